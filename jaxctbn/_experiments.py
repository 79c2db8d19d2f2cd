"""The paper's synthetic experiments (§6) on the host: chunks of repetitions, resumable result
files, summary statistics, tables and figures. `jaxctbn run` is a thin layer over
[`jaxctbn.run_experiment`][].

Output layout of `run_experiment(..., out=DIR)`:

- `DIR/config.json`: every setting, and the ground truth (`DIR/truth.json`, a network JSON);
- `DIR/chunks/<design>/<first>-<last>.npz`: finished repetitions, written as they finish; a
  rerun with the same settings loads them instead of recomputing (resume after interruption);
- `DIR/metrics.csv`: one row per design x repetition x experiment: `design, repetition,
  experiment` (0 = before any experiment), every metric, `intervention` (e.g. `X1=0;X3=1`,
  `none`; empty at experiment 0) and `initial_state`;
- `DIR/results.json`: the settings, per design every metric per repetition
  (`[repetition][experiment]`), the chosen intervention indices and the summary;
- `DIR/summary.md`: the summary table; `DIR/figure.png`: learning curves like the paper's
  figures; `DIR/interventions.png`: the marginal probability of intervening on each node at
  each experiment, per design.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._active_learning import (
    DESIGN_NAMES,
    ParameterLearningTask,
    StructureLearningTask,
    design_from_name,
    run_repetitions,
)
from ._ctbn import CTBN
from ._interventions import intervention_space
from ._priors import GammaPrior
from ._random import paper_network

#: The learning task of each target; its `metric_labels` name the metrics, labels and directions.
TASKS = {"structure": StructureLearningTask, "parameters": ParameterLearningTask}
#: For each target: metric name -> (label, better is "higher" or "lower").
METRICS = {target: task.metric_labels for target, task in TASKS.items()}

DEFAULTS = {
    "structure": {"repetitions": 20, "experiments": 10},
    "parameters": {"repetitions": 20, "experiments": 10},
}


def default_truth(target: str, seed: int = 0) -> CTBN:
    """The fixed ground truths: the 4-node fast/slow network with Gamma(5,1)/Gamma(1/5,1) rates
    (structure) or scaled-softmax rates (parameters), drawn once from `seed`."""
    rates = "gamma" if target == "structure" else "softmax"
    return paper_network(jax.random.key(seed), rates=rates)


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
    differences of that area against `passive` and `random` (same repetition keys)."""
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


def summary_table(target: str, summary: dict, settings: dict) -> list[str]:
    lines = [
        f"# Active {target} learning: {settings['repetitions']} repetitions x "
        f"{settings['experiments']} experiments (tau = {settings['horizon']}, "
        f"N_S = {settings['samples']}, seed {settings['seed']})",
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
        if metric == "mse":
            ax.set_yscale("log")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"active {target} learning, {settings['repetitions']} repetitions", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "figure.png"), dpi=120)
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
    fig.savefig(os.path.join(out_dir, "interventions.png"), dpi=120)
    plt.close(fig)


