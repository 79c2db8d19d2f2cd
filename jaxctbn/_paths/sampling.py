"""Exact (Gillespie) sampling of cCTBN trajectories under an intervention, or of only their
statistics over the global states (what the structure criteria need, without the jumps)."""

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
from jaxtyping import Array, ArrayLike, Float, Int, Key, PRNGKeyArray

from .._errors import error_if
from .._model.ctbn import AbstractCTBN
from .._model.interventions import Intervention
from .._model.layout import all_global_states, global_state_index, state_bins_on_sets
from .gillespie_loop import EventBuffer, StateStatistics, gillespie, model_rates, rate_table
from .trajectories import Trajectories


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
    s0, key = draw_initial_state(model, intervention, initial_state, key)
    batch = batch_trajectories(model, horizon, s0[None], key[None], intervention, max_events)
    return jax.tree_util.tree_map(lambda a: a[0], batch)


def _prepare(model, horizon, intervention, max_events):
    """Checks shared by all paths: the (intervened) model's rates and the horizon."""
    check_count(max_events, "max_events")
    horizon = _checked_horizon(horizon, jnp.result_type(*model.cims))
    model, intervention = _intervened(model, intervention)
    return model, horizon, intervention


def _checked_horizon(horizon, dtype) -> Array:
    if jnp.ndim(horizon) != 0:
        raise ValueError(
            f"horizon: expected one number (a scalar), got shape {jnp.shape(horizon)}; vmap "
            "over horizons for several."
        )
    horizon = jnp.asarray(horizon, dtype)
    return cast(
        Array,
        error_if(
            horizon,
            ~(horizon > 0) | ~jnp.isfinite(horizon),
            "horizon: must be positive and finite.",
        ),
    )


def _intervened(model, intervention):
    """The checked intervened model and the checked intervention (`None` = no intervention)."""
    if intervention is None:
        intervention = Intervention.none(model.num_nodes)
    intervention = intervention.checked(model)  # clamped states in range, named as such
    model = intervention.apply(model.checked())
    if intervention.replacement_cims is not None or intervention.rate_scales is not None:
        # checked again after an imperfect intervention, which can make rates negative or NaN
        # (a perfect one only zeroes checked rates; each check costs tracing time)
        model = model.checked("cims under the intervention")
    return model, intervention


