"""Exact (Gillespie) sampling of cCTBN trajectories under an intervention."""

from __future__ import annotations

import math
import sys
from typing import cast

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from ._ctbn import AbstractCTBN
from ._interventions import Intervention
from ._layout import all_global_states


class Trajectories(eqx.Module):
    r"""Padded trajectories (one, or a batch with leading axes on every field).

    Trajectory $r$ starts in `initial_states[r]` at time 0; its `i`-th jump
    (`i < num_events[r]`) happens at `jump_times[r, i]` and leads to `states[r, i]` (the whole
    global state after the jump); it is observed until `durations[r]`. Slots past `num_events`
    are padding (time = horizon, state = the last state). `truncated[r]` is `True` when the event
    buffer was too small and the path is incomplete: statistics refuse such paths.
    `intervention_targets` / `intervention_states` record the perfect intervention each trajectory
    was recorded under (for data pooling).
    """

    initial_states: Int[Array, "*batch nodes"]
    jump_times: Float[Array, "*batch events"]
    states: Int[Array, "*batch events nodes"]
    num_events: Int[Array, "*batch"]
    durations: Float[Array, "*batch"]
    truncated: Bool[Array, "*batch"]
    intervention_targets: Bool[Array, "*batch nodes"]
    intervention_states: Int[Array, "*batch nodes"]

    @property
    def num_trajectories(self) -> int:
        return int(np.prod(self.num_events.shape))

    @property
    def max_events(self) -> int:
        return int(self.jump_times.shape[-1])


def sample_trajectory(
    model: AbstractCTBN,
    initial_state: ArrayLike,
    horizon: ArrayLike,
    *,
    key: PRNGKeyArray,
    intervention: Intervention | None = None,
    max_events: int = 256,
) -> Trajectories:
    r"""One exact trajectory by the Gillespie algorithm (for many, [`jaxctbn.sample_trajectories`][]
    runs them in one loop, faster than `jax.vmap` of this for long paths).

    At state $s$ every node $n$ offers transitions $x_n\to x'$ at rate $\Lambda_n(x_n,x',u_n(s))$
    (zero for perfectly intervened nodes); the waiting time is exponential with the total rate and
    the transition is drawn proportionally to its rate.

    **Arguments:**

    - `model`, `initial_state` (ints, one per node, or a float distribution over the global
      states to draw it from; clamped nodes are moved to their clamped state),
      `horizon` ($\tau>0$), `key`, optional `intervention`.
    - `max_events`: buffer size (static). If the path has more jumps the result has
      `truncated=True`; statistics computed from it raise an error instead of using a cut path.
    """
    model, horizon, intervention = _prepare(model, horizon, intervention, max_events)
    s0, key = _initial_state(model, intervention, initial_state, key)
    batch = _gillespie(model, horizon, s0[None], key[None], intervention, max_events)
    return jax.tree_util.tree_map(lambda a: a[0], batch)


def _prepare(model, horizon, intervention, max_events):
    """Checks shared by all paths: the (intervened) model's rates and the horizon."""
    _check_count(max_events, "max_events")
    if jnp.ndim(horizon) != 0:
        raise ValueError(
            f"horizon: expected one number (a scalar), got shape {jnp.shape(horizon)}; vmap "
            "over horizons for several."
        )
    if intervention is None:
        intervention = Intervention.none(model.num_nodes)
    intervention = intervention.checked(model)  # clamped states in range, named as such
    # checked again after an imperfect intervention, which can make rates negative or NaN
    model = intervention.apply(model.checked()).checked("cims under the intervention")
    dtype = jnp.result_type(*model.cims)
    horizon = jnp.asarray(horizon, dtype)
    horizon = cast(
        Array,
        eqx.error_if(
            horizon,
            ~(horizon > 0) | ~jnp.isfinite(horizon),
            "horizon: must be positive and finite.",
        ),
    )
    return model, horizon, intervention


