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

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray

from .._learning.knowledge import NO_KNOWLEDGE, PriorKnowledge, check_knowledge
from .._learning.priors import AbstractPrior, GammaPrior
from .._learning.scores import candidate_sets_within_budget
from .._model.ctbn import CTBN, AbstractCTBN, PaddedCTBN
from .buckets import PanelBuckets, as_flat_buckets
from .e_step import AbstractPanelEStep
from .exact_e_step import EXACT_E_STEP
from .observations import Emissions, PanelObservations
from .structural_em import PanelStructureFit, StructuralEMProblem, graph_of


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
    if isinstance(model, CTBN) and all(len(p) <= width for p in graph_of(model)):
        # the shapes of every later E-step's model: one compilation serves all iterations
        model = PaddedCTBN.from_ctbn(model, max_parents=width)
    problem = StructuralEMProblem(
        model=model,
        observations=observations,
        emissions=emissions,
        names=names,
        parent_sets=tuple(jnp.asarray(s, jnp.int32) for s in sets),
        prior=prior,
        edge_prior=knowledge.edge_prior,
        tolerance=float(tolerance),
        max_iterations=max_iterations,
        patience=patience,
        key=key,
    )
    return e_step.structural_em(problem)
