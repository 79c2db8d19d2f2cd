"""Sensitivity of the paper's structure-learning claim (issue 11): does VBHC beat passive and
random observation, and on what does the answer depend?

Grid: learning prior {the paper-faithful Gamma(a_f/s, 1) per node (slow 1/5, fast 5), Gamma(1,1),
Gamma(5,1), Nodelman(1,1), empirical Bayes from Gamma(1,1)}
x truth {the built-in truth (truth seed 0), three more truths drawn by the paper's recipe
(seeds 1, 2, 3), an ensemble of recipe-drawn truths (seeds 100, 101, ...; one repetition
each)} x initial-state policy {random revealed (the paper's), fixed at all zeros}. Designs
passive, random and VBHC (N_S = 10, tau = 3, all 81 interventions, exact posterior with
in-degree <= 3). "The paper's recipe": the 4-node fast/slow graph of `jaxctbn.paper_network`
with rates drawn from Gamma(5, 1) (fast) and Gamma(1/5, 1) (slow), as in §6.

Per cell: paired differences VBHC - passive and VBHC - random (same repetition keys, so the same
initial states) of the area under the learning curve (mean over experiments 1..K) and of the
value at the last experiment, for AUROC, AUPR and the posterior entropy, with 95% normal
intervals over repetitions (over truths for the ensemble).

Single-truth cells are `jaxctbn.experiments.run_experiment` directories under
`results/sensitivity/cells/` (resumable: rerun the same command to continue after an
interruption); the ensemble cells vmap over truths and keys and keep their chunks in
`results/sensitivity/ensemble/`. Outputs: `results/sensitivity.{json,md}` and
`results/sensitivity.png` (the grid at a glance).

Empirical Bayes refits after every experiment of every repetition (~25x the cost of a cell with a
fixed prior here), so its cells use fewer repetitions: 40 on the built-in truth, 10 on the other
truths, 30 ensemble truths (`--eb-repetitions`, `--eb-repetitions-other`, `--eb-ensemble`).

Run: `python benchmarks/active_learning/bench_sensitivity.py [--repetitions R] [--experiments K]
[--ensemble E] [--quick]`.
"""

from __future__ import annotations

import os
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc
from jaxctbn._active_learning.designs import design_from_name
from jaxctbn._experiments.config import default_truth
from jaxctbn._files import write_atomically as _atomic
from jaxctbn._paths.sampling import automatic_max_events

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
import _common
from _common import argument_parser, environment, stopwatch, write_results

RESULTS = _common.RESULTS

PRIORS = {
    # the paper-faithful reading (docs/concepts/active-learning.md): the truths' own
    # hyper-parameters, Gamma(1/5, 1) for the slow nodes X1, X3 and Gamma(5, 1) for the fast X2, X4
    "Gamma(a_f/s,1)": (jc.GammaPrior(np.array([0.2, 5.0, 0.2, 5.0]), 1.0), None),
    "Gamma(1,1)": (jc.GammaPrior(1.0, 1.0), None),
    "Gamma(5,1)": (jc.GammaPrior(5.0, 1.0), None),
    "Nodelman(1,1)": (jc.NodelmanPrior(1.0, 1.0), None),
    "empirical Bayes": (jc.GammaPrior(1.0, 1.0), jc.EmpiricalBayes()),
}
POLICIES = {
    "random revealed": jc.RandomInitialState(),
    "fixed s0=0": jc.FixedInitialState([0, 0, 0, 0]),
}
DESIGNS = ("passive", "random", "vbhc")
METRICS = ("auroc", "aupr", "entropy")
TRUTH_SEEDS = (0, 1, 2, 3)


def paired(a, b):
    """Mean and 95% half-width of the paired difference a - b over the first axis."""
    d = np.asarray(a, float) - np.asarray(b, float)
    d = d[np.isfinite(d)]
    hw = 1.96 * d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
    return float(d.mean()), float(hw)


