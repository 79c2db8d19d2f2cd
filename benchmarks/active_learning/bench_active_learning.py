"""The paper's synthetic experiments at full size (issue 5): wall time, time per design step,
where the time goes, and the learning curves.

- Structure learning (paper Fig. "fig-structure"): the fixed 4-node fast/slow ground truth
  (`jaxctbn.paper_network(key(0))`, Gamma(5,1) / Gamma(1/5,1) rates), all 81 interventions,
  tau = 3, N_S = 10, exact posterior over all graphs (max in-degree 3), designs passive, random,
  BHC, VBHC; 500 repetitions x 15 experiments by default.
- Parameter learning (Fig. "fig-rate"): the same graph with scaled-softmax rates, designs
  passive, random, BHC, VBHC, negative VBHC; 500 repetitions x 15 experiments.

Outputs: `results/active_<target>/` (summary.md, figure.png, interventions.png, results.json,
config.json) and `results/active_learning.{json,md}` (timings and profile).

The profile splits one VBHC design step (one repetition, one experiment) into: scoring the 81
candidates (`score_interventions`) and the rest (sampling, update, metrics; measured
as the step time of the passive design), and the scoring into its master-equation solves
(the same number of solves through `expected_statistics_batch` alone) and the rest.

Run: `python benchmarks/active_learning/bench_active_learning.py [--quick] [--repetitions R] [--experiments K]
[--chunk C] [--targets structure,parameters] [--designs vbhc,...] [--name NAME] [--shard]
[--cpu-devices D] [--rolled-threefry]` (a `--name` other than the default also suffixes the
run directories);
`--shard` splits each chunk's repetitions across the local devices (`jaxctbn.Sharded()`, the
CLI's `run --shard`: the same results), and `--cpu-devices D` makes the CPU D devices
(`jax_num_cpu_devices`, as `XLA_FLAGS=--xla_force_host_platform_device_count=D` does), so that
on a CPU with D cores each core runs a share of the repetitions; the random hash is compiled
straight-line (`use_unrolled_threefry_on_cpu()`, as the CLI does) unless
`--rolled-threefry` keeps JAX's default;
`--profile-only` times just the pieces of one structure VBHC step (seconds, not the full
experiment) and prints them as JSON without writing any results file.
"""

from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import RESULTS, argument_parser, environment, fmt, stopwatch, timeit, write_results

from jaxctbn._compilation import use_unrolled_threefry_on_cpu
from jaxctbn._criteria.structure import structure_draws


def profile_structure_step(truth, samples=10):
    """Time of the pieces of one structure VBHC step on a posterior after 5 experiments."""
    traj = jc.sample_trajectories(
        truth, jnp.zeros(4, jnp.int32), 3.0, key=jax.random.key(1), num_trajectories=5
    )
    post = jc.learn_structure(traj, truth.names, truth.cardinalities, max_parents=3)
    space = jc.intervention_space(truth.cardinalities)
    init = jnp.zeros(4, jnp.int32)
    score = jax.jit(
        lambda p, k: jc.score_interventions(p, space, init, 3.0, key=k, num_samples=samples)
    )
    jax.block_until_ready(score(post, jax.random.key(0)))
    t_score = timeit(score, post, jax.random.key(1), repeat=3, min_time=0.2)
    # the solves the scoring does: per node, one per clamp pattern of the candidates that leave
    # it free (8 for the 27) x sets x draws, shared by the candidates of a pattern
    from jaxctbn._master_equation.master_equation import clamp_pattern_statistics

    draws = structure_draws(post, jax.random.key(0), samples)
    solves, num_solves = [], 0
    for n in range(4):
        free = np.nonzero(~np.asarray(space.targets[:, n]))[0]
        ivs = jax.tree_util.tree_map(lambda a: a[free], space)
        models = jax.tree_util.tree_map(lambda a: a.reshape(-1, *a.shape[2:]), draws.models[n])
        others = tuple(j for j in range(4) if j != n)
        solves.append((models, ivs, others))
        num_solves += 2 ** len(others) * models.cims[0].shape[0]

    def solve_all(problems):
        return [
            clamp_pattern_statistics(m, init, 3.0, iv, clampable=o).statistics.dwell_times
            for (m, iv, o) in problems
        ]

    solve = jax.jit(lambda ms, ivs: solve_all([(m, i, s[2]) for m, i, s in zip(ms, ivs, solves)]))
    args = ([s[0] for s in solves], [s[1] for s in solves])
    jax.block_until_ready(solve(*args))
    t_solve = timeit(solve, *args, repeat=3, min_time=0.2)
    return {"score_81_candidates_s": t_score, "solves_s": t_solve, "num_solves": num_solves}


