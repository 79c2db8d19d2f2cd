r"""The Box-Hill family (maths §3, §4, §7, §8): [`jaxctbn.VBHC`][], the variational Box-Hill
criterion, minimised in closed form (default) or by an `optimiser` ([`jaxctbn.LBFGS`][],
[`jaxctbn.Adam`][]) with autodiff gradients; [`jaxctbn.BHC`][], the VBHC at $q$ = the posterior.
The structure (V)BHC also takes a KL `estimator` ([`jaxctbn.PlugIn`][] or
[`jaxctbn.MonteCarlo`][]); the parameter (V)BHC is exact."""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._batching import AbstractBatching, Chunked, Vmap
from .._learning.optimisers import AbstractVBHCOptimiser
from .._learning.posterior import AbstractRatePosterior, RatePosterior
from .._learning.structure_mixture import StructureMixturePosterior
from .._learning.structure_posterior import StructurePosterior
from .._model.interventions import Intervention
from .batch_terms import (
    BatchTerms,
    panel_batch_terms,
    path_batch_terms,
)
from .chunks import STRUCTURE_CHUNK, structure_batching
from .criterion import AbstractCriterion, check_max_sets
from .kl_estimators import AbstractKLEstimator, PlugIn, RateCoupling
from .node_divergences import check_single_structure_posterior
from .outcomes import PanelOutcome
from .panel_parameter import (
    PANEL_VBHC_OPTIMISER,
    PanelDesign,
    Variational,
    draw_laws,
    panel_parameter_bhc,
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
    panel_structure_vbhc_minimum,
)
from .parameter import (
    design_statistics,
    parameter_bhc,
    parameter_vbhc_minimise,
    parameter_vbhc_minimum,
    posterior_draws,
)
from .structure import (
    AbstractGraphDraws,
    StratifiedGraphDraws,
    structure_bhc,
    structure_vbhc_minimise,
    structure_vbhc_minimum,
)


class AbstractBoxHillCriterion(AbstractCriterion):
    """A criterion computed from posterior-averaged expected statistics (parameters) or from
    the divergences $a_n(P')$ (structure): the (V)BHC family. Subclasses say how a value follows
    from those (`rate_value`, `structure_value`, and for panel outcomes `panel_rate_value`,
    `panel_structure_value`); the scoring, the panel designs with their visit times and the
    batches' terms are shared."""

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

    def path_rate_scores(
        self, posterior, candidates, initial_state, horizon, *, key, num_samples, solver,
        batching,
    ):  # fmt: skip
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

    def path_structure_scores(
        self, posterior, candidates, initial_state, horizon, *, key, num_samples, solver,
        batching,
    ):  # fmt: skip
        check_single_structure_posterior(posterior)
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
            batching=structure_batching(self.graph_draws) if batching is None else batching,
        )
        return jax.vmap(lambda a: self.structure_value(posterior, a))(a_all)

    def panel_rate_scores(
        self, posterior, candidates, initial_state, horizon, *, key, num_samples, batching,
        outcome,
    ):  # fmt: skip
        return self.panel_design_rates(
            posterior, candidates, initial_state, horizon, key=key, num_samples=num_samples,
            batching=batching, outcome=outcome,
        ).scores  # fmt: skip

    def panel_structure_scores(
        self, posterior, candidates, initial_state, horizon, *, key, num_samples, batching,
        outcome,
    ):  # fmt: skip
        return self.panel_design_structure(
            posterior, candidates, initial_state, horizon, key=key, num_samples=num_samples,
            batching=batching, outcome=outcome,
        ).scores  # fmt: skip

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
        outcome: PanelOutcome,
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

        return outcome.scores_and_times(
            candidates,
            horizon,
            Vmap() if batching is None else batching,
            value,
            surrogate,
            refine,
            posterior_log_kappa(posterior),
        )

    def panel_design_structure(
        self,
        posterior: StructurePosterior | StructureMixturePosterior,
        candidates: Intervention,
        initial_state: ArrayLike,
        horizon: ArrayLike,
        *,
        key: PRNGKeyArray,
        num_samples: int,
        batching: AbstractBatching | None,
        outcome: PanelOutcome,
    ) -> PanelDesign:
        """Structure learning's [`PanelDesign`][jaxctbn.criteria.PanelDesign]: the panel
        divergences of `panel_structure_draws` (graphs at their
        posterior-mean rates with `PlugIn()`, coupled rate draws with `RateCoupling()`; maths
        §7), the visit times ascended on the criterion itself."""
        draws, horizon, posterior = self.panel_structure_setup(posterior, key, num_samples, horizon)

        def value(iv, times):
            divergences = panel_structure_divergences(draws, initial_state, times, iv)
            return self.panel_structure_value(divergences)

        return outcome.scores_and_times(
            candidates,
            horizon,
            Chunked(STRUCTURE_CHUNK) if batching is None else batching,
            value,
            lambda iv, times, carry: value(iv, times),
            lambda iv, times, carry: carry,
            jnp.zeros((), horizon.dtype),
        )

    def panel_structure_setup(self, posterior, key, num_samples, horizon):
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

    def path_batch_terms(
        self, posterior, candidates, initial_state, horizon, *, key, num_samples, solver,
        batching,
    ) -> BatchTerms:  # fmt: skip
        """How a batch of complete-path experiments' criterion is built member by member
        (maths §8)."""
        return path_batch_terms(
            self, posterior, candidates, initial_state, horizon, key, num_samples, solver,
            batching,
        )  # fmt: skip

    def panel_batch_terms(
        self, posterior, candidates, initial_state, horizon, *, key, num_samples, batching,
        outcome,
    ) -> BatchTerms:  # fmt: skip
        """The same for panel experiments at given visit times (maths §7, §8)."""
        return panel_batch_terms(
            self, posterior, candidates, initial_state, horizon, key, num_samples, batching,
            outcome,
        )  # fmt: skip


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
        check_max_sets(self.max_sets)

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

    def panel_batch_terms(
        self, posterior, candidates, initial_state, horizon, *, key, num_samples, batching,
        outcome,
    ):  # fmt: skip
        if isinstance(posterior, AbstractRatePosterior):
            raise ValueError(
                "criterion: panel batches for parameter learning take the BHC (the sum of the "
                "members' panel BHC); the panel VBHC's numerical minimum has no batch form yet."
            )
        return super().panel_batch_terms(
            posterior, candidates, initial_state, horizon, key=key, num_samples=num_samples,
            batching=batching, outcome=outcome,
        )  # fmt: skip

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
        check_max_sets(self.max_sets)

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
