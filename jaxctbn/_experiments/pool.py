r"""The paper's real-data experiment (§6, "British Household Data-set"; appendix C.2–C.3): active
structure learning by drawing **subjects from a pool** of recorded panel trajectories, where the
only possible "interventions" are on a **root node** that some subjects kept constant.

**The setting.** Real panel data cannot be intervened on after the fact. The paper picks a node
with no parents in the network learned from all the data (a *root*), and reads a subject whose
observed root state is $r$ at every visit as an experiment under $\mathrm{do}(\text{root}=r)$:
conditioning on a root is the same as intervening on it. The options of each experiment are then

- option 0, the **full pool** (no intervention): any remaining subject;
- option $1+r$, the **sub-pool** $\mathrm{do}(\text{root}=r)$: the remaining subjects whose root
  is observed in state $r$ at every visit where it is observed (visits with the root missing
  do not exclude a subject, but at least one visit must observe it).

A design picks an option, a subject is drawn uniformly from it **without replacement**, and the
subject's statistics update the structure posterior. The designs are those of the synthetic
experiments ([`jaxctbn.AbstractDesign.choose_option`][]): [`jaxctbn.PassiveDesign`][] (always
the full pool), [`jaxctbn.RandomDesign`][] (an option with subjects left, uniformly) and
[`jaxctbn.CriterionDesign`][] (the best or, for the paper's "negative VBHC" control, the worst
option by a design criterion under the current posterior; the criteria assume each subject's
whole path is seen, as the paper's, and score a particle filter's mixture through its
moment-matched posterior).

**How a subject is learnt from** (the default, `panel_posterior=`
[`jaxctbn.panel.StructureParticleFilter`][]`()`; `run pool`): the posterior learns from the
drawn subject's panel itself. The structure particle filter draws the subject's hidden path
given each particle's graph and rates and weights the particle by the subject's exact panel
likelihood, so the posterior after the drawn subjects is exact in the limit of its particles
and uses nothing but those subjects. A subject drawn from a sub-pool is an interventional
experiment (the root clamped at $r$), so by the pooling rule (§4) the root's own transitions
are not learnt from it. On real panels with long gaps (years between visits) a path draw can
need more uniformisation times than the filter's `max_candidates`:
[`jaxctbn.experiments.run_pool_experiment`][] (`run pool`) then redoes the chunk with the bound
doubled.

**The paper's approximation** (`panel_posterior=None`; `run pool --panel-posterior moment`):
a subject's panel gives no counts, so the posterior is updated with the subject's **expected
family statistics** $\mathsf E_m[M_n\mid Y]$, $\mathsf E_m[T_n\mid Y]$ under one fixed network
$m$ learned from **all** the data ([`jaxctbn.panel.learn_structure_from_panels`][]),
precomputed once per subject ([`jaxctbn.panel.panel_expected_statistics`][]). The statistics
therefore already carry information from the whole data set through $m$, and imputed counts
are treated as observed (overconfident where the visits are sparse); the experiment then
measures how fast the *choice of subjects* recovers $m$'s graph, not an independent
re-learning. The root's statistics of a subject drawn from a sub-pool are left out likewise.
Much faster: no path draws.

**Scoring.** [`jaxctbn.CriterionDesign`][] scores each option's intervention (none, or
$\mathrm{do}(\text{root}=r)$) with [`jaxctbn.score_interventions`][] from the option's own
initial state and horizon ([`jaxctbn.experiments.PoolExperiment`][]: the most common complete first
observation of its subjects, and the median follow-up of its subjects with at least two visits),
with common posterior draws for all options.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, Bool, Float, Int, Key, PRNGKeyArray

from .._active_learning.designs import AbstractDesign, CriterionDesign, PassiveDesign, RandomDesign
from .._active_learning.metrics import edge_aupr, edge_auroc
from .._criteria.criteria import VBHC, AbstractCriterion
from .._learning.candidates import candidate_parent_sets
from .._learning.family_statistics import FamilyStatistics
from .._learning.priors import AbstractPrior, GammaPrior
from .._learning.structure_mixture import StructureMixturePosterior
from .._learning.structure_posterior import StructurePosterior
from .._master_equation.solvers import AbstractMasterEquationSolver
from .._model.ctbn import AbstractCTBN
from .._model.interventions import Intervention
from .._panel.buckets import PanelBuckets, as_flat_buckets, per_trajectory_on_host
from .._panel.inference import panel_expected_statistics
from .._panel.observations import PanelObservations
from .._panel.path_statistics import with_candidate_growth
from .._panel.structure import (
    DENSE_SOLVER,
    PanelStructureFit,
    expected_family_statistics,
    learn_structure_from_panels,
)
from .._panel.structure_posterior import StructureParticleFilter, panel_structure_posterior
from .config import METRICS

#: Design names understood by [`jaxctbn.experiments.pool_design_from_name`][] and `jaxctbn run pool`.
POOL_DESIGN_NAMES = ("passive", "random", "vbhc", "negative-vbhc")
#: The metrics recorded after every experiment: name -> (label, better is "higher"/"lower").
POOL_METRICS = METRICS["pool"]


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
      [`jaxctbn.experiments.pool_membership`][]);
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
    axis gives [`jaxctbn.panel.panel_family_statistics`][] of the batch without interventions)."""
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
      [`jaxctbn.panel.PanelBuckets`][], e.g. from [`jaxctbn.panel.read_panel_csv`][]),
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
            solver=solver,
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


