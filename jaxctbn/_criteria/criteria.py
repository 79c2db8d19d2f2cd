r"""Design criteria as Modules, and the one verb that scores candidate interventions.

[`jaxctbn.score_interventions`][] scores a batch of candidates for whatever the posterior learns:
the rates of a known graph ([`jaxctbn.RatePosterior`][], active parameter learning) or the graph
([`jaxctbn.StructurePosterior`][], active structure learning). The criterion is a Module:

- [`jaxctbn.VBHC`][]: the variational Box-Hill criterion, minimised in closed form (default) or
  by an `optimiser` ([`jaxctbn.LBFGS`][], [`jaxctbn.Adam`][]) with autodiff gradients;
- [`jaxctbn.BHC`][]: the Box-Hill criterion (the VBHC at $q$ = the posterior);
- [`jaxctbn.EIG`][]: the expected information gain by Monte Carlo over sampled paths.

The structure (V)BHC also takes a KL `estimator` ([`jaxctbn.PlugIn`][] or
[`jaxctbn.MonteCarlo`][]); the parameter (V)BHC is exact. The posterior decides which of the
criterion's two methods runs (`score_rates` or `score_structure`), so a new criterion is one
class with those two methods. Larger scores are more informative (the paper's
$\arg\max_i\min_\kappa\mathrm{VBHC}$); the paper's "negative VBHC" control is the `argmin`.
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._batching import AbstractBatching, Chunked, Vmap
from .._learning.optimisers import AbstractVBHCOptimiser
from .._learning.posterior import AbstractPosterior, AbstractRatePosterior, RatePosterior
from .._learning.structure_mixture import StructureMixturePosterior
from .._learning.structure_posterior import StructurePosterior
from .._master_equation.solvers import AUTOMATIC_SOLVER, StatisticsSolver
from .._model.interventions import Intervention
from .._panel.outcome_law import global_emission_matrix
from .kl_estimators import AbstractKLEstimator, PlugIn, RateCoupling
from .outcomes import AbstractOutcome, CompletePath, Panel
from .panel_parameter import (
    PANEL_VBHC_OPTIMISER,
    PanelDesign,
    Variational,
    draw_laws,
    optimise_visit_times,
    panel_parameter_bhc,
    panel_parameter_eig,
    panel_parameter_vbhc,
    panel_parameter_vbhc_minimum,
    posterior_log_kappa,
    posterior_variational_draws,
    warm_vbhc_steps,
)
from .panel_structure import (
    panel_structure_bhc,
    panel_structure_divergences,
    panel_structure_draws,
    panel_structure_eig,
    panel_structure_eig_draws,
    panel_structure_vbhc_minimum,
)
from .parameter import (
    design_statistics,
    parameter_bhc,
    parameter_eig,
    parameter_vbhc_minimise,
    parameter_vbhc_minimum,
    posterior_draws,
)
from .structure import (
    AbstractGraphDraws,
    StratifiedGraphDraws,
    eig_all_candidates,
    structure_bhc,
    structure_draws,
    structure_vbhc_minimise,
    structure_vbhc_minimum,
)

#: Candidates scored together by default for structure learning: the scorer skips, per node, the
#: chunks whose candidates all clamp that node.
STRUCTURE_CHUNK = 9
#: The same for the (V)BHC with stratified draws on a CPU, where a chunk's candidates x draws are
#: solved as one batch, which the uniformisation sorts by rate into cache-sized groups of similar
#: rate (`Uniformisation.group_size`): 27 candidates x 8 sets x 10 draws of the paper's network
#: (every candidate that leaves a node free) are 2,160 problems in 9 groups, whose loops run
#: fewer products than 9 unsorted chunks of 3 candidates (why: the `jaxctbn.Uniformisation`
#: docstring; the step is timed in `benchmarks/bench_design_step.py`, results in
#: `benchmarks/results/design_step.md`).
CPU_STRATIFIED_CHUNK = 27


def _structure_batching(graph_draws: AbstractGraphDraws) -> Chunked:
    """The default batching of the structure (V)BHC's candidates."""
    if isinstance(graph_draws, StratifiedGraphDraws) and jax.default_backend() == "cpu":
        return Chunked(CPU_STRATIFIED_CHUNK)
    return Chunked(STRUCTURE_CHUNK)


