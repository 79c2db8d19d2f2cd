"""The moves of a graph search scored at once: for every node's held parent set, the statistics
of every addition, removal and swap by chunked matrix products over the path segments, and the
local score of each move (used by [`jaxctbn.HillClimbing`][] and by CTPC's tests)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._model.layout import config_index, num_configurations


def _bases(sets: Array) -> Array:
    """For held sets `(N, K)`: the base sets `(N, K + 1, K)`, the held set and then the held
    set less its slot j (the held set again where slot j is empty)."""
    K = sets.shape[1]
    drop = jnp.arange(K)[:, None] == jnp.arange(K)[None, :]  # (j, slot)
    less = jnp.where(drop[None], -1, sets[:, None, :])
    return jnp.concatenate([sets[:, None, :], less], axis=1)


def _one_hot_states(states: Array, cards: tuple[int, ...], dtype) -> Array:
    """`(rows, N)` states as the concatenated one-hot of every node `(rows, sum k)`."""
    offsets = jnp.asarray(np.concatenate([[0], np.cumsum(cards)[:-1]]))
    rows = jnp.arange(states.shape[0])[:, None]
    out = jnp.zeros((states.shape[0], int(sum(cards))), dtype)
    return out.at[rows, offsets[None, :] + states].set(1.0)


def _one_hot_columns(states: Array, columns: Array, cards: tuple[int, ...], dtype) -> Array:
    """`(rows, N)` states as the one-hot of the states of the nodes `columns (P,)` (`-1`: an
    empty slot, all zero), `kmax` entries per slot: `(rows, P * kmax)`."""
    values = jnp.take(states, jnp.maximum(columns, 0), axis=1)  # (rows, P)
    hot = jax.nn.one_hot(values, max(cards), dtype=dtype) * (columns >= 0)[None, :, None]
    return hot.reshape(states.shape[0], -1)


#: the most floats of one chunk's one-hot operands in the move statistics (8 MiB in float64;
#: CTPC's tests of conditioning sets of size 2 hold N x 64 sets x 8 entries per segment). The
#: products stay large enough to run at full speed (hill climbing at N = 100-200 and CTPC at
#: N = 50-100 took the same time at 2^25), and a step's temporary memory stays near the data's
#: (hill climbing at N = 100: 92 MiB -> 28 MiB)
_CHUNK_FLOATS = 1 << 20


def move_statistics(data, bases, cards, C: int, chunk: int, swaps: bool, columns=None):
    r"""The statistics of every node `n` under every base set `(N, B, K)` (at most $K-1$
    parents, so `C` configurations):

    - `D (N, B', kmax, C, sum k)`, `E (N, B', kmax, kmax, C, sum k)`: dwell and transitions
      jointly with every node's state, for the bases that take additions (`B' = B` with
      `swaps`, else the held set alone): the sums over the segments (over node n's own
      jumps) of the weighted one-hot of $(x_n[, x_n'], u_B)$ times the one-hot of all node
      states, by chunked matrix products;
    - `D_own (N, B, kmax, C)`, `E_own (N, B, kmax, kmax, C)`: the base sets' own statistics
      (for removals).

    With `columns (N, P)` (node indices, `-1` = none), node n's joint statistics span only the
    states of the nodes `columns[n]`, `kmax` entries per slot (last axis `P * kmax` instead of
    `sum k`): the work and memory of the matrix products then grow with P, not with N."""
    seg, w_dwell, pre, post, jump_rows, jump_weights, _ = data
    N = len(cards)
    kmax = max(cards)
    dtype = w_dwell.dtype
    B = bases.shape[1]
    B_add = B if swaps else 1
    width = int(sum(cards)) if columns is None else int(columns.shape[1]) * kmax

    def one_hot(st, node_columns):  # the states the joint statistics span
        if node_columns is None:
            return _one_hot_states(st, cards, dtype)
        return _one_hot_columns(st, node_columns, cards, dtype)

    configs = jax.vmap(lambda b, st: config_index(st, b, cards), in_axes=(0, None))

    # dwell: all nodes at once, over chunks of the segments (fewer segments per chunk when
    # its one-hot operands would pass _CHUNK_FLOATS)
    rows = seg.shape[0]
    per_row = N * (B * kmax * C + (0 if columns is None else int(columns.shape[1]) * kmax))
    size = max(1, min(chunk, rows, _CHUNK_FLOATS // per_row))

    def dwell_step(acc, i):
        # chunk i: rows [i size, (i + 1) size), the last one shifted back to end at the last
        # row with the rows of the chunk before it weighted 0 (no padded copy of the data)
        start = jnp.minimum(i * size, rows - size)
        st = jax.lax.dynamic_slice_in_dim(seg, start, size)
        fresh = start + jnp.arange(size) >= i * size
        w = jax.lax.dynamic_slice_in_dim(w_dwell, start, size) * fresh[:, None]
        u = jax.vmap(configs, in_axes=(0, None))(bases, st)  # (N, B, r)
        index = st.T[:, None, :] * C + u
        W = jax.nn.one_hot(index, kmax * C, dtype=dtype) * w.T[:, None, :, None]
        joint, own = acc
        if columns is None:
            joint = joint + jnp.einsum("nbrc,rj->nbcj", W[:, :B_add], one_hot(st, None))
        else:
            hot = jax.vmap(lambda c: one_hot(st, c))(columns)  # (N, r, P * kmax)
            joint = joint + jnp.einsum("nbrc,nrj->nbcj", W[:, :B_add], hot)
        return (joint, own + W.sum(2)), None

    init = (
        jnp.zeros((N, B_add, kmax * C, width), dtype),
        jnp.zeros((N, B, kmax * C), dtype),
    )
    (D, D_own), _ = jax.lax.scan(dwell_step, init, jnp.arange(-(-rows // size)))

    # transitions: node by node, over its own jumps
    def node_jumps(args):
        n, node_bases, rows_n, w_n, node_columns = args
        st = pre[rows_n]  # (J, N)
        u = configs(node_bases, st)  # (B, J)
        x = jnp.take(st, n, axis=1)
        y = jnp.take(post[rows_n], n, axis=1)
        index = (x * kmax + y) * C + u
        W = jax.nn.one_hot(index, kmax * kmax * C, dtype=dtype) * w_n[None, :, None]
        joint = jnp.einsum("bjc,jm->bcm", W[:B_add], one_hot(st, node_columns))
        return joint, W.sum(1)

    per_node = (jnp.arange(N), bases, jump_rows, jump_weights)
    if columns is None:
        E, E_own = jax.lax.map(lambda a: node_jumps((*a, None)), per_node)
    else:
        E, E_own = jax.lax.map(node_jumps, (*per_node, columns))
    return (
        D.reshape(N, B_add, kmax, C, width),
        E.reshape(N, B_add, kmax, kmax, C, width),
        D_own.reshape(N, B, kmax, C),
        E_own.reshape(N, B, kmax, kmax, C),
    )


def by_parent_state(cards: tuple[int, ...], D: Array, E: Array) -> tuple[Array, Array, Array]:
    """The column of (node m, state v) in the joint statistics' last axis `(N, kmax)`, and the
    statistics `D`, `E` with an extra all-zero column, the column of the states a node does not
    have."""
    kmax = max(cards)
    offsets = np.concatenate([[0], np.cumsum(cards)[:-1]])
    column = np.where(
        np.arange(kmax)[None, :] < np.asarray(cards)[:, None],
        offsets[:, None] + np.arange(kmax)[None, :],
        int(sum(cards)),
    )
    D = jnp.concatenate([D, jnp.zeros(D.shape[:-1] + (1,), D.dtype)], axis=-1)
    E = jnp.concatenate([E, jnp.zeros(E.shape[:-1] + (1,), E.dtype)], axis=-1)
    return jnp.asarray(column), D, E


def by_column_state(
    cards: tuple[int, ...], columns: Array, D: Array, E: Array
) -> tuple[Array, Array, Array]:
    """As [`by_parent_state`][] for joint statistics that span only the nodes `columns (N, P)`
    (`-1`: an empty slot; `kmax` entries per slot): the column of (slot p, state v) of node n
    `(N, P, kmax)`, `p * kmax + v`, or the extra all-zero column for the states a node does not
    have and for the empty slots."""
    kmax = max(cards)
    P = columns.shape[1]
    D = jnp.concatenate([D, jnp.zeros(D.shape[:-1] + (1,), D.dtype)], axis=-1)
    E = jnp.concatenate([E, jnp.zeros(E.shape[:-1] + (1,), E.dtype)], axis=-1)
    states = jnp.asarray(cards)[jnp.maximum(columns, 0)]  # (N, P)
    has = (jnp.arange(kmax) < states[..., None]) & (columns >= 0)[..., None]
    column = jnp.where(has, jnp.arange(P)[:, None] * kmax + jnp.arange(kmax), P * kmax)
    return column, D, E


def own_scores(prior, cards: tuple[int, ...], D_own: Array, E_own: Array, configs: Array):
    """The log marginal likelihood of every node under each of its base sets `(N, B)`, from the
    bases' own statistics `D_own (N, B, kmax, C)`, `E_own (N, B, kmax, kmax, C)` and their
    numbers of configurations `configs (N, B)`."""
    scores = jnp.zeros(D_own.shape[:2], D_own.dtype)
    for k in sorted(set(cards)):  # nodes of k states: one vectorised call
        nodes = np.asarray([n for n, kn in enumerate(cards) if kn == k])

        def one(n, T, M, c):  # T (k, C), M (k, k, C)
            return prior.log_marginal_likelihood(n, jnp.moveaxis(M, (0, 1), (-2, -1)), T.T, c)

        r = jax.vmap(jax.vmap(one, in_axes=(None, 0, 0, 0)))(
            jnp.asarray(nodes), D_own[nodes][:, :, :k], E_own[nodes][:, :, :k, :k], configs[nodes]
        )
        scores = scores.at[nodes].set(r)
    return scores


def dropped_parents(sets: Array) -> Array:
    """`(N, K + 1)`: the parent each base of [`move_scores`][] drops from the held sets `(N, K)`
    (base 0, the held set itself: none, `-1`; base b >= 1: slot b - 1)."""
    return jnp.concatenate([jnp.full((sets.shape[0], 1), -1, sets.dtype), sets], axis=1)


def move_scores(
    data, sets, cards, prior, log_odds, allowed, required, in_degree, chunk, swaps=True,
    columns=None,
) -> tuple[Array, Array, Array]:  # fmt: skip
    r"""The local score $s_n$ of every move from the held sets `(N, K)`:

    - `adds (N, K + 1, N)`: base b plus node m (b = 0: the held set, an addition; b >= 1: the
      held set less its slot b - 1, a swap; `-inf` without `swaps`);
    - `removals (N, K + 1)`: base b itself (b >= 1: a removal; b = 0 is no move);
    - `bases (N, K + 1, K)`;

    `-inf` where a move breaks the prior knowledge (`allowed`, `required` `(N, N)` as
    `[parent, child]`, `in_degree (N,)`) or is no move. With `columns (N, P)` (node indices,
    `-1` = none) only the additions of node n's candidates `columns[n]` are scored (the others
    are `-inf`), and the statistics span only them."""
    N, K = sets.shape
    kmax = max(cards)
    C = int(kmax ** max(K - 1, 0))
    bases = _bases(sets)
    size = (bases >= 0).sum(-1)  # (N, K + 1)
    # base 0 holding K parents takes no addition (and has more than C configurations)
    bases = bases.at[:, 0].set(jnp.where((size[:, :1] >= K), -1, bases[:, 0]))
    D, E, D_own, E_own = move_statistics(data, bases, cards, C, chunk, swaps, columns)
    B_add = D.shape[1]
    if columns is None:  # every node a candidate of every node
        column, D, E = by_parent_state(cards, D, E)
        column = jnp.broadcast_to(column[None], (N,) + column.shape)  # (N, N, kmax)
        targets = jnp.broadcast_to(jnp.arange(N), (N, N))
    else:
        column, D, E = by_column_state(cards, columns, D, E)
        targets = columns
    base_configs = num_configurations(bases, cards)  # (N, K + 1)
    states_of = jnp.asarray(cards)[jnp.maximum(targets, 0)]  # (N, P)

    adds = jnp.full((N, K + 1, N), -jnp.inf, D.dtype)
    for k in sorted(set(cards)):  # nodes of k states: one vectorised call
        nodes = np.asarray([n for n, kn in enumerate(cards) if kn == k])
        Dk, Ek = D[nodes][:, :, :k], E[nodes][:, :, :k, :k]

        def add_one(n, Dnb, Enb, configs, col, states, k=k):  # col (kmax,): m's columns
            T = Dnb[..., col]  # (k, C, kmax)
            M = Enb[..., col]  # (k, k, C, kmax)
            T = jnp.moveaxis(T, 0, -1).reshape(C * kmax, k)
            M = jnp.moveaxis(M, (0, 1), (-2, -1)).reshape(C * kmax, k, k)
            return prior.log_marginal_likelihood(n, M, T, configs * states)

        over_m = jax.vmap(add_one, in_axes=(None, None, None, None, 0, 0))
        over_b = jax.vmap(over_m, in_axes=(None, 0, 0, 0, None, None))
        node_index = jnp.asarray(nodes)
        a = jax.vmap(over_b)(
            node_index, Dk, Ek, base_configs[nodes][:, :B_add], column[nodes], states_of[nodes]
        )  # (nodes, B_add, P)
        target = targets[nodes][:, None, :]  # the node each score adds (N: an empty slot)
        adds = adds.at[node_index[:, None, None], jnp.arange(B_add)[None, :, None],
                       jnp.where(target >= 0, target, N)].set(a, mode="drop")  # fmt: skip
    removals = own_scores(prior, cards, D_own, E_own, base_configs)
    # the edge prior's log-odds of each set
    member = (bases[..., None] == jnp.arange(N)).any(-2)  # (N, B, N): m in base b of n
    base_odds = jnp.einsum("nbm,mn->nb", member.astype(log_odds.dtype), log_odds)
    adds = adds + base_odds[..., None] + log_odds.T[:, None, :]
    removals = removals + base_odds
    # the moves that keep the knowledge
    held = (sets[..., None] == jnp.arange(N)).any(-2)  # (N, N): m is held by n
    dropped = dropped_parents(sets)
    node = jnp.arange(N)[:, None]
    kept_required = jnp.where(dropped >= 0, ~required[jnp.maximum(dropped, 0), node], False)
    is_move = kept_required  # b >= 1 with a parent dropped that is not required
    room = size < in_degree[:, None]
    can_add = (is_move | (jnp.arange(K + 1) == 0)[None, :]) & room
    adds = jnp.where(can_add[..., None] & allowed.T[:, None, :] & ~held[:, None, :], adds, -jnp.inf)
    removals = jnp.where(is_move, removals, -jnp.inf)
    return adds, removals, bases
