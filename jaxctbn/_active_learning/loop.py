r"""Sequential active learning: designs, learning tasks and the compiled experiment loop.

One run is $K$ experiments. In experiment $k$: an initial state $s_0$ is chosen by the
initial-state policy (by default drawn uniformly at random and revealed to the design, as in
the paper); the design picks an intervention $i_k$ from a fixed batch of
candidates (by default the paper's whole space, [`jaxctbn.intervention_space`][], or for large
networks the single-node interventions: [`jaxctbn.design_space`][]); one trajectory
of length $\tau$ is simulated from the ground truth under $i_k$; the posterior is updated with
pooling (an intervened node learns nothing from that trajectory); metrics are recorded.

The whole loop is one `jax.lax.scan`, and [`jaxctbn.run_repetitions`][] vmaps it over
independent repetitions, so a batch of repetitions is one compiled call. Designs are Equinox
modules, so a new design is a small class (or a [`jaxctbn.CallableDesign`][] around a function).
"""

from __future__ import annotations

import abc
import dataclasses
import math
import operator
from collections.abc import Callable
from typing import ClassVar, Literal

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, Key, PRNGKeyArray, UInt32

from .._criteria.batching import AbstractBatching, Sharded, Vmap
from .._criteria.criteria import BHC, EIG, VBHC, AbstractCriterion, score_interventions
from .._criteria.structure import AbstractGraphDraws, StratifiedGraphDraws
from .._errors import error_message
from .._learning.empirical_bayes import EmpiricalBayes
from .._learning.family_statistics import family_statistics
from .._learning.optimisers import LBFGS
from .._learning.posterior import AbstractPosterior, RatePosterior
from .._learning.priors import AbstractPrior, GammaPrior
from .._learning.structure_posterior import StructurePosterior
from .._master_equation.solvers import AUTOMATIC_SOLVER, StatisticsSolver
from .._model.ctbn import CTBN
from .._model.interventions import Intervention, design_space
from .._model.layout import all_global_states
from .._paths.sampling import Trajectories, automatic_max_events, check_count, sample_trajectory
from .._paths.sufficient_statistics import SufficientStatistics
from .metrics import adjacency_from_parents, edge_aupr, edge_auroc, structural_hamming_distance

# --------------------------------------------------------------------------------- designs


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

    def choose(self, posterior, candidates, initial_state, horizon, key) -> Int[Array, ""]:
        """Index of the chosen candidate: the `argmax` of `scores`."""
        return jnp.argmax(self.scores(posterior, candidates, initial_state, horizon, key))


class PassiveDesign(AbstractDesign):
    """Never intervenes: picks the candidate with no target (it must be among the candidates)."""

    def scores(self, posterior, candidates, initial_state, horizon, key):
        return (~candidates.targets.any(-1)).astype(jnp.result_type(float))


class RandomDesign(AbstractDesign):
    """Picks a candidate uniformly at random."""

    def scores(self, posterior, candidates, initial_state, horizon, key):
        return jr.uniform(key, candidates.targets.shape[:1])


def _as_flag(value):
    """A concrete flag as a NumPy boolean (traced under `eqx.filter_jit`, unlike a Python
    bool, and hashable; `bool(flag)` still works); a JAX array (e.g. a tracer) is kept."""
    return value if isinstance(value, jax.Array) else np.bool_(value)


class CriterionDesign(AbstractDesign):
    r"""Picks the intervention that maximises a design criterion, scored over all candidates in
    one call of [`jaxctbn.score_interventions`][] (for either learning target).

    **Arguments:** `criterion` ([`jaxctbn.VBHC`][], [`jaxctbn.BHC`][], [`jaxctbn.EIG`][] or any
    [`jaxctbn.AbstractCriterion`][]); keyword-only `num_samples` ($N_S$), `worst` (pick the
    *least* informative candidate: "negative VBHC", the paper's control), `solver`, `batching`
    (see [`jaxctbn.score_interventions`][]).
    """

    criterion: AbstractCriterion
    num_samples: int = eqx.field(default=10, static=True, kw_only=True)
    # a value, not a static field: the best and the worst design share one compiled loop
    worst: bool | np.bool_ | Bool[Array, ""] = eqx.field(
        default=False, kw_only=True, converter=_as_flag
    )
    solver: StatisticsSolver = eqx.field(default=AUTOMATIC_SOLVER, kw_only=True)
    batching: AbstractBatching | None = eqx.field(default=None, kw_only=True)

    def __check_init__(self):
        if not isinstance(self.criterion, AbstractCriterion):
            raise ValueError(
                f"criterion: expected a criterion Module (VBHC(), BHC(), EIG()), got "
                f"{self.criterion!r}."
            )
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {self.num_samples}.")

    def scores(self, posterior, candidates, initial_state, horizon, key):
        s = score_interventions(
            posterior,
            candidates,
            initial_state,
            horizon,
            criterion=self.criterion,
            key=key,
            num_samples=self.num_samples,
            solver=self.solver,
            batching=self.batching,
        )
        return jnp.where(self.worst, -s, s)


