r"""The family statistics of panel data: expected statistics (exact or sampled) projected onto
every candidate parent set of each node, pooled over the trajectories in which the node was not
perfectly intervened on; the inputs of the structure scores."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Int

from .._learning.family_statistics import FamilyStatistics, family_statistics
from .._master_equation import AbstractExpectedStatistics
from .expected_statistics import PanelExpectedStatistics


def project_families(node_statistics, parent_sets, cards) -> FamilyStatistics:
    """[`jaxctbn.internal.FamilyStatistics`][] with node $n$'s statistics `node_statistics(n)` (an
    [`jaxctbn.AbstractExpectedStatistics`][]) projected onto each of its candidate sets
    (leading batch axes are kept)."""
    if len(parent_sets) != len(cards):
        raise ValueError(f"parent_sets: need one array per node ({len(cards)}).")
    sets = tuple(jnp.asarray(s, jnp.int32) for s in parent_sets)
    Ms, Ts = zip(
        *(node_statistics(n).node_statistics_on_sets(n, sets[n]) for n in range(len(cards)))
    )
    return FamilyStatistics(
        transitions=tuple(Ms), dwell_times=tuple(Ts), parent_sets=sets, cardinalities=tuple(cards)
    )


def expected_family_statistics(
    statistics: AbstractExpectedStatistics,
    parent_sets: Sequence[Int[Array | np.ndarray, "_sets max_parents"]],
) -> FamilyStatistics:
    r"""[`jaxctbn.internal.FamilyStatistics`][] from expected statistics: node $n$'s expected
    $\bar M_n$, $\bar T_n$ projected onto each of its candidate sets (leading batch axes of the
    statistics are kept, e.g. one per subject). For a batch of panel trajectories pooled across
    interventions use `panel_family_statistics`."""
    return project_families(lambda n: statistics, parent_sets, statistics.model.cardinalities)


def panel_family_statistics(
    statistics: PanelExpectedStatistics,
    parent_sets: Sequence[Int[Array | np.ndarray, "_sets max_parents"]],
    *,
    intervention_targets: Bool[Array, "trajectories nodes"] | None = None,
) -> FamilyStatistics:
    r"""Pooled expected family statistics of a batch of panel trajectories (one leading axis):
    node $n$'s statistics sum only the trajectories in which $n$ was not perfectly intervened on
    (`intervention_targets[r, n]`, the pooling rule of the paper's §4; default: none were), then
    project onto each candidate set of $n$."""
    if statistics.log_likelihood.ndim != 1:
        raise ValueError("statistics: expected a batch of trajectories (one leading axis).")
    R = statistics.log_likelihood.shape[0]
    cards = statistics.model.cardinalities
    if intervention_targets is None:
        intervention_targets = jnp.zeros((R, len(cards)), bool)
    if jnp.shape(intervention_targets) != (R, len(cards)):
        raise ValueError(
            f"intervention_targets: expected shape {(R, len(cards))}, got "
            f"{jnp.shape(intervention_targets)}."
        )
    return project_families(
        lambda n: statistics.sum(where=~intervention_targets[:, n]), parent_sets, cards
    )


def sampled_family_statistics(trajectories, cardinalities, parent_sets) -> FamilyStatistics:
    """The Monte Carlo estimate of the pooled expected family statistics: the family statistics
    of sampled paths `(R, samples)` (`SampledPaths.trajectories`; node $n$ pools the paths in
    which it is not clamped) summed over the trajectories and averaged over the samples.

    One sample of every trajectory at a time (a scan over the samples), so that memory holds
    $R$ paths, not $R\times$samples; by parts over the jumps (`method="jumps"`: work in jumps
    x nodes$^2$; every sampled jump moves one node) for float64 paths and in-degree <= 2."""
    S = trajectories.num_events.shape[1]
    max_k = max(jnp.shape(p)[-1] for p in parent_sets)
    by_jumps = max_k <= 2 and jnp.dtype(trajectories.jump_times.dtype) == jnp.float64
    method = "jumps" if by_jumps else "auto"
    per_sample = jax.tree_util.tree_map(lambda x: jnp.swapaxes(x, 0, 1), trajectories)

    def statistics(paths):
        return family_statistics(paths, cardinalities, parent_sets, method=method)

    def add(total, paths):  # `new + total` keeps the new statistics' parent sets
        return statistics(paths) + total, None

    shapes = jax.eval_shape(statistics, jax.tree_util.tree_map(lambda x: x[0], per_sample))
    zero = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    total, _ = jax.lax.scan(add, zero, per_sample)
    return scaled(total, 1.0 / S)


def scaled(family: FamilyStatistics, factor) -> FamilyStatistics:
    return FamilyStatistics(
        transitions=tuple(m * factor for m in family.transitions),
        dwell_times=tuple(t * factor for t in family.dwell_times),
        parent_sets=family.parent_sets,
        cardinalities=family.cardinalities,
    )
