"""The candidate parent sets of structure learning: every set of at most `max_parents` other
nodes, with required and forbidden edges."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import jax
import numpy as np
from jaxtyping import Array, Int


def enumerate_parent_sets(
    num_nodes: int,
    node: int,
    max_parents: int,
    *,
    required: Sequence[int] = (),
    forbidden: Sequence[int] = (),
    width: int | None = None,
) -> np.ndarray:
    """All parent sets of `node` with at most `max_parents` parents that contain every `required`
    parent and no `forbidden` one, ordered by size then lexicographically; shape
    `(sets, width)` (default `width = max_parents`), padded with `-1`."""
    if not 0 <= max_parents <= num_nodes - 1:
        raise ValueError(
            f"max_parents must be between 0 and {num_nodes - 1} (N - 1), got {max_parents}."
        )
    required_set, forbidden_set = set(required), set(forbidden)
    if node in required_set or node in forbidden_set:
        raise ValueError(f"required/forbidden edges of node {node}: self-loops are not allowed.")
    if required_set & forbidden_set:
        raise ValueError(
            f"edges {sorted(required_set & forbidden_set)} -> {node} are both required and forbidden."
        )
    if len(required_set) > max_parents:
        raise ValueError(
            f"node {node} has {len(required_set)} required parents > max_parents={max_parents}."
        )
    width = max_parents if width is None else width
    if width < max_parents:
        raise ValueError(f"width: must be at least max_parents={max_parents}, got {width}.")
    others = [m for m in range(num_nodes) if m != node and m not in forbidden_set]
    sets = []
    for size in range(max_parents + 1):
        for combo in itertools.combinations(others, size):
            if required_set <= set(combo):
                sets.append(list(combo) + [-1] * (width - size))
    return np.asarray(sets, dtype=np.int32).reshape(len(sets), width)


def candidate_parent_sets(
    num_nodes: int,
    max_parents: int | Sequence[int],
    *,
    required_edges: Sequence[tuple[int, int]] = (),
    forbidden_edges: Sequence[tuple[int, int]] = (),
    tiers: Sequence[int] | None = None,
    within: np.ndarray | None = None,
) -> tuple[Int[Array, "_sets max_parents"], ...]:
    """Candidate parent sets of every node (see `enumerate_parent_sets`); edges are
    `(parent, child)` index pairs. Prior knowledge about the graph, all of it hard (a set that
    breaks it is not a candidate, so its posterior is 0 and it is never drawn):

    - `max_parents`: the largest in-degree, one for every node or one per node (every node's
      array is padded to the largest);
    - `required_edges`, `forbidden_edges`: edges every candidate set has, or none has;
    - `tiers`: a tier (an integer) per node, e.g. a temporal order; a node's parents come from
      its own tier or earlier ones (an edge from a later tier into an earlier one is forbidden;
      a required one is an error).

    `within` (optional, `(N, N)` booleans, `[parent, child]`): parents outside it are left out
    too (the pools of a graph search)."""
    allowed, required, per_node = knowledge_arrays(
        num_nodes, max_parents, required_edges, forbidden_edges, tiers
    )
    if within is not None:
        allowed = allowed & np.asarray(within, bool)
    width = max(per_node)
    others = np.arange(num_nodes)
    return tuple(
        jax.device_put(  # a host array copied as it is (jnp.asarray would compile a program)
            enumerate_parent_sets(
                num_nodes,
                n,
                per_node[n],
                required=others[required[:, n]].tolist(),
                forbidden=others[~allowed[:, n] & (others != n)].tolist(),
                width=width,
            )
        )
        for n in range(num_nodes)
    )


def edges_by_index(edges, names: Sequence[str], flag: str) -> list:
    """`(parent, child)` pairs given by node names translated to indices (pairs of indices, and
    anything else, are left for `knowledge_arrays` to check); an unknown name is one line."""
    out = []
    for edge in edges:
        if (
            isinstance(edge, tuple | list)
            and len(edge) == 2
            and all(isinstance(v, str) for v in edge)
        ):
            unknown = [v for v in edge if v not in names]
            if unknown:
                raise ValueError(
                    f"{flag}: unknown node {unknown[0]!r} in {tuple(edge)!r}; the nodes are "
                    f"{list(names)}."
                )
            edge = (list(names).index(edge[0]), list(names).index(edge[1]))
        out.append(edge)
    return out


def knowledge_arrays(
    num_nodes: int,
    max_parents: int | Sequence[int],
    required_edges: Sequence[tuple[int, int]] = (),
    forbidden_edges: Sequence[tuple[int, int]] = (),
    tiers: Sequence[int] | None = None,
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The prior knowledge checked, as host arrays: `allowed` `(N, N)` (`[parent, child]`: not
    forbidden, not into an earlier tier, no self-loop), `required` `(N, N)` and the in-degree
    of every node (see `candidate_parent_sets`)."""
    per_node = check_max_parents(num_nodes, max_parents)
    for flag, edges in (("required_edges", required_edges), ("forbidden_edges", forbidden_edges)):
        for edge in edges:
            pair = tuple(edge) if isinstance(edge, tuple | list) else ()
            if len(pair) != 2 or not all(
                isinstance(v, int | np.integer) and not isinstance(v, bool) for v in pair
            ):
                raise ValueError(
                    f"{flag}: each edge is a (parent, child) pair of node indices, got "
                    f"{edge!r} (where the node names are known, pairs of names work too)."
                )
    for a, b in list(required_edges) + list(forbidden_edges):
        if not (0 <= a < num_nodes and 0 <= b < num_nodes):
            raise ValueError(f"edge ({a}, {b}): node index out of range for {num_nodes} nodes.")
        if a == b:
            raise ValueError(f"required/forbidden edges of node {a}: self-loops are not allowed.")
    allowed = ~np.eye(num_nodes, dtype=bool)
    required = np.zeros((num_nodes, num_nodes), bool)
    for a, b in forbidden_edges:
        allowed[a, b] = False
    for a, b in required_edges:
        required[a, b] = True
    if tiers is not None:
        tier = np.asarray(tiers)
        if tier.shape != (num_nodes,) or not np.issubdtype(tier.dtype, np.integer):
            raise ValueError(
                f"tiers: expected one integer tier per node ({num_nodes}), got {tiers!r}."
            )
        for a, b in required_edges:
            if tier[a] > tier[b]:
                raise ValueError(
                    f"required edge ({a}, {b}): node {a} is in a later tier ({tier[a]}) than "
                    f"node {b} ({tier[b]}), and tiers forbid edges into earlier tiers."
                )
        allowed &= ~(tier[:, None] > tier[None, :])
    return allowed, required, per_node


def check_max_parents(num_nodes: int, max_parents: int | Sequence[int]) -> list[int]:
    """`max_parents` as one in-degree per node, each in `0..N-1` (a `ValueError` otherwise)."""
    if isinstance(max_parents, bool) or not isinstance(
        max_parents, int | np.integer | Sequence | np.ndarray
    ):
        raise ValueError(
            f"max_parents: expected an integer or one integer per node ({num_nodes}), got "
            f"{max_parents!r}."
        )
    if isinstance(max_parents, int | np.integer):
        per_node = [int(max_parents)] * num_nodes
    else:
        per_node = list(max_parents)
        if len(per_node) != num_nodes or not all(
            isinstance(k, int | np.integer) and not isinstance(k, bool) for k in per_node
        ):
            raise ValueError(
                f"max_parents: expected an integer or one integer per node ({num_nodes}), got "
                f"{max_parents!r}."
            )
        per_node = [int(k) for k in per_node]
    for k in per_node:
        if not 0 <= k <= num_nodes - 1:
            raise ValueError(f"max_parents must be between 0 and {num_nodes - 1} (N - 1), got {k}.")
    return per_node
