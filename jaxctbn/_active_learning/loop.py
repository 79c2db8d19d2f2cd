r"""Sequential active learning: designs, learning tasks and the compiled experiment loop.

One run is $K$ experiments. In experiment $k$: an initial state $s_0$ is chosen by the
initial-state policy (by default drawn uniformly at random and revealed to the design, as in
the paper); the design picks an intervention $i_k$ from a fixed batch of
candidates (by default the paper's whole space, [`jaxctbn.intervention_space`][], or for large
networks the single-node interventions: `design_space`); one trajectory
of length $\tau$ is simulated from the ground truth under $i_k$; the posterior is updated with
pooling (an intervened node learns nothing from that trajectory); metrics are recorded.

The whole loop is one `jax.lax.scan`, and [`jaxctbn.run_repetitions`][] vmaps it over
independent repetitions, so a batch of repetitions is one compiled call. Designs are Equinox
modules, so a new design is a small class (or a [`jaxctbn.CallableDesign`][] around a function).
"""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, Any, cast

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, ArrayLike, PRNGKeyArray

from .._criteria.costs import AbstractRanking, ByScore, Costs, check_pricing
from .._errors import error_if
from .._learning.posterior import AbstractPosterior
from .._model.frames import assignment_label, intervention_labels, optional_import
from .._model.interventions import Intervention, design_space
from .._paths.sampling import automatic_max_events, check_count, sample_trajectory
from .designs import AbstractDesign
from .initial_states import PAPER_INITIAL_STATE, AbstractInitialStatePolicy
from .tasks import AbstractLearningTask

if TYPE_CHECKING:
    import pandas as pd


class ActiveLearningResult(eqx.Module):
    """The record of one run (or, from [`jaxctbn.run_repetitions`][], of a batch of runs with a
    leading repetition axis).

    - `metrics[name]`: `(experiments + 1,)`, entry 0 before any experiment;
    - `intervention_index`: `(experiments,)` index of the chosen candidate;
    - `targets`, `states`: `(experiments, nodes)` the chosen perfect intervention;
    - `initial_states`: `(experiments, nodes)` the drawn (and revealed) initial states;
    - `num_events`: `(experiments,)` transitions in each simulated trajectory;
    - `posterior`: the posterior after the last experiment;
    - `observation_times`: `(experiments, visits)` the visit times at which each experiment was
      seen when the task's outcome is a panel (chosen by the design with
      `PanelOutcome(num_visits=K)`); `None` for complete paths;
    - `rounds`: `(experiments,)` the round (batch) of each experiment, from 1; with
      `batch_size` $B$, experiments $B(r-1)+1..Br$ run together in round $r$ and `metrics` of
      each of them is the posterior's after its round;
    - `costs`: `(experiments,)` the cumulative cost after each experiment (zeros without
      `costs`).

    An experiment the budget could not afford has `intervention_index` -1, no targets, no
    events, and leaves the posterior as it was."""

    metrics: dict[str, Array]
    intervention_index: Array
    targets: Array
    states: Array
    initial_states: Array
    num_events: Array
    posterior: eqx.Module
    observation_times: Array | None = None
    rounds: Array | None = None
    costs: Array | None = None

    def to_frame(self) -> pd.DataFrame:
        """The record as a pandas table, one row per repetition and experiment: the rows of
        the metrics.csv that `jaxctbn run` writes for one design
        ([Files](../formats.md#python-results)).

        **Returns:** a `pandas.DataFrame` with columns `repetition` (0 for a single run),
        `experiment` (0: before any experiment), one per metric, `intervention` (the chosen
        clamps, `A=1;B=0`, `none`, or `skipped` for an experiment the budget could not
        afford; `""` at experiment 0), `initial_state` (`A=0;B=1`; `""` at experiment 0),
        with a panel outcome `observation_times` (a tuple of the visit times; `None` at
        experiment 0), `round` and `cost` (the cumulative cost; 0 at experiment 0). Eager,
        on the host."""
        pd = optional_import("pandas", "ActiveLearningResult.to_frame")
        names = tuple(cast(AbstractPosterior, self.posterior).names)
        # one run, or a batch of runs: a leading repetition axis either way
        single = np.ndim(next(iter(self.metrics.values()))) == 1

        def runs(a) -> np.ndarray:
            return np.asarray(a)[None] if single else np.asarray(a)

        metrics = {k: runs(v).astype(float) for k, v in self.metrics.items()}
        index, targets, states = (
            runs(self.intervention_index),
            runs(self.targets),
            runs(self.states),
        )
        initial = runs(self.initial_states)
        times = None if self.observation_times is None else runs(self.observation_times)
        rounds = None if self.rounds is None else runs(self.rounds)
        costs = None if self.costs is None else runs(self.costs)
        rows = []
        for r in range(index.shape[0]):
            labels = intervention_labels(names, targets[r], states[r])
            labels = ["skipped" if i < 0 else label for i, label in zip(index[r], labels)]
            for k in range(index.shape[1] + 1):
                row: dict[str, Any] = {"repetition": r, "experiment": k}
                row.update({name: float(v[r, k]) for name, v in metrics.items()})
                if k == 0:  # before any experiment
                    row.update(intervention="", initial_state="")
                    row.update({} if times is None else {"observation_times": None})
                    row.update(round=0, cost=0.0)
                    rows.append(row)
                    continue
                row["intervention"] = labels[k - 1]
                row["initial_state"] = assignment_label(dict(zip(names, initial[r, k - 1])), ";")
                if times is not None:
                    row["observation_times"] = tuple(float(t) for t in times[r, k - 1])
                row["round"] = k if rounds is None else int(rounds[r, k - 1])
                row["cost"] = 0.0 if costs is None else float(costs[r, k - 1])
                rows.append(row)
        return pd.DataFrame(rows)