class CallableDesign(AbstractDesign):
    """A user criterion: `fn(posterior, candidates, initial_state, horizon, key)` returns one
    score per candidate (larger = better). `fn` must be pure and jittable."""

    fn: Callable = eqx.field(static=True)

    def scores(self, posterior, candidates, initial_state, horizon, key):
        return self.fn(posterior, candidates, initial_state, horizon, key)


#: Design names understood by [`jaxctbn.design_from_name`][] and `jaxctbn run --designs`.
DESIGN_NAMES = ("passive", "random", "vbhc", "bhc", "vbhc-optax", "eig", "negative-vbhc")
DesignName = Literal["passive", "random", "vbhc", "bhc", "vbhc-optax", "eig", "negative-vbhc"]


def design_from_name(
    name: DesignName | str,
    *,
    num_samples: int = 10,
    num_paths: int = 10,
    graph_draws: AbstractGraphDraws | None = None,
    max_sets: int | None = None,
) -> AbstractDesign:
    """The design behind a CLI name: `"passive"`, `"random"`, `"vbhc"` (`VBHC()`), `"bhc"`,
    `"vbhc-optax"` (`VBHC(optimiser=LBFGS())`), `"eig"` (`EIG(num_paths=num_paths)`) or
    `"negative-vbhc"` (the worst candidate by the VBHC). `graph_draws` (default `None` =
    [`jaxctbn.StratifiedGraphDraws`][]) and `max_sets` go to the (V)BHC (structure learning; see
    [`jaxctbn.VBHC`][])."""
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
        return CriterionDesign(VBHC(**box_hill), num_samples=num_samples, worst=True)
    if name in criteria:
        return CriterionDesign(criteria[name], num_samples=num_samples)
    raise ValueError(f"design: unknown name {name!r}; valid: {', '.join(DESIGN_NAMES)}.")


# ------------------------------------------------------------------- initial-state policies


class AbstractInitialStatePolicy(eqx.Module):
    """How the initial state $s_0$ of each experiment is chosen, and what the design sees of it.

    `draw` returns the state the trajectory starts in; `revealed` what the design is given:
    the state itself, or a distribution over global states `(S,)` when $s_0$ is hidden (the
    (V)BHC then score the expected statistics under that distribution)."""

    @abc.abstractmethod
    def draw(self, key: PRNGKeyArray, cardinalities: tuple[int, ...]) -> Int[Array, " nodes"]:
        """The initial state of one experiment (jittable)."""

    def revealed(self, state: Int[Array, " nodes"], cardinalities: tuple[int, ...]) -> Array:
        """What the design sees: by default the drawn state."""
        return state

    def check(self, cardinalities: tuple[int, ...], names: tuple[str, ...]) -> None:
        """Raise `ValueError` if the policy does not fit a network with these cardinalities."""


class RandomInitialState(AbstractInitialStatePolicy):
    """$s_0$ uniform over the global states, revealed to the design (the paper's choice, §6)."""

    def draw(self, key, cardinalities):
        return _random_state(key, cardinalities)


class FixedInitialState(AbstractInitialStatePolicy):
    """The same $s_0$ in every experiment (known to the design). **Argument:** `state`, one
    state per node."""

    state: tuple[int, ...] = eqx.field(static=True)

    def __init__(self, state):
        state = tuple(int(s) for s in np.ravel(np.asarray(state)))
        if not state or any(s < 0 for s in state):
            raise ValueError(f"state: need one non-negative state per node, got {state}.")
        self.state = state

    def check(self, cardinalities, names):
        if len(self.state) != len(cardinalities):
            raise ValueError(
                f"initial state: need {len(cardinalities)} node states, got {len(self.state)}."
            )
        for s, k, name in zip(self.state, cardinalities, names):
            if not 0 <= s < k:
                raise ValueError(f"initial state: node {name!r} has states 0..{k - 1}, got {s}.")

    def draw(self, key, cardinalities):
        return jnp.asarray(self.state, jnp.int32)


