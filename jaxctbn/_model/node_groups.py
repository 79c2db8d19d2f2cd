r"""A node index traced within a group of nodes of equal shapes.

A per-node computation written with static node indices is unrolled at trace time: one copy of
its program per node. For the nodes of a group whose tables have equal shapes (equal
cardinality, equal numbers of candidate parent sets, ...), a loop over the group with the node
as a traced value compiles the body once. [`GroupNode`][jaxctbn._model.node_groups.GroupNode]
is that value: the group (static) and the position in it (traced). Functions that take a node
accept an `int` or a `GroupNode`; what they build per node from static facts (index tables,
strides) they build for every node of the group and look up at the position
(`node_table`), what they read from per-node sequences they stack over the group and look up
(`node_entry`). With an `int` both return what the node alone gives, so the static route is
unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int


class GroupNode(eqx.Module):
    """Node `group[position]`: `group` (static) the node indices of a group of equal shapes,
    `position` (a traced integer scalar) which of them."""

    group: tuple[int, ...] = eqx.field(static=True)
    position: Int[Array, ""]

    def __check_init__(self):
        if not self.group:
            raise ValueError("group: a group has at least one node.")

    @property
    def index(self) -> Int[Array, ""]:
        """The node's index, traced."""
        return jnp.asarray(self.group, jnp.int32)[self.position]

    @property
    def first(self) -> int:
        """A node of the group (static): its shapes are every member's."""
        return self.group[0]


#: A node: a static index, or one traced within its group.
Node: TypeAlias = int | GroupNode


def node_index(node: Node) -> Any:
    """The node's index: the `int`, or the traced index of a `GroupNode`."""
    return node.index if isinstance(node, GroupNode) else node


def representative(node: Node) -> int:
    """A static node of the same shapes: the `int` itself, or the first of the group."""
    return node.first if isinstance(node, GroupNode) else node


def node_table(node: Node, table: Callable[[int], Any]) -> Any:
    """`table(n)` (numpy arrays built from static facts about node n, any pytree) for `node`:
    as it is for an `int`; for a `GroupNode`, stacked over the group's nodes (equal shapes) and
    looked up at the position."""
    if not isinstance(node, GroupNode):
        return table(node)
    tables = [table(n) for n in node.group]
    return jax.tree_util.tree_map(
        lambda *xs: jnp.asarray(np.stack([np.asarray(x) for x in xs]))[node.position], *tables
    )


def other_nodes(node: Node, num_nodes: int) -> Any:
    """The indices of the nodes other than `node` among `num_nodes`, in order (int32): a numpy
    array for an `int`, traced for a `GroupNode`."""
    return node_table(node, lambda n: np.array([j for j in range(num_nodes) if j != n], np.int32))


def node_entry(node: Node, per_node: Sequence[Any]) -> Any:
    """`per_node[n]` (a sequence with one pytree of arrays per node) for `node`: the entry for
    an `int`; for a `GroupNode`, the group's entries (equal shapes) stacked and looked up at
    the position."""
    if not isinstance(node, GroupNode):
        return per_node[node]
    entries = [per_node[n] for n in node.group]
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs)[node.position], *entries)


def per_node(
    fn: Callable[[Node], Any],
    num_nodes: int,
    groups: Sequence[Sequence[int]] | None = None,
    *,
    vectorised: bool = False,
) -> list:
    """`[fn(n) for n in range(num_nodes)]`, with the nodes of each group in `groups` (static;
    default one node each) computed together, the node a `GroupNode`: one compiled body per
    group instead of one per node. One after another (`jax.lax.map`: a `lax.cond` inside `fn`
    still skips work, and memory is one node's), or with `vectorised` side by side
    (`jax.vmap`: one random draw or one loop for the group). `fn`'s results for the nodes of
    a group must have equal shapes (any pytree of arrays)."""
    out: list = [None] * num_nodes
    for group in groups or [(n,) for n in range(num_nodes)]:
        group = tuple(int(n) for n in group)
        if len(group) == 1:
            out[group[0]] = fn(group[0])
            continue
        positions = jnp.arange(len(group), dtype=jnp.int32)

        def member(i, g=group):
            return fn(GroupNode(g, i))

        values = jax.vmap(member)(positions) if vectorised else jax.lax.map(member, positions)
        for i, n in enumerate(group):
            out[n] = jax.tree_util.tree_map(lambda x, i=i: x[i], values)
    return out
