"""The nodes of other tools' files (pyAgrum, causal-hub, PyCTBN): node names and the labels of
their states, given by a CTBN, a dict `{name: cardinality}` or a dict `{name: [labels]}`, and
checked against the nodes a file names."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .ctbn import AbstractCTBN

#: The nodes of a file: `{name: [state labels]}` in node order; state `i` of a node is its
#: `i`-th label (so its cardinality is the number of labels).
Nodes = dict[str, list[str]]

#: Columns of jaxctbn's long format that no node may be named.
RESERVED = ("trajectory_id", "time", "intervention")


def default_labels(k: int) -> list[str]:
    """The labels of states `0..k-1` where a model has none: the numbers, zero-padded to one
    width (`"00", ..., "10"` for 11 states) so that their text order, by which pyAgrum and
    causal-hub order the labels they read, is the order of the states."""
    width = len(str(k - 1))
    return [str(i).zfill(width) for i in range(k)]


def model_nodes(model: Any, what: str = "model") -> tuple[Nodes, bool]:
    """`(nodes, numeric)` of a model given as a CTBN, a dict `{name: cardinality}` or a dict
    `{name: [state labels]}`. `numeric` is `True` where the model has no labels (the first two):
    the labels are then `default_labels`, and a file's label is also read as the number it
    spells (`"1"` and `"01"` are state 1)."""
    if isinstance(model, AbstractCTBN):
        return {n: default_labels(k) for n, k in zip(model.names, model.cardinalities)}, True
    if not isinstance(model, Mapping) or not model:
        raise ValueError(
            f"{what}: expected a CTBN, a dict {{node name: cardinality}} or a dict "
            "{node name: [state labels]}."
        )
    nodes: Nodes = {}
    numeric = None
    for name, spec in model.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{what}: node names must be non-empty strings, got {name!r}.")
        is_count = isinstance(spec, int | np.integer) and not isinstance(spec, bool)
        if numeric is not None and numeric != is_count:
            raise ValueError(
                f"{what}: give every node a cardinality or every node its state labels, not both."
            )
        numeric = is_count
        if is_count:
            labels = default_labels(int(spec))
        elif isinstance(spec, Sequence) and not isinstance(spec, str):
            labels = list(spec)
            if not all(isinstance(s, str) and s for s in labels):
                raise ValueError(
                    f"{what}: the state labels of node {name!r} must be non-empty strings, "
                    f"got {labels!r}."
                )
            if len(set(labels)) != len(labels):
                raise ValueError(f"{what}: node {name!r} lists a state label twice: {labels}.")
        else:
            raise ValueError(
                f"{what}: node {name!r}: expected a cardinality or a list of state labels, "
                f"got {spec!r}."
            )
        if len(labels) < 2:
            raise ValueError(f"{what}: node {name!r} needs at least 2 states, got {len(labels)}.")
        nodes[name] = labels
    return nodes, bool(numeric)


def nodes_from_labels(seen: dict[str, set[str]], source: str) -> Nodes:
    """The nodes of a file that names its states by labels and gives no model: each node's
    labels seen, in text order (pyAgrum's and causal-hub's own rule); a node seen in a single
    state is refused (its other states cannot be known), naming `source`."""
    nodes = {v: sorted(labels) for v, labels in seen.items()}
    single = [v for v, labels in nodes.items() if len(labels) < 2]
    if single:
        raise ValueError(
            f"{source}: node(s) {single} show a single state label; pass "
            "model={name: [state labels]} to give their states."
        )
    return nodes


def check_names(names: Sequence[str], source: str) -> None:
    """Refuses node names that are columns of jaxctbn's trajectory format."""
    reserved = [n for n in names if n in RESERVED]
    if reserved:
        raise ValueError(
            f"{source}: node name(s) {reserved} are reserved for the columns of jaxctbn's "
            "trajectory format; rename the nodes."
        )


def match_nodes(found: Sequence[str], model_names: Sequence[str], source: str) -> None:
    """The nodes that a file names against those of the model passed with it."""
    unknown = [n for n in found if n not in model_names]
    missing = [n for n in model_names if n not in found]
    if unknown or missing:
        parts = ([f"unknown node(s) {unknown}"] if unknown else []) + (
            [f"no data for node(s) {missing}"] if missing else []
        )
        raise ValueError(
            f"{source}: {'; '.join(parts)}; the model's nodes are {list(model_names)}."
        )


def labels_of(model: Any, labels: Any) -> Nodes:
    """The state labels of a CTBN's nodes: `labels` as `model_nodes` takes them, one per state
    of the model, or (`None`) the model's own, `default_labels`."""
    if labels is None:
        return model_nodes(model)[0]
    nodes, _ = model_nodes(labels, "labels")
    match_nodes(list(nodes), list(model.names), "labels")
    wrong = [n for n, k in zip(model.names, model.cardinalities) if len(nodes[n]) != k]
    if wrong:
        raise ValueError(f"labels: node(s) {wrong} need one label per state of the model.")
    return nodes
