r"""Inference under panel evidence by sampling: auxiliary-variable Gibbs sampling of whole CTBN
paths given panel observations (Rao & Teh 2013, "Fast MCMC sampling for Markov jump processes
and extensions", §5 for CTBNs), for networks beyond exact forward-backward (whose amalgamated
state space grows as $\prod_n k_n$).

One Gibbs update redraws the path of one node $n$ on $[t_0,t_{m-1}]$ given the paths of all
the others and the observations of $n$. Only $n$'s Markov blanket enters it: its parents
(its rates), its children (their likelihood) and the children's other parents (the children's
rates); the update works on those nodes' paths alone, so its cost does not grow with the
network:

1. **Uniformisation.** With $\Omega_n = 2\max_{x,u}q_n(x\mid u)$ (twice the node's largest exit
   rate), virtual jump times are drawn from a Poisson process of rate
   $\Omega_n-q_n(x_n(t)\mid u_n(t))$ along the current path (by thinning a rate-$\Omega_n$
   process). With the node's own jump times they form the candidate times $W$.
2. **Forward filtering, backward sampling** over the grid of $W$, the blanket's jump times
   and the observation times of $n$, in time order. At a candidate time the node moves by
   $B = I + Q_n(u_n(t))/\Omega_n$ (its parents' configuration at $t$); between grid points its
   children $c$ contribute $\exp(-\Delta\sum_c q_c(x_c\mid u_c))$, which depends on $x_n$
   through $u_c$; at a jump of a child, the child's rate of that jump; at an observation of $n$,
   the indicator of the observed state. The initial law of $x_n(t_0)$ is uniform (the exact
   route's default: conditional on the first observation).
3. The new path keeps the jumps at the candidate times where the sampled state changes
   (virtual jumps that stay are dropped).

A sweep updates every node once, in order; the chain's stationary law is the posterior over
complete paths given the observations. The first path jumps half-way between two
observations of a node that differ.

A path is held node by node: each node's jump times and values in a buffer of
`max_node_events` slots, so that an update gathers its blanket's rows (a grid of
$(1+|\mathrm{blanket}|)\cdot$`max_node_events` + `max_virtual` + observations points). The
samples are returned as whole paths of at most `max_events` jumps. Everything is padded to
static sizes and vectorised over trajectories (and chains) with `vmap`; a path or an update
that would need more than a buffer raises (`eqx.error_if`) rather than returning a truncated
sample.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from .._learning.chain_diagnostics import autocovariance
from .._model.ctbn import AbstractCTBN
from .._model.interventions import is_concrete
from .._model.layout import slot_strides
from .._paths.sampling import Trajectories
from .._paths.sufficient_statistics import NodeStatistics, node_statistics
from .observations import (
    PanelObservations,
    clamped_nodes,
    per_trajectory_tables,
    require_batch,
    trajectory_tables,
)


class _Tables(eqx.Module):
    """The model padded to common shapes, for a traced node index: parents `(N, P)`, children
    `(N, C)` and the other nodes of each Markov blanket `(N, B)` (parents, children, the
    children's other parents; `-1` = none), off-diagonal rates `(N, U, K, K)` (zero where
    padded), cardinalities `(N,)` and the uniformisation rates $\\Omega_n$ `(N,)`."""

    parents: Int[Array, "nodes slots"]
    children: Int[Array, "nodes children"]
    blanket: Int[Array, "nodes blanket"]
    rates: Float[Array, "nodes configs k k"]
    cardinalities: Int[Array, " nodes"]
    omega: Float[Array, " nodes"]
    static_cards: tuple[int, ...] = eqx.field(static=True)


def _parent_array(model: AbstractCTBN) -> Int[Array, "nodes slots"]:
    """The model's parent lists as one array `(N, P)` padded with `-1` (static tuples or the
    padded arrays of a [`jaxctbn.PaddedCTBN`][])."""
    lists = [
        jnp.asarray(model.parent_list(n), jnp.int32).reshape(-1) for n in range(model.num_nodes)
    ]
    P = max(1, max(int(p.shape[0]) for p in lists))
    return jnp.stack([jnp.pad(p, (0, P - p.shape[0]), constant_values=-1) for p in lists])


def sampler_bounds(model: AbstractCTBN) -> tuple[int, int]:
    """Static bounds on a node's children and on its Markov blanket (parents, children and
    the children's other parents): the largest counts when the graph is concrete, each
    rounded up to a power of two (graphs that differ little share one compiled sampler), at
    most $N-1$; $N-1$ when the graph is traced."""
    N = model.num_nodes
    lists = [model.parent_list(n) for n in range(N)]
    if not is_concrete(*lists):
        return max(1, N - 1), max(1, N - 1)
    return _bounds([{int(q) for q in np.asarray(p, int).reshape(-1) if q >= 0} for p in lists])


def candidate_sampler_bounds(parent_sets) -> tuple[int, int]:
    """`sampler_bounds` for every graph whose parent sets are among the candidate sets
    `parent_sets` (per node an integer array `(sets, k)` padded with `-1`): a node's possible
    parents are the union of its candidates; $N-1$ when the sets are traced."""
    N = len(parent_sets)
    if not is_concrete(*parent_sets):
        return max(1, N - 1), max(1, N - 1)
    return _bounds([{int(q) for q in np.asarray(p).reshape(-1) if q >= 0} for p in parent_sets])


def _bounds(parents: list[set[int]]) -> tuple[int, int]:
    N = len(parents)
    children = [{c for c in range(N) if n in parents[c]} for n in range(N)]
    blanket = [
        (parents[n] | children[n] | {q for c in children[n] for q in parents[c]}) - {n}
        for n in range(N)
    ]

    def rounded(count: int) -> int:
        return max(1, min(1 << max(0, count - 1).bit_length(), N - 1))

    return rounded(max(map(len, children))), rounded(max(map(len, blanket)))


def _first(mask: Array, size: int) -> Array:
    """Per row of a boolean matrix, the indices of its first `size` true entries in order
    (`-1` past them)."""
    order = jnp.argsort(~mask, axis=1, stable=True)[:, :size]
    return jnp.where(jnp.take_along_axis(mask, order, axis=1), order, -1).astype(jnp.int32)


def _tables(model: AbstractCTBN, bounds: tuple[int, int]) -> _Tables:
    cards = model.cardinalities
    N, K = len(cards), max(cards)
    parents = _parent_array(model)
    is_parent = jnp.any(parents[:, :, None] == jnp.arange(N)[None, None, :], axis=1)  # [c, n]
    is_child = is_parent.T  # [n, c]: c is a child of n
    co_parent = (is_child.astype(jnp.int32) @ is_parent.astype(jnp.int32)) > 0
    in_blanket = (is_parent | is_child | co_parent) & ~jnp.eye(N, dtype=bool)
    U = max(c.shape[0] for c in model.cims)
    rates = []
    for n, cim in enumerate(model.cims):
        k = cards[n]
        off = jnp.where(jnp.eye(k, dtype=bool), 0.0, cim)
        rates.append(jnp.pad(off, ((0, U - cim.shape[0]), (0, K - k), (0, K - k))))
    rates = jnp.stack(rates)
    omega = 2 * rates.sum(-1).max(axis=(1, 2))
    return _Tables(
        parents=parents,
        children=_first(is_child, bounds[0]),
        blanket=_first(in_blanket, bounds[1]),
        rates=rates,
        cardinalities=jnp.asarray(cards, jnp.int32),
        omega=jnp.where(omega > 0, omega, 1.0),
        static_cards=tuple(cards),
    )


class _Path(eqx.Module):
    """One path on $[0, D]$ (times relative to the first observation) held node by node: the
    initial state, and each node's jumps in time order, `(N, J)` (slots past a node's last
    jump: time `inf`), with the node's value after each."""

    initial: Int[Array, " nodes"]
    times: Float[Array, "nodes slots"]
    values: Int[Array, "nodes slots"]