# --------------------------------------------------------------------------- designs
def pool_scores(
    posterior: StructurePosterior,
    pool: PoolExperiment,
    *,
    key: PRNGKeyArray,
    criterion: AbstractCriterion = VBHC(),
    num_samples: int = 40,
) -> Float[Array, " options"]:
    """The criterion's score of every option's intervention, each from the option's own initial
    state and horizon, with the same posterior draws for all (`key` shared):
    [`jaxctbn.AbstractDesign.option_scores`][] of [`jaxctbn.CriterionDesign`][]."""
    design = CriterionDesign(criterion, num_samples=num_samples, assume_complete_path=True)
    return design.option_scores(posterior, pool.candidates, pool.initial_states, pool.horizons, key)


def pool_design_from_name(name: str, *, num_samples: int = 40) -> AbstractDesign:
    """`"passive"`, `"random"`, `"vbhc"` or `"negative-vbhc"` as a design of the pool
    experiment (`num_samples` posterior draws for the VBHC)."""
    if name == "passive":
        return PassiveDesign()
    if name == "random":
        return RandomDesign()
    if name in ("vbhc", "negative-vbhc"):
        # the paper's: each option scored as if the subject's whole path were seen (a particle
        # filter's mixture through its moment-matched posterior)
        return CriterionDesign(
            VBHC(),
            num_samples=num_samples,
            worst=name == "negative-vbhc",
            assume_complete_path=True,
        )
    raise ValueError(
        f"design: unknown pool design {name!r}; valid: {', '.join(POOL_DESIGN_NAMES)}."
    )


# --------------------------------------------------------------------------- one repetition
class PoolResult(eqx.Module):
    """One repetition (or a batch, with leading axes): `entropy`, `auroc`, `aupr` per experiment
    `(K + 1,)` (entry 0 before any subject), the chosen `option` and `subject` indices `(K,)`,
    and the final posterior's `statistics` (the particle filter's: the weighted mean of its
    particles', [`jaxctbn.StructureMixturePosterior.moment_matched`][])."""

    entropy: Float[Array, "*batch experiments_plus_one"]
    auroc: Float[Array, "*batch experiments_plus_one"]
    aupr: Float[Array, "*batch experiments_plus_one"]
    option: Int[Array, "*batch experiments"]
    subject: Int[Array, "*batch experiments"]
    statistics: FamilyStatistics


def _metrics(posterior: StructurePosterior | StructureMixturePosterior, reference):
    edges = posterior.edge_marginals()
    return jnp.stack(
        [posterior.entropy(), edge_auroc(edges, reference), edge_aupr(edges, reference)]
    )


