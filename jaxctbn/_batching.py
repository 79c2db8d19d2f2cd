r"""How a batch of independent computations (candidate interventions, posterior draws,
repetitions) is executed, as a Module passed keyword-only (`batching=`), in the style of
diffrax's `adjoint=`: [`jaxctbn.Vmap`][] (all at once) or [`jaxctbn.Chunked`][] (a
`jax.lax.map` over chunks, bounded memory). A later sharded execution is one more subclass.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax


class AbstractBatching(eqx.Module):
    """Maps a function over the leading axis of a pytree of arrays."""

    @abc.abstractmethod
    def map(self, fn: Callable[[Any], Any], xs: Any) -> Any:
        """`fn` applied to every member of `xs` (leading axis); results stacked on a leading
        axis. Must give the same numbers as `jax.vmap(fn)(xs)` up to floating-point rounding."""

    @abc.abstractmethod
    def chunk_size(self, num_members: int) -> int:
        """How many members are computed together (for schedulers that skip whole chunks)."""


class Vmap(AbstractBatching):
    """Everything at once: `jax.vmap(fn)(xs)` (fastest while it fits in memory)."""

    def map(self, fn, xs):
        return jax.vmap(fn)(xs)

    def chunk_size(self, num_members: int) -> int:
        return num_members


class Chunked(AbstractBatching):
    """`jax.lax.map(fn, xs, batch_size=size)`: `size` members vectorised at a time, the chunks
    one after another (memory bounded by one chunk).

    **Arguments:** `size`, a positive integer (static)."""

    size: int = eqx.field(static=True)

    def __check_init__(self):
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 1:
            raise ValueError(f"Chunked: size must be a positive integer, got {self.size!r}.")

    def map(self, fn, xs):
        return jax.lax.map(fn, xs, batch_size=self.size)

    def chunk_size(self, num_members: int) -> int:
        return min(self.size, num_members)
