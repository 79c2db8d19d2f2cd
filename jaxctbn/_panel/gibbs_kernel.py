r"""The kernels of the Gibbs sampler of [`jaxctbn.panel.GibbsSampler`][] (its module page
has the algorithm): the model padded to common shapes for a traced node index, the static
bounds on a node's children and Markov blanket, the paths held node by node, one node's update
by uniformisation and forward filtering, backward sampling, and a sweep over the nodes."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, Float, Int

from .._model.ctbn import AbstractCTBN
from .._model.interventions import is_concrete
from .._model.layout import slot_strides
from .._paths.sampling import Trajectories


class Tables(eqx.Module):
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


def padded_tables(model: AbstractCTBN, bounds: tuple[int, int]) -> Tables:
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
    return Tables(
        parents=parents,
        children=_first(is_child, bounds[0]),
        blanket=_first(in_blanket, bounds[1]),
        rates=rates,
        cardinalities=jnp.asarray(cards, jnp.int32),
        omega=jnp.where(omega > 0, omega, 1.0),
        static_cards=tuple(cards),
    )


class Path(eqx.Module):
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


def whole(path: Path, max_events: int) -> tuple[_Events, Array]:
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


def compacted(jumps: Array, times: Array, values: Array, size: int) -> tuple[Array, Array, Array]:
    """The entries of time-ordered `times` and `values` where `jumps` holds, moved to the front
    of a row of `size` slots (`inf`, `0` after them), and whether there are more than `size`."""
    slot = jnp.where(jumps, jnp.cumsum(jumps) - 1, size)
    row_times = jnp.full((size,), jnp.inf, times.dtype).at[slot].set(times, mode="drop")
    row_values = jnp.zeros((size,), values.dtype).at[slot].set(values, mode="drop")
    return row_times, row_values, jnp.sum(jumps) > size


def _initial_path(obs_times, obs_states, observed, size: int) -> tuple[Path, Array]:
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
    times, values, overflow = jax.vmap(compacted, in_axes=(1, 1, 1, None))(
        jump, mid, obs_states, size
    )
    return Path(initial=initial, times=times, values=values), jnp.any(overflow)


def _update_node(tables: Tables, path: Path, n, evidence, duration, key, max_virtual: int):
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
    times_n, values_n, overflow_row = compacted(jumps, t, states_after.astype(path.values.dtype), J)
    new = Path(
        initial=path.initial.at[n].set(x_start.astype(path.initial.dtype)),
        times=path.times.at[n].set(times_n),
        values=path.values.at[n].set(values_n),
    )
    # an infeasible update (no path through the grid: it cannot happen from a feasible path,
    # whose own jumps are candidates) keeps the old path
    new = jax.tree_util.tree_map(lambda a, b: jnp.where(feasible, a, b), new, path)
    return new, jnp.stack([feasible & overflow_row, overflow]), ~feasible


def to_trajectories(path: _Events, duration, targets, clamps) -> Trajectories:
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


def chain_start(times, states, num_observations, targets, clamps, max_node_events: int):
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


def sweep(tables: Tables, evidence, duration, carry, key, max_virtual: int):
    """One Gibbs sweep over the nodes, in order: `carry = (path, overflow, infeasible)`."""

    def one(n, c):
        path, overflow, infeasible = c
        new, flag, stuck = _update_node(
            tables, path, n, evidence, duration, jr.fold_in(key, n), max_virtual
        )
        return new, overflow | flag, infeasible + stuck.astype(jnp.int32)

    return jax.lax.fori_loop(0, tables.cardinalities.shape[0], one, carry)
