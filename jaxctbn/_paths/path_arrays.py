"""What the converters of other tools' trajectory formats (pyAgrum, causal-hub, PyCTBN) share:
trajectories as plain per-path arrays for the writers, trajectories built from such arrays by
the readers (through jaxctbn's long format and its checks), and the state a label names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from .._model.node_labels import Nodes
from .sampling import Trajectories


class StateCodes:
    """Label -> state lookups for the nodes of a model (see `model_nodes`)."""

    def __init__(self, nodes: Nodes, numeric: bool):
        self.nodes = nodes
        self.numeric = numeric
        self._codes = {n: {label: i for i, label in enumerate(ls)} for n, ls in nodes.items()}

    def code(self, node: str, label: str) -> int | None:
        """The state of `node` that `label` names, or `None`."""
        state = self._codes[node].get(label)
        if state is None and self.numeric and label.isdigit() and label.isascii():
            state = int(label) if int(label) < len(self.nodes[node]) else None
        return state

    def valid(self, node: str) -> str:
        """The labels of `node`, for an error message."""
        labels = self.nodes[node]
        shown = ", ".join(repr(s) for s in labels[:8]) + (", ..." if len(labels) > 8 else "")
        extra = f" (or the numbers 0..{len(labels) - 1})" if self.numeric else ""
        return f"{shown}{extra}"


def paths_of(trajectories: Trajectories, num_nodes: int, what: str) -> list[tuple]:
    """Per trajectory (a batch's leading axes flattened): `(initial state (N,), jump times (m,)
    float64, states after each jump (m, N), duration)`. Peers have no interventions and no cut
    paths, so trajectories with either are refused."""
    t = jax.tree_util.tree_map(np.asarray, trajectories)
    N = t.initial_states.shape[-1]
    if N != num_nodes:
        raise ValueError(f"{what}: the trajectories have {N} nodes, the model {num_nodes}.")
    init = t.initial_states.reshape(-1, N)
    times = t.jump_times.reshape(init.shape[0], -1).astype(np.float64)
    states = t.states.reshape(init.shape[0], -1, N)
    counts = t.num_events.reshape(-1)
    durations = t.durations.reshape(-1).astype(np.float64)
    if np.any(t.truncated):
        raise ValueError(f"{what}: some paths are truncated (max_events too small).")
    if np.any(t.intervention_targets):
        raise ValueError(
            f"{what}: some trajectories were recorded under an intervention, which this format "
            "cannot hold; write them with `write_csv` instead."
        )
    return [
        (init[r], times[r, : counts[r]], states[r, : counts[r]], float(durations[r]))
        for r in range(init.shape[0])
    ]


def build_trajectories(
    paths: Sequence[tuple[Any, np.ndarray, np.ndarray]],
    nodes: Nodes,
    max_events: int | None,
) -> tuple[Trajectories, list]:
    """Trajectories from `(id, times (rows,), states (rows, N))` per path, each row the state from
    that time on and the last row the end of observation (jaxctbn's long format, so the checks and
    the cutting of long paths are those of [`jaxctbn.Trajectories.from_dataframe`][])."""
    import pandas as pd

    from .csv import trajectories_from_dataframe

    names = list(nodes)
    ids = np.concatenate([np.full(len(p[1]), i) for i, p in enumerate(paths)])
    frame = pd.DataFrame({"trajectory_id": ids, "time": np.concatenate([p[1] for p in paths])})
    states = np.concatenate([np.asarray(p[2], np.int64).reshape(-1, len(names)) for p in paths])
    for n, name in enumerate(names):
        frame[name] = states[:, n]
    cards = {name: len(labels) for name, labels in nodes.items()}
    trajectories, rows = trajectories_from_dataframe(frame, cards, max_events=max_events)
    return trajectories, [paths[int(r)][0] for r in rows]
