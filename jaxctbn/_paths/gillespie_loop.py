"""The Gillespie loop: exact paths of a batch, all in one while loop, and what it records of
each path (its jumps in an event buffer, or only its statistics over the global states)."""

from __future__ import annotations

import abc
import math
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from .._model.ctbn import AbstractCTBN
from .._model.layout import all_global_states, global_state_index


def _transition_table(cardinalities) -> tuple[Array, Array]:
    """Transition `r` of the sampler (one per node and target state) moves node `owner[r]` to
    state `target[r]`; a node's transitions are contiguous, in the order of the nodes."""
    owner = np.concatenate([[n] * k for n, k in enumerate(cardinalities)])
    target = np.concatenate([np.arange(k) for k in cardinalities])
    return jnp.asarray(owner, jnp.int32), jnp.asarray(target, jnp.int32)


class _AbstractRecorder(eqx.Module):
    """What the Gillespie loop keeps of one path: its jumps (`EventBuffer`, for `Trajectories`)
    or only the statistics they add up to (`StateStatistics`, for the design criteria, whose
    cost then does not grow with the buffer size)."""

    cardinalities: eqx.AbstractVar[tuple[int, ...]]

    @abc.abstractmethod
    def init(self, s0: Int[Array, " nodes"]) -> Any:
        """The record of a path that starts in `s0` and has not moved yet."""

    @abc.abstractmethod
    def record(self, record: Any, step: "_Step") -> Any:
        """The record after one iteration of the loop (`step`; for a finished path a no-op)."""


class _Step(NamedTuple):
    """One iteration of the Gillespie loop for one path: it was in `state` from `time` to
    `end` (the next jump, or the horizon if that comes first) after `count` jumps; `accept`
    says whether the jump to `new_state` by transition `transition` happened (the path was
    running, the jump came before the horizon and within `max_events`), `running` whether the
    path was still running."""

    state: Int[Array, " nodes"]
    new_state: Int[Array, " nodes"]
    transition: Int[Array, ""]
    time: Float[Array, ""]
    end: Float[Array, ""]
    count: Int[Array, ""]
    accept: Bool[Array, ""]
    running: Bool[Array, ""]


class EventBuffer(_AbstractRecorder):
    """Every jump in a padded buffer of `max_events` slots (times, then the state after it)."""

    cardinalities: tuple[int, ...] = eqx.field(static=True)
    max_events: int = eqx.field(static=True)
    horizon: Float[Array, ""]

    def init(self, s0):
        times = jnp.full((self.max_events,), self.horizon)
        return times, jnp.broadcast_to(s0, (self.max_events, s0.shape[0]))

    def record(self, record, step):
        times, states = record
        # a rejected step writes nowhere (an out-of-range slot, dropped): no read of the slot
        slot = jnp.where(step.accept, step.count, self.max_events)
        times = times.at[slot].set(step.end, mode="drop")
        states = states.at[slot].set(step.new_state, mode="drop")
        return times, states


class StateStatistics(_AbstractRecorder):
    """What one node's statistics under any parent set are projections of (`PathStatistics`):
    the time the path spent in each global state `(S,)` and the jumps of `node` out of each
    state to each of its states `(S, k)`."""

    cardinalities: tuple[int, ...] = eqx.field(static=True)
    node: int = eqx.field(static=True)
    dtype: Any = eqx.field(static=True)

    def init(self, s0):
        S = math.prod(self.cardinalities)
        return jnp.zeros((S,), self.dtype), jnp.zeros(
            (S, self.cardinalities[self.node]), self.dtype
        )

    def record(self, record, step):
        dwell, jumps = record
        state = global_state_index(step.state, self.cardinalities)
        x, x_new = step.state[self.node], step.new_state[self.node]
        moved = step.accept & (x_new != x)  # only one node moves in a jump
        dwell = dwell.at[state].add(jnp.where(step.running, step.end - step.time, 0.0))
        jumps = jumps.at[state, x_new].add(moved.astype(self.dtype))
        return dwell, jumps


def model_rates(model: AbstractCTBN, s: Int[Array, " nodes"]) -> Float[Array, " transitions"]:
    """Rates of the transitions (`_transition_table`) out of global state `s`."""
    return jnp.concatenate([model.node_rates(n, s) for n in range(model.num_nodes)])


def rate_table(model: AbstractCTBN) -> Float[Array, "global_states transitions"]:
    """`model_rates` at every global state: for small state spaces a row lookup per jump is
    much cheaper than evaluating the conditional rates of every node (same numbers)."""
    states = jnp.asarray(all_global_states(model.cardinalities))
    return jax.vmap(lambda s: model_rates(model, s))(states)


