"""causal-hub's CTBN JSON (`CatCTBN.to_json_string` / `from_json_string`, schema
`catctbn.schema.json`), read and written without causal-hub itself; its trajectories are in
`_paths/causal_hub_frames.py`.

The file is `{"graph": {"labels", "edges", "type": "digraph"}, "cims": [catcim, ...],
"initial_distribution": catbn, "type": "catctbn"}` (optional `"name"`, `"description"`: strings,
never null), a catcim being `{"states": {X: [labels]}, "conditioning_states": {P: [labels],
...}, "parameters": [configs][k][k], "type": "catcim"}`. causal-hub reads the parent
configurations in row-major order (the last parent fastest) over the parents *sorted by name*,
each parent's states in the order listed, and then sorts every variable and every state set by
its text, moving the rates with them; it writes that sorted form. A jaxctbn model read from it
has the nodes, parents and states in that sorted order.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._files import write_json
from .ctbn import CTBN
from .json_documents import read_json
from .layout import parent_configurations
from .node_labels import labels_of


def _labels(value: Any, where: str) -> list[str]:
    if (
        not isinstance(value, list)
        or len(value) < 2
        or not all(isinstance(s, str) for s in value)
        or len(set(value)) != len(value)
    ):
        raise ValueError(
            f"{where} must be a list of at least 2 distinct state labels (strings), got {value!r}."
        )
    return value


def ctbn_from_dict(data: Any, source: str) -> CTBN:
    """causal-hub's CTBN JSON (see the module docstring) as a CTBN, in causal-hub's sorted
    order; errors name `source` and the JSON key."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{source}: expected a JSON object with keys 'graph' and 'cims'.")
    kind = data.get("type", "catctbn")
    if kind != "catctbn":
        raise ValueError(f"{source}: 'type' is {kind!r}; expected 'catctbn' (a categorical CTBN).")
    for key in ("graph", "cims"):
        if key not in data:
            raise ValueError(
                f"{source}: missing key {key!r}; expected 'graph', 'cims' and 'initial_distribution'."
            )
    graph = data["graph"]
    if not isinstance(graph, Mapping) or not isinstance(graph.get("labels"), list):
        raise ValueError(
            f"{source}: 'graph' must be an object with 'labels' (a list of names) and 'edges'."
        )
    names = graph["labels"]
    if (
        not names
        or not all(isinstance(n, str) and n for n in names)
        or len(set(names)) != len(names)
    ):
        raise ValueError(f"{source}: graph.labels must be distinct non-empty names, got {names!r}.")
    edges = graph.get("edges", [])
    if not isinstance(edges, list) or not all(
        isinstance(e, list) and len(e) == 2 and all(x in names for x in e) for e in edges
    ):
        raise ValueError(
            f"{source}: graph.edges must be a list of [from, to] pairs of graph.labels."
        )
    cims = data["cims"]
    if not isinstance(cims, list):
        raise ValueError(f"{source}: 'cims' must be a list of catcim objects, one per variable.")
    states: dict[str, list[str]] = {}
    tables: dict[str, tuple[list[str], np.ndarray, str]] = {}
    for j, cim in enumerate(cims):
        where = f"{source}: cims[{j}]"
        if not isinstance(cim, Mapping) or not {
            "states",
            "conditioning_states",
            "parameters",
        } <= set(cim):
            raise ValueError(
                f"{where} must be an object with 'states', 'conditioning_states' and 'parameters'."
            )
        own = cim["states"]
        if not isinstance(own, Mapping) or len(own) != 1:
            raise ValueError(f"{where}.states must name one variable, got {own!r}.")
        ((name, labels),) = own.items()
        if name not in names:
            raise ValueError(
                f"{where}.states names {name!r}, which is not in graph.labels {names}."
            )
        if name in tables:
            raise ValueError(f"{where}: a second CIM for {name!r}.")
        conditioning = cim["conditioning_states"]
        if not isinstance(conditioning, Mapping) or not all(p in names for p in conditioning):
            raise ValueError(
                f"{where}.conditioning_states must be an object {{variable in graph.labels: [labels]}}."
            )
        order = sorted(conditioning)  # causal-hub's configuration order: parents sorted by name
        for var, ls in [(name, labels), *((p, conditioning[p]) for p in order)]:
            key = "states" if var == name else "conditioning_states"
            ls = _labels(ls, f"{where}.{key}[{var!r}]")
            if var in states and sorted(states[var]) != sorted(ls):
                raise ValueError(
                    f"{where}.{key}[{var!r}] lists states {ls}, elsewhere {states[var]}."
                )
            states.setdefault(var, ls)
        shape = (math.prod(len(conditioning[p]) for p in order), len(labels), len(labels))
        try:
            q = np.asarray(cim["parameters"], dtype=float)
        except (TypeError, ValueError):
            q = None
        if q is None or q.shape != shape:
            raise ValueError(
                f"{where}.parameters must be numbers of shape {list(shape)} (configurations, k, k)."
            )
        if not np.all(np.isfinite(q)) or np.any(q[:, ~np.eye(shape[1], dtype=bool)] < 0):
            raise ValueError(
                f"{where}.parameters must be finite with non-negative off-diagonal rates."
            )
        tables[name] = (order, q, where)
    missing = [n for n in names if n not in tables]
    if missing:
        raise ValueError(f"{source}: 'cims' has no CIM for {missing}.")
    edge_set = {(a, b) for a, b in edges}
    for name, (order, _, where) in tables.items():
        if {(p, name) for p in order} != {e for e in edge_set if e[1] == name}:
            raise ValueError(
                f"{where}.conditioning_states {order} are not the parents of {name!r} in graph.edges."
            )
    # causal-hub's sorted form: names, parents and labels in text order
    sorted_names = sorted(names)
    labels = {n: sorted(states[n]) for n in sorted_names}
    cards = tuple(len(labels[n]) for n in sorted_names)
    out_cims, out_parents = [], []
    for name in sorted_names:
        order, q, _ = tables[name]
        own = [states[name].index(s) for s in labels[name]]  # sorted state -> listed index
        listed = [[states[p].index(s) for s in labels[p]] for p in order]
        strides = np.cumprod([1, *(len(states[p]) for p in order[::-1])])[:-1][::-1]
        pidx = tuple(sorted_names.index(p) for p in order)
        rows = []
        for config in parent_configurations(pidx, cards):
            c = sum(int(s) * int(listed[i][v]) for i, (v, s) in enumerate(zip(config, strides)))
            rows.append(q[c][np.ix_(own, own)])
        out_cims.append(np.stack(rows))
        out_parents.append(pidx)
    return CTBN(cims=out_cims, parents=out_parents, names=sorted_names)


