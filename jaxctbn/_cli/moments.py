"""`jaxctbn moments`: expected statistics of a network from the master equation."""

from __future__ import annotations

import math

from .._files import write_json
from .arguments import _assignment, _initial_state
from .jax_setup import _exported


def _cmd_moments(args):
    import jax.numpy as jnp
    import numpy as np

    from .._model.interventions import Intervention
    from .inputs import read_network

    network = read_network(args.network, args.format)
    model = network.model
    duration = args.duration
    init, initial = _initial_state(args.initial_state, model.names, model.cardinalities)
    assignment = _assignment(args.intervention, model.names, model.cardinalities, "--intervention")
    from .._master_equation import (
        AutomaticSolver,
        ExpectedStatistics,
        MeanField,
        Uniformisation,
        resolve_solver,
    )

    intervention = Intervention.perfect(model, assignment)
    solver = {"auto": AutomaticSolver(), "exact": Uniformisation(), "mean-field": MeanField()}[
        args.solver
    ]
    used = resolve_solver(solver, model)
    states = math.prod(model.cardinalities)
    exact = not isinstance(used, MeanField)
    try:
        stats, per_node, effective = _exported("moments", _moments)(
            model, initial, jnp.asarray(duration), intervention, used
        )
    except RuntimeError as error:  # a check inside the compiled solve
        raise ValueError(_duration_advice(error, duration)) from None
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
    out["input_format"] = {"network": network.format}
    write_json(args.out, out)
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


def _duration_advice(error: RuntimeError, duration: float, *, solver_flag: bool = True) -> str:
    """The solver's message in the command's terms: the options it names (`max_terms`,
    `max_steps`) exist only in Python, so name `--duration` (and `--solver` where the command
    has it) instead."""
    from .._errors import error_message

    message = error_message(error)
    if "max_terms" in message:
        return (
            f"--duration: {duration:g} is too long for the exact solver (its series needs more "
            "terms than its limit: the fastest exit rate times the duration is very large); give "
            "a shorter --duration"
            + (", or --solver mean-field (approximate)." if solver_flag else ".")
        )
    if "maximum number of solver steps" in message:
        return (
            f"--duration: {duration:g} is too long for the mean-field equations (more ODE steps "
            "than their limit); give a shorter --duration (the statistics grow linearly once the "
            "marginals are stationary)."
        )
    return message


def _moments(model, initial, duration, intervention, solver):
    """What `moments` writes: the statistics, each node's (dwell, transitions), the initial state."""
    from .._master_equation import expected_statistics

    stats = expected_statistics(model, initial, duration, intervention=intervention, solver=solver)
    per_node = [
        (stats.node_dwell_times(i), stats.node_transitions(i)) for i in range(model.num_nodes)
    ]
    return stats, per_node, intervention.initial_states(initial)