def gillespie(source, rates_at, horizon, s0, keys, max_events, recorder, *, source_axes=None):
    """The Gillespie loop for a batch of paths, `s0` `(B, N)` and `keys` `(B,)`, as a while
    loop over the whole batch that runs until every path is done (each iteration advances
    every unfinished path). The rates out of state `s` are `rates_at(source, s)` for a pytree
    `source` (a model, or rate tables and an index into them) mapped over the paths by
    `jax.vmap`'s `in_axes=source_axes` (`None`: shared by all paths; otherwise 0 or None per
    part). Returns the final states, the numbers of jumps, whether a path had more than
    `max_events` jumps (it stops there, `truncated`), and the `recorder`'s record, each with a
    leading axis `B`.

    Not `jax.vmap` of a per-path loop on purpose: vmap turns a per-path stopping condition into
    a select over the whole carry in every iteration, which copies the event buffers, so the
    cost per event grows with `max_events` (quadratic overall for long paths). One flat batch,
    too: nested vmaps over groups of paths make the per-path lookups markedly slower. Large
    batches shrink instead: once at most `B / _SHRINK` paths still run, those continue alone
    in a loop over that many (the same paths: each path's randomness is its own key's)."""
    dtype = horizon.dtype
    owner, target = _transition_table(recorder.cardinalities)

    def body(source, carry):  # one path; a finished path (`done`) stays as it is
        t, s, count, key, truncated, done, record = carry
        key, k_time, k_choice = jr.split(key, 3)
        rates = rates_at(source, s)
        total = rates.sum()
        wait = jr.exponential(k_time, dtype=dtype) / total
        t_new = t + wait
        stops = ~(t_new < horizon)  # also when total == 0 (wait = inf)
        overflow = ~done & ~stops & (count >= max_events)
        u = jr.uniform(k_choice, dtype=dtype) * total
        # searchsorted(cumsum, u, side="right") as one comparison per transition (few of them)
        idx = jnp.minimum(jnp.sum(jnp.cumsum(rates) <= u, dtype=jnp.int32), rates.shape[0] - 1)
        s_new = s.at[owner[idx]].set(target[idx])
        accept = ~done & ~stops & ~overflow
        end = jnp.where(stops, horizon, t_new)
        record = recorder.record(record, _Step(s, s_new, idx, t, end, count, accept, ~done))
        s = jnp.where(accept, s_new, s)
        t = jnp.where(accept, t_new, t)
        count = count + accept.astype(count.dtype)
        return t, s, count, key, truncated | overflow, done | stops | overflow, record

    def start(s, key):
        false = jnp.zeros((), bool)
        return (
            jnp.zeros((), dtype),
            s,
            jnp.zeros((), jnp.int32),
            key,
            false,
            false,
            recorder.init(s),
        )

    step = jax.vmap(body, in_axes=(source_axes, 0))
    # `source_axes` (a prefix of `source`, like vmap's) for every leaf of `source`: 0 for those
    # that hold one entry per path, None for shared ones
    axes = jax.tree_util.tree_map(
        lambda axis, sub: jax.tree_util.tree_map(lambda _: axis, sub),
        source_axes,
        source,
        is_leaf=lambda x: x is None,
    )

    def run(source, carry, sizes):
        """Iterate until at most `sizes[1]` paths run, then continue with only those, gathered
        into a batch of that size (the last size: until every path is done)."""
        until = sizes[1] if len(sizes) > 1 else 0
        carry = jax.lax.while_loop(
            lambda carry: jnp.sum(~carry[5]) > until, lambda carry: step(source, carry), carry
        )
        if len(sizes) == 1:
            return carry
        # the running paths first (stable: a done path keeps its record as it is)
        index = jnp.argsort(carry[5], stable=True)[: sizes[1]]
        take = lambda a: a[index]  # noqa: E731
        part = run(
            jax.tree_util.tree_map(lambda a, ax: a if ax is None else take(a), source, axes),
            jax.tree_util.tree_map(take, carry),
            sizes[1:],
        )
        return jax.tree_util.tree_map(lambda a, b: a.at[index].set(b), carry, part)

    # Every iteration costs the same for every path of the batch, running or done, and path
    # lengths vary: once few paths run, they continue in a batch `_SHRINK` times smaller.
    sizes = [s0.shape[0]]
    while sizes[-1] // _SHRINK >= _MIN_SHRUNK_BATCH:
        sizes.append(sizes[-1] // _SHRINK)
    _, s_end, count, _, truncated, _, record = run(source, jax.vmap(start)(s0, keys), sizes)
    return s_end, count, truncated, record


#: `gillespie` continues with the running paths of a batch in a batch `_SHRINK` times smaller
#: once no more run than fit in it (each size is one more copy of the loop to compile), down to
#: `_MIN_SHRUNK_BATCH` paths.
_SHRINK = 8
_MIN_SHRUNK_BATCH = 1024
