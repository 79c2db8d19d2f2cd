"""The hand-over from a graph search to the exact posterior: the parent sets drawn from each
node's pool, and their family statistics by contingency tables over the pool's states."""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._model.layout import slot_strides
from .candidates import candidate_parent_sets
from .family_statistics import FamilyStatistics, grouped_family_statistics, scatter_statistics

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
        return scatter_statistics(cards, sets, seg, w_dwell, pre, post, moved, chunk)

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


def listed(lists) -> np.ndarray:
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
    within = listed(pools)
    return candidate_parent_sets(
        within.shape[0],
        max_parents,
        required_edges=required_edges,
        forbidden_edges=forbidden_edges,
        tiers=tiers,
        within=within,
    )