class _Events(eqx.Module):
    """One whole path: the initial state, and every jump in time order, each one node moving
    to a new value (slots past `count`: time `inf`, node -1)."""

    initial: Int[Array, " nodes"]
    times: Float[Array, " events"]
    nodes: Int[Array, " events"]
    values: Int[Array, " events"]
    count: Int[Array, ""]


def _states_after(path: _Events) -> Int[Array, "events nodes"]:
    """The global state after each jump slot (padding slots repeat the last state)."""
    N, E = path.initial.shape[0], path.times.shape[0]
    own = path.nodes[:, None] == jnp.arange(N)[None, :]
    last = jax.lax.cummax(jnp.where(own, jnp.arange(E)[:, None], -1), axis=0)
    return jnp.where(last >= 0, path.values[jnp.maximum(last, 0)], path.initial[None, :])


def _whole(path: _Path, max_events: int) -> tuple[_Events, Array]:
    """The node-by-node `path` as one time-ordered list of `max_events` jump slots, and whether
    its jumps overflow them."""
    N, J = path.times.shape
    times = path.times.reshape(-1)
    order = jnp.argsort(times, stable=True)
    nodes = jnp.broadcast_to(jnp.arange(N, dtype=jnp.int32)[:, None], (N, J)).reshape(-1)
    times, nodes, values = times[order], nodes[order], path.values.reshape(-1)[order]
    count = jnp.sum(jnp.isfinite(times)).astype(jnp.int32)
    if N * J < max_events:
        pad = max_events - N * J
        times = jnp.concatenate([times, jnp.full((pad,), jnp.inf, times.dtype)])
        nodes = jnp.concatenate([nodes, jnp.full((pad,), -1, nodes.dtype)])
        values = jnp.concatenate([values, jnp.zeros((pad,), values.dtype)])
    times, nodes, values = times[:max_events], nodes[:max_events], values[:max_events]
    valid = jnp.isfinite(times)
    events = _Events(
        initial=path.initial,
        times=times,
        nodes=jnp.where(valid, nodes, -1),
        values=jnp.where(valid, values, 0),
        count=jnp.minimum(count, max_events),
    )
    return events, count > max_events


