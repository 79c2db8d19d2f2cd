"""The settings of the paper's synthetic experiments: the learning tasks and their metrics, the
default ground truths and defaults, [`jaxctbn.experiments.ExperimentConfig`][], and the settings as JSON."""

from __future__ import annotations

import math
from typing import Literal

import equinox as eqx
import jax
import numpy as np

from .._active_learning.designs import DESIGN_NAMES
from .._active_learning.initial_states import (
    AbstractInitialStatePolicy,
    RandomInitialState,
)
from .._active_learning.tasks import ParameterLearningTask, StructureLearningTask
from .._criteria.costs import Costs
from .._learning.empirical_bayes import EmpiricalBayes
from .._learning.priors import AbstractPrior, GammaPrior, NodelmanPrior, check_prior
from .._model.ctbn import CTBN
from .._model.random_networks import PAPER_NAMES, paper_network

#: The learning task of each target; its `metric_labels` name the metrics, labels and directions.
TASKS = {"structure": StructureLearningTask, "parameters": ParameterLearningTask}
#: For each target: metric name -> (label, better is "higher" or "lower").
METRICS = {target: task.metric_labels for target, task in TASKS.items()}
# the real-data pool experiment (`jaxctbn run pool`, `jaxctbn._experiments.pool`) shares the
# writers below
METRICS["pool"] = {
    "entropy": ("posterior entropy (nats)", "lower"),
    "auroc": ("AUROC vs full-data MAP graph", "higher"),
    "aupr": ("AUPR vs full-data MAP graph", "higher"),
}

DEFAULTS = {
    "structure": {"repetitions": 20, "experiments": 10},
    "parameters": {"repetitions": 20, "experiments": 10},
}


def default_truth(target: str, seed: int = 0) -> CTBN:
    """The fixed ground truths: the 4-node fast/slow network with Gamma(5,1)/Gamma(1/5,1) rates
    (structure) or scaled-softmax rates (parameters), drawn once from `seed`."""
    rates = "gamma" if target == "structure" else "softmax"
    return paper_network(jax.random.key(seed), rates=rates)


#: Settings added after results were first written: a `config.json` without them holds these.
_LATER_SETTINGS = {
    "batch": 1,
    "costs": None,
    "budget": None,
    "rank_by": "score",
    "prior": "gamma",
    "empirical_bayes": None,
    "initial_state_policy": "random-revealed",
    "outcome": {"type": "path"},
}


#: Fixed-point (moment-matched) or structural-EM steps of a panel update in the loop.
PANEL_ITERATIONS = 10


def default_max_parents(num_nodes: int, max_parents: int | None) -> int:
    """`max_parents` if given, else $N-1$ (every parent set) up to 8 nodes and 2 beyond."""
    if max_parents is not None:
        return max_parents
    return num_nodes - 1 if num_nodes <= 8 else 2


#: Above this many nodes the structure (V)BHC of `run` switches to joint graph draws over each
#: node's `LARGE_NETWORK_MAX_SETS` most probable parent sets.
LARGE_NETWORK_NODES = 8
LARGE_NETWORK_MAX_SETS = 32


def default_graph_draws(
    num_nodes: int, graph_draws: str, max_sets: int | None
) -> tuple[str, int | None]:
    """The structure (V)BHC's graph draws and `max_sets` for a network of `num_nodes`:
    `graph_draws="auto"` is `"stratified"` (the paper's Algorithm 2) up to 8 nodes and
    `"joint"` beyond; `max_sets=None` keeps every parent set up to 8 nodes and the 32 most
    probable per node beyond (see [`jaxctbn.criteria.JointGraphDraws`][] and
    [`jaxctbn.StructurePosterior.truncated`][])."""
    large = num_nodes > LARGE_NETWORK_NODES
    if graph_draws == "auto":
        graph_draws = "joint" if large else "stratified"
    if max_sets is None and large:
        max_sets = LARGE_NETWORK_MAX_SETS
    return graph_draws, max_sets