class ExperimentConfig(eqx.Module):
    """Every setting of the paper's synthetic experiment (the fields of `config.json`).

    **Arguments (keyword-only, all optional):** `target` (`"structure"` or `"parameters"`),
    `designs` (names, see [`jaxctbn.design_from_name`][]), `repetitions` and `experiments`
    (default 20 and 10), `samples` ($N_S$), `horizon` ($\\tau$), `seed` (repetition $r$ uses
    `fold_in(key(seed), r)` for every design: common random numbers), `truth` (a
    [`jaxctbn.CTBN`][]; default the built-in fast/slow network drawn from `truth_seed`),
    `max_parents` (structure; default $N-1$), `prior` (a [`jaxctbn.GammaPrior`][] with scalar
    parameters), `paths` (EIG paths per draw), `chunk` (repetitions per compiled batch; changes
    results only by rounding), `max_events` (jump buffer of a simulated trajectory).
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
    prior: GammaPrior = GammaPrior()
    paths: int = eqx.field(default=10, static=True)
    chunk: int = eqx.field(default=10, static=True)
    max_events: int = eqx.field(default=512, static=True)

    def __check_init__(self):
        if self.target not in TASKS:
            raise ValueError(f"target must be 'structure' or 'parameters', got {self.target!r}.")
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
        for name in ("repetitions", "experiments", "samples", "paths", "chunk", "max_events"):
            v = getattr(self, name)
            if v is not None and (int(v) != v or v < 1):
                raise ValueError(f"{name}: must be a positive integer, got {v}.")
        if not (self.horizon > 0 and math.isfinite(self.horizon)):
            raise ValueError(f"horizon: must be positive and finite, got {self.horizon}.")
        if not isinstance(self.prior, GammaPrior) or any(
            not isinstance(v, float) for v in (self.prior.alpha, self.prior.beta)
        ):
            raise ValueError("prior: the experiments take a GammaPrior with scalar alpha and beta.")

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
) -> dict:
    """Run the paper's synthetic experiment for several designs and return
    `{"settings", "results", "summary", "timing"}` (`results[design][metric]` is an array
    `(repetitions, experiments + 1)`; also `intervention_index`, `targets`).

    With `out`, results are written as described in the module docstring and finished chunks
    are reused on a rerun with the same settings.
    """
    config = ExperimentConfig() if config is None else config
    target, designs = config.target, list(config.designs)
    repetitions, experiments = config.num_repetitions, config.num_experiments
    samples, paths, chunk, horizon = config.samples, config.paths, config.chunk, config.horizon
    seed, truth_seed, max_events = config.seed, config.truth_seed, config.max_events
    alpha, beta = config.prior.alpha, config.prior.beta
    truth = default_truth(target, truth_seed) if config.truth is None else config.truth
    max_parents = config.max_parents
    if target == "structure":
        max_parents = truth.num_nodes - 1 if max_parents is None else max_parents
        task = StructureLearningTask(truth, max_parents=max_parents, prior=config.prior)
    else:
        task = ParameterLearningTask(truth, prior=config.prior)
    space = intervention_space(truth.cardinalities)
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
        "alpha": alpha,
        "beta": beta,
        "interventions": int(space.targets.shape[0]),
        "truth": truth.to_dict(),
    }
    chunk_dir = None
    if out is not None:
        os.makedirs(out, exist_ok=True)
        chunk_dir = os.path.join(out, "chunks")
        cfg_path = os.path.join(out, "config.json")
        # chunks are only reusable if every setting that changes them is the same
        key_settings = {k: v for k, v in settings.items() if k not in ("designs", "repetitions")}
        if os.path.exists(cfg_path):
            with open(cfg_path) as f:
                old = json.load(f)
            old_key = {k: v for k, v in old.items() if k not in ("designs", "repetitions")}
            if old_key != json.loads(json.dumps(key_settings)):
                import shutil

                shutil.rmtree(chunk_dir, ignore_errors=True)
        with open(cfg_path, "w") as f:
            json.dump(settings, f, indent=1)
        truth.to_json(os.path.join(out, "truth.json"))

    base = jax.random.key(seed)
    starts = list(range(0, repetitions, chunk))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(designs) * repetitions, desc=f"run {target}", unit="rep")
    results, timing, failures = {}, {}, {}
    for design_name in designs:
        design = design_from_name(design_name, num_samples=samples, num_paths=paths)
        parts, seconds, computed, chunk_seconds = [], 0.0, 0, []
        for start in starts:
            stop = min(start + chunk, repetitions)
            path = None
            if chunk_dir is not None:
                path = os.path.join(chunk_dir, design_name, f"{start}-{stop - 1}.npz")
                if os.path.exists(path):
                    with np.load(path) as z:
                        parts.append({k: z[k] for k in z.files})
                    if bar is not None:
                        bar.update(stop - start)
                    continue
            keys = jax.vmap(lambda r: jax.random.fold_in(base, r))(jnp.arange(start, stop))
            if bar is not None:
                bar.set_postfix_str(design_name)
            t0 = time.perf_counter()
            res, status = run_repetitions(  # pyright: ignore[reportGeneralTypeIssues] (throw=False: a pair)
                task,
                design,
                keys,
                num_experiments=experiments,
                horizon=horizon,
                candidates=space,
                max_events=max_events,
                throw=False,
            )
            res = jax.device_get(res)
            for r in np.nonzero(~status.ok)[0]:  # kept as NaN rows; the others are unaffected
                failures.setdefault(design_name, []).append(
                    {"repetition": start + int(r), "error": status.messages[r]}
                )
                print(
                    f"jaxctbn run: {design_name} repetition {start + int(r)} failed: "
                    f"{status.messages[r]}",
                    file=sys.stderr,
                )
            chunk_seconds.append(time.perf_counter() - t0)
            seconds += chunk_seconds[-1]
            computed += stop - start
            part: dict[str, Any] = {f"metric_{k}": np.asarray(v) for k, v in res.metrics.items()}
            part.update(
                intervention_index=np.asarray(res.intervention_index),
                targets=np.asarray(res.targets),
                states=np.asarray(res.states),
                initial_states=np.asarray(res.initial_states),
                num_events=np.asarray(res.num_events),
            )
            if path is not None:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                tmp = path + ".tmp.npz"
                np.savez(tmp, **part)
                os.replace(tmp, path)
            parts.append(part)
            if bar is not None:
                bar.update(stop - start)
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        results[design_name] = {
            **{k[len("metric_") :]: v for k, v in merged.items() if k.startswith("metric_")},
            **{k: v for k, v in merged.items() if not k.startswith("metric_")},
        }
        timing[design_name] = {
            "seconds_incl_compile": seconds,
            "repetitions_computed": computed,
            "chunk_seconds": chunk_seconds,  # the first computed chunk includes compilation
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
    if out is not None:
        _write_outputs(target, report, truth, out)
    return report


def _write_outputs(target, report, truth, out):
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
                rows.append(row)
    pd.DataFrame(rows).to_csv(os.path.join(out, "metrics.csv"), index=False)
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
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(payload, f)
    lines = summary_table(target, report["summary"], settings)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    _plot(target, results, names, out, settings)
