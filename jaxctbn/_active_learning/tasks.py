"""Learning tasks: what is learned from the experiments (the structure, or the rates of a known
graph), from which posterior, and by which metrics it is judged against the truth."""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx
from jaxtyping import Array, PRNGKeyArray

from .._criteria.outcomes import COMPLETE_PATH, AbstractOutcome, check_outcome
from .._learning.empirical_bayes import EmpiricalBayes
from .._learning.posterior import AbstractPosterior, AbstractRatePosterior, RatePosterior
from .._learning.priors import AbstractPrior, GammaPrior, check_prior
from .._learning.structure_mixture import StructureMixturePosterior
from .._learning.structure_posterior import StructurePosterior
from .._model.ctbn import CTBN
from .._panel.rate_families import (
    AbstractPanelRateFamily,
    MomentMatchedGamma,
    ParticleFilter,
)
from .._panel.structure_posterior import (
    AbstractPanelStructureFamily,
    StructuralEM,
    StructureParticleFilter,
)
from .._paths.sampling import Trajectories
from .metrics import adjacency_from_parents, edge_aupr, edge_auroc, structural_hamming_distance

#: The rate posterior family of a sequential loop with panel outcomes.
DEFAULT_SEQUENTIAL_FAMILY = ParticleFilter()
#: The structure posterior family of a sequential loop with panel outcomes.
DEFAULT_SEQUENTIAL_STRUCTURE_FAMILY = StructureParticleFilter()


def _check_outcome(outcome, panel_iterations) -> None:
    check_outcome(outcome, error=ValueError)
    outcome.check_simulated()
    if (
        isinstance(panel_iterations, bool)
        or not isinstance(panel_iterations, int)
        or (panel_iterations < 1)
    ):
        raise ValueError(f"panel_iterations: expected an integer >= 1, got {panel_iterations!r}.")


class AbstractLearningTask(eqx.Module):
    """What is being learned: the ground truth, what each experiment reveals (`outcome`, an
    [`jaxctbn.AbstractOutcome`][]; the designs score under it), the prior, how one
    trajectory updates the posterior and which metrics are recorded. `metric_labels` (a class attribute) names every
    metric `metrics` returns: `{name: (label, "higher" | "lower" is better)}`; the experiment
    tables and figures read it."""

    truth: eqx.AbstractVar[CTBN]
    outcome: eqx.AbstractVar[AbstractOutcome]
    metric_labels: ClassVar[dict[str, tuple[str, str]]]

    @abc.abstractmethod
    def initial_posterior(self) -> AbstractPosterior:
        """The posterior before any experiment."""

    @abc.abstractmethod
    def update(self, posterior: AbstractPosterior, path: Trajectories) -> AbstractPosterior:
        """The posterior after one more simulated trajectory (pooled across interventions).
        A task with a panel outcome also takes keyword-only `observation_times`, the visit times
        at which this experiment was seen (the loop passes the design's choice), and `key`, for
        a posterior family that samples (the loop passes one per experiment)."""

    @abc.abstractmethod
    def metrics(self, posterior: AbstractPosterior) -> dict[str, Array]:
        """Scalar metrics of `posterior` against the truth, keyed as `metric_labels`."""


