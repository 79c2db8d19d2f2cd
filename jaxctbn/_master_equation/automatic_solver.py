r"""[`jaxctbn.AutomaticSolver`][], the default solver of the expected statistics: exact up to a
number of global states, approximate beyond; and `resolve_solver`, which says
what a solver stands for on a model."""

from __future__ import annotations

import math
from typing import Any

import equinox as eqx
import numpy as np

from .._model.ctbn import AbstractCTBN
from .mean_field import MeanField
from .solver import (
    AbstractApproximateSolver,
    AbstractMasterEquationSolver,
    AbstractStatisticsSolver,
    StatisticsSolver,
)
from .uniformisation import Uniformisation


class AutomaticSolver(AbstractStatisticsSolver):
    r"""The solver of the expected statistics chosen by the size of the network: the exact
    solver `exact` while the global state space $S=\prod_n k_n$ has at most
    `max_global_states` states, the approximate solver `approximate` beyond (default
    [`jaxctbn.MeanField`][]). The default `solver` of [`jaxctbn.expected_statistics`][], the
    design criteria and the active-learning loop; the choice is static (the cardinalities are),
    so it costs nothing under `jax.jit`, and `resolve_solver` says which one a model
    gets.

    The threshold, $2^{14}=16384$ states (14 binary nodes), is where the exact design step
    stops being practical on a CPU (the uniformisation works on vectors of $S$ entries per
    candidate, posterior draw and parameter; `benchmarks/master_equation/bench_master_equation.py`), and where
    the mean-field error measured in `benchmarks/master_equation/bench_mean_field.py` (node statistics within
    ~10% median, intervention rankings with Spearman $\rho\ge0.93$ against exact at
    N = 4-12) is the price of going on. Override it, or pass a concrete solver, to choose
    yourself.

    **Arguments (keyword-only):** `exact` (default [`jaxctbn.Uniformisation`][]),
    `approximate` (default `None` = [`jaxctbn.MeanField`][]`()`), `max_global_states`
    (static, >= 1)."""

    exact: AbstractMasterEquationSolver = eqx.field(default=Uniformisation(), kw_only=True)
    approximate: AbstractApproximateSolver | None = eqx.field(default=None, kw_only=True)
    max_global_states: int = eqx.field(default=2**14, static=True, kw_only=True)

    def __check_init__(self):
        if (
            not isinstance(self.max_global_states, int | np.integer)
            or isinstance(self.max_global_states, bool)
            or self.max_global_states < 1
        ):
            raise ValueError(
                "AutomaticSolver: max_global_states must be an integer >= 1, got "
                f"{self.max_global_states!r}."
            )
        if not isinstance(self.exact, AbstractMasterEquationSolver):
            raise ValueError(
                "AutomaticSolver: exact must be an exact master-equation solver "
                f"(AbstractMasterEquationSolver), got {type(self.exact).__name__}."
            )
        if self.approximate is not None and not isinstance(
            self.approximate, AbstractApproximateSolver
        ):
            raise ValueError(
                "AutomaticSolver: approximate must be an AbstractApproximateSolver or None, got "
                f"{type(self.approximate).__name__}."
            )

    def resolve(self, model) -> AbstractMasterEquationSolver | AbstractApproximateSolver:
        """`exact` (checked against the state space it handles) while `model` has at most
        `max_global_states` global states, else `approximate` (`None`: `MeanField()`)."""
        if math.prod(model.cardinalities) <= self.max_global_states:
            return self.exact.resolve(model)
        if self.approximate is not None:
            return self.approximate
        return MeanField()

    def sized(self, model, horizon, intervention) -> AbstractStatisticsSolver:
        """The resolved solver's `sized`."""
        return self.resolve(model).sized(model, horizon, intervention)

    def solve_statistics(self, model, initial_state, horizon, intervention) -> Any:
        """The resolved solver's `solve_statistics`."""
        return self.resolve(model).solve_statistics(model, initial_state, horizon, intervention)

    def solve_statistics_batch(self, models, initial_state, horizon, interventions) -> Any:
        """The resolved solver's `solve_statistics_batch`."""
        return self.resolve(models).solve_statistics_batch(
            models, initial_state, horizon, interventions
        )


AUTOMATIC_SOLVER = AutomaticSolver()


def resolve_solver(
    solver: StatisticsSolver, model: AbstractCTBN
) -> AbstractMasterEquationSolver | AbstractApproximateSolver:
    """The solver that `solver` stands for on `model`: an [`jaxctbn.AutomaticSolver`][] gives
    its exact solver while `model` has at most `max_global_states` global states, else its
    approximate one (default [`jaxctbn.MeanField`][]); any other solver is itself."""
    return solver.resolve(model)
