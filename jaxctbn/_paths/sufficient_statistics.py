"""Sufficient statistics of cCTBN paths, and the long-format CSV / DataFrame route."""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from .._errors import branched_error_if
from .._model.layout import config_index, num_configurations
from .sampling import Trajectories


class NodeStatistics(eqx.Module):
    r"""Sufficient statistics of one node under one parent set:
    `transitions` $M_n(x,x',u)$, shape `(*batch, configs, k, k)` (zero diagonal), and
    `dwell_times` $T_n(x,u)$, shape `(*batch, configs, k)`. Statistics are additive: `a + b`."""

    transitions: Float[Array, "*batch configs states states"]
    dwell_times: Float[Array, "*batch configs states"]

    def __add__(self, other: "NodeStatistics") -> "NodeStatistics":
        return NodeStatistics(
            transitions=self.transitions + other.transitions,
            dwell_times=self.dwell_times + other.dwell_times,
        )

    def sum(self, where: Bool[Array, " batch"] | None = None) -> "NodeStatistics":
        """Sum over a leading trajectory axis, optionally only where `where` is True."""
        if where is None:
            where = jnp.ones(self.dwell_times.shape[:1], bool)
        w = where.astype(self.dwell_times.dtype)
        return NodeStatistics(
            transitions=jnp.einsum("r,r...->...", w, self.transitions),
            dwell_times=jnp.einsum("r,r...->...", w, self.dwell_times),
        )


def _node_label(n: int, names: Sequence[str] | None) -> str:
    return f"node {names[n]!r}" if names is not None else f"node {n}"


def check_trajectories(
    trajectories: Trajectories,
    cardinalities: Sequence[int],
    names: Sequence[str] | None = None,
) -> Trajectories:
    r"""The same trajectories (one, or any batch), checked against `cardinalities` before
    statistics are cut from them; every statistic is computed from the returned value, so each
    check guards all of them.

    - Shapes (`ValueError` now): one state per node, `states` `(..., E, N)`, `jump_times`
      `(..., E)`, one `num_events`, `durations`, `truncated` per trajectory.
    - Node states (initial state and the states after the real jumps) in `0..k-1`: a
      `ValueError` now when the arrays are concrete (naming the node, the states found and the
      valid range), an `eqx.error_if` otherwise. A state $\ge k$ would otherwise fall outside
      every bin and its time would silently go missing from the statistics.
    - Inside jit (`eqx.error_if`): no path `truncated`; `num_events` in `0..E`; `durations`
      finite and $\ge0$; the real jump times finite, non-decreasing and in `[0, duration]`.
    """
    cards = tuple(int(k) for k in cardinalities)
    check_states_now(trajectories, cards, names)  # also checks the shapes
    return _guard_trajectories(trajectories, cards, None if names is None else tuple(names))


@eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
def _guard_trajectories(
    t: Trajectories, cards: tuple[int, ...], names: tuple[str, ...] | None
) -> Trajectories:
    """The value checks of `check_trajectories`, attached to every field of `t`."""
    preds = _problems(t, cards)
    msgs = _problem_messages(cards, names, _check_shapes(t, cards)[1])
    return branched_error_if(t, jnp.any(preds), jnp.argmax(preds), msgs)


def check_trajectories_now(
    trajectories: Trajectories,
    cardinalities: Sequence[int],
    names: Sequence[str] | None = None,
) -> None:
    """The checks of `check_trajectories` on concrete trajectories, as a one-line `ValueError`
    now, with no guarded copy of the data (for code that reads the arrays on the host)."""
    cards = tuple(int(k) for k in cardinalities)
    check_states_now(trajectories, cards, names)  # also checks the shapes
    preds = np.asarray(_problem_flags(trajectories, cards))
    if preds.any():
        E = _check_shapes(trajectories, cards)[1]
        names = None if names is None else tuple(names)
        raise ValueError(_problem_messages(cards, names, E)[int(np.argmax(preds))])


