"""The pool of the real-data experiment ([`jaxctbn.experiments.run_pool`][]): which subjects
each option holds, each option's initial state and horizon, the subjects' statistics, and
[`jaxctbn.experiments.prepare_pool`][], which makes the [`jaxctbn.experiments.PoolExperiment`][]
from panel data."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from .._learning.candidates import candidate_parent_sets
from .._learning.family_statistics import FamilyStatistics
from .._learning.priors import AbstractPrior, GammaPrior
from .._learning.structure_posterior import StructurePosterior
from .._master_equation import AbstractMasterEquationSolver
from .._model.ctbn import AbstractCTBN
from .._model.interventions import Intervention
from .._panel.buckets import PanelBuckets, as_flat_buckets, per_trajectory_on_host
from .._panel.e_step import DENSE_SOLVER
from .._panel.exact_e_step import ForwardBackward
from .._panel.inference import panel_expected_statistics
from .._panel.observations import PanelObservations
from .._panel.panel_families import expected_family_statistics
from .._panel.structural_em import PanelStructureFit
from .._panel.structure import learn_structure_from_panels


# --------------------------------------------------------------------------- the pool
def pool_membership(
    observations: PanelObservations | PanelBuckets, root: int, cardinality: int
) -> np.ndarray:
    r"""Which subjects each option may draw, as a `(1 + k, subjects)` boolean array (host-side):
    row 0 the full pool (every subject), row $1+r$ the subjects whose root is observed in state
    $r$ at every visit where it is observed, and at least once (missing visits are ignored)."""
    if len(observations.batch_shape) != 1:
        raise ValueError("observations: expected a batch of subjects (one leading axis).")

    def constant_in(times, states, counts):  # (R_b, k): root seen only in state r, and seen
        y = states[..., root]
        seen = (np.arange(y.shape[-1])[None, :] < counts[:, None]) & (y >= 0)
        return np.stack(
            [seen.any(1) & np.all(~seen | (y == r), axis=1) for r in range(cardinality)], -1
        )

    constant = per_trajectory_on_host(observations, constant_in)
    return np.concatenate([np.ones((1, constant.shape[0]), bool), constant.T])


def _first_states(first_rows: np.ndarray, subjects: np.ndarray, num_nodes: int):
    """The most common complete first observation of `subjects` (ties: the smallest); nodes
    missing in every first observation fall back to the per-node mode, then to 0.
    `first_rows`: every subject's first observation `(R, N)`."""
    first = first_rows[subjects]
    complete = first[(first >= 0).all(1)]
    if len(complete):
        rows, counts = np.unique(complete, axis=0, return_counts=True)
        return rows[int(np.argmax(counts))]
    out = np.zeros(num_nodes, np.int32)
    for n in range(num_nodes):
        seen = first[:, n][first[:, n] >= 0]
        if seen.size:
            out[n] = np.bincount(seen).argmax()
    return out


def _follow_up(spans: np.ndarray, subjects: np.ndarray) -> float:
    """The median follow-up of `subjects` with two visits or more (`spans`: every subject's
    last minus first observation time, NaN with one visit)."""
    span = spans[subjects]
    span = span[np.isfinite(span)]
    return float(np.median(span)) if span.size else 1.0


