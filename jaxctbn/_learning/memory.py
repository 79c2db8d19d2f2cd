"""The memory planner of structure learning: the memory budget (`memory_budget=`,
`JAXCTBN_MEMORY_BUDGET`), the estimated size of each route to the family statistics, and the
choice of route and chunk that fits; requests that do not fit are refused before anything runs."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from .._model.layout import (
    max_configs,
)
from .._paths.sampling import Trajectories

DEFAULT_MEMORY_BUDGET = 4 * 2**30
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def memory_budget_bytes(value: int | float | str | None = None) -> int:
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


def format_bytes(n: int | float) -> str:
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        n /= 1024
        if n < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if n < 1e4 else f"{n:.2g} {unit}"
    raise AssertionError


def compiled_bytes(compiled) -> int:
    """XLA's own account of a compiled program's memory (a `jax.stages.Compiled` or an
    `eqx.filter_jit(...).lower(...).compile()`): its arguments, outputs and temporaries, less
    what they share. 0 on a backend without the analysis (nothing to bound by)."""
    compiled = getattr(compiled, "compiled", compiled)
    try:
        stats = compiled.memory_analysis()
    except NotImplementedError:
        stats = None
    if stats is None:
        return 0
    return int(
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        + stats.temp_size_in_bytes
        - stats.alias_size_in_bytes
    )


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
            streamed = min(rows + events, 2 * chunk)  # a chunk of segments, then of jumps
            size = 8.0 * sets * streamed * (width + 4)
            parts.append(
                (
                    size,
                    f"method='scatter' for {_label(n, names)}: {sets} candidate parent sets x "
                    f"{streamed} path segments and jumps per chunk",
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
        f"{what}: needs about {format_bytes(total)}, more than the memory budget of "
        f"{format_bytes(budget)}; the largest part: {part} ({format_bytes(size)}){observed}. "
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