def main():
    ap = argument_parser(__doc__, quick=True, repetitions=500, experiments=15, chunk=25)
    ap.add_argument("--targets", default="structure,parameters")
    ap.add_common(name="active_learning")
    ap.add_argument(
        "--designs", default=None, help="comma-separated designs (default: the paper's per target)"
    )
    ap.add_argument(
        "--shard", action="store_true", help="repetitions split across the local devices"
    )
    ap.add_argument("--cpu-devices", type=int, default=None, help="make the CPU this many devices")
    ap.add_argument(
        "--rolled-threefry",
        action="store_true",
        help="keep JAX 0.10's CPU lowering of the random hash (a loop) instead of the "
        "straight-line one of use_unrolled_threefry_on_cpu() (as the CLI); to compare",
    )
    ap.add_argument(
        "--profile-only",
        action="store_true",
        help="only time the pieces of one structure VBHC step; print them, write nothing",
    )
    args = ap.parse_args()
    if args.cpu_devices is not None:  # before anything starts the CPU backend
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    unrolled = not args.rolled_threefry and use_unrolled_threefry_on_cpu()
    if args.profile_only:
        prof = profile_structure_step(jc.paper_network(jax.random.key(0)))
        print(json.dumps({"environment": environment(), "profile": prof}, indent=1))
        return
    R, K, chunk = args.repetitions, args.experiments, args.chunk
    if args.quick:
        R, K, chunk = 4, 3, 2
    designs = {
        "structure": ("passive", "random", "bhc", "vbhc"),
        "parameters": ("passive", "random", "bhc", "vbhc", "negative-vbhc"),
    }
    if args.designs is not None:
        designs = {target: tuple(args.designs.split(",")) for target in designs}
    records, rows = {"environment": environment(), "runs": {}}, []
    records["devices"] = [str(d) for d in jax.local_devices()]
    records["batching"] = "Sharded()" if args.shard else "default (Vmap)"
    records["threefry_lowering"] = "straight-line" if unrolled else "JAX's default"
    for target in args.targets.split(","):
        out = os.path.join(RESULTS, f"active_{target}" + ("_quick" if args.quick else ""))
        if args.name != "active_learning":
            out += f"_{args.name}"
        with stopwatch() as sw:
            config = jc.experiments.ExperimentConfig(
                target=target, designs=designs[target], repetitions=R, experiments=K, chunk=chunk
            )
            report = jc.experiments.run_experiment(
                config, out=out, progress=True, batching=jc.Sharded() if args.shard else None
            )
        wall = sw.seconds
        records["runs"][target] = {
            "wall_s": wall,
            "timing": report["timing"],
            "summary": report["summary"],
        }
        for design, t in report["timing"].items():
            cs = t["chunk_seconds"]
            if not cs:
                rows.append(f"| {target} | {design} | (reused chunks) | – | – |")
                continue
            steady = float(np.median(cs[1:])) if len(cs) > 1 else cs[0]
            per_step = steady / (chunk * K)
            compile_est = max(cs[0] - steady, 0.0)
            total = sum(cs)
            rows.append(
                f"| {target} | {design} | {fmt(total)} | {fmt(compile_est)} | "
                f"{1e3 * per_step:.2f} ms |"
            )
            print(rows[-1], flush=True)
    prof = None
    if "structure" in args.targets:
        prof = profile_structure_step(jc.paper_network(jax.random.key(0)))
        records["profile"] = prof
    lines = [
        f"# Active learning at full size ({jax.default_backend()}, float64): {R} repetitions x "
        f"{K} experiments",
        "",
        f"Command: `python benchmarks/active_learning/bench_active_learning.py{''.join(' ' + a for a in sys.argv[1:])}` "
        f"(chunks of {chunk} repetitions per compiled call). Per step = one repetition, one "
        "experiment (design + simulate + update + metrics), from the median chunk after the "
        "first; compile = first chunk minus a steady chunk. "
        f"{len(jax.local_devices())} device(s); repetitions of a chunk "
        + ("split across them (`jaxctbn.Sharded()`)." if args.shard else "on one device.")
        + " Random hash: "
        + (
            "straight-line (`use_unrolled_threefry_on_cpu()`, as the CLI)."
            if unrolled
            else "JAX's default lowering."
        ),
        "",
        "| experiment | design | wall time (all repetitions) | compile (est.) | per design step |",
        "|---|---|---|---|---|",
        *rows,
    ]
    if prof is not None:
        lines += [
            "",
            "Where the time of a structure VBHC step goes (one posterior after 5 trajectories):",
            "",
            f"- scoring all 81 candidates: {fmt(prof['score_81_candidates_s'])}, of which "
            f"{prof['num_solves']} master-equation solves (per node, the 8 clamp patterns of "
            "the candidates that leave it free, each shared by the candidates that clamp the "
            f"same nodes, x 8 parent sets x 10 draws): {fmt(prof['solves_s'])}; the rest is drawing "
            "graphs and rates, projecting onto the parent sets and the predictive likelihoods.",
        ]
    write_results(args.name + ("_quick" if args.quick else ""), records, lines)


if __name__ == "__main__":
    main()