def differences(results: dict) -> dict:
    """Per metric: VBHC - passive and VBHC - random, area and last experiment."""
    out = {}
    for metric in METRICS:
        v = np.asarray(results["vbhc"][metric], float)
        entry = {}
        for base in ("passive", "random"):
            b = np.asarray(results[base][metric], float)
            entry[f"area_vs_{base}"] = paired(v[:, 1:].mean(1), b[:, 1:].mean(1))
            entry[f"final_vs_{base}"] = paired(v[:, -1], b[:, -1])
        entry["curves"] = {
            d: np.nanmean(np.asarray(results[d][metric], float), 0).tolist() for d in DESIGNS
        }
        out[metric] = entry
    return out


def run_cell(prior_name, truth_seed, policy_name, repetitions, experiments, chunk):
    prior, eb = PRIORS[prior_name]
    config = jc.experiments.ExperimentConfig(
        target="structure",
        designs=DESIGNS,
        repetitions=repetitions,
        experiments=experiments,
        truth_seed=truth_seed,
        prior=prior,
        empirical_bayes=eb,
        initial_state_policy=POLICIES[policy_name],
        chunk=chunk,
    )
    name = f"{prior_name}_seed{truth_seed}_{policy_name}".replace(" ", "-").replace("/", "-")
    out = os.path.join(RESULTS, "sensitivity", "cells", name)
    report = jc.experiments.run_experiment(config, out=out, progress=False)
    return report["results"], report["timing"]


@eqx.filter_jit
def _ensemble_batch(truths, keys, design, prior, eb, policy, experiments, max_events):
    def one(truth, key):
        task = jc.StructureLearningTask(truth, max_parents=3, prior=prior, empirical_bayes=eb)
        return jc.run_active_learning(
            task,
            design,
            key=key,
            num_experiments=experiments,
            horizon=3.0,
            max_events=max_events,
            initial_state_policy=policy,
        )

    return jax.vmap(one)(truths, keys)


def run_ensemble(prior_name, policy_name, size, experiments, chunk):
    """One repetition on each of `size` recipe-drawn truths (seeds 100, 101, ...), vmapped over
    truths; chunks of `chunk` truths are saved and reused."""
    prior, eb = PRIORS[prior_name]
    policy = POLICIES[policy_name]
    seeds = list(range(100, 100 + size))
    truths = [default_truth("structure", s) for s in seeds]
    max_events = max(automatic_max_events(t, 3.0) or 512 for t in truths)
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *truths)
    base = jax.random.key(0)
    keys = jax.vmap(lambda s: jax.random.fold_in(base, s))(jnp.asarray(seeds))
    name = f"{prior_name}_{policy_name}".replace(" ", "-").replace("/", "-")
    directory = os.path.join(RESULTS, "sensitivity", "ensemble", name)
    os.makedirs(directory, exist_ok=True)
    results, seconds = {}, {}
    for design_name in DESIGNS:
        design = design_from_name(design_name, num_samples=10)
        parts, sw = [], stopwatch()
        for start in range(0, size, chunk):
            stop = min(start + chunk, size)
            path = os.path.join(directory, f"{design_name}_{start}-{stop - 1}_max{max_events}.npz")
            if os.path.exists(path):
                with np.load(path) as z:
                    parts.append({m: z[m] for m in METRICS})
                continue
            sl = jax.tree_util.tree_map(lambda a: a[start:stop], stacked)
            res = _ensemble_batch(
                sl, keys[start:stop], design, prior, eb, policy, experiments, max_events
            )
            part = {m: np.asarray(res.metrics[m]) for m in METRICS}
            _atomic(path, lambda f, part=part: np.savez(f, **part))
            parts.append(part)
        results[design_name] = {m: np.concatenate([p[m] for p in parts]) for m in METRICS}
        seconds[design_name] = sw.elapsed
    return results, seconds


