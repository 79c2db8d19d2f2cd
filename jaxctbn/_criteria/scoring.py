r"""The one verb that answers every design question: which candidate intervention to run next,
with what strengths, at which visit times, and which batch to run together.

[`jaxctbn.score_interventions`][] scores a batch of candidates for whatever the posterior learns:
the rates of a known graph ([`jaxctbn.RatePosterior`][], active parameter learning) or the graph
([`jaxctbn.StructurePosterior`][], active structure learning). Each choice is a Module:

- the criterion: [`jaxctbn.VBHC`][] (the variational Box-Hill criterion, minimised in closed
  form by default or by an `optimiser`, [`jaxctbn.LBFGS`][] or [`jaxctbn.Adam`][], with
  autodiff gradients), [`jaxctbn.BHC`][] (the VBHC at $q$ = the posterior) or
  [`jaxctbn.EIG`][] (the expected information gain by Monte Carlo over sampled paths); the
  structure (V)BHC also takes a KL `estimator` ([`jaxctbn.PlugIn`][] or
  [`jaxctbn.MonteCarlo`][]);
- the outcome: [`jaxctbn.CompletePath`][] or [`jaxctbn.PanelOutcome`][] (given visit times, or
  `num_visits` whose times are chosen per candidate);
- the question beyond one experiment: `batch=` ([`jaxctbn.Batch`][]: choose several to run
  together, with costs and a budget; [`jaxctbn.criteria.GivenBatch`][]: the value of the
  candidates run together) or `strengths=` ([`jaxctbn.criteria.Strengths`][]: each candidate's
  best rate scales; [`jaxctbn.criteria.UncertainStrength`][]: a drug of uncertain effect).

The posterior decides which of the criterion's methods runs (`score_rates` or
`score_structure`) and the outcome which of their forms (complete paths or panels), so a new
criterion is one class with those methods (see [`jaxctbn.AbstractCriterion`][]). Larger scores
are more informative (the paper's $\arg\max_i\min_\kappa\mathrm{VBHC}$); the paper's "negative
VBHC" control is the `argmin`.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._batching import AbstractBatching
from .._learning.posterior import AbstractPosterior
from .._master_equation import AUTOMATIC_SOLVER, StatisticsSolver
from .._model.interventions import Intervention
from .batches import AbstractBatchQuestion
from .box_hill import VBHC, AbstractBoxHillCriterion
from .criterion import AbstractCriterion
from .outcomes import COMPLETE_PATH, AbstractOutcome, check_outcome
from .strengths import AbstractStrengthQuestion


def candidate_scores(
    posterior: AbstractPosterior,
    candidates: Intervention,
    initial_state: ArrayLike,
    horizon: ArrayLike,
    *,
    criterion: AbstractCriterion,
    key: PRNGKeyArray,
    num_samples: int,
    solver: StatisticsSolver,
    batching: AbstractBatching | None,
    outcome: AbstractOutcome,
) -> Float[Array, " candidates"]:
    """One score per candidate (the arguments checked by the caller): what
    [`jaxctbn.score_interventions`][] returns for a single experiment, and what the strength
    questions and the designs score with."""
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


def check_scoring(posterior, criterion, num_samples, outcome) -> None:
    """The structure checks shared by every design question: one line each."""
    if not isinstance(posterior, AbstractPosterior):
        raise TypeError(
            f"posterior: expected a RatePosterior or StructurePosterior, got {type(posterior)}."
        )
    if not isinstance(criterion, AbstractCriterion):
        raise TypeError(
            f"criterion: expected a jaxctbn criterion Module (VBHC(), BHC(), EIG()), got "
            f"{criterion!r}."
        )
    if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}.")
    check_outcome(outcome)


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
    batch: AbstractBatchQuestion | None = None,
    strengths: AbstractStrengthQuestion | None = None,
) -> Any:
    r"""Score candidate interventions (leading axis) for the next experiment, or answer a design
    question about them, as one compiled computation.

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
    - `initial_state`, `horizon`: the next experiment's initial state and length $\tau$ (a
      batch may give one initial state per member, `(size, N)`).
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
      §7; parameter learning with the BHC, VBHC and EIG, structure learning with all three at
      given times).
    - `batch`: several experiments run in parallel (maths §8): [`jaxctbn.Batch`][] chooses
      `size` of the candidates greedily (with costs, a budget and a ranking; the BHC or VBHC);
      [`jaxctbn.criteria.GivenBatch`][] scores the candidates as one batch.
    - `strengths`: the candidates' rate scales as a design variable:
      [`jaxctbn.criteria.Strengths`][] finds each candidate's best scales in a range (the BHC
      or VBHC, by gradient ascent through the master equation);
      [`jaxctbn.criteria.UncertainStrength`][] averages over a drug's uncertain strength.

    **Returns** what the question chose, with the scores:

    | question | returns |
    |---|---|
    | one experiment (default, or a panel at given times) | `(candidates,)` scores |
    | `outcome=PanelOutcome(num_visits=K)` (the Box-Hill criteria) | [`jaxctbn.criteria.PanelDesign`][]: scores and each candidate's visit times |
    | `batch=Batch(size, ...)` | [`jaxctbn.criteria.BatchDesign`][]: the members and their gains |
    | `batch=GivenBatch()` | the batch's score, a scalar |
    | `strengths=Strengths(...)` | [`jaxctbn.criteria.StrengthDesign`][]: scores and best scales |
    | `strengths=UncertainStrength(...)` | [`jaxctbn.criteria.UncertainStrengthScores`][] |

    The most informative candidate is the `argmax` of the scores.
    """
    check_scoring(posterior, criterion, num_samples, outcome)
    if batch is not None and strengths is not None:
        raise ValueError(
            "batch, strengths: give one design question at a time (a batch of strength "
            "variants is not supported yet)."
        )
    if batch is not None:
        if not isinstance(batch, AbstractBatchQuestion):
            raise TypeError(
                f"batch: expected jaxctbn.Batch(size, ...) or jaxctbn.criteria.GivenBatch(), "
                f"got {batch!r}."
            )
        return batch.answer(
            criterion, posterior, candidates, initial_state, horizon, key=key,
            num_samples=num_samples, solver=solver, batching=batching, outcome=outcome,
        )  # fmt: skip
    if strengths is not None:
        if not isinstance(strengths, AbstractStrengthQuestion):
            raise TypeError(
                "strengths: expected jaxctbn.criteria.Strengths(...) or "
                f"jaxctbn.criteria.UncertainStrength(...), got {strengths!r}."
            )

        def scores(variants):
            return candidate_scores(
                posterior, variants, initial_state, horizon, criterion=criterion, key=key,
                num_samples=num_samples, solver=solver, batching=batching, outcome=outcome,
            )  # fmt: skip

        return strengths.answer(scores, candidates)
    if outcome.chooses_times and isinstance(criterion, AbstractBoxHillCriterion):
        return outcome.design(
            criterion, posterior, candidates, initial_state, horizon, key=key,
            num_samples=num_samples, batching=batching,
        )  # fmt: skip
    return candidate_scores(
        posterior, candidates, initial_state, horizon, criterion=criterion, key=key,
        num_samples=num_samples, solver=solver, batching=batching, outcome=outcome,
    )  # fmt: skip