class InitialStateDistribution(AbstractInitialStatePolicy):
    r"""$s_0$ drawn from a distribution over the global states (`probabilities`, `(S,)` in
    product order or one axis per node; default uniform). With `revealed=False` (default) the
    design sees only the distribution, not the draw ("a distribution of initial states", §6); with
    `revealed=True` it sees the drawn state. With a hidden state the (V)BHC score the expected
    statistics under the distribution, and the EIG draws each sampled path's initial state from
    it."""

    probabilities: Float[Array, "..."] | None = None
    revealed_to_design: bool = eqx.field(default=False, static=True, kw_only=True)

    def __init__(self, probabilities=None, *, revealed: bool = False):
        if probabilities is not None:
            p = np.asarray(probabilities, float)
            if np.any(~np.isfinite(p)) or np.any(p < 0) or abs(p.sum() - 1) > 1e-9:
                raise ValueError(
                    "probabilities: must be finite, non-negative and sum to 1 (one per global "
                    "state)."
                )
            probabilities = jnp.asarray(p.ravel())
        self.probabilities = probabilities
        self.revealed_to_design = bool(revealed)

    def check(self, cardinalities, names):
        S = math.prod(cardinalities)
        if self.probabilities is not None and self.probabilities.shape[0] != S:
            raise ValueError(
                f"probabilities: need one per global state ({S}), got "
                f"{self.probabilities.shape[0]}."
            )

    def _probabilities(self, cardinalities):
        S = math.prod(cardinalities)
        if self.probabilities is None:
            return jnp.full((S,), 1.0 / S)
        return self.probabilities

    def draw(self, key, cardinalities):
        p = self._probabilities(cardinalities)
        index = jr.choice(key, p.shape[0], p=p)
        return jnp.asarray(all_global_states(tuple(cardinalities)))[index]

    def revealed(self, state, cardinalities):
        if self.revealed_to_design:
            return state
        return self._probabilities(cardinalities).astype(jnp.result_type(float))


#: The paper's initial-state policy (uniform, revealed), the default of the loop.
PAPER_INITIAL_STATE = RandomInitialState()


# --------------------------------------------------------------------------------- tasks


def _as_batch(path: Trajectories) -> Trajectories:
    return jax.tree_util.tree_map(lambda a: a[None], path)


class AbstractLearningTask(eqx.Module):
    """What is being learned: the ground truth, the prior, how one trajectory updates the
    posterior and which metrics are recorded. `metric_labels` (a class attribute) names every
    metric `metrics` returns: `{name: (label, "higher" | "lower" is better)}`; the experiment
    tables and figures read it."""

    truth: eqx.AbstractVar[CTBN]
    metric_labels: ClassVar[dict[str, tuple[str, str]]]

    @abc.abstractmethod
    def initial_posterior(self) -> AbstractPosterior:
        """The posterior before any experiment."""

    @abc.abstractmethod
    def update(self, posterior: AbstractPosterior, path: Trajectories) -> AbstractPosterior:
        """The posterior after one more simulated trajectory (pooled across interventions)."""

    @abc.abstractmethod
    def metrics(self, posterior: AbstractPosterior) -> dict[str, Array]:
        """Scalar metrics of `posterior` against the truth, keyed as `metric_labels`."""


