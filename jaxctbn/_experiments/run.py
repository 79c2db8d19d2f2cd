"""The paper's synthetic experiments (§6) on the host: chunks of repetitions, resumable result
files, summary statistics, tables and figures. `jaxctbn run` is a thin layer over
[`jaxctbn.run_experiment`][].

Output layout of `run_experiment(..., out=DIR)`:

- `DIR/config.json`: every setting, and the ground truth (`DIR/truth.json`, a network JSON);
- `DIR/chunks/<design>/<first>-<last>.npz`: finished repetitions, written as they finish; a
  rerun with the same settings loads them instead of recomputing (resume after interruption).
  A damaged chunk file (truncated, edited, missing keys or wrong shapes) is reported on stderr
  and recomputed. A rerun with other settings into the same directory is refused unless
  `overwrite=True` (`--overwrite`), which discards the old results;
- `DIR/processes/<i>.done`, `<i>.failed`: written by process `i` of a distributed run
  (`distributed=True`) when it has finished its chunks, or failed;
- `DIR/metrics.csv`: one row per design x repetition x experiment: `design, repetition,
  experiment` (0 = before any experiment), every metric, `intervention` (e.g. `X1=0;X3=1`,
  `none`; empty at experiment 0) and `initial_state`;
- `DIR/results.json`: the settings, per design every metric per repetition
  (`[repetition][experiment]`), the chosen intervention indices and the summary;
- `DIR/summary.md`: the summary table; `DIR/figure.png`: learning curves like the paper's
  figures; `DIR/interventions.png`: the marginal probability of intervening on each node at
  each experiment, per design.

Every file is written atomically (a temporary file, then `os.replace`), so an interrupted run
never leaves a half-written file, and files that describe other settings (`summary.md`, ...)
are removed before a changed run starts.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
import warnings
import zipfile
import zlib
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._active_learning.loop import (
    DESIGN_NAMES,
    AbstractInitialStatePolicy,
    FixedInitialState,
    InitialStateDistribution,
    ParameterLearningTask,
    RandomInitialState,
    StructureLearningTask,
    design_from_name,
    run_repetitions,
)
from .._criteria.batching import AbstractBatching, Sharded
from .._criteria.structure import JointGraphDraws, StratifiedGraphDraws
from .._learning.empirical_bayes import EmpiricalBayes
from .._learning.priors import AbstractPrior, GammaPrior, NodelmanPrior
from .._model.ctbn import CTBN
from .._model.interventions import design_space, intervention_space, single_node_interventions
from .._model.random_networks import PAPER_NAMES, paper_network
from .._paths.sampling import automatic_max_events

#: The learning task of each target; its `metric_labels` name the metrics, labels and directions.
TASKS = {"structure": StructureLearningTask, "parameters": ParameterLearningTask}
#: For each target: metric name -> (label, better is "higher" or "lower").
METRICS = {target: task.metric_labels for target, task in TASKS.items()}
# the real-data pool experiment (`jaxctbn run pool`, `jaxctbn._experiments.pool`) shares the writers below
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


def _json_value(v):
    """A hyper-parameter as JSON: a float, or a list of one per node."""
    return float(v) if np.ndim(v) == 0 else np.asarray(v, float).tolist()


def prior_settings(prior: AbstractPrior) -> dict:
    """`{"prior": "gamma" | "nodelman", "alpha": ..., "beta": ...}` (for the Nodelman prior
    `beta` is its total imaginary time `tau`, as `--beta` on the command line)."""
    if isinstance(prior, NodelmanPrior):
        return {
            "prior": "nodelman",
            "alpha": _json_value(prior.alpha),
            "beta": _json_value(prior.tau),
        }
    if isinstance(prior, GammaPrior):
        return {
            "prior": "gamma",
            "alpha": _json_value(prior.alpha),
            "beta": _json_value(prior.beta),
        }
    raise ValueError(f"prior: expected GammaPrior or NodelmanPrior, got {type(prior).__name__}.")


def _empirical_bayes_settings(eb: EmpiricalBayes | None):
    if eb is None:
        return None
    return {"per_node": eb.per_node, "bounds": list(eb.bounds)}


def policy_settings(policy: AbstractInitialStatePolicy):
    """The initial-state policy as JSON: `"random-revealed"`, `{"fixed": [states]}` or
    `{"distribution": "uniform" | [probabilities], "revealed": bool}`."""
    if isinstance(policy, RandomInitialState):
        return "random-revealed"
    if isinstance(policy, FixedInitialState):
        return {"fixed": list(policy.state)}
    if isinstance(policy, InitialStateDistribution):
        p = policy.probabilities
        return {
            "distribution": "uniform" if p is None else np.asarray(p, float).tolist(),
            "revealed": policy.revealed_to_design,
        }
    return type(policy).__name__


#: Settings added after results were first written: a `config.json` without them holds these.
_LATER_SETTINGS = {
    "prior": "gamma",
    "empirical_bayes": None,
    "initial_state_policy": "random-revealed",
}


def _labels(names, targets, states):
    out = []
    for t, s in zip(targets, states):
        parts = [f"{names[n]}={int(s[n])}" for n in range(len(names)) if t[n]]
        out.append(";".join(parts) if parts else "none")
    return out


def _ci(x):
    """Mean and 95% normal half-width over the first axis (NaN-aware)."""
    x = np.asarray(x, float)
    n = np.sum(np.isfinite(x), axis=0)
    mean = np.nanmean(x, axis=0)
    sd = np.nanstd(x, axis=0, ddof=1) if x.shape[0] > 1 else np.zeros_like(mean)
    return mean, 1.96 * sd / np.sqrt(np.maximum(n, 1))


def summarise(target: str, results: dict[str, dict[str, np.ndarray]]) -> dict:
    """Per design and metric: mean at the last experiment and the mean over experiments 1..K
    (the area under the learning curve), each with a 95% interval over repetitions; and paired
    differences of that area against `passive` and `random` (same repetition keys). Failed
    repetitions (NaN rows) are left out; a design whose repetitions all failed gets NaN."""
    with warnings.catch_warnings():  # all-NaN slices: failures are reported separately
        warnings.simplefilter("ignore", RuntimeWarning)
        return _summarise(target, results)


def _summarise(target, results):
    summary = {}
    for design, res in results.items():
        entry = {}
        for metric in METRICS[target]:
            values = np.asarray(res[metric], float)
            final_mean, final_hw = _ci(values[:, -1])
            area_mean, area_hw = _ci(np.nanmean(values[:, 1:], axis=1))
            entry[metric] = {
                "final_mean": float(final_mean),
                "final_ci95": float(final_hw),
                "final_median": float(np.nanmedian(values[:, -1])),
                "final_q25": float(np.nanquantile(values[:, -1], 0.25)),
                "final_q75": float(np.nanquantile(values[:, -1], 0.75)),
                "area_mean": float(area_mean),
                "area_ci95": float(area_hw),
            }
            for baseline in ("passive", "random"):
                if baseline in results and baseline != design:
                    other = np.asarray(results[baseline][metric], float)
                    diff = np.nanmean(values[:, 1:], axis=1) - np.nanmean(other[:, 1:], axis=1)
                    m, hw = _ci(diff)
                    entry[metric][f"area_minus_{baseline}"] = float(m)
                    entry[metric][f"area_minus_{baseline}_ci95"] = float(hw)
        summary[design] = entry
    return summary


def verdicts(target: str, summary: dict) -> list[str]:
    """One line per design: its paired differences of the area under the learning curve against
    passive and random observation, and whether the 95% interval excludes zero ("better",
    "worse") or not ("no clear difference")."""
    lines = []
    for design, entry in summary.items():
        parts = []
        for base in ("passive", "random"):
            if design == base:
                continue
            items = []
            for metric, (label, direction) in METRICS[target].items():
                e = entry[metric]
                key = f"area_minus_{base}"
                if key not in e or not np.isfinite(e[key]):
                    continue
                m, hw = e[key], e[key + "_ci95"]
                if abs(m) <= hw or not np.isfinite(hw):
                    word = "no clear difference"
                else:
                    word = "better" if (m > 0) == (direction == "higher") else "worse"
                items.append(f"{label.split(' (')[0]} {m:+.3f} ± {hw:.3f} ({word})")
            if items:
                parts.append(f"vs {base}: " + ", ".join(items))
        if parts:
            lines.append(f"{design}: " + "; ".join(parts))
    return lines


def _describe_prior(settings: dict) -> str:
    name = {"gamma": "Gamma", "nodelman": "Nodelman"}[settings.get("prior", "gamma")]
    text = f"{name}({settings.get('alpha', 1.0)}, {settings.get('beta', 1.0)})"
    eb = settings.get("empirical_bayes")
    if eb:
        text += " with empirical Bayes" + (" (per node)" if eb["per_node"] else "")
    return text


def _describe_policy(policy) -> str:
    if policy == "random-revealed":
        return "uniform at random, revealed to the design (the paper's)"
    if isinstance(policy, dict) and "fixed" in policy:
        return f"fixed at {policy['fixed']}"
    if isinstance(policy, dict) and "distribution" in policy:
        seen = "revealed" if policy["revealed"] else "hidden from the design"
        return f"drawn from the {'uniform' if policy['distribution'] == 'uniform' else 'given'} distribution, {seen}"
    return str(policy)


def summary_table(
    target: str, summary: dict, settings: dict, failures: dict | None = None
) -> list[str]:
    """The summary as Markdown lines; `failures` (`report["failed_repetitions"]`) adds a line
    per design whose failed repetitions are left out of the means."""
    lines = [
        f"# Active {target} learning: {settings['repetitions']} repetitions x "
        f"{settings['experiments']} experiments (tau = {settings['horizon']}, "
        f"N_S = {settings['samples']}, seed {settings['seed']})",
        "",
        f"Learning prior: {_describe_prior(settings)}; initial state: "
        f"{_describe_policy(settings.get('initial_state_policy', 'random-revealed'))}.",
        "",
        "Mean ± 95% interval over repetitions. 'area' = mean over experiments 1..K (area under "
        "the learning curve); 'vs passive' / 'vs random' = paired difference of the area "
        "(same repetition keys), with its 95% interval.",
        "",
        "| design | metric | last experiment | area | vs passive | vs random |",
        "|---|---|---|---|---|---|",
    ]
    for design, entry in summary.items():
        for metric, (label, _) in METRICS[target].items():
            e = entry[metric]

            def diff(base, e=e):
                key = f"area_minus_{base}"
                if key not in e:
                    return "–"
                return f"{e[key]:+.4f} ± {e[key + '_ci95']:.4f}"

            lines.append(
                f"| {design} | {label} | {e['final_mean']:.4f} ± {e['final_ci95']:.4f} | "
                f"{e['area_mean']:.4f} ± {e['area_ci95']:.4f} | {diff('passive')} | "
                f"{diff('random')} |"
            )
    for design, failed in (failures or {}).items():
        lines.append("")
        lines.append(
            f"**{design}: {len(failed)} of {settings['repetitions']} repetitions failed** and are "
            "left out of the means (NaN in metrics.csv); `failed_repetitions` in results.json "
            "has the errors."
        )
    return lines


def _plot(target, results, names, out_dir, settings):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = list(METRICS[target])
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for design, res in results.items():
            v = np.asarray(res[metric], float)
            k = np.arange(v.shape[1])
            if target == "parameters":  # the paper: mean and 25-75% band
                lo, hi = np.nanquantile(v, 0.25, axis=0), np.nanquantile(v, 0.75, axis=0)
            else:  # the paper: mean and variance band (± one standard deviation)
                sd = np.nanstd(v, axis=0)
                lo, hi = np.nanmean(v, 0) - sd, np.nanmean(v, 0) + sd
            (line,) = ax.plot(k, np.nanmean(v, 0), label=design)
            ax.fill_between(k, lo, hi, color=line.get_color(), alpha=0.15)
        ax.set_xlabel("experiments")
        ax.set_title(METRICS[target][metric][0], fontsize=10)
        values = np.concatenate([np.ravel(res[metric]) for res in results.values()])
        if metric == "mse" and np.any(np.isfinite(values) & (values > 0)):
            ax.set_yscale("log")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"active {target} learning, {settings['repetitions']} repetitions", fontsize=10)
    fig.tight_layout()
    _atomic(os.path.join(out_dir, "figure.png"), lambda f: fig.savefig(f, dpi=120, format="png"))
    plt.close(fig)

    designs = list(results)
    fig, axes = plt.subplots(1, len(designs), figsize=(2.6 * len(designs) + 1, 2.6), squeeze=False)
    for ax, design in zip(axes[0], designs):
        p = np.asarray(results[design]["targets"], float).mean(0).T  # (nodes, experiments)
        im = ax.imshow(p, vmin=0, vmax=1, aspect="auto", cmap="viridis", origin="lower")
        ax.set_yticks(range(len(names)), names)
        ax.set_xticks(range(p.shape[1]), [str(i + 1) for i in range(p.shape[1])], fontsize=6)
        ax.set_xlabel("experiment")
        ax.set_title(design, fontsize=9)
    fig.colorbar(im, ax=axes[0].tolist(), label="P(intervene on node)")
    _atomic(
        os.path.join(out_dir, "interventions.png"),
        lambda f: fig.savefig(f, dpi=120, format="png"),
    )
    plt.close(fig)


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
    probable per node beyond (see [`jaxctbn.JointGraphDraws`][] and
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
    `designs` (names, see [`jaxctbn.design_from_name`][]), `repetitions` and `experiments`
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
    `interventions` (the candidates: `"all"` the paper's whole [`jaxctbn.intervention_space`][],
    `"single"` the [`jaxctbn.single_node_interventions`][], default `"auto"` =
    [`jaxctbn.design_space`][]: all up to 4096 members, single-node beyond), `graph_draws`
    (structure (V)BHC: `"stratified"`, `"joint"` or `"auto"`, the default) and `max_sets`
    (structure (V)BHC: each node's most probable parent sets scored; default `None`), resolved by
    [`jaxctbn.default_graph_draws`][]: the paper's stratified draws over every set up to 8
    nodes, joint draws over the 32 most probable sets per node beyond. With
    `max_parents=None` structure learning allows $N-1$ parents up to 8 nodes and 2 beyond (the
    exhaustive search has $2^{N-1}$ parent sets per node).
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
        ):
            v = getattr(self, name)
            if v is not None and (int(v) != v or v < 1):
                raise ValueError(f"{name}: must be a positive integer, got {v}.")
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
        self.prior.check_num_nodes(N)
        if self.empirical_bayes is not None and self.target != "structure":
            raise ValueError("empirical_bayes: supported for structure learning only.")
        if self.empirical_bayes is not None:
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
        if self.target == "structure" and self.truth is not None:
            # the task checks the truth (>= 2 nodes, metrics defined) and max_parents
            StructureLearningTask(self.truth, max_parents=default_max_parents(N, self.max_parents))

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


def run_experiment(
    config: ExperimentConfig | None = None,
    *,
    out: str | None = None,
    progress: bool = True,
    overwrite: bool = False,
    batching: AbstractBatching | None = None,
    distributed: bool = False,
) -> dict:
    """Run the paper's synthetic experiment for several designs and return
    `{"settings", "results", "summary", "timing"}` (`results[design][metric]` is an array
    `(repetitions, experiments + 1)`; also `intervention_index`, `targets`).

    With `out`, results are written as described in the module docstring and finished chunks
    are reused on a rerun with the same settings (only `designs` and `repetitions` may change).
    A directory that holds results for other settings raises a `ValueError` naming them, unless
    `overwrite=True`, which deletes the old results and starts afresh.

    `batching` executes each chunk's repetitions (see [`jaxctbn.run_repetitions`][]; e.g.
    [`jaxctbn.Sharded`][] across this process's devices). It changes no result, so it is not a
    setting: chunks written with one batching are reused with another.

    `distributed=True` (after `jax.distributed.initialize()`, and with `out` on a file system
    every process reaches) splits the chunks across the `jax.process_count()` processes:
    process $i$ computes chunks $i$, $i + P$, ... (in the order designs x chunks) and writes
    their files; process 0 prepares `out` first, every process waits for the others, and
    process 0 writes the summary from the chunk files. Every process returns the same report
    (the timing sums the processes' own times and devices). The results are those of one
    process.
    See [Multiple devices and hosts](../multi-device.md).
    """
    config = ExperimentConfig() if config is None else config
    target, designs = config.target, list(config.designs)
    repetitions, experiments = config.num_repetitions, config.num_experiments
    samples, paths, chunk, horizon = config.samples, config.paths, config.chunk, config.horizon
    seed, truth_seed = config.seed, config.truth_seed
    truth = default_truth(target, truth_seed) if config.truth is None else config.truth
    max_events = config.max_events
    if max_events is None:
        # None only for non-finite rates, which the sampler reports itself
        max_events = automatic_max_events(truth, horizon) or 512
    max_parents = config.max_parents
    if target == "structure":
        max_parents = default_max_parents(truth.num_nodes, max_parents)
        task = StructureLearningTask(
            truth,
            max_parents=max_parents,
            prior=config.prior,
            empirical_bayes=config.empirical_bayes,
        )
    else:
        assert isinstance(config.prior, GammaPrior)  # checked by ExperimentConfig
        task = ParameterLearningTask(truth, prior=config.prior)
    space = {
        "auto": design_space,
        "all": intervention_space,
        "single": single_node_interventions,
    }[config.interventions](truth.cardinalities)
    graph_draws, max_sets = default_graph_draws(
        truth.num_nodes, config.graph_draws, config.max_sets
    )
    settings = {
        "target": target,
        "designs": designs,
        "repetitions": repetitions,
        "experiments": experiments,
        "samples": samples,
        "paths": paths,
        "horizon": horizon,
        "seed": seed,
        "truth_seed": truth_seed,
        "max_parents": max_parents,
        **prior_settings(config.prior),
        "empirical_bayes": _empirical_bayes_settings(config.empirical_bayes),
        "initial_state_policy": policy_settings(config.initial_state_policy),
        "max_events": max_events,
        "interventions": int(space.targets.shape[0]),
        "intervention_space": config.interventions,
        **({"graph_draws": graph_draws, "max_sets": max_sets} if target == "structure" else {}),
        "truth": truth.to_dict(),
    }
    process, processes = (jax.process_index(), jax.process_count()) if distributed else (0, 1)
    if distributed and out is None:
        raise ValueError("out: a distributed run needs an output directory every process reaches.")
    chunk_dir = None
    if out is not None:
        if process == 0:
            chunk_dir = _prepare_out(out, settings, overwrite)
            _atomic(
                os.path.join(out, "config.json"),
                lambda f: f.write(_json_bytes(settings, indent=1)),
            )
            _atomic(
                os.path.join(out, "truth.json"),
                lambda f: f.write(_json_bytes(truth.to_dict(), indent=1)),
            )
            if distributed:
                shutil.rmtree(os.path.join(out, _PROCESS_DIR), ignore_errors=True)
        if distributed:  # the others start once process 0 has checked and prepared `out`
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("jaxctbn run: output directory prepared")
        if process != 0:
            chunk_dir = _prepare_out(out, settings, overwrite=False)
    base = jax.random.key(seed)
    starts = list(range(0, repetitions, chunk))
    make_design = {
        name: design_from_name(
            name,
            num_samples=samples,
            num_paths=paths,
            graph_draws=JointGraphDraws() if graph_draws == "joint" else StratifiedGraphDraws(),
            max_sets=max_sets,
        )
        for name in designs
    }
    timing = _empty_timing(designs, batching.num_devices if isinstance(batching, Sharded) else 1)

    def chunk_path(design_name, start):
        if chunk_dir is None:
            return None
        stop = min(start + chunk, repetitions)
        return os.path.join(chunk_dir, design_name, f"{start}-{stop - 1}.npz")

    def compute(design_name, start):
        """Run one chunk of repetitions, record its time and write its file."""
        stop = min(start + chunk, repetitions)
        keys = jax.vmap(lambda r: jax.random.fold_in(base, r))(jnp.arange(start, stop))
        t0 = time.perf_counter()
        res, status = run_repetitions(  # pyright: ignore[reportGeneralTypeIssues] (throw=False: a pair)
            task,
            make_design[design_name],
            keys,
            num_experiments=experiments,
            horizon=horizon,
            candidates=space,
            max_events=max_events,
            initial_state_policy=config.initial_state_policy,
            throw=False,
            batching=batching,
        )
        res = jax.device_get(res)
        errors = np.asarray(status.messages, dtype=str).reshape(stop - start)
        truncated = [m for m in status.messages if "truncated" in m]
        if truncated:  # a setting, not bad luck: stop rather than record NaN repetitions
            raise ValueError(
                f"max_events: a simulated path of {design_name} had more than {max_events} "
                "jumps; raise it (--max-events) or leave it unset (sized from the rates)."
            )
        entry = timing[design_name]
        entry["chunk_seconds"].append(time.perf_counter() - t0)
        entry["seconds_incl_compile"] += entry["chunk_seconds"][-1]
        entry["repetitions_computed"] += stop - start
        part: dict[str, Any] = {f"metric_{k}": np.asarray(v) for k, v in res.metrics.items()}
        part.update(
            intervention_index=np.asarray(res.intervention_index),
            targets=np.asarray(res.targets),
            states=np.asarray(res.states),
            initial_states=np.asarray(res.initial_states),
            num_events=np.asarray(res.num_events),
            errors=errors,
        )
        path = chunk_path(design_name, start)
        if path is not None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            _atomic(path, lambda f, part=part: np.savez(f, **part))
        return part

    def load(design_name, start):
        path = chunk_path(design_name, start)
        if path is None:
            return None
        stop = min(start + chunk, repetitions)
        return _load_chunk(path, target, stop - start, experiments, truth.num_nodes)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(designs) * repetitions, desc=f"run {target}", unit="rep")
    if distributed:
        # Process i computes chunks i, i + P, ... of all designs' chunks, writing their files,
        # then every process waits for the others; below, each process loads every chunk.
        assert out is not None
        jobs = [(name, start) for name in designs for start in starts]
        marker = os.path.join(out, _PROCESS_DIR, f"{process}")
        try:
            for design_name, start in jobs[process::processes]:
                if bar is not None:
                    bar.set_postfix_str(design_name)
                if load(design_name, start) is None:
                    compute(design_name, start)
                if bar is not None:
                    bar.update(min(start + chunk, repetitions) - start)
        except BaseException as error:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            _atomic(marker + ".failed", lambda f: f.write(reason.encode()))
            raise
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        _atomic(marker + ".done", lambda f: f.write(_json_bytes(timing)))
        timing = _wait_for_processes(os.path.join(out, _PROCESS_DIR), processes, designs)
        if bar is not None:
            bar.close()
            bar = None
    results, failures = {}, {}
    for design_name in designs:
        parts = []
        for start in starts:
            stop = min(start + chunk, repetitions)
            part = load(design_name, start)
            if part is None:
                if bar is not None:
                    bar.set_postfix_str(design_name)
                part = compute(design_name, start)
            if process == 0:  # one report of each failure
                _record_failures(failures, design_name, start, part["errors"])
            parts.append(part)
            if bar is not None:
                bar.update(stop - start)
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0] if k != "errors"}
        results[design_name] = {
            **{k[len("metric_") :]: v for k, v in merged.items() if k.startswith("metric_")},
            **{k: v for k, v in merged.items() if not k.startswith("metric_")},
        }
    if bar is not None:
        bar.close()
    summary = summarise(target, results)
    report = {
        "settings": settings,
        "results": results,
        "summary": summary,
        "timing": timing,
        "failed_repetitions": failures,
    }
    if out is not None and process == 0:
        _write_outputs(target, report, truth, out)
    return report


#: Under the output directory: `<process>.done` (its timing) or `<process>.failed` (its error)
#: for each process of a distributed run.
_PROCESS_DIR = "processes"


def _empty_timing(designs, devices: int) -> dict:
    """The `timing` entry of each design before any chunk: `devices`, the devices its chunks
    are split across (summed over the processes of a distributed run)."""
    return {
        name: {
            "seconds_incl_compile": 0.0,
            "repetitions_computed": 0,
            "chunk_seconds": [],
            "devices": devices,
        }
        for name in designs
    }


def _wait_for_processes(folder: str, processes: int, designs) -> dict:
    """Wait until every process of a distributed run has written its chunks (`<i>.done`);
    raise a `ValueError` as soon as one reports a failure (`<i>.failed`). Returns the timing
    summed over the processes (seconds are each process's own)."""
    while True:
        names = set(os.listdir(folder)) if os.path.isdir(folder) else set()
        for i in range(processes):
            if f"{i}.failed" in names:
                with open(os.path.join(folder, f"{i}.failed")) as f:
                    raise ValueError(f"process {i} of the distributed run failed: {f.read()}")
        if all(f"{i}.done" in names for i in range(processes)):
            break
        time.sleep(0.5)
    timing = _empty_timing(designs, 0)
    for i in range(processes):
        with open(os.path.join(folder, f"{i}.done")) as f:
            theirs = json.load(f)
        for name, entry in timing.items():
            entry["seconds_incl_compile"] += theirs[name]["seconds_incl_compile"]
            entry["repetitions_computed"] += theirs[name]["repetitions_computed"]
            entry["chunk_seconds"] += theirs[name]["chunk_seconds"]
            entry["devices"] += theirs[name]["devices"]
    return timing


def _write_outputs(target, report, truth, out, extra_columns=None):
    """`extra_columns`: `{column: {design: (repetitions, experiments) values}}` added to
    metrics.csv (empty at experiment 0), e.g. the pool experiment's subject ids."""
    import pandas as pd

    settings, results = report["settings"], report["results"]
    names = list(truth.names)
    rows = []
    for design, res in results.items():
        R, K1 = np.asarray(res[next(iter(METRICS[target]))]).shape
        for r in range(R):
            ivs = _labels(names, res["targets"][r], res["states"][r])
            inits = [
                ";".join(f"{names[n]}={int(s[n])}" for n in range(len(names)))
                for s in res["initial_states"][r]
            ]
            for k in range(K1):
                row = {"design": design, "repetition": r, "experiment": k}
                for metric in METRICS[target]:
                    row[metric] = float(res[metric][r, k])
                row["intervention"] = ivs[k - 1] if k > 0 else ""
                row["initial_state"] = inits[k - 1] if k > 0 else ""
                for column, values in (extra_columns or {}).items():
                    row[column] = values[design][r, k - 1] if k > 0 else ""
                rows.append(row)
    frame = pd.DataFrame(rows)
    _atomic(os.path.join(out, "metrics.csv"), lambda f: f.write(frame.to_csv(index=False).encode()))
    payload = {
        "settings": settings,
        "timing": report["timing"],
        "summary": report["summary"],
        "failed_repetitions": report["failed_repetitions"],
        "designs": {
            design: {
                "metrics": {m: np.asarray(res[m]).tolist() for m in METRICS[target]},
                "intervention_index": np.asarray(res["intervention_index"]).tolist(),
            }
            for design, res in results.items()
        },
    }
    _atomic(os.path.join(out, "results.json"), lambda f: f.write(_json_bytes(payload)))
    lines = summary_table(target, report["summary"], settings, report["failed_repetitions"])
    lines += ["", "Verdict (area under the learning curve, paired, 95% interval):", ""]
    lines += [f"- {line}" for line in verdicts(target, report["summary"])]
    _atomic(os.path.join(out, "summary.md"), lambda f: f.write(("\n".join(lines) + "\n").encode()))
    with warnings.catch_warnings():  # all-NaN designs (failures are reported separately)
        warnings.simplefilter("ignore", RuntimeWarning)
        _plot(target, results, names, out, settings)


# ------------------------------------------------------------------ the output directory

#: Files derived from a finished run (removed when a changed run starts in the directory).
_OUTPUTS = ("metrics.csv", "results.json", "summary.md", "figure.png", "interventions.png")
#: Settings that may change between runs that share chunks.
_FREE_SETTINGS = ("designs", "repetitions")


def _json_bytes(data, indent=None) -> bytes:
    return json.dumps(data, indent=indent).encode()


def _atomic(path: str, write) -> None:
    """`write(f)` to a temporary file (binary) next to `path`, then rename it to `path`: an
    interrupted run leaves either the old file or the new one, never half of one."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _describe_differences(old: dict, new: dict) -> str:
    diffs = []
    old = {**_LATER_SETTINGS, **old}
    for key in sorted(set(old) | set(new)):
        if key in _FREE_SETTINGS or old.get(key) == new.get(key):
            continue
        if key == "truth":
            diffs.append("truth")
        else:
            diffs.append(f"{key} {old.get(key)!r} -> {new.get(key)!r}")
    return ", ".join(diffs)


def _prepare_out(out: str, settings: dict, overwrite: bool) -> str:
    """Check that `out` holds nothing or a run with compatible settings, and remove what a
    changed run would leave stale. Returns the chunk directory."""
    os.makedirs(out, exist_ok=True)
    chunk_dir = os.path.join(out, "chunks")
    cfg_path = os.path.join(out, "config.json")
    new = json.loads(json.dumps(settings))
    hint = "choose another directory or pass --overwrite (overwrite=True) to discard it"
    if overwrite:
        shutil.rmtree(chunk_dir, ignore_errors=True)
        old = None
    elif os.path.exists(cfg_path):
        try:
            with open(cfg_path) as f:
                old = json.load(f)
            if not isinstance(old, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as error:
            raise ValueError(
                f"out: {cfg_path} is unreadable ({error}), so the results in {out} cannot be "
                f"checked; {hint}."
            ) from None
        diffs = _describe_differences(old, new)
        if diffs:
            raise ValueError(f"out: {out} holds a run with other settings ({diffs}); {hint}.")
    else:
        old = None
        if os.path.isdir(chunk_dir) and any(files for _, _, files in os.walk(chunk_dir)):
            raise ValueError(f"out: {out} holds chunk files but no config.json; {hint}.")
    if old != new:  # other designs or repetitions, or a fresh start: old summaries are stale
        for name in _OUTPUTS:
            path = os.path.join(out, name)
            if os.path.exists(path):
                os.remove(path)
    return chunk_dir


def _chunk_layout(target, reps, experiments, nodes) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every array of a chunk file: name -> (shape, numpy dtype kinds)."""
    layout: dict[str, tuple[tuple[int, ...], str]] = {
        f"metric_{m}": ((reps, experiments + 1), "f") for m in METRICS[target]
    }
    layout.update(
        intervention_index=((reps, experiments), "iu"),
        targets=((reps, experiments, nodes), "b"),
        states=((reps, experiments, nodes), "iu"),
        initial_states=((reps, experiments, nodes), "iu"),
        num_events=((reps, experiments), "iu"),
        errors=((reps,), "U"),
    )
    if target == "pool":  # subjects drawn from a pool: no simulated paths
        del layout["num_events"]
        layout["subjects"] = ((reps, experiments), "iu")
    return layout


def _load_chunk(path, target, reps, experiments, nodes) -> dict[str, np.ndarray] | None:
    """The arrays of a finished chunk, or `None` when it must be computed: missing, or damaged
    (then a line on stderr names the file and why)."""
    if not os.path.exists(path):
        return None
    layout = _chunk_layout(target, reps, experiments, nodes)
    try:
        with np.load(path, allow_pickle=False) as z:
            if set(z.files) != set(layout):
                missing, extra = set(layout) - set(z.files), set(z.files) - set(layout)
                raise KeyError(
                    f"missing {sorted(missing)}" if missing else f"unexpected {sorted(extra)}"
                )
            part = {name: z[name] for name in layout}
        for name, (shape, kinds) in layout.items():
            a = part[name]
            if a.shape != shape or a.dtype.kind not in kinds:
                raise ValueError(
                    f"{name} has shape {a.shape} and dtype {a.dtype}, expected {shape}"
                )
        ok = part["errors"] == ""
        for m in METRICS[target]:
            if not np.all(np.isfinite(part[f"metric_{m}"][ok])):
                raise ValueError(f"metric_{m} is not finite in a finished repetition")
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(
            f"jaxctbn run: chunk file {path} is damaged ({type(error).__name__}: {reason}); "
            "recomputing it.",
            file=sys.stderr,
        )
        return None
    return part


def _record_failures(failures, design, start, errors) -> None:
    for r, message in enumerate(np.asarray(errors, dtype=str)):
        if message:
            failures.setdefault(design, []).append({"repetition": start + r, "error": str(message)})
            print(
                f"jaxctbn run: {design} repetition {start + r} failed: {message}",
                file=sys.stderr,
            )
