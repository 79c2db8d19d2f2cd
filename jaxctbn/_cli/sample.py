"""`jaxctbn sample`: trajectories of a network, written to a long-format CSV."""

from __future__ import annotations

from .arguments import _assignment, _initial_state


def _cmd_sample(args):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from .._model.interventions import Intervention
    from .._paths.csv import write_trajectories_csv
    from .._paths.sampling import sample_within_cap
    from .inputs import read_network

    network = read_network(args.network, args.format)
    model = network.model
    duration = args.duration  # checked by argparse (_positive_number)
    intervention = Intervention.perfect(
        model, _assignment(args.intervention, model.names, model.cardinalities, "--intervention")
    )
    key = jax.random.key(args.seed)
    key_init, key_paths = jax.random.split(key)
    if args.initial_state:
        _, initial = _initial_state(args.initial_state, model.names, model.cardinalities)
    else:  # uniformly random initial state per trajectory
        initial = jnp.stack(
            [
                jax.random.randint(k, (args.trajectories,), 0, c)
                for k, c in zip(jax.random.split(key_init, model.num_nodes), model.cardinalities)
            ],
            axis=1,
        ).astype(jnp.int32)
    traj = sample_within_cap(
        model,
        initial,
        duration,
        key=key_paths,
        num_trajectories=args.trajectories,
        intervention=intervention,
        max_events=args.max_events,
        name="--max-events",
    )
    write_trajectories_csv(traj, model, args.out)
    n_events = int(np.asarray(traj.num_events).sum())
    print(f"wrote {args.trajectories} trajectories ({n_events} jumps) to {args.out}")