class StructureLearningTask(AbstractLearningTask):
    r"""Exact Bayesian structure learning (exhaustive parent sets with in-degree
    $\le$ `max_parents`, rate prior `prior`, default [`jaxctbn.GammaPrior`][]`(1, 1)`; with
    `empirical_bayes=`[`jaxctbn.EmpiricalBayes`][]`()` the prior's hyper-parameters are refitted
    to the data after every experiment, starting from `prior`). Metrics:
    edge AUROC and AUPR of the posterior edge marginals against the true graph, structural
    Hamming distance of the MAP graph, and the entropy of the structure posterior (nats). The
    truth needs at least 2 nodes, one edge and one absent edge (else AUROC/AUPR are undefined);
    other truths are refused here with a `ValueError`."""

    truth: CTBN
    max_parents: int = eqx.field(static=True, kw_only=True)
    prior: AbstractPrior = eqx.field(default=GammaPrior(), kw_only=True)
    empirical_bayes: EmpiricalBayes | None = eqx.field(default=None, kw_only=True)
    metric_labels: ClassVar[dict[str, tuple[str, str]]] = {
        "auroc": ("AUROC", "higher"),
        "aupr": ("AUPR", "higher"),
        "shd": ("SHD of the MAP graph", "lower"),
        "entropy": ("structure posterior entropy (nats)", "lower"),
    }

    def __check_init__(self):
        N = self.truth.num_nodes
        if N < 2:
            raise ValueError(
                f"truth: structure learning needs at least 2 nodes (a {N}-node network has no "
                "candidate edges, so its AUROC and AUPR are undefined)."
            )
        edges = sum(len(self.truth.parent_list(n)) for n in range(N))
        if edges == 0 or edges == N * (N - 1):
            raise ValueError(
                f"truth: the edge AUROC/AUPR need a true graph with at least one edge and one "
                f"absent edge; this one has {'no edges' if edges == 0 else 'every edge'}."
            )
        if not 0 <= self.max_parents < self.truth.num_nodes:
            raise ValueError(
                f"max_parents must be in 0..{self.truth.num_nodes - 1}, got {self.max_parents}."
            )

    def initial_posterior(self) -> StructurePosterior:
        prior = self.prior
        if self.empirical_bayes is not None:
            prior = self.empirical_bayes.initial_prior(prior, self.truth.num_nodes)
        return StructurePosterior.from_prior(
            self.truth.names,
            self.truth.cardinalities,
            max_parents=self.max_parents,
            prior=prior,
        )

    def update(self, posterior: StructurePosterior, path: Trajectories) -> StructurePosterior:
        new = family_statistics(_as_batch(path), posterior.cardinalities, posterior.parent_sets)
        posterior = posterior.update(new)
        if self.empirical_bayes is not None:
            posterior = self.empirical_bayes.fit(posterior)
        return posterior

    def metrics(self, posterior: StructurePosterior) -> dict[str, Array]:
        true = adjacency_from_parents(self.truth.parents, self.truth.num_nodes)
        edges = posterior.edge_marginals()
        return {
            "auroc": edge_auroc(edges, true),
            "aupr": edge_aupr(edges, true),
            "shd": structural_hamming_distance(posterior.map_adjacency(), true).astype(edges.dtype),
            "entropy": posterior.entropy(),
        }


class ParameterLearningTask(AbstractLearningTask):
    r"""Bayesian rate learning for the known graph of `truth` (rate prior `prior`, a
    [`jaxctbn.GammaPrior`][], default $(1, 1)$). Metric: the posterior-averaged squared error
    $\mathsf E[(\Lambda-\Lambda^*)^2]$ ([`jaxctbn.RatePosterior.mse`][])."""

    truth: CTBN
    prior: GammaPrior = eqx.field(default=GammaPrior(), kw_only=True)
    metric_labels: ClassVar[dict[str, tuple[str, str]]] = {
        "mse": ("posterior MSE of the rates", "lower")
    }

    def initial_posterior(self) -> RatePosterior:
        return RatePosterior.for_model(self.truth, prior=self.prior)

    def update(self, posterior: RatePosterior, path: Trajectories) -> RatePosterior:
        stats = SufficientStatistics.from_trajectories(
            _as_batch(path), posterior.cardinalities, posterior.parents
        )
        return posterior.update_with(stats)

    def metrics(self, posterior: RatePosterior) -> dict[str, Array]:
        return {"mse": posterior.mse(self.truth)}


# --------------------------------------------------------------------------------- the loop


class ActiveLearningResult(eqx.Module):
    """The record of one run (or, from [`jaxctbn.run_repetitions`][], of a batch of runs with a
    leading repetition axis).

    - `metrics[name]`: `(experiments + 1,)`, entry 0 before any experiment;
    - `intervention_index`: `(experiments,)` index of the chosen candidate;
    - `targets`, `states`: `(experiments, nodes)` the chosen perfect intervention;
    - `initial_states`: `(experiments, nodes)` the drawn (and revealed) initial states;
    - `num_events`: `(experiments,)` transitions in each simulated trajectory;
    - `posterior`: the posterior after the last experiment.
    """

    metrics: dict[str, Array]
    intervention_index: Array
    targets: Array
    states: Array
    initial_states: Array
    num_events: Array
    posterior: eqx.Module


