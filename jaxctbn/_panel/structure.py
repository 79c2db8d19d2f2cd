r"""Structure learning from panel data: expected statistics in the marginal likelihood, iterated
to a fixed point (structural EM).

With complete paths the local score of a parent set $P$ of node $n$ is the Gamma-Poisson
marginal likelihood $\ln p(X_n\mid X_P)$ of the counts $M_n(x,x',u)$ and dwell times
$T_n(x,u)$. Panel data give no counts; the paper (appendix C.2) replaces them by their
**expectations under a model** $m$, $\bar M_n=\mathsf E_m[M_n\mid Y]$ and
$\bar T_n=\mathsf E_m[T_n\mid Y]$ (the smoothed statistics of
[`jaxctbn.panel.panel_expected_statistics`][], projected onto every candidate set):

$$\operatorname{score}_m(P)=\ln\int p(\Lambda)\prod_{u,x\ne x'}\Lambda^{\bar M}e^{-\Lambda\bar T}
\,d\Lambda .$$

**The approximation.** This is the marginal likelihood of *expected* statistics, not the
expected (let alone the exact) marginal likelihood $\ln p(Y\mid P)$, which has no closed form
for panel data: the expected counts are fractional, and they depend on the model $m$ that
imputed the hidden paths. Scoring once under a fixed $m$ is the paper's approach
(`max_iterations=1` with `start=m`). **Structural EM** (Friedman 1997, for Bayesian networks;
Nodelman et al. 2005 for CTBNs) iterates: E-step under $m_i$, score every candidate set,
$m_{i+1}$ = the MAP graph with posterior-mean rates, until the graph no longer changes and the
log-likelihood of the data under $m_i$ has converged. Each step's M-step is a conjugate update,
so the rates of a fixed graph follow parameter EM (MAP under the prior); the graph step
maximises the approximate score.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .._learning.family_statistics import FamilyStatistics
from .._learning.knowledge import NO_KNOWLEDGE, PriorKnowledge, check_knowledge
from .._learning.priors import AbstractPrior, GammaPrior
from .._learning.scores import candidate_sets_within_budget
from .._learning.structure_posterior import StructurePosterior
from .._master_equation import (
    MatrixExponential,
)
from .._model.ctbn import CTBN, AbstractCTBN, PaddedCTBN
from .buckets import PanelBuckets, as_flat_buckets
from .checks import check_possible
from .e_step import EXACT_E_STEP, AbstractPanelEStep, ForwardBackward
from .expected_statistics import PanelExpectedStatistics
from .gap_groups import gap_groups, pooled_by_gaps
from .gibbs import GibbsSampler, SampledPaths, sample_unguarded
from .gibbs_kernel import sampler_bounds
from .importance import PanelImportanceSampler, WeightedPaths, weighted_unguarded
from .inference import panel_expected_statistics
from .mean_field import PanelMeanField, PanelMeanFieldStatistics, as_data, children_bound
from .mean_field import _as_start as _mean_field_start
from .mean_field import _statistics as _mean_field_statistics
from .observations import Emissions, PanelObservations
from .panel_families import (
    expected_family_statistics,
    panel_family_statistics,
    project_families,
    sampled_family_statistics,
    scaled,
)

# panel gaps are long relative to the rates: the dense exponential has no limit on a gap's length
DENSE_SOLVER = MatrixExponential()


class PanelStructureFit(eqx.Module):
    r"""The result of [`jaxctbn.panel.learn_structure_from_panels`][].

    - `posterior`: the [`jaxctbn.StructurePosterior`][] scored with the expected statistics of
      the last E-step (what the design criteria and the active-learning loop use).
    - `model`: the network of the last E-step ($m_i$).
    - `log_likelihood`: $\sum_r\ln p(Y_r\mid m_i)$, conditional on each trajectory's first
      observation; `None` with a sampled or mean-field E-step (not computed: exact
      forward-backward is what they avoid).
    - `evidence_lower_bound`: with a mean-field E-step, its bound $\mathcal F\le\sum_r\ln
      p(Y_r\mid m_i)$ (`panel_mean_field_statistics`); else `None`.
    - `trace`: the log-likelihood (mean-field: the bound) after each iteration,
      `(iterations,)` (empty with a sampled E-step).
    - `iterations`, `converged`: the number of E-steps, and whether the graph was unchanged and
      the log-likelihood had converged (sampled: the rule under the sampling `e_step` below)
      before `max_iterations`.
    - `effective_sample_size`: with a sampled E-step, per node, the smallest effective sample
      size over the trajectories of the jump count's chain in the last E-step (`None` with exact
      inference); `median_effective_sample_size`: the median over the trajectories;
      `split_r_hat`: the largest split-$\hat R$ over the trajectories
      (`SampledPaths.split_r_hat`; `None` with fewer than 4 samples);
      `infeasible_updates`: Gibbs updates that kept their path, over all E-steps;
      `sampler`: the sampler of the last E-step (its buffers as grown). With importance
      sampling: the effective sample sizes are the weights'
      (`WeightedPaths.effective_sample_size`, the same for every node),
      `split_r_hat` and `infeasible_updates` are `None`, and `log_likelihood_estimate` is the
      last E-step's $\sum_r\ln\frac1S\sum_s w_{rs}$, an estimate of $\sum_r\ln p(Y_r\mid
      m_i)$ (biased low by about half the relative variance of the weights; `None`
      otherwise).
    """

    posterior: StructurePosterior
    model: AbstractCTBN
    log_likelihood: Float[Array, ""] | None
    trace: Float[Array, " iterations"]
    iterations: int = eqx.field(static=True)
    converged: bool = eqx.field(static=True)
    effective_sample_size: Float[Array, " nodes"] | None = None
    infeasible_updates: int | None = None
    sampler: GibbsSampler | PanelImportanceSampler | None = None
    log_likelihood_estimate: Float[Array, ""] | None = None
    median_effective_sample_size: Float[Array, " nodes"] | None = None
    split_r_hat: Float[Array, " nodes"] | None = None
    evidence_lower_bound: Float[Array, ""] | None = None


def _independent_start(observations: PanelObservations | PanelBuckets, names, cards) -> CTBN:
    """The empty graph with one rate per node: (observed changes of the node between
    consecutive observations + 1) / (observed time x (k - 1)), spread evenly over the target
    states (a crude, strictly positive start)."""
    total, changes = 0.0, np.zeros(len(cards))
    for bucket in as_flat_buckets(observations):
        t = np.asarray(bucket.times)
        y = np.asarray(bucket.states)
        m = np.asarray(bucket.num_observations)
        valid = np.arange(t.shape[-1])[None, :] < m[:, None]
        pair = valid[:, 1:] & valid[:, :-1]
        total += float(np.sum(np.where(pair, np.diff(t, axis=-1), 0.0)))
        a, b = y[:, :-1], y[:, 1:]
        changes += np.sum(pair[..., None] & (a >= 0) & (b >= 0) & (a != b), axis=(0, 1))
    total = max(total, 1e-12)
    cims = []
    for n, k in enumerate(cards):
        rate = (changes[n] + 1.0) / (total * (k - 1))
        cim = np.full((1, k, k), rate)
        cim[0][np.diag_indices(k)] = -rate * (k - 1)
        cims.append(cim)
    return CTBN(cims=cims, parents=tuple(() for _ in cards), names=tuple(names))


@eqx.filter_jit
def _e_step(model, observations, emissions, solver, parent_sets, targets, groups):
    if groups is not None:  # no interventions: pooled directly, exponentials shared by gap
        bad, pooled = pooled_by_gaps(model, observations, emissions, None, groups, "statistics")
        pooled = cast(PanelExpectedStatistics, check_possible(pooled, bad, observations))
        return expected_family_statistics(pooled, parent_sets), pooled.log_likelihood
    stats = panel_expected_statistics(model, observations, emissions=emissions, solver=solver)
    family = panel_family_statistics(stats, parent_sets, intervention_targets=targets)
    return family, stats.log_likelihood.sum()


@eqx.filter_jit
def _sampled_e_step(model, bucket, sampler, parent_sets, key, bounds):
    """The Monte Carlo E-step of one bucket: the family statistics of the sampled paths (pooled
    by their interventions), averaged over the samples; the chains' diagnostics (effective
    sample sizes and split-R-hat, per trajectory and node) and the number of infeasible
    updates."""
    paths: SampledPaths
    paths, overflow = sample_unguarded(model, bucket, key, sampler, bounds)
    family = sampled_family_statistics(paths.trajectories, model.cardinalities, parent_sets)
    r_hat = paths.split_r_hat() if sampler.num_samples >= 4 else None
    diagnostics = (paths.effective_sample_size(), r_hat)
    return family, diagnostics, paths.infeasible_updates.sum(), overflow


@eqx.filter_jit
def _importance_e_step(model, bucket, sampler, parent_sets, key, start, max_children):
    """The importance-sampling E-step of one bucket: the family statistics of the weighted
    paths resampled to equal weights (systematic resampling), averaged over the samples; the
    weights' effective sample size per trajectory, the summed likelihood estimate, which
    buffers overflowed, and the proposal's fit `(dwell, transitions, given)` (the next E-step
    starts its mean-field sweeps there; `start`: the same from the previous E-step)."""
    key_draw, key_resample = jax.random.split(key)
    paths: WeightedPaths
    paths, overflow, fitted = weighted_unguarded(
        model, bucket, key_draw, sampler, start, max_children
    )
    resampled = paths.resampled(key_resample)
    family = sampled_family_statistics(resampled, model.cardinalities, parent_sets)
    diagnostics = (paths.effective_sample_size(), paths.log_likelihood().sum())
    return family, diagnostics, overflow, (*fitted, jnp.asarray(True))


@eqx.filter_jit
def _mean_field_e_step(model, bucket, approximation, parent_sets, initial, max_children):
    """The mean-field E-step of one bucket: the pooled family statistics (node $n$ pools the
    trajectories in which it is not clamped), the summed bound, the most sweeps taken, and the
    fitted `(dwell, transitions)` (the next E-step starts from them; `initial`: `None` or the
    previous E-step's, `(dwell, transitions, given)`)."""
    stats: PanelMeanFieldStatistics = _mean_field_statistics(
        model, bucket, approximation, initial, max_children
    )
    R, N = bucket.times.shape[0], model.num_nodes
    if bucket.intervention is None:
        targets = jnp.zeros((R, N), bool)
    else:
        targets = jnp.broadcast_to(bucket.intervention.targets, (R, N))
    family = project_families(
        lambda n: stats.sum(where=~targets[:, n]), parent_sets, model.cardinalities
    )
    fitted = (stats.dwell_times, stats.transitions)
    return family, stats.evidence_lower_bound.sum(), stats.sweeps.max(), fitted


@eqx.filter_jit
def _m_step(family, names, prior, edge_prior):
    posterior = StructurePosterior.from_statistics(
        family, names, prior=prior, edge_prior=edge_prior
    )
    indices = posterior.map_indices()
    return posterior, indices, posterior.mean_rates_given(indices)


def learn_structure_from_panels(
    observations: PanelObservations | PanelBuckets,
    names: Sequence[str],
    cardinalities: Sequence[int],
    *,
    max_parents: int | Sequence[int],
    prior: AbstractPrior = GammaPrior(),
    knowledge: PriorKnowledge = NO_KNOWLEDGE,
    start: AbstractCTBN | None = None,
    tolerance: float = 1e-6,
    max_iterations: int = 50,
    emissions: Emissions | None = None,
    e_step: AbstractPanelEStep = EXACT_E_STEP,
    memory_budget: int | float | str | None = None,
    key: PRNGKeyArray | None = None,
    patience: int = 3,
) -> PanelStructureFit:
    r"""Exhaustive Bayesian structure learning from panel trajectories, by structural EM (see
    the module docstring for the approximation it makes).

    Iteration $i$: smoothed expected statistics of every trajectory under $m_i$ (pooled across
    interventions), scores of every candidate parent set of every node under `prior`
    ([`jaxctbn.StructurePosterior.from_statistics`][]), and $m_{i+1}$ = the MAP graph with
    posterior-mean rates. Stops when the MAP graph is that of $m_i$ and the log-likelihood
    changed by at most `tolerance` $\times(1+|\ell|)$, or after `max_iterations` E-steps.

    **Arguments** (those shared with [`jaxctbn.learn_structure`][] mean the same):

    - `observations`: a batch of [`jaxctbn.panel.PanelObservations`][] (one leading axis), or a
      [`jaxctbn.panel.PanelBuckets`][]; their interventions give the pooling.
    - `start`: the model of the first E-step. Default: the empty graph with one crude rate per
      node (observed changes per unit time). `start=m, max_iterations=1` is the paper's
      approach: one E-step under a given model.
    - `tolerance`, `max_iterations`: the stopping rule above.
    - `emissions`: as for [`jaxctbn.panel.panel_expected_statistics`][] (the exact E-step only).
    - `e_step`: how each E-step infers the hidden paths: [`jaxctbn.panel.ForwardBackward`][]
      (default: exact, with its master-equation `solver`; the default dense
      [`jaxctbn.MatrixExponential`][] has no limit on the length of a gap; exponential in the
      number of nodes whatever the solver, the amalgamated state space),
      [`jaxctbn.panel.PanelMeanField`][], [`jaxctbn.panel.GibbsSampler`][] or
      [`jaxctbn.panel.PanelImportanceSampler`][] (below).

    **Inference under evidence by sampling** (`e_step=`[`jaxctbn.panel.GibbsSampler`][],
    with `key`): for networks beyond exact forward-backward, each E-step draws complete paths
    given the observations (`sample_panel_paths`) and averages their family
    statistics over the samples (Monte Carlo structural EM). The statistics of the E-steps since
    the MAP graph last changed are averaged (the later half of them: their models differ only
    in the rates, which settle and then move by sampling noise). The exact route's stopping rule
    needs the log-likelihood; here the fit stops at the `patience`-th E-step, since the MAP
    graph last changed, whose evidence $\ln p(\bar M,\bar T)$ (of its own statistics, summed
    over the candidate sets: it rises while EM converges) is not above the previous E-step's,
    i.e. once the rates' progress is lost in the sampling noise. The sampler takes exact
    observations (no `emissions`, no exact entry times); the E-step's cost grows with the
    number of nodes (a node update works on the node's Markov blanket), not with
    $\prod_n k_n$. When a sampled path or update needs more than the sampler's `max_events` /
    `max_node_events` / `max_virtual`, the buffers that overflowed are doubled and the E-step
    redone (each up to 16,384; then a `ValueError`), so the buffers need no tuning. Reports
    the chains' effective sample sizes; the log-likelihood is not computed.

    **Importance sampling** (`e_step=`[`jaxctbn.panel.PanelImportanceSampler`][], with
    `key`): each E-step fits the mean-field product law to the observations, draws paths from
    it, weighs them towards the exact posterior
    (`sample_panel_paths_by_importance`) and resamples them to equal weights
    (systematic resampling) for the family statistics; the rest (averaging, stopping, buffer
    growth: `max_events`, `max_node_events`, `max_candidates`) is as for the Gibbs sampler. It
    corrects the mean field's bias where the weights' effective sample size is not small; the
    effective sample size falls as the network grows (about 90 of 256 at 6 nodes, 16 at 20,
    4 at 50 nodes in `benchmarks/panel/bench_panel_sampling.py`'s data), so beyond ~20 coupled nodes
    Gibbs sampling or the mean field serve better.

    **Local fixed points.** Like every EM, structural EM can stop at a local fixed point: the
    imputed paths follow the current graph, which then scores well on them. On sparse panels
    (e.g. 150 subjects of a three-node chain seen at 6 times, with rates up to 3 per gap) the
    empty start and the true network as start reached different graphs; with 11 observation
    times both reached the truth. Compare fits from several `start`s by their `log_likelihood`
    and their posteriors before trusting an edge.

    **Mean-field inference under evidence** (`e_step=`[`jaxctbn.panel.PanelMeanField`][]):
    each E-step approximates the posterior of the paths by a product of node processes fitted
    to the observations (`panel_mean_field_statistics`); deterministic, its
    cost grows with the number of nodes, not with $\prod_n k_n$. The stopping rule is the exact
    route's with the evidence lower bound in place of the log-likelihood (reported as
    `evidence_lower_bound`). Exact observations only (no `emissions`, no exact entry times).
    The projections onto the candidate sets use the product law, so a dependence between a
    node and a candidate parent that the product cannot carry is scored from the rates'
    effect alone (compared with sampling and exact inference in
    `benchmarks/panel/bench_panel_sampling.py`).

    Runs on the host (a Python loop over iterations, each compiled once: the E-step model is a
    [`jaxctbn.PaddedCTBN`][] of fixed shapes after the first step).
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
            "observations: expected a batch of PanelObservations with one leading axis, or a "
            "PanelBuckets."
        )
    if observations.num_nodes != N:
        raise ValueError(
            f"observations: have {observations.num_nodes} nodes, cardinalities give {N}."
        )
    if not (isinstance(tolerance, (int, float)) and tolerance >= 0):
        raise ValueError(f"tolerance: must be a number >= 0, got {tolerance!r}.")
    if not (isinstance(max_iterations, int) and max_iterations >= 1):
        raise ValueError(f"max_iterations: must be an integer >= 1, got {max_iterations!r}.")
    check_knowledge(knowledge)
    edge_prior = knowledge.edge_prior
    if not isinstance(e_step, AbstractPanelEStep):
        raise ValueError(
            "e_step: expected ForwardBackward(), PanelMeanField(), GibbsSampler() or "
            f"PanelImportanceSampler() (jaxctbn.panel), got {e_step!r}."
        )
    e_step.check_emissions(emissions)
    if e_step.samples:
        if key is None:
            raise ValueError(
                f"key: a PRNG key is needed to sample (e_step={type(e_step).__name__}(...))."
            )
        if not (isinstance(patience, int) and not isinstance(patience, bool) and patience >= 1):
            raise ValueError(f"patience: must be an integer >= 1, got {patience!r}.")
    sampler = e_step if isinstance(e_step, GibbsSampler | PanelImportanceSampler) else None
    mean_field = e_step if isinstance(e_step, PanelMeanField) else None
    solver = e_step.solver if isinstance(e_step, ForwardBackward) else DENSE_SOLVER
    sets = candidate_sets_within_budget(
        "learn_structure_from_panels",
        names,
        cards,
        max_parents,
        **knowledge.constraints(names),
        memory_budget=memory_budget,
    )
    model = _independent_start(observations, names, cards) if start is None else start
    if model.cardinalities != cards or tuple(model.names) != names:
        raise ValueError("start: must have the nodes and cardinalities of `names`/`cardinalities`.")
    width = max(int(s.shape[-1]) for s in sets)
    if isinstance(model, CTBN) and all(len(p) <= width for p in _graph_of(model)):
        # the shapes of every later E-step's model: one compilation serves all iterations
        model = PaddedCTBN.from_ctbn(model, max_parents=width)
    R = observations.batch_shape[0]
    intervention = observations.intervention
    if intervention is None:
        targets = jnp.zeros((R, N), bool)
    else:
        targets = jnp.broadcast_to(intervention.targets, (R, N))
    sets = tuple(jnp.asarray(s, jnp.int32) for s in sets)
    groups = None
    if intervention is None and solver.tabulates_gaps:
        groups = gap_groups(observations)
    if sampler is not None:
        assert key is not None
        return _sampled_structural_em(
            model, observations, names, sets, prior, edge_prior, sampler, key, max_iterations,
            patience,
        )  # fmt: skip
    trace: list[float] = []
    previous_graph = _graph_of(model)
    converged = False
    posterior = None
    buckets = as_flat_buckets(observations) if mean_field is not None else []
    if mean_field is not None:  # the sweeps and tolerance as data, and the default start
        mean_field = as_data(mean_field)
    # each bucket's last mean-field fit: the next one's start (one program for all E-steps)
    fitted = [_mean_field_start(model, b, mean_field, None) for b in buckets]
    for _ in range(max_iterations):
        if mean_field is not None:
            bound = children_bound(model)  # (static: a power of two, one program mostly)
            parts = [
                _mean_field_e_step(model, b, mean_field, sets, f, bound)
                for b, f in zip(buckets, fitted)
            ]
            fitted = [(*part[3], jnp.asarray(True)) for part in parts]
            family = parts[0][0]
            for part in parts[1:]:
                family = family + part[0]
            log_likelihood = sum(float(part[1]) for part in parts)
        else:
            family, log_likelihood = _e_step(
                model, observations, emissions, solver, sets, targets, groups
            )
        trace.append(float(log_likelihood))
        posterior, indices, next_model = _m_step(family, names, prior, edge_prior)
        graph = _graph_at(sets, indices)
        steady = len(trace) >= 2 and abs(trace[-1] - trace[-2]) <= tolerance * (
            1.0 + abs(trace[-1])
        )
        if graph == previous_graph and steady:
            converged = True
            break
        if len(trace) == max_iterations:
            break
        model, previous_graph = next_model, graph
    assert posterior is not None
    value = jnp.asarray(trace[-1])
    return PanelStructureFit(
        posterior=posterior,
        model=model,
        log_likelihood=None if mean_field is not None else value,
        trace=jnp.asarray(trace),
        iterations=len(trace),
        converged=converged,
        evidence_lower_bound=value if mean_field is not None else None,
    )


#: the samplers' buffers, in the order of their overflow flags
_BUFFERS = ("max_events", "max_node_events", "max_virtual")
_IMPORTANCE_BUFFERS = ("max_events", "max_node_events", "max_candidates")
#: the largest size the sampled E-step grows each of them to
_MAX_BUFFER = 1 << 14


def _sampled_structural_em(
    model, observations, names, sets, prior, edge_prior, sampler, key, max_iterations, patience
) -> PanelStructureFit:  # fmt: skip
    """Structural EM with the Monte Carlo E-step (`learn_structure_from_panels`)."""
    buckets = as_flat_buckets(observations)
    previous_graph = _graph_of(model)
    window: list[FamilyStatistics] = []  # the E-steps under the current graph
    infeasible, stable, converged = 0, 0, False
    posterior, diagnostics, previous_evidence = None, [], -np.inf
    importance = isinstance(sampler, PanelImportanceSampler)
    starts = []  # importance: each bucket's last mean-field fit, the next proposal's start
    if importance:  # the proposal's sweeps and tolerance as data (one program)
        sampler = eqx.tree_at(lambda s: s.proposal, sampler, as_data(sampler.proposal))
        starts = [_mean_field_start(model, b, sampler.proposal, None) for b in buckets]
    for i in range(max_iterations):
        bounds = children_bound(model) if importance else sampler_bounds(model)
        family, diagnostics = None, []
        for b, bucket in enumerate(buckets):
            while True:  # a buffer too small for these paths: doubled, the step redone
                step_key = jax.random.fold_in(jax.random.fold_in(key, i), b)
                if importance:
                    part, chains, overflow, fitted = _importance_e_step(
                        model, bucket, sampler, sets, step_key, starts[b], bounds
                    )
                    stuck, names_ = 0, _IMPORTANCE_BUFFERS
                    if not np.any(np.asarray(overflow)):
                        starts[b] = fitted
                else:
                    part, chains, stuck, overflow = _sampled_e_step(
                        model, bucket, sampler, sets, step_key, bounds
                    )
                    names_ = _BUFFERS
                grow = [name for name, flag in zip(names_, np.asarray(overflow)) if flag]
                if not grow:
                    break
                if any(getattr(sampler, name) >= _MAX_BUFFER for name in grow):
                    raise ValueError(
                        f"sampler: the paths need more than {_MAX_BUFFER} jumps or virtual "
                        f"times per update ({', '.join(grow)}); the rates are too fast for the "
                        "time between the observations."
                    )
                sampler = dataclasses.replace(
                    sampler, **{name: min(2 * getattr(sampler, name), _MAX_BUFFER) for name in grow}
                )
            family = part if family is None else family + part
            diagnostics.append(chains)
            infeasible += int(stuck)
        assert family is not None
        # this E-step's evidence (of its own statistics): it rises while EM converges and then
        # moves by sampling noise alone
        evidence = float(_m_step(family, names, prior, edge_prior)[0].log_evidence())
        window.append(family)
        recent = window[len(window) // 2 :]  # the later half: the rates have settled
        averaged = scaled(sum(recent[1:], recent[0]), 1.0 / len(recent))
        posterior, indices, next_model = _m_step(averaged, names, prior, edge_prior)
        graph = _graph_at(sets, indices)
        if graph != previous_graph:
            stable, window = 0, []
        elif evidence <= previous_evidence:
            stable += 1
        previous_evidence = evidence
        if stable >= patience:
            converged = True
            break
        if i + 1 == max_iterations:
            break
        model, previous_graph = next_model, graph
    assert posterior is not None
    r_hat, estimate = None, None
    if importance:  # the weights' effective sample sizes (the same for every node)
        ess = jnp.concatenate([d[0] for d in diagnostics])[:, None]
        ess = jnp.broadcast_to(ess, (ess.shape[0], model.num_nodes))
        estimate = jnp.asarray(sum(float(d[1]) for d in diagnostics))
    else:
        ess = jnp.concatenate([d[0] for d in diagnostics])  # (trajectories, nodes)
        if diagnostics[0][1] is not None:
            r_hat = jnp.concatenate([d[1] for d in diagnostics]).max(0)
    return PanelStructureFit(
        posterior=posterior,
        model=model,
        log_likelihood=None,
        trace=jnp.zeros((0,)),
        iterations=i + 1,
        converged=converged,
        effective_sample_size=ess.min(0),
        infeasible_updates=None if importance else infeasible,
        sampler=sampler,
        median_effective_sample_size=jnp.median(ess, axis=0),
        split_r_hat=r_hat,
        log_likelihood_estimate=estimate,
    )


def _graph_at(sets, indices) -> tuple[tuple[int, ...], ...]:
    """The graph of the candidate sets `indices[n]` of `sets` (the M-step's MAP graph)."""
    return tuple(
        tuple(int(p) for p in np.asarray(s[int(i)]) if p >= 0) for s, i in zip(sets, indices)
    )


def _graph_of(model: AbstractCTBN) -> tuple[tuple[int, ...], ...]:
    return tuple(
        tuple(int(p) for p in np.asarray(model.parent_list(n)).reshape(-1) if p >= 0)
        for n in range(model.num_nodes)
    )
