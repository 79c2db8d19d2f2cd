r"""Batches of experiments run in parallel: the value of a batch, and a greedy choice of one
(maths §8).

Given the model, the members' outcomes are independent. The (V)BHC of a batch follows from
quantities that add over the members:

- **parameters:** the posterior-averaged expected statistics
  ([`jaxctbn.criteria.ParameterDesignStatistics`][]), linear in each member's, so the batch BHC is
  the sum of the members' BHC and the batch VBHC is today's closed form at the summed
  statistics: at least its best member's, at most the sum;
- **structure:** each draw's expected statistics of node $n$ projected on every parent set,
  summed over the members that leave $n$ free; $\ell_n$ (the predictive likelihood, which
  integrates the shared rates out) of the sum gives the batch's $a_n(P')$ (the plug-in
  estimator, as for one experiment). The rates couple the members, so here neither criterion
  is the sum of the members'.

[`jaxctbn.Batch`][] (the `batch=` of [`jaxctbn.score_interventions`][]) computes every
candidate's quantities once (one batch of master-equation solves, as for a single experiment)
and then adds members greedily: each round scores every candidate together with the members
already chosen. The nested Monte Carlo EIG of a given batch
([`jaxctbn.criteria.GivenBatch`][] with [`jaxctbn.EIG`][]) is the reference.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from .._errors import error_if
from .._model.interventions import Intervention
from .batch_terms import member_initial
from .box_hill import AbstractBoxHillCriterion
from .costs import AbstractRanking, ByScore, Costs, affordable, check_pricing
from .eig import EIG
from .outcomes import COMPLETE_PATH, AbstractOutcome

if TYPE_CHECKING:
    import pandas as pd


class BatchDesign(eqx.Module):
    """A batch chosen by [`jaxctbn.score_interventions`][] with `batch=`[`jaxctbn.Batch`][]:

    - `members` `(size,)`: the chosen candidates' indices, in the order chosen; `-1` for a slot
      left empty because nothing affordable remained within the budget;
    - `scores` `(size,)`: each member's own single-experiment score (as
      [`jaxctbn.score_interventions`][] gives it);
    - `gains` `(size,)`: what each member added to the batch's score when it was chosen;
    - `costs` `(size,)`: each member's cost ([`jaxctbn.Costs`][]; zero without costs);
    - `batch_score`: the criterion of the whole batch, the sum of `gains`;
    - `total_cost`: the sum of `costs`;
    - `round_scores` `(size, candidates)`: every candidate's score together with the members
      chosen before each round; row 0 is the single-experiment scores.

    Empty slots have zero score, gain and cost."""

    members: Int[Array, " size"]
    scores: Float[Array, " size"]
    gains: Float[Array, " size"]
    costs: Float[Array, " size"]
    batch_score: Float[Array, ""]
    total_cost: Float[Array, ""]
    round_scores: Float[Array, "size candidates"]

    def to_frame(self, candidates: Intervention, names: Sequence[str]) -> pd.DataFrame:
        """The batch's members as a pandas table, in the order chosen, empty slots left out
        (the `batch` of `jaxctbn design --batch`'s JSON).

        **Arguments:**

        - `candidates`: the candidates the batch was chosen from (a batch of interventions).
        - `names`: the network's node names.

        **Returns:** a `pandas.DataFrame`, one row per member: `candidate` (its index in
        `candidates`), `intervention` ([`Intervention.to_frame`][jaxctbn.Intervention.to_frame]'s),
        `score`, `gain` and `cost`. Eager, on the host."""
        frame = candidates.to_frame(names)
        members = np.asarray(self.members)
        kept = members >= 0
        if np.any(members[kept] >= len(frame)):
            raise ValueError(
                f"candidates: {len(frame)} interventions, but the batch holds candidate "
                f"{int(members.max())}."
            )
        frame = frame.iloc[members[kept]].reset_index(drop=True)
        frame.insert(0, "candidate", members[kept])
        return frame.assign(
            score=np.asarray(self.scores, float)[kept],
            gain=np.asarray(self.gains, float)[kept],
            cost=np.asarray(self.costs, float)[kept],
        )


def _check_box_hill(criterion, what: str):
    if isinstance(criterion, EIG):
        raise ValueError(
            f"criterion: {what} adds members by the BHC or VBHC; the EIG of a given batch is "
            "score_interventions(..., criterion=EIG(), batch=GivenBatch())."
        )
    if not isinstance(criterion, AbstractBoxHillCriterion):
        raise ValueError(
            f"criterion: {what} needs jaxctbn.BHC() or jaxctbn.VBHC(), got {criterion!r}."
        )


def _check_initial_states(initial_state, candidates, size: int):
    """One initial state `(N,)` shared by the batch, or one per member `(size, N)`."""
    shape = jnp.shape(initial_state)
    N = candidates.targets.shape[-1]
    if shape not in ((N,), (size, N)):
        raise ValueError(
            f"initial_state: one state ({N},) shared by the batch or one per member "
            f"({size}, {N}), got shape {shape}."
        )


def _check_candidates(candidates, what: str):
    if not isinstance(candidates, Intervention) or jnp.ndim(candidates.targets) != 2:
        raise ValueError(
            f"{what}: expected an Intervention with a leading axis (one row per "
            f"{'experiment' if what == 'members' else 'candidate'})."
        )


class AbstractBatchQuestion(eqx.Module):
    """A question about experiments run in parallel, passed to
    [`jaxctbn.score_interventions`][] as `batch=`: [`jaxctbn.Batch`][] or
    [`jaxctbn.criteria.GivenBatch`][]."""

    @abc.abstractmethod
    def answer(
        self, criterion, posterior, candidates, initial_state, horizon, *, key, num_samples,
        solver, batching, outcome,
    ) -> Any:  # fmt: skip
        """The answer for `candidates` (the other arguments those of `score_interventions`,
        checked by it)."""


class Batch(AbstractBatchQuestion):
    r"""Choose `size` experiments to run in parallel, greedily (maths §8): the
    `batch=` of [`jaxctbn.score_interventions`][], which returns a
    [`jaxctbn.criteria.BatchDesign`][].

    Every candidate's quantities (expected statistics for parameters, per-draw statistics on
    every parent set for structure) are computed once, with the same posterior draws as the
    single-experiment scores for the same `key`; then each of `size` rounds scores every
    candidate together with the members already chosen and adds the best by `ranking` among
    those the remaining `budget` affords. A candidate may be chosen again (a replicate). With
    `size=1` the scores are exactly the single-experiment scores. The criterion must be
    [`jaxctbn.BHC`][] or [`jaxctbn.VBHC`][] (structure learning with the
    [`jaxctbn.PlugIn`][] estimator); panel outcomes at given visit times.

    **Arguments:**

    - `size`: the number of experiments in the batch (static). The `initial_state` given to
      `score_interventions` is one state `(N,)` every member starts from, or one per member
      `(size, N)` (slot $b$'s experiment starts from row $b$: its candidates' quantities are
      computed from it, and the rounds are unrolled, one per slot);
    - `costs`: a [`jaxctbn.Costs`][] pricing each candidate, with a panel outcome's visits
      (default: free);
    - `budget`: the most the batch may cost (default: unbounded); the slots nothing affordable
      fills are left empty;
    - `ranking`: [`jaxctbn.criteria.ByScore`][] (default) or
      [`jaxctbn.criteria.ByScorePerCost`][] (gain per unit cost).
    """

    size: int = eqx.field(static=True)
    costs: Costs | None = eqx.field(default=None, kw_only=True)
    budget: Float[Array, ""] | None = eqx.field(default=None, kw_only=True)
    ranking: AbstractRanking = eqx.field(default=ByScore(), kw_only=True)

    def __check_init__(self):
        size = self.size
        if not isinstance(size, int | np.integer) or isinstance(size, bool) or size < 1:
            raise ValueError(f"size: the batch size must be an integer >= 1, got {size!r}.")
        check_pricing(self.costs, self.budget, self.ranking, error=TypeError)

    def answer(
        self, criterion, posterior, candidates, initial_state, horizon, *, key, num_samples,
        solver, batching, outcome,
    ) -> BatchDesign:  # fmt: skip
        size = int(self.size)
        _check_candidates(candidates, "candidates")
        _check_initial_states(initial_state, candidates, size)
        _check_box_hill(criterion, "Batch")
        C = candidates.targets.shape[0]
        dtype = jnp.result_type(float)
        if self.costs is None:
            candidate_costs = jnp.zeros((C,), dtype)
        else:
            # a panel's visits are priced too, as in the active-learning loop
            visits = outcome.num_priced_visits
            candidate_costs = self.costs.of(candidates, num_visits=visits).astype(dtype)
        budget = jnp.asarray(jnp.inf if self.budget is None else self.budget, dtype)
        return greedy_batch(
            posterior, candidates, initial_state, horizon, size=size, criterion=criterion,
            key=key, num_samples=num_samples, solver=solver, batching=batching,
            candidate_costs=candidate_costs, budget=budget, ranking=self.ranking,
            outcome=outcome,
        )  # fmt: skip


class GivenBatch(AbstractBatchQuestion):
    r"""The candidates are the members of one batch of experiments run in parallel, one row per
    experiment, all from `initial_state` `(N,)` or each from its own row of `initial_state`
    `(members, N)`: the `batch=` of [`jaxctbn.score_interventions`][], which returns the
    batch's criterion, a scalar (maths §8).

    - [`jaxctbn.BHC`][], [`jaxctbn.VBHC`][]: from the members' summed quantities, with the same
      draws as the single-experiment scores and [`jaxctbn.Batch`][] for the same `key` (one
      member gives its single-experiment score).
    - [`jaxctbn.EIG`][]: the batch's expected information gain by Monte Carlo, `num_paths`
      outcomes per posterior draw, each outcome one independent path per member (member 0's
      path is the one the single-experiment EIG samples, so one member gives its EIG): for
      parameters by conjugacy, for structure Algorithm 4 with the stratum weights on the
      members' summed statistics. The reference for the Box-Hill batches.
    """

    def answer(
        self, criterion, posterior, candidates, initial_state, horizon, *, key, num_samples,
        solver, batching, outcome,
    ) -> Float[Array, ""]:  # fmt: skip
        members = candidates
        _check_candidates(members, "members")
        if members.targets.shape[0] == 0:
            raise ValueError("members: a batch needs at least one experiment, got none.")
        _check_initial_states(initial_state, members, members.targets.shape[0])
        if isinstance(criterion, EIG):
            return outcome.batch_eig(
                criterion, posterior, members, initial_state, horizon, key=key,
                num_samples=num_samples,
            )  # fmt: skip
        _check_box_hill(criterion, "GivenBatch")
        if jnp.ndim(initial_state) == 1:
            terms = outcome.batch_terms(
                criterion, posterior, members, initial_state, horizon, key=key,
                num_samples=num_samples, solver=solver, batching=batching,
            )  # fmt: skip
            chosen = terms.empty
            for b in range(members.targets.shape[0]):
                chosen = terms.add(chosen, b)
            return terms.value(chosen)
        chosen = None
        for b in range(members.targets.shape[0]):  # each member from its own initial state
            member = jax.tree_util.tree_map(lambda a, b=b: a[b : b + 1], members)
            terms = outcome.batch_terms(
                criterion, posterior, member, member_initial(initial_state, b), horizon,
                key=key, num_samples=num_samples, solver=solver, batching=batching,
            )  # fmt: skip
            chosen = terms.add(terms.empty if chosen is None else chosen, 0)
        return terms.value(chosen)


def greedy_batch(
    posterior,
    candidates,
    initial_state,
    horizon,
    *,
    size: int,
    criterion,
    key,
    num_samples: int,
    solver,
    batching,
    candidate_costs: Array,
    budget: Array,
    ranking: AbstractRanking,
    sign: ArrayLike = 1.0,
    outcome: AbstractOutcome = COMPLETE_PATH,
) -> BatchDesign:
    """[`jaxctbn.Batch`][]'s greedy rounds (the arguments checked by the caller), with
    every candidate's cost given as an array and the criterion multiplied by `sign` (-1 picks
    the least informative batch, the "negative" control); the active-learning loop calls it
    with the costs of its own outcome."""
    init = jnp.asarray(initial_state)
    per_slot = init.ndim == 2  # slot b's experiment starts from initial_state[b]

    def terms_from(state):
        return outcome.batch_terms(
            criterion, posterior, candidates, state, horizon, key=key, num_samples=num_samples,
            solver=solver, batching=batching,
        )  # fmt: skip

    slots = [terms_from(init[b]) for b in range(size)] if per_slot else [terms_from(init)]
    dtype = jnp.result_type(float)
    sign = jnp.asarray(sign, dtype)
    budget = error_if(budget, ~(budget >= 0), "budget: must be a number >= 0 (or None, unbounded).")
    empty, value = slots[0].empty, slots[0].value

    def step_with(terms):
        def step(carry, _):
            chosen, current, spent = carry
            values = terms.round_values(chosen)
            gains = values - current
            ok = affordable(candidate_costs, budget - spent)
            rank = jnp.where(ok, ranking.rank(sign * gains, candidate_costs), -jnp.inf)
            pick = jnp.argmax(rank)
            found = ok.any()
            chosen = jax.tree_util.tree_map(
                lambda new, old: jnp.where(found, new, old), terms.add(chosen, pick), chosen
            )
            gain = jnp.where(found, gains[pick], 0.0)
            cost = jnp.where(found, candidate_costs[pick], 0.0)
            member = jnp.where(found, pick, -1)
            return (chosen, current + gain, spent + cost), (member, gain, cost, values)

        return step

    start = (empty, value(empty), jnp.zeros((), dtype))
    if per_slot:  # one round per slot, each with its slot's quantities (unrolled)
        carry, rounds = start, []
        for terms in slots:
            carry, out = step_with(terms)(carry, None)
            rounds.append(out)
        _, total, spent = carry
        members, gains, member_costs, round_scores = (
            jnp.stack([r[i] for r in rounds]) for i in range(4)
        )
        # each member's own score: alone, from its slot's initial state
        scores = jnp.stack(
            [
                jnp.where(m >= 0, terms.value(terms.add(empty, jnp.maximum(m, 0))) - start[1], 0.0)
                for terms, m in zip(slots, members)
            ]
        )
    else:
        (_, total, spent), (members, gains, member_costs, round_scores) = jax.lax.scan(
            step_with(slots[0]), start, None, length=size
        )
        singles = round_scores[0]
        scores = jnp.where(members >= 0, singles[jnp.maximum(members, 0)], 0.0)
    return BatchDesign(
        members=members,
        scores=scores,
        gains=gains,
        costs=member_costs,
        batch_score=total - start[1],
        total_cost=spent,
        round_scores=round_scores,
    )