def _random_state(key, cardinalities):
    return jnp.stack(
        [jr.randint(k, (), 0, c) for k, c in zip(jr.split(key, len(cardinalities)), cardinalities)]
    ).astype(jnp.int32)


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
) -> ActiveLearningResult:
    r"""One sequential experiment of `num_experiments` steps as a single `jax.lax.scan`.

    `candidates`: the candidate interventions (leading axis; default
    [`jaxctbn.design_space`][] of the truth: the whole [`jaxctbn.intervention_space`][] up to
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

    Compiled (`eqx.filter_jit`): `num_experiments` and `max_events` set the shapes and are
    static; the key, the horizon (a Python number is made an array) and the arrays of the task,
    design, candidates and policy are traced, so a new key, horizon or ground truth of the
    same shapes reuses the compiled loop (Python-number fields, such as a scalar prior's
    hyper-parameters, are static).
    """
    if num_experiments < 1:
        raise ValueError(f"num_experiments must be >= 1, got {num_experiments}.")
    max_events = _resolve_max_events(task, horizon, max_events)
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
    # static: the Python integers that set the shapes; traced: everything else (a Python-float
    # horizon is made an array, or every new value would compile the loop again)
    return _run_active_learning(
        task,
        design,
        key,
        jnp.asarray(horizon),
        candidates,
        initial_state_policy,
        num_experiments=operator.index(num_experiments),
        max_events=max_events,
    )


@eqx.filter_jit
def _run_active_learning(
    task, design, key, horizon, candidates, initial_state_policy, *, num_experiments, max_events
):
    truth = task.truth
    horizon = jnp.asarray(horizon, jnp.result_type(float))
    horizon = eqx.error_if(
        horizon, ~(horizon > 0) | ~jnp.isfinite(horizon), "horizon: must be positive and finite."
    )
    cards = truth.cardinalities

    def step(posterior, key):
        k_init, k_design, k_path = jr.split(key, 3)
        initial_state = initial_state_policy.draw(k_init, cards)
        seen = initial_state_policy.revealed(initial_state, cards)
        index = design.choose(posterior, candidates, seen, horizon, k_design)
        iv = jax.tree_util.tree_map(lambda a: a[index], candidates)
        path = sample_trajectory(
            truth, initial_state, horizon, key=k_path, intervention=iv, max_events=max_events
        )
        posterior = task.update(posterior, path)
        record = (
            task.metrics(posterior),
            index,
            iv.targets,
            iv.states,
            path.initial_states,
            path.num_events,
        )
        return posterior, record

    prior = task.initial_posterior()
    final, (metrics, index, targets, states, initial, events) = jax.lax.scan(
        step, prior, jr.split(key, num_experiments)
    )
    start = task.metrics(prior)
    metrics = {
        name: jnp.concatenate([jnp.asarray(start[name])[None], m]) for name, m in metrics.items()
    }
    return ActiveLearningResult(
        metrics=metrics,
        intervention_index=index,
        targets=targets,
        states=states,
        initial_states=initial,
        num_events=events,
        posterior=final,
    )


def _resolve_max_events(task, horizon, max_events) -> int:
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


def _one_repetition(task, design, num_experiments, horizon, candidates, max_events, policy, key):
    return run_active_learning(
        task,
        design,
        key=key,
        num_experiments=num_experiments,
        horizon=horizon,
        candidates=candidates,
        max_events=max_events,
        initial_state_policy=policy,
    )


@eqx.filter_jit
def _map_batch(batching, fn, keys):
    return batching.map(fn, keys)


def _run_batch(batching, task, design, keys, *settings):
    # `fn` is a pytree (the task's arrays are traced), so every batch reuses one program
    fn = eqx.Partial(_one_repetition, task, design, *settings)
    if isinstance(batching, Sharded):
        # Called from the host, Sharded compiles its own program without communication between
        # devices, so a failing repetition raises instead of stalling the other devices.
        return batching.map(fn, keys)
    return _map_batch(batching, fn, keys)