def run_active_learning(
    task: AbstractLearningTask,
    design: AbstractDesign,
    *,
    key: PRNGKeyArray,
    num_experiments: int,
    horizon: ArrayLike = 3.0,
    candidates: Intervention | None = None,
    max_events: int | None = None,
    initial_state_policy: AbstractInitialStatePolicy = PAPER_INITIAL_STATE,
    batch_size: int = 1,
    costs: Costs | None = None,
    budget: ArrayLike | None = None,
    ranking: AbstractRanking = ByScore(),
) -> ActiveLearningResult:
    r"""One sequential experiment of `num_experiments` steps as a single `jax.lax.scan`.

    `candidates`: the candidate interventions (leading axis; default
    `design_space` of the truth: the whole [`jaxctbn.intervention_space`][] up to
    4096 members, else the single-node interventions; member 0 = no intervention). The same `key`
    gives the same run; two designs run with the same key see the same initial states and the
    same random streams, so their differences are not sampling noise in those.

    `max_events` (static) is the jump buffer of a simulated trajectory; `None` sizes it from the
    truth's exit rates and the horizon ([`jaxctbn.run_repetitions`][] does this outside `jit`;
    here the truth and horizon must then be concrete). A trajectory that overflows it raises an
    error rather than being silently cut.

    `initial_state_policy`: how each experiment's $s_0$ is chosen and what the design sees of it
    ([`jaxctbn.RandomInitialState`][], the paper's and the default; [`jaxctbn.FixedInitialState`][];
    [`jaxctbn.InitialStateDistribution`][]).

    **Batches, costs and budgets** (maths §8): with `batch_size` $B$ (static; it must divide
    `num_experiments`) the experiments run in rounds of $B$ from one initial state, chosen
    together by `design.choose_batch` (greedy BHC/VBHC for a [`jaxctbn.CriterionDesign`][],
    $B$ myopic picks for the EIG, random picks for [`jaxctbn.RandomDesign`][]), each member its
    own simulated path (member 0's from the key a single experiment would use), and the
    posterior learns from all of them after the round. `costs` (a [`jaxctbn.Costs`][]) prices
    each candidate (with the task's panel visits); `ranking`
    ([`jaxctbn.criteria.ByScore`][], [`jaxctbn.criteria.ByScorePerCost`][]) trades score
    against cost; `budget` bounds the total: a candidate the rest of the budget cannot afford
    is never run, and once nothing is affordable the remaining experiments are skipped (index
    -1) and the posterior stays as it was. Without costs and with $B=1$ the loop is the
    sequential one above.

    Compiled (`eqx.filter_jit`): `num_experiments` and `max_events` set the shapes and are
    static; the key, the horizon (a Python number is made an array) and the arrays of the task,
    design, candidates and policy are traced, so a new key, horizon or ground truth of the
    same shapes reuses the compiled loop (Python-number fields, such as a scalar prior's
    hyper-parameters, are static).
    """
    if num_experiments < 1:
        raise ValueError(f"num_experiments must be >= 1, got {num_experiments}.")
    design = design.observing(task.outcome)
    max_events = resolve_max_events(task, horizon, max_events)
    truth = task.truth
    if candidates is None:
        candidates = design_space(truth.cardinalities)
    if candidates.targets.ndim != 2 or candidates.targets.shape[1] != truth.num_nodes:
        raise ValueError(
            f"candidates: expected a batch (candidates, {truth.num_nodes}), got targets of "
            f"shape {candidates.targets.shape}."
        )
    if not isinstance(initial_state_policy, AbstractInitialStatePolicy):
        raise ValueError(
            "initial_state_policy: expected RandomInitialState(), FixedInitialState(...) or "
            f"InitialStateDistribution(...), got {initial_state_policy!r}."
        )
    initial_state_policy.check(truth.cardinalities, truth.names)
    check_batches(batch_size, num_experiments, costs, budget, ranking)
    # static: the Python integers that set the shapes; traced: everything else (a Python-float
    # horizon is made an array, or every new value would compile the loop again)
    return _run_active_learning(
        task,
        design,
        key,
        jnp.asarray(horizon),
        candidates,
        initial_state_policy,
        costs,
        None if budget is None else jnp.asarray(budget, jnp.result_type(float)),
        ranking,
        num_experiments=operator.index(num_experiments),
        max_events=max_events,
        batch_size=batch_size,
    )