def _initial_state(model, intervention, initial_state, key):
    """One path's initial state (drawn when given as a distribution) and its remaining key."""
    n_nodes = model.num_nodes
    s0 = jnp.asarray(initial_state)
    if jnp.issubdtype(s0.dtype, jnp.floating):
        # a distribution over the global states: draw the initial state from it
        if s0.size != model.num_global_states:
            raise ValueError(
                f"initial_state: a distribution needs {model.num_global_states} probabilities "
                f"(one per global state), got shape {s0.shape}."
            )
        p0 = eqx.error_if(
            s0.reshape(-1),
            jnp.any(s0 < 0) | (jnp.abs(s0.sum() - 1) > 1e-6) | jnp.any(~jnp.isfinite(s0)),
            "initial_state: probabilities must be finite, non-negative and sum to 1.",
        )
        key, key_init = jr.split(key)
        index = jr.categorical(key_init, jnp.log(p0))
        s0 = jnp.asarray(all_global_states(model.cardinalities))[index]
    if s0.shape != (n_nodes,) or not jnp.issubdtype(s0.dtype, jnp.integer):
        raise ValueError(f"initial_state: expected {n_nodes} integer node states, got {s0.shape}.")
    s0 = intervention.initial_states(s0.astype(jnp.int32))
    s0 = eqx.error_if(
        s0,
        jnp.any((s0 < 0) | (s0 >= jnp.asarray(model.cardinalities))),
        f"initial_state: node states must be in 0..k-1 for cardinalities {model.cardinalities}.",
    )
    return s0, key


def _gillespie(model, horizon, s0, keys, intervention, max_events) -> Trajectories:
    """The Gillespie loop for a batch of paths `s0 (B, N)`, `keys (B,)` in **one** while loop
    that runs until every path is done (each iteration advances every unfinished path).

    Not `jax.vmap` of a per-path loop on purpose: vmap turns a per-path stopping condition into
    a select over the whole carry in every iteration, which copies the event buffers, so the
    cost per event grows with `max_events` (quadratic overall for long paths)."""
    n_nodes = model.num_nodes
    dtype = horizon.dtype
    cards = model.cardinalities
    owner = jnp.asarray(np.concatenate([[n] * k for n, k in enumerate(cards)]), jnp.int32)
    target = jnp.asarray(np.concatenate([np.arange(k) for k in cards]), jnp.int32)

    def rates_at(s):
        return jnp.concatenate([model.node_rates(n, s) for n in range(n_nodes)])

    def body(carry):  # one path; a finished path (`done`) stays as it is
        t, s, count, times, states, key, truncated, done = carry
        key, k_time, k_choice = jr.split(key, 3)
        rates = rates_at(s)
        total = rates.sum()
        wait = jr.exponential(k_time, dtype=dtype) / total
        t_new = t + wait
        stops = ~(t_new < horizon)  # also when total == 0 (wait = inf)
        overflow = ~done & ~stops & (count >= max_events)
        u = jr.uniform(k_choice, dtype=dtype) * total
        idx = jnp.clip(jnp.searchsorted(jnp.cumsum(rates), u, side="right"), 0, rates.shape[0] - 1)
        s_new = s.at[owner[idx]].set(target[idx])
        accept = ~done & ~stops & ~overflow
        slot = jnp.minimum(count, max_events - 1)
        times = times.at[slot].set(jnp.where(accept, t_new, times[slot]))
        states = states.at[slot].set(jnp.where(accept, s_new, states[slot]))
        s = jnp.where(accept, s_new, s)
        t = jnp.where(accept, t_new, t)
        count = count + accept.astype(count.dtype)
        return t, s, count, times, states, key, truncated | overflow, done | stops | overflow

    B = s0.shape[0]
    init = (
        jnp.zeros((B,), dtype),
        s0,
        jnp.zeros((B,), jnp.int32),
        jnp.full((B, max_events), horizon, dtype),
        jnp.broadcast_to(s0[:, None], (B, max_events, n_nodes)),
        keys,
        jnp.zeros((B,), bool),
        jnp.zeros((B,), bool),
    )
    _, s_end, count, times, states, _, truncated, _ = jax.lax.while_loop(
        lambda carry: jnp.any(~carry[-1]), jax.vmap(body), init
    )
    # padding after the last jump repeats the final state
    pad = jnp.arange(max_events) >= count[:, None]
    states = jnp.where(pad[:, :, None], s_end[:, None], states)
    return Trajectories(
        initial_states=s0,
        jump_times=times,
        states=states,
        num_events=count,
        durations=jnp.broadcast_to(horizon, (B,)),
        truncated=truncated,
        intervention_targets=jnp.broadcast_to(intervention.targets, (B, n_nodes)),
        intervention_states=jnp.broadcast_to(intervention.states, (B, n_nodes)),
    )