def _check_max_sets(max_sets) -> None:
    if max_sets is not None and (
        not isinstance(max_sets, int) or isinstance(max_sets, bool) or max_sets < 1
    ):
        raise ValueError(f"max_sets: expected None or a positive integer, got {max_sets!r}.")


#: The default outcome: the paper's complete path of every node.
COMPLETE_PATH = CompletePath()


def _check_single_structure_posterior(posterior) -> None:
    """The complete-path structure criteria factorise over nodes: they score one
    `StructurePosterior`, not a mixture."""
    if isinstance(posterior, StructureMixturePosterior):
        raise ValueError(
            "posterior: the complete-path structure criteria score a StructurePosterior; a "
            "StructureMixturePosterior (what panels leave) is scored with a Panel(...) outcome, "
            "or as if its paths were seen through posterior.moment_matched()."
        )


def _check_complete_path(outcome, target: str = "") -> None:
    if not isinstance(outcome, CompletePath):
        where = f" for {target}" if target else ""
        raise ValueError(
            f"outcome: {type(outcome).__name__} outcomes are not supported{where} by this "
            "criterion yet; use CompletePath() or Panel(...)."
        )


def _panel_design(
    candidates: Intervention,
    horizon: Array,
    outcome: Panel,
    batching: AbstractBatching,
    value,
    surrogate,
    refine,
    carry0,
) -> PanelDesign:
    """Every candidate's panel score `value(iv, times)`: at the outcome's given times, or at its
    own best times (the search ascends `surrogate(iv, times, carry)`, `carry` updated by
    `refine` before each step, from `carry0`), kept only where better than equal spacing."""
    if outcome.emissions is not None:
        raise ValueError(_BOX_HILL_EMISSIONS)
    dtype = horizon.dtype

    def one(iv):
        if outcome.times is not None:
            times = outcome.visit_times(horizon, dtype)
            v = value(iv, times)
            return v, times, v
        best = optimise_visit_times(
            lambda times, carry: surrogate(iv, times, carry),
            lambda times, carry: refine(iv, times, carry),
            carry0,
            horizon,
            outcome.size,
            steps=outcome.steps,
            learning_rate=outcome.learning_rate,
        )
        equal = outcome.equally_spaced(horizon, dtype)
        v_best, v_equal = jax.vmap(lambda times: value(iv, times))(jnp.stack([best, equal]))
        pick = jnp.isfinite(v_best) & (v_best > v_equal)
        return jnp.where(pick, v_best, v_equal), jnp.where(pick, best, equal), v_equal

    scores, times, equal_scores = batching.map(one, candidates)
    return PanelDesign(scores=scores, times=times, equally_spaced_scores=equal_scores)


class AbstractCriterion(eqx.Module):
    """A design criterion: one score per candidate intervention for each learning target.

    Both methods receive the posterior, a batch of `candidates` (an
    [`jaxctbn.Intervention`][] with a leading axis), the `initial_state` and `horizon` of the
    next experiment, and keyword-only `key`, `num_samples` (posterior draws $N_S$), `solver`,
    `batching` and `outcome` (what the experiment reveals, a
    [`jaxctbn.criteria.AbstractOutcome`][]). They return `(candidates,)` scores, larger = more
    informative, computed with the same random numbers for every candidate (common random
    numbers). `batching=None` means the target's default. A criterion that does not support an
    outcome raises a `ValueError` naming it."""

    @abc.abstractmethod
    def score_rates(
        self,
        posterior: RatePosterior,
        candidates: Intervention,
        initial_state: ArrayLike,
        horizon: ArrayLike,
        *,
        key: PRNGKeyArray,
        num_samples: int,
        solver: StatisticsSolver,
        batching: AbstractBatching | None,
        outcome: AbstractOutcome,
    ) -> Float[Array, " candidates"]:
        """Scores for active parameter learning."""

    @abc.abstractmethod
    def score_structure(
        self,
        posterior: StructurePosterior,
        candidates: Intervention,
        initial_state: ArrayLike,
        horizon: ArrayLike,
        *,
        key: PRNGKeyArray,
        num_samples: int,
        solver: StatisticsSolver,
        batching: AbstractBatching | None,
        outcome: AbstractOutcome,
    ) -> Float[Array, " candidates"]:
        """Scores for active structure learning."""


