"""Intervention strength as a design variable (issue: batches, costs, strengths).

The paper's parameter experiment (4 binary nodes, scaled-softmax rates, tau = 3, N_S = 10,
initial states uniform and revealed) where node X2 cannot be clamped, only its rates scaled by a
drug of strength s in [0.5, 8]. Sequential VBHC designs, each experiment's candidates the 27
perfect interventions on X1, X3, X4:

- `optimised`: plus, for each, X2 scaled by its best strength (`score_interventions` with
  `strengths=Strengths(...)`);
- `fixed`: plus, for each, X2 scaled by the fixed mid-range strength 2 (geometric midpoint);
- `none`: no control of X2;
- `clamp`: X2 perfectly clampable instead (the 81 candidates; a control that does not exist
  here, for reference).

The posterior learns each scaled path with X2's exposure s T (maths §8). Paired over
repetitions (same keys); posterior MSE of the rates after each experiment.

    python benchmarks/criteria/bench_strengths.py [--repetitions 100] [--experiments 6] [--quick]

Writes `results/strengths.json` and `.md`.
"""

from __future__ import annotations

import json
import os
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import RESULTS, argument_parser, stopwatch
from _paired import mean_ci

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc  # noqa: E402
from jaxctbn._paths.sampling import sample_trajectory  # noqa: E402

NODE = 1  # X2
LOW, HIGH, FIXED = 0.5, 8.0, 2.0
TAU, NUM_SAMPLES = 3.0, 10
DESIGNS = ("optimised", "fixed", "none", "clamp")


def scaled(candidates, s):
    """`candidates` with X2's rates scaled by `s` (one per candidate)."""
    C = candidates.targets.shape[0]
    ones = jnp.ones((C,))
    return candidates.with_rate_scales([ones, jnp.broadcast_to(s, (C,)), ones, ones])


