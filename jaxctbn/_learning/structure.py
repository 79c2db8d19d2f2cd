r"""Exact Bayesian structure learning of CTBNs with data pooled across interventions.

Because CTBN graphs may be cyclic, the posterior over graphs factorises over nodes:
$p(G\mid H)=\prod_n p(\mathrm{par}(n)\mid H)$ with
$p(\mathrm{par}(n)=P\mid H)\propto p(P)\,p(X_n\mid X_P)$, the local marginal likelihood of node
$n$'s pooled statistics under parent set $P$ (maths §5, **with** the prior normalising terms that the
paper's "$\propto$" drops). Every candidate parent set of every node is scored in one vectorised
computation from [`jaxctbn.FamilyStatistics`][] (statistics of node $n$ projected onto each
candidate set), which are additive, so adding an experiment never needs the raw paths again.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._model.ctbn import CTBN, PaddedCTBN
from .._model.layout import (
    all_global_states,
    config_index,
    global_state_index,
    max_configs,
    num_configurations,
)
from .._paths.sampling import Trajectories
from .._paths.sufficient_statistics import _check_states_now, _check_trajectories, segments
from .posterior import AbstractPosterior
from .priors import AbstractPrior, GammaPrior


# --------------------------------------------------------------------------- candidates
def enumerate_parent_sets(
    num_nodes: int,
    node: int,
    max_parents: int,
    *,
    required: Sequence[int] = (),
    forbidden: Sequence[int] = (),
) -> np.ndarray:
    """All parent sets of `node` with at most `max_parents` parents that contain every `required`
    parent and no `forbidden` one, ordered by size then lexicographically; shape
    `(sets, max_parents)`, padded with `-1`."""
    if not 0 <= max_parents <= num_nodes - 1:
        raise ValueError(
            f"max_parents must be between 0 and {num_nodes - 1} (N - 1), got {max_parents}."
        )
    required_set, forbidden_set = set(required), set(forbidden)
    if node in required_set or node in forbidden_set:
        raise ValueError(f"required/forbidden edges of node {node}: self-loops are not allowed.")
    if required_set & forbidden_set:
        raise ValueError(
            f"edges {sorted(required_set & forbidden_set)} -> {node} are both required and forbidden."
        )
    if len(required_set) > max_parents:
        raise ValueError(
            f"node {node} has {len(required_set)} required parents > max_parents={max_parents}."
        )
    others = [m for m in range(num_nodes) if m != node and m not in forbidden_set]
    sets = []
    for size in range(max_parents + 1):
        for combo in itertools.combinations(others, size):
            if required_set <= set(combo):
                sets.append(list(combo) + [-1] * (max_parents - size))
    return np.asarray(sets, dtype=np.int32).reshape(len(sets), max_parents)


def candidate_parent_sets(
    num_nodes: int,
    max_parents: int,
    *,
    required_edges: Sequence[tuple[int, int]] = (),
    forbidden_edges: Sequence[tuple[int, int]] = (),
) -> tuple[Int[Array, "_sets max_parents"], ...]:
    """Candidate parent sets of every node (see [`jaxctbn.enumerate_parent_sets`][]); edges are
    `(parent, child)` index pairs."""
    for a, b in list(required_edges) + list(forbidden_edges):
        if not (0 <= a < num_nodes and 0 <= b < num_nodes):
            raise ValueError(f"edge ({a}, {b}): node index out of range for {num_nodes} nodes.")
    return tuple(
        jnp.asarray(
            enumerate_parent_sets(
                num_nodes,
                n,
                max_parents,
                required=[a for a, b in required_edges if b == n],
                forbidden=[a for a, b in forbidden_edges if b == n],
            )
        )
        for n in range(num_nodes)
    )


# --------------------------------------------------------------------------- memory
DEFAULT_MEMORY_BUDGET = 4 * 2**30
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _memory_budget(value: int | float | str | None = None) -> int:
    """The memory budget of structure learning in bytes: `value` if given, else the environment
    variable `JAXCTBN_MEMORY_BUDGET`, else 4 GiB. A number of bytes, or a number with a binary
    suffix `K`, `M`, `G` or `T` (`"8G"`, `"512MiB"`, `"1.5 GB"` = 1.5 GiB)."""
    source = "memory_budget"
    if value is None:
        value = os.environ.get("JAXCTBN_MEMORY_BUDGET")
        source = "JAXCTBN_MEMORY_BUDGET"
        if value is None or not value.strip():
            return DEFAULT_MEMORY_BUDGET
    number = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(?:i?b)?\s*", value, re.I)
        if match:
            number = float(match.group(1)) * _UNITS[match.group(2).upper()]
    if number is None or not number > 0 or not math.isfinite(number):
        raise ValueError(
            f"{source}: expected a positive number of bytes such as 8000000000 or 8G, "
            f"got {value!r}."
        )
    return int(number)


def _format_bytes(n: int | float) -> str:
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        n /= 1024
        if n < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if n < 1e4 else f"{n:.2g} {unit}"
    raise AssertionError


def _label(n: int, names: Sequence[str] | None) -> str:
    return f"node {names[n]!r}" if names is not None else f"node {n}"


def _memory_parts(
    cards: tuple[int, ...],
    set_shapes: Sequence[tuple[int, int]],
    *,
    rows: int,
    events: int,
    method: str | None,
    chunk: int,
    itemsize: int,
    names: Sequence[str] | None,
) -> list[tuple[float, str, str]]:
    """Estimated bytes of the large arrays of `family_statistics` + scoring, as
    `(bytes, what, kind)`: the per-node statistics tables (`kind="tables"`), the route's
    temporaries (`"scatter"`, `"matmul"`) and the path segments (`"segments"`). XLA keeps a
    few copies of each, hence the factors; the estimate aims at the right order of magnitude."""
    N = len(cards)
    parts = []
    for n, (sets, width) in enumerate(set_shapes):
        k = cards[n]
        configs = max_configs(n, cards, width)
        # statistics, their copy in the posterior, and the scoring's elementwise temporaries
        size = 6.0 * sets * configs * k * (k + 1) * itemsize
        parts.append(
            (
                size,
                f"{_label(n, names)} has {k} states: {sets} candidate parent sets x {configs} "
                f"parent configurations x {k}x{k} transition tables",
                "tables",
            )
        )
        if method == "scatter":  # per candidate set: config index, bins and weights per row
            size = 8.0 * sets * (rows + events) * (width + 4)
            parts.append(
                (
                    size,
                    f"method='scatter' for {_label(n, names)}: {sets} candidate parent sets x "
                    f"{rows + events} path segments and jumps",
                    "scatter",
                )
            )
    if method == "matmul":
        K = sum(cards)
        Kp = 1 + sum(k - 1 for k in cards)
        cols = K + sum(k * (k - 1) for k in cards)
        rows_summed = min(rows, math.prod(cards))  # rows are summed per global state first
        size = itemsize * (
            rows * K
            + events * (cols - K)
            + 2 * min(chunk, max(rows_summed, 1)) * Kp * (Kp + 1) / 2
            + cols * (Kp * (Kp + 1) / 2 + Kp * Kp + Kp * K + 2 * K * K)
            + 2 * max(k * k for k in cards) * K * K
        )
        parts.append(
            (
                size,
                f"the co-occupancy tables of method='matmul': {cols} weight columns x {K}x{K} "
                "one-hot states",
                "matmul",
            )
        )
    if method == "jumps":
        K = sum(cards)
        Kp = 1 + sum(k - 1 for k in cards)
        G = sum(k * (k - 1) for k in cards)
        paths = rows - events  # one more segment than jump slots per path
        size = float(
            itemsize
            * (
                2 * G * 2 * Kp * Kp  # the per-transition sums and their corrections
                + 2 * Kp**3  # the reduced three-way table
                + 3 * K * Kp * Kp  # its expansion to the one-hot encoding
                + 2 * K * K * K
                + 2 * G * K * K
                + paths * Kp * Kp  # the two-way tables of the paths (pooling)
                + 3 * chunk * (2 * Kp + N)  # one chunk of jumps
                + 2 * (events // max(paths, 1)) * Kp  # one path's jumps
            )
        )
        parts.append(
            (
                size,
                f"the co-occupancy tables of method='jumps': {G} transitions x 2x{Kp}x{Kp} "
                f"sums and {K}x{K}x{K} three-way tables",
                "jumps",
            )
        )
        # the group, order and chunk table of every jump slot
        parts.append((8.0 * 6 * events, f"{events} jump slots sorted by transition", "segments"))
        return parts
    parts.append(
        (8.0 * (rows + 2 * events) * (N + 3), f"{rows} path segments of {N} nodes", "segments")
    )
    return parts


def _route_cost(
    method: str, cards: tuple[int, ...], *, paths: int, rows: int, events: int, chunk: int
) -> float:
    """Multiply-adds of the co-occupancy products of the pairwise routes (for `"auto"`)."""
    K = sum(cards)
    Kp = 1 + sum(k - 1 for k in cards)
    G = sum(k * (k - 1) for k in cards)
    if method == "matmul":
        S = math.prod(cards)
        return float((min(rows, S) * K + min(events, S) * G) * Kp * (Kp + 1) / 2)
    return float((events + G * chunk / 2) * 2 * Kp * Kp + (paths + 4 * G + 2 * K) * K * Kp * Kp)


def _check_memory(
    what: str,
    parts: list[tuple[float, str, str]],
    budget: int,
    *,
    largest_states: Sequence[int] | None = None,
) -> None:
    """Raise a one-line `ValueError` when the estimated `parts` exceed `budget` bytes."""
    total = sum(size for size, _, _ in parts)
    if total <= budget:
        return
    size, part, kind = max(parts, key=lambda p: p[0])
    hints = {
        "tables": "check the data for a mistyped state or give the right cardinalities, or lower "
        "max_parents",
        "scatter": "pass fewer trajectories at a time (FamilyStatistics add up: a + b)",
        "matmul": "use method='scatter'",
        "jumps": "use method='scatter'",
        "segments": "pass fewer trajectories at a time (FamilyStatistics add up: a + b)",
    }
    observed = ""
    if largest_states is not None and kind == "tables":
        observed = f" (largest states in the data: {list(largest_states)})"
    raise ValueError(
        f"{what}: needs about {_format_bytes(total)}, more than the memory budget of "
        f"{_format_bytes(budget)}; the largest part: {part} ({_format_bytes(size)}){observed}. "
        f"To reduce it, {hints[kind]}; or raise the budget with JAXCTBN_MEMORY_BUDGET (e.g. "
        "JAXCTBN_MEMORY_BUDGET=16G) or memory_budget= if the machine has the memory."
    )


def _route_chunk(method: str | None, chunk: int | None) -> int:
    """The chunk size of a route: `chunk` if given, else 4096 path segments per product for
    `"matmul"` and 1024 jumps for `"jumps"`."""
    if chunk is not None:
        return chunk
    return 1024 if method == "jumps" else 4096


def _plan_family_statistics(
    what: str,
    trajectories: Trajectories,
    cards: tuple[int, ...],
    set_shapes: Sequence[tuple[int, int]],
    *,
    method: str,
    chunk: int | None,
    names: Sequence[str] | None,
    budget: int,
    largest_states=None,
) -> str:
    """The route of `family_statistics` (`"auto"`: for in-degree <= 2 the cheaper of `"matmul"`
    and `"jumps"` (float64, concrete trajectories whose jumps change one node each) within the
    budget, else `"scatter"`), after checking the estimated memory of the request against
    `budget` (`ValueError` naming the large part). `largest_states`: an optional callable giving
    each node's largest state in the data, for the message."""
    num_paths, slots = (int(d) for d in trajectories.jump_times.shape)

    def parts_for(route):
        return _memory_parts(
            cards,
            set_shapes,
            rows=num_paths * (slots + 1),
            events=num_paths * slots,
            method=route,
            chunk=_route_chunk(route, chunk),
            itemsize=jnp.dtype(trajectories.jump_times.dtype).itemsize,
            names=names,
        )

    if method == "auto":
        width = max((w for _, w in set_shapes), default=0)
        method = "scatter"
        if width <= 2:
            routes = ["matmul"]
            float64 = jnp.dtype(trajectories.jump_times.dtype) == jnp.float64
            if float64 and _jumps_route_applies(trajectories):
                routes.append("jumps")
            costs = {
                route: _route_cost(
                    route,
                    cards,
                    paths=num_paths,
                    rows=num_paths * (slots + 1),
                    events=num_paths * slots,
                    chunk=_route_chunk(route, chunk),
                )
                for route in routes
                if sum(p[0] for p in parts_for(route)) <= budget
            }
            if costs:
                method = min(costs, key=costs.__getitem__)
    parts = parts_for(method)
    if sum(p[0] for p in parts) > budget:
        observed = None if largest_states is None else largest_states()
        _check_memory(what, parts, budget, largest_states=observed)
    return method