def check_batches(batch_size, num_experiments, costs, budget, ranking) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size: must be an integer >= 1, got {batch_size!r}.")
    if num_experiments % batch_size:
        raise ValueError(
            f"batch_size: {batch_size} must divide num_experiments ({num_experiments}): the "
            "experiments run in whole rounds."
        )
    check_pricing(costs, budget, ranking, error=ValueError)


@eqx.filter_jit
def _run_active_learning(
    task,
    design,
    key,
    horizon,
    candidates,
    initial_state_policy,
    costs,
    budget,
    ranking,
    *,
    num_experiments,
    max_events,
    batch_size=1,
):
    """The loop in rounds of `batch_size` experiments chosen together, with costs and a
    budget (see `run_active_learning`); a single experiment is a round of one, chosen by the
    design's own `choose_with_times` when nothing is priced."""
    horizon = jnp.asarray(horizon, jnp.result_type(float))
    horizon = error_if(
        horizon, ~(horizon > 0) | ~jnp.isfinite(horizon), "horizon: must be positive and finite."
    )
    outcome, prior = task.outcome, task.initial_posterior()
    truth = task.truth
    cards = truth.cardinalities
    B = batch_size
    dtype = horizon.dtype
    C = candidates.targets.shape[0]
    visits = outcome.num_priced_visits
    prices = jnp.zeros((C,), dtype) if costs is None else costs.of(candidates, num_visits=visits)
    prices = prices.astype(dtype)
    total = jnp.asarray(jnp.inf, dtype) if budget is None else jnp.asarray(budget, dtype)
    total = error_if(total, ~(total >= 0), "budget: must be a number >= 0.")

    def update(posterior, member):
        path, run, times, key = member
        new = _update(task, posterior, path, times, key)
        return jax.tree_util.tree_map(
            lambda a, b: jnp.where(run, a, b) if eqx.is_array(a) else a, new, posterior
        ), None

    def step(carry, key):
        posterior, spent = carry
        k_init, k_design, k_path = jr.split(key, 3)
        initial_state = initial_state_policy.draw(k_init, cards)
        seen = initial_state_policy.revealed(initial_state, cards)
        if B == 1 and costs is None:  # one experiment, nothing priced: the design's choice
            index, times = design.choose_with_times(
                posterior, candidates, seen, horizon, k_design, outcome=outcome
            )
            members = jnp.asarray(index)[None]
            times = None if times is None else times[None]
        else:
            members, times = design.choose_batch(
                posterior,
                candidates,
                seen,
                horizon,
                k_design,
                outcome=outcome,
                size=B,
                costs=prices,
                remaining=total - spent,
                ranking=ranking,
            )
        run = members >= 0
        index = jnp.maximum(members, 0)
        ivs = jax.tree_util.tree_map(lambda a: a[index], candidates)
        ivs = eqx.tree_at(lambda i: i.targets, ivs, ivs.targets & run[:, None])
        # member 0 simulated from the key a single experiment would use
        keys = jnp.stack([k_path, *(jr.fold_in(k_path, b) for b in range(1, B))])
        paths = jax.vmap(
            lambda iv, k: sample_trajectory(
                truth, initial_state, horizon, key=k, intervention=iv, max_events=max_events
            )
        )(ivs, keys)
        update_keys = jax.vmap(lambda k: jr.fold_in(k, _UPDATE_STREAM))(keys)
        posterior, _ = jax.lax.scan(update, posterior, (paths, run, times, update_keys))
        member_costs = jnp.where(run, prices[index], 0.0)
        record = (
            task.metrics(posterior),
            members,
            ivs.targets,
            jnp.where(run[:, None], ivs.states, 0),
            paths.initial_states,
            jnp.where(run, paths.num_events, 0),
            times,
            spent + jnp.cumsum(member_costs),
        )
        return (posterior, spent + member_costs.sum()), record

    rounds = num_experiments // B
    (final, _), records = jax.lax.scan(step, (prior, jnp.zeros((), dtype)), jr.split(key, rounds))
    metrics, index, targets, states, initial, events, times, spent = records

    def flat(a: Array) -> Array:
        return a.reshape(rounds * B, *a.shape[2:])

    start = task.metrics(prior)
    metrics = {
        name: jnp.concatenate([jnp.asarray(start[name])[None], jnp.repeat(m, B, axis=0)])
        for name, m in metrics.items()
    }
    return ActiveLearningResult(
        metrics=metrics,
        intervention_index=flat(index),
        targets=flat(targets),
        states=flat(states),
        initial_states=flat(initial),
        num_events=flat(events),
        posterior=final,
        observation_times=None if times is None else flat(times),
        rounds=jnp.repeat(jnp.arange(1, rounds + 1), B),
        costs=flat(spent),
    )


#: The random stream of a posterior update that samples (a particle filter), folded into the
#: experiment's path key (the design's, the initial state's and the path's streams unchanged).
_UPDATE_STREAM = 0x7570


def _update(task, posterior, path, times, key):
    """The task's posterior after one experiment: its visit times when the design chose them,
    and a key for a posterior family that samples."""
    if times is None:
        return task.update(posterior, path, key=key)
    return task.update(posterior, path, observation_times=times, key=key)


def resolve_max_events(task, horizon, max_events) -> int:
    """`max_events`, or when `None` the automatic buffer for the truth's rates and `horizon`."""
    if max_events is not None:
        check_count(max_events, "max_events")
        return int(max_events)
    if isinstance(horizon, jax.core.Tracer) or np.ndim(horizon) != 0:
        auto = None
    elif not (float(horizon) > 0 and math.isfinite(float(horizon))):
        return 1  # any size: the horizon check in the loop raises before a path is used
    else:
        auto = automatic_max_events(task.truth, float(horizon))
    if auto is None:
        raise ValueError(
            "max_events: cannot size the event buffer from traced rates or horizon (inside "
            "jit); pass max_events explicitly."
        )
    return auto