@dataclasses.dataclass(frozen=True)
class RepetitionStatus:
    """Which repetitions of a [`jaxctbn.run_repetitions`][] batch failed, and why (host-side).

    - `ok[r]`: whether repetition `r` finished;
    - `messages[r]`: the first line of its error (`""` when it finished). Rerun
      `run_active_learning(..., key=keys[r])` to see the whole error.
    """

    ok: np.ndarray
    messages: tuple[str, ...]

    @property
    def num_failed(self) -> int:
        return int((~self.ok).sum())


def _failed_like(shapes) -> ActiveLearningResult:
    """A result with the structure of `shapes` (from `eqx.filter_eval_shape`) with NaN in every
    float, False in every boolean and -1 in every integer array."""

    def fill(a):
        if not isinstance(a, jax.ShapeDtypeStruct):
            return a
        if np.issubdtype(a.dtype, np.inexact):
            return np.full(a.shape, np.nan, a.dtype)
        if np.issubdtype(a.dtype, np.bool_):
            return np.zeros(a.shape, a.dtype)
        return np.full(a.shape, -1, a.dtype)

    return jax.tree_util.tree_map(fill, shapes)


def run_repetitions(
    task: AbstractLearningTask,
    design: AbstractDesign,
    keys: Key[Array, " repetitions"] | UInt32[Array, "repetitions 2"],
    *,
    num_experiments: int,
    horizon: ArrayLike = 3.0,
    candidates: Intervention | None = None,
    max_events: int | None = None,
    initial_state_policy: AbstractInitialStatePolicy = PAPER_INITIAL_STATE,
    throw: bool = True,
    batching: AbstractBatching | None = None,
) -> ActiveLearningResult | tuple[ActiveLearningResult, RepetitionStatus]:
    """[`jaxctbn.run_active_learning`][] vmapped over a batch of keys (one per repetition), as
    one compiled computation. Every result field gets a leading repetition axis.

    With `throw=True` (default) an error in any repetition (an overflowing path buffer, a
    non-finite rate, ...) raises, as everywhere in jaxctbn. With `throw=False` one failing
    repetition does not abort the batch: returns `(result, status)`, a
    [`jaxctbn.RepetitionStatus`][] saying which repetitions failed and why; a failed
    repetition's fields are NaN (floats) or -1 (integers). The batch runs as one compiled call;
    only when it fails are its repetitions rerun one at a time (one more compilation) to tell
    the failing ones from the others, so a clean batch costs nothing extra.

    `max_events=None` sizes the jump buffer from the truth's exit rates and `horizon` (see
    [`jaxctbn.run_active_learning`][]); `initial_state_policy` as there.

    `batching` says how the repetitions are executed: `None` (default) or [`jaxctbn.Vmap`][],
    all in one vmap; [`jaxctbn.Chunked`][], a few at a time; [`jaxctbn.Sharded`][], split across
    devices. Each repetition depends on its key only, so every choice gives the same results
    (up to rounding). With `throw=False` the reruns of a failed batch run one at a time on one
    device."""
    max_events = _resolve_max_events(task, horizon, max_events)
    if batching is None:
        batching = Vmap()
    if not isinstance(batching, AbstractBatching):
        raise ValueError(
            f"batching: expected Vmap(), Chunked(size) or Sharded(...), got {batching!r}."
        )
    # a Python-float horizon made an array: traced, not baked into the compiled batch
    settings = (num_experiments, jnp.asarray(horizon), candidates, max_events, initial_state_policy)
    if throw:
        return _run_batch(batching, task, design, keys, *settings)
    num = int(jnp.shape(keys)[0])
    try:
        result = _run_batch(batching, task, design, keys, *settings)
        jax.block_until_ready(result)
        return result, RepetitionStatus(ok=np.ones(num, bool), messages=("",) * num)
    except (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError):
        pass
    singles, messages = [], []
    for r in range(num):
        try:
            one = _run_batch(Vmap(), task, design, keys[r : r + 1], *settings)
            singles.append(jax.device_get(one))
            messages.append("")
        except (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError) as error:
            singles.append(None)
            messages.append(error_message(error))
    fn = eqx.Partial(_one_repetition, task, design, *settings)
    filler = _failed_like(eqx.filter_eval_shape(_map_batch, Vmap(), fn, keys[:1]))
    result = jax.tree_util.tree_map(
        lambda *xs: np.concatenate(xs), *[filler if x is None else x for x in singles]
    )
    ok = np.array([m == "" for m in messages])
    return result, RepetitionStatus(ok=ok, messages=tuple(messages))