class AbstractBoxHillCriterion(AbstractCriterion):
    """A criterion computed from posterior-averaged expected statistics (parameters) or from
    the divergences $a_n(P')$ (structure): the (V)BHC family. Subclasses say how a value follows
    from those (`rate_value`, `structure_value`); the scoring is shared."""

    estimator: eqx.AbstractVar[AbstractKLEstimator]
    graph_draws: eqx.AbstractVar[AbstractGraphDraws]
    max_sets: eqx.AbstractVar[int | None]

    @abc.abstractmethod
    def rate_value(self, posterior: RatePosterior, statistics) -> Float[Array, ""]:
        """The criterion from one candidate's [`jaxctbn.criteria.ParameterDesignStatistics`][]."""

    @abc.abstractmethod
    def structure_value(self, posterior: StructurePosterior, divergences) -> Float[Array, ""]:
        """The criterion from one candidate's divergences $a_n(P')$ (one array per node)."""

    @abc.abstractmethod
    def panel_rate_value(
        self,
        posterior: AbstractRatePosterior,
        laws,
        variational,
        initial_state,
        times,
        intervention,
    ) -> Float[Array, ""]:
        """The criterion of one candidate with a panel outcome, from the panel laws of the
        posterior draws (maths §7)."""

    @abc.abstractmethod
    def panel_structure_value(self, divergences: Array) -> Float[Array, ""]:
        """The structure criterion of one candidate with a panel outcome, from the coupled
        panel divergences $D_{st}$ `(S, T)` (maths §7)."""

    def score_rates(
        self,
        posterior,
        candidates,
        initial_state,
        horizon,
        *,
        key,
        num_samples,
        solver,
        batching,
        outcome=COMPLETE_PATH,
    ):
        if isinstance(outcome, Panel):
            return self._score_rates_panel(
                posterior, candidates, initial_state, horizon, key, num_samples, batching, outcome
            )
        _check_complete_path(outcome)
        if not isinstance(self.estimator, PlugIn):
            raise ValueError(
                "estimator: the parameter criteria are linear in the expected statistics, so "
                "they are exact; use the default PlugIn() (MonteCarlo applies to structure "
                "learning)."
            )
        draws = posterior_draws(posterior, key, num_samples)

        def one(iv):
            stats = design_statistics(
                posterior, draws, initial_state, horizon, intervention=iv, solver=solver
            )
            return self.rate_value(posterior, stats)

        return (Vmap() if batching is None else batching).map(one, candidates)

    def _score_rates_panel(
        self, posterior, candidates, initial_state, horizon, key, num_samples, batching, outcome
    ):
        return self.panel_design_rates(
            posterior,
            candidates,
            initial_state,
            horizon,
            key=key,
            num_samples=num_samples,
            batching=batching,
            outcome=outcome,
        ).scores

    def panel_design_rates(
        self,
        posterior: AbstractRatePosterior,
        candidates: Intervention,
        initial_state: ArrayLike,
        horizon: ArrayLike,
        *,
        key: PRNGKeyArray,
        num_samples: int,
        batching: AbstractBatching | None,
        outcome: Panel,
    ) -> PanelDesign:
        """Every candidate's score with a panel outcome, its visit times (chosen per candidate
        when `outcome` has `num_visits`) and its score at equally spaced visits (maths §7)."""
        if not isinstance(self.estimator, PlugIn):
            raise ValueError(
                "estimator: the panel parameter criteria use exact panel divergences; use the "
                "default PlugIn()."
            )
        key_draws, key_variational = jr.split(key)
        draws = posterior_draws(posterior, key_draws, num_samples)
        variational_keys = jr.split(key_variational, num_samples)
        variational = Variational(
            keys=variational_keys,
            at_posterior=posterior_variational_draws(posterior, variational_keys),
        )
        horizon = jnp.asarray(horizon, posterior.alpha[0].dtype)

        def value(iv, times):
            laws = draw_laws(draws, initial_state, times, iv)
            return self.panel_rate_value(posterior, laws, variational, initial_state, times, iv)

        def surrogate(iv, times, carry):
            laws = draw_laws(draws, initial_state, times, iv)
            return self.panel_search_value(
                posterior, laws, variational, initial_state, times, iv, carry
            )

        def refine(iv, times, carry):
            laws = draw_laws(draws, initial_state, times, iv)
            return self.panel_search_refine(
                posterior, laws, variational, initial_state, times, iv, carry
            )

        return _panel_design(
            candidates,
            horizon,
            outcome,
            Vmap() if batching is None else batching,
            value,
            surrogate,
            refine,
            posterior_log_kappa(posterior),
        )

    def panel_design_structure(
        self,
        posterior: StructurePosterior,
        candidates: Intervention,
        initial_state: ArrayLike,
        horizon: ArrayLike,
        *,
        key: PRNGKeyArray,
        num_samples: int,
        batching: AbstractBatching | None,
        outcome: Panel,
    ) -> PanelDesign:
        """Structure learning's [`PanelDesign`][jaxctbn.criteria.PanelDesign]: the panel
        divergences of [`jaxctbn.criteria.panel_structure_draws`][] (graphs at their
        posterior-mean rates with `PlugIn()`, coupled rate draws with `RateCoupling()`; maths
        §7), the visit times ascended on the criterion itself."""
        draws, horizon, posterior = self.panel_structure_setup(posterior, key, num_samples, horizon)

        def value(iv, times):
            divergences = panel_structure_divergences(draws, initial_state, times, iv)
            return self.panel_structure_value(divergences)

        return _panel_design(
            candidates,
            horizon,
            outcome,
            Chunked(STRUCTURE_CHUNK) if batching is None else batching,
            value,
            lambda iv, times, carry: value(iv, times),
            lambda iv, times, carry: carry,
            jnp.zeros((), horizon.dtype),
        )

    def panel_structure_setup(self, posterior: StructurePosterior, key, num_samples, horizon):
        """The draws of the panel structure criteria (checked estimator, `max_sets` applied):
        `(draws, horizon as an array, the posterior scored)`."""
        if not isinstance(self.estimator, PlugIn | RateCoupling):
            raise ValueError(
                "estimator: the panel structure criteria take PlugIn() (graphs at their "
                "posterior-mean rates, the default) or RateCoupling() (the bound), got "
                f"{self.estimator!r}."
            )
        if self.max_sets is not None:
            posterior = posterior.truncated(self.max_sets)
        draws = panel_structure_draws(
            posterior,
            key,
            num_samples,
            coupled=isinstance(self.estimator, RateCoupling),
            systematic=getattr(self.graph_draws, "systematic", True),
        )
        dtype = posterior.dtype
        return draws, jnp.asarray(horizon, dtype), posterior

    def panel_search_value(
        self, posterior, laws, variational, initial_state, times, intervention, log_kappa
    ):
        """The surrogate of the criterion that the visit-time search ascends, differentiable
        in `times`, at the variational parameters carried through the search (here the BHC:
        the posterior's own)."""
        return panel_parameter_bhc(
            posterior, laws, variational.at_posterior, initial_state, times, intervention
        )

    def panel_search_refine(
        self, posterior, laws, variational, initial_state, times, intervention, log_kappa
    ):
        """The carried variational parameters before a step of the visit-time search (here
        unchanged)."""
        return log_kappa

    def score_structure(
        self,
        posterior,
        candidates,
        initial_state,
        horizon,
        *,
        key,
        num_samples,
        solver,
        batching,
        outcome=COMPLETE_PATH,
    ):
        if isinstance(outcome, Panel):
            return self.panel_design_structure(
                posterior,
                candidates,
                initial_state,
                horizon,
                key=key,
                num_samples=num_samples,
                batching=batching,
                outcome=outcome,
            ).scores
        _check_complete_path(outcome, "structure learning")
        _check_single_structure_posterior(posterior)
        if self.max_sets is not None:
            posterior = posterior.truncated(self.max_sets)
        a_all = self.graph_draws.divergences(
            posterior,
            candidates,
            initial_state,
            horizon,
            key=key,
            num_samples=num_samples,
            solver=solver,
            estimator=self.estimator,
            batching=_structure_batching(self.graph_draws) if batching is None else batching,
        )
        return jax.vmap(lambda a: self.structure_value(posterior, a))(a_all)