# --------------------------------------------------------------------------- statistics
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


def _scatter_route(node, sets, cards, configs, seg, w_dwell, pre, post, w_event):
    k = cards[node]

    def one(parents):
        c = config_index(seg, parents, cards)
        T = jax.ops.segment_sum(w_dwell, c * k + seg[:, node], num_segments=configs * k)
        ce = config_index(pre, parents, cards)
        bins = (ce * k + pre[:, node]) * k + post[:, node]
        M = jax.ops.segment_sum(w_event, bins, num_segments=configs * k * k)
        return M.reshape(configs, k, k), T.reshape(configs, k)

    return jax.vmap(one)(sets)


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


def _cooccupancy(cards, seg, w_dwell_cols, pre, w_event_cols, chunk):
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


def _transition_groups(cards: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
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


def _jumps_route_applies(t: Trajectories) -> bool | None:
    """Whether concrete trajectories (one batch axis) suit `method="jumps"`: every jump changes
    one node, and no node moves in a trajectory that records it as intervened on; `None` when
    they are traced."""
    if any(
        isinstance(a, jax.core.Tracer)
        for a in (t.initial_states, t.states, t.num_events, t.intervention_targets)
    ):
        return None
    init, states, num, targets = (
        np.asarray(a) for a in (t.initial_states, t.states, t.num_events, t.intervention_targets)
    )
    for r in range(0, states.shape[0], 64):  # a few paths at a time: no (paths, slots, nodes) copy
        block = states[r : r + 64]
        pre = np.concatenate([init[r : r + 64, None], block[:, :-1]], axis=1)
        real = np.arange(block.shape[1]) < num[r : r + 64, None]
        moved = real[..., None] & (pre != block)
        if np.any(moved.sum(-1) > 1) or np.any(moved & targets[r : r + 64, None]):
            return False
    return True


def _cooccupancy_from_jumps(cards, t: Trajectories, chunk):
    r"""The co-occupancy tensors of `_cooccupancy` (`D` over the dwell columns, `E` over the
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
    groups, index = _transition_groups(cards)
    G = groups.shape[0]
    col_node = np.repeat(np.arange(len(cards)), cards)
    d = jnp.asarray(np.stack([levels[m][y] - levels[m][x] for m, x, y in groups]), dtype)

    group, broken = _jump_groups(t, index)
    t = eqx.error_if(
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


def _pairwise_gather(own, k, pair_index, sets, cards, configs, D_all, E_all):
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
    numbers up to rounding (tested). `chunk` (static): path segments (matmul, default 4096) or
    jumps (jumps, default 1024) per matrix product.

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
        budget=_memory_budget(memory_budget),
    )
    chunk = _route_chunk(method, chunk)
    # every statistic below is computed from the checked trajectories
    trajectories = _check_trajectories(trajectories, cards, names)
    if method == "jumps":
        D_all, E_all = _cooccupancy_from_jumps(cards, trajectories, chunk)
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
                for n, x, y in _transition_groups(cards)[0]
            ],
            axis=1,
        ).astype(dtype)
        D_all, E_all = _cooccupancy(cards, seg, w_dwell_cols, pre, w_event_cols, chunk)
        return _pairwise_statistics(cards, parent_sets, D_all, E_all)
    Ms, Ts = [], []
    for n in range(len(cards)):
        sets = jnp.asarray(parent_sets[n], jnp.int32)
        configs = max_configs(n, cards, sets.shape[-1])
        M, T = _scatter_route(
            n, sets, cards, configs, seg, w_dwell[:, n], pre, post, moved[:, n].astype(dwell.dtype)
        )
        Ms.append(M)
        Ts.append(T)
    return FamilyStatistics(
        transitions=tuple(Ms),
        dwell_times=tuple(Ts),
        parent_sets=tuple(jnp.asarray(s, jnp.int32) for s in parent_sets),
        cardinalities=cards,
    )


def _pairwise_statistics(cards, parent_sets, D_all, E_all) -> FamilyStatistics:
    """The family statistics of every node read from the co-occupancy tensors of the pairwise
    routes (`D_all` over the dwell columns, `E_all` over the transition columns of
    `_transition_groups`), one vectorised gather per group of nodes with the same number of
    states and the same shape of candidate sets (one for a network of binary nodes)."""
    _, index = _transition_groups(cards)
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
            lambda o, p, S, k=k, configs=configs: _pairwise_gather(
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


# --------------------------------------------------------------------------- scores
def _candidate_sets_within_budget(
    caller: str,
    names: tuple[str, ...],
    cards: tuple[int, ...],
    max_parents: int,
    *,
    required_edges: Sequence[tuple[int, int]],
    forbidden_edges: Sequence[tuple[int, int]],
    memory_budget: int | float | str | None,
) -> tuple[Array, ...]:
    """The candidate parent sets, after checking that the statistics tables they need (no
    trajectory buffers) fit in the memory budget (a `ValueError` from `caller` otherwise)."""
    sets = candidate_parent_sets(
        len(cards), max_parents, required_edges=required_edges, forbidden_edges=forbidden_edges
    )
    parts = _memory_parts(
        cards,
        [(int(S.shape[0]), int(S.shape[-1])) for S in sets],
        rows=0,
        events=0,
        method=None,
        chunk=1,
        itemsize=jnp.dtype(float).itemsize,
        names=names,
    )
    _check_memory(caller, parts, _memory_budget(memory_budget))
    return sets


def _check_statistics(statistics: FamilyStatistics) -> FamilyStatistics:
    """The same statistics, guarded (`eqx.error_if` on every field) by: dwell times and
    transition counts finite and >= 0."""
    bad_T = jnp.stack([jnp.any(~(T >= 0) | ~jnp.isfinite(T)) for T in statistics.dwell_times])
    bad_M = jnp.stack([jnp.any(~(M >= 0) | ~jnp.isfinite(M)) for M in statistics.transitions])
    preds = jnp.stack([bad_T.any(), bad_M.any()])
    return eqx.branched_error_if(
        statistics,
        preds.any(),
        jnp.argmax(preds),
        [
            "statistics: dwell times must be finite and >= 0.",
            "statistics: transition counts must be finite and >= 0.",
        ],
    )


def _scores(prior: AbstractPrior, statistics: FamilyStatistics) -> tuple:
    cards = statistics.cardinalities
    return tuple(
        jax.vmap(lambda M, T, u, n=n: prior.log_marginal_likelihood(n, M, T, u))(
            statistics.transitions[n],
            statistics.dwell_times[n],
            num_configurations(statistics.parent_sets[n], cards),
        )
        for n in range(len(cards))
    )


def score_parent_sets(
    statistics: FamilyStatistics, *, prior: AbstractPrior = GammaPrior()
) -> tuple[Float[Array, " _sets"], ...]:
    r"""Local log marginal likelihoods $\ln p(X_n\mid X_P)$ of every candidate parent set of
    every node under `prior` ([`jaxctbn.GammaPrior`][], the paper's, or
    [`jaxctbn.NodelmanPrior`][], CTBN-RLE's family score), vectorised over sets, **with** the
    prior's normalising terms (maths §5). Statistics must be finite and $\ge0$ (checked inside
    jit, guarding every score)."""
    prior.check_num_nodes(len(statistics.cardinalities))
    return _scores(prior, _check_statistics(statistics))


# --------------------------------------------------------------------------- posterior
class StructurePosterior(AbstractPosterior):
    r"""The exact posterior over CTBN graphs, factorised over nodes.

    - `log_marginal_likelihoods[n]`: $\ln p(X_n\mid X_P)$ per candidate set $P$ of node $n$;
    - `log_prior[n]`: $\ln p(P)$ (unnormalised) per candidate set;
    - `statistics`: the [`jaxctbn.FamilyStatistics`][] they were computed from (for updates and
      for rate draws given a graph).
    """

    log_marginal_likelihoods: tuple[Float[Array, " _sets"], ...]
    log_prior: tuple[Float[Array, " _sets"], ...]
    statistics: FamilyStatistics
    prior: AbstractPrior
    names: tuple[str, ...] = eqx.field(static=True)

    @classmethod
    def from_statistics(
        cls,
        statistics: FamilyStatistics,
        names: Sequence[str],
        *,
        prior: AbstractPrior = GammaPrior(),
        edge_prior: Array | None = None,
    ) -> "StructurePosterior":
        r"""Score every candidate set under the rate `prior`. `edge_prior` (optional, `(N, N)`, entry `[m, n]` the prior
        probability of the edge $m\to n$ in $(0,1)$) gives
        $\ln p(P)=\sum_{m\in P}\ln\pi_{mn}+\sum_{m\notin P}\ln(1-\pi_{mn})$; default uniform over
        the candidate sets."""
        names = tuple(names)
        N = len(statistics.cardinalities)
        if len(names) != N:
            raise ValueError(f"names: need {N} node names, got {len(names)}.")
        prior.check_num_nodes(N)
        # the stored statistics are the checked ones, so every field is guarded
        statistics = _check_statistics(statistics)
        scores = _scores(prior, statistics)
        log_prior = structure_log_prior(statistics.parent_sets, edge_prior)
        return cls(
            log_marginal_likelihoods=scores,
            log_prior=log_prior,
            statistics=statistics,
            prior=prior,
            names=names,
        )

    @classmethod
    def from_prior(
        cls,
        names: Sequence[str],
        cardinalities: Sequence[int],
        *,
        max_parents: int,
        prior: AbstractPrior = GammaPrior(),
        edge_prior: Array | None = None,
        required_edges: Sequence[tuple[int, int]] = (),
        forbidden_edges: Sequence[tuple[int, int]] = (),
        memory_budget: int | float | str | None = None,
    ) -> "StructurePosterior":
        """The posterior before any data (zero statistics), e.g. the start of an active-learning
        run; add experiments with [`jaxctbn.StructurePosterior.update`][]. The memory of the
        statistics tables is estimated first and checked against the budget as in
        [`jaxctbn.family_statistics`][]."""
        names, cards = tuple(names), tuple(int(k) for k in cardinalities)
        N = len(cards)
        if len(names) != N:
            raise ValueError(f"names: need {N} node names, got {len(names)}.")
        sets = _candidate_sets_within_budget(
            "StructurePosterior.from_prior",
            names,
            cards,
            max_parents,
            required_edges=required_edges,
            forbidden_edges=forbidden_edges,
            memory_budget=memory_budget,
        )
        Ms, Ts = [], []
        for n, k in enumerate(cards):
            configs = max_configs(n, cards, sets[n].shape[-1])
            Ms.append(jnp.zeros((sets[n].shape[0], configs, k, k)))
            Ts.append(jnp.zeros((sets[n].shape[0], configs, k)))
        stats = FamilyStatistics(
            transitions=tuple(Ms),
            dwell_times=tuple(Ts),
            parent_sets=tuple(jnp.asarray(s, jnp.int32) for s in sets),
            cardinalities=cards,
        )
        return cls.from_statistics(stats, names, prior=prior, edge_prior=edge_prior)

    @property
    def cardinalities(self) -> tuple[int, ...]:
        return self.statistics.cardinalities

    def score_with(self, criterion, candidates, initial_state, horizon, **options):
        return criterion.score_structure(self, candidates, initial_state, horizon, **options)

    @property
    def parent_sets(self) -> tuple[Int[Array | np.ndarray, "_sets max_parents"], ...]:
        return self.statistics.parent_sets

    def update(self, new: FamilyStatistics) -> "StructurePosterior":
        r"""Add the statistics of new experiments and rescore (no raw paths needed). The new
        statistics must be finite and $\ge0$ (checked inside jit, guarding every field)."""
        stats = self.statistics + _check_statistics(new)
        scores = _scores(self.prior, stats)
        return eqx.tree_at(
            lambda p: (p.log_marginal_likelihoods, p.statistics), self, (scores, stats)
        )

    def with_prior(self, prior: AbstractPrior) -> "StructurePosterior":
        """The same data scored under another rate `prior` (e.g. hyper-parameters fitted by
        [`jaxctbn.EmpiricalBayes`][]); jittable."""
        prior.check_num_nodes(len(self.names))
        scores = _scores(prior, self.statistics)
        return eqx.tree_at(lambda p: (p.log_marginal_likelihoods, p.prior), self, (scores, prior))

    def truncated(self, max_sets: int) -> "StructurePosterior":
        r"""The posterior restricted to each node's `max_sets` most probable candidate sets (all
        of them where a node has fewer), renormalised over the kept sets:
        $\tilde p(P\mid H)=p(P\mid H)/\sum_{P'\in\mathcal K_n}p(P'\mid H)$ on the kept sets
        $\mathcal K_n$. Everything else (statistics, prior, further updates) is kept per kept
        set, so the result is an ordinary posterior over a smaller model space; its
        `log_evidence` is over that space. The mass left out per node is
        `1 - exp(logsumexp(log_posterior()[n][kept]))`; the design criteria use this to make
        their cost independent of $\binom{N-1}{\le k}$ (see [`jaxctbn.VBHC`][]'s `max_sets`).
        Jittable: the sets are chosen by `jax.lax.top_k` (ties keep the lower index) and kept in
        their original order."""
        if not isinstance(max_sets, int) or isinstance(max_sets, bool) or max_sets < 1:
            raise ValueError(f"max_sets: expected a positive integer, got {max_sets!r}.")
        kept = [  # in their original order, so keeping every set changes nothing
            jnp.sort(jax.lax.top_k(lp, min(max_sets, lp.shape[0]))[1])
            for lp in self.log_posterior()
        ]

        def take(arrays):
            return tuple(jnp.asarray(a)[i] for a, i in zip(arrays, kept))

        statistics = FamilyStatistics(
            transitions=take(self.statistics.transitions),
            dwell_times=take(self.statistics.dwell_times),
            parent_sets=take(self.statistics.parent_sets),
            cardinalities=self.statistics.cardinalities,
        )
        return StructurePosterior(
            log_marginal_likelihoods=take(self.log_marginal_likelihoods),
            log_prior=take(self.log_prior),
            statistics=statistics,
            prior=self.prior,
            names=self.names,
        )

    def log_evidence(self) -> Float[Array, ""]:
        r"""$\ln p(H)=\sum_n\ln\sum_P p(P)\,p(X_n\mid X_P)$: the marginal likelihood of the
        data under the rate prior, averaged over graphs with the structure prior normalised
        (it factorises over nodes). Zero before any data."""
        return jnp.asarray(
            sum(
                jax.nn.logsumexp(jax.nn.log_softmax(p) + s)
                for s, p in zip(self.log_marginal_likelihoods, self.log_prior)
            )
        )

    def log_posterior(self) -> tuple[Float[Array, " _sets"], ...]:
        """$\\ln p(\\mathrm{par}(n)=P\\mid H)$ for every candidate set of every node."""
        return tuple(
            jax.nn.log_softmax(s + p) for s, p in zip(self.log_marginal_likelihoods, self.log_prior)
        )

    def parent_set_probabilities(self) -> tuple[Float[Array, " _sets"], ...]:
        return tuple(jnp.exp(lp) for lp in self.log_posterior())

    def edge_marginals(self) -> Float[Array, "nodes nodes"]:
        """`[m, n]` = $p(m\\to n\\mid H)$ (zero diagonal)."""
        N = len(self.names)
        cols = []
        for n, probs in enumerate(self.parent_set_probabilities()):
            member = (self.parent_sets[n][:, :, None] == jnp.arange(N)).any(1)  # (sets, N)
            cols.append(probs @ member.astype(probs.dtype))
        return jnp.stack(cols, axis=1)

    def map_indices(self) -> Int[Array, " nodes"]:
        """Index of the MAP parent set of each node (jittable)."""
        return jnp.stack([jnp.argmax(lp) for lp in self.log_posterior()])

    def map_graph(self) -> tuple[tuple[int, ...], ...]:
        """The MAP graph as static parent tuples (host-side)."""
        idx = np.asarray(_map_indices(self))
        return tuple(
            tuple(int(p) for p in np.asarray(self.parent_sets[n][idx[n]]) if p >= 0)
            for n in range(len(self.names))
        )

    def map_adjacency(self) -> Array:
        """MAP graph as an `(N, N)` 0/1 adjacency matrix, `[m, n] = 1` for $m\\to n$ (jittable)."""
        N = len(self.names)
        idx = self.map_indices()
        rows = [(self.parent_sets[n][idx[n]][:, None] == jnp.arange(N)).any(0) for n in range(N)]
        return jnp.stack(rows, axis=1).astype(jnp.int32)

    def entropy(self) -> Float[Array, ""]:
        """Entropy of the structure posterior, $\\sum_n H[p(\\mathrm{par}(n)\\mid H)]$ (nats)."""
        total = jnp.asarray(0.0)
        for lp in self.log_posterior():
            total = total - jnp.sum(jnp.where(jnp.isfinite(lp), jnp.exp(lp) * lp, 0.0))
        return total

    def sample_parent_sets(self, key: PRNGKeyArray) -> Int[Array, " nodes"]:
        """One draw of a whole graph: the index of each node's parent set (jittable)."""
        keys = jr.split(key, len(self.names))
        return jnp.stack(
            self._per_node(lambda n, k, lp: jr.categorical(k, lp), keys, self.log_posterior())
        )

    def systematic_parent_sets(
        self, key: PRNGKeyArray, num_samples: int
    ) -> Int[Array, "samples nodes"]:
        r"""`num_samples` whole graphs by systematic sampling, node by node: node $n$'s sets are
        read off its posterior CDF at $u_s=(s+U_n)/S$, $s=0,\dots,S-1$, with one
        $U_n\sim\mathcal U(0,1)$ per node, and randomly permuted over the $S$ draws (an
        independent permutation per node). Each draw on its own is distributed as
        [`sample_parent_sets`][jaxctbn.StructurePosterior.sample_parent_sets] (product of the
        nodes' posteriors), so averages over the draws stay unbiased; but node $n$ takes set $P$
        in $\lfloor Sp\rfloor$ or $\lceil Sp\rceil$ of the draws, $p=p(P\mid H)$, rather
        than a binomial number, which removes the graph-sampling variance of the averages'
        per-node terms. Sets of zero probability are never drawn. Jittable."""
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
            raise ValueError(f"num_samples: expected a positive integer, got {num_samples!r}.")
        columns = []
        for lp, k in zip(self.log_posterior(), jr.split(key, len(self.names))):
            k_offset, k_order = jr.split(k)
            cdf = jnp.cumsum(jnp.exp(lp - jnp.max(lp)))
            cdf = cdf / cdf[-1]  # cdf[-1] == 1 exactly: u < 1 always lands on a set
            u = (jnp.arange(num_samples) + jr.uniform(k_offset, dtype=cdf.dtype)) / num_samples
            index = jnp.searchsorted(cdf, u, side="right")  # first set with cdf > u
            columns.append(jr.permutation(k_order, index.astype(jnp.int32)))
        return jnp.stack(columns, axis=1)

    def _node_groups(self) -> list[tuple[int, ...]]:
        """The nodes in groups of equal cardinality and equal shapes of their candidate sets and
        statistics tables: a per-node computation can be vectorised over a group."""
        groups: dict[tuple, list[int]] = {}
        for n, k in enumerate(self.cardinalities):
            shape = (k, np.shape(self.parent_sets[n]), np.shape(self.statistics.transitions[n]))
            groups.setdefault(shape, []).append(n)
        return [tuple(g) for g in groups.values()]

    def _per_node(self, fn, *per_node):
        """`[fn(n, *(a[n] for a in per_node)) for n in nodes]`, vectorised (`vmap`, with a traced
        node index `n`) over each group of nodes of equal shapes: one random draw, or one loop,
        per group instead of one per node. Each `a` in `per_node` is a sequence with one pytree
        per node; the results are the same numbers as node by node (random draws included: a
        node's draws depend only on its own key)."""
        out: list = [None] * len(self.names)
        for group in self._node_groups():
            if len(group) == 1:
                (n,) = group
                out[n] = fn(n, *(a[n] for a in per_node))
                continue
            stacked = [
                jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *(a[n] for n in group))
                for a in per_node
            ]
            values = jax.vmap(fn)(jnp.asarray(group, jnp.int32), *stacked)
            for i, n in enumerate(group):
                out[n] = jax.tree_util.tree_map(lambda x, i=i: x[i], values)
        return out

    def _rates_per_node(self, indices, rates_of_node, *per_node):
        """`rates_of_node(n, M, T, U, *args_n)` for every node, with node n's history statistics
        `M`, `T` under its candidate set `indices[n]` and that set's configurations `U`."""

        def one(n, transitions, dwell_times, sets, index, *args):
            U = num_configurations(jnp.asarray(sets)[index], self.cardinalities)
            return rates_of_node(n, transitions[index], dwell_times[index], U, *args)

        return self._per_node(
            one,
            [jnp.asarray(m) for m in self.statistics.transitions],
            [jnp.asarray(t) for t in self.statistics.dwell_times],
            self.parent_sets,
            list(indices),
            *per_node,
        )

    def _padded_model(self, indices, rates) -> PaddedCTBN:
        cims = []
        for n, k in enumerate(self.cardinalities):
            r = jnp.where(~jnp.eye(k, dtype=bool), rates[n], 0.0)
            cims.append(r - jnp.eye(k) * r.sum(-1, keepdims=True))
        return PaddedCTBN(
            cims=tuple(cims),
            parent_index=tuple(
                self.statistics.parent_sets[n][indices[n]] for n in range(len(self.names))
            ),
            names=self.names,
            cardinalities=self.cardinalities,
        )

    def rates_given(self, indices: Int[Array, " nodes"], key: PRNGKeyArray) -> PaddedCTBN:
        """Rates drawn from their posterior under the rate prior, given the parent-set `indices`
        (a [`jaxctbn.PaddedCTBN`][]: same shapes for every graph, so it vmaps over keys)."""
        keys = jr.split(key, len(self.names))
        rates = self._rates_per_node(indices, self.prior.sample_rates, keys)
        return self._padded_model(indices, rates)

    def mean_rates_given(self, indices: Int[Array, " nodes"]) -> PaddedCTBN:
        """Posterior-mean rates given the parent-set `indices` (e.g. `map_indices()`)."""
        rates = self._rates_per_node(indices, self.prior.posterior_mean_rates)
        return self._padded_model(indices, rates)

    def map_model(self) -> CTBN:
        """The MAP graph with posterior-mean rates as a [`jaxctbn.CTBN`][] (host-side)."""
        graph = self.map_graph()
        padded = _map_rates(self)
        cims = [
            padded.cims[n][: num_configurations(graph[n], self.cardinalities)]
            for n in range(len(self.names))
        ]
        return CTBN(cims=cims, parents=graph, names=self.names)