def _figure(grid, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    priors = list(PRIORS)
    columns = [(t, p) for p in POLICIES for t in [*(f"seed {s}" for s in TRUTH_SEEDS), "ensemble"]]
    fig, axes = plt.subplots(2, 3, figsize=(17, 6.5), squeeze=False)
    for row, base in enumerate(("passive", "random")):
        for col, metric in enumerate(METRICS):
            ax = axes[row][col]
            values = np.full((len(priors), len(columns)), np.nan)
            text = [["" for _ in columns] for _ in priors]
            for i, prior in enumerate(priors):
                for j, (truth, policy) in enumerate(columns):
                    cell = grid.get(f"{prior} | {truth} | {policy}")
                    if cell is None:
                        continue
                    m, hw = cell["differences"][metric][f"area_vs_{base}"]
                    sign = -1 if metric == "entropy" else 1  # lower entropy is better
                    values[i, j] = sign * m / (hw if hw > 0 else 1.0)
                    star = "*" if abs(m) > hw else ""
                    text[i][j] = f"{m:+.3f}{star}"
            lim = 4.0
            ax.imshow(np.clip(values, -lim, lim), cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
            for i in range(len(priors)):
                for j in range(len(columns)):
                    ax.text(j, i, text[i][j], ha="center", va="center", fontsize=6.5)
            ax.set_yticks(range(len(priors)), priors, fontsize=7)
            ax.set_xticks(
                range(len(columns)),
                [f"{t}\n{p}" for t, p in columns],
                fontsize=5.5,
                rotation=90,
            )
            label = {"auroc": "AUROC", "aupr": "AUPR", "entropy": "entropy (nats)"}[metric]
            ax.set_title(f"VBHC - {base}: area, {label}", fontsize=9)
    fig.suptitle(
        "Paired differences of the area under the learning curve (blue: VBHC better, red: "
        "worse; colour = difference / 95% half-width, * = interval excludes 0)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


# empirical Bayes refits its hyper-parameters (100 L-BFGS steps) after every experiment of every
# repetition: ~25x the cost of a fixed-prior cell on this CPU, so it gets fewer repetitions
COSTLY = ("empirical Bayes",)


def _repetitions(prior, seed, policy, args) -> int:
    """Repetitions of a single-truth cell: all for fixed priors; for empirical Bayes
    `--eb-repetitions` on the built-in truth (seed 0) and `--eb-repetitions-other` on the
    other truths."""
    if prior not in COSTLY:
        return args.repetitions
    reps = args.eb_repetitions if seed == 0 else args.eb_repetitions_other
    return min(args.repetitions, reps)


def main():
    parser = argument_parser(__doc__, repetitions=40, experiments=10)
    parser.add_argument("--ensemble", type=int, default=100)
    parser.add_common(chunk=10)
    parser.add_argument(
        "--eb-repetitions", type=int, default=40, help="empirical Bayes, built-in truth"
    )
    parser.add_argument(
        "--eb-repetitions-other", type=int, default=10, help="empirical Bayes, truths 1-3"
    )
    parser.add_argument("--eb-ensemble", type=int, default=30, help="empirical Bayes, truths")
    parser.add_common(quick="a smoke run: 2 reps, 2 experiments")
    args = parser.parse_args()
    if args.quick:
        global RESULTS
        RESULTS = _common.RESULTS = os.path.join(RESULTS, "quick")
        args.repetitions, args.experiments, args.ensemble, args.chunk = 2, 2, 2, 2
        args.eb_repetitions = args.eb_repetitions_other = args.eb_ensemble = 2
    grid, total = {}, stopwatch()
    for prior in PRIORS:
        for policy in POLICIES:
            for seed in TRUTH_SEEDS:
                sw = stopwatch()
                reps = _repetitions(prior, seed, policy, args)
                results, _ = run_cell(prior, seed, policy, reps, args.experiments, args.chunk)
                grid[f"{prior} | seed {seed} | {policy}"] = {
                    "repetitions": reps,
                    "differences": differences(results),
                    "seconds": sw.elapsed,
                }
                print(
                    f"{prior} | seed {seed} | {policy}: {sw.elapsed:.0f} s",
                    flush=True,
                )
            sw = stopwatch()
            size = args.ensemble if prior not in COSTLY else min(args.ensemble, args.eb_ensemble)
            results, _ = run_ensemble(prior, policy, size, args.experiments, args.chunk)
            grid[f"{prior} | ensemble | {policy}"] = {
                "repetitions": size,
                "differences": differences(results),
                "seconds": sw.elapsed,
            }
            print(f"{prior} | ensemble | {policy}: {sw.elapsed:.0f} s", flush=True)
    command = "python benchmarks/active_learning/bench_sensitivity.py" + (
        " --quick" if args.quick else ""
    )
    lines = [
        "# Sensitivity of the structure-learning claim: VBHC vs passive and random",
        "",
        f"Command: `{command}` ({args.repetitions} repetitions per single-truth cell, "
        f"{args.ensemble} truths x 1 repetition for the ensemble; empirical Bayes, which refits "
        f"after every experiment, {args.eb_repetitions} repetitions on the built-in truth, "
        f"{args.eb_repetitions_other} on the other truths and {args.eb_ensemble} ensemble "
        f"truths; {args.experiments} "
        "experiments, tau = 3, N_S = 10, all 81 interventions, in-degree <= 3, float64). "
        f"Total {total.elapsed:.0f} s.",
        "",
        "Paired differences (same repetition keys) of the area under the learning curve (mean "
        "over experiments 1..K) and of the last experiment, ± 95% interval. Entropy: lower is "
        "better, so a negative entropy difference favours VBHC.",
        "",
        "| prior | truth | s0 | reps | AUROC area vs passive | AUROC area vs random | AUPR area vs "
        "passive | AUPR area vs random | entropy area vs passive | entropy area vs random | "
        "AUROC last vs passive |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, cell in grid.items():
        prior, truth, policy = key.split(" | ")
        d = cell["differences"]

        def f(metric, what, d=d):
            m, hw = d[metric][what]
            return f"{m:+.3f} ± {hw:.3f}"

        lines.append(
            f"| {prior} | {truth} | {policy} | {cell['repetitions']} | "
            f"{f('auroc', 'area_vs_passive')} | "
            f"{f('auroc', 'area_vs_random')} | {f('aupr', 'area_vs_passive')} | "
            f"{f('aupr', 'area_vs_random')} | {f('entropy', 'area_vs_passive')} | "
            f"{f('entropy', 'area_vs_random')} | {f('auroc', 'final_vs_passive')} |"
        )
    lines += [
        "",
        "## The early dip",
        "",
        "Mean AUROC over repetitions (truths for the ensemble) after experiments 0..5 and the "
        "lowest mean after experiment 1, passive and VBHC, random revealed s0. A curve that "
        "falls below its starting value and below 0.5 ranks edges worse than chance on this data.",
        "",
        "| prior | truth | design | AUROC after experiments 0, 1, ..., 5 | lowest (experiment) |",
        "|---|---|---|---|---|",
    ]
    for key, cell in grid.items():
        prior, truth, policy = key.split(" | ")
        if policy != "random revealed":
            continue
        for design in ("passive", "vbhc"):
            curve = np.asarray(cell["differences"]["auroc"]["curves"][design])
            low = int(np.argmin(curve[1:])) + 1
            lines.append(
                f"| {prior} | {truth} | {design} | "
                + ", ".join(f"{v:.3f}" for v in curve[:6])
                + f" | {curve[low]:.3f} ({low}) |"
            )
    os.makedirs(RESULTS, exist_ok=True)
    _figure(grid, os.path.join(RESULTS, "sensitivity.png"))
    lines += ["", "![grid](sensitivity.png)"]
    write_results(
        "sensitivity",
        {"environment": environment(), "settings": vars(args), "grid": grid},
        lines,
    )


if __name__ == "__main__":
    main()
