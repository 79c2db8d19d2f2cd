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
) -> np.ndarray:
    """All parent sets of `node` with at most `max_parents` parents that contain every `required`
    parent and no `forbidden` one, ordered by size then lexicographically; shape
    `(sets, max_parents)`, padded with `-1`."""
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
    others = [m for m in range(num_nodes) if m != node and m not in forbidden_set]
    sets = []
    for size in range(max_parents + 1):
        for combo in itertools.combinations(others, size):
            if required_set <= set(combo):
                sets.append(list(combo) + [-1] * (max_parents - size))
    return np.asarray(sets, dtype=np.int32).reshape(len(sets), max_parents)


def candidate_parent_sets(
    num_nodes: int,
    max_parents: int,
    *,
    required_edges: Sequence[tuple[int, int]] = (),
    forbidden_edges: Sequence[tuple[int, int]] = (),
) -> tuple[Int[Array, "_sets max_parents"], ...]:
    """Candidate parent sets of every node (see [`jaxctbn.internal.enumerate_parent_sets`][]); edges are
    `(parent, child)` index pairs."""
    for a, b in list(required_edges) + list(forbidden_edges):
        if not (0 <= a < num_nodes and 0 <= b < num_nodes):
            raise ValueError(f"edge ({a}, {b}): node index out of range for {num_nodes} nodes.")
    return tuple(
        jax.device_put(  # a host array copied as it is (jnp.asarray would compile a program)
            enumerate_parent_sets(
                num_nodes,
                n,
                max_parents,
                required=[a for a, b in required_edges if b == n],
                forbidden=[a for a, b in forbidden_edges if b == n],
            )
        )
        for n in range(num_nodes)
    )