class ExperimentConfig(eqx.Module):
    """Every setting of the paper's synthetic experiment (the fields of `config.json`).

    **Arguments (keyword-only, all optional):** `target` (`"structure"` or `"parameters"`),
    `designs` (names, see `design_from_name`), `repetitions` and `experiments`
    (default 20 and 10), `samples` ($N_S$), `horizon` ($\\tau$), `seed` (repetition $r$ uses
    `fold_in(key(seed), r)` for every design: common random numbers), `truth` (a
    [`jaxctbn.CTBN`][]; default the built-in fast/slow network drawn from `truth_seed`),
    `max_parents` (structure; default $N-1$), `prior` (a [`jaxctbn.GammaPrior`][] or, for
    structure learning, a [`jaxctbn.NodelmanPrior`][]; parameters scalars or one per node),
    `empirical_bayes` (structure learning: an [`jaxctbn.EmpiricalBayes`][] refits the prior's
    hyper-parameters after every experiment, starting from `prior`; default `None`),
    `initial_state_policy` (default [`jaxctbn.RandomInitialState`][], the paper's; see
    [`jaxctbn.run_active_learning`][]), `paths` (EIG paths per draw), `chunk` (repetitions per compiled batch; changes
    results only by rounding), `max_events` (jump buffer of a simulated trajectory; default
    `None`: sized from the truth's exit rates and the horizon, see
    [`jaxctbn.run_active_learning`][]; a path that overflows it is an error, never cut),
    `observation_times` (each experiment seen only at time 0 and these visit times, a panel
    outcome, which the designs score and the posterior learns from, maths §7; default `None`:
    the whole path), `visits` (instead of `observation_times`: each experiment seen at time 0
    and at $K$ visit times which the criterion designs choose per candidate and the other
    designs space equally, maths §7), `interventions` (the candidates: `"all"` the paper's whole [`jaxctbn.intervention_space`][],
    `"single"` the [`jaxctbn.single_node_interventions`][], default `"auto"` =
    `design_space`: all up to 4096 members, single-node beyond), `graph_draws`
    (structure (V)BHC: `"stratified"`, `"joint"` or `"auto"`, the default) and `max_sets`
    (structure (V)BHC: each node's most probable parent sets scored; default `None`), resolved by
    `default_graph_draws`: the paper's stratified draws over every set up to 8
    nodes, joint draws over the 32 most probable sets per node beyond. With
    `max_parents=None` structure learning allows $N-1$ parents up to 8 nodes and 2 beyond (the
    exhaustive search has $2^{N-1}$ parent sets per node). Batches and costs (maths §8; see
    [`jaxctbn.run_active_learning`][]): `batch` (experiments per round, chosen together; it
    must divide `experiments`; default 1), `costs` (a [`jaxctbn.Costs`][]; default `None`,
    free), `budget` (the most a repetition may spend; needs `costs`) and `rank_by` (`"score"`
    or `"score-per-cost"`). Panel outcomes: `panel_posterior`
    (`"sampled"`, the default when `None`: the [`jaxctbn.panel.ParticleFilter`][] of
    `particles` particles (default 256), exact as they grow; or `"moment"`: the
    moment-matched Gamma, fast and overconfident where visits are sparse, maths §7); of
    structure learning the same choice between the
    [`jaxctbn.panel.StructureParticleFilter`][] (`"sampled"`) and structural EM (`"moment"`,
    and always with `empirical_bayes`). `config.json`'s `outcome` says which
    (`"posterior": {"method": ...}`).
    Settings are checked here, with one-line `ValueError`s."""

    target: Literal["structure", "parameters"] = eqx.field(default="structure", static=True)
    designs: tuple[str, ...] = eqx.field(default=("passive", "random", "bhc", "vbhc"), static=True)
    repetitions: int | None = eqx.field(default=None, static=True)
    experiments: int | None = eqx.field(default=None, static=True)
    samples: int = eqx.field(default=10, static=True)
    horizon: float = eqx.field(default=3.0, static=True)
    seed: int = eqx.field(default=0, static=True)
    truth: CTBN | None = None
    truth_seed: int = eqx.field(default=0, static=True)
    max_parents: int | None = eqx.field(default=None, static=True)
    prior: AbstractPrior = GammaPrior()
    empirical_bayes: EmpiricalBayes | None = None
    initial_state_policy: AbstractInitialStatePolicy = RandomInitialState()
    paths: int = eqx.field(default=10, static=True)
    chunk: int = eqx.field(default=10, static=True)
    max_events: int | None = eqx.field(default=None, static=True)
    interventions: Literal["auto", "all", "single"] = eqx.field(default="auto", static=True)
    graph_draws: Literal["auto", "stratified", "joint"] = eqx.field(default="auto", static=True)
    max_sets: int | None = eqx.field(default=None, static=True)
    observation_times: tuple[float, ...] | None = eqx.field(default=None, static=True)
    visits: int | None = eqx.field(default=None, static=True)
    batch: int = eqx.field(default=1, static=True)
    costs: Costs | None = None
    budget: float | None = eqx.field(default=None, static=True)
    rank_by: Literal["score", "score-per-cost"] = eqx.field(default="score", static=True)
    panel_posterior: Literal["sampled", "moment"] | None = eqx.field(default=None, static=True)
    particles: int = eqx.field(default=256, static=True)

    def __check_init__(self):
        if self.target not in TASKS:
            raise ValueError(f"target must be 'structure' or 'parameters', got {self.target!r}.")
        if self.graph_draws not in ("auto", "stratified", "joint"):
            raise ValueError(
                f"graph_draws must be 'auto', 'stratified' or 'joint', got {self.graph_draws!r}."
            )
        if self.interventions not in ("auto", "all", "single"):
            raise ValueError(
                f"interventions must be 'auto', 'all' or 'single', got {self.interventions!r}."
            )
        designs = list(self.designs)
        if not designs:
            raise ValueError("designs: give at least one design.")
        for d in designs:
            if d not in DESIGN_NAMES:
                raise ValueError(
                    f"designs: unknown design {d!r}; valid: {', '.join(DESIGN_NAMES)}."
                )
        if len(set(designs)) != len(designs):
            raise ValueError(f"designs: repeated entries in {designs}.")
        for name in (
            "repetitions",
            "experiments",
            "samples",
            "paths",
            "chunk",
            "max_events",
            "max_sets",
            "particles",
        ):
            v = getattr(self, name)
            if v is not None and (int(v) != v or v < 1):
                raise ValueError(f"{name}: must be a positive integer, got {v}.")
        if self.panel_posterior not in (None, "sampled", "moment"):
            raise ValueError(
                f"panel_posterior: must be 'sampled', 'moment' or None, got "
                f"{self.panel_posterior!r}."
            )
        if self.panel_posterior is not None and self.observation_times is None:
            if self.visits is None:
                raise ValueError(
                    "panel_posterior: only with a panel outcome (observation_times or visits)."
                )
        if not (self.horizon > 0 and math.isfinite(self.horizon)):
            raise ValueError(f"horizon: must be positive and finite, got {self.horizon}.")
        N = len(PAPER_NAMES) if self.truth is None else self.truth.num_nodes
        allowed = (GammaPrior,) if self.target == "parameters" else (GammaPrior, NodelmanPrior)
        if not isinstance(self.prior, allowed):
            raise ValueError(
                f"prior: {self.target} learning takes "
                + " or ".join(c.__name__ for c in allowed)
                + f", got {type(self.prior).__name__}."
            )
        check_prior(self.prior, N)
        if self.empirical_bayes is not None and self.target != "structure":
            raise ValueError("empirical_bayes: supported for structure learning only.")
        if self.empirical_bayes is not None:
            if self.panel_posterior == "sampled":
                raise ValueError(
                    "panel_posterior: empirical_bayes refits one posterior's prior; with panels "
                    "it updates by structural EM ('moment')."
                )
            self.empirical_bayes.initial_prior(self.prior, N)  # per-node values need per_node
        if not isinstance(self.initial_state_policy, AbstractInitialStatePolicy):
            raise ValueError(
                "initial_state_policy: expected RandomInitialState(), FixedInitialState(...) or "
                f"InitialStateDistribution(...), got {self.initial_state_policy!r}."
            )
        if self.truth is not None:
            self.initial_state_policy.check(self.truth.cardinalities, self.truth.names)
        else:
            self.initial_state_policy.check((2,) * N, PAPER_NAMES)
        if self.observation_times is not None:
            times = tuple(float(t) for t in self.observation_times)
            if (
                not times
                or not all(0 < t < math.inf for t in times)
                or any(b <= a for a, b in zip(times, times[1:]))
                or times[-1] > self.horizon
            ):
                raise ValueError(
                    f"observation_times: expected finite, strictly increasing times in (0, "
                    f"horizon] = (0, {self.horizon:g}], got {list(times)}."
                )
        if self.visits is not None:
            if isinstance(self.visits, bool) or int(self.visits) != self.visits or self.visits < 1:
                raise ValueError(f"visits: must be a positive integer, got {self.visits}.")
            if self.observation_times is not None:
                raise ValueError("visits: give observation_times or visits, not both.")
            if "eig" in designs:
                raise ValueError(
                    "designs: the eig design cannot choose visit times (its Monte Carlo "
                    "outcomes are not differentiable in them); with visits use bhc or vbhc, or "
                    "give observation_times."
                )
        self._check_batches(designs, N)
        if self.target == "structure" and self.truth is not None:
            # the task checks the truth (>= 2 nodes, metrics defined) and max_parents
            StructureLearningTask(self.truth, max_parents=default_max_parents(N, self.max_parents))

    def _check_batches(self, designs, num_nodes) -> None:
        if isinstance(self.batch, bool) or int(self.batch) != self.batch or self.batch < 1:
            raise ValueError(f"batch: must be a positive integer, got {self.batch}.")
        if self.num_experiments % self.batch:
            raise ValueError(
                f"batch: {self.batch} must divide experiments ({self.num_experiments}): the "
                "experiments run in whole rounds."
            )
        if self.costs is not None and not isinstance(self.costs, Costs):
            raise ValueError(f"costs: expected a jaxctbn.Costs or None, got {self.costs!r}.")
        if self.costs is not None and self.costs.clamp.shape[0] != num_nodes:
            raise ValueError(
                f"costs: priced for {self.costs.clamp.shape[0]} nodes, the network has {num_nodes}."
            )
        if self.rank_by not in ("score", "score-per-cost"):
            raise ValueError(f"rank_by: must be 'score' or 'score-per-cost', got {self.rank_by!r}.")
        if self.costs is None and (self.budget is not None or self.rank_by != "score"):
            raise ValueError("budget/rank_by: give the prices (costs) first.")
        if self.budget is not None and not (0 <= self.budget < math.inf):
            raise ValueError(f"budget: must be a finite number >= 0, got {self.budget}.")
        panel_scored = {"vbhc", "bhc", "vbhc-optax", "negative-vbhc", "vbhc-copies"} & set(designs)
        rounds = self.batch > 1 or self.costs is not None
        if rounds and self.visits is not None and panel_scored:
            raise ValueError(
                f"designs: {sorted(panel_scored)} choose each experiment's visit times, which "
                "batches and costs do not support yet; give observation_times or use bhc-path "
                "or vbhc-path."
            )
        greedy_vbhc = {"vbhc", "vbhc-optax", "negative-vbhc"} & set(designs)
        if (
            self.batch > 1
            and self.observation_times is not None
            and self.target == "parameters"
            and greedy_vbhc
        ):
            raise ValueError(
                f"designs: {sorted(greedy_vbhc)} have no batch form for panel outcomes in "
                "parameter learning yet; use bhc (the sum of the members' panel BHC), "
                "vbhc-copies or the -path designs."
            )

    @property
    def rounds(self) -> bool:
        """Whether the experiments run in rounds with costs (`batch` > 1 or `costs`): the
        result files then record each experiment's round and cumulative cost."""
        return self.batch > 1 or self.costs is not None

    def ranking(self):
        """The ranking Module of `rank_by`."""
        from .._criteria.costs import ByScore, ByScorePerCost

        return ByScorePerCost() if self.rank_by == "score-per-cost" else ByScore()

    def batch_settings(self) -> dict:
        """`config.json`'s `batch`, `costs`, `budget` and `rank_by`."""
        costs = None
        if self.costs is not None:
            costs = {
                "clamp": np.asarray(self.costs.clamp).tolist(),
                "scale": np.asarray(self.costs.scale).tolist(),
                "visit": float(self.costs.visit),
                "experiment": float(self.costs.experiment),
            }
        return {
            "batch": int(self.batch),
            "costs": costs,
            "budget": None if self.budget is None else float(self.budget),
            "rank_by": self.rank_by,
        }

    @property
    def num_repetitions(self) -> int:
        return (
            DEFAULTS[self.target]["repetitions"] if self.repetitions is None else self.repetitions
        )

    @property
    def num_experiments(self) -> int:
        return (
            DEFAULTS[self.target]["experiments"] if self.experiments is None else self.experiments
        )

    def outcome(self):
        """The outcome Module of `observation_times` or `visits` (`CompletePath()` without)."""
        from .._criteria.outcomes import CompletePath, PanelOutcome

        if self.visits is not None:
            return PanelOutcome(num_visits=int(self.visits))
        if self.observation_times is None:
            return CompletePath()
        return PanelOutcome(np.asarray(self.observation_times, float))

    def panel_family(self):
        """The posterior family of the loop with a panel outcome. Parameters:
        `ParticleFilter(particles)` (`panel_posterior` "sampled" or `None`) or
        `MomentMatchedGamma(10)` ("moment"); structure: `StructureParticleFilter(particles)`
        or `StructuralEM(10)`; with empirical Bayes (structure) always `StructuralEM(10)`
        (the refit needs one posterior)."""
        from .._panel.rate_families import MomentMatchedGamma, ParticleFilter
        from .._panel.structure_posterior import StructuralEM, StructureParticleFilter

        if self.target == "structure":
            if self.panel_posterior == "moment" or self.empirical_bayes is not None:
                return StructuralEM(PANEL_ITERATIONS)
            return StructureParticleFilter(num_particles=int(self.particles))
        if self.panel_posterior == "moment":
            return MomentMatchedGamma(PANEL_ITERATIONS)
        return ParticleFilter(num_particles=int(self.particles))

    def outcome_settings(self) -> dict:
        """`config.json`'s `outcome`, with the posterior a panel outcome is learnt by."""
        if self.visits is not None:
            out: dict = {"type": "panel", "visits": int(self.visits)}
        elif self.observation_times is not None:
            out = {"type": "panel", "observation_times": [float(t) for t in self.observation_times]}
        else:
            return {"type": "path"}
        family = type(self.panel_family()).__name__
        if family == "StructuralEM":
            out["posterior"] = {"method": "structural-em", "iterations": PANEL_ITERATIONS}
        elif family == "MomentMatchedGamma":
            out["posterior"] = {"method": "moment-matched-gamma", "iterations": PANEL_ITERATIONS}
        else:
            out["posterior"] = {"method": "particle-filter", "particles": int(self.particles)}
        return out