def _compacted(jumps: Array, times: Array, values: Array, size: int) -> tuple[Array, Array, Array]:
    """The entries of time-ordered `times` and `values` where `jumps` holds, moved to the front
    of a row of `size` slots (`inf`, `0` after them), and whether there are more than `size`."""
    slot = jnp.where(jumps, jnp.cumsum(jumps) - 1, size)
    row_times = jnp.full((size,), jnp.inf, times.dtype).at[slot].set(times, mode="drop")
    row_values = jnp.zeros((size,), values.dtype).at[slot].set(values, mode="drop")
    return row_times, row_values, jnp.sum(jumps) > size


def _initial_path(obs_times, obs_states, observed, size: int) -> tuple[_Path, Array]:
    """A first path consistent with the observations: each node starts in its first observed
    state (0 if never observed) and jumps half-way between two of its observations that
    differ."""
    num_rows, N = obs_states.shape
    index = jnp.where(observed, jnp.arange(num_rows)[:, None], -1)
    latest = jax.lax.cummax(index, axis=0)
    before = jnp.concatenate([jnp.full((1, N), -1, latest.dtype), latest[:-1]])
    safe = jnp.maximum(before, 0)
    previous = jnp.take_along_axis(obs_states, safe, axis=0)
    jump = observed & (before >= 0) & (obs_states != previous)
    mid = (obs_times[safe] + obs_times[:, None]) / 2
    first = jnp.argmax(observed, axis=0)
    initial = jnp.where(observed.any(0), obs_states[first, jnp.arange(N)], 0)
    times, values, overflow = jax.vmap(_compacted, in_axes=(1, 1, 1, None))(
        jump, mid, obs_states, size
    )
    return _Path(initial=initial, times=times, values=values), jnp.any(overflow)


