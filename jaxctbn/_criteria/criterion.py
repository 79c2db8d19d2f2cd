r"""The design criterion's base: one score per candidate intervention for each learning target,
computed by the method the outcome names (see `outcomes.py`). The (V)BHC are in `box_hill.py`,
the EIG in `eig.py`, the verb that scores candidates in `scoring.py`."""

from __future__ import annotations

import abc

import equinox as eqx
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._batching import AbstractBatching
from .._learning.posterior import AbstractRatePosterior
from .._learning.structure_mixture import StructureMixturePosterior
from .._learning.structure_posterior import StructurePosterior
from .._master_equation import StatisticsSolver
from .._model.interventions import Intervention
from .outcomes import COMPLETE_PATH, AbstractOutcome


def check_max_sets(max_sets) -> None:
    if max_sets is not None and (
        not isinstance(max_sets, int) or isinstance(max_sets, bool) or max_sets < 1
    ):
        raise ValueError(f"max_sets: expected None or a positive integer, got {max_sets!r}.")


def _unsupported(criterion, outcome, target: str):
    return ValueError(
        f"outcome: {type(outcome).__name__} outcomes are not supported for {target} by "
        f"{type(criterion).__name__}; use CompletePath() or PanelOutcome(...)."
    )


class AbstractCriterion(eqx.Module):
    """A design criterion: one score per candidate intervention for each learning target.

    `score_rates` and `score_structure` receive the posterior, a batch of `candidates` (an
    [`jaxctbn.Intervention`][] with a leading axis), the `initial_state` and `horizon` of the
    next experiment, and keyword-only `key`, `num_samples` (posterior draws $N_S$), `solver`,
    `batching` and `outcome` (what the experiment reveals, a
    [`jaxctbn.AbstractOutcome`][]). They return `(candidates,)` scores, larger = more
    informative, computed with the same random numbers for every candidate (common random
    numbers). `batching=None` means the target's default.

    The outcome decides which method computes them: a new criterion implements
    `path_rate_scores` and `path_structure_scores` (complete paths, the same arguments less
    `outcome`) and, for panel outcomes, `panel_rate_scores` and `panel_structure_scores`
    (keyword-only `key`, `num_samples`, `batching`, `outcome`); a criterion that does not
    support an outcome raises a `ValueError` naming it."""

    def score_rates(
        self,
        posterior: AbstractRatePosterior,
        candidates: Intervention,
        initial_state: ArrayLike,
        horizon: ArrayLike,
        *,
        key: PRNGKeyArray,
        num_samples: int,
        solver: StatisticsSolver,
        batching: AbstractBatching | None,
        outcome: AbstractOutcome = COMPLETE_PATH,
    ) -> Float[Array, " candidates"]:
        """Scores for active parameter learning."""
        return outcome.score_rates(
            self, posterior, candidates, initial_state, horizon, key=key,
            num_samples=num_samples, solver=solver, batching=batching,
        )  # fmt: skip

    def score_structure(
        self,
        posterior: StructurePosterior | StructureMixturePosterior,
        candidates: Intervention,
        initial_state: ArrayLike,
        horizon: ArrayLike,
        *,
        key: PRNGKeyArray,
        num_samples: int,
        solver: StatisticsSolver,
        batching: AbstractBatching | None,
        outcome: AbstractOutcome = COMPLETE_PATH,
    ) -> Float[Array, " candidates"]:
        """Scores for active structure learning."""
        return outcome.score_structure(
            self, posterior, candidates, initial_state, horizon, key=key,
            num_samples=num_samples, solver=solver, batching=batching,
        )  # fmt: skip

    @abc.abstractmethod
    def path_rate_scores(
        self, posterior, candidates, initial_state, horizon, *, key, num_samples, solver,
        batching,
    ) -> Float[Array, " candidates"]:  # fmt: skip
        """Parameter learning's scores when the experiment reveals complete paths."""

    @abc.abstractmethod
    def path_structure_scores(
        self, posterior, candidates, initial_state, horizon, *, key, num_samples, solver,
        batching,
    ) -> Float[Array, " candidates"]:  # fmt: skip
        """Structure learning's scores when the experiment reveals complete paths."""

    def panel_rate_scores(
        self, posterior, candidates, initial_state, horizon, *, key, num_samples, batching,
        outcome,
    ) -> Float[Array, " candidates"]:  # fmt: skip
        """Parameter learning's scores when the experiment reveals a panel `outcome`."""
        raise _unsupported(self, outcome, "parameter learning")

    def panel_structure_scores(
        self, posterior, candidates, initial_state, horizon, *, key, num_samples, batching,
        outcome,
    ) -> Float[Array, " candidates"]:  # fmt: skip
        """Structure learning's scores when the experiment reveals a panel `outcome`."""
        raise _unsupported(self, outcome, "structure learning")
