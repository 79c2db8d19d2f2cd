r"""Graph search: which parent sets structure learning scores, for networks too large to score
every set of at most $K$ parents ($\binom{N-1}{\le K}$ per node: 1.3 million per node at
$N = 200$, $K = 3$).

A CTBN graph may be cyclic, so the posterior over graphs factorises over the nodes (no
acyclicity couples them) and a search over graphs is a search over each node's parent set.
[`jaxctbn.HillClimbing`][] climbs every node's set at once: from the set it holds, every move
(add a parent, remove one, swap one for another; with the prior knowledge kept) is scored in one
compiled, vectorised call, and each node takes its best move while it improves the local score

$$s_n(P)=\ln p(X_n\mid X_P)+\sum_{m\in P}\ln\frac{\pi_{mn}}{1-\pi_{mn}}$$

(the family's log marginal likelihood under the rate prior, plus the edge prior's log-odds when
one is given). The statistics of all moves come from matrix products over the path segments:
for a base set $B$ (the held set, or the held set less one parent) and every candidate parent
$m$ at once,

$$T_{B\cup m}(x, u, v)=\sum_s\Delta t_s\,[x_n(s)=x,\ u_B(s)=u]\,[x_m(s)=v],$$

one product of the weighted one-hot of $(x_n, u_B)$ with the one-hot of every node's state, and
likewise the transitions over the node's jumps. Random restarts start from random sets (the
best end of each node's climbs is kept; a node's climbs do not interact with another's).

The search then hands over to the exact posterior: each node keeps a **pool** of parents, its
final set and the parents of its best other moves (`pool_size` in all), and every set of at most
$K$ parents drawn from the pool (with the prior knowledge) is scored exactly, so
[`jaxctbn.StructurePosterior`][]'s edge marginals, MAP graph, entropy and the design criteria
work as after exhaustive scoring, over the sets the search found worth keeping.
"""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._model.layout import config_index, num_configurations, slot_strides
from .._paths.sampling import Trajectories
from .._paths.sufficient_statistics import check_trajectories_now
from .candidates import candidate_parent_sets, knowledge_arrays
from .family_statistics import FamilyStatistics, _scatter_statistics, grouped_family_statistics
from .priors import AbstractPrior


class AbstractStructureSearch(eqx.Module):
    """Which candidate parent sets [`jaxctbn.learn_structure`][] scores:
    [`jaxctbn.Exhaustive`][] (every set) or [`jaxctbn.HillClimbing`][] (a search, then the sets
    of each node's pool)."""


class Exhaustive(AbstractStructureSearch):
    """Every parent set of at most `max_parents` parents that keeps the prior knowledge (the
    default): exact, for networks up to about 100 nodes with in-degree 2, 30 with in-degree 3."""