def ctbn_to_dict(model: CTBN, labels: Any = None) -> dict:
    """causal-hub's CTBN JSON for the model, in causal-hub's sorted form, with a uniform initial
    distribution (jaxctbn's CTBN has none); `labels` as `labels_of` takes them."""
    nodes = labels_of(model, labels)
    names = sorted(model.names)
    sorted_labels = {n: sorted(nodes[n]) for n in names}
    index = {n: i for i, n in enumerate(model.names)}
    cims = []
    for name in names:
        i = index[name]
        own = [nodes[name].index(s) for s in sorted_labels[name]]
        order = sorted(model.names[p] for p in model.parents[i])
        table = np.asarray(model.cims[i], dtype=float)
        ours = model.parents[i]
        strides = np.cumprod([1, *(model.cardinalities[p] for p in ours[::-1])])[:-1][::-1]
        params = []
        for config in itertools.product(*(sorted_labels[p] for p in order)):
            state = {p: nodes[p].index(s) for p, s in zip(order, config)}
            c = sum(int(st) * state[model.names[p]] for p, st in zip(ours, strides))
            params.append(table[c][np.ix_(own, own)].tolist())
        cims.append(
            {
                "states": {name: sorted_labels[name]},
                "conditioning_states": {p: sorted_labels[p] for p in order},
                "parameters": params,
                "type": "catcim",
            }
        )
    edges = sorted(
        (model.names[p], model.names[n]) for n, ps in enumerate(model.parents) for p in ps
    )
    cpds = [
        {
            "states": {n: sorted_labels[n]},
            "conditioning_states": {},
            "parameters": [[1.0 / len(sorted_labels[n])] * len(sorted_labels[n])],
            "type": "catcpd",
        }
        for n in names
    ]
    return {
        "initial_distribution": {
            "graph": {"labels": names, "edges": [], "type": "digraph"},
            "cpds": cpds,
            "type": "catbn",
        },
        "graph": {"labels": names, "edges": [list(e) for e in edges], "type": "digraph"},
        "cims": cims,
        "type": "catctbn",
    }


def read_ctbn_json(path: Any) -> CTBN:
    """The model of causal-hub's CTBN JSON file, in causal-hub's sorted order (state `i` of a
    node is its `i`-th label in text order); the initial distribution is not read (a CTBN here
    has none). A malformed file is a one-line `ValueError` naming it and the JSON key."""
    source = f"causal-hub network file {os.fspath(path)!r}"
    return ctbn_from_dict(read_json(path, "causal-hub network"), source)


def write_ctbn_json(model: CTBN, path: Any, labels: Any = None) -> None:
    """causal-hub's CTBN JSON of the model (`ctbn_to_dict`), atomically; `labels` default to
    the state numbers, zero-padded from 11 states on (`default_labels`)."""
    write_json(path, ctbn_to_dict(model, labels), indent=None)
