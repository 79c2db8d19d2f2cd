"""Sufficient statistics of cCTBN paths, and the long-format CSV / DataFrame route."""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from ._layout import config_index, num_configurations
from ._sampling import Trajectories


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


def _check_complete(trajectories: Trajectories) -> Trajectories:
    return eqx.error_if(
        trajectories,
        jnp.any(trajectories.truncated),
        "trajectories: a path was truncated because max_events was too small; resample with a "
        "larger max_events (statistics of a cut path would be wrong).",
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
    Use `jax.vmap` over a batch of trajectories."""
    trajectory = _check_complete(trajectory)
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

    - `nodes[n]`: [`jaxctbn.NodeStatistics`][] with a leading trajectory axis.
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
        """Statistics of a batch of trajectories (one leading axis) for the given parent sets."""
        parents = tuple(tuple(int(p) for p in ps) for ps in parents)
        if len(parents) != len(cardinalities):
            raise ValueError(f"parents: need one parent list per node ({len(cardinalities)}).")
        if trajectories.num_events.ndim != 1:
            raise ValueError("trajectories: expected one leading batch axis of trajectories.")
        nodes = tuple(
            jax.vmap(lambda t, n=n: node_statistics(t, n, parents[n], cardinalities))(trajectories)
            for n in range(len(cardinalities))
        )
        return cls(
            nodes=nodes,
            intervention_targets=trajectories.intervention_targets,
            intervention_states=trajectories.intervention_states,
            parents=parents,
            cardinalities=tuple(cardinalities),
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