def _update_node(tables: _Tables, path: _Path, n, evidence, duration, key, max_virtual: int):
    """Redraw node `n`'s path given its Markov blanket's and its observations (module
    docstring). Returns the new path, whether the node's jump buffer and the virtual times
    overflowed (`(2,)`) and whether the update found
    no path through its grid."""
    obs_times, obs_states, observed = evidence
    K = tables.rates.shape[-1]
    J = path.times.shape[1]
    dtype = path.times.dtype
    omega = tables.omega[n]
    k_n = tables.cardinalities[n]
    cards = tables.static_cards
    key_times, key_thin, key_back = jr.split(key, 3)

    # the local nodes: n first, then its blanket (`-1` slots: no path, state 0)
    blanket = tables.blanket[n]
    B = blanket.shape[0]
    local = jnp.concatenate([jnp.asarray(n, jnp.int32)[None], blanket])
    in_use = local >= 0
    safe = jnp.maximum(local, 0)
    l_times = jnp.where(in_use[:, None], path.times[safe], jnp.inf)  # (L, J)
    l_values = path.values[safe]
    l_initial = jnp.where(in_use, path.initial[safe], 0)

    def position(nodes):  # local positions of node indices (-1 = none)
        match = (nodes[..., None] == local) & (nodes >= 0)[..., None]
        return jnp.where(match.any(-1), jnp.argmax(match, -1), -1)

    def configuration(state, slots, strides):  # parent configuration from local states
        values = jnp.where(slots >= 0, jnp.take(state, jnp.maximum(slots, 0), axis=-1), 0)
        return (values * strides).sum(-1)

    slots_n, strides_n = position(tables.parents[n]), slot_strides(tables.parents[n], cards)[3]
    children = tables.children[n]
    safe_children = jnp.maximum(children, 0)
    child_parents = tables.parents[safe_children]  # (C, P)
    slots_c = position(child_parents)
    strides_c = jax.vmap(lambda p: slot_strides(p, cards)[3])(child_parents)
    child_position = position(children)  # (C,)

    def local_state_at(t):  # (T,) -> (T, L): the local states after the jumps at or before t
        j = jax.vmap(lambda row: jnp.searchsorted(row, t, side="right"))(l_times)
        values = jnp.take_along_axis(l_values, jnp.maximum(j - 1, 0), axis=1)
        return jnp.where(j > 0, values, l_initial[:, None]).T

    # 1. virtual jumps: a rate-Omega Poisson process on [0, D] (exponential gaps, already in
    # time order) thinned by 1 - q_n(x(t)) / Omega
    arrivals = jnp.cumsum(jr.exponential(key_times, (max_virtual + 1,), dtype) / omega)
    overflow = arrivals[-1] <= duration  # more than max_virtual arrivals in [0, D]
    u = jnp.where(arrivals[:-1] <= duration, arrivals[:-1], jnp.inf)
    at_u = local_state_at(jnp.where(jnp.isfinite(u), u, 0.0))
    exit_u = tables.rates[n, configuration(at_u, slots_n, strides_n), at_u[:, 0]].sum(-1)
    keep = jr.uniform(key_thin, (max_virtual,), dtype) * omega >= exit_u
    virtual = jnp.where(keep, u, jnp.inf)

    # 2. the grid: n's jumps and the virtual times (candidates), the blanket's jumps, and the
    # observations of n; in time order
    M = obs_times.shape[0]
    grid_t = jnp.concatenate(
        [
            l_times[0],
            virtual,
            l_times[1:].reshape(-1),
            jnp.where(observed[:, n], obs_times, jnp.inf),
        ]
    )
    kind = jnp.concatenate(
        [jnp.ones((J + max_virtual,), jnp.int32), jnp.full((B * J,), 2), jnp.full((M,), 3)]
    )  # 1 candidate, 2 a blanket node's jump, 3 an observation of n
    mover = jnp.concatenate(
        [jnp.full((J + max_virtual,), -1), jnp.repeat(jnp.arange(1, B + 1), J), jnp.full((M,), -1)]
    )  # the local position of the node jumping at a point of kind 2
    value = jnp.concatenate(
        [jnp.zeros((J + max_virtual,), l_values.dtype), l_values[1:].reshape(-1),
         jnp.zeros((M,), l_values.dtype)]
    )  # fmt: skip
    row = jnp.concatenate([jnp.zeros((J + max_virtual + B * J,), jnp.int32), jnp.arange(M)])
    order = jnp.argsort(grid_t, stable=True)
    grid_t, kind, mover, value, row = (a[order] for a in (grid_t, kind, mover, value, row))
    G = grid_t.shape[0]
    valid = jnp.isfinite(grid_t)
    t = jnp.where(valid, grid_t, duration)
    kind = jnp.where(valid, kind, 0)  # 0: padding, no action
    mover = jnp.where(kind == 2, mover, -1)
    # the local states after each point (n's own entry unused), and before it
    own = mover[:, None] == jnp.arange(B + 1)[None, :]
    last = jax.lax.cummax(jnp.where(own, jnp.arange(G)[:, None], -1), axis=0)
    after = jnp.where(last >= 0, value[jnp.maximum(last, 0)], l_initial[None, :])  # (G, L)
    previous = jnp.concatenate([l_initial[None], after[:-1]])
    gaps = jnp.maximum(jnp.diff(jnp.concatenate([jnp.zeros((1,), dtype), t])), 0.0)

    xs = jnp.arange(K)
    possible = xs < k_n

    def children_rates(state):  # (..., L) -> (..., K, C, K): each child's rates, n at each value
        s = jnp.where(jnp.arange(B + 1) == 0, xs[:, None], state[..., None, :])  # (..., K, L)
        u_c = jax.vmap(configuration, in_axes=(None, 0, 0), out_axes=-1)(s, slots_c, strides_c)
        x_c = jnp.take(s, jnp.maximum(child_position, 0), axis=-1)  # (..., K, C)
        q = tables.rates[safe_children, u_c, x_c]  # (..., K, C, K)
        return jnp.where((children >= 0)[:, None], q, 0.0)

    # the interval before each point (states as after the previous point), and the end's
    rates_before = children_rates(previous)  # (G, K, C, K)
    interval = jnp.exp(-gaps[:, None] * rates_before.sum((-2, -1)))
    last_gap = jnp.maximum(duration - t[-1], 0.0)
    end_factor = jnp.exp(-last_gap * children_rates(after[-1]).sum((-2, -1)))
    # a child's jump: its rate, with n at each value
    is_mover = (child_position[None, :] == mover[:, None]) & (child_position >= 0)[None, :]
    slot = jnp.argmax(is_mover, axis=1)
    jump_rates = jnp.take_along_axis(rates_before, slot[:, None, None, None], axis=2)[:, :, 0]
    child_rate = jnp.take_along_axis(jump_rates, value[:, None, None], axis=2)[..., 0]  # (G, K)
    point = jnp.where(is_mover.any(1)[:, None], child_rate, 1.0)
    seen = jnp.where(kind == 3, obs_states[row, n], -1)
    point = jnp.where((kind == 3)[:, None], (xs[None, :] == seen[:, None]).astype(dtype), point)
    point = jnp.where(possible[None, :], point, 0.0)
    # a candidate time: B = I + Q_n(u_n) / Omega (parents as after the point)
    off = tables.rates[n, configuration(after, slots_n, strides_n)] / omega  # (G, K, K)
    step = off + jnp.eye(K, dtype=dtype) * (1 - off.sum(-1))[..., None]
    moves = jnp.where((kind == 1)[:, None, None], step, jnp.eye(K, dtype=dtype))

    # 3. forward filtering
    prior = possible.astype(dtype) / k_n

    def forward(alpha, inputs):
        f, m, e = inputs
        a = ((alpha * f) @ m) * e
        z = a.sum()
        return jnp.where(z > 0, a / jnp.where(z > 0, z, 1), alpha), (alpha, z > 0)

    last_alpha, (alphas, ok) = jax.lax.scan(forward, prior, (interval, moves, point))
    final = last_alpha * end_factor
    feasible = jnp.all(ok) & (final.sum() > 0)

    # 4. backward sampling: x after the last point, then each earlier point's state (inverse
    # CDF draws from one batch of uniforms)
    uniforms = jr.uniform(key_back, (G + 1,), dtype)

    def draw(w, u):  # a state with probability proportional to the weights w
        cumulative = jnp.cumsum(w)
        return jnp.minimum(jnp.sum(cumulative <= u * cumulative[-1]), K - 1)

    x_last = draw(final, uniforms[-1])

    def backward(x_next, inputs):
        alpha, f, m, u = inputs
        x = draw(alpha * f * m[:, x_next], u)
        return x, x_next

    x_start, states_after = jax.lax.scan(
        backward, x_last, (alphas, interval, moves, uniforms[:-1]), reverse=True
    )
    states_before = jnp.concatenate([x_start[None], states_after[:-1]])

    # 5. n's new row: its jumps at the candidate times where the sampled state changes
    jumps = (kind == 1) & (states_after != states_before)
    times_n, values_n, overflow_row = _compacted(
        jumps, t, states_after.astype(path.values.dtype), J
    )
    new = _Path(
        initial=path.initial.at[n].set(x_start.astype(path.initial.dtype)),
        times=path.times.at[n].set(times_n),
        values=path.values.at[n].set(values_n),
    )
    # an infeasible update (no path through the grid: it cannot happen from a feasible path,
    # whose own jumps are candidates) keeps the old path
    new = jax.tree_util.tree_map(lambda a, b: jnp.where(feasible, a, b), new, path)
    return new, jnp.stack([feasible & overflow_row, overflow]), ~feasible


