"""Family statistics: the sufficient statistics of every node projected onto each of its
candidate parent sets, computed from complete paths in one vectorised pass (co-occupancy
tensors, from segments or from the jumps)."""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from .._model.layout import config_index, max_configs
from .._paths.sampling import Trajectories
from .._paths.sufficient_statistics import check_trajectories, segments
from .memory import _plan_family_statistics, _route_chunk, memory_budget_bytes
from .pairwise_routes import cooccupancy, cooccupancy_from_jumps, pairwise_gather, transition_groups


class FamilyStatistics(eqx.Module):
    r"""Pooled statistics of every node projected onto each of its candidate parent sets.

    - `transitions[n]`: $M_n(x,x',u)$, shape `(sets, max_configs, k, k)`;
    - `dwell_times[n]`: $T_n(x,u)$, shape `(sets, max_configs, k)`;
    - `parent_sets[n]`: `(sets, max_parents)` padded with `-1`.

    Node $n$'s statistics only use trajectories in which $n$ was not perfectly intervened on.
    Additive: `a + b` pools two batches of experiments.
    """

    transitions: tuple[Array, ...]
    dwell_times: tuple[Array, ...]
    parent_sets: tuple[Int[Array, "_sets max_parents"], ...]
    cardinalities: tuple[int, ...] = eqx.field(static=True)

    def __add__(self, other: "FamilyStatistics") -> "FamilyStatistics":
        if other.cardinalities != self.cardinalities:
            raise ValueError("FamilyStatistics: cannot add statistics of different networks.")
        return FamilyStatistics(
            transitions=tuple(a + b for a, b in zip(self.transitions, other.transitions)),
            dwell_times=tuple(a + b for a, b in zip(self.dwell_times, other.dwell_times)),
            parent_sets=self.parent_sets,
            cardinalities=self.cardinalities,
        )


def _segments(t: Trajectories):
    """Flattened segments (state, dwell, trajectory) and events (pre, post state, trajectory)
    of checked trajectories."""
    R, E = t.jump_times.shape
    seg_states, dwell, valid_event = jax.vmap(segments)(t)  # (R, E+1, N), (R, E+1), (R, E)
    traj = jnp.broadcast_to(jnp.arange(R)[:, None], (R, E + 1))
    N = seg_states.shape[-1]
    return (
        seg_states.reshape(-1, N),
        dwell.reshape(-1),
        traj.reshape(-1),
        seg_states[:, :-1].reshape(-1, N),
        seg_states[:, 1:].reshape(-1, N),
        valid_event.reshape(-1),
        traj[:, :-1].reshape(-1),
    )


def _scatter_route(node, k, sets, cards, configs, seg, w_dwell, pre, post, w_event, chunk):
    """Node `node`'s (`k` states; the index may be traced) statistics on every candidate set
    by segment sums, streamed over chunks of `chunk` segments (events): the temporaries are
    sets x chunk, never sets x segments."""

    def streamed(states, weights, bins_of, num_bins):
        rows = states[0].shape[0]
        size = min(chunk, max(rows, 1))
        pad = (-rows) % size
        parts = [jnp.concatenate([a, jnp.zeros((pad,) + a.shape[1:], a.dtype)]) for a in states]
        w = jnp.concatenate([weights, jnp.zeros((pad,), weights.dtype)])
        xs = (tuple(a.reshape(-1, size, *a.shape[1:]) for a in parts), w.reshape(-1, size))

        def step(acc, chunk_rows):
            arrays, wc = chunk_rows

            def one(parents):
                return jax.ops.segment_sum(wc, bins_of(parents, *arrays), num_segments=num_bins)

            return acc + jax.vmap(one)(sets), None

        init = jnp.zeros((sets.shape[0], num_bins), weights.dtype)
        return jax.lax.scan(step, init, xs)[0]

    T = streamed(
        (seg,),
        w_dwell,
        lambda parents, s: config_index(s, parents, cards) * k + jnp.take(s, node, axis=1),
        configs * k,
    )
    M = streamed(
        (pre, post),
        w_event,
        lambda parents, a, b: (
            (config_index(a, parents, cards) * k + jnp.take(a, node, axis=1)) * k
            + jnp.take(b, node, axis=1)
        ),
        configs * k * k,
    )
    return M.reshape(-1, configs, k, k), T.reshape(-1, configs, k)


