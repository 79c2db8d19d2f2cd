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

from .._model.layout import num_configurations
from .._paths.sampling import Trajectories
from .candidates import knowledge_arrays
from .moves import dropped_parents, move_scores, move_statistics, own_scores
from .priors import AbstractPrior
from .search_data import search_data
from .search_pool import listed


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


def _canonical(sets: Array) -> Array:
    """Parent sets `(..., K)` sorted ascending with the `-1` padding last."""
    big = jnp.iinfo(jnp.int32).max
    s = jnp.sort(jnp.where(sets < 0, big, sets), axis=-1)
    return jnp.where(s == big, -1, s).astype(jnp.int32)


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
        dropped = dropped_parents(sets)
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
    _, _, D_own, E_own = move_statistics(data, sets[:, None, :], cards, kmax**K, chunk, False,
                                          none)  # fmt: skip
    configs = num_configurations(sets[:, None, :], cards)
    scores = own_scores(prior, cards, D_own, E_own, configs)[:, 0]
    member = (sets[..., None] == jnp.arange(N)).any(-2)  # (N, N): [n, m]
    return scores + jnp.einsum("nm,mn->n", member.astype(log_odds.dtype), log_odds)


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
        allowed = allowed & listed(columns)  # [m, n]: m is a candidate of n
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
