r"""Indexing of the global state space and of parent configurations.

Global states are ordered as `itertools.product` over the nodes in the order they are listed
(the last node varies fastest), so a probability vector of length $S=\prod_n k_n$ reshapes in C
order to a tensor with one axis per node. Parent configurations are ordered the same way over the
listed parents (the first parent is the most significant digit).

Parent lists may be given statically (a tuple of node indices) or as a traced integer array padded
with `-1`; the latter lets a batch of models with *different graphs* share one compiled function.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import overload

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Int


def all_global_states(cardinalities: tuple[int, ...]) -> np.ndarray:
    """All global states as an `(S, N)` integer array in itertools.product order."""
    grids = np.indices(cardinalities).reshape(len(cardinalities), -1).T
    return np.ascontiguousarray(grids.astype(np.int32))


def global_state_index(states, cardinalities: tuple[int, ...]):
    """Flat index of a global state (works on numpy and jax arrays, batched over leading axes)."""
    strides = np.array(
        [math.prod(cardinalities[i + 1 :]) for i in range(len(cardinalities))], dtype=np.int32
    )
    return (states * strides).sum(-1)


@overload
def num_configurations(
    parents: tuple[int, ...] | list[int], cardinalities: Sequence[int]
) -> int: ...


@overload
def num_configurations(
    parents: ArrayLike, cardinalities: Sequence[int]
) -> Int[Array, "*batch"]: ...


def num_configurations(
    parents: tuple[int, ...] | list[int] | ArrayLike, cardinalities: Sequence[int]
) -> int | Int[Array, "*batch"]:
    """Number of configurations of a parent set: a Python `int` for a static tuple of node
    indices, an integer array for a (batch of) padded parent array(s) (`-1` = empty slot).
    This is the one place configuration counts are computed."""
    if isinstance(parents, tuple | list):
        return math.prod(cardinalities[int(p)] for p in parents)
    parents = jnp.asarray(parents)
    card = jnp.asarray(cardinalities)
    return jnp.prod(jnp.where(parents >= 0, card[jnp.maximum(parents, 0)], 1), axis=-1)


def max_configs(node: int, cardinalities: tuple[int, ...], max_parents: int) -> int:
    """Largest number of parent configurations of `node` over parent sets of size <= max_parents
    (the padded size of a configuration axis)."""
    others = sorted((k for j, k in enumerate(cardinalities) if j != node), reverse=True)
    return math.prod(others[:max_parents])


def parse_assignment(
    text: str | None,
    names,
    what: str,
    cardinalities: tuple[int, ...] | None = None,
    *,
    separators: str = ",;",
) -> dict[str, int]:
    """Parse `"A=1,B=0"` (or `;`-separated) into `{name: value}` with one-line errors that start
    with `what`. With `cardinalities`, each value must be a state of its node (0..k-1). This is
    the one NAME=VALUE parser (CLI options, the CSV `intervention` column)."""
    if text is None or str(text).strip() == "":
        return {}
    names = list(names)
    text = str(text)
    for sep in separators[1:]:
        text = text.replace(sep, separators[0])
    out: dict[str, int] = {}
    for part in text.split(separators[0]):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise ValueError(f"{what}: expected NODE=STATE, got {part!r}.")
        name, value = (x.strip() for x in part.split("=", 1))
        if name not in names:
            raise ValueError(f"{what}: unknown node {name!r}; nodes are {names}.")
        try:
            number = int(value)
        except ValueError:
            raise ValueError(
                f"{what}: value of {name!r} must be an integer, got {value!r}."
            ) from None
        if cardinalities is not None:
            k = cardinalities[names.index(name)]
            if not 0 <= number < k:
                raise ValueError(f"{what}: state of {name!r} must be in 0..{k - 1}, got {number}.")
        if name in out:
            raise ValueError(f"{what}: node {name!r} given twice.")
        out[name] = number
    return out


def parent_configurations(parents: tuple[int, ...], cardinalities: tuple[int, ...]) -> list:
    """Parent configurations in itertools.product order."""
    return list(itertools.product(*(range(cardinalities[p]) for p in parents)))


def config_index(
    states: Int[Array, "... nodes"],
    parents,
    cardinalities: tuple[int, ...],
) -> Int[Array, "..."]:
    """Index of the parent configuration of `states` for the parent list `parents`.

    `parents` is either a static tuple of node indices, or an integer array padded with `-1`
    (padded slots count as a parent with one state, so they do not change the index).
    """
    if isinstance(parents, tuple | list):
        index = jnp.zeros(states.shape[:-1], dtype=jnp.int32)
        for p in parents:
            index = index * cardinalities[p] + states[..., p]
        return index
    present, safe, _, strides = slot_strides(parents, cardinalities)
    slot_value = jnp.where(present, jnp.take(states, safe, axis=-1), 0)
    return (slot_value * strides).sum(-1).astype(jnp.int32)


def slot_strides(parents, cardinalities: tuple[int, ...]) -> tuple[Array, Array, Array, Array]:
    """For a padded parent array `(slots,)` (`-1` = empty): `(present, safe, slot_card,
    strides)`: which slots hold a parent, the slot's node index (0 where empty), its
    cardinality (1 where empty) and its stride in the configuration index (the product of the
    later slots' cardinalities; the first parent is the most significant digit)."""
    parents = jnp.asarray(parents, jnp.int32)
    card = jnp.asarray(cardinalities, dtype=jnp.int32)
    present = parents >= 0
    safe = jnp.where(present, parents, 0)
    slot_card = jnp.where(present, card[safe], 1)
    later = jnp.cumprod(slot_card[::-1])[::-1]
    strides = jnp.concatenate([later[1:], jnp.ones((1,), dtype=later.dtype)])[: parents.shape[-1]]
    return present, safe, slot_card, strides


def state_bins_on_sets(
    node: int, parent_sets: Int[Array, "sets max_parents"], cardinalities: tuple[int, ...], dtype
) -> Array:
    """Per padded parent set, the one-hot matrix `(sets, S, configs * k)` that sends global state
    $s$ to the bin $c(s_P)\\,k + s_n$ of `node` (`configs` = the most configurations any set of
    that padding can have). A node statistic on every set is this matrix times a per-state
    statistic; the matrix depends on no model, so a batch of models shares it."""
    states = jnp.asarray(all_global_states(cardinalities))
    k = cardinalities[node]
    configs = max_configs(node, cardinalities, parent_sets.shape[-1])

    def one_hot(parents):
        bins = config_index(states, parents, cardinalities) * k + states[:, node]
        return (bins[:, None] == jnp.arange(configs * k)).astype(dtype)

    return jax.vmap(one_hot)(jnp.asarray(parent_sets))


def rounded_size(n: int) -> int:
    r"""The least of $1, 2, 3, 4, 6, 8, 12, \dots$ ($2^k$ and $3\cdot2^{k-1}$) that is at least
    `n` (a shape that a compiled program is shared by)."""
    if n <= 2:
        return max(int(n), 1)
    power = 1 << (int(n) - 1).bit_length()  # the least power of two >= n
    return power * 3 // 4 if power * 3 // 4 >= n else power