#: How a drawn subject updates the posterior by default: its own panel, by the structure
#: particle filter (exact as its particles grow).
DEFAULT_POOL_FILTER = StructureParticleFilter()

#: The key stream of the particle filter's update within a step.
_UPDATE_STREAM = 0x7570


def _check_pool_family(panel_posterior) -> None:
    if panel_posterior is not None and not isinstance(panel_posterior, StructureParticleFilter):
        raise ValueError(
            "panel_posterior: expected StructureParticleFilter(...) (the default) or None (the "
            f"paper's expected statistics), got {panel_posterior!r}."
        )


def run_pool(
    pool: PoolExperiment,
    design: AbstractDesign,
    key: PRNGKeyArray,
    *,
    num_experiments: int,
    panel_posterior: StructureParticleFilter | None = DEFAULT_POOL_FILTER,
) -> PoolResult:
    r"""One repetition of the pool experiment: `num_experiments` times, the design picks an
    option, a subject is drawn uniformly from the option's remaining subjects (without
    replacement) and the posterior learns from it (see the module docstring). Jittable and
    vmappable over `key` ([`jaxctbn.experiments.run_pool_repetitions`][] does both); the same
    key gives the same result.

    `panel_posterior` (keyword-only): how a drawn subject updates the structure posterior. By
    default a [`jaxctbn.panel.StructureParticleFilter`][]`()` learns from the subject's panel
    itself (exact in the limit of its particles; the posterior is then a
    [`jaxctbn.StructureMixturePosterior`][], and the designs, which assume complete paths,
    score its moment-matched posterior). `None`: the subject's expected statistics under the
    network learned from all the data are added (the paper's approximation: the posterior then
    borrows that network's information and is overconfident where the visits are sparse).
    Under `jit` a path that needs more uniformisation times than the filter's
    `max_candidates` raises an error naming it
    ([`jaxctbn.experiments.run_pool_experiment`][] grows it instead)."""
    if not 1 <= num_experiments <= pool.num_subjects:
        raise ValueError(
            f"num_experiments: must be in 1..{pool.num_subjects} (subjects are drawn without "
            f"replacement), got {num_experiments}."
        )
    _check_pool_family(panel_posterior)
    start = pool.prior_posterior
    if panel_posterior is not None:
        start = panel_posterior.initial(start)

    def update(posterior, subject, option, k):
        if panel_posterior is None:
            return posterior.update(pool.subject_statistics(subject, option))
        return panel_structure_posterior(
            posterior,
            pool.subject_observations(subject, option),
            family=panel_posterior,
            key=jr.fold_in(k, _UPDATE_STREAM),
        )

    def step(carry, k):
        posterior, available = carry
        k_option, k_subject = jr.split(k)
        open_ = jnp.any(pool.membership & available[None, :], axis=1)
        option = design.choose_option(
            posterior, pool.candidates, pool.initial_states, pool.horizons, open_, k_option
        )
        weights = pool.membership[option] & available
        subject = jr.categorical(k_subject, jnp.where(weights, 0.0, -jnp.inf)).astype(jnp.int32)
        posterior = update(posterior, subject, option, k)
        available = available.at[subject].set(False)
        return (posterior, available), (option, subject, _metrics(posterior, pool.reference))

    available = jnp.ones(pool.num_subjects, bool)
    keys = jr.split(key, num_experiments)
    (posterior, _), (option, subject, metrics) = jax.lax.scan(step, (start, available), keys)
    metrics = jnp.concatenate([_metrics(start, pool.reference)[None], metrics])
    if isinstance(posterior, StructureMixturePosterior):
        posterior = posterior.moment_matched()
    return PoolResult(
        entropy=metrics[:, 0],
        auroc=metrics[:, 1],
        aupr=metrics[:, 2],
        option=option,
        subject=subject,
        statistics=posterior.statistics,
    )