class VBHC(AbstractBoxHillCriterion):
    r"""The variational Box-Hill criterion (maths §3 for parameters, §4 for structure), minimised
    over the variational family: in closed form (`optimiser=None`, the default) or numerically
    by an [`jaxctbn.AbstractVBHCOptimiser`][] with autodiff gradients (the same minimum).

    **Arguments (keyword-only):** `optimiser` (default `None` = closed form), and for structure
    learning `estimator` (the KL estimator, default [`jaxctbn.PlugIn`][]), `graph_draws` (how
    graphs are drawn, default [`jaxctbn.criteria.StratifiedGraphDraws`][], the paper's;
    [`jaxctbn.criteria.JointGraphDraws`][] for large networks) and `max_sets` (score over each node's
    `max_sets` most probable parent sets, [`jaxctbn.StructurePosterior.truncated`][]; default
    `None` = all)."""

    optimiser: AbstractVBHCOptimiser | None = eqx.field(default=None, kw_only=True)
    estimator: AbstractKLEstimator = eqx.field(default=PlugIn(), kw_only=True)
    graph_draws: AbstractGraphDraws = eqx.field(default=StratifiedGraphDraws(), kw_only=True)
    max_sets: int | None = eqx.field(default=None, static=True, kw_only=True)

    def __check_init__(self):
        _check_max_sets(self.max_sets)

    def rate_value(self, posterior, statistics):
        if self.optimiser is None:
            return parameter_vbhc_minimum(posterior, statistics)
        return parameter_vbhc_minimise(posterior, statistics, self.optimiser)[0]

    def structure_value(self, posterior, divergences):
        if self.optimiser is None:
            return structure_vbhc_minimum(posterior, divergences)
        return structure_vbhc_minimise(posterior, divergences, self.optimiser)[0]

    def panel_search_value(
        self, posterior, laws, variational, initial_state, times, intervention, log_kappa
    ):
        """The VBHC at the carried variational parameters; its gradient in the times is taken
        at those parameters (the envelope theorem at the inner minimum)."""
        return panel_parameter_vbhc(
            posterior, laws, log_kappa, variational.keys, initial_state, times, intervention
        )

    def panel_search_refine(
        self, posterior, laws, variational, initial_state, times, intervention, log_kappa
    ):
        """A few Adam steps on the carried variational parameters at these times (a warm
        start of the inner minimisation)."""
        return warm_vbhc_steps(
            posterior, laws, log_kappa, variational.keys, initial_state, times, intervention
        )

    def panel_structure_value(self, divergences):
        """Minimised in closed form over the drawn alternative graphs (`optimiser` is not
        used)."""
        return panel_structure_vbhc_minimum(divergences)

    def panel_rate_value(self, posterior, laws, variational, initial_state, times, intervention):
        optimiser = PANEL_VBHC_OPTIMISER if self.optimiser is None else self.optimiser
        value = panel_parameter_vbhc_minimum(
            posterior, laws, variational.keys, initial_state, times, intervention, optimiser
        )[0]
        if isinstance(posterior, RatePosterior):
            return value
        # a mixture is not in the Gamma family: the family is the Gammas and the posterior
        # itself, whose value is the BHC
        bhc = panel_parameter_bhc(
            posterior, laws, variational.at_posterior, initial_state, times, intervention
        )
        return jnp.minimum(value, bhc)