@eqx.filter_jit
def _map_indices(posterior: StructurePosterior) -> Array:
    return posterior.map_indices()


@eqx.filter_jit
def _map_rates(posterior: StructurePosterior) -> PaddedCTBN:
    return posterior.mean_rates_given(posterior.map_indices())


def structure_log_prior(parent_sets, edge_prior=None) -> tuple[Array, ...]:
    """Log prior of each candidate set: uniform (zeros) or from per-edge probabilities."""
    N = len(parent_sets)
    if edge_prior is None:
        return tuple(jnp.zeros(s.shape[0]) for s in parent_sets)
    pi = jnp.asarray(edge_prior, float)
    if pi.shape != (N, N):
        raise ValueError(f"edge_prior: expected shape ({N}, {N}), got {pi.shape}.")
    off = ~np.eye(N, dtype=bool)
    pi = eqx.error_if(
        pi,
        ~jnp.all((pi[off] > 0) & (pi[off] < 1)),
        "edge_prior: off-diagonal edge probabilities must be in (0, 1).",
    )
    out = []
    for n, sets in enumerate(parent_sets):
        member = (sets[:, :, None] == jnp.arange(N)).any(1)  # (sets, N)
        logp = jnp.where(member, jnp.log(pi[:, n]), jnp.log1p(-pi[:, n]))
        out.append(jnp.where(jnp.arange(N) == n, 0.0, logp).sum(-1))
    return tuple(out)