@eqx.filter_jit
def run_pool_repetitions(
    pool: PoolExperiment,
    design: AbstractDesign,
    keys: Key[Array, " repetitions"],
    *,
    num_experiments: int,
    panel_posterior: StructureParticleFilter | None = DEFAULT_POOL_FILTER,
) -> PoolResult:
    """[`jaxctbn.experiments.run_pool`][] vmapped over a batch of keys, as one compiled program."""
    return jax.vmap(
        lambda k: run_pool(
            pool, design, k, num_experiments=num_experiments, panel_posterior=panel_posterior
        )
    )(keys)


# --------------------------------------------------------------------------- the experiment
def data_digest(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def run_pool_experiment(
    pool: PoolExperiment,
    fit: PanelStructureFit,
    *,
    designs: Sequence[str] = POOL_DESIGN_NAMES,
    repetitions: int = 100,
    experiments: int = 20,
    samples: int = 40,
    seed: int = 0,
    chunk: int = 10,
    data: str = "",
    out: str | None = None,
    progress: bool = True,
    overwrite: bool = False,
    panel_posterior: StructureParticleFilter | None = DEFAULT_POOL_FILTER,
) -> dict:
    """Run every design for `repetitions` repetitions of `experiments` subjects (each
    repetition learning by `panel_posterior`, see [`jaxctbn.experiments.run_pool`][]; when a
    chunk's paths need more uniformisation times than the filter's `max_candidates`, the chunk
    is redone with it doubled, up to 1,024, and the chunks after it keep the grown bound, which
    each chunk records) and return
    `{"settings", "results", "summary", "timing"}` like [`jaxctbn.experiments.run_experiment`][] (metrics
    `entropy`, `auroc`, `aupr`, each `(repetitions, experiments + 1)`; also
    `intervention_index` (the option), `subjects`). Repetition $r$ uses
    `fold_in(key(seed), r)` for every design. With `out`, the output directory of
    `jaxctbn run structure` (config.json, truth.json = the full-data network, resumable chunks,
    metrics.csv with a `subject` column, results.json, summary.md, figure.png,
    interventions.png)."""
    from .._files import json_bytes, write_atomically
    from .outputs import _load_chunk, _prepare_out, _save_chunk, _write_outputs
    from .report import summarise

    designs = list(designs)
    unknown = [d for d in designs if d not in POOL_DESIGN_NAMES]
    if unknown or not designs:
        raise ValueError(
            f"designs: unknown pool design(s) {unknown or designs}; valid: "
            + ",".join(POOL_DESIGN_NAMES)
        )
    if not 1 <= experiments <= pool.num_subjects:
        raise ValueError(
            f"experiments: must be in 1..{pool.num_subjects} (the number of subjects), got "
            f"{experiments}."
        )
    _check_pool_family(panel_posterior)
    names = list(pool.names)
    model = fit.posterior.map_model()
    settings = {
        "target": "pool",
        "posterior": {"method": "expected-statistics", "network": "full-data"}
        if panel_posterior is None
        else {
            "method": "particle-filter",
            "particles": panel_posterior.num_particles,
            "max_candidates": panel_posterior.max_candidates,
        },
        "designs": designs,
        "repetitions": repetitions,
        "experiments": experiments,
        "samples": samples,
        "horizon": "per option: median follow-up of its subjects "
        + ", ".join(
            f"{lab} {float(h):.3g}" for lab, h in zip(pool.option_labels, np.asarray(pool.horizons))
        ),
        "seed": seed,
        "data": data,
        "root": names[pool.root],
        "subjects": pool.num_subjects,
        "options": {
            lab: int(np.asarray(pool.membership[o]).sum())
            for o, lab in enumerate(pool.option_labels)
        },
        "option_initial_states": {
            lab: np.asarray(pool.initial_states[o]).tolist()
            for o, lab in enumerate(pool.option_labels)
        },
        "max_parents": int(pool.statistics.parent_sets[0].shape[-1]),
        **pool.prior_posterior.prior.settings(),  # pyright: ignore[reportAttributeAccessIssue]
        "initial_state_policy": "scored from each option's most common complete first observation",
        "full_data_graph": {names[n]: [names[p] for p in ps] for n, ps in enumerate(model.parents)},
        "full_data_iterations": fit.iterations,
        "full_data_converged": fit.converged,
        "full_data_log_likelihood": (
            None if fit.log_likelihood is None else float(fit.log_likelihood)
        ),
    }
    chunk_dir = None
    if out is not None:
        chunk_dir = _prepare_out(out, settings, overwrite)
        blob = json_bytes(settings, indent=1)
        write_atomically(os.path.join(out, "config.json"), lambda f: f.write(blob))
        net = json_bytes(model.to_dict(), indent=1)
        write_atomically(os.path.join(out, "truth.json"), lambda f: f.write(net))
    base = jr.key(seed)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(designs) * repetitions, desc="run pool", unit="rep")
    N, K = len(names), experiments
    results, timing = {}, {}
    # the filter's bound on one bridge's uniformisation times, doubled when a chunk's paths
    # need more and kept for the chunks after it (each chunk file records the bound it ran with)
    bound = 0 if panel_posterior is None else panel_posterior.max_candidates
    for design_name in designs:
        design = pool_design_from_name(design_name, num_samples=samples)
        parts, seconds, chunk_seconds = [], 0.0, []
        for start in range(0, repetitions, chunk):
            stop = min(start + chunk, repetitions)
            path = None
            if chunk_dir is not None:
                path = os.path.join(chunk_dir, design_name, f"{start}-{stop - 1}.npz")
                loaded = _load_chunk(path, "pool", stop - start, K, N)
                if loaded is not None:
                    bound = max(bound, int(loaded["max_candidates"].max()))
                    parts.append(loaded)
                    if bar is not None:
                        bar.update(stop - start)
                    continue
            keys = jax.vmap(lambda r: jr.fold_in(base, r))(jnp.arange(start, stop))
            t0 = time.perf_counter()

            def run_chunk(family, design=design, keys=keys):
                return jax.device_get(
                    run_pool_repetitions(
                        pool, design, keys, num_experiments=K, panel_posterior=family
                    )
                )

            if panel_posterior is None:
                res = run_chunk(None)
            else:  # from the largest bound of the chunks before it: the same when resumed
                family = dataclasses.replace(panel_posterior, max_candidates=bound)
                res, used = with_candidate_growth(run_chunk, family)
                bound = used.max_candidates
            chunk_seconds.append(time.perf_counter() - t0)
            seconds += chunk_seconds[-1]
            option = np.asarray(res.option)
            part = {
                "metric_entropy": np.asarray(res.entropy),
                "metric_auroc": np.asarray(res.auroc),
                "metric_aupr": np.asarray(res.aupr),
                "intervention_index": option,
                "targets": np.asarray(pool.candidates.targets)[option],
                "states": np.asarray(pool.candidates.states)[option],
                "initial_states": np.asarray(pool.initial_states)[option],
                "subjects": np.asarray(res.subject),
                "max_candidates": np.full(stop - start, bound),
                "errors": np.full(stop - start, "", dtype="U1"),
            }
            if path is not None:
                _save_chunk(path, part)
            parts.append(part)
            if bar is not None:
                bar.update(stop - start)
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0] if k != "errors"}
        results[design_name] = {
            **{k[len("metric_") :]: v for k, v in merged.items() if k.startswith("metric_")},
            **{k: v for k, v in merged.items() if not k.startswith("metric_")},
        }
        timing[design_name] = {"seconds_incl_compile": seconds, "chunk_seconds": chunk_seconds}
    if bar is not None:
        bar.close()
    report = {
        "settings": settings,
        "results": results,
        "summary": summarise("pool", results),
        "timing": timing,
        "failed_repetitions": {},
    }
    if out is not None:
        ids = np.asarray(pool.subject_ids, dtype=object)
        subjects = {d: ids[np.asarray(res["subjects"])] for d, res in results.items()}
        _write_outputs("pool", report, model, out, extra_columns={"subject": subjects})
    return report
