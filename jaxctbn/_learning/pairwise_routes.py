"""The pairwise routes of the family statistics (in-degree at most 2): every node's three-way
co-occupancy sums with every pair of other nodes, by matrix products over the path segments
(`"matmul"`) or by sums by parts over the jumps (`"jumps"`), and the gather that reads one
node's statistics on its candidate sets from them."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from .._errors import error_if
from .._model.layout import all_global_states, global_state_index
from .._paths.sampling import Trajectories


def _one_hot_all(states, cards, dtype):
    """One-hot encoding of every node's state, concatenated: `(rows, sum_k)`."""
    return jnp.concatenate(
        [jax.nn.one_hot(states[:, m], k, dtype=dtype) for m, k in enumerate(cards)], axis=1
    )


def _reduced_basis(cards: tuple[int, ...], dtype):
    """The reduced one-hot encoding of global states and its expansion matrix.

    `encode(states)` gives z = [1, 1(x_m = v) for v < k_m - 1] (`K' = 1 + sum(k - 1)` columns);
    `L` `(K', K)` maps it back to the full one-hot encoding O = z L (the last state's indicator is
    1 minus the others); `levels[m][x]` is the reduced encoding of node m in state x (a `(K',)`
    row with the constant column zero), so a jump of node m from x to y changes z by
    `levels[m][y] - levels[m][x]`."""
    Kp = 1 + sum(k - 1 for k in cards)
    L = np.zeros((Kp, sum(cards)))
    levels = []
    col, row = 0, 1
    for k in cards:
        node_levels = np.zeros((k, Kp))
        for v in range(k - 1):
            L[row + v, col + v] = 1.0
            L[row + v, col + k - 1] = -1.0
            node_levels[v, row + v] = 1.0
        L[0, col + k - 1] = 1.0
        levels.append(node_levels)
        col += k
        row += k - 1

    def encode(states):
        parts = [jnp.ones((states.shape[0], 1), dtype)]
        parts += [
            jax.nn.one_hot(states[:, m], k, dtype=dtype)[:, : k - 1] for m, k in enumerate(cards)
        ]
        return jnp.concatenate(parts, axis=1)

    return jnp.asarray(L, dtype), encode, levels


def _expand(reduced, L):
    """`sum_qr reduced[c, q, r] L[q, a] L[r, b]`, clamped at zero: the expansion subtracts sums,
    so entries that are exactly zero can come out as -1e-16."""
    return jnp.maximum(jnp.einsum("cqr,qa,rb->cab", reduced, L, L), 0.0)


def cooccupancy(cards, seg, w_dwell_cols, pre, w_event_cols, chunk):
    """Three-way co-occupancy sums by chunked matrix products.

    `D[c, a, b] = sum_i w_ic O_ia O_ib` for the one-hot state matrix $O$ (rows x K, K = sum_k)
    and each weight column c (dwell of node n in state x; or one transition x -> x' of node n),
    likewise `E` over the events' pre-jump states. Two savings, both exact:

    - rows are first summed per global state when there are fewer global states than rows;
    - the products use the reduced encoding z = [1, one-hot without each node's last state]
      (K' = 1 + sum(k - 1) columns) and are expanded afterwards with O = z L, since the last
      state's indicator is 1 minus the others; and only the upper triangle of the symmetric
      z z^T is formed. For binary nodes this is ~8x fewer FLOPs.
    """
    dtype = w_dwell_cols.dtype
    N = len(cards)
    S = math.prod(cards)
    L, encode, _ = _reduced_basis(cards, dtype)
    Kp = L.shape[0]
    upper_q, upper_r = np.triu_indices(Kp)

    def accumulate(states, weights):
        if S <= states.shape[0]:  # fewer global states than rows: aggregate first
            weights = jax.ops.segment_sum(weights, global_state_index(states, cards), S)
            states = jnp.asarray(all_global_states(cards))
        rows = states.shape[0]
        size = min(chunk, rows)
        pad = (-rows) % size
        states = jnp.concatenate([states, jnp.zeros((pad, N), states.dtype)])
        weights = jnp.concatenate([weights, jnp.zeros((pad, weights.shape[1]), dtype)])
        states = states.reshape(-1, size, N)
        weights = weights.reshape(-1, size, weights.shape[1])

        def step(acc, xs):
            st, w = xs
            z = encode(st)
            return acc + w.T @ (z[:, upper_q] * z[:, upper_r]), None  # symmetric: q <= r only

        init = jnp.zeros((weights.shape[-1], upper_q.shape[0]), dtype)
        acc, _ = jax.lax.scan(step, init, (states, weights))
        reduced = jnp.zeros((acc.shape[0], Kp, Kp), dtype)
        reduced = reduced.at[:, upper_q, upper_r].set(acc).at[:, upper_r, upper_q].set(acc)
        return _expand(reduced, L)

    return accumulate(seg, w_dwell_cols), accumulate(pre, w_event_cols)


