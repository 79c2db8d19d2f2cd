"""Type aliases used across jaxctbn (jaxtyping shapes)."""

from typing import TypeAlias

from jaxtyping import Array, ArrayLike, Bool, Float, Int

#: A conditional intensity table of one node: one $k\times k$ matrix per parent configuration.
ConditionalIntensities: TypeAlias = Float[Array, "configs states states"]
#: A probability vector over the global state space (itertools.product order over the nodes).
GlobalDistribution: TypeAlias = Float[Array, " global_states"]
#: One state per node.
NodeStates: TypeAlias = Int[Array, " nodes"]
#: Which nodes a perfect intervention targets.
NodeMask: TypeAlias = Bool[Array, " nodes"]
#: A padded parent list: node indices, `-1` for an empty slot.
ParentIndex: TypeAlias = Int[Array, " max_parents"]

__all__ = [
    "Array",
    "ArrayLike",
    "ConditionalIntensities",
    "GlobalDistribution",
    "NodeMask",
    "NodeStates",
    "ParentIndex",
]