def sample_trajectories(
    model: AbstractCTBN,
    initial_states: ArrayLike,
    horizon: ArrayLike,
    *,
    key: PRNGKeyArray,
    num_trajectories: int,
    intervention: Intervention | None = None,
    max_events: int = 256,
) -> Trajectories:
    """`num_trajectories` independent trajectories (vmapped [`jaxctbn.sample_trajectory`][]).

    `initial_states` is one state `(N,)` shared by all trajectories or one per trajectory
    `(num_trajectories, N)`.
    """
    _check_count(num_trajectories, "num_trajectories")
    _check_count(max_events, "max_events")
    return _sample_keys(
        model,
        jnp.asarray(initial_states),
        horizon,
        jr.split(key, int(num_trajectories)),
        intervention,
        max_events,
    )


def _check_count(value, name: str) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer (static), got {value!r}.")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}.")


def _sample_keys(model, initial_states, horizon, keys, intervention, max_events) -> Trajectories:
    """One trajectory per key, all in one loop (the body of `sample_trajectories`, and of the
    capped sampler in batches of keys: the same key gives the same path either way)."""
    num = keys.shape[0]
    in_axes = 0 if initial_states.ndim == 2 else None
    if in_axes == 0 and initial_states.shape[0] != num:
        raise ValueError(
            f"initial_states: got {initial_states.shape[0]} states for {num} trajectories."
        )
    model, horizon, intervention = _prepare(model, horizon, intervention, max_events)
    s0, keys = jax.vmap(
        lambda s, k: _initial_state(model, intervention, s, k), in_axes=(in_axes, 0)
    )(initial_states, keys)
    return _gillespie(model, horizon, s0, keys, intervention, max_events)


_sample_keys_jit = eqx.filter_jit(_sample_keys)


# ------------------------------------------------------------- sizing the event buffer


def exit_rate_bound(model: AbstractCTBN) -> float | None:
    r"""An upper bound on the total exit rate of any global state: $\sum_n \max_{u,x}
    \sum_{x'\neq x}\Lambda_n(x,x',u)$ (host-side). The number of jumps of a path of length
    $\tau$ is then stochastically smaller than a Poisson variable of mean bound $\times\tau$
    (uniformisation). `None` when the rates are traced (inside `jit`) or not finite (the
    sampler's own checks report those)."""
    total = 0.0
    for cim in model.cims:
        if isinstance(cim, jax.core.Tracer):
            return None
        c = np.asarray(cim, float)
        k = c.shape[-1]
        off = np.where(np.eye(k, dtype=bool), 0.0, np.maximum(c, 0.0))
        if not np.all(np.isfinite(off)):
            return None
        total += float(off.sum(-1).max(initial=0.0))
    return total


def events_bound(mean: float) -> int:
    """A buffer size that a Poisson number of jumps with this `mean` exceeds with negligible
    probability: mean + 6 standard deviations + 16."""
    return int(math.ceil(mean + 6.0 * math.sqrt(mean) + 16.0))


def automatic_max_events(model: AbstractCTBN, horizon: float) -> int | None:
    """The event buffer for paths of length `horizon` from `model` (any perfect intervention
    only removes rates): `events_bound` of the exit-rate bound x horizon, rounded up to a
    power of two (fewer distinct compilations). `None` when the rates are not concrete."""
    rate = exit_rate_bound(model)
    mean = None if rate is None else rate * float(horizon)
    if mean is None or not (mean >= 0 and math.isfinite(mean)):
        return None
    return 1 << (events_bound(mean) - 1).bit_length()


#: Memory for one batch of event buffers in the capped sampler (bytes).
_BATCH_BYTES = 512 * 2**20
#: Expected jumps in all paths above which the capped sampler shows a progress bar.
_LONG_SAMPLING = 1e7


