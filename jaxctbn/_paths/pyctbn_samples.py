"""The samples of PyCTBN's JSON file: its layout, and the network part, are described in
`_model/pyctbn_network.py`.

Reading, the samples of data set `index` become trajectories; each node's states are the
numbers `0..k-1` of `variables` (a `model`, a CTBN or `{name: cardinality}` or `{name:
[labels]}`, must have the same nodes and cardinalities); errors name the file and the JSON key;
`max_events` as in `Trajectories.from_dataframe`. The reader returns `(trajectories, ids,
nodes)`. Writing, each sample's rows are its initial state at time 0, one row per jump and an
end row of `-1` states at the end of observation, in one data set with the network of `model`
when it is a CTBN (`variables`, `dyn.str`, `dyn.cims`), or with the `variables` of a dict
`{name: cardinality}` (no structure, no rates).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .._files import write_json
from .._model.json_documents import is_integer, is_number
from .._model.node_labels import Nodes, default_labels, match_nodes, model_nodes
from .._model.pyctbn_network import network_data_set, read_data_set, read_variables
from .path_arrays import build_trajectories, paths_of
from .sampling import Trajectories


def read_samples(
    path: Any, model: Any = None, *, index: int = 0, max_events: int | None = None
) -> tuple[Trajectories, list, Nodes]:
    """The samples of data set `index` of a PyCTBN JSON file as trajectories, the index of each
    one's sample and the nodes (see the module docstring)."""
    data, where = read_data_set(path, index)
    cards = read_variables(data, where)
    names = list(cards)
    if model is not None:
        nodes, _ = model_nodes(model)
        match_nodes(names, list(nodes), where)
        wrong = [n for n in nodes if len(nodes[n]) != cards[n]]
        if wrong:
            raise ValueError(
                f"{where}.variables: node(s) {wrong} have {[cards[n] for n in wrong]} states, the "
                f"model {[len(nodes[n]) for n in wrong]}."
            )
    else:
        nodes = {n: default_labels(k) for n, k in cards.items()}
    order = list(nodes)
    samples = data.get("samples")
    if not isinstance(samples, list) or not samples:
        raise ValueError(f"{where}.samples must be a non-empty list of samples (lists of rows).")
    paths = []
    for i, sample in enumerate(samples):
        at = f"{where}.samples[{i}]"
        if not isinstance(sample, list) or len(sample) < 2:
            raise ValueError(
                f"{at} must be a list of at least 2 rows (the initial state and the end row)."
            )
        times = np.empty(len(sample))
        states = np.empty((len(sample), len(order)), np.int64)
        for r, row in enumerate(sample):
            if not isinstance(row, Mapping) or set(row) != {"Time", *names}:
                raise ValueError(f"{at}[{r}] must be an object with 'Time' and {names}.")
            t = row["Time"]
            if not is_number(t) or not np.isfinite(t) or t < 0:
                raise ValueError(f"{at}[{r}].Time must be a finite number >= 0, got {t!r}.")
            times[r] = t
            for n, name in enumerate(order):
                s = row[name]
                k = len(nodes[name])
                last = r == len(sample) - 1
                if not is_integer(s) or not (0 <= s < k or (last and s == -1)):
                    valid = f"0..{k - 1}" + (" (or -1 in the end row)" if last else "")
                    raise ValueError(f"{at}[{r}].{name} = {s!r}; states are {valid}.")
                states[r, n] = int(s)
        end = states[-1]
        if np.any(end == -1) and not np.all(end == -1):
            raise ValueError(
                f"{at}[{len(sample) - 1}]: the end row must have every state -1, or none."
            )
        if np.any(np.diff(times) < 0):
            r = int(np.argmax(np.diff(times) < 0)) + 1
            raise ValueError(
                f"{at}[{r}].Time is before the previous row's; rows must be in time order."
            )
        if np.all(end == -1):
            states[-1] = states[-2]
        else:  # a jump at the end of observation, then the end
            times, states = np.append(times, times[-1]), np.vstack([states, states[-1:]])
        changes = (states[1:] != states[:-1]).sum(1)
        if np.any(changes > 1):
            r = int(np.argmax(changes > 1)) + 1
            raise ValueError(
                f"{at}[{r}] changes {int(changes[r - 1])} variables at once; a CTBN changes one at a time."
            )
        if not times[-1] > times[0]:
            raise ValueError(f"{at} is observed for no time (its end row is at its start).")
        paths.append((i, times, states))
    trajectories, ids = build_trajectories(paths, nodes, max_events)
    return trajectories, ids, nodes


def write_samples(trajectories: Trajectories, model: Any, path: Any) -> None:
    """A PyCTBN file of the trajectories' samples, with `model`'s network when it is a CTBN (see
    the module docstring), atomically."""
    data = network_data_set(model)
    names = [v["Name"] for v in data["variables"]]
    samples = []
    for init, times, states, duration in paths_of(trajectories, len(names), "PyCTBN samples"):
        rows = [{"Time": 0.0, **{n: int(init[j]) for j, n in enumerate(names)}}]
        rows += [
            {"Time": float(t), **{n: int(s[j]) for j, n in enumerate(names)}}
            for t, s in zip(times.tolist(), states)
        ]
        rows.append({"Time": duration, **dict.fromkeys(names, -1)})
        samples.append(rows)
    data["samples"] = samples
    write_json(path, [data], indent=None)
