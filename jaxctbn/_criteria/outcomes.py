r"""What the next experiment reveals, as Modules passed to [`jaxctbn.score_interventions`][]
(`outcome=`) and held by a learning task: the paper's complete path of every node, or a
**panel**, the global state seen at a few times (maths §7).

An outcome owns what differs between them: which of a criterion's methods scores a candidate
(`score_rates`, `score_structure`, `batch_terms`, `batch_eig`: the outcome calls the
criterion's method for itself, e.g. `criterion.panel_rate_scores(..., outcome=self)`), the
visit times an experiment is seen at, and what the posterior update of the active-learning loop
sees (`initial_posterior`, `update_rates`, `update_structure`). A new outcome is one Module with
these methods; no code outside this module asks which outcome it holds.
"""

from __future__ import annotations

import abc
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._batching import AbstractBatching
from .._learning.family_statistics import family_statistics
from .._learning.posterior import AbstractRatePosterior
from .._learning.structure_mixture import StructureMixturePosterior
from .._learning.structure_posterior import StructurePosterior
from .._model.interventions import is_concrete
from .._panel.observations import Emissions, PanelObservations
from .._panel.outcome_law import checked_observation_times, global_emission_matrix
from .._panel.rate_posterior import panel_rate_posterior
from .._panel.structure_posterior import panel_structure_posterior
from .._paths.sampling import Trajectories
from .._paths.sufficient_statistics import SufficientStatistics
from .batch_terms import BatchTerms
from .panel_parameter import PanelDesign, optimise_visit_times


def _as_batch(path: Trajectories) -> Trajectories:
    return jax.tree_util.tree_map(lambda a: a[None], path)


class AbstractOutcome(eqx.Module):
    """What an experiment of length $\\tau$ reveals: [`jaxctbn.CompletePath`][] or
    [`jaxctbn.PanelOutcome`][].

    Scoring (`criterion` any [`jaxctbn.AbstractCriterion`][], the other arguments those of
    [`jaxctbn.score_interventions`][]): `score_rates` and `score_structure` return one score per
    candidate; `batch_terms` the quantities of [`jaxctbn.Batch`][] and `batch_eig` the
    EIG of one batch ([`jaxctbn.criteria.GivenBatch`][]). The loop: `visit_times`,
    `chooses_times`, `num_priced_visits`, `check_simulated`, `matches`, and the posterior
    updates `initial_posterior`, `update_rates`, `update_structure`."""

    @abc.abstractmethod
    def score_rates(
        self, criterion, posterior, candidates, initial_state, horizon, *, key, num_samples,
        solver, batching,
    ) -> Float[Array, " candidates"]:  # fmt: skip
        """Parameter learning's scores `(candidates,)` under this outcome."""

    @abc.abstractmethod
    def score_structure(
        self, criterion, posterior, candidates, initial_state, horizon, *, key, num_samples,
        solver, batching,
    ) -> Float[Array, " candidates"]:  # fmt: skip
        """Structure learning's scores `(candidates,)` under this outcome."""

    @abc.abstractmethod
    def batch_terms(
        self, criterion, posterior, candidates, initial_state, horizon, *, key, num_samples,
        solver, batching,
    ) -> BatchTerms:  # fmt: skip
        """How a batch's (V)BHC is built member by member under this outcome (maths §8)."""

    @abc.abstractmethod
    def batch_eig(
        self, criterion, posterior, members, initial_state, horizon, *, key, num_samples
    ) -> Float[Array, ""]:
        """The EIG of one batch of experiments under this outcome."""

    def design(
        self, criterion, posterior, candidates, initial_state, horizon, *, key, num_samples,
        batching,
    ) -> PanelDesign:  # fmt: skip
        """Every candidate's score and the visit times it is seen at
        (`score_interventions` with `PanelOutcome(num_visits=K)`): panel outcomes only."""
        raise ValueError(f"outcome: expected a PanelOutcome(...), got {self!r}.")

    @property
    @abc.abstractmethod
    def num_priced_visits(self) -> int:
        """The visits a [`jaxctbn.Costs`][] prices per experiment (0 for a complete path)."""

    @property
    def chooses_times(self) -> bool:
        """Whether a design chooses each experiment's visit times (`PanelOutcome(num_visits=K)`)."""
        return False

    def visit_times(self, horizon: ArrayLike, dtype) -> Float[Array, " visits"] | None:
        """The times an experiment of length `horizon` is seen at (`None`: all along)."""
        return None

    def check_simulated(self) -> None:
        """Raise a `ValueError` if the active-learning loop cannot simulate this outcome."""

    def matches(self, other: AbstractOutcome) -> bool:
        """Whether `other` is the same outcome (the same kind, and the same visit times where
        both are concrete)."""
        return type(self) is type(other)

    @abc.abstractmethod
    def posterior_family(self, family: Any) -> Any:
        """The posterior family of the loop's updates under this outcome: `None` where the
        update is conjugate (complete paths), else `family` (the task's panel family)."""

    @abc.abstractmethod
    def initial_posterior(self, posterior, *, family) -> Any:
        """The loop's posterior before any experiment, from the prior's `posterior` (in the
        task's panel `family` where the updates need one)."""

    @abc.abstractmethod
    def update_rates(
        self, posterior, path: Trajectories, *, family, observation_times, key
    ) -> AbstractRatePosterior:
        """The rate posterior after one simulated experiment `path`, as this outcome sees it."""

    @abc.abstractmethod
    def update_structure(
        self, posterior, path: Trajectories, *, family, observation_times, key
    ) -> StructurePosterior | StructureMixturePosterior:
        """The structure posterior after one simulated experiment `path`, as this outcome sees
        it."""