class StructureLearningTask(AbstractLearningTask):
    r"""Exact Bayesian structure learning (exhaustive parent sets with in-degree
    $\le$ `max_parents`, rate prior `prior`, default [`jaxctbn.GammaPrior`][]`(1, 1)`; with
    `empirical_bayes=`[`jaxctbn.EmpiricalBayes`][]`()` the prior's hyper-parameters are refitted
    to the data after every experiment, starting from `prior`). Metrics:
    edge AUROC and AUPR of the posterior edge marginals against the true graph, structural
    Hamming distance of the MAP graph, and the entropy of the structure posterior (nats). The
    truth needs at least 2 nodes, one edge and one absent edge (else AUROC/AUPR are undefined);
    other truths are refused here with a `ValueError`.

    `outcome` (keyword-only): what each experiment reveals, [`jaxctbn.CompletePath`][]
    (default) or [`jaxctbn.PanelOutcome`][]`(times)`: the simulated path seen at time 0 and at
    the visit times only, the posterior updated by
    [`jaxctbn.panel.panel_structure_posterior`][] in the family `panel_posterior`
    (keyword-only): by default [`jaxctbn.panel.StructureParticleFilter`][]`()`, sequential Monte
    Carlo over the hidden paths whose posterior is a [`jaxctbn.StructureMixturePosterior`][],
    exact as its particles grow (`update` then takes a `key`; the loop passes one); or
    [`jaxctbn.panel.StructuralEM`][]`(iterations)`, the fast approximation (earlier experiments'
    statistics kept as they were; **overconfident** where the visits are sparse, maths §7).
    `panel_iterations=I` is a shortcut for `panel_posterior=StructuralEM(I)`. Under the mixture
    the entropy metric is the mixture's over whole graphs
    ([`jaxctbn.StructureMixturePosterior.entropy`][]) and the MAP graph is taken node by node
    from the edge marginals' parent-set marginals. `empirical_bayes` refits a single
    posterior's prior, so it takes the structural-EM family. With `PanelOutcome(num_visits=K)` each
    experiment's $K$ visit times are the design's (`update`'s `observation_times`; see
    [`jaxctbn.AbstractDesign`][]). The outcome is stated here only: the loop gives it to the
    design, which scores under it."""

    truth: CTBN
    max_parents: int = eqx.field(static=True, kw_only=True)
    prior: AbstractPrior = eqx.field(default=GammaPrior(), kw_only=True)
    empirical_bayes: EmpiricalBayes | None = eqx.field(default=None, kw_only=True)
    outcome: AbstractOutcome = eqx.field(default=COMPLETE_PATH, kw_only=True)
    panel_posterior: AbstractPanelStructureFamily | None = eqx.field(default=None, kw_only=True)
    panel_iterations: int | None = eqx.field(default=None, static=True, kw_only=True)
    metric_labels: ClassVar[dict[str, tuple[str, str]]] = {
        "auroc": ("AUROC", "higher"),
        "aupr": ("AUPR", "higher"),
        "shd": ("SHD of the MAP graph", "lower"),
        "entropy": ("structure posterior entropy (nats)", "lower"),
    }

    def __check_init__(self):
        N = self.truth.num_nodes
        check_prior(self.prior, N)
        if N < 2:
            raise ValueError(
                f"truth: structure learning needs at least 2 nodes (a {N}-node network has no "
                "candidate edges, so its AUROC and AUPR are undefined)."
            )
        edges = sum(len(self.truth.parent_list(n)) for n in range(N))
        if edges == 0 or edges == N * (N - 1):
            raise ValueError(
                f"truth: the edge AUROC/AUPR need a true graph with at least one edge and one "
                f"absent edge; this one has {'no edges' if edges == 0 else 'every edge'}."
            )
        if not 0 <= self.max_parents < self.truth.num_nodes:
            raise ValueError(
                f"max_parents must be in 0..{self.truth.num_nodes - 1}, got {self.max_parents}."
            )
        _check_outcome(self.outcome, 1 if self.panel_iterations is None else self.panel_iterations)
        if self.panel_posterior is not None:
            if not isinstance(self.panel_posterior, StructureParticleFilter | StructuralEM):
                raise ValueError(
                    "panel_posterior: the loop updates one experiment at a time with "
                    "StructureParticleFilter() or StructuralEM(), got "
                    f"{self.panel_posterior!r}."
                )
            if self.panel_iterations is not None:
                raise ValueError(
                    "panel_iterations: give either panel_posterior or its shortcut "
                    "panel_iterations (= StructuralEM(panel_iterations)), not both."
                )
        family = self.outcome.posterior_family(self.panel_family())
        if (
            self.empirical_bayes is not None
            and family is not None
            and not isinstance(family, StructuralEM)
        ):
            raise ValueError(
                "empirical_bayes: refits one posterior's prior; with a panel outcome give "
                "panel_posterior=StructuralEM() (the particle filter's mixture has no single "
                "prior to refit)."
            )

    def panel_family(self) -> AbstractPanelStructureFamily:
        """The posterior family of the panel updates (see the class page)."""
        if self.panel_posterior is not None:
            return self.panel_posterior
        if self.panel_iterations is not None:
            return StructuralEM(self.panel_iterations)
        return DEFAULT_SEQUENTIAL_STRUCTURE_FAMILY

    def initial_posterior(self) -> StructurePosterior | StructureMixturePosterior:
        prior = self.prior
        if self.empirical_bayes is not None:
            prior = self.empirical_bayes.initial_prior(prior, self.truth.num_nodes)
        posterior = StructurePosterior.from_prior(
            self.truth.names,
            self.truth.cardinalities,
            max_parents=self.max_parents,
            prior=prior,
        )
        return self.outcome.initial_posterior(posterior, family=self.panel_family())

    def update(
        self,
        posterior: StructurePosterior | StructureMixturePosterior,
        path: Trajectories,
        *,
        observation_times: Array | None = None,
        key: PRNGKeyArray | None = None,
    ) -> StructurePosterior | StructureMixturePosterior:
        posterior = self.outcome.update_structure(
            posterior,
            path,
            family=self.panel_family(),
            observation_times=observation_times,
            key=key,
        )
        if self.empirical_bayes is not None:
            assert isinstance(posterior, StructurePosterior)
            posterior = self.empirical_bayes.fit(posterior)
        return posterior

    def metrics(
        self, posterior: StructurePosterior | StructureMixturePosterior
    ) -> dict[str, Array]:
        true = adjacency_from_parents(self.truth.parents, self.truth.num_nodes)
        edges = posterior.edge_marginals()
        return {
            "auroc": edge_auroc(edges, true),
            "aupr": edge_aupr(edges, true),
            "shd": structural_hamming_distance(posterior.map_adjacency(), true).astype(edges.dtype),
            "entropy": posterior.entropy(),
        }