class PoolExperiment(eqx.Module):
    r"""A prepared pool: everything a repetition of the pool experiment needs, as arrays (build
    with [`jaxctbn.experiments.prepare_pool`][]).

    - `statistics`: each subject's expected [`jaxctbn.internal.FamilyStatistics`][] under the full-data
      network (a leading `subjects` axis on every array);
    - `membership`: `(options, subjects)`, which subjects each option may draw (see
      `pool_membership`);
    - `candidates`: the options' [`jaxctbn.Intervention`][]s, `(options,)`: none, then
      $\mathrm{do}(\text{root}=r)$;
    - `initial_states`, `horizons`: the state and length each option is scored from: its
      subjects' most common complete first observation and median follow-up (subjects with at
      least two visits);
    - `reference`: the MAP graph learned from all the data, `(N, N)` adjacency, against which
      the AUROC and AUPR of the edge marginals are computed;
    - `prior_posterior`: the structure posterior before any subject;
    - `observations`: each subject's panel (one row per subject, padded to the most visits),
      what the particle filter learns from;
    - `root`, `names`, `subject_ids` (static).
    """

    statistics: FamilyStatistics
    membership: Bool[Array, "options subjects"]
    candidates: Intervention
    initial_states: Int[Array, "options nodes"]
    horizons: Float[Array, " options"]
    reference: Int[Array, "nodes nodes"]
    prior_posterior: StructurePosterior
    observations: PanelObservations
    root: int = eqx.field(static=True)
    names: tuple[str, ...] = eqx.field(static=True)
    subject_ids: tuple = eqx.field(static=True)

    @property
    def num_subjects(self) -> int:
        return int(self.membership.shape[1])

    @property
    def option_labels(self) -> tuple[str, ...]:
        k = int(self.membership.shape[0]) - 1
        return ("none",) + tuple(f"{self.names[self.root]}={r}" for r in range(k))

    def subject_statistics(self, subject: Int[Array, ""], option: Int[Array, ""]):
        """The statistics that subject `subject` adds when drawn through `option`: all of them
        from the full pool; without the root's own statistics from a sub-pool (pooling rule)."""
        clamped = self.candidates.targets[option]
        keep = [1.0 - clamped[n].astype(float) for n in range(len(self.names))]
        return FamilyStatistics(
            transitions=tuple(M[subject] * w for M, w in zip(self.statistics.transitions, keep)),
            dwell_times=tuple(T[subject] * w for T, w in zip(self.statistics.dwell_times, keep)),
            parent_sets=self.statistics.parent_sets,
            cardinalities=self.statistics.cardinalities,
        )

    def subject_observations(self, subject: Int[Array, ""], option: Int[Array, ""]):
        r"""Subject `subject`'s panel as a batch of one, under `option`'s intervention (none
        from the full pool; $\mathrm{do}(\text{root}=r)$ from a sub-pool, whose subjects keep
        the root at $r$: its own transitions are then not learnt from, the pooling rule)."""
        one = jax.tree_util.tree_map(lambda x: x[subject][None], self.observations)
        return eqx.tree_at(
            lambda o: o.intervention,
            one,
            Intervention(
                targets=self.candidates.targets[option][None],
                states=self.candidates.states[option][None],
            ),
            is_leaf=lambda x: x is None,
        )


def subject_family_statistics(
    model: AbstractCTBN,
    observations: PanelObservations | PanelBuckets,
    parent_sets: Sequence[Int[Array | np.ndarray, "_sets max_parents"]],
    *,
    solver: AbstractMasterEquationSolver = DENSE_SOLVER,
) -> FamilyStatistics:
    """Each subject's expected family statistics under `model`, *not* pooled: a
    [`jaxctbn.internal.FamilyStatistics`][] with a leading subjects axis on every array (summing that
    axis gives `panel_family_statistics` of the batch without interventions)."""
    stats = panel_expected_statistics(model, observations, solver=solver)
    return expected_family_statistics(stats, parent_sets)