def sample_within_cap(
    model: AbstractCTBN,
    initial_states: ArrayLike,
    horizon: float,
    *,
    key: PRNGKeyArray,
    num_trajectories: int,
    intervention: Intervention | None = None,
    max_events: int,
    name: str = "max_events",
    progress: bool = True,
) -> Trajectories:
    """[`jaxctbn.sample_trajectories`][] for paths of unknown length, never truncated, with a bounded
    buffer (the same paths as `sample_trajectories` with a large enough buffer; host-side).

    The buffer is sized from `exit_rate_bound` first; when even that estimate exceeds the
    cap `max_events` (per path) this raises before sampling, naming the expected number of
    events. Otherwise trajectories are sampled in batches that fit in memory, each cut to its
    longest path; a truncated path (very unlikely: the estimate has 6 standard deviations of
    margin) doubles the buffer up to the cap and resamples that batch with the same keys, and a
    path longer than the cap raises. `name` is how errors call the cap (e.g. `--max-events`).
    Shows a progress bar on stderr when sampling is long (`progress`)."""
    _check_count(max_events, "max_events")
    _check_count(num_trajectories, "num_trajectories")
    horizon = float(horizon)
    if not (horizon > 0 and math.isfinite(horizon)):
        raise ValueError(f"horizon: must be positive and finite, got {horizon}.")
    R = int(num_trajectories)
    n_nodes = model.num_nodes
    if intervention is None:
        intervention = Intervention.none(n_nodes)
    rate = exit_rate_bound(intervention.apply(model))
    mean = 0.0 if rate is None else rate * horizon  # None: the sampler reports the bad rates
    need = events_bound(mean) if math.isfinite(mean) else math.inf
    if rate is not None and need > max_events:
        raise ValueError(
            f"{name}: a path of duration {horizon:g} is expected to have up to ~{mean:.2g} "
            f"events (exit rates sum to at most {rate:.3g}/s; {need:.3g} with margin), more "
            f"than {name} {max_events}; raise {name} or shorten the duration."
        )
    need = int(need)
    buffer = min(max_events, 1 << (need - 1).bit_length())
    initial_states = jnp.asarray(initial_states)
    per_path = initial_states.ndim == 2
    if per_path and initial_states.shape[0] != R:
        raise ValueError(
            f"initial_states: got {initial_states.shape[0]} states for {R} trajectories."
        )
    dtype = jnp.result_type(*model.cims)
    slot_bytes = jnp.dtype(dtype).itemsize + 4 * n_nodes
    batch = max(1, min(R, _BATCH_BYTES // (buffer * slot_bytes)))
    long = R * mean > _LONG_SAMPLING
    if long:  # smaller batches, so that the progress bar moves
        batch = min(batch, -(-R // 20))
    keys = jr.split(key, R)
    horizon_array = jnp.asarray(horizon, dtype)
    from tqdm.auto import tqdm

    bar = tqdm(
        total=R, unit="path", desc="sampling", file=sys.stderr, disable=not (progress and long)
    )
    parts = []
    for start in range(0, R, batch):
        stop = min(start + batch, R)
        pad = batch - (stop - start)  # the last batch is padded, so one compilation serves all
        k = jnp.concatenate([keys[start:stop], keys[:pad]])
        s0 = (
            jnp.concatenate([initial_states[start:stop], initial_states[:pad]])
            if per_path
            else initial_states
        )
        while True:
            traj = _sample_keys_jit(model, s0, horizon_array, k, intervention, buffer)
            traj = jax.tree_util.tree_map(lambda a: np.asarray(a)[: stop - start], traj)
            if not traj.truncated.any():
                break
            if buffer >= max_events:
                bar.close()
                raise ValueError(
                    f"{name}: a path of duration {horizon:g} has more than {max_events} events "
                    f"(expected up to ~{mean:.2g}); raise {name} or shorten the duration."
                )
            buffer = min(max_events, 2 * buffer)
        used = max(1, int(traj.num_events.max()))
        parts.append(
            eqx.tree_at(
                lambda t: (t.jump_times, t.states),
                traj,
                (traj.jump_times[:, :used], traj.states[:, :used]),
            )
        )
        bar.update(stop - start)
    bar.close()
    width = max(p.max_events for p in parts)

    def widen(p: Trajectories) -> Trajectories:
        # padding slots hold the duration and the last state (the final state of every path)
        extra = width - p.max_events
        times = np.concatenate(
            [p.jump_times, np.broadcast_to(p.durations[:, None], (p.num_events.shape[0], extra))],
            axis=1,
        )
        states = np.concatenate([p.states, np.repeat(p.states[:, -1:], extra, axis=1)], axis=1)
        return eqx.tree_at(lambda t: (t.jump_times, t.states), p, (times, states))

    return jax.tree_util.tree_map(
        lambda *a: jnp.asarray(np.concatenate(a)), *[widen(p) for p in parts]
    )