class ParameterLearningTask(AbstractLearningTask):
    r"""Bayesian rate learning for the known graph of `truth` (rate prior `prior`, a
    [`jaxctbn.GammaPrior`][], default $(1, 1)$). Metric: the posterior-averaged squared error
    $\mathsf E[(\Lambda-\Lambda^*)^2]$ ([`jaxctbn.RatePosterior.mse`][]).

    `outcome` (keyword-only): what each experiment reveals, [`jaxctbn.CompletePath`][]
    (default) or [`jaxctbn.PanelOutcome`][]`(times)`: the simulated path seen at time 0 and at
    the visit times only, the posterior updated after each experiment by
    [`jaxctbn.panel.panel_rate_posterior`][] in the family `panel_posterior` (keyword-only):
    by default [`jaxctbn.panel.ParticleFilter`][]`()`, sequential Monte Carlo over the hidden
    paths whose posterior is a [`jaxctbn.GammaMixturePosterior`][], exact as its particles
    grow (`update` then takes a `key`; the loop passes one); or
    [`jaxctbn.panel.MomentMatchedGamma`][]`(iterations)`, the fast assumed-density filter
    (earlier experiments' statistics kept as they were; **overconfident** where the visits are
    sparse, maths §7). `panel_iterations=I` is a shortcut for
    `panel_posterior=MomentMatchedGamma(I)`. With `PanelOutcome(num_visits=K)` each experiment's $K$
    visit times are the design's (`update`'s `observation_times`; see
    [`jaxctbn.AbstractDesign`][]). The outcome is stated here only: the loop gives it to the
    design ([`jaxctbn.CriterionDesign`][]), which scores under it."""

    truth: CTBN
    prior: GammaPrior = eqx.field(default=GammaPrior(), kw_only=True)
    outcome: AbstractOutcome = eqx.field(default=COMPLETE_PATH, kw_only=True)
    panel_posterior: AbstractPanelRateFamily | None = eqx.field(default=None, kw_only=True)
    panel_iterations: int | None = eqx.field(default=None, static=True, kw_only=True)
    metric_labels: ClassVar[dict[str, tuple[str, str]]] = {
        "mse": ("posterior MSE of the rates", "lower")
    }

    def __check_init__(self):
        if not isinstance(self.prior, GammaPrior):
            raise ValueError(
                f"prior: parameter learning takes a GammaPrior(alpha, beta), got {self.prior!r}."
            )
        check_prior(self.prior, self.truth.num_nodes)
        _check_outcome(self.outcome, 1 if self.panel_iterations is None else self.panel_iterations)
        if self.panel_posterior is not None:
            if not isinstance(self.panel_posterior, AbstractPanelRateFamily):
                raise ValueError(
                    "panel_posterior: expected ParticleFilter(), MomentMatchedGamma() or "
                    f"SampledGammaMixture(), got {self.panel_posterior!r}."
                )
            if self.panel_iterations is not None:
                raise ValueError(
                    "panel_iterations: give either panel_posterior or its shortcut "
                    "panel_iterations (= MomentMatchedGamma(panel_iterations)), not both."
                )

    def panel_family(self) -> AbstractPanelRateFamily:
        """The posterior family of the panel updates (see the class page)."""
        if self.panel_posterior is not None:
            return self.panel_posterior
        if self.panel_iterations is not None:
            return MomentMatchedGamma(self.panel_iterations)
        return DEFAULT_SEQUENTIAL_FAMILY

    def initial_posterior(self) -> AbstractRatePosterior:
        prior = RatePosterior.for_model(self.truth, prior=self.prior)
        return self.outcome.initial_posterior(prior, family=self.panel_family())

    def update(
        self,
        posterior: AbstractRatePosterior,
        path: Trajectories,
        *,
        observation_times: Array | None = None,
        key: PRNGKeyArray | None = None,
    ) -> AbstractRatePosterior:
        return self.outcome.update_rates(
            posterior,
            path,
            family=self.panel_family(),
            observation_times=observation_times,
            key=key,
        )

    def metrics(self, posterior: AbstractRatePosterior) -> dict[str, Array]:
        return {"mse": posterior.mse(self.truth)}