class BHC(AbstractBoxHillCriterion):
    r"""The Box-Hill criterion: the VBHC at $q$ = the posterior (maths §3, §4).

    **Arguments (keyword-only):** `estimator`, `graph_draws` and `max_sets` for structure
    learning, as for [`jaxctbn.VBHC`][]."""

    estimator: AbstractKLEstimator = eqx.field(default=PlugIn(), kw_only=True)
    graph_draws: AbstractGraphDraws = eqx.field(default=StratifiedGraphDraws(), kw_only=True)
    max_sets: int | None = eqx.field(default=None, static=True, kw_only=True)

    def __check_init__(self):
        _check_max_sets(self.max_sets)

    def rate_value(self, posterior, statistics):
        return parameter_bhc(posterior, statistics)

    def structure_value(self, posterior, divergences):
        return structure_bhc(posterior, divergences)

    def panel_structure_value(self, divergences):
        return panel_structure_bhc(divergences)

    def panel_rate_value(self, posterior, laws, variational, initial_state, times, intervention):
        return panel_parameter_bhc(
            posterior, laws, variational.at_posterior, initial_state, times, intervention
        )


_BOX_HILL_EMISSIONS = (
    "outcome: the Box-Hill criteria assume error-free visits; with Panel(emissions=...) "
    "(misclassified or unmeasured nodes) use the EIG."
)

