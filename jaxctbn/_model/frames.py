"""What the results as other packages' objects share (the `to_frame`, `to_networkx` and
`to_inference_data` methods, and the command line's files): the optional packages, imported on
demand with a one-line error, and the labels of parent configurations, rates, states and
interventions, in the layouts the command line writes.

Nothing here imports JAX, pandas, networkx or ArviZ at module level."""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any


def optional_import(package: str, what: str) -> Any:
    """`import package`, or a one-line `ImportError` saying that `what` needs it and how to
    install it."""
    try:
        return importlib.import_module(package)
    except ImportError:
        raise ImportError(f"{what} needs {package}: pip install {package}") from None


def parent_states(model: Any, n: int) -> list[dict]:
    """Node `n`'s parent configurations, in the CIMs' order, as `{"parent": state, ...}` dicts
    (one empty dict for a node without parents). `model`: anything with `names`, `parents`
    and `cardinalities` (a CTBN, a rate posterior)."""
    from .layout import parent_configurations

    names = [model.names[p] for p in model.parents[n]]
    return [
        dict(zip(names, map(int, config)))
        for config in parent_configurations(model.parents[n], model.cardinalities)
    ]


def assignment_label(assignment: Mapping[str, Any], separator: str = ",") -> str:
    """`NODE=STATE` pairs joined by `separator` (`""` for none): a parent configuration
    (`A=0,B=1`) or, with `";"`, a state or an intervention as metrics.csv writes them."""
    return separator.join(f"{name}={int(state)}" for name, state in assignment.items())


def free_rate_masks(model: Any) -> list[Any]:
    """Per node, the free rates of `model`'s CIMs as numpy booleans `(configs, k, k)`: the
    nonzero off-diagonal entries (structural zeros and the diagonal false). Host-side."""
    import numpy as np

    return [(np.asarray(q) != 0) & ~np.eye(np.shape(q)[-1], dtype=bool) for q in model.cims]


def free_rates(model: Any, free: Sequence[Any]) -> list[tuple[int, int, int, int, dict]]:
    """`(node, configuration, from, to, parent states)` of every rate that `free[n]` (booleans
    `(configs, k, k)`, or `(k, k)` for every configuration, per node) marks, node by node, each in `(configuration, from, to)`
    order: the rows of the rate tables."""
    import numpy as np

    out = []
    for n, k in enumerate(model.cardinalities):
        configs = parent_states(model, n)
        # (a table shared by every configuration broadcasts)
        marked = np.broadcast_to(np.asarray(free[n]), (len(configs), k, k))
        for u, x, y in zip(*np.nonzero(marked)):
            out.append((n, int(u), int(x), int(y), configs[int(u)]))
    return out


def rate_name(model: Any, n: int, x: int, y: int, states: Mapping[str, Any]) -> str:
    """A rate's name in a draws file: `NODE:X->Y`, with `|PARENT=STATE,...` before the colon
    for a node with parents."""
    given = assignment_label(states)
    label = f"{model.names[n]}|{given}" if given else model.names[n]
    return f"{label}:{x}->{y}"


def named_rate_draws(model: Any, free: Sequence[Any], draws: Sequence[Any]) -> dict[str, Any]:
    """Per free rate (`free`, as in `free_rates`), its draws `(chains, draws)` from each node's
    `(chains, draws, configs, k, k)`, keyed by `rate_name`."""
    import numpy as np

    host = [np.asarray(d) for d in draws]
    return {
        rate_name(model, n, x, y, states): host[n][:, :, u, x, y]
        for n, u, x, y, states in free_rates(model, free)
    }


def rate_draws_inference_data(
    model: Any, free: Sequence[Any], draws: Sequence[Any], what: str
) -> Any:
    """The draws of the free rates (per node `(chains, draws, configs, k, k)`) as an ArviZ
    `InferenceData`: its posterior group holds one variable per free rate, named by
    `rate_name`, with dimensions `chain` and `draw`. `what` names the caller in the error
    when ArviZ is missing."""
    arviz = optional_import("arviz", what)
    return arviz.from_dict(posterior=named_rate_draws(model, free, draws))


def intervention_labels(names: Sequence[str], targets: Any, states: Any) -> list[str]:
    """Each perfect intervention of a batch (`targets`, `states`: `(batch, nodes)`) as
    metrics.csv writes it: `A=1;B=0` for the clamped nodes, `none` for no clamp."""
    import numpy as np

    out = []
    for t, s in zip(np.asarray(targets), np.asarray(states)):
        label = assignment_label({names[n]: s[n] for n in range(len(names)) if t[n]}, ";")
        out.append(label or "none")
    return out