def main():
    parser = argument_parser(__doc__, repetitions=100, experiments=6, quick=True)
    args = parser.parse_args()
    if args.quick:
        args.repetitions, args.experiments = 3, 2
    truth = jc.paper_network(jr.key(0), rates="softmax")
    task = jc.ParameterLearningTask(truth)
    full = jc.intervention_space(truth.cardinalities)
    perfect = jax.tree_util.tree_map(lambda a: a[~np.asarray(full.targets[:, NODE])], full)
    strengths = jc.criteria.Strengths((NODE,), [LOW], [HIGH], starts=3, steps=20)

    def choose(design, posterior, init, key):
        """The chosen intervention (with X2's scale) for one experiment."""

        def score(cands):
            return jc.score_interventions(
                posterior, cands, init, TAU, key=key, num_samples=NUM_SAMPLES
            )

        if design == "clamp":
            best = jnp.argmax(score(full))
            return scaled(jax.tree_util.tree_map(lambda a: a[best][None], full), 1.0)
        plain = score(scaled(perfect, 1.0))
        if design == "none":
            values, scales = plain, jnp.ones_like(plain)
        elif design == "fixed":
            with_drug = score(scaled(perfect, FIXED))
            use = with_drug > plain
            values, scales = jnp.where(use, with_drug, plain), jnp.where(use, FIXED, 1.0)
        else:
            found = jc.score_interventions(
                posterior, perfect, init, TAU, strengths=strengths, key=key,
                num_samples=NUM_SAMPLES,
            )  # fmt: skip
            use = found.scores > plain
            values = jnp.where(use, found.scores, plain)
            scales = jnp.where(use, found.rate_scales[:, 0], 1.0)
        best = jnp.argmax(values)
        chosen = jax.tree_util.tree_map(lambda a: a[best][None], perfect)
        return scaled(chosen, scales[best])

    def run(design, key):
        def step(posterior, key):
            k_init, k_design, k_path = jr.split(key, 3)
            init = jr.randint(k_init, (4,), 0, 2)
            iv = choose(design, posterior, init, k_design)
            one = jax.tree_util.tree_map(lambda a: a[0], iv)
            path = sample_trajectory(truth, init, TAU, key=k_path, intervention=one, max_events=256)
            batch = jax.tree_util.tree_map(lambda a: a[None], path)
            stats = jc.SufficientStatistics.from_trajectories(
                batch, truth.cardinalities, truth.parents
            )
            node = stats.nodes[NODE]
            s = one.rate_scales[NODE]  # X2's exposure s T
            stats = eqx.tree_at(lambda st: st.nodes[NODE].dwell_times, stats, s * node.dwell_times)
            posterior = posterior.update_with(stats)
            return posterior, (task.metrics(posterior)["mse"], s, one.targets)

        prior = task.initial_posterior()
        _, (mse, s, targets) = jax.lax.scan(step, prior, jr.split(key, args.experiments))
        start = task.metrics(prior)["mse"]
        return jnp.concatenate([start[None], mse]), s, targets

    keys = jax.vmap(lambda r: jr.fold_in(jr.key(1), r))(jnp.arange(args.repetitions))
    results, seconds = {}, {}
    for design in DESIGNS:
        with stopwatch() as sw:
            mse, s, targets = eqx.filter_jit(jax.vmap(lambda k, d=design: run(d, k)))(keys)
            results[design] = {"mse": np.asarray(mse), "scales": np.asarray(s),
                               "targets": np.asarray(targets)}  # fmt: skip
        seconds[design] = sw.seconds
    out = {"repetitions": args.repetitions, "experiments": args.experiments,
           "range": [LOW, HIGH], "fixed": FIXED, "seconds": seconds, "designs": {}}  # fmt: skip
    ref = results["optimised"]["mse"]
    for design, res in results.items():
        m, h = mean_ci(res["mse"])
        row = {"mean": m.tolist(), "ci95": h.tolist(),
               "drug_used": float((res["scales"] != 1.0).mean()),
               "mean_scale_when_used": float(res["scales"][res["scales"] != 1.0].mean())
               if (res["scales"] != 1.0).any() else None}  # fmt: skip
        if design != "optimised":
            dm, dh = mean_ci(ref - res["mse"])
            row["optimised_minus_this"] = dm.tolist()
            row["optimised_minus_this_ci95"] = dh.tolist()
            area = (ref[:, 1:] - res["mse"][:, 1:]).mean(1)
            row["optimised_minus_this_area"] = [float(v) for v in mean_ci(area)]
        out["designs"][design] = row
    name = "strengths" + ("_quick" if args.quick else "")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"{name}.json"), "w") as f:
        json.dump(out, f, indent=1)
    K = args.experiments
    lines = [
        f"# Intervention strength as a design variable: {args.repetitions} repetitions, {K} "
        "experiments",
        "",
        f"Command: `python benchmarks/criteria/bench_strengths.py --repetitions {args.repetitions}`. "
        f"X2 cannot be clamped; a drug scales its rates by s in [{LOW:g}, {HIGH:g}]. Posterior "
        "MSE of the rates (lower is better), mean ± 95% t interval; the optimised design minus "
        "the others, paired, after the last experiment and averaged over experiments 1..K "
        "(area).",
        "",
        f"| design | MSE after {K} | optimised minus this (last) | optimised minus this (area) "
        "| experiments with the drug | mean strength used |",
        "|---|---|---|---|---|---|",
    ]
    for design, row in out["designs"].items():
        last = f"{row['mean'][-1]:.4g} ± {row['ci95'][-1]:.2g}"
        if design == "optimised":
            diff = area = "–"
        else:
            diff = f"{row['optimised_minus_this'][-1]:+.3g} ± {row['optimised_minus_this_ci95'][-1]:.2g}"
            area = "{:+.3g} ± {:.2g}".format(*row["optimised_minus_this_area"])
        used = f"{row['drug_used']:.2f}" if design in ("optimised", "fixed") else "–"
        scale = row["mean_scale_when_used"]
        lines.append(
            f"| {design} | {last} | {diff} | {area} | {used} | "
            f"{'–' if scale is None else f'{scale:.3g}'} |"
        )
    lines += ["", "Wall time (s, incl. compilation): "
              + ", ".join(f"{d}: {s:.0f}" for d, s in seconds.items()), ""]  # fmt: skip
    with open(os.path.join(RESULTS, f"{name}.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