def learn_structure(
    trajectories: Trajectories,
    names: Sequence[str],
    cardinalities: Sequence[int],
    *,
    max_parents: int,
    prior: AbstractPrior = GammaPrior(),
    edge_prior=None,
    required_edges: Sequence[tuple[int, int]] = (),
    forbidden_edges: Sequence[tuple[int, int]] = (),
    method: str = "auto",
    memory_budget: int | float | str | None = None,
) -> StructurePosterior:
    """Exhaustive Bayesian structure learning from trajectories pooled across interventions:
    candidate sets, [`jaxctbn.family_statistics`][] and [`jaxctbn.StructurePosterior`][] in one
    compiled call (arguments other than arrays are static).

    Before compiling: node states in the data must be in `0..k-1` for `cardinalities`
    (`ValueError` naming the node, when the arrays are concrete; inside jit an `eqx.error_if`),
    and the memory of the request is estimated and checked against the budget
    (`memory_budget`, bytes or e.g. `"8G"`; default the environment variable
    `JAXCTBN_MEMORY_BUDGET`, else 4 GiB): above it, a one-line `ValueError` says what is large
    (e.g. a node with many states) and how to reduce it, instead of running out of memory.
    """
    names, cards = tuple(names), tuple(int(k) for k in cardinalities)
    if len(names) != len(cards):
        raise ValueError(f"names: need {len(cards)} node names, got {len(names)}.")
    budget = _memory_budget(memory_budget)
    # concrete data: a state >= k is reported now, naming the node
    _check_states_now(trajectories, cards, names)
    sets = candidate_parent_sets(
        len(cards), max_parents, required_edges=required_edges, forbidden_edges=forbidden_edges
    )
    if method in ("auto", "scatter", "matmul", "jumps") and trajectories.jump_times.ndim == 2:
        # checked here too (not only when family_statistics is traced) for the data's states
        method = _plan_family_statistics(
            "learn_structure",
            trajectories,
            cards,
            [(int(S.shape[0]), int(S.shape[-1])) for S in sets],
            method=method,
            chunk=None,
            names=names,
            budget=budget,
            largest_states=lambda: _largest_states(trajectories),
        )
    return _learn_structure(
        trajectories,
        names,
        cards,
        sets,
        prior=prior,
        edge_prior=edge_prior,
        method=method,
        memory_budget=budget,
    )


def _largest_states(trajectories: Trajectories) -> list[int] | None:
    """The largest state of each node in concrete data (for messages), else `None`."""
    if isinstance(trajectories.states, jax.core.Tracer) or isinstance(
        trajectories.initial_states, jax.core.Tracer
    ):
        return None
    N = trajectories.initial_states.shape[-1]
    seen = np.concatenate(
        [
            np.asarray(trajectories.initial_states).reshape(-1, N),
            np.asarray(trajectories.states).reshape(-1, N),
        ]
    )
    return [int(v) for v in seen.max(0)]


@eqx.filter_jit
def _learn_structure(
    trajectories: Trajectories, names, cards, sets, *, prior, edge_prior, method, memory_budget
) -> StructurePosterior:
    stats = family_statistics(
        trajectories, cards, sets, method=method, names=names, memory_budget=memory_budget
    )
    return StructurePosterior.from_statistics(stats, names, prior=prior, edge_prior=edge_prior)
