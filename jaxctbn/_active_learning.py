r"""Sequential active learning: designs, learning tasks and the compiled experiment loop.

One run is $K$ experiments. In experiment $k$: an initial state $s_0$ is drawn uniformly at
random and revealed to the design; the design picks an intervention $i_k$ from a fixed batch of
candidates (by default the paper's whole space, [`jaxctbn.intervention_space`][]); one trajectory
of length $\tau$ is simulated from the ground truth under $i_k$; the posterior is updated with
pooling (an intervened node learns nothing from that trajectory); metrics are recorded.

The whole loop is one `jax.lax.scan`, and [`jaxctbn.run_repetitions`][] vmaps it over
independent repetitions, so a batch of repetitions is one compiled call. Designs are Equinox
modules, so a new design is a small class (or a [`jaxctbn.CallableDesign`][] around a function).
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from ._criteria import PARAMETER_CRITERIA, score_interventions
from ._ctbn import CTBN
from ._interventions import Intervention, intervention_space
from ._metrics import adjacency_from_parents, edge_aupr, edge_auroc, structural_hamming_distance
from ._posterior import RatePosterior
from ._sampling import Trajectories, sample_trajectory
from ._solvers import DEFAULT_SOLVER, AbstractMasterEquationSolver
from ._statistics import SufficientStatistics
from ._structure import StructurePosterior, family_statistics
from ._structure_criteria import STRUCTURE_CRITERIA, score_interventions_structure

# --------------------------------------------------------------------------------- designs


class AbstractDesign(eqx.Module):
    """Chooses the next intervention from a batch of candidates.

    Subclasses implement `scores(posterior, interventions, initial, horizon, key)`, one score
    per candidate (larger = better); `choose` returns the index of the best one.
    """

    @abc.abstractmethod
    def scores(
        self,
        posterior,
        interventions: Intervention,
        initial: Int[Array, " nodes"],
        horizon: Float[Array, ""],
        key: PRNGKeyArray,
    ) -> Float[Array, " interventions"]:
        raise NotImplementedError

    def choose(self, posterior, interventions, initial, horizon, key) -> Int[Array, ""]:
        return jnp.argmax(self.scores(posterior, interventions, initial, horizon, key))


class PassiveDesign(AbstractDesign):
    """Never intervenes: picks the candidate with no target (it must be among the candidates)."""

    def scores(self, posterior, interventions, initial, horizon, key):
        return (~interventions.targets.any(-1)).astype(jnp.result_type(float))


class RandomDesign(AbstractDesign):
    """Picks a candidate uniformly at random."""

    def scores(self, posterior, interventions, initial, horizon, key):
        return jr.uniform(key, interventions.targets.shape[:1])


class CriterionDesign(AbstractDesign):
    r"""Picks the intervention that maximises a design criterion, scored over all candidates in
    one call ([`jaxctbn.score_interventions`][] for a [`jaxctbn.RatePosterior`][],
    [`jaxctbn.score_interventions_structure`][] for a [`jaxctbn.StructurePosterior`][]).

    **Arguments (keyword-only after `criterion`):** `criterion` (`"vbhc"`, `"bhc"`,
    `"vbhc-optax"`, `"eig"`), `num_samples` ($N_S$), `num_paths` (paths per draw, for `"eig"` and
    the Monte Carlo KL), `estimator` (structure KL: `"plug-in"` or `"monte-carlo"`), `worst`
    (pick the *least* informative candidate: "negative VBHC", the paper's control), `batch_size`
    (map over chunks of candidates to bound memory), `solver`.
    """

    criterion: str = eqx.field(static=True)
    num_samples: int = eqx.field(default=10, static=True, kw_only=True)
    num_paths: int = eqx.field(default=10, static=True, kw_only=True)
    estimator: str = eqx.field(default="plug-in", static=True, kw_only=True)
    worst: bool = eqx.field(default=False, static=True, kw_only=True)
    batch_size: int | None = eqx.field(default=None, static=True, kw_only=True)
    solver: AbstractMasterEquationSolver = eqx.field(default=DEFAULT_SOLVER, kw_only=True)

    def __check_init__(self):
        valid = sorted(set(PARAMETER_CRITERIA) | set(STRUCTURE_CRITERIA))
        if self.criterion not in valid:
            raise ValueError(f"criterion must be one of {valid}, got {self.criterion!r}.")
        if self.num_samples < 1 or self.num_paths < 1:
            raise ValueError("num_samples and num_paths must be >= 1.")
        if self.estimator not in ("plug-in", "monte-carlo"):
            raise ValueError(
                f"estimator must be 'plug-in' or 'monte-carlo', got {self.estimator!r}."
            )

    def scores(self, posterior, interventions, initial, horizon, key):
        common = dict(
            key=key,
            num_samples=self.num_samples,
            criterion=self.criterion,
            num_paths=self.num_paths,
            solver=self.solver,
            batch_size=self.batch_size,
        )
        if isinstance(posterior, StructurePosterior):
            s = score_interventions_structure(
                posterior, interventions, initial, horizon, estimator=self.estimator, **common
            )
        elif isinstance(posterior, RatePosterior):
            s = score_interventions(posterior, interventions, initial, horizon, **common)
        else:
            raise TypeError(
                f"posterior: expected a RatePosterior or StructurePosterior, got {type(posterior)}."
            )
        return -s if self.worst else s


class CallableDesign(AbstractDesign):
    """A user criterion: `fn(posterior, interventions, initial, horizon, key)` returns one score
    per candidate (larger = better). `fn` must be pure and jittable."""

    fn: Callable = eqx.field(static=True)

    def scores(self, posterior, interventions, initial, horizon, key):
        return self.fn(posterior, interventions, initial, horizon, key)


#: Design names understood by [`jaxctbn.design_from_name`][] and `jaxctbn run --designs`.
DESIGN_NAMES = ("passive", "random", "vbhc", "bhc", "vbhc-optax", "eig", "negative-vbhc")


def design_from_name(name: str, *, num_samples: int = 10, num_paths: int = 10) -> AbstractDesign:
    """`"passive"`, `"random"`, a criterion (`"vbhc"`, `"bhc"`, `"vbhc-optax"`, `"eig"`) or
    `"negative-vbhc"` (the worst candidate by the VBHC)."""
    if name == "passive":
        return PassiveDesign()
    if name == "random":
        return RandomDesign()
    if name == "negative-vbhc":
        return CriterionDesign("vbhc", num_samples=num_samples, num_paths=num_paths, worst=True)
    if name in ("vbhc", "bhc", "vbhc-optax", "eig"):
        return CriterionDesign(name, num_samples=num_samples, num_paths=num_paths)
    raise ValueError(f"design: unknown name {name!r}; valid: {', '.join(DESIGN_NAMES)}.")


# --------------------------------------------------------------------------------- tasks


def _as_batch(path: Trajectories) -> Trajectories:
    return jax.tree_util.tree_map(lambda a: a[None], path)


class AbstractLearningTask(eqx.Module):
    """What is being learned: the ground truth, the prior, how one trajectory updates the
    posterior and which metrics are recorded."""

    truth: eqx.AbstractVar[CTBN]

    @abc.abstractmethod
    def prior(self):
        raise NotImplementedError

    @abc.abstractmethod
    def update(self, posterior, path: Trajectories):
        raise NotImplementedError

    @abc.abstractmethod
    def metrics(self, posterior) -> dict[str, Array]:
        raise NotImplementedError


class StructureLearningTask(AbstractLearningTask):
    r"""Exact Bayesian structure learning (exhaustive parent sets with in-degree
    $\le$ `max_parents`, Gamma($\alpha$, $\beta$) rate priors). Metrics: edge AUROC and AUPR of
    the posterior edge marginals against the true graph, structural Hamming distance of the MAP
    graph, and the entropy of the structure posterior (nats)."""

    truth: CTBN
    max_parents: int = eqx.field(static=True, kw_only=True)
    alpha: float = eqx.field(default=1.0, kw_only=True)
    beta: float = eqx.field(default=1.0, kw_only=True)

    def __check_init__(self):
        if not 0 <= self.max_parents < self.truth.num_nodes:
            raise ValueError(
                f"max_parents must be in 0..{self.truth.num_nodes - 1}, got {self.max_parents}."
            )

    def prior(self) -> StructurePosterior:
        return StructurePosterior.from_prior(
            self.truth.names,
            self.truth.cardinalities,
            max_parents=self.max_parents,
            alpha=self.alpha,
            beta=self.beta,
        )

    def update(self, posterior: StructurePosterior, path: Trajectories) -> StructurePosterior:
        new = family_statistics(_as_batch(path), posterior.cardinalities, posterior.parent_sets)
        return posterior.update(new)

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
    r"""Bayesian rate learning for the known graph of `truth` (Gamma($\alpha$, $\beta$) priors).
    Metric: the posterior-averaged squared error $\mathsf E[(\Lambda-\Lambda^*)^2]$
    ([`jaxctbn.RatePosterior.mse`][])."""

    truth: CTBN
    alpha: float = eqx.field(default=1.0, kw_only=True)
    beta: float = eqx.field(default=1.0, kw_only=True)

    def prior(self) -> RatePosterior:
        return RatePosterior.for_model(self.truth, alpha=self.alpha, beta=self.beta)

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
    interventions: Intervention | None = None,
    max_events: int = 512,
) -> ActiveLearningResult:
    r"""One sequential experiment of `num_experiments` steps as a single `jax.lax.scan`.

    `interventions`: the candidates (leading axis; default the whole
    [`jaxctbn.intervention_space`][] of the truth, member 0 = no intervention). The same `key`
    gives the same run; two designs run with the same key see the same initial states and the
    same random streams, so their differences are not sampling noise in those.

    A simulated trajectory that overflows `max_events` (static) raises an error rather than
    being silently cut.
    """
    if num_experiments < 1:
        raise ValueError(f"num_experiments must be >= 1, got {num_experiments}.")
    truth = task.truth
    if interventions is None:
        interventions = intervention_space(truth.cardinalities)
    if interventions.targets.ndim != 2 or interventions.targets.shape[1] != truth.num_nodes:
        raise ValueError(
            f"interventions: expected a batch (candidates, {truth.num_nodes}), got targets of "
            f"shape {interventions.targets.shape}."
        )
    horizon = jnp.asarray(horizon, jnp.result_type(float))
    horizon = eqx.error_if(
        horizon, ~(horizon > 0) | ~jnp.isfinite(horizon), "horizon: must be positive and finite."
    )
    cards = truth.cardinalities

    def step(posterior, key):
        k_init, k_design, k_path = jr.split(key, 3)
        initial = _random_state(k_init, cards)
        index = design.choose(posterior, interventions, initial, horizon, k_design)
        iv = jax.tree_util.tree_map(lambda a: a[index], interventions)
        path = sample_trajectory(
            truth, initial, horizon, key=k_path, intervention=iv, max_events=max_events
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

    prior = task.prior()
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


@eqx.filter_jit
def run_repetitions(
    task: AbstractLearningTask,
    design: AbstractDesign,
    keys: PRNGKeyArray,
    *,
    num_experiments: int,
    horizon: ArrayLike = 3.0,
    interventions: Intervention | None = None,
    max_events: int = 512,
) -> ActiveLearningResult:
    """[`jaxctbn.run_active_learning`][] vmapped over a batch of keys (one per repetition), as
    one compiled computation. Every result field gets a leading repetition axis."""
    return jax.vmap(
        lambda k: run_active_learning(
            task,
            design,
            key=k,
            num_experiments=num_experiments,
            horizon=horizon,
            interventions=interventions,
            max_events=max_events,
        )
    )(keys)
