r"""How a batch of independent computations (candidate interventions, posterior draws,
repetitions) is executed, as a Module passed keyword-only (`batching=`), in the style of
diffrax's `adjoint=`: [`jaxctbn.Vmap`][] (all at once) or [`jaxctbn.Chunked`][] (a
`jax.lax.map` over chunks, bounded memory) on one device, or [`jaxctbn.Sharded`][] (split
across devices with `jax.shard_map`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec


class AbstractBatching(eqx.Module):
    """Maps a function over the leading axis of a pytree of arrays."""

    @abc.abstractmethod
    def map(self, fn: Callable[[Any], Any], xs: Any) -> Any:
        """`fn` applied to every member of `xs` (leading axis); results stacked on a leading
        axis. Must give the same numbers as `jax.vmap(fn)(xs)` up to floating-point rounding."""

    @abc.abstractmethod
    def chunk_size(self, num_members: int) -> int:
        """How many members are computed together on one device (for schedulers that skip
        whole chunks)."""

    def map_sequentially(self, fn: Callable[[Any], Any], xs: Any) -> Any:
        """`fn` applied to the members of `xs` one after another on a device (`jax.lax.map`,
        not vectorised, so a `lax.cond` inside `fn` still skips work); results stacked on a
        leading axis. Schedulers that group members into chunks map `fn` over the chunks with
        this; [`jaxctbn.Sharded`][] splits them across its devices."""
        return jax.lax.map(fn, xs)


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


def _padded(xs, size: int):
    """`xs` with its leading axis padded to `size` by repeating the last member."""
    num = jax.tree_util.tree_leaves(xs)[0].shape[0]
    index = jnp.minimum(jnp.arange(size), num - 1)
    return jax.tree_util.tree_map(lambda x: x[index], xs)


def _shard_body(inner, fn, mesh, xs, sequential: bool = False):
    spec = PartitionSpec(mesh.axis_names)
    body = (lambda x: jax.lax.map(fn, x)) if sequential else (lambda x: inner.map(fn, x))
    # no replication checks: the devices' values are independent (no collectives), and the
    # host callbacks of `eqx.error_if` carry no replication information
    if hasattr(jax, "shard_map"):
        mapped = jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    else:  # jax < 0.7
        from jax.experimental.shard_map import shard_map  # pyright: ignore

        mapped = shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_rep=False)
    return mapped(xs)


# One compiled program per (inner, fn, mesh, shapes): `fn` is an argument, so a function that
# is a pytree (an `eqx.Partial`, a Module) is traced, not baked in, and reuses the program.
_sharded_program = eqx.filter_jit(_shard_body)
_sharded_sequential_program = eqx.filter_jit(
    lambda inner, fn, mesh, xs: _shard_body(inner, fn, mesh, xs, sequential=True)
)


class Sharded(AbstractBatching):
    """Members split across devices with `jax.shard_map`: the leading axis is padded to a
    multiple of the number of devices (repeating the last member), each device computes its
    share with `inner` (default [`jaxctbn.Vmap`][]), and the padding is dropped. Members are
    independent, so the numbers are those of `Vmap()` on one device (up to rounding) for any
    number of devices, and every member keeps its own key: the same keys give the same results.

    **Arguments (keyword-only):**

    - `mesh`: a `jax.sharding.Mesh`; the leading axis is split over all of its axes. Default
      `None`: a 1-D mesh over `jax.local_devices()`, the devices of this process (with
      `jax.distributed`, each process shards its own work over its own devices).
    - `inner`: how each device computes its share: `Vmap()` (default) or
      [`jaxctbn.Chunked`][] (bounded memory per device); not another `Sharded`.

    **Where errors are reported.** A check inside compiled code (`eqx.error_if`) raises from a
    host callback on the device that computes the failing member. Called from the host (as
    [`jaxctbn.run_repetitions`][] does), `map` compiles the sharded computation as a program of
    its own, with no communication between devices, runs it to completion and only then drops
    the padding, so a failing member raises as on one device. Inside a larger compiled program
    (a criterion's `batching=` under `jit`) the map is part of that program, and when a
    device stops at a failing check the others wait for it at the next collective: XLA aborts
    the process on CPU (after `--xla_cpu_collective_call_terminate_timeout_seconds`) and may
    hang on GPU. So shard the outermost batch (the repetitions) where checks may fail, and
    candidates only where they do not.

    ```python
    result = jc.run_repetitions(task, design, keys, num_experiments=10, batching=jc.Sharded())
    ```
    """

    mesh: jax.sharding.Mesh | None = eqx.field(default=None, static=True, kw_only=True)
    inner: AbstractBatching = eqx.field(default=Vmap(), kw_only=True)

    def __check_init__(self):
        if self.mesh is not None and not isinstance(self.mesh, jax.sharding.Mesh):
            raise ValueError(
                f"Sharded: mesh must be a jax.sharding.Mesh or None, got {type(self.mesh).__name__}."
            )
        if not isinstance(self.inner, AbstractBatching) or isinstance(self.inner, Sharded):
            raise ValueError(
                "Sharded: inner must be Vmap() or Chunked(size) (how each device computes its "
                f"share), got {self.inner!r}."
            )

    def _mesh(self) -> jax.sharding.Mesh:
        """`mesh`, or the 1-D mesh over this process's devices."""
        if self.mesh is not None:
            return self.mesh
        return jax.sharding.Mesh(np.array(jax.local_devices()), ("members",))

    @property
    def num_devices(self) -> int:
        """How many devices the members are split across."""
        return int(self._mesh().devices.size)

    def map(self, fn, xs):
        return self._split(fn, xs, sequential=False)

    def map_sequentially(self, fn, xs):
        """The members split across the devices as by `map`; each device computes its share
        one member after another (`jax.lax.map`)."""
        return self._split(fn, xs, sequential=True)

    def _split(self, fn, xs, *, sequential: bool):
        mesh = self._mesh()
        num = jax.tree_util.tree_leaves(xs)[0].shape[0]
        if num == 0:
            return jax.lax.map(fn, xs) if sequential else self.inner.map(fn, xs)
        size = -(-num // mesh.size) * mesh.size
        xs = _padded(xs, size)
        traced = any(
            isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves((fn, xs))
        )
        if traced:  # part of the caller's program
            out = _shard_body(self.inner, fn, mesh, xs, sequential)
        else:  # a program of its own, finished before the padding is dropped (see above)
            xs = jax.device_put(xs, NamedSharding(mesh, PartitionSpec(mesh.axis_names)))
            program = _sharded_sequential_program if sequential else _sharded_program
            out = jax.block_until_ready(program(self.inner, fn, mesh, xs))
        if size == num:
            return out
        return jax.tree_util.tree_map(lambda y: y[:num], out)

    def chunk_size(self, num_members: int) -> int:
        """`inner`'s chunk of one device's share of `num_members`."""
        share = -(-num_members // self._mesh().size)
        return self.inner.chunk_size(share)