def family_statistics(
    trajectories: Trajectories,
    cardinalities: Sequence[int],
    parent_sets: Sequence[Int[Array | np.ndarray, "_sets max_parents"]],
    *,
    method: str = "auto",
    chunk: int | None = None,
    names: Sequence[str] | None = None,
    memory_budget: int | float | str | None = None,
) -> FamilyStatistics:
    r"""Pooled statistics of each node under each of its candidate parent sets, from a batch of
    trajectories (one leading axis), in one jittable computation.

    `method`: `"scatter"` (one segment sum per candidate set, any in-degree), `"matmul"`
    (in-degree <= 2: all three-way co-occupancy sums at once by matrix products over the path
    segments, much faster for many nodes and few states), `"jumps"` (in-degree <= 2, float64:
    the same sums by parts over the jumps, grouped by transition, so the work grows with
    jumps x nodes$^2$ instead of segments x nodes$^3$; for 20-100 nodes; needs each jump to change
    one node, checked), or `"auto"` (for in-degree <= 2 the cheaper pairwise route by its count
    of multiply-adds, within the memory budget; `"jumps"` only for concrete float64 data, so an
    outer `jax.jit` gets `"matmul"` unless it asks for `"jumps"`). All routes give the same
    numbers up to rounding (tested). `chunk` (static): path segments (scatter, matmul; default
    4096) or jumps (jumps, default 1024) per segment sum or matrix product.

    **Checks.** The trajectories' node states must be in `0..k-1` for `cardinalities` (a
    `ValueError` naming the node when the arrays are concrete, an `eqx.error_if` inside jit; a
    state $\ge k$ would otherwise silently drop its time); no path may be truncated and times
    must be valid. `names` (optional) names the nodes in messages.

    **Memory.** Before allocating anything, the memory of the request is estimated from the
    cardinalities, the number of candidate parent sets and their configurations, the number of
    path segments and the route. Above the budget (`memory_budget`, bytes or e.g. `"8G"`; default
    the environment variable `JAXCTBN_MEMORY_BUDGET`, else 4 GiB) this raises a one-line
    `ValueError` that says what is large and how to reduce it.
    """
    cards = tuple(int(k) for k in cardinalities)
    if len(parent_sets) != len(cards):
        raise ValueError(
            f"parent_sets: need one array per node ({len(cards)}), got {len(parent_sets)}."
        )
    if trajectories.num_events.ndim != 1:
        raise ValueError("trajectories: expected one leading batch axis of trajectories.")
    if trajectories.initial_states.shape[-1] != len(cards):
        raise ValueError(
            f"trajectories: have {trajectories.initial_states.shape[-1]} nodes, cardinalities {len(cards)}."
        )
    if method not in ("auto", "scatter", "matmul", "jumps"):
        raise ValueError(f"method must be 'auto', 'scatter', 'matmul' or 'jumps', got {method!r}.")
    if names is not None and len(names) != len(cards):
        raise ValueError(f"names: need {len(cards)} node names, got {len(names)}.")
    if chunk is not None and (not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}.")
    max_k = max(jnp.shape(s)[-1] for s in parent_sets)
    if method in ("matmul", "jumps") and max_k > 2:
        raise ValueError(f"method={method!r} supports at most 2 parents; use 'scatter'.")
    if method == "jumps" and jnp.dtype(trajectories.jump_times.dtype) != jnp.float64:
        raise ValueError(
            "method='jumps' needs float64 times (jax_enable_x64): its sums by parts cancel; "
            "use method='matmul'."
        )
    method = _plan_family_statistics(
        "family_statistics",
        trajectories,
        cards,
        [(int(jnp.shape(s)[0]), int(jnp.shape(s)[-1])) for s in parent_sets],
        method=method,
        chunk=chunk,
        names=names,
        budget=memory_budget_bytes(memory_budget),
    )
    chunk = _route_chunk(method, chunk)
    # every statistic below is computed from the checked trajectories
    trajectories = check_trajectories(trajectories, cards, names)
    if method == "jumps":
        D_all, E_all = cooccupancy_from_jumps(cards, trajectories, chunk)
        return _pairwise_statistics(cards, parent_sets, D_all, E_all)
    seg, dwell, seg_traj, pre, post, valid_event, ev_traj = _segments(trajectories)
    # pooling: node n's statistics skip the trajectories in which n was intervened on
    keep_seg = ~trajectories.intervention_targets[seg_traj]  # (segs, N)
    keep_ev = ~trajectories.intervention_targets[ev_traj] & valid_event[:, None]  # (events, N)
    w_dwell = dwell[:, None] * keep_seg
    moved = (pre != post) & keep_ev
    if method == "matmul":
        dtype = dwell.dtype
        w_dwell_cols = jnp.concatenate(
            [
                jax.nn.one_hot(seg[:, n], k, dtype=dtype) * w_dwell[:, n : n + 1]
                for n, k in enumerate(cards)
            ],
            axis=1,
        )
        w_event_cols = jnp.stack(
            [
                moved[:, n] & (pre[:, n] == x) & (post[:, n] == y)
                for n, x, y in transition_groups(cards)[0]
            ],
            axis=1,
        ).astype(dtype)
        D_all, E_all = cooccupancy(cards, seg, w_dwell_cols, pre, w_event_cols, chunk)
        return _pairwise_statistics(cards, parent_sets, D_all, E_all)
    return scatter_statistics(cards, parent_sets, seg, w_dwell, pre, post, moved, chunk)


