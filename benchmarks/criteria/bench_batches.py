"""Batches of experiments on the paper's experiments (issue: batches, costs, strengths).

For each batch size B: the greedy VBHC batch (`vbhc`: each round scores every candidate with
the members already chosen), B copies of the VBHC's best (`vbhc-copies`, the myopic baseline)
and B random picks (`random`), against the sequential VBHC (B = 1), all with the same total
number of trajectories (`--experiments`, default 8) and the paper's settings otherwise
(`jaxctbn.experiments.run_experiment`: the paper's network and prior, N_S = 10, tau = 3,
initial states uniform and revealed). Repetition r uses the same key in every run, so every
comparison is paired.

Reported: at **equal trajectories** (after all experiments) each design's metric and the paired
differences greedy - copies, greedy - random, greedy - sequential; at **equal rounds** (after
experiments/B rounds) greedy(B) against the sequential design after the same number of rounds
(= experiments); and how diverse the greedy batches are (distinct interventions per round).

    python benchmarks/criteria/bench_batches.py --target parameters [--repetitions 100] [--quick]

Writes `results/batches_<target>.json` and `.md`.
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

PRIMARY = {"parameters": "mse", "structure": "auroc"}
BETTER = {"mse": "lower", "auroc": "higher", "aupr": "higher", "shd": "lower", "entropy": "lower"}


def run(target, designs, batch, repetitions, experiments, chunk):
    config = jc.experiments.ExperimentConfig(
        target=target,
        designs=tuple(designs),
        repetitions=repetitions,
        experiments=experiments,
        batch=batch,
        chunk=chunk,
    )
    with stopwatch() as sw:
        report = jc.experiments.run_experiment(config, progress=False)
    return report["results"], sw.seconds


def interval(x):
    m, h = mean_ci(np.asarray(x, float))
    return float(m), float(h)


def main():
    parser = argument_parser(__doc__)
    parser.add_argument("--target", choices=["parameters", "structure"], default="parameters")
    parser.add_common(repetitions=100, experiments=8)
    parser.add_argument("--sizes", default="2,4,8")
    parser.add_common(chunk=10, quick="4 repetitions, sizes 2")
    args = parser.parse_args()
    if args.quick:
        args.repetitions, args.sizes, args.chunk = 4, "2", 4
    sizes = [int(b) for b in args.sizes.split(",")]
    K = args.experiments
    metrics = list(METRICS[args.target])
    seconds = {}
    sequential, seconds[1] = run(
        args.target, ["vbhc", "random", "passive"], 1, args.repetitions, K, args.chunk
    )
    runs = {}
    for B in sizes:
        runs[B], seconds[B] = run(
            args.target, ["vbhc", "vbhc-copies", "random"], B, args.repetitions, K, args.chunk
        )
    out = {"target": args.target, "repetitions": args.repetitions, "experiments": K,
           "sizes": sizes, "seconds": seconds, "metrics": {}}  # fmt: skip
    for metric in metrics:
        seq = np.asarray(sequential["vbhc"][metric], float)
        entry = {"sequential": {"final": interval(seq[:, -1]),
                                "passive_final": interval(np.asarray(sequential["passive"][metric])[:, -1]),
                                "random_final": interval(np.asarray(sequential["random"][metric])[:, -1])}}  # fmt: skip
        for B in sizes:
            res = runs[B]
            greedy = np.asarray(res["vbhc"][metric], float)
            copies = np.asarray(res["vbhc-copies"][metric], float)
            rand = np.asarray(res["random"][metric], float)
            rounds = K // B
            entry[str(B)] = {
                "greedy_final": interval(greedy[:, -1]),
                "copies_final": interval(copies[:, -1]),
                "random_final": interval(rand[:, -1]),
                "greedy_minus_copies": interval(greedy[:, -1] - copies[:, -1]),
                "greedy_minus_random": interval(greedy[:, -1] - rand[:, -1]),
                "greedy_minus_sequential_equal_trajectories": interval(greedy[:, -1] - seq[:, -1]),
                # after `rounds` rounds: greedy has run K trajectories, sequential `rounds`
                "greedy_minus_sequential_equal_rounds": interval(greedy[:, -1] - seq[:, rounds]),
                "rounds": rounds,
            }
        out["metrics"][metric] = entry
    diversity = {}
    for B in sizes:
        idx = np.asarray(runs[B]["vbhc"]["intervention_index"]).reshape(args.repetitions, K // B, B)
        distinct = np.array([[len(set(r)) for r in rep] for rep in idx])
        copies_idx = np.asarray(runs[B]["vbhc-copies"]["intervention_index"]).reshape(
            args.repetitions, K // B, B
        )
        distinct_copies = np.array([[len(set(r)) for r in rep] for rep in copies_idx])
        diversity[str(B)] = {"greedy_distinct_per_round": float(distinct.mean()),
                             "copies_distinct_per_round": float(distinct_copies.mean())}  # fmt: skip
    out["diversity"] = diversity
    name = f"batches_{args.target}" + ("_quick" if args.quick else "")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"{name}.json"), "w") as f:
        json.dump(out, f, indent=1)
    lines = [
        f"# Batches of experiments: {args.target}, {args.repetitions} repetitions, "
        f"{K} trajectories each",
        "",
        "Command: `python benchmarks/criteria/bench_batches.py --target "
        f"{args.target} --repetitions {args.repetitions}`. Paired over repetitions (the same key "
        "per repetition in every run); mean ± 95% t interval. 'greedy' = the VBHC batch chosen "
        "greedily, 'copies' = B copies of the VBHC's best, 'sequential' = the VBHC one "
        "experiment at a time (B = 1).",
        "",
    ]
    for metric in metrics:
        e = out["metrics"][metric]
        better = BETTER.get(metric, "")
        lines += [
            f"## {metric} ({better} is better)",
            "",
            f"Sequential VBHC after {K}: {e['sequential']['final'][0]:.4g} ± "
            f"{e['sequential']['final'][1]:.2g}; passive {e['sequential']['passive_final'][0]:.4g}"
            f"; random {e['sequential']['random_final'][0]:.4g}.",
            "",
            "| B | rounds | greedy | copies | random | greedy - copies | greedy - random | "
            "greedy - sequential (equal trajectories) | greedy - sequential (equal rounds) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for B in sizes:
            r = e[str(B)]

            def f(pair):
                return f"{pair[0]:+.4g} ± {pair[1]:.2g}"

            lines.append(
                f"| {B} | {r['rounds']} | {r['greedy_final'][0]:.4g} | {r['copies_final'][0]:.4g} | "
                f"{r['random_final'][0]:.4g} | {f(r['greedy_minus_copies'])} | "
                f"{f(r['greedy_minus_random'])} | "
                f"{f(r['greedy_minus_sequential_equal_trajectories'])} | "
                f"{f(r['greedy_minus_sequential_equal_rounds'])} |"
            )
        lines.append("")
    lines += ["## Diversity of the batches", "",
              "| B | distinct interventions per round, greedy | copies |", "|---|---|---|"]  # fmt: skip
    for B in sizes:
        d = diversity[str(B)]
        lines.append(
            f"| {B} | {d['greedy_distinct_per_round']:.2f} | {d['copies_distinct_per_round']:.2f} |"
        )
    lines += ["", "Wall time per run (s, incl. compilation): "
              + ", ".join(f"B={b}: {s:.0f}" for b, s in seconds.items()), ""]  # fmt: skip
    with open(os.path.join(RESULTS, f"{name}.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
