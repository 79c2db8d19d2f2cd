"""Designs: how the next intervention is chosen from the candidates (passive, random, by a
criterion, or by any function), and the designs by name. One hierarchy for both experiments:
the synthetic loop chooses among candidates that share the next experiment's initial state and
horizon (`choose`); the real-data pool chooses among options that each have their own, some
of them used up (`choose_option`)."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Literal, get_args

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from .._batching import AbstractBatching
from .._criteria.batches import greedy_batch
from .._criteria.box_hill import BHC, VBHC, AbstractBoxHillCriterion
from .._criteria.costs import AbstractRanking, affordable
from .._criteria.criterion import AbstractCriterion
from .._criteria.eig import EIG
from .._criteria.outcomes import COMPLETE_PATH, AbstractOutcome, check_outcome
from .._criteria.scoring import candidate_scores, check_scoring
from .._criteria.structure import AbstractGraphDraws, StratifiedGraphDraws
from .._learning.optimisers import LBFGS
from .._learning.posterior import AbstractPosterior
from .._learning.structure_mixture import StructureMixturePosterior
from .._master_equation import AUTOMATIC_SOLVER, StatisticsSolver
from .._model.interventions import Intervention


class AbstractDesign(eqx.Module):
    """Chooses the next intervention from a batch of candidates.

    Subclasses implement `scores`; `choose` returns the index of the best candidate (the
    `argmax`). This is the extension point for a new design strategy."""

    @abc.abstractmethod
    def scores(
        self,
        posterior: AbstractPosterior,
        candidates: Intervention,
        initial_state: Int[Array, " nodes"],
        horizon: Float[Array, ""],
        key: PRNGKeyArray,
    ) -> Float[Array, " candidates"]:
        """One score per candidate (larger = better), for the current `posterior`, the revealed
        `initial_state` of the next experiment and its `horizon`. Must be pure and jittable: it
        runs inside the compiled loop, under `jax.vmap` over repetitions."""

    def observing(self, outcome: AbstractOutcome) -> AbstractDesign:
        """This design for a task whose experiments reveal `outcome` (the loop calls it with
        the task's): itself unless it scores under an outcome of its own."""
        return self

    def choose(self, posterior, candidates, initial_state, horizon, key) -> Int[Array, ""]:
        """Index of the chosen candidate: the `argmax` of `scores`."""
        return jnp.argmax(self.scores(posterior, candidates, initial_state, horizon, key))

    def choose_with_times(
        self,
        posterior: AbstractPosterior,
        candidates: Intervention,
        initial_state: Int[Array, " nodes"],
        horizon: Float[Array, ""],
        key: PRNGKeyArray,
        *,
        outcome: AbstractOutcome,
    ) -> tuple[Int[Array, ""], Float[Array, " visits"] | None]:
        """The chosen candidate and the visit times at which its experiment is seen under the
        task's `outcome`: `None` for a complete path, the given times of a `PanelOutcome(times)`, and
        for `PanelOutcome(num_visits=K)` equal spacing $t_k=\tau k/K$ unless the design chooses
        them (a [`jaxctbn.CriterionDesign`][] with the same panel outcome: the chosen
        candidate's own best times, maths §7)."""
        index = self.choose(posterior, candidates, initial_state, horizon, key)
        return index, outcome.visit_times(horizon, jnp.result_type(float))

    def choose_batch(
        self,
        posterior: AbstractPosterior,
        candidates: Intervention,
        initial_state: Int[Array, " nodes"],
        horizon: Float[Array, ""],
        key: PRNGKeyArray,
        *,
        outcome: AbstractOutcome,
        size: int,
        costs: Float[Array, " candidates"],
        remaining: Float[Array, ""],
        ranking: AbstractRanking,
    ) -> tuple[Int[Array, " size"], Float[Array, "size visits"] | None]:
        """`size` experiments to run together (indices into `candidates`, `-1` for a slot the
        `remaining` budget cannot fill) and their visit times (as `choose_with_times`). By
        default each slot takes the best candidate by `ranking` of `scores` and `costs` that
        the budget still affords: $B$ independent myopic picks, copies of the best unless the
        budget runs short. [`jaxctbn.CriterionDesign`][] chooses the members together
        ([`jaxctbn.Batch`][]); [`jaxctbn.RandomDesign`][] draws them."""
        scores = self.scores(posterior, candidates, initial_state, horizon, key)
        rank = ranking.rank(scores, costs)
        return _slots(
            size, costs, remaining, lambda b, ok: jnp.argmax(jnp.where(ok, rank, -jnp.inf))
        ), _batch_times(outcome, horizon, size)

    def option_scores(
        self,
        posterior: AbstractPosterior,
        candidates: Intervention,
        initial_states: Int[Array, "options nodes"],
        horizons: Float[Array, " options"],
        key: PRNGKeyArray,
    ) -> Float[Array, " options"]:
        """One score per option, each option's intervention scored from its own initial state
        and horizon (the pool experiment's options), all with the same `key`."""

        def one(candidate, initial_state, horizon):
            single = jax.tree_util.tree_map(lambda x: x[None], candidate)
            return self.scores(posterior, single, initial_state, horizon, key)[0]

        return jax.vmap(one)(candidates, initial_states, horizons)

    def choose_option(
        self,
        posterior: AbstractPosterior,
        candidates: Intervention,
        initial_states: Int[Array, "options nodes"],
        horizons: Float[Array, " options"],
        open: Bool[Array, " options"],
        key: PRNGKeyArray,
    ) -> Int[Array, ""]:
        """Index of the chosen option among the `open` ones: the first `argmax` of
        `option_scores` over them (at least one option must be open)."""
        scores = self.option_scores(posterior, candidates, initial_states, horizons, key)
        return jnp.argmax(jnp.where(open, scores, -jnp.inf)).astype(jnp.int32)


def _slots(size: int, costs, remaining, pick) -> Int[Array, " size"]:
    """Fill `size` slots one after another: slot b takes `pick(b, affordable)` among the
    candidates whose cost fits in what is left of `remaining`, or -1 when none fits."""

    def step(left, b):
        ok = affordable(costs, left)
        index = pick(b, ok)
        found = ok.any()
        return left - jnp.where(found, costs[index], 0.0), jnp.where(found, index, -1)

    _, members = jax.lax.scan(step, jnp.asarray(remaining, costs.dtype), jnp.arange(size))
    return members


def _batch_times(outcome: AbstractOutcome, horizon, size: int):
    """Every member's visit times `(size, visits)` of a panel outcome; `None` otherwise."""
    times = outcome.visit_times(horizon, jnp.result_type(float))
    return None if times is None else jnp.broadcast_to(times, (size, *times.shape))


class PassiveDesign(AbstractDesign):
    """Never intervenes: picks the candidate with no target (it must be among the candidates)."""

    def scores(self, posterior, candidates, initial_state, horizon, key):
        return (~candidates.targets.any(-1)).astype(jnp.result_type(float))


class RandomDesign(AbstractDesign):
    """Picks a candidate uniformly at random."""

    def scores(self, posterior, candidates, initial_state, horizon, key):
        return jr.uniform(key, candidates.targets.shape[:1])

    def choose_batch(
        self,
        posterior,
        candidates,
        initial_state,
        horizon,
        key,
        *,
        outcome,
        size,
        costs,
        remaining,
        ranking,
    ):
        """Each slot a candidate uniformly at random among those the budget still affords
        (slot 0 with `key`, as `choose`)."""

        C = candidates.targets.shape[0]
        draws = jnp.concatenate(
            [jr.uniform(key, (C,))[None], jr.uniform(jr.fold_in(key, 1), (size - 1, C))]
        )

        def pick(b, ok):
            return jnp.argmax(jnp.where(ok, draws[b], -jnp.inf))

        return _slots(size, costs, remaining, pick), _batch_times(outcome, horizon, size)

    def choose_option(self, posterior, candidates, initial_states, horizons, open, key):
        """An open option uniformly at random, drawn as a categorical over the open ones."""
        return jr.categorical(key, jnp.where(open, 0.0, -jnp.inf)).astype(jnp.int32)


def as_flag(value):
    """A concrete flag as a NumPy boolean (traced under `eqx.filter_jit`, unlike a Python
    bool, and hashable; `bool(flag)` still works); a JAX array (e.g. a tracer) is kept."""
    return value if isinstance(value, jax.Array) else np.bool_(value)


class CriterionDesign(AbstractDesign):
    r"""Picks the intervention that maximises a design criterion, scored over all candidates in
    one call of [`jaxctbn.score_interventions`][] (for either learning target).

    **Arguments:** `criterion` ([`jaxctbn.VBHC`][], [`jaxctbn.BHC`][], [`jaxctbn.EIG`][] or any
    [`jaxctbn.AbstractCriterion`][]); keyword-only `num_samples` ($N_S$), `worst` (pick the
    *least* informative candidate: "negative VBHC", the paper's control), `solver`, `batching`,
    `outcome` (what each experiment reveals, see [`jaxctbn.score_interventions`][]; default
    `None`: the task's, which the active-learning loop gives the design, so it is stated once,
    on the task; a design given its own must match the task's), `assume_complete_path` (static, default
    `False`): score as if each experiment revealed the whole path whatever the task observes, a
    design that ignores that its outcomes are panels (for comparison; the loop then does not
    require the design's outcome to match the task's), `greedy_batches` (static, default
    `True`): in rounds of several experiments (`batch_size` of the loop) the BHC/VBHC choose
    the members together, greedily ([`jaxctbn.Batch`][]); `False` takes $B$ copies of
    the best single candidate (the myopic baseline). With `assume_complete_path` a
    [`jaxctbn.StructureMixturePosterior`][] (the panel loop's structure posterior) is scored
    through its [`moment_matched`][jaxctbn.StructureMixturePosterior.moment_matched]
    posterior: the history's hidden paths taken as seen, as the design takes the next ones.
    """

    criterion: AbstractCriterion
    num_samples: int = eqx.field(default=10, static=True, kw_only=True)
    # a value, not a static field: the best and the worst design share one compiled loop
    worst: bool | np.bool_ | Bool[Array, ""] = eqx.field(
        default=False, kw_only=True, converter=as_flag
    )
    solver: StatisticsSolver = eqx.field(default=AUTOMATIC_SOLVER, kw_only=True)
    batching: AbstractBatching | None = eqx.field(default=None, kw_only=True)
    outcome: AbstractOutcome | None = eqx.field(default=None, kw_only=True)
    assume_complete_path: bool = eqx.field(default=False, static=True, kw_only=True)
    greedy_batches: bool = eqx.field(default=True, static=True, kw_only=True)

    def __check_init__(self):
        if not isinstance(self.greedy_batches, bool):
            raise ValueError(
                f"greedy_batches: expected True or False, got {self.greedy_batches!r}."
            )
        if not isinstance(self.assume_complete_path, bool):
            raise ValueError(
                f"assume_complete_path: expected True or False, got {self.assume_complete_path!r}."
            )
        if self.outcome is not None:
            check_outcome(self.outcome, error=ValueError)
        if not isinstance(self.criterion, AbstractCriterion):
            raise ValueError(
                f"criterion: expected a criterion Module (VBHC(), BHC(), EIG()), got "
                f"{self.criterion!r}."
            )
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {self.num_samples}.")

    def observing(self, outcome):
        """This design scoring under the task's `outcome`; a `ValueError` if it was given
        another one (unless it assumes complete paths)."""
        check_outcome(outcome, error=ValueError)
        if self.assume_complete_path:
            return self
        if self.outcome is None:
            return dataclasses.replace(self, outcome=outcome)
        if not self.outcome.matches(outcome):
            raise ValueError(
                f"outcome: the design scores {self.outcome!r} but the task observes "
                f"{outcome!r}; give both the same outcome (or leave the design's unset: it "
                "scores under the task's)."
            )
        return self

    @property
    def scored_outcome(self) -> AbstractOutcome:
        """The outcome the criterion scores under: the design's (the task's once the loop
        gave it, else a complete path), or a complete path with `assume_complete_path`."""
        if self.assume_complete_path or self.outcome is None:
            return COMPLETE_PATH
        return self.outcome

    def _scored(self, posterior):
        """What the criterion scores: the posterior, or with `assume_complete_path` a structure
        mixture's moment-matched posterior (class page)."""
        if self.assume_complete_path and isinstance(posterior, StructureMixturePosterior):
            return posterior.moment_matched()
        return posterior

    def scores(self, posterior, candidates, initial_state, horizon, key):
        scored = self._scored(posterior)
        check_scoring(scored, self.criterion, self.num_samples, self.scored_outcome)
        s = candidate_scores(
            scored,
            candidates,
            initial_state,
            horizon,
            criterion=self.criterion,
            key=key,
            num_samples=self.num_samples,
            solver=self.solver,
            batching=self.batching,
            outcome=self.scored_outcome,
        )
        return jnp.where(self.worst, -s, s)

    def choose_with_times(self, posterior, candidates, initial_state, horizon, key, *, outcome):
        scored = self.scored_outcome
        if not (outcome.chooses_times and scored.chooses_times):
            return super().choose_with_times(
                posterior, candidates, initial_state, horizon, key, outcome=outcome
            )
        check_scoring(posterior, self.criterion, self.num_samples, scored)
        if not isinstance(self.criterion, AbstractBoxHillCriterion):
            raise ValueError(
                "criterion: panel designs with their visit times need the BHC or VBHC; the EIG "
                "scores given times."
            )
        design = scored.design(
            self.criterion,
            posterior,
            candidates,
            initial_state,
            horizon,
            key=key,
            num_samples=self.num_samples,
            batching=self.batching,
        )
        index = jnp.argmax(jnp.where(self.worst, -design.scores, design.scores))
        return index, design.times[index]

    def choose_batch(
        self,
        posterior,
        candidates,
        initial_state,
        horizon,
        key,
        *,
        outcome,
        size,
        costs,
        remaining,
        ranking,
    ):
        """With the BHC or VBHC: the members chosen together, greedily
        ([`jaxctbn.Batch`][]: each round scores every candidate with the members already
        chosen; the negative control picks the least informative batch). With the EIG: $B$
        myopic picks (the default)."""
        scored = self.scored_outcome
        if not isinstance(self.criterion, AbstractBoxHillCriterion) or not self.greedy_batches:
            return super().choose_batch(
                posterior,
                candidates,
                initial_state,
                horizon,
                key,
                outcome=outcome,
                size=size,
                costs=costs,
                remaining=remaining,
                ranking=ranking,
            )
        if scored.chooses_times:
            raise ValueError(
                "outcome: batches and costs with visit times chosen per candidate "
                "(PanelOutcome(num_visits=K)) are not supported yet; give the visit times, or use "
                "the -path designs (bhc-path, vbhc-path)."
            )
        design = greedy_batch(
            self._scored(posterior),
            candidates,
            initial_state,
            horizon,
            size=size,
            criterion=self.criterion,
            key=key,
            num_samples=self.num_samples,
            solver=self.solver,
            batching=self.batching,
            candidate_costs=costs,
            budget=remaining,
            ranking=ranking,
            sign=jnp.where(self.worst, -1.0, 1.0),
            outcome=scored,
        )
        return design.members, _batch_times(outcome, horizon, size)


class CallableDesign(AbstractDesign):
    """A user criterion: `fn(posterior, candidates, initial_state, horizon, key)` returns one
    score per candidate (larger = better). `fn` must be pure and jittable."""

    fn: Callable = eqx.field(static=True)

    def scores(self, posterior, candidates, initial_state, horizon, key):
        return self.fn(posterior, candidates, initial_state, horizon, key)


DesignName = Literal[
    "passive",
    "random",
    "vbhc",
    "bhc",
    "vbhc-optax",
    "eig",
    "negative-vbhc",
    "vbhc-path",
    "bhc-path",
    "vbhc-copies",
]
#: Design names understood by `design_from_name` and `jaxctbn run --designs`.
DESIGN_NAMES: tuple[str, ...] = get_args(DesignName)


def design_from_name(
    name: DesignName | str,
    *,
    num_samples: int = 10,
    num_paths: int = 10,
    graph_draws: AbstractGraphDraws | None = None,
    max_sets: int | None = None,
    outcome: AbstractOutcome | None = None,
) -> AbstractDesign:
    """The design behind a CLI name: `"passive"`, `"random"`, `"vbhc"` (`VBHC()`), `"bhc"`,
    `"vbhc-optax"` (`VBHC(optimiser=LBFGS())`), `"eig"` (`EIG(num_paths=num_paths)`) or
    `"negative-vbhc"` (the worst candidate by the VBHC), `"vbhc-path"`/`"bhc-path"` (the
    criterion scored as if the whole path were seen whatever `outcome` is:
    `assume_complete_path=True`), `"vbhc-copies"` (in rounds of several experiments, $B$
    copies of the VBHC's best candidate instead of a greedy batch: `greedy_batches=False`).
    `graph_draws` (default `None` =
    [`jaxctbn.criteria.StratifiedGraphDraws`][]) and `max_sets` go to the (V)BHC (structure learning; see
    [`jaxctbn.VBHC`][]); `outcome` to the criterion designs (what each experiment reveals; default `None`:
    the task's, which the loop gives them)."""
    graph_draws = StratifiedGraphDraws() if graph_draws is None else graph_draws
    box_hill = {"graph_draws": graph_draws, "max_sets": max_sets}
    criteria = {
        "vbhc": VBHC(**box_hill),
        "bhc": BHC(**box_hill),
        "vbhc-optax": VBHC(optimiser=LBFGS(), **box_hill),
        "eig": EIG(num_paths=num_paths),
    }
    if name == "passive":
        return PassiveDesign()
    if name == "random":
        return RandomDesign()
    if name == "negative-vbhc":
        return CriterionDesign(
            VBHC(**box_hill), num_samples=num_samples, worst=True, outcome=outcome
        )
    if name in criteria:
        return CriterionDesign(criteria[name], num_samples=num_samples, outcome=outcome)
    if name == "vbhc-copies":
        return CriterionDesign(
            VBHC(**box_hill), num_samples=num_samples, outcome=outcome, greedy_batches=False
        )
    if name in ("vbhc-path", "bhc-path"):
        return CriterionDesign(
            criteria[name.removesuffix("-path")],
            num_samples=num_samples,
            outcome=outcome,
            assume_complete_path=True,
        )
    raise ValueError(f"design: unknown name {name!r}; valid: {', '.join(DESIGN_NAMES)}.")