_EIG_TIMES = (
    "outcome: the EIG cannot choose visit times (its Monte Carlo outcomes are not "
    "differentiable in them); give Panel(times=...) or choose the times with the BHC or VBHC."
)


def _emission(outcome: Panel, model, dtype):
    """The global emission matrix of a panel outcome's `emissions` (`None` without)."""
    if outcome.emissions is None:
        return None
    return global_emission_matrix(outcome.emissions, model, dtype)


class EIG(AbstractCriterion):
    r"""The expected information gain by Monte Carlo (maths §6): `num_paths` sampled paths per
    posterior draw, the same path keys for every candidate. For parameters by conjugacy without
    an inner loop ([`jaxctbn.criteria.parameter_eig`][]); for structure Algorithm 4 with the stratum
    weights ([`jaxctbn.criteria.structure_eig`][]), per node all candidates x draws x paths of a chunk
    of candidates in one sampling loop that keeps only the paths' statistics, and the chunks
    whose candidates all clamp the node skipped (default batching `Chunked(9)`, as for the
    other structure criteria).

    **Arguments (keyword-only):** `num_paths` (default 10), `max_events` (the most jumps a
    sampled path may have, a longer path raises an error; default 512 for parameters, where it
    is the jump buffer of each path, and 256 for structure, where no jumps are stored and its
    size hardly changes the cost)."""

    num_paths: int = eqx.field(default=10, static=True, kw_only=True)
    max_events: int | None = eqx.field(default=None, static=True, kw_only=True)
    num_inner: int = eqx.field(default=100, static=True, kw_only=True)

    def __check_init__(self):
        if self.num_paths < 1 or (self.max_events is not None and self.max_events < 1):
            raise ValueError(
                f"EIG: num_paths and max_events must be >= 1, got {self.num_paths}, "
                f"{self.max_events}."
            )
        if self.num_inner < 1:
            raise ValueError(f"EIG: num_inner must be >= 1, got {self.num_inner}.")

    def score_rates(
        self,
        posterior,
        candidates,
        initial_state,
        horizon,
        *,
        key,
        num_samples,
        solver,
        batching,
        outcome=COMPLETE_PATH,
    ):
        if isinstance(outcome, Panel):
            if outcome.times is None:
                raise ValueError(_EIG_TIMES)
            key_outer, key_inner, key_paths = jr.split(key, 3)
            draws = posterior_draws(posterior, key_outer, num_samples)
            inner = posterior_draws(posterior, key_inner, self.num_inner)
            times = outcome.visit_times(horizon, posterior.alpha[0].dtype)
            emission = _emission(outcome, draws, times.dtype)

            def panel_eig(iv):
                return panel_parameter_eig(
                    posterior,
                    draws,
                    inner,
                    initial_state,
                    times,
                    iv,
                    key=key_paths,
                    num_paths=self.num_paths,
                    emission=emission,
                )

            return (Vmap() if batching is None else batching).map(panel_eig, candidates)
        _check_complete_path(outcome)

        def eig(iv):
            return parameter_eig(
                posterior,
                initial_state,
                horizon,
                key=key,
                num_samples=num_samples,
                num_paths=self.num_paths,
                intervention=iv,
                max_events=self.max_events or 512,
            )

        return (Vmap() if batching is None else batching).map(eig, candidates)

    def score_structure(
        self,
        posterior,
        candidates,
        initial_state,
        horizon,
        *,
        key,
        num_samples,
        solver,
        batching,
        outcome=COMPLETE_PATH,
    ):
        if isinstance(outcome, Panel):
            if outcome.times is None:
                raise ValueError(_EIG_TIMES)
            key_draws, key_paths = jr.split(key)
            draws = panel_structure_eig_draws(posterior, key_draws, num_samples, self.num_inner)
            times = outcome.visit_times(horizon, posterior.dtype)
            emission = _emission(outcome, draws.models, times.dtype)

            def panel_eig(iv):
                return panel_structure_eig(
                    draws,
                    initial_state,
                    times,
                    iv,
                    key=key_paths,
                    num_paths=self.num_paths,
                    emission=emission,
                )

            return (Chunked(STRUCTURE_CHUNK) if batching is None else batching).map(
                panel_eig, candidates
            )
        _check_complete_path(outcome, "structure learning")
        _check_single_structure_posterior(posterior)
        key_draws, key_paths = jr.split(key)
        draws = structure_draws(posterior, key_draws, num_samples)
        return eig_all_candidates(
            posterior,
            draws,
            candidates,
            initial_state,
            horizon,
            key=key_paths,
            num_paths=self.num_paths,
            max_events=self.max_events or 256,
            batching=Chunked(STRUCTURE_CHUNK) if batching is None else batching,
        )


