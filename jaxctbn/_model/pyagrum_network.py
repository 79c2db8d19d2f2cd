"""pyAgrum's CTBN objects (`pyagrum.ctbn.CTBN`, needs `pip install pyagrum`) to and from
jaxctbn's `CTBN`; pyAgrum's trajectory CSV is in `_paths/pyagrum_csv.py`.

A model read from pyAgrum has its nodes and parents in pyAgrum's node-id order and each node's
states in the order of its variable's labels (get them as
`{v.name(): list(v.labels()) for v in obj.variables()}`, e.g. for
[`jaxctbn.Trajectories.read_pyagrum_csv`][]); a model written to pyAgrum has
`pyagrum.LabelizedVariable`s with the labels given (default: the state numbers,
`node_labels.default_labels`). The rates are read and written through pyAgrum's `CIM` API
(keys `{parent: state, "X#i": a, "X#j": b}`).
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from .ctbn import CTBN
from .layout import parent_configurations
from .node_labels import Nodes, labels_of


def _pyagrum() -> Any:
    # by name: a plain `import pyagrum` here reads, for type checkers, as this very module
    try:
        pyagrum = importlib.import_module("pyagrum")
        importlib.import_module("pyagrum.ctbn")
    except ImportError:
        raise ImportError(
            "converting to or from pyAgrum's CTBN needs pyAgrum: pip install pyagrum"
        ) from None
    return pyagrum


def ctbn_from_pyagrum(obj: Any) -> tuple[CTBN, Nodes]:
    """A `pyagrum.ctbn.CTBN` as a `jaxctbn.CTBN` (nodes in pyAgrum's node-id order, parents in
    that order, states in the order of each variable's labels), and its nodes' labels."""
    _pyagrum()
    ids = sorted(obj.nodes())
    names = [obj.name(i) for i in ids]
    labels = {obj.name(i): list(obj.variable(i).labels()) for i in ids}
    cards = [len(labels[n]) for n in names]
    parents = []
    cims = []
    for i, name in zip(ids, names):
        ps = sorted(obj.parents(i))
        pidx = [ids.index(p) for p in ps]
        parents.append(pidx)
        cim = obj.CIM(i)
        k = cards[len(parents) - 1]
        table = []
        for config in parent_configurations(tuple(pidx), tuple(cards)):
            q = np.zeros((k, k))
            context = {names[p]: int(v) for p, v in zip(pidx, config)}
            for a in range(k):
                for b in range(k):
                    q[a, b] = cim[{**context, f"{name}#i": a, f"{name}#j": b}]
            table.append(q)
        cims.append(np.stack(table))
    return CTBN(cims=cims, parents=parents, names=names), labels


def ctbn_to_pyagrum(model: CTBN, labels: Any = None) -> Any:
    """A `pyagrum.ctbn.CTBN` with the model's nodes, arcs and rates; `labels` as `labels_of`
    takes them (default: the model's own, the state numbers)."""
    pyagrum = _pyagrum()
    nodes = labels_of(model, labels)
    obj = pyagrum.ctbn.CTBN()
    for name in model.names:
        obj.add(pyagrum.LabelizedVariable(name, name, list(nodes[name])))
    for n, ps in enumerate(model.parents):
        for p in ps:
            obj.addArc(model.names[p], model.names[n])
    for n, name in enumerate(model.names):
        table = np.asarray(model.cims[n], dtype=float)
        k = model.cardinalities[n]
        cim = obj.CIM(name)
        for c, config in enumerate(parent_configurations(model.parents[n], model.cardinalities)):
            context = {model.names[p]: int(v) for p, v in zip(model.parents[n], config)}
            for a in range(k):
                for b in range(k):
                    cim[{**context, f"{name}#i": a, f"{name}#j": b}] = float(table[c, a, b])
    return obj