def transition_groups(cards: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The transition columns `(node, x, y)`, `x != y`, node by node (the order of the event
    columns of both co-occupancy routes), and a lookup `index[node, x, y]` (-1 on the diagonal)."""
    kmax = max(cards)
    index = np.full((len(cards), kmax, kmax), -1, np.int32)
    groups = []
    for n, k in enumerate(cards):
        for x in range(k):
            for y in range(k):
                if x != y:
                    index[n, x, y] = len(groups)
                    groups.append((n, x, y))
    return np.asarray(groups, np.int32).reshape(-1, 3), index


def _jump_groups(t: Trajectories, index: np.ndarray):
    """For every jump slot `(trajectory, slot)` (flattened): its transition column (the number of
    columns for slots that are padding or change no node), and whether a jump breaks what the
    jumps route needs (it changes several nodes at once, or moves a node that its trajectory
    records as intervened on). One trajectory at a time: no `(paths, slots, nodes)` temporary."""
    G = int((index >= 0).sum())
    lookup = jnp.asarray(index)

    def one(args):
        init, states, num, targets = args
        pre = jnp.concatenate([init[None], states[:-1]])
        moved = pre != states
        count = moved.sum(-1)
        node = jnp.argmax(moved, axis=-1)
        x = jnp.take_along_axis(pre, node[:, None], -1)[:, 0]
        y = jnp.take_along_axis(states, node[:, None], -1)[:, 0]
        real = jnp.arange(states.shape[0]) < num
        group = jnp.where(real & (count == 1), lookup[node, x, y], G)
        broken = real & ((count > 1) | ((count == 1) & targets[node]))
        return group, broken

    group, broken = jax.lax.map(
        one, (t.initial_states, t.states, t.num_events, t.intervention_targets)
    )
    return group.reshape(-1), broken


def cooccupancy_from_jumps(cards, t: Trajectories, chunk):
    r"""The co-occupancy tensors of `cooccupancy` (`D` over the dwell columns, `E` over the
    transition columns) computed from the jumps instead of the segments.

    The path is piecewise constant and each jump changes one node, so by summation by parts

    $$\sum_i \Delta t_i\,f(s_i)=\tau f(s_0)+\sum_j(\tau-t_j)\,\big(f(s_j)-f(s_{j-1})\big)$$

    for the three-way product $f = z\otimes z\otimes z$ of the reduced encoding, whose
    increment at a jump of node m is $d\otimes z'\otimes z' + z\otimes d\otimes z' +
    z\otimes z\otimes d$ with $d = z' - z$ non-zero only on node m's columns and fixed by the
    transition (m, x, y). Grouping the jumps by transition, all of it follows from two
    `K' x K'` sums per group, $A_g=\sum_j(\tau-t_j)zz^\top$ and $F_g=\sum_j zz^\top$ over the
    pre-jump states (the latter are the transition co-occupancies), accumulated by matrix
    products over cache-sized chunks of the jumps sorted by group: jumps x 2K' x K'
    multiply-adds instead of segments x columns x K'^2/2, and no per-segment weight matrix.

    Pooling: node n's rows leave out the trajectories that record n as intervened on. There n
    never moves (checked), so their share is its constant one-hot times the two-way
    co-occupancy $\sum_i \Delta t_i z z^\top$ of that trajectory, got by the same sum by parts
    and subtracted.

    Needs float64 (the sums by parts cancel) and jumps that change one node each (checked)."""
    dtype = t.jump_times.dtype
    R, slots = t.jump_times.shape
    L, encode, levels = _reduced_basis(cards, dtype)
    Kp = L.shape[0]
    groups, index = transition_groups(cards)
    G = groups.shape[0]
    col_node = np.repeat(np.arange(len(cards)), cards)
    d = jnp.asarray(np.stack([levels[m][y] - levels[m][x] for m, x, y in groups]), dtype)

    group, broken = _jump_groups(t, index)
    t = error_if(
        t,
        broken.any(),
        "trajectories: method='jumps' needs each jump to change one node and intervened-on "
        "nodes to stay put, but a jump breaks that; use method='matmul' or 'scatter'.",
    )
    # the jump slots sorted by group; group g holds order[start[g] : start[g] + count[g]]
    order = jnp.argsort(group, stable=True).astype(jnp.int32)
    order = jnp.concatenate([order, jnp.full((chunk,), -1, jnp.int32)])  # room for a last chunk
    counts = jnp.bincount(group, length=G + 1)[:G]
    starts = jnp.concatenate([jnp.zeros(1, counts.dtype), jnp.cumsum(counts)[:-1]])

    def one_group(args):
        start, count = args

        def body(c, acc):
            members = jax.lax.dynamic_slice(order, (start + c * chunk,), (chunk,))
            real = c * chunk + jnp.arange(chunk) < count
            idx = jnp.where(real, members, 0)
            r, i = idx // slots, idx % slots
            before = t.states[r, jnp.maximum(i - 1, 0)]
            z = encode(jnp.where((i == 0)[:, None], t.initial_states[r], before))
            w = jnp.where(real, t.durations[r] - t.jump_times[r, i], 0.0)
            left = jnp.concatenate([w[:, None] * z, real[:, None] * z], axis=1)
            return acc + left.T @ z

        zero = jnp.zeros((2 * Kp, Kp), dtype)
        return jax.lax.fori_loop(0, (count + chunk - 1) // chunk, body, zero)

    acc = jax.lax.map(one_group, (starts, counts))
    A, F = acc[:, :Kp], acc[:, Kp:]
    q, s = A[:, :, 0], A[:, 0, 0]
    P1 = (  # sum w z' z'^T with z' = z + d
        A
        + d[:, :, None] * q[:, None, :]
        + q[:, :, None] * d[:, None, :]
        + s[:, None, None] * d[:, :, None] * d[:, None, :]
    )
    P2 = A + q[:, :, None] * d[:, None, :]  # sum w z z'^T
    z0 = encode(t.initial_states)
    Z3 = (
        jnp.einsum("r,rp,rq,rs->pqs", t.durations, z0, z0, z0)
        + jnp.einsum("gp,gqr->pqr", d, P1)
        + jnp.einsum("gq,gpr->pqr", d, P2)
        + jnp.einsum("gpq,gr->pqr", A, d)
    )
    T = jnp.einsum("pc,pqr->cqr", L, Z3)
    # pooling: the two-way co-occupancy of each trajectory, sum_i dt_i z z^T (sum by parts:
    # d z^T + z d^T + d d^T at each jump, d = e_plus - e_minus in the reduced columns), times
    # the constant one-hot of each node the trajectory records as intervened on
    first = np.concatenate([[1], 1 + np.cumsum([k - 1 for k in cards])[:-1]])
    column = [  # the reduced column of (node, state); K' (dropped) for the last state
        [first[m] + v if v < k - 1 else Kp for v in range(k)] for m, k in enumerate(cards)
    ]
    plus = jnp.asarray([column[m][y] for m, _, y in groups])
    minus = jnp.asarray([column[m][x] for m, x, _ in groups])

    def two_way(args):
        init, states, num, grp, duration, times = args
        z = encode(jnp.concatenate([init[None], states[:-1]]))
        real = (jnp.arange(slots) < num) & (grp < G)
        g = jnp.minimum(grp, G - 1)
        w = jnp.where(real, duration - times, 0.0)
        a, b = plus[g], minus[g]
        wz = w[:, None] * z
        DZ = jnp.zeros((Kp + 1, Kp), dtype).at[a].add(wz).at[b].add(-wz)[:Kp]
        DD = jnp.zeros((Kp + 1, Kp + 1), dtype)
        DD = DD.at[a, a].add(w).at[b, b].add(w).at[a, b].add(-w).at[b, a].add(-w)[:Kp, :Kp]
        z0 = encode(init[None])[0]
        return duration * jnp.outer(z0, z0) + DZ + DZ.T + DD

    C2 = jax.lax.map(
        two_way,
        (
            t.initial_states,
            t.states,
            t.num_events,
            group.reshape(R, slots),
            t.durations,
            t.jump_times,
        ),
    )
    held = t.intervention_targets[:, col_node] * _one_hot_all(t.initial_states, cards, dtype)
    T = T - jnp.einsum("rc,rqs->cqs", held, C2)
    return _expand(T, L), _expand(F, L)


def pairwise_gather(own, k, pair_index, sets, cards, configs, D_all, E_all):
    """Statistics of one node with `k` states for padded parent sets of size <= 2, read from the
    co-occupancy tensors of the pairwise routes: `D_all[own + x]` (the node's dwell columns
    start at `own`) and `E_all[pair_index[x, y]]` (its transition columns; -1 on the
    diagonal). `own` and `pair_index` may be traced (`jax.vmap` over nodes)."""
    offsets = np.concatenate([[0], np.cumsum(cards)[:-1]])
    card_arr = jnp.asarray(cards)
    off_arr = jnp.asarray(offsets)
    c = jnp.arange(configs)
    x = jnp.arange(k)
    jump = pair_index >= 0
    column = jnp.where(jump, pair_index, 0)

    def one(parents):
        present = parents >= 0
        safe = jnp.where(present, parents, 0)
        slot_card = jnp.where(present, card_arr[safe], 1)
        if parents.shape[0] == 0:
            va, vb = jnp.zeros_like(c), jnp.zeros_like(c)
            pa, pb = jnp.zeros((), bool), jnp.zeros((), bool)
            card_b = 1
            card_a = 1
            idx_a0, idx_b0 = 0, 0
        elif parents.shape[0] == 1:
            card_a, card_b = slot_card[0], 1
            pa, pb = present[0], jnp.zeros((), bool)
            va, vb = c % card_a, jnp.zeros_like(c)
            idx_a0, idx_b0 = off_arr[safe[0]], 0
        else:
            card_a, card_b = slot_card[0], slot_card[1]
            pa, pb = present[0], present[1]
            vb = c % card_b
            va = (c // card_b) % card_a
            idx_a0, idx_b0 = off_arr[safe[0]], off_arr[safe[1]]
        valid = c < card_a * card_b
        own_idx = own + x  # empty slots read the node's own state (always 1 there)
        ia = jnp.where(pa, idx_a0 + va[:, None], own_idx[None, :])  # (configs, k)
        ib = jnp.where(pb, idx_b0 + vb[:, None], own_idx[None, :])
        T = D_all[own_idx[None, :], ia, ib] * valid[:, None]  # (configs, k)
        M = E_all[column[None], ia[:, :, None], ib[:, :, None]]  # (configs, k, k)
        M = M * (valid[:, None, None] & jump[None])
        return M, T

    return jax.vmap(one)(sets)