class GibbsSampler(eqx.Module):
    """Auxiliary-variable Gibbs sampling of complete paths given panel observations (module
    docstring): `burn_in` sweeps, then `num_samples` samples `thin` sweeps apart (all static).
    Static buffer sizes: `max_events` jumps per sampled path, `max_node_events` jumps per
    node of a path, `max_virtual` virtual jump times per node update; a path or update that
    needs more raises. A node update costs about
    $(1+b)\\cdot$`max_node_events` + `max_virtual` steps, $b$ the largest Markov blanket."""

    num_samples: int = eqx.field(default=200, static=True)
    burn_in: int = eqx.field(default=50, static=True)
    thin: int = eqx.field(default=1, static=True)
    max_events: int = eqx.field(default=64, static=True)
    max_virtual: int = eqx.field(default=64, static=True)
    max_node_events: int = eqx.field(default=32, static=True)

    def __check_init__(self):
        for name in ("num_samples", "thin", "max_events", "max_virtual", "max_node_events"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"GibbsSampler: {name} must be an integer >= 1, got {value!r}.")
        if not isinstance(self.burn_in, int) or isinstance(self.burn_in, bool) or self.burn_in < 0:
            raise ValueError(
                f"GibbsSampler: burn_in must be an integer >= 0, got {self.burn_in!r}."
            )


#: The default sampler of [`sample_panel_paths`][jaxctbn.panel.sample_panel_paths].
DEFAULT_SAMPLER = GibbsSampler()