@eqx.filter_jit
def score_interventions(
    posterior: AbstractPosterior,
    candidates: Intervention,
    initial_state: ArrayLike,
    horizon: ArrayLike,
    *,
    criterion: AbstractCriterion = VBHC(),
    key: PRNGKeyArray,
    num_samples: int = 10,
    solver: StatisticsSolver = AUTOMATIC_SOLVER,
    batching: AbstractBatching | None = None,
    outcome: AbstractOutcome = COMPLETE_PATH,
) -> Float[Array, " candidates"]:
    r"""Score a batch of candidate interventions (leading axis) for the next experiment, as one
    compiled computation.

    **Arguments:**

    - `posterior`: a [`jaxctbn.RatePosterior`][] or [`jaxctbn.GammaMixturePosterior`][]
      (parameter learning; the mixture, what panel data leave, is scored by every criterion:
      in closed form where the Gamma is, with the VBHC's family the Gammas and the posterior
      itself for panel outcomes) or [`jaxctbn.StructurePosterior`][] (structure learning), or
      for panel outcomes a [`jaxctbn.StructureMixturePosterior`][] (what panels leave; its
      graphs and rates are drawn from the mixture; the complete-path structure criteria
      refuse it, see [`jaxctbn.StructureMixturePosterior.moment_matched`][]).
    - `candidates`: an [`jaxctbn.Intervention`][] with a leading axis, e.g. the whole
      [`jaxctbn.intervention_space`][].
    - `initial_state`, `horizon`: the next experiment's initial state and length $\tau$.
    - `criterion`: [`jaxctbn.VBHC`][] (default), [`jaxctbn.BHC`][], [`jaxctbn.EIG`][] or your own
      [`jaxctbn.AbstractCriterion`][].
    - `key`: the same key gives the same posterior draws and paths for every candidate (common
      random numbers), so differences between candidates are not sampling noise.
    - `num_samples`: posterior draws $N_S$ (per candidate parent set for structure learning).
    - `solver`: the master-equation solver.
    - `batching`: how the candidates are executed: [`jaxctbn.Vmap`][] or
      [`jaxctbn.Chunked`][]; default `Vmap()` for parameters and `Chunked(9)` for structure
      (whose scorer skips chunks that clamp a node; `Chunked(27)` for the (V)BHC with stratified
      draws on a CPU, which solves a chunk's candidates x draws as one batch, in groups of
      similar rate).
    - `outcome`: what the experiment reveals: [`jaxctbn.criteria.CompletePath`][] (default, the
      paper's) or [`jaxctbn.criteria.Panel`][] (the global state at a few visit times; maths
      §7; parameter learning with the BHC, VBHC and EIG).

    **Returns:** `(candidates,)` scores; the most informative candidate is the `argmax`.
    """
    if not isinstance(posterior, AbstractPosterior):
        raise TypeError(
            f"posterior: expected a RatePosterior or StructurePosterior, got {type(posterior)}."
        )
    if not isinstance(criterion, AbstractCriterion):
        raise TypeError(
            f"criterion: expected a jaxctbn criterion Module (VBHC(), BHC(), EIG()), got "
            f"{criterion!r}."
        )
    if not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}.")
    if not isinstance(outcome, AbstractOutcome):
        raise TypeError(
            f"outcome: expected CompletePath() or Panel(...) (jaxctbn.criteria), got {outcome!r}."
        )
    return posterior.score_with(
        criterion,
        candidates,
        initial_state,
        horizon,
        key=key,
        num_samples=num_samples,
        solver=solver,
        batching=batching,
        outcome=outcome,
    )


