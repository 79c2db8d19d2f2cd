"""Mean-field expected statistics (`jc.MeanField()`): accuracy against the exact solver on
networks small enough for it, and the time of a parameter design step on large networks.

Accuracy (N = 4, 6, 8, 10, 12 binary nodes, 2 random graphs each, in-degree <= 2, each edge
present with probability 0.5, rates from the paper's fast/slow Gamma law with alternate nodes
fast and slow, tau = 3, start in state 0):
- relative error of every node's statistics on its own parents,
  `sum|MF - exact| / sum|exact|` over (u, x) for the dwell times and (u, x, x') for the
  transitions, without intervention and under do(X0 = 1); median and max over nodes and graphs;
- rank (Spearman) correlation of the parameter VBHC scores of the 1 + 2N single-node
  interventions (posterior after 5 trajectories, N_S = 10 draws, same key) computed with the
  mean-field statistics against the same scores with the exact ones;
- the same for the structure VBHC (posterior from `learn_structure` on 10 trajectories,
  max_parents = 2) for N <= `--structure-max` (default 6).

Time (N = 20, 50, 100): the parameter VBHC of all 1 + 2N single-node interventions with the
mean-field statistics (N_S = 10, one compiled call, best of 3 after compilation; compile time
reported separately). Target (issue 13): <= 10 s at N = 100 on the 2-core CPU.

Run: `python benchmarks/master_equation/bench_mean_field.py [--quick] [--timing-only] [--name NAME]`; writes `results/mean_field.{json,md}`.
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc
from jaxctbn._paths.sampling import automatic_max_events

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import argument_parser, compile_time, environment, fmt, repeat_time, write_results

TAU, NS = 3.0, 10


def network(seed: int, N: int) -> jc.CTBN:
    key = jax.random.key(seed)
    graph = jc.experiments.random_graph(key, N, max_parents=2)
    return jc.random_ctbn(jax.random.fold_in(key, 1), graph, fast=[n % 2 == 0 for n in range(N)])


def node_errors(model: jc.CTBN) -> tuple[list[float], list[float]]:
    """Relative errors of every free node's statistics without intervention and under
    do(X0 = 1), from one compiled program."""
    init = jnp.zeros(model.num_nodes, jnp.int32)
    do = jc.Intervention.perfect(model, {0: 1})

    @jax.jit
    def both(m):
        out = []
        for solver in (jc.Uniformisation(), jc.MeanField()):
            for iv in (None, do):
                st = jc.expected_statistics(m, init, TAU, intervention=iv, solver=solver)
                out.append(
                    [(st.node_dwell_times(n), st.node_transitions(n)) for n in range(m.num_nodes)]
                )
        return out

    exact_none, exact_do, mf_none, mf_do = both(model)
    dwell, jumps = [], []
    for exact, mf, clamped in [(exact_none, mf_none, None), (exact_do, mf_do, 0)]:
        for n, ((Te, Me), (Tm, Mm)) in enumerate(zip(exact, mf)):
            if n == clamped:
                continue
            dwell.append(float(jnp.abs(Tm - Te).sum() / jnp.abs(Te).sum()))
            jumps.append(float(jnp.abs(Mm - Me).sum() / max(float(jnp.abs(Me).sum()), 1e-300)))
    return dwell, jumps


def history(model: jc.CTBN, seed: int, n: int):
    return jc.sample_trajectories(
        model,
        jnp.zeros(model.num_nodes, jnp.int32),
        TAU,
        key=jax.random.key(1000 + seed),
        num_trajectories=n,
        max_events=automatic_max_events(model, TAU) or 256,
    )


def parameter_posterior(model: jc.CTBN, seed: int) -> jc.RatePosterior:
    traj = history(model, seed, 5)
    stats = jc.SufficientStatistics.from_trajectories(traj, model.cardinalities, model.parents)
    return jc.RatePosterior.for_model(model).update_with(stats)


def scores(posterior, space, key):
    """The VBHC scores from the exact and from the mean-field statistics, one compiled
    program."""
    init = jnp.zeros(len(posterior.cardinalities), jnp.int32)
    return jax.jit(
        lambda p, k: [
            jc.score_interventions(p, space, init, TAU, key=k, num_samples=NS, solver=solver)
            for solver in (jc.Uniformisation(), jc.MeanField())
        ]
    )(posterior, key)


def spearman(a, b) -> float:
    return float(scipy.stats.spearmanr(np.asarray(a), np.asarray(b)).statistic)


def main():
    ap = argument_parser(__doc__, quick=True, name="mean_field")
    ap.add_argument("--structure-max", type=int, default=6)
    ap.add_argument("--timing-only", action="store_true", help="skip the accuracy part")
    args = ap.parse_args()
    sizes = () if args.timing_only else (4, 6) if args.quick else (4, 6, 8, 10, 12)
    seeds = (0,) if args.quick else (0, 1)
    big = (20,) if args.quick else (20, 50, 100)
    accuracy, timing = [], []
    for N in sizes:
        for seed in seeds:
            model = network(seed, N)
            space = jc.single_node_interventions(model.cardinalities)
            row = {"N": N, "seed": seed, "edges": sum(len(p) for p in model.parents)}
            dwell, jumps = node_errors(model)
            row.update(dwell_errors=dwell, transition_errors=jumps)
            post = parameter_posterior(model, seed)
            key = jax.random.key(7 + seed)
            exact, mf = scores(post, space, key)
            row["parameter_spearman"] = spearman(exact, mf)
            if N <= args.structure_max:
                traj = history(model, seed, 10)
                spost = jc.learn_structure(traj, model.names, model.cardinalities, max_parents=2)
                exact, mf = scores(spost, space, key)
                row["structure_spearman"] = spearman(exact, mf)
            accuracy.append(row)
            print(
                f"N={N} seed={seed} dwell err median {np.median(row['dwell_errors']):.2e} "
                f"max {max(row['dwell_errors']):.2e}; parameter rho "
                f"{row['parameter_spearman']:.3f}; structure rho "
                f"{row.get('structure_spearman', float('nan')):.3f}",
                flush=True,
            )
    for N in big:
        model = network(0, N)
        space = jc.single_node_interventions(model.cardinalities)
        post = parameter_posterior(model, 0)
        init = jnp.zeros(N, jnp.int32)
        fn = jax.jit(
            lambda p, k, space=space, init=init: jc.score_interventions(
                p, space, init, TAU, key=k, num_samples=NS, solver=jc.MeanField()
            )
        )
        key = jax.random.key(3)
        compile_s, compiled = compile_time(fn, post, key)
        _, step = repeat_time(compiled, post, key, repeats=3)
        runs = step.times
        timing.append(
            {
                "N": N,
                "interventions": int(space.targets.shape[0]),
                "compile_s": compile_s,
                "time_s": min(runs),
            }
        )
        print(f"N={N}: compile {compile_s:.1f} s, step {min(runs):.3f} s", flush=True)

    lines = [
        "# Mean-field expected statistics",
        "",
        "Accuracy against the exact solver (Uniformisation): relative error of each free node's "
        "statistics on its own parents (no intervention and do(X0 = 1); median / max over nodes "
        "and graphs), and Spearman correlation of the VBHC scores of the 1 + 2N single-node "
        "interventions computed from mean-field vs exact statistics (same posterior draws).",
        "",
        "| N | graphs | edges (mean) | dwell error median | dwell error max | transition error "
        "median | transition error max | parameter VBHC rho (min) | structure VBHC rho (min) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for N in sizes:
        rows = [r for r in accuracy if r["N"] == N]
        d = np.concatenate([r["dwell_errors"] for r in rows])
        m = np.concatenate([r["transition_errors"] for r in rows])
        s = [r["structure_spearman"] for r in rows if "structure_spearman" in r]
        lines.append(
            f"| {N} | {len(rows)} | {np.mean([r['edges'] for r in rows]):.1f} | "
            f"{np.median(d):.2e} | {d.max():.2e} | {np.median(m):.2e} | {m.max():.2e} | "
            f"{min(r['parameter_spearman'] for r in rows):.3f} | "
            f"{(f'{min(s):.3f}') if s else '–'} |"
        )
    lines += [
        "",
        "Time of one parameter design step with the mean-field statistics: VBHC of all 1 + 2N "
        "single-node interventions, N_S = 10, one compiled call (best of 3; compile separate).",
        "",
        "| N | interventions | compile | step |",
        "|---|---|---|---|",
    ]
    for r in timing:
        lines.append(
            f"| {r['N']} | {r['interventions']} | {fmt(r['compile_s'])} | {fmt(r['time_s'])} |"
        )
    write_results(
        args.name,
        {"environment": environment(), "accuracy": accuracy, "timing": timing},
        lines,
    )


if __name__ == "__main__":
    main()