class SampledPaths(eqx.Module):
    """Posterior samples of complete paths given panel observations.

    - `trajectories`: a [`jaxctbn.Trajectories`][] batch `(R, num_samples)` (trajectory, then
      sample), each on $[0, t_{m-1}-t_0]$ (time from its first observation), ready for the
      complete-data statistics (`jaxctbn.SufficientStatistics.from_trajectories`, structure
      learning).
    - `infeasible_updates`: per trajectory, node updates that found no path through their grid
      and kept the old one (0 for a chain started from a feasible path).
    - `jumps`: `(R, num_samples, N)` jumps of each node in each sample, the trace whose
      effective sample size `effective_sample_size` and split R-hat `split_r_hat` report.
    """

    trajectories: Trajectories
    infeasible_updates: Int[Array, " trajectories"]
    jumps: Int[Array, "trajectories samples nodes"]

    def effective_sample_size(self) -> Float[Array, "trajectories nodes"]:
        r"""Per trajectory and node, the effective sample size of the node's jump count over the
        samples: $S/\tau$, $\tau=-1+2\sum_{k}(\hat\rho_{2k}+\hat\rho_{2k+1})$ over the pairs of
        autocorrelations before the first pair that is not positive (Geyer's initial positive
        sequence; the autocorrelations by FFT); $S$ for a constant trace."""
        x = self.jumps.astype(self.trajectories.durations.dtype)
        S = x.shape[1]
        covariances = autocovariance(x)
        variance = covariances[:, 0]
        rho = covariances / jnp.where(variance > 0, variance, 1)[:, None]
        pairs = rho[:, : S // 2 * 2].reshape(rho.shape[0], -1, 2, rho.shape[2]).sum(2)
        positive = jnp.cumprod(pairs > 0, axis=1).astype(x.dtype)
        tau = -1 + 2 * (positive * pairs).sum(1)
        return jnp.where(variance > 0, S / jnp.maximum(tau, 1e-12), float(S))

    def split_r_hat(self) -> Float[Array, "trajectories nodes"]:
        r"""Per trajectory and node, the split-$\hat R$ of the node's jump count (Gelman et
        al., *Bayesian Data Analysis*, 3rd ed., §11.4): the chain's first $2n$ samples cut into
        two halves of $n$, $W$ the mean of their variances, $B/n$ the variance of their means,
        $\hat R=\sqrt{\bigl(\tfrac{n-1}{n}W+B/n\bigr)/W}$. Near 1 when the halves agree; above
        ~1.01-1.1 the chain has not mixed (it drifts, or is stuck in one region). 1 for a
        constant trace, $+\infty$ for two constant halves that differ; NaN-free. Needs
        `num_samples >= 4`."""
        x = self.jumps.astype(self.trajectories.durations.dtype)
        n = x.shape[1] // 2
        if n < 2:
            raise ValueError(f"split_r_hat: needs at least 4 samples, got {x.shape[1]}.")
        halves = jnp.stack([x[:, :n], x[:, n : 2 * n]])  # (2, R, n, N)
        within = halves.var(2, ddof=1).mean(0)  # W
        between_n = halves.mean(2).var(0, ddof=1)  # B / n
        pooled = (n - 1) / n * within + between_n
        safe = jnp.where(within > 0, within, 1.0)
        ratio = jnp.where(within > 0, pooled / safe, jnp.where(between_n > 0, jnp.inf, 1.0))
        return jnp.sqrt(ratio)


def _to_trajectories(path: _Events, duration, targets, clamps) -> Trajectories:
    valid = jnp.isfinite(path.times)
    return Trajectories(
        initial_states=path.initial,
        jump_times=jnp.where(valid, path.times, duration),
        states=_states_after(path),
        num_events=path.count,
        durations=duration,
        truncated=jnp.asarray(False),
        intervention_targets=targets,
        intervention_states=jnp.where(targets, clamps, 0).astype(jnp.int32),
    )


def _chain_start(times, states, num_observations, targets, clamps, max_node_events: int):
    """One trajectory's evidence `(times from the first visit, states, observed)`, its
    duration, a first path consistent with it, its overflow flags (a node's jumps, the virtual
    times) and whether an observation contradicts a clamp. A node clamped by the trajectory's
    perfect intervention (`targets`, `clamps`; its rates are zero in the tables) is held at its
    clamped state: the clamp is its evidence at every observation time."""
    num_rows, N = states.shape
    rows = jnp.arange(num_rows) < num_observations
    t0 = times[0]
    duration = times[num_observations - 1] - t0
    obs_times = jnp.where(rows, times - t0, jnp.inf)
    contradiction = jnp.any(rows[:, None] & targets & (states >= 0) & (states != clamps))
    states = jnp.where(rows[:, None] & targets, clamps, states)
    observed = rows[:, None] & (states >= 0)
    evidence = (obs_times, states, observed)
    path, too_many = _initial_path(
        jnp.where(rows, obs_times, 0.0), states, observed, max_node_events
    )
    overflow = jnp.stack([too_many, jnp.asarray(False)])
    return evidence, duration, path, overflow, contradiction


def _sweep(tables: _Tables, evidence, duration, carry, key, max_virtual: int):
    """One Gibbs sweep over the nodes, in order: `carry = (path, overflow, infeasible)`."""

    def one(n, c):
        path, overflow, infeasible = c
        new, flag, stuck = _update_node(
            tables, path, n, evidence, duration, jr.fold_in(key, n), max_virtual
        )
        return new, overflow | flag, infeasible + stuck.astype(jnp.int32)

    return jax.lax.fori_loop(0, tables.cardinalities.shape[0], one, carry)


def _chain(
    tables: _Tables, times, states, num_observations, targets, clamps, key, sampler: GibbsSampler
):
    """One trajectory's chain: its samples (as `_Path`s with a leading sample axis), the
    overflow flags (a node's jumps, the virtual times), the number of infeasible updates and
    whether an observation contradicts a clamp (`_chain_start`)."""
    evidence, duration, path, overflow, contradiction = _chain_start(
        times, states, num_observations, targets, clamps, sampler.max_node_events
    )

    def sweeps(carry, keys):
        carry = jax.lax.fori_loop(
            0,
            keys.shape[0],
            lambda i, c: _sweep(tables, evidence, duration, c, keys[i], sampler.max_virtual),
            carry,
        )
        return carry, carry[0]

    key_burn, key_samples = jr.split(key)
    carry = (path, overflow, jnp.zeros((), jnp.int32))
    if sampler.burn_in:
        carry, _ = sweeps(carry, jr.split(key_burn, sampler.burn_in))
    keys = jr.split(key_samples, sampler.num_samples * sampler.thin)
    keys = keys.reshape(sampler.num_samples, sampler.thin, *keys.shape[1:])
    (_, overflow, infeasible), samples = jax.lax.scan(sweeps, carry, keys)
    return samples, duration, overflow, infeasible, contradiction


class PathChains(eqx.Module):
    """Gibbs chains over the hidden paths of a flat batch of `R` panel trajectories, held
    between sweeps by a sampler whose model changes from sweep to sweep
    ([`jaxctbn.panel.SampledStructure`][] with a `path_sampler`): each trajectory's current
    path, its evidence and duration, its clamps, the buffers' overflow flags `(R, 2)`
    (`max_node_events`, `max_virtual`) and the infeasible updates `(R,)`."""

    paths: _Path
    evidence: tuple[Array, Array, Array]
    durations: Float[Array, " trajectories"]
    targets: Bool[Array, "trajectories nodes"]
    clamps: Int[Array, "trajectories nodes"]
    overflow: Bool[Array, "trajectories 2"]
    infeasible: Int[Array, " trajectories"]

    @classmethod
    def start(cls, observations: PanelObservations, num_nodes: int, sampler: GibbsSampler):
        """The chains' first paths (each node jumps half-way between two of its observations
        that differ), for observations already checked against the model; a contradiction
        between an observation and a clamp raises."""
        R = observations.times.shape[0]
        targets, clamps = clamped_nodes(observations, num_nodes)
        evidence, durations, paths, overflow, contradiction = jax.vmap(
            lambda t, s, m, tg, c: _chain_start(t, s, m, tg, c, sampler.max_node_events)
        )(observations.times, observations.states, observations.num_observations, targets, clamps)
        paths = eqx.error_if(
            paths,
            jnp.any(contradiction),
            "observations: a node observed in another state than its intervention's clamp.",
        )
        return cls(
            paths, evidence, durations, targets, clamps, overflow, jnp.zeros((R,), jnp.int32)
        )

    def swept(
        self,
        model: AbstractCTBN,
        observations: PanelObservations,
        key: PRNGKeyArray,
        sampler: GibbsSampler,
        bounds: tuple[int, int],
    ) -> PathChains:
        r"""Every trajectory's path after `sampler.thin` Gibbs sweeps under `model` (its
        intervened model per trajectory), from the current one: each leaves
        $p(S\mid Y,\text{model})$ invariant. `bounds`: static bounds on a node's children and
        Markov blanket under every graph the model may have (`sampler_bounds`)."""
        tables, _, _ = trajectory_tables(model, observations, lambda m: _tables(m, bounds))
        R = self.durations.shape[0]

        def chain(tab, evidence, duration, path, overflow, infeasible, key):
            carry = (path, overflow, infeasible)
            return jax.lax.fori_loop(
                0,
                sampler.thin,
                lambda i, c: _sweep(
                    tab, evidence, duration, c, jr.fold_in(key, i), sampler.max_virtual
                ),
                carry,
            )

        paths, overflow, infeasible = jax.vmap(chain)(
            tables,
            self.evidence,
            self.durations,
            self.paths,
            self.overflow,
            self.infeasible,
            jr.split(key, R),
        )
        return PathChains(
            paths, self.evidence, self.durations, self.targets, self.clamps, overflow, infeasible
        )

    def trajectories(self, max_events: int) -> tuple[Trajectories, Array]:
        """The current paths as a [`jaxctbn.Trajectories`][] batch `(R,)` of at most
        `max_events` jumps each (with the clamps, so that the structure scores pool them), and
        whether any needed more."""
        events, too_long = jax.vmap(lambda p: _whole(p, max_events))(self.paths)
        trajectories = jax.vmap(_to_trajectories)(events, self.durations, self.targets, self.clamps)
        return trajectories, jnp.any(too_long)


def sample_panel_paths(
    model: AbstractCTBN,
    observations: PanelObservations,
    *,
    key: PRNGKeyArray,
    sampler: GibbsSampler = DEFAULT_SAMPLER,
) -> SampledPaths:
    r"""Posterior samples of the complete paths of a batch of panel trajectories given their
    observations, by auxiliary-variable Gibbs sampling (module docstring): one chain per
    trajectory, all trajectories at once (`vmap`).

    - `model`: the CTBN whose path law is conditioned (its rates; no structural check of the
      observations beyond the exact route's: an observation the model cannot reach makes every
      update infeasible, reported in `infeasible_updates`).
    - `observations`: a batch `(R, O)` of [`jaxctbn.panel.PanelObservations`][] with exact
      (error-free) states, `-1` = missing; their interventions (perfect and imperfect, one per
      trajectory or one for all) apply as in the exact route: a clamped node stays at its
      clamped state (an observation of another state raises) and the samples record the
      clamps, so that the structure scores pool them; no exact entry times (not yet).
    - `key`; `sampler`: a [`jaxctbn.panel.GibbsSampler`][].

    **Returns:** [`jaxctbn.panel.SampledPaths`][]. Raises when a buffer is too small
    (`max_events`, `max_node_events`, `max_virtual`)."""
    require_batch(observations)
    if not isinstance(sampler, GibbsSampler):
        raise ValueError(f"sampler: expected a jaxctbn.panel.GibbsSampler, got {sampler!r}.")
    return _sample_panel_paths(model, observations, key, sampler, sampler_bounds(model))


@eqx.filter_jit
def _sample_panel_paths(model, observations, key, sampler, bounds: tuple[int, int]) -> SampledPaths:
    paths, overflow = _sample_unguarded(model, observations, key, sampler, bounds)
    trajectories = eqx.error_if(
        paths.trajectories,
        jnp.any(overflow),
        "sampler: a path needed more than max_events jumps (or a node more than "
        "max_node_events), or an update more than max_virtual virtual times; raise them "
        "(GibbsSampler(max_events=..., max_node_events=..., max_virtual=...)).",
    )
    return eqx.tree_at(lambda p: p.trajectories, paths, trajectories)


def _sample_unguarded(model, observations, key, sampler, bounds: tuple[int, int]):
    """`_sample_panel_paths` without the buffer guard: the samples and which buffers
    overflowed, `(3,)`: `max_events`, `max_node_events`, `max_virtual` (then the samples are
    not valid; a caller that can grow the buffers retries)."""
    model, observations, tables, targets, clamps = per_trajectory_tables(
        model, observations, lambda m: _tables(m, bounds), "sampling yet"
    )
    R = observations.times.shape[0]
    keys = jr.split(key, R)
    samples, durations, overflow, infeasible, contradiction = jax.vmap(
        lambda tab, t, s, m, tg, c, k: _chain(tab, t, s, m, tg, c, k, sampler)
    )(
        tables,
        observations.times,
        observations.states,
        observations.num_observations,
        targets,
        clamps,
        keys,
    )
    events, too_long = jax.vmap(jax.vmap(lambda p: _whole(p, sampler.max_events)))(samples)
    trajectories = jax.vmap(
        jax.vmap(_to_trajectories, in_axes=(0, None, None, None)), in_axes=(0, 0, 0, 0)
    )(events, durations, targets, clamps)
    jumps = jnp.isfinite(samples.times).sum(-1).astype(jnp.int32)  # (R, samples, N)
    trajectories = eqx.error_if(
        trajectories,
        jnp.any(contradiction),
        "observations: a node observed in another state than its intervention's clamp.",
    )
    paths = SampledPaths(trajectories=trajectories, infeasible_updates=infeasible, jumps=jumps)
    return paths, jnp.concatenate([jnp.any(too_long)[None], jnp.any(overflow, axis=0)])


def sampled_node_statistics(
    trajectories: Trajectories,
    parents: tuple[tuple[int, ...], ...],
    cardinalities: tuple[int, ...],
) -> tuple[NodeStatistics, ...]:
    """Each node's statistics for the parent sets `parents` from sampled `trajectories` `(R,
    samples)` (`SampledPaths.trajectories`), averaged over the samples and summed over the
    trajectories: the Monte Carlo estimate of the expected statistics given the
    observations (the E-step of EM)."""
    out = []
    for n, ps in enumerate(parents):
        stats = jax.vmap(jax.vmap(lambda t: node_statistics(t, n, tuple(ps), cardinalities)))(
            trajectories
        )
        out.append(
            NodeStatistics(
                transitions=stats.transitions.mean(1).sum(0),
                dwell_times=stats.dwell_times.mean(1).sum(0),
            )
        )
    return tuple(out)