def prepare_pool(
    observations: PanelObservations | PanelBuckets,
    names: Sequence[str],
    cardinalities: Sequence[int],
    *,
    root: str | int,
    max_parents: int | None = None,
    prior: AbstractPrior = GammaPrior(),
    fit: PanelStructureFit | None = None,
    subject_ids: Sequence[Any] | None = None,
    tolerance: float = 1e-4,
    max_iterations: int = 20,
    solver: AbstractMasterEquationSolver = DENSE_SOLVER,
) -> tuple[PoolExperiment, PanelStructureFit]:
    r"""Learn the network from all subjects, precompute every subject's expected statistics
    under it, and build the options (host-side; the E-step is exponential in the number of
    nodes, so keep panels small, e.g. at most 5 binary nodes).

    **Arguments:**

    - `observations`: one panel trajectory per subject (a batch with one leading axis, or a
      [`jaxctbn.panel.PanelBuckets`][], e.g. from [`jaxctbn.panel.PanelBuckets.read_csv`][]),
      observational (no intervention labels).
    - `names`, `cardinalities`: the nodes.
    - `root` (keyword-only): the root node's name or index. It should have no parents in the
      network learned from all the data (a warning otherwise), and some subject must keep it
      constant.
    - `max_parents`: the in-degree limit of the learned network and of the posterior (default
      $N-1$).
    - `prior`: the rate prior of the learning and of the posterior.
    - `fit`: a [`jaxctbn.panel.PanelStructureFit`][] of these data to reuse (default: learned here by
      [`jaxctbn.panel.learn_structure_from_panels`][] with `tolerance` and `max_iterations`).
    - `subject_ids`: labels of the subjects (default `0..R-1`).
    - `solver`: the master-equation solver of the E-step.

    **Returns:** `(pool, fit)`, a [`jaxctbn.experiments.PoolExperiment`][] and the full-data fit.
    """
    names, cards = tuple(names), tuple(int(k) for k in cardinalities)
    N = len(cards)
    if len(names) != N:
        raise ValueError(f"names: need {N} node names, got {len(names)}.")
    if not (
        isinstance(observations, PanelBuckets)
        or (isinstance(observations, PanelObservations) and len(observations.batch_shape) == 1)
    ):
        raise ValueError(
            "observations: expected a batch of PanelObservations (one axis) or a PanelBuckets."
        )
    if any(
        b.intervention is not None and bool(np.any(b.intervention.targets))
        for b in as_flat_buckets(observations)
    ):
        raise ValueError(
            "observations: the pool experiment needs observational data (no intervention labels)."
        )
    if isinstance(root, str):
        if root not in names:
            raise ValueError(f"root: unknown node {root!r}; the nodes are {list(names)}.")
        root = names.index(root)
    if not 0 <= int(root) < N:
        raise ValueError(f"root: node index {root} outside 0..{N - 1}.")
    root = int(root)
    membership = pool_membership(observations, root, cards[root])
    if not membership[1:].any():
        raise ValueError(
            f"root: no subject has {names[root]!r} observed in one state at every visit; the "
            "pool has no intervention to offer (choose a root that is constant for some subjects)."
        )
    R = observations.batch_shape[0]
    max_parents = N - 1 if max_parents is None else int(max_parents)
    if fit is None:
        fit = learn_structure_from_panels(
            observations,
            names,
            cards,
            max_parents=max_parents,
            prior=prior,
            tolerance=tolerance,
            max_iterations=max_iterations,
            e_step=ForwardBackward(solver),
        )
    graph = fit.posterior.map_graph()
    if graph[root]:
        import warnings

        warnings.warn(
            f"root: {names[root]!r} has parents {[names[p] for p in graph[root]]} in the network "
            "learned from all the data; conditioning on it is then not an intervention.",
            stacklevel=2,
        )
    reference = np.zeros((N, N), np.int32)
    for n, parents in enumerate(graph):
        reference[list(parents), n] = 1
    off = reference[~np.eye(N, dtype=bool)]
    if off.all() or not off.any():
        raise ValueError(
            "data: the network learned from all the data has no edge (or every edge); the AUROC "
            "and AUPR against it are undefined."
        )
    sets = candidate_parent_sets(N, max_parents)
    statistics = subject_family_statistics(fit.model, observations, sets, solver=solver)
    options = membership.shape[0]
    targets = np.zeros((options, N), bool)
    states = np.zeros((options, N), np.int32)
    targets[1:, root] = True
    states[1:, root] = np.arange(cards[root])
    initial = np.zeros((options, N), np.int32)
    horizons = np.ones(options)
    first_rows = per_trajectory_on_host(observations, lambda t, y, m: y[:, 0, :])
    spans = per_trajectory_on_host(
        observations,
        lambda t, y, m: np.where(m >= 2, t[np.arange(len(m)), m - 1] - t[:, 0], np.nan),
    )
    for o in range(options):
        members = np.nonzero(membership[o])[0]
        if members.size:
            initial[o] = _first_states(first_rows, members, N)
            horizons[o] = _follow_up(spans, members)
    initial[1:, root] = np.arange(cards[root])
    ids = tuple(range(R)) if subject_ids is None else tuple(subject_ids)
    if len(ids) != R:
        raise ValueError(f"subject_ids: need {R} labels, got {len(ids)}.")
    pool = PoolExperiment(
        statistics=statistics,
        membership=jnp.asarray(membership),
        candidates=Intervention(targets=jnp.asarray(targets), states=jnp.asarray(states)),
        initial_states=jnp.asarray(initial),
        horizons=jnp.asarray(horizons),
        reference=jnp.asarray(reference),
        prior_posterior=StructurePosterior.from_prior(
            names, cards, max_parents=max_parents, prior=prior
        ),
        observations=observations.padded()
        if isinstance(observations, PanelBuckets)
        else observations,
        root=root,
        names=names,
        subject_ids=ids,
    )
    return pool, fit
