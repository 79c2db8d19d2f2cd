"""`jaxctbn moments`: expected statistics of a network from the master equation."""

from __future__ import annotations

import json
import math

from .arguments import _assignment, _initial_state, _load_network
from .jax_setup import _jit


def _cmd_moments(args):
    import jax.numpy as jnp
    import numpy as np

    from .._model.interventions import Intervention

    model = _load_network(args.network)
    duration = args.duration
    init, initial = _initial_state(args.initial_state, model.names, model.cardinalities)
    assignment = _assignment(args.intervention, model.names, model.cardinalities, "--intervention")
    from .._master_equation.master_equation import ExpectedStatistics, resolve_solver
    from .._master_equation.mean_field import MeanField
    from .._master_equation.solvers import AutomaticSolver, Uniformisation

    intervention = Intervention.perfect(model, assignment)
    solver = {"auto": AutomaticSolver(), "exact": Uniformisation(), "mean-field": MeanField()}[
        args.solver
    ]
    used = resolve_solver(solver, model)
    states = math.prod(model.cardinalities)
    exact = not isinstance(used, MeanField)
    stats, per_node, effective = _jit(_moments)(
        model, initial, jnp.asarray(duration), intervention, used
    )
    out = {
        "duration": duration,
        "initial_state": {n: int(effective[i]) for i, n in enumerate(model.names)},
        "intervention": assignment,
        "solver": {
            "name": "uniformisation" if exact else "mean-field",
            "exact": exact,
            "global_states": states,
            "chosen": "automatically" if args.solver == "auto" else "by --solver",
            "max_global_states": solver.max_global_states
            if isinstance(solver, AutomaticSolver)
            else None,
        },
        "nodes": {},
    }
    if isinstance(stats, ExpectedStatistics):
        out["global"] = {
            "nodes": list(model.names),
            "expected_dwell": np.asarray(stats.dwell_times).tolist(),
            "final_marginal": np.asarray(stats.final_marginal).tolist(),
        }
    for i, name in enumerate(model.names):
        out["nodes"][name] = {
            "parents": [model.names[p] for p in model.parents[i]],
            "expected_dwell": np.asarray(per_node[i][0]).tolist(),
            "expected_transitions": np.asarray(per_node[i][1]).tolist(),
        }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    how = (
        f"exact, uniformisation over {states} global states"
        if exact
        else f"approximate: mean-field, the {states} global states exceed "
        f"{out['solver']['max_global_states']}"
        if args.solver == "auto"
        else "approximate: mean-field, by --solver"
    )
    print(
        f"wrote expected statistics of {model.num_nodes} nodes over [0, {duration}] to "
        f"{args.out} ({how})"
    )


def _moments(model, initial, duration, intervention, solver):
    """What `moments` writes: the statistics, each node's (dwell, transitions), the initial state."""
    from .._master_equation.master_equation import expected_statistics

    stats = expected_statistics(model, initial, duration, intervention=intervention, solver=solver)
    per_node = [
        (stats.node_dwell_times(i), stats.node_transitions(i)) for i in range(model.num_nodes)
    ]
    return stats, per_node, intervention.initial_states(initial)
