"""The cost of choosing a batch: `score_interventions` with `batch=Batch(B)`, B = 1, 2, 4, 8,
against one design step
(`score_interventions`) over the paper's 81 candidates, side by side in one run, for both
targets (VBHC, N_S = 10, tau = 3, the paper's networks after a history of 5 trajectories).
The target: a greedy batch of 4 within 4x a single design step.

    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/criteria/bench_batch_step.py

Writes `results/batch_step.json` and `.md`.
"""

from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import jax.random as jr

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import RESULTS, argument_parser, timeit

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc  # noqa: E402


def posterior_after_history(target):
    rates = "gamma" if target == "structure" else "softmax"
    truth = jc.paper_network(jr.key(0), rates=rates)
    traj = jc.sample_trajectories(
        truth, jnp.zeros(4, jnp.int32), 3.0, key=jr.key(1), num_trajectories=5
    )
    if target == "structure":
        return jc.learn_structure(traj, truth.names, truth.cardinalities, max_parents=3)
    stats = jc.SufficientStatistics.from_trajectories(traj, truth.cardinalities, truth.parents)
    return jc.RatePosterior.for_model(truth).update_with(stats)


def main():
    space = jc.intervention_space((2, 2, 2, 2))
    init = jnp.zeros(4, jnp.int32)
    horizon = jnp.asarray(3.0)
    out = {}
    for target in ("parameters", "structure"):
        posterior = posterior_after_history(target)
        key = jr.key(2)
        row = {
            "single": timeit(
                lambda: jc.score_interventions(posterior, space, init, horizon, key=key), repeat=5
            )
        }
        for B in (1, 2, 4, 8):
            row[f"batch_{B}"] = timeit(
                lambda B=B: jc.score_interventions(
                    posterior, space, init, horizon, key=key, batch=jc.Batch(B)
                ),
                repeat=5,
            )
        row["ratio_batch_4"] = row["batch_4"] / row["single"]
        out[target] = row
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "batch_step.json"), "w") as f:
        json.dump(out, f, indent=1)
    lines = [
        "# Choosing a batch vs one design step (81 candidates, VBHC, N_S = 10)",
        "",
        "Command: `OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/criteria/bench_batch_step.py` (best "
        "of 5, compiled). Target: a greedy batch of 4 within 4x one design step.",
        "",
        "| target | one step (ms) | B=1 | B=2 | B=4 | B=8 | B=4 / one step | target met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for target, row in out.items():
        lines.append(
            f"| {target} | {1e3 * row['single']:.1f} | "
            + " | ".join(f"{1e3 * row[f'batch_{B}']:.1f}" for B in (1, 2, 4, 8))
            + f" | {row['ratio_batch_4']:.1f}x | {'yes' if row['ratio_batch_4'] <= 4 else 'no'} |"
        )
    lines.append("")
    with open(os.path.join(RESULTS, "batch_step.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    argument_parser(__doc__).parse_args()  # --help; no flags
    main()
