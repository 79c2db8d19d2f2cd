r"""The verb that scores candidate interventions, and its panel form with the chosen visit times.

[`jaxctbn.score_interventions`][] scores a batch of candidates for whatever the posterior learns:
the rates of a known graph ([`jaxctbn.RatePosterior`][], active parameter learning) or the graph
([`jaxctbn.StructurePosterior`][], active structure learning). The criterion is a Module:

- [`jaxctbn.VBHC`][]: the variational Box-Hill criterion, minimised in closed form (default) or
  by an `optimiser` ([`jaxctbn.LBFGS`][], [`jaxctbn.Adam`][]) with autodiff gradients;
- [`jaxctbn.BHC`][]: the Box-Hill criterion (the VBHC at $q$ = the posterior);
- [`jaxctbn.EIG`][]: the expected information gain by Monte Carlo over sampled paths.

The structure (V)BHC also takes a KL `estimator` ([`jaxctbn.PlugIn`][] or
[`jaxctbn.MonteCarlo`][]); the parameter (V)BHC is exact. The posterior decides which of the
criterion's two methods runs (`score_rates` or `score_structure`) and the outcome which of
their forms (complete paths or panels), so a new criterion is one class with those methods
(see [`jaxctbn.AbstractCriterion`][]). Larger scores are more informative (the paper's
$\arg\max_i\min_\kappa\mathrm{VBHC}$); the paper's "negative VBHC" control is the `argmin`.
"""

from __future__ import annotations

import equinox as eqx
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._batching import AbstractBatching
from .._learning.posterior import AbstractPosterior, AbstractRatePosterior
from .._learning.structure_mixture import StructureMixturePosterior
from .._learning.structure_posterior import StructurePosterior
from .._master_equation import AUTOMATIC_SOLVER, StatisticsSolver
from .._model.interventions import Intervention
from .box_hill import VBHC, AbstractBoxHillCriterion
from .criterion import AbstractCriterion
from .outcomes import COMPLETE_PATH, AbstractOutcome, check_outcome
from .panel_parameter import (
    PanelDesign,
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
    - `outcome`: what the experiment reveals: [`jaxctbn.CompletePath`][] (default, the
      paper's) or [`jaxctbn.PanelOutcome`][] (the global state at a few visit times; maths
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
    check_outcome(outcome)
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
    outcome: AbstractOutcome,
    criterion: AbstractCriterion = VBHC(),
    key: PRNGKeyArray,
    num_samples: int = 10,
    batching: AbstractBatching | None = None,
) -> PanelDesign:
    r"""[`jaxctbn.score_interventions`][] with a panel outcome, and what it chose: every
    candidate's score, its visit times (its own best times with `PanelOutcome(num_visits=K)`, from
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
    check_outcome(outcome)
    if not isinstance(criterion, AbstractBoxHillCriterion):
        raise ValueError(
            "criterion: panel designs with their visit times need the BHC or VBHC; the EIG "
            "scores given times through score_interventions."
        )
    if not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}.")
    return outcome.design(
        criterion, posterior, candidates, initial_state, horizon, key=key,
        num_samples=num_samples, batching=batching,
    )  # fmt: skip