@eqx.filter_jit
def _problem_flags(t: Trajectories, cards: tuple[int, ...]) -> Array:
    return _problems(t, cards)


def _problems(t: Trajectories, cards: tuple[int, ...]) -> Array:
    """Which of `_problem_messages` hold (a boolean per message)."""
    N = len(cards)
    _, E = _check_shapes(t, cards)
    valid = jnp.arange(E) < jnp.asarray(t.num_events)[..., None]  # (..., E): real jumps
    card_arr = jnp.asarray(cards)

    def out_of_range(x):
        return (x < 0) | (x >= card_arr)

    bad_state = out_of_range(t.initial_states).reshape(-1, N).any(0) | (
        valid[..., None] & out_of_range(t.states)
    ).reshape(-1, N).any(0)
    jt = jnp.asarray(t.jump_times)
    previous = jnp.concatenate([jnp.zeros_like(jt[..., :1]), jt[..., :-1]], axis=-1)
    durations = jnp.asarray(t.durations)
    bad_time = valid & (~jnp.isfinite(jt) | (jt < previous) | (jt > durations[..., None]))
    return jnp.concatenate(
        [
            bad_state,
            jnp.stack(
                [
                    jnp.any(t.truncated),
                    jnp.any((t.num_events < 0) | (t.num_events > E)),
                    jnp.any(~jnp.isfinite(durations) | (durations < 0)),
                    jnp.any(bad_time),
                ]
            ),
        ]
    )


def _problem_messages(cards: tuple[int, ...], names: tuple[str, ...] | None, E: int) -> list[str]:
    """The messages of the trajectory checks: one per node (its states), then the paths'."""
    labels = [_node_label(n, names) for n in range(len(cards))]
    return [
        f"trajectories: states of {label} must be in 0..{k - 1} (cardinality {k}); a larger "
        "state means a wrong cardinality or a mistyped state."
        for label, k in zip(labels, cards)
    ] + [
        "trajectories: a path was truncated because max_events was too small; resample with a "
        "larger max_events (statistics of a cut path would be wrong).",
        f"trajectories: num_events must be in 0..{E} (the number of jump slots).",
        "trajectories: durations must be finite and >= 0.",
        "trajectories: the jump times of real events must be finite, non-decreasing and in "
        "[0, duration].",
    ]


