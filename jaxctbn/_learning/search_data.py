"""Complete trajectories as the rows a graph search sums over: the lasting segments with their
dwell weights, the jumps' pre- and post-states, and each node's own jumps."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .._paths.sampling import Trajectories
from .._paths.sufficient_statistics import check_trajectories_now


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
