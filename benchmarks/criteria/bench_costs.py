"""Designs with costs on the paper's experiments (issue: batches, costs, strengths).

Clamping a slow node (X1, X3) costs 3, a fast one (X2, X4) 1, and every experiment 1 more
(so watching costs 1); each repetition has a budget. Designs: the VBHC ranked by its score
alone (costs only bound the budget), the VBHC ranked by score per unit cost, passive and
random, the paper's settings otherwise (`run_experiment`), the same key per repetition in
every run (paired). Learning curves against cumulative cost: each metric at cost levels (the
value after the last experiment whose cumulative cost is within the level).

    python benchmarks/criteria/bench_costs.py --target parameters [--repetitions 100] [--quick]

Writes `results/costs_<target>.json`, `.md` and `.png`.
"""

from __future__ import annotations

import json
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import RESULTS, argument_parser, stopwatch
from _paired import mean_ci

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc  # noqa: E402
from jaxctbn._experiments.config import METRICS  # noqa: E402

SLOW, FAST, EXPERIMENT = 3.0, 1.0, 1.0
NAMES = ("X1", "X2", "X3", "X4")


def costs():
    return jc.Costs.of_nodes(
        NAMES, (2, 2, 2, 2), clamp={"X1": SLOW, "X2": FAST, "X3": SLOW, "X4": FAST},
        experiment=EXPERIMENT,
    )  # fmt: skip


def run(target, designs, rank_by, repetitions, experiments, budget, chunk):
    config = jc.experiments.ExperimentConfig(
        target=target,
        designs=tuple(designs),
        repetitions=repetitions,
        experiments=experiments,
        costs=costs(),
        budget=budget,
        rank_by=rank_by,
        chunk=chunk,
    )
    with stopwatch() as sw:
        results = jc.experiments.run_experiment(config, progress=False)["results"]
    return results, sw.seconds


def at_cost(result, metric, levels):
    """`(repetitions, levels)`: the metric after the last experiment within each cost level."""
    values = np.asarray(result[metric], float)  # (R, K + 1)
    spent = np.concatenate([np.zeros((values.shape[0], 1)), np.asarray(result["costs"])], axis=1)
    out = np.empty((values.shape[0], len(levels)))
    for j, level in enumerate(levels):
        last = (spent <= level + 1e-9).sum(1) - 1  # spent is non-decreasing
        out[:, j] = values[np.arange(values.shape[0]), last]
    return out


def main():
    parser = argument_parser(__doc__)
    parser.add_argument("--target", choices=["parameters", "structure"], default="parameters")
    parser.add_common(repetitions=100)
    parser.add_argument("--budget", type=float, default=20.0)
    parser.add_common(chunk=10, quick=True)
    args = parser.parse_args()
    if args.quick:
        args.repetitions, args.budget, args.chunk = 4, 6.0, 4
    experiments = int(args.budget / EXPERIMENT)  # the most the budget can buy
    plain, t_plain = run(args.target, ["vbhc", "passive", "random"], "score", args.repetitions,
                         experiments, args.budget, args.chunk)  # fmt: skip
    per_cost, t_cost = run(args.target, ["vbhc"], "score-per-cost", args.repetitions,
                           experiments, args.budget, args.chunk)  # fmt: skip
    runs = {
        "vbhc, by score": plain["vbhc"],
        "vbhc, by score per cost": per_cost["vbhc"],
        "passive": plain["passive"],
        "random": plain["random"],
    }
    levels = [args.budget * f for f in (0.25, 0.5, 0.75, 1.0)]
    reference = "vbhc, by score per cost"
    out = {"target": args.target, "repetitions": args.repetitions, "budget": args.budget,
           "prices": {"slow clamp": SLOW, "fast clamp": FAST, "experiment": EXPERIMENT},
           "levels": levels, "seconds": [t_plain, t_cost], "metrics": {}, "spending": {}}  # fmt: skip
    for name, res in runs.items():
        idx = np.asarray(res["intervention_index"])
        out["spending"][name] = {
            "experiments_run": float((idx >= 0).sum(1).mean()),
            "final_cost": float(np.asarray(res["costs"])[:, -1].mean()),
        }
    for metric in METRICS[args.target]:
        curves = {name: at_cost(res, metric, levels) for name, res in runs.items()}
        entry = {}
        for name, curve in curves.items():
            m, h = mean_ci(curve)
            row = {"mean": m.tolist(), "ci95": h.tolist()}
            if name != reference:
                dm, dh = mean_ci(curves[reference] - curve)
                row["reference_minus_this"] = dm.tolist()
                row["reference_minus_this_ci95"] = dh.tolist()
            entry[name] = row
        out["metrics"][metric] = entry
    name = f"costs_{args.target}" + ("_quick" if args.quick else "")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"{name}.json"), "w") as f:
        json.dump(out, f, indent=1)
    lines = [
        f"# Designs with costs: {args.target}, {args.repetitions} repetitions, budget "
        f"{args.budget:g}",
        "",
        f"Command: `python benchmarks/criteria/bench_costs.py --target {args.target} --repetitions "
        f"{args.repetitions}`. Prices: clamping a slow node (X1, X3) {SLOW:g}, a fast one "
        f"(X2, X4) {FAST:g}, plus {EXPERIMENT:g} per experiment. Each metric at cumulative cost "
        "levels, mean ± 95% t interval; the last columns: score-per-cost minus the other design "
        "(paired).",
        "",
        "| design | experiments run | cost spent |",
        "|---|---|---|",
    ]
    for n, s in out["spending"].items():
        lines.append(f"| {n} | {s['experiments_run']:.1f} | {s['final_cost']:.1f} |")
    for metric in METRICS[args.target]:
        lines += ["", f"## {metric}", "",
                  "| design | " + " | ".join(f"cost {c:g}" for c in levels)
                  + " | " + " | ".join(f"per-cost minus this at {c:g}" for c in levels) + " |",
                  "|---|" + "---|" * (2 * len(levels))]  # fmt: skip
        for n, row in out["metrics"][metric].items():
            cells = [f"{m:.4g} ± {h:.2g}" for m, h in zip(row["mean"], row["ci95"])]
            diffs = ["–"] * len(levels)
            if "reference_minus_this" in row:
                diffs = [f"{m:+.3g} ± {h:.2g}" for m, h in
                         zip(row["reference_minus_this"], row["reference_minus_this_ci95"])]  # fmt: skip
            lines.append(f"| {n} | " + " | ".join(cells) + " | " + " | ".join(diffs) + " |")
    lines.append("")
    with open(os.path.join(RESULTS, f"{name}.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = list(METRICS[args.target])
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False)
    grid = np.linspace(0, args.budget, 41)
    for ax, metric in zip(axes[0], metrics):
        for n, res in runs.items():
            curve = at_cost(res, metric, grid).mean(0)
            ax.plot(grid, curve, label=n)
        ax.set_xlabel("cumulative cost")
        ax.set_title(METRICS[args.target][metric][0], fontsize=10)
        if metric == "mse":
            ax.set_yscale("log")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, f"{name}.png"), dpi=110)


if __name__ == "__main__":
    main()