@eqx.filter_jit
def panel_design_scores(
    posterior: AbstractPosterior,
    candidates: Intervention,
    initial_state: ArrayLike,
    horizon: ArrayLike,
    *,
    outcome: Panel,
    criterion: AbstractCriterion = VBHC(),
    key: PRNGKeyArray,
    num_samples: int = 10,
    batching: AbstractBatching | None = None,
) -> PanelDesign:
    r"""[`jaxctbn.score_interventions`][] with a panel outcome, and what it chose: every
    candidate's score, its visit times (its own best times with `Panel(num_visits=K)`, from
    equal spacing; else the given times) and its score at equally spaced visits, as a
    [`jaxctbn.criteria.PanelDesign`][] (maths §7). Parameter or structure learning with
    [`jaxctbn.BHC`][] or [`jaxctbn.VBHC`][]; arguments as for `score_interventions`."""
    if not isinstance(
        posterior, AbstractRatePosterior | StructurePosterior | StructureMixturePosterior
    ):
        raise ValueError(
            "posterior: expected a RatePosterior, GammaMixturePosterior, StructurePosterior or "
            f"StructureMixturePosterior, got {type(posterior).__name__}."
        )
    if not isinstance(outcome, Panel):
        raise ValueError(f"outcome: expected a Panel(...), got {outcome!r}.")
    if not isinstance(criterion, AbstractBoxHillCriterion):
        raise ValueError(
            "criterion: panel designs with their visit times need the BHC or VBHC; the EIG "
            "scores given times through score_interventions."
        )
    if not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}.")
    if isinstance(posterior, StructurePosterior | StructureMixturePosterior):
        design = criterion.panel_design_structure
    else:
        design = criterion.panel_design_rates
    return design(
        posterior,  # pyright: ignore[reportArgumentType]  (the method matches the posterior)
        candidates,
        initial_state,
        horizon,
        key=key,
        num_samples=num_samples,
        batching=batching,
        outcome=outcome,
    )