def draw_initial_state(model, intervention, initial_state, key):
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
        p0 = error_if(
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
    s0 = error_if(
        s0,
        jnp.any((s0 < 0) | (s0 >= jnp.asarray(model.cardinalities))),
        f"initial_state: node states must be in 0..k-1 for cardinalities {model.cardinalities}.",
    )
    return s0, key


def nested_vmap(fn, ndim: int):
    """`fn` mapped over `ndim` leading axes of every argument."""
    for _ in range(ndim):
        fn = jax.vmap(fn)
    return fn


#: Largest rate table (global states x transitions) that `batch_trajectories` looks rates up in.
_MAX_TABLE_ENTRIES = 2**16


def batch_trajectories(model, horizon, s0, keys, intervention, max_events) -> Trajectories:
    """`gillespie` with an event buffer, for a batch of paths `s0 (B, N)`, `keys (B,)` of one
    model."""
    n_nodes = model.num_nodes
    cards = model.cardinalities
    recorder = EventBuffer(cards, max_events, horizon)
    if math.prod(cards) * sum(cards) <= _MAX_TABLE_ENTRIES:
        # one row of a (small, cache-resident) table per jump instead of every node's rates
        source, rates_at = rate_table(model), lambda table, s: table[global_state_index(s, cards)]
    else:
        source, rates_at = model, model_rates
    s_end, count, truncated, (times, states) = gillespie(
        source, rates_at, horizon, s0, keys, max_events, recorder
    )
    # padding after the last jump repeats the final state
    pad = jnp.arange(max_events) >= count[:, None]
    states = jnp.where(pad[:, :, None], s_end[:, None], states)
    B = s0.shape[0]
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


class PathStatistics(eqx.Module):
    r"""What sampled paths add to the statistics of one node, kept over the global states
    instead of as jumps: `dwell_times` `(*batch, S)` (the time spent in each global state) and
    `jumps` `(*batch, S, k)` (the jumps of `node` out of each state to each of its `k` states).
    The node's statistics under any parent set are projections of these
    ([`PathStatistics.node_statistics_on_sets`][]); they equal those that
    `node_statistics` cuts from the same paths as trajectories, up to rounding."""

    dwell_times: Float[Array, "*batch global_states"]
    jumps: Float[Array, "*batch global_states k"]
    node: int = eqx.field(static=True)
    cardinalities: tuple[int, ...] = eqx.field(static=True)

    def node_statistics_on_sets(
        self, parent_sets: Int[Array, "sets max_parents"]
    ) -> tuple[Float[Array, "*batch sets configs k k"], Float[Array, "*batch sets configs k"]]:
        """`(transitions, dwell_times)` of the node projected onto every padded parent set, for
        every path of the batch."""
        k = self.cardinalities[self.node]
        G = state_bins_on_sets(self.node, parent_sets, self.cardinalities, self.dwell_times.dtype)
        V = jnp.concatenate([self.dwell_times[..., None], self.jumps], axis=-1)  # (*batch, S, 1+k)
        out = jnp.einsum("psb,...sj->...pbj", G, V)
        out = out.reshape(*out.shape[:-2], -1, k, 1 + k)  # (*batch, sets, configs, k, 1 + k)
        return out[..., 1:], out[..., 0]


def path_statistics(
    model: AbstractCTBN,
    intervention: Intervention,
    initial_state: ArrayLike,
    horizon: ArrayLike,
    keys: Key[Array, "*batch paths"],
    max_events: int,
    node: int,
) -> PathStatistics:
    """The `PathStatistics` of `node` for one path per key: `keys` has shape `(*batch, paths)`, and
    `model` and `intervention` carry the leading axes `batch` (one model and intervention per
    group of paths; broadcast them yourself); `initial_state` (as for
    `sample_trajectory`) and `horizon` are shared. Each path is the one
    `sample_trajectory` draws with the same model, intervention and key, all of them in one
    loop, and no jumps are stored, so the cost does not grow with `max_events`. A path with
    more than `max_events` jumps raises an error, as its statistics from `sample_trajectory`
    would."""
    check_count(max_events, "max_events")
    horizon = _checked_horizon(horizon, jnp.result_type(*model.cims))
    cards = model.cardinalities
    N, S, R = len(cards), math.prod(cards), sum(cards)
    shape = keys.shape
    batch = shape[:-1]
    models, intervention = nested_vmap(_intervened, len(batch))(model, intervention)
    tables = nested_vmap(rate_table, len(batch))(models).reshape(-1, S, R)
    targets = intervention.targets.reshape(-1, N)
    clamped = intervention.states.reshape(-1, N)
    # one flat batch of paths; path p belongs to group p // paths (its model and intervention)
    group = jnp.repeat(jnp.arange(tables.shape[0]), shape[-1])
    s0, keys = jax.vmap(
        lambda g, k: draw_initial_state(
            model, Intervention(targets=targets[g], states=clamped[g]), initial_state, k
        )
    )(group, keys.reshape(-1))
    _, _, truncated, (dwell, jumps) = gillespie(
        (tables, group),
        lambda source, s: source[0][source[1], global_state_index(s, cards)],
        horizon,
        s0,
        keys,
        max_events,
        StateStatistics(cards, node, horizon.dtype),
        source_axes=(None, 0),
    )
    dwell, jumps = error_if(
        (dwell.reshape(*shape, S), jumps.reshape(*shape, S, cards[node])),
        jnp.any(truncated),
        f"max_events: a path sampled for a design criterion has more than {max_events} jumps; "
        "raise the criterion's max_events (EIG(max_events=...), MonteCarlo(max_events=...)).",
    )
    return PathStatistics(dwell_times=dwell, jumps=jumps, node=node, cardinalities=cards)


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
    """`num_trajectories` independent trajectories (vmapped `sample_trajectory`).

    `initial_states` is one state `(N,)` shared by all trajectories or one per trajectory
    `(num_trajectories, N)`.
    """
    check_count(num_trajectories, "num_trajectories")
    check_count(max_events, "max_events")
    # one compiled program (the capped sampler's, for the same types: the same paths), not one
    # per operation; the horizon as an array of the rates' type, so that every horizon shares it
    return _sample_keys_jit(
        model,
        jnp.asarray(initial_states),
        jnp.asarray(horizon, jnp.result_type(*model.cims)),
        jr.split(key, int(num_trajectories)),
        intervention,
        max_events,
    )


def check_count(value, name: str) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer (static), got {value!r}.")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}.")
    if value > np.iinfo(np.int32).max:
        raise ValueError(f"{name} must be at most 2**31 - 1 (a 32-bit size), got {value}.")


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
        lambda s, k: draw_initial_state(model, intervention, s, k), in_axes=(in_axes, 0)
    )(initial_states, keys)
    return batch_trajectories(model, horizon, s0, keys, intervention, max_events)


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
    power of two (fewer distinct compilations). `None` when the rates are not concrete (or
    not finite); a `ValueError` naming the horizon when finite rates over it need a buffer
    beyond a 32-bit size."""
    rate = exit_rate_bound(model)
    if rate is None or not (rate >= 0 and math.isfinite(rate)):
        return None
    mean = rate * float(horizon)
    finite = mean >= 0 and math.isfinite(mean)
    size = 1 << (events_bound(mean) - 1).bit_length() if finite else 0
    if not finite or size > np.iinfo(np.int32).max:
        raise ValueError(
            f"horizon: {float(horizon):g} is too long for a path's event buffer: about "
            f"{mean:.3g} jumps expected (the fastest exit rate {rate:.3g} x the horizon), more "
            "than a 32-bit buffer holds; give a shorter horizon."
        )
    return size


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
    check_count(max_events, "max_events")
    check_count(num_trajectories, "num_trajectories")
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