def grouped_family_statistics(cards, parent_sets, node_statistics, node_arrays) -> FamilyStatistics:
    """The family statistics of every node from `node_statistics(k, configs, n, sets, *arrays)`,
    node n's `(M, T)` (k states, `configs` configurations) on its candidate sets padded with
    empty sets; one compiled body per group of nodes with the same states and set shapes, run
    by `lax.map` over the group's nodes (8 at a time) with `node_arrays(index)`, the arrays of
    the nodes `index` (leading axis the node). The padding is cut off after."""
    sets_of = [jnp.asarray(S, jnp.int32) for S in parent_sets]
    out: list = [None] * len(cards)
    keys = [
        (cards[n], sets_of[n].shape[-1], max_configs(n, cards, sets_of[n].shape[-1]))
        for n in range(len(cards))
    ]
    for key in dict.fromkeys(keys):
        k, width, configs = key
        nodes = [n for n in range(len(cards)) if keys[n] == key]
        count = max(sets_of[n].shape[0] for n in nodes)
        padded = jnp.stack(
            [
                jnp.concatenate(
                    [sets_of[n], jnp.full((count - sets_of[n].shape[0], width), -1, jnp.int32)]
                )
                for n in nodes
            ]
        )
        index = jnp.asarray(nodes)
        M, T = jax.lax.map(
            lambda args, k=k, configs=configs: node_statistics(k, configs, *args),
            (index, padded, *node_arrays(index)),
            batch_size=min(len(nodes), 8),
        )
        for i, n in enumerate(nodes):
            out[n] = (M[i, : sets_of[n].shape[0]], T[i, : sets_of[n].shape[0]])
    return FamilyStatistics(
        transitions=tuple(M for M, _ in out),
        dwell_times=tuple(T for _, T in out),
        parent_sets=tuple(sets_of),
        cardinalities=cards,
    )


def scatter_statistics(cards, parent_sets, seg, w_dwell, pre, post, moved, chunk):
    """The family statistics of every node by the scatter route from flat rows: segment
    states and dwell weights `(rows, N)` (pooling applied), events' pre- and post-states and
    jump weights `(events, N)`."""
    moved = moved.astype(w_dwell.dtype)

    def one_node(k, configs, n, sets, w_n, moved_n):
        return _scatter_route(n, k, sets, cards, configs, seg, w_n, pre, post, moved_n, chunk)

    return grouped_family_statistics(
        cards, parent_sets, one_node, lambda index: (w_dwell[:, index].T, moved[:, index].T)
    )


def _pairwise_statistics(cards, parent_sets, D_all, E_all) -> FamilyStatistics:
    """The family statistics of every node read from the co-occupancy tensors of the pairwise
    routes (`D_all` over the dwell columns, `E_all` over the transition columns of
    `transition_groups`), one vectorised gather per group of nodes with the same number of
    states and the same shape of candidate sets (one for a network of binary nodes)."""
    _, index = transition_groups(cards)
    own = np.concatenate([[0], np.cumsum(cards)[:-1]])
    sets = [jnp.asarray(S, jnp.int32) for S in parent_sets]
    shapes = [
        (k, sets[n].shape, max_configs(n, cards, sets[n].shape[-1])) for n, k in enumerate(cards)
    ]
    out: list = [None] * len(cards)
    for shape in dict.fromkeys(shapes):
        k, _, configs = shape
        nodes = [n for n in range(len(cards)) if shapes[n] == shape]
        M, T = jax.vmap(
            lambda o, p, S, k=k, configs=configs: pairwise_gather(
                o, k, p, S, cards, configs, D_all, E_all
            )
        )(
            jnp.asarray(own[nodes]),
            jnp.asarray(index[nodes, :k, :k]),
            jnp.stack([sets[n] for n in nodes]),
        )
        for i, n in enumerate(nodes):
            out[n] = (M[i], T[i])
    return FamilyStatistics(
        transitions=tuple(M for M, _ in out),
        dwell_times=tuple(T for _, T in out),
        parent_sets=tuple(sets),
        cardinalities=cards,
    )