def _check_shapes(t: Trajectories, cards: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """The shapes of `check_trajectories` (`ValueError`); returns the batch shape and `E`."""
    N = len(cards)
    batch = tuple(jnp.shape(t.num_events))
    E = jnp.shape(t.jump_times)[-1] if jnp.ndim(t.jump_times) > len(batch) else -1
    expected = {
        "initial_states": (t.initial_states, batch + (N,)),
        "jump_times": (t.jump_times, batch + (E,)),
        "states": (t.states, batch + (E, N)),
        "durations": (t.durations, batch),
        "truncated": (t.truncated, batch),
        "intervention_targets": (t.intervention_targets, batch + (N,)),
        "intervention_states": (t.intervention_states, batch + (N,)),
    }
    for field, (value, shape) in expected.items():
        if jnp.shape(value) != shape:
            raise ValueError(
                f"trajectories: {field} has shape {jnp.shape(value)}, expected {shape} "
                f"({N} nodes for cardinalities {cards}, one entry per trajectory)."
            )
    return batch, E


def check_states_now(
    t: Trajectories, cards: tuple[int, ...], names: Sequence[str] | None = None
) -> None:
    """The state check of `check_trajectories` as a `ValueError`, when the arrays are concrete
    (inside jit it is left to the `eqx.error_if`)."""
    _check_shapes(t, cards)
    if any(isinstance(a, jax.core.Tracer) for a in (t.initial_states, t.states, t.num_events)):
        return
    N = len(cards)
    labels = [_node_label(n, names) for n in range(N)]
    states = np.asarray(t.states).reshape(-1, *np.shape(t.states)[-2:])  # (paths, E, N)
    counts = np.asarray(t.num_events).reshape(-1)
    initial = np.asarray(t.initial_states).reshape(-1, N)
    if initial.shape[0] == 0:
        return
    lo, hi = initial.min(0), initial.max(0)
    for r in range(0, states.shape[0], 64):  # blocks of paths: no copy of the whole data
        block = states[r : r + 64]
        valid = (np.arange(block.shape[1]) < counts[r : r + 64, None])[..., None]
        if valid.any():
            lo = np.minimum(lo, np.where(valid, block, lo).min((0, 1)))
            hi = np.maximum(hi, np.where(valid, block, hi).max((0, 1)))
    for n, k in enumerate(cards):
        if lo[n] < 0 or hi[n] >= k:
            raise ValueError(
                f"trajectories: {labels[n]} has states {lo[n]}..{hi[n]}, but its cardinality is "
                f"{k} (states 0..{k - 1}); check the data for a mistyped state or give the "
                "right cardinality (states outside the range would silently drop time from "
                "the statistics)."
            )


@eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
def _statistics_of_every_node(
    trajectories: Trajectories, parents: tuple[tuple[int, ...], ...], cards: tuple[int, ...]
) -> tuple["NodeStatistics", ...]:
    """Each node's statistics of every trajectory (leading axis), for `parents`."""
    return tuple(
        jax.vmap(lambda t, n=n: _node_statistics(t, n, parents[n], cards))(trajectories)
        for n in range(len(cards))
    )


def segments(
    trajectory: Trajectories,
) -> tuple[Int[Array, "segments nodes"], Float[Array, " segments"], Bool[Array, " events"]]:
    """The piecewise-constant segments of **one** padded trajectory: the state of each segment
    `(E + 1, N)` (initial state, then the state after each jump slot), its dwell time `(E + 1,)`
    (zero for unused slots; they sum to the duration), and which jump slots hold a real event
    `(E,)`. This is the one place dwell times are cut from jump times."""
    seg_states = jnp.concatenate([trajectory.initial_states[None], trajectory.states])
    E = trajectory.jump_times.shape[0]
    idx = jnp.arange(E + 1)
    dtype = trajectory.jump_times.dtype
    starts = jnp.concatenate([jnp.zeros((1,), dtype), trajectory.jump_times])
    ends = jnp.concatenate([trajectory.jump_times, trajectory.durations[None]])
    ends = jnp.where(idx < trajectory.num_events, ends, trajectory.durations)
    dwell = jnp.where(idx <= trajectory.num_events, ends - starts, 0.0)
    return seg_states, dwell, jnp.arange(E) < trajectory.num_events


def node_statistics(
    trajectory: Trajectories,
    node: int,
    parents,
    cardinalities: tuple[int, ...],
    *,
    num_configs: int | None = None,
) -> NodeStatistics:
    r"""$M_n(x,x',u)$ and $T_n(x,u)$ of **one** trajectory for node `node` and any parent set
    (a static tuple, or an integer array padded with `-1`, then give `num_configs`).
    Use `jax.vmap` over a batch of trajectories. The trajectory is checked first (node states
    in `0..k-1`, no truncated path, valid times; see `SufficientStatistics.from_trajectories`)."""
    trajectory = check_trajectories(trajectory, cardinalities)
    return _node_statistics(trajectory, node, parents, cardinalities, num_configs=num_configs)


def _node_statistics(
    trajectory: Trajectories,
    node: int,
    parents,
    cardinalities: tuple[int, ...],
    *,
    num_configs: int | None = None,
) -> NodeStatistics:
    """`node_statistics` of an already checked trajectory."""
    k = cardinalities[node]
    if isinstance(parents, tuple | list):
        parents = tuple(int(p) for p in parents)
        if node in parents:
            raise ValueError(f"parents: node {node} cannot be its own parent.")
        configs = num_configurations(parents, cardinalities)
    else:
        if num_configs is None:
            raise ValueError("num_configs: required when parents is a padded array.")
        configs = num_configs
    seg_states, dwell, valid_event = segments(trajectory)
    c = config_index(seg_states, parents, cardinalities)
    x = seg_states[:, node]
    dwell_times = jax.ops.segment_sum(dwell, c * k + x, num_segments=configs * k)
    src, dst = seg_states[:-1], seg_states[1:]
    moved = valid_event & (src[:, node] != dst[:, node])
    bins = (c[:-1] * k + src[:, node]) * k + dst[:, node]
    transitions = jax.ops.segment_sum(moved.astype(dwell.dtype), bins, num_segments=configs * k * k)
    return NodeStatistics(
        transitions=transitions.reshape(configs, k, k), dwell_times=dwell_times.reshape(configs, k)
    )


class SufficientStatistics(eqx.Module):
    """Per-trajectory statistics of every node under fixed parent sets, together with the perfect
    intervention each trajectory was recorded under (for pooling across interventions).

    - `nodes[n]`: [`jaxctbn.internal.NodeStatistics`][] with a leading trajectory axis.
    - `intervention_targets`, `intervention_states`: `(trajectories, N)`.
    """

    nodes: tuple[NodeStatistics, ...]
    intervention_targets: Bool[Array, "trajectories nodes"]
    intervention_states: Int[Array, "trajectories nodes"]
    parents: tuple[tuple[int, ...], ...] = eqx.field(static=True)
    cardinalities: tuple[int, ...] = eqx.field(static=True)

    @classmethod
    def from_trajectories(
        cls,
        trajectories: Trajectories,
        cardinalities: tuple[int, ...],
        parents: Sequence[Sequence[int]],
    ) -> "SufficientStatistics":
        r"""Statistics of a batch of trajectories (one leading axis) for the given parent sets.

        The trajectories are checked first: node states in `0..k-1` for the given
        `cardinalities` (a `ValueError` naming the node when the arrays are concrete, an
        `eqx.error_if` inside jit: a state $\ge k$ would fall outside every bin and its time
        would silently go missing), no truncated path, `num_events` in `0..E`, durations finite
        and $\ge0$, jump times finite, non-decreasing and in `[0, duration]`. Every field of
        the result is computed from the checked trajectories."""
        cardinalities = tuple(int(k) for k in cardinalities)
        parents = tuple(tuple(int(p) for p in ps) for ps in parents)
        if len(parents) != len(cardinalities):
            raise ValueError(f"parents: need one parent list per node ({len(cardinalities)}).")
        if trajectories.num_events.ndim != 1:
            raise ValueError("trajectories: expected one leading batch axis of trajectories.")
        trajectories = check_trajectories(trajectories, cardinalities)
        return cls(
            nodes=_statistics_of_every_node(trajectories, parents, cardinalities),
            intervention_targets=trajectories.intervention_targets,
            intervention_states=trajectories.intervention_states,
            parents=parents,
            cardinalities=cardinalities,
        )

    def pooled(self) -> tuple[NodeStatistics, ...]:
        """Per node, the sum over trajectories in which that node was **not** perfectly
        intervened on (the pooling rule of the paper's §4)."""
        return tuple(
            stats.sum(~self.intervention_targets[:, n]) for n, stats in enumerate(self.nodes)
        )

    def total(self) -> tuple[NodeStatistics, ...]:
        """Per node, the plain sum over all trajectories."""
        return tuple(stats.sum() for stats in self.nodes)

    def concatenate(self, other: "SufficientStatistics") -> "SufficientStatistics":
        """Statistics of both sets of trajectories (keeps the per-trajectory interventions)."""
        if other.parents != self.parents or other.cardinalities != self.cardinalities:
            raise ValueError("concatenate: statistics were computed for different graphs.")
        return jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b]), self, other)