class CompletePath(AbstractOutcome):
    """Every node's whole path over $[0,\\tau]$: the paper's experiment (the default)."""

    def score_rates(
        self, criterion, posterior, candidates, initial_state, horizon, *, key, num_samples,
        solver, batching,
    ):  # fmt: skip
        return criterion.path_rate_scores(
            posterior, candidates, initial_state, horizon, key=key, num_samples=num_samples,
            solver=solver, batching=batching,
        )  # fmt: skip

    def score_structure(
        self, criterion, posterior, candidates, initial_state, horizon, *, key, num_samples,
        solver, batching,
    ):  # fmt: skip
        return criterion.path_structure_scores(
            posterior, candidates, initial_state, horizon, key=key, num_samples=num_samples,
            solver=solver, batching=batching,
        )  # fmt: skip

    def batch_terms(
        self, criterion, posterior, candidates, initial_state, horizon, *, key, num_samples,
        solver, batching,
    ):  # fmt: skip
        return criterion.path_batch_terms(
            posterior, candidates, initial_state, horizon, key=key, num_samples=num_samples,
            solver=solver, batching=batching,
        )  # fmt: skip

    def batch_eig(self, criterion, posterior, members, initial_state, horizon, *, key, num_samples):
        return criterion.path_batch_eig(
            posterior, members, initial_state, horizon, key=key, num_samples=num_samples
        )

    @property
    def num_priced_visits(self) -> int:
        return 0

    def posterior_family(self, family):
        return None

    def initial_posterior(self, posterior, *, family):
        return posterior

    def update_rates(self, posterior, path, *, family, observation_times, key):
        stats = SufficientStatistics.from_trajectories(
            _as_batch(path), posterior.cardinalities, posterior.parents
        )
        return posterior.update(stats.pooled())

    def update_structure(self, posterior, path, *, family, observation_times, key):
        new = family_statistics(_as_batch(path), posterior.cardinalities, posterior.parent_sets)
        return posterior.update(new)