class HillClimbing(AbstractStructureSearch):
    r"""Hill climbing over every node's parent set, then the exact posterior over the sets of
    each node's pool (see the module page).

    **Arguments** (keyword-only):

    - `restarts`: climbs from random starting sets besides the one from the required parents
      alone (default 0); each node keeps the best end of its climbs.
    - `key`: the PRNG key of the random starts (needed when `restarts > 0`).
    - `swaps`: also swap a held parent for another (default `True`); each step then costs
      $K+1$ matrix products over the segments instead of one.
    - `pool_size`: parents kept per node for the exact posterior (default 6: at most
      $\sum_{j\le K}\binom{6}{j}$ sets per node, 42 for $K=3$).
    - `max_steps`: the most moves per climb (default 100).
    - `chunk`: path segments per matrix product (default 2048; memory
      $\approx N(K+1)\,k\,k_{\max}^{K-1}\times$ `chunk` floats; fewer segments when that
      would pass $2^{20}$ floats).
    - `candidates`: screen each node's candidate parents first (the *sparse candidate*
      restriction, for hundreds of nodes): every allowed parent is scored once as the single
      addition to the node's required parents, and the climbs, restarts and pool then use only
      the `candidates` best (besides the required ones). Each step's matrix products then span
      `candidates` nodes instead of all $N$. Default `None`: every allowed parent.
    - `tabu`: the tabu tenure $L$ (default 0: plain hill climbing). With $L > 0$ each node's
      climb goes on past its local maximum (tabu search): it takes its best move that touches
      no parent it added or dropped in its last $L$ moves (a tabu move only where it beats the
      best set seen), until $L$ moves in a row find no better set, and keeps the best set seen
      (never worse than plain hill climbing from the same start).
    """

    restarts: int = eqx.field(static=True)
    key: PRNGKeyArray | None
    swaps: bool = eqx.field(static=True)
    pool_size: int = eqx.field(static=True)
    max_steps: int = eqx.field(static=True)
    chunk: int = eqx.field(static=True)
    candidates: int | None = eqx.field(static=True)
    tabu: int = eqx.field(static=True)

    def __init__(
        self,
        *,
        restarts: int = 0,
        key: PRNGKeyArray | None = None,
        swaps: bool = True,
        pool_size: int = 6,
        max_steps: int = 100,
        chunk: int = 2048,
        candidates: int | None = None,
        tabu: int = 0,
    ):
        for name, value, low in (
            ("restarts", restarts, 0),
            ("tabu", tabu, 0),
            ("pool_size", pool_size, 1),
            ("max_steps", max_steps, 1),
            ("chunk", chunk, 1),
            ("candidates", 1 if candidates is None else candidates, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}.")
        if restarts > 0 and key is None:
            raise ValueError("key: random restarts need a PRNG key, e.g. jax.random.key(0).")
        if not isinstance(swaps, bool):
            raise ValueError(f"swaps: expected True or False, got {swaps!r}.")
        self.restarts, self.key, self.swaps, self.pool_size = restarts, key, swaps, pool_size
        self.max_steps, self.chunk, self.candidates = max_steps, chunk, candidates
        self.tabu = tabu


class SearchResult(eqx.Module):
    """What [`jaxctbn.HillClimbing`][] found: per node, the parent set it ended at (`sets`,
    `(N, K)` padded with `-1`), its local score (`scores`), the pool of parents kept for the
    exact posterior (`pools`, `(N, pool_size)` padded with `-1`), and the moves made in the
    best climb of each node (`steps`)."""

    sets: Int[Array, "nodes width"]
    scores: Float[Array, " nodes"]
    pools: Int[Array, "nodes pool"]
    steps: Int[Array, " nodes"]


# ----------------------------------------------------------------------------- move scores
def _canonical(sets: Array) -> Array:
    """Parent sets `(..., K)` sorted ascending with the `-1` padding last."""
    big = jnp.iinfo(jnp.int32).max
    s = jnp.sort(jnp.where(sets < 0, big, sets), axis=-1)
    return jnp.where(s == big, -1, s).astype(jnp.int32)


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


def _move_statistics(data, bases, cards, C: int, chunk: int, swaps: bool, columns=None):
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


def _by_parent_state(cards: tuple[int, ...], D: Array, E: Array) -> tuple[Array, Array, Array]:
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


def _by_column_state(
    cards: tuple[int, ...], columns: Array, D: Array, E: Array
) -> tuple[Array, Array, Array]:
    """As [`_by_parent_state`][] for joint statistics that span only the nodes `columns (N, P)`
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


def _own_scores(prior, cards: tuple[int, ...], D_own: Array, E_own: Array, configs: Array):
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


def _dropped_parents(sets: Array) -> Array:
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
    D, E, D_own, E_own = _move_statistics(data, bases, cards, C, chunk, swaps, columns)
    B_add = D.shape[1]
    if columns is None:  # every node a candidate of every node
        column, D, E = _by_parent_state(cards, D, E)
        column = jnp.broadcast_to(column[None], (N,) + column.shape)  # (N, N, kmax)
        targets = jnp.broadcast_to(jnp.arange(N), (N, N))
    else:
        column, D, E = _by_column_state(cards, columns, D, E)
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
    removals = _own_scores(prior, cards, D_own, E_own, base_configs)
    # the edge prior's log-odds of each set
    member = (bases[..., None] == jnp.arange(N)).any(-2)  # (N, B, N): m in base b of n
    base_odds = jnp.einsum("nbm,mn->nb", member.astype(log_odds.dtype), log_odds)
    adds = adds + base_odds[..., None] + log_odds.T[:, None, :]
    removals = removals + base_odds
    # the moves that keep the knowledge
    held = (sets[..., None] == jnp.arange(N)).any(-2)  # (N, N): m is held by n
    dropped = _dropped_parents(sets)
    node = jnp.arange(N)[:, None]
    kept_required = jnp.where(dropped >= 0, ~required[jnp.maximum(dropped, 0), node], False)
    is_move = kept_required  # b >= 1 with a parent dropped that is not required
    room = size < in_degree[:, None]
    can_add = (is_move | (jnp.arange(K + 1) == 0)[None, :]) & room
    adds = jnp.where(can_add[..., None] & allowed.T[:, None, :] & ~held[:, None, :], adds, -jnp.inf)
    removals = jnp.where(is_move, removals, -jnp.inf)
    return adds, removals, bases


# ----------------------------------------------------------------------------- the climb
def _first_free_slot(base: Array) -> Array:
    return jnp.argmax(base < 0)


def _above(value: Array, reference: Array) -> Array:
    """`value` beats `reference` by more than rounding (relative 1e-9)."""
    return value > reference + 1e-9 * (1 + jnp.abs(reference))


@eqx.filter_jit
def _climb(data, sets, scores, cards, prior, log_odds, allowed, required, in_degree, chunk,
           swaps, max_steps, columns=None, tabu: int = 0):  # fmt: skip
    """Every node's best move while it improves its score (at most `max_steps` moves; with
    `columns`, among each node's candidates alone, as in [`move_scores`][]). With `tabu` $= L
    > 0$ (tabu search), a node past its local maximum goes on with its best move that touches
    no parent it added or dropped in its last $L$ moves (unless that move beats the best set
    it has seen), until $L$ moves bring no new best; the best set seen is returned."""
    N = sets.shape[0]
    rows = jnp.arange(N)

    def cond(carry):
        return carry[3].any() & (carry[4] < max_steps)

    def body(carry):
        sets, scores, steps, _, it, best_sets, best_scores, tabu_until, since = carry
        adds, removals, bases = move_scores(
            data, sets, cards, prior, log_odds, allowed, required, in_degree, chunk, swaps,
            columns,
        )  # fmt: skip
        dropped = _dropped_parents(sets)
        if tabu:  # a move touching a tabu parent only where it beats the best set seen
            blocked = tabu_until > it  # (N, N): [n, m]
            drop_blocked = jnp.where(dropped >= 0, blocked[rows[:, None], dropped], False)
            add_blocked = blocked[:, None, :] | drop_blocked[:, :, None]
            adds = jnp.where(add_blocked & ~_above(adds, best_scores[:, None, None]), -jnp.inf,
                             adds)  # fmt: skip
            removals = jnp.where(drop_blocked & ~_above(removals, best_scores[:, None]),
                                 -jnp.inf, removals)  # fmt: skip
        flat = adds.reshape(N, -1)
        best_add, where_add = flat.max(-1), jnp.argmax(flat, -1)
        best_removal, where_removal = removals.max(-1), jnp.argmax(removals, -1)
        b_add, m_add = where_add // N, (where_add % N).astype(sets.dtype)
        base = bases[rows, b_add]
        added = base.at[rows, jax.vmap(_first_free_slot)(base)].set(m_add)
        take_add = best_add >= best_removal
        best = jnp.maximum(best_add, best_removal)
        chosen = jnp.where(take_add[:, None], added, bases[rows, where_removal])
        move = jnp.isfinite(best) & _above(best, scores)
        if tabu:  # past the local maximum too, while the last `tabu` moves found a new best
            move = jnp.isfinite(best) & (move | (since < tabu))
            touched_drop = dropped[rows, jnp.where(take_add, b_add, where_removal)]
            touched_add = jnp.where(take_add, m_add, -1)
            for touched in (touched_drop, touched_add):
                tabu_until = tabu_until.at[rows, jnp.where(move & (touched >= 0), touched, N)].set(
                    it + 1 + tabu, mode="drop"
                )
        sets = jnp.where(move[:, None], _canonical(chosen), sets)
        scores = jnp.where(move, best, scores)
        new_best = move & _above(scores, best_scores)
        best_sets = jnp.where(new_best[:, None], sets, best_sets)
        best_scores = jnp.where(new_best, scores, best_scores)
        since = jnp.where(new_best, 0, since + move)
        return sets, scores, steps + move, move, it + 1, best_sets, best_scores, tabu_until, since

    zeros = jnp.zeros(N, jnp.int32)
    carry = (sets, scores, zeros, jnp.ones(N, bool), jnp.zeros((), jnp.int32), sets, scores,
             jnp.zeros((N, N), jnp.int32) if tabu else jnp.zeros((), jnp.int32), zeros)  # fmt: skip
    out = jax.lax.while_loop(cond, body, carry)
    steps, best_sets, best_scores = out[2], out[5], out[6]
    return best_sets, best_scores, steps


@eqx.filter_jit
def _pools(data, sets, cards, prior, log_odds, allowed, required, in_degree, chunk, swaps,
           pool_size, columns=None):  # fmt: skip
    """Each node's pool: its held parents, then the parents of its best other moves (by the
    best score of a move that brings them in), `pool_size` in all or the held set if larger."""
    N, K = sets.shape
    adds, _, _ = move_scores(data, sets, cards, prior, log_odds, allowed, required, in_degree,
                             chunk, swaps, columns)  # fmt: skip
    held = (sets[..., None] == jnp.arange(N)).any(-2)
    by_parent = jnp.where(held, jnp.inf, adds.max(1))  # (N, N): held parents first
    width = max(pool_size, K)
    top, index = jax.lax.top_k(by_parent, min(width, N))
    count = jnp.maximum(held.sum(-1), pool_size)[:, None]
    keep = (top > -jnp.inf) & (jnp.arange(top.shape[1])[None, :] < count)
    return _canonical(jnp.where(keep, index, -1))


@eqx.filter_jit
def _screened_candidates(data, sets, cards, prior, log_odds, allowed, required, in_degree,
                         chunk, width: int):  # fmt: skip
    """Each node's `width` candidate parents `(N, width)` (padded with `-1`; ascending): its
    required parents, then the allowed parents whose addition alone to the required set
    `sets (N, K)` scores best (one step of additions over every node)."""
    N = sets.shape[0]
    adds, _, _ = move_scores(data, sets, cards, prior, log_odds, allowed, required, in_degree,
                             chunk, False)  # fmt: skip
    priority = jnp.where(required.T, jnp.inf, adds[:, 0, :])  # (N, N): [n, m]
    top, index = jax.lax.top_k(priority, min(width, N))
    return _canonical(jnp.where(top > -jnp.inf, index, -1).astype(jnp.int32))


def _start_sets(key, allowed, required, in_degree, K: int) -> Array:
    """Random starting sets: the required parents and a uniform number of random allowed ones
    (up to the in-degree)."""
    N = allowed.shape[0]
    key_order, key_count = jax.random.split(key)
    u = jax.random.uniform(key_order, (N, N))
    req = required.T  # (N, N): [n, m]
    nreq = req.sum(-1)
    count = nreq + jax.random.randint(key_count, (N,), 0, in_degree - nreq + 1)
    priority = jnp.where(req, 2.0, jnp.where(allowed.T, u, -1.0))
    top, index = jax.lax.top_k(priority, K) if K > 0 else (priority[:, :0], priority[:, :0])
    keep = (top >= 0) & (jnp.arange(K)[None, :] < count[:, None])
    return _canonical(jnp.where(keep, index, -1).astype(jnp.int32))


@eqx.filter_jit
def _set_scores(data, cards, sets, prior, log_odds, chunk) -> Array:
    """The local score of one set per node `(N, K)`, from its own statistics by the matrix
    products of the moves (a program whose size does not grow with N; the moves' scores
    are compared with it)."""
    N, K = sets.shape
    none = jnp.full((N, 1), -1, jnp.int32)  # no joint statistics: no candidate columns
    kmax = max(cards)
    _, _, D_own, E_own = _move_statistics(data, sets[:, None, :], cards, kmax**K, chunk, False,
                                          none)  # fmt: skip
    configs = num_configurations(sets[:, None, :], cards)
    scores = _own_scores(prior, cards, D_own, E_own, configs)[:, 0]
    member = (sets[..., None] == jnp.arange(N)).any(-2)  # (N, N): [n, m]
    return scores + jnp.einsum("nm,mn->n", member.astype(log_odds.dtype), log_odds)


def search_data(trajectories: Trajectories, cards: tuple[int, ...]):
    """The checked (concrete) trajectories as the rows the move statistics sum over, built on
    the host trajectory by trajectory (never the padded `(paths x slots, N)` arrays): the
    segments that last (states and dwell weights `(rows, N)`, node n's weight 0 in the
    trajectories that hold it), the jumps' pre- and post-states `(jumps, N)`, for every node the
    rows of its own pooled jumps `(N, J)` with their weights (1; 0 past the node's count), and
    which nodes each jump moved `(jumps, N)` (boolean: an eighth of float64's memory)."""
    check_trajectories_now(trajectories, cards)  # no guarded copy of the data
    initial, times, states, counts, durations, targets = (
        np.asarray(x)
        for x in (
            trajectories.initial_states,
            trajectories.jump_times,
            trajectories.states,
            trajectories.num_events,
            trajectories.durations,
            trajectories.intervention_targets,
        )
    )
    N = len(cards)
    dtype = times.dtype

    def path_of(r):  # trajectory r: its states, dwell times, lasting segments, real jumps
        J = int(counts[r])
        path = np.concatenate([initial[r][None], states[r, :J]])  # (J + 1, N)
        edges = np.concatenate([[0.0], times[r, :J], [durations[r]]]).astype(dtype)
        dwell = np.diff(edges)
        moved = (path[:-1] != path[1:]) & ~targets[r][None, :]
        return path, dwell, dwell > 0, moved, moved.any(1)

    # two passes over the trajectories: the numbers of rows, then the rows written in place
    # (no per-trajectory lists concatenated: the host holds the rows once)
    sizes = np.array([[p[2].sum(), p[4].sum()] for p in map(path_of, range(len(counts)))])
    rows, jumps = (int(x) for x in sizes.sum(0)) if len(sizes) else (0, 0)
    seg = np.zeros((rows, N), states.dtype)
    w_dwell = np.zeros((rows, N), dtype)
    pre, post = np.zeros((jumps, N), states.dtype), np.zeros((jumps, N), states.dtype)
    moved = np.zeros((jumps, N), bool)
    at_row = at_jump = 0
    for r in range(len(counts)):
        path, dwell, lasting, moved_r, real = path_of(r)
        a, b = at_row, at_row + int(lasting.sum())
        seg[a:b] = path[lasting]
        w_dwell[a:b] = dwell[lasting, None] * ~targets[r][None, :]
        c, d = at_jump, at_jump + int(real.sum())
        pre[c:d], post[c:d], moved[c:d] = path[:-1][real], path[1:][real], moved_r[real]
        at_row, at_jump = b, d
    if rows == 0:  # no time at all: one dummy segment (weight 0)
        seg, w_dwell = np.zeros((1, N), states.dtype), np.zeros((1, N), dtype)
    if jumps == 0:  # no jump at all: one dummy row (weight 0)
        pre, post, moved = seg[:1], seg[:1], np.zeros((1, N), bool)
    counts_per_node = moved.sum(0)
    J = max(int(counts_per_node.max(initial=0)), 1)
    jump_rows = np.zeros((N, J), np.int32)
    jump_weights = np.zeros((N, J), dtype)
    for n in range(N):
        rows_n = np.nonzero(moved[:, n])[0]
        jump_rows[n, : len(rows_n)] = rows_n
        jump_weights[n, : len(rows_n)] = 1.0
    arrays = [seg, w_dwell, pre, post, jump_rows, jump_weights, moved]
    del seg, w_dwell, pre, post, jump_rows, jump_weights, moved
    out = []
    while arrays:  # each host array released once it is on the device
        out.append(jnp.asarray(arrays.pop(0)))
    return tuple(out)


def hill_climb(
    trajectories: Trajectories,
    cards: tuple[int, ...],
    search: HillClimbing,
    *,
    prior: AbstractPrior,
    max_parents: int | Sequence[int],
    required_edges: Sequence[tuple[int, int]] = (),
    forbidden_edges: Sequence[tuple[int, int]] = (),
    tiers: Sequence[int] | None = None,
    edge_prior=None,
    data=None,
) -> SearchResult:
    """Run `search` on complete trajectories (see the module page); `data`: their
    `search_data` when already made."""
    N = len(cards)
    allowed, required, per_node = knowledge_arrays(
        N, max_parents, required_edges, forbidden_edges, tiers
    )
    in_degree = np.asarray(per_node, np.int32)
    K = int(in_degree.max())
    dtype = trajectories.jump_times.dtype
    if edge_prior is None:
        log_odds = jnp.zeros((N, N), dtype)
    else:
        pi = jnp.asarray(edge_prior, dtype)
        log_odds = jnp.where(jnp.eye(N, dtype=bool), 0.0, jnp.log(pi) - jnp.log1p(-pi))
    data = search_data(trajectories, cards) if data is None else data
    columns = None
    if search.candidates is not None:  # the sparse candidates: one step of additions
        held = int(required.sum(0).max(initial=0))
        screen_from = jnp.asarray(_required_sets(required, held + 1))
        columns = _screened_candidates(
            data, screen_from, cards, prior, log_odds, jnp.asarray(allowed),
            jnp.asarray(required), jnp.asarray(in_degree), search.chunk,
            search.candidates + held,
        )  # fmt: skip
        allowed = allowed & _listed(columns)  # [m, n]: m is a candidate of n
    # the first climb starts from the required parents alone
    starts = [_canonical(jnp.asarray(_required_sets(required, K)))]
    if search.restarts:
        assert search.key is not None  # (checked at construction)
        keys = jax.random.split(search.key, search.restarts)
        starts += [
            _start_sets(k, jnp.asarray(allowed), jnp.asarray(required), jnp.asarray(in_degree), K)
            for k in keys
        ]
    best: tuple[Array, Array, Array] | None = None
    args = (
        jnp.asarray(allowed),
        jnp.asarray(required),
        jnp.asarray(in_degree),
        search.chunk,
        search.swaps,
    )
    for start in starts:
        scores = _set_scores(data, cards, start, prior, log_odds, search.chunk)
        sets, scores, steps = _climb(data, start, scores, cards, prior, log_odds, *args,
                                     search.max_steps, columns, search.tabu)  # fmt: skip
        if best is None:
            best = (sets, scores, steps)
        else:  # each node keeps its best climb
            better = scores > best[1]
            best = (
                jnp.where(better[:, None], sets, best[0]),
                jnp.where(better, scores, best[1]),
                jnp.where(better, steps, best[2]),
            )
    assert best is not None
    best_sets, best_scores, best_steps = best
    pools = _pools(data, best_sets, cards, prior, log_odds, *args, search.pool_size, columns)
    return SearchResult(sets=best_sets, scores=best_scores, pools=pools, steps=best_steps)


def _required_sets(required: np.ndarray, K: int) -> np.ndarray:
    """`(N, K)`: each node's required parents, padded with `-1`."""
    N = required.shape[0]
    out = np.full((N, K), -1, np.int32)
    for n in range(N):
        parents = np.nonzero(required[:, n])[0]
        out[n, : len(parents)] = parents
    return out


#: the most entries of one node's transition table over its pool (x 8 nodes at a time)
_TABLE_ENTRIES = 1 << 20


@eqx.filter_jit
def pool_statistics(data, cards: tuple[int, ...], pools, sets, chunk: int) -> FamilyStatistics:
    r"""The family statistics of every node's candidate sets `sets[n] (S_n, K)`, each drawn
    from the node's pool `pools (N, P)` (padded with `-1`), by contingency tables: node n's
    dwell times over the joint states $(u, x)$ of its pool and itself,
    $T_n(u, x) = \sum_s \Delta t_s [x_{\mathrm{pool}}(s) = u, x_n(s) = x]$ (one segment sum
    over the segments, $k_{\max}^P k$ bins), and its transitions likewise over its own jumps;
    every set's statistics are then sums of table entries, over the pool states that give
    each of its configurations. The work over the segments is one pass per node, whatever the
    number of sets. (Nodes of many states with a wide pool, whose tables would pass
    `_TABLE_ENTRIES`: the scatter route over every set, `chunk` segments at a time.)"""
    seg, w_dwell, pre, post, jump_rows, jump_weights, moved = data
    P = pools.shape[1]
    kmax = max(cards)
    U = kmax**P
    if U * kmax * kmax > _TABLE_ENTRIES:
        return _scatter_statistics(cards, sets, seg, w_dwell, pre, post, moved, chunk)

    def one_node(k, configs, n, node_sets, pool, w_n, rows_n, weights_n):
        present, safe, pool_cards, pool_strides = slot_strides(pool, cards)

        def pool_state(states):  # (rows, N) -> the pool's joint state (rows,)
            digits = jnp.where(present, jnp.take(states, safe, axis=1), 0)
            return (digits * pool_strides).sum(-1)

        dwell = jax.ops.segment_sum(
            w_n, pool_state(seg) * k + jnp.take(seg, n, axis=1), num_segments=U * k
        ).reshape(U, k)
        a, b = pre[rows_n], post[rows_n]
        index = (pool_state(a) * k + jnp.take(a, n, axis=1)) * k + jnp.take(b, n, axis=1)
        jumps = jax.ops.segment_sum(weights_n, index, num_segments=U * k * k).reshape(U, k, k)
        u = jnp.arange(U)
        digits = (u[:, None] // pool_strides[None, :]) % pool_cards[None, :]  # (U, P)

        def one_set(parents):  # parents (K,) from the pool, padded with -1
            slot = jnp.argmax(pool[None, :] == parents[:, None], axis=1)  # (K,)
            held, _, _, set_strides = slot_strides(parents, cards)
            # (U,): the set's configuration in each pool state
            config = (jnp.where(held[None, :], digits[:, slot], 0) * set_strides).sum(-1)
            T = jax.ops.segment_sum(dwell, config, num_segments=configs)
            M = jax.ops.segment_sum(jumps, config, num_segments=configs)
            return M, T

        return jax.vmap(one_set)(node_sets)

    return grouped_family_statistics(
        cards,
        sets,
        one_node,
        lambda index: (pools[index], w_dwell[:, index].T, jump_rows[index], jump_weights[index]),
    )


def _listed(lists) -> np.ndarray:
    """Each node's list of nodes `(N, P)` (padded with `-1`) as `[m, n]`: m is in n's list."""
    lists = np.asarray(lists)
    N = lists.shape[0]
    out = np.zeros((N, N), bool)
    child = np.broadcast_to(np.arange(N)[:, None], lists.shape)
    out[lists[lists >= 0], child[lists >= 0]] = True
    return out


def pool_parent_sets(
    pools,
    max_parents: int | Sequence[int],
    *,
    required_edges: Sequence[tuple[int, int]] = (),
    forbidden_edges: Sequence[tuple[int, int]] = (),
    tiers: Sequence[int] | None = None,
) -> tuple[Array, ...]:
    """The candidate sets of every node drawn from its pool `(N, P)` (padded with `-1`), the
    prior knowledge kept."""
    within = _listed(pools)
    return candidate_parent_sets(
        within.shape[0],
        max_parents,
        required_edges=required_edges,
        forbidden_edges=forbidden_edges,
        tiers=tiers,
        within=within,
    )