class PanelOutcome(AbstractOutcome):
    r"""The experiment's global state seen at $0<t_1<\dots<t_K\le\tau$ (maths §7): every node
    measured at each visit (without error unless `emissions` say otherwise), nothing in
    between; the state at time 0 is the experiment's initial state (set, hence known).

    **Arguments:**

    - `times`: the visit times `(K,)`, finite, $>0$, strictly increasing and at most the
      horizon (the shape is checked here, the values inside jit);
    - or `num_visits` (keyword-only): $K$ visits whose times the criterion chooses, per
      candidate, to maximise its score (maths §7): Adam ascent (`steps`, `learning_rate`, on
      the logits of the gaps) from equal spacing $t_k=\tau k/K$ with the posterior draws held
      fixed; the better of the search's best point and equal spacing is kept, so the score is
      never below the equally spaced one. The Box-Hill criteria only (the EIG's Monte Carlo
      outcomes are not differentiable in the times).
    - `emissions` (keyword-only): a [`jaxctbn.panel.Emissions`][] of per-node
      misclassification matrices $E_n(x,y)=p(y\mid x)$; a node that is not measured has the
      `(k, 1)` matrix of ones. Scored by the [`jaxctbn.EIG`][] (the recorded symbols'
      likelihoods by the forward filter, maths §7) at given times; the Box-Hill criteria and
      the active-learning loop refuse it (their panel divergences and updates assume error-free
      visits).
    """

    times: Float[Array, " visits"] | None
    num_visits: int | None = eqx.field(static=True)
    steps: int = eqx.field(static=True)
    learning_rate: float = eqx.field(static=True)
    emissions: Emissions | None

    def __init__(
        self,
        times: ArrayLike | None = None,
        *,
        num_visits: int | None = None,
        steps: int = 30,
        learning_rate: float = 0.1,
        emissions: Emissions | None = None,
    ):
        if emissions is not None and not isinstance(emissions, Emissions):
            raise ValueError(
                f"emissions: expected None or a jaxctbn.panel.Emissions, got {emissions!r}."
            )
        self.emissions = emissions
        if (times is None) == (num_visits is None):
            raise ValueError(
                "PanelOutcome: give the visit `times` or `num_visits`, not both or neither."
            )
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps: expected an integer >= 1, got {steps!r}.")
        if not (isinstance(learning_rate, int | float) and learning_rate > 0):
            raise ValueError(f"learning_rate: expected a number > 0, got {learning_rate!r}.")
        self.steps, self.learning_rate = int(steps), float(learning_rate)
        if num_visits is not None:
            if isinstance(num_visits, bool) or not isinstance(num_visits, int | np.integer):
                raise ValueError(f"num_visits: expected an integer >= 1, got {num_visits!r}.")
            if num_visits < 1:
                raise ValueError(f"num_visits: expected an integer >= 1, got {num_visits}.")
            self.times, self.num_visits = None, int(num_visits)
            return
        times = jnp.asarray(times)
        if times.ndim != 1 or times.shape[0] < 1:
            raise ValueError(
                f"times: expected one or more visit times, shape (K,), got {times.shape}."
            )
        if is_concrete(times):
            t = np.asarray(times, float)
            if not np.all(np.isfinite(t)) or np.any(t <= 0) or np.any(np.diff(t) <= 0):
                raise ValueError(
                    f"times: visit times must be finite, > 0 and strictly increasing, got "
                    f"{t.tolist()}."
                )
        if not jnp.issubdtype(times.dtype, jnp.floating):
            times = times.astype(float)
        self.times, self.num_visits = times, None

    @property
    def size(self) -> int:
        """The number of visits $K$."""
        if self.times is None:
            assert self.num_visits is not None
            return self.num_visits
        return int(self.times.shape[0])

    def equally_spaced(self, horizon: ArrayLike, dtype) -> Float[Array, " visits"]:
        """$t_k=\tau k/K$, $k=1..K$."""
        K = self.size
        return jnp.asarray(horizon, dtype) * jnp.arange(1, K + 1, dtype=dtype) / K

    def visit_times(self, horizon: ArrayLike, dtype) -> Float[Array, " visits"]:
        """The given visit times, checked inside jit (finite, increasing, in $(0,\tau]$); equally
        spaced ones with `num_visits`."""
        if self.times is None:
            return self.equally_spaced(horizon, dtype)
        return checked_observation_times(self.times, dtype, horizon)

    def score_rates(
        self, criterion, posterior, candidates, initial_state, horizon, *, key, num_samples,
        solver, batching,
    ):  # fmt: skip
        return criterion.panel_rate_scores(
            posterior, candidates, initial_state, horizon, key=key, num_samples=num_samples,
            batching=batching, outcome=self,
        )  # fmt: skip

    def score_structure(
        self, criterion, posterior, candidates, initial_state, horizon, *, key, num_samples,
        solver, batching,
    ):  # fmt: skip
        return criterion.panel_structure_scores(
            posterior, candidates, initial_state, horizon, key=key, num_samples=num_samples,
            batching=batching, outcome=self,
        )  # fmt: skip

    def batch_terms(
        self, criterion, posterior, candidates, initial_state, horizon, *, key, num_samples,
        solver, batching,
    ):  # fmt: skip
        if self.times is None or self.emissions is not None:
            raise ValueError(
                "outcome: panel batches are scored at given visit times without emissions "
                "(PanelOutcome(times)); choosing each member's times is not supported yet."
            )
        return criterion.panel_batch_terms(
            posterior, candidates, initial_state, horizon, key=key, num_samples=num_samples,
            batching=batching, outcome=self,
        )  # fmt: skip

    def batch_eig(self, criterion, posterior, members, initial_state, horizon, *, key, num_samples):
        raise ValueError(
            "outcome: the EIG of a batch is computed for complete paths; score panel batches "
            "with the BHC or VBHC (PanelOutcome(times)), or one panel experiment's EIG with "
            "score_interventions."
        )

    def design(
        self, criterion, posterior, candidates, initial_state, horizon, *, key, num_samples,
        batching,
    ):  # fmt: skip
        if isinstance(posterior, StructurePosterior | StructureMixturePosterior):
            method = criterion.panel_design_structure
        else:
            method = criterion.panel_design_rates
        return method(
            posterior, candidates, initial_state, horizon, key=key, num_samples=num_samples,
            batching=batching, outcome=self,
        )  # fmt: skip

    def scores_and_times(
        self,
        candidates,
        horizon: Array,
        batching: AbstractBatching,
        value,
        surrogate,
        refine,
        carry0,
    ) -> PanelDesign:
        """Every candidate's panel score `value(iv, times)`: at the given times, or at its own
        best times (the search ascends `surrogate(iv, times, carry)`, `carry` updated by
        `refine` before each step, from `carry0`), kept only where better than equal spacing
        (maths §7)."""
        if self.emissions is not None:
            raise ValueError(BOX_HILL_EMISSIONS)
        dtype = horizon.dtype

        def one(iv):
            if self.times is not None:
                times = self.visit_times(horizon, dtype)
                v = value(iv, times)
                return v, times, v
            best = optimise_visit_times(
                lambda times, carry: surrogate(iv, times, carry),
                lambda times, carry: refine(iv, times, carry),
                carry0,
                horizon,
                self.size,
                steps=self.steps,
                learning_rate=self.learning_rate,
            )
            equal = self.equally_spaced(horizon, dtype)
            v_best, v_equal = jax.vmap(lambda times: value(iv, times))(jnp.stack([best, equal]))
            pick = jnp.isfinite(v_best) & (v_best > v_equal)
            return jnp.where(pick, v_best, v_equal), jnp.where(pick, best, equal), v_equal

        scores, times, equal_scores = batching.map(one, candidates)
        return PanelDesign(scores=scores, times=times, equally_spaced_scores=equal_scores)

    def emission_matrix(self, model, dtype) -> Array | None:
        """The global emission matrix of `emissions` for `model` (`None` without)."""
        if self.emissions is None:
            return None
        return global_emission_matrix(self.emissions, model, dtype)

    @property
    def num_priced_visits(self) -> int:
        return self.size

    @property
    def chooses_times(self) -> bool:
        return self.times is None

    def check_simulated(self) -> None:
        if self.emissions is not None:
            raise ValueError(
                "outcome: the loop simulates error-free visits; PanelOutcome(emissions=...) is for "
                "scoring with the EIG (score_interventions)."
            )

    def matches(self, other: AbstractOutcome) -> bool:
        if not isinstance(other, PanelOutcome) or other.num_visits != self.num_visits:
            return False
        if self.times is None or other.times is None or not is_concrete(self.times, other.times):
            return True
        a, b = np.asarray(self.times), np.asarray(other.times)
        return a.shape == b.shape and bool(np.allclose(a, b, rtol=1e-12, atol=0))

    def posterior_family(self, family):
        return family

    def initial_posterior(self, posterior, *, family):
        return family.initial(posterior)

    def observed(self, path: Trajectories, dtype, observation_times) -> PanelObservations:
        """The simulated `path` seen at time 0 and at the visit times: `observation_times`
        (the experiment's own, chosen by the design; required with `PanelOutcome(num_visits=K)`) or
        the given times."""
        if observation_times is None:
            if self.times is None:
                raise ValueError(
                    "observation_times: the task observes PanelOutcome(num_visits="
                    f"{self.num_visits}), so each update needs the experiment's visit times."
                )
            times = self.visit_times(path.durations, dtype)
        else:
            times = jnp.asarray(observation_times, dtype)
            if times.shape != (self.size,):
                raise ValueError(
                    f"observation_times: expected the experiment's {self.size} visit times, "
                    f"shape ({self.size},), got {times.shape}."
                )
            times = checked_observation_times(times, dtype, path.durations)
        return PanelObservations.from_paths(
            _as_batch(path), jnp.concatenate([jnp.zeros((1,), dtype), times])
        )

    def update_rates(self, posterior, path, *, family, observation_times, key):
        observations = self.observed(path, posterior.beta[0].dtype, observation_times)
        return panel_rate_posterior(posterior, observations, family=family, key=key)

    def update_structure(self, posterior, path, *, family, observation_times, key):
        observations = self.observed(path, posterior.dtype, observation_times)
        return panel_structure_posterior(posterior, observations, family=family, key=key)


#: The default outcome: the paper's complete path of every node.
COMPLETE_PATH = CompletePath()

BOX_HILL_EMISSIONS = (
    "outcome: the Box-Hill criteria assume error-free visits; with PanelOutcome(emissions=...) "
    "(misclassified or unmeasured nodes) use the EIG."
)


def check_outcome(outcome, *, error: type[Exception] = TypeError) -> None:
    """Raise `error` unless `outcome` is an outcome Module."""
    if not isinstance(outcome, AbstractOutcome):
        raise error(f"outcome: expected CompletePath() or PanelOutcome(...), got {outcome!r}.")
