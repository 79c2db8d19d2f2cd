"""Design criteria: time to score the whole intervention space, and ranking accuracy vs a
high-sample EIG reference.

Problem: the paper's 4-node fast/slow network (81 interventions), a history of 5 trajectories,
tau = 3, initial state 0, N_S = 10 posterior draws; structure criteria with max in-degree 2. Also
random 6- and 8-node networks for the parameter criteria (729 and 6561 interventions) and the
structure VBHC over the 1 + 2N single-node interventions.

Ranking accuracy = Spearman correlation of a criterion's scores over the 81 interventions with a
high-sample EIG (parameters: N_S = 400 draws x 10 paths; structure: N_S = 60 x 10 paths), mean
over 5 seeds of the criterion.

Criterion labels: `vbhc` = `jc.VBHC()` (closed form), `vbhc-optax` = `jc.VBHC(optimiser=jc.LBFGS())`,
`bhc` = `jc.BHC()`, `eig` = `jc.EIG(num_paths=paths)`, `vbhc-mc` =
`jc.VBHC(estimator=jc.MonteCarlo(num_paths=paths))`; all through `jc.score_interventions`.

Run: `python benchmarks/criteria/bench_criteria.py [--quick]`; writes `results/criteria.{json,md}`.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import argument_parser, compile_time, environment, fmt, timeit, write_results

TAU, NS = 3.0, 10


def history(truth, key, n=5):
    traj = jc.sample_trajectories(
        truth, jnp.zeros(truth.num_nodes, jnp.int32), TAU, key=key, num_trajectories=n
    )
    return traj


PARAMETER_CRITERIA = {
    "vbhc": jc.VBHC(),
    "vbhc-optax": jc.VBHC(optimiser=jc.LBFGS()),  # the closed-form minimum by optax L-BFGS
    "bhc": jc.BHC(),
}
STRUCTURE_CRITERIA = {"vbhc": jc.VBHC(), "bhc": jc.BHC()}


def param_scores(post, space, init, key, crit, ns=NS, paths=10):
    if crit == "eig":
        criterion, batching = jc.EIG(num_paths=paths), jc.Chunked(9)
    else:
        criterion, batching = PARAMETER_CRITERIA[crit], None
    return jc.score_interventions(
        post, space, init, TAU, key=key, num_samples=ns, criterion=criterion, batching=batching
    )


def struct_scores(post, space, init, key, crit, ns=NS, paths=10):
    if crit == "eig":
        criterion, batching = jc.EIG(num_paths=paths), jc.Chunked(3)
    elif crit == "vbhc-mc":
        criterion = jc.VBHC(estimator=jc.MonteCarlo(num_paths=paths))
        batching = jc.Chunked(3)
    else:
        criterion, batching = STRUCTURE_CRITERIA[crit], None  # default Chunked(9)
    return jc.score_interventions(
        post, space, init, TAU, key=key, num_samples=ns, criterion=criterion, batching=batching
    )


def main():
    ap = argument_parser(__doc__, quick=True, name="criteria")
    args = ap.parse_args()
    truth = jc.paper_network(jax.random.key(0))
    traj = history(truth, jax.random.key(1))
    ppost = jc.RatePosterior.for_model(truth).update_with(
        jc.SufficientStatistics.from_trajectories(traj, truth.cardinalities, truth.parents)
    )
    spost = jc.learn_structure(traj, truth.names, truth.cardinalities, max_parents=2)
    space = jc.intervention_space(truth.cardinalities)
    init = jnp.zeros(4, jnp.int32)
    key = jax.random.key(2)
    rows, records = [], []
    seeds = 2 if args.quick else 5
    # ---- reference EIGs
    ref_p = np.asarray(
        jax.jit(lambda p, k: param_scores(p, space, init, k, "eig", ns=40 if args.quick else 400))(
            ppost, jax.random.key(99)
        )
    )
    ref_s = np.asarray(
        jax.jit(lambda p, k: struct_scores(p, space, init, k, "eig", ns=10 if args.quick else 60))(
            spost, jax.random.key(98)
        )
    )
    setups = [
        ("parameters", "vbhc", {}),
        ("parameters", "vbhc-optax", {}),
        ("parameters", "bhc", {}),
        ("parameters", "eig", {"paths": 1}),
        ("parameters", "eig", {"paths": 10}),
        ("parameters", "eig", {"paths": 10, "ns": 50}),
        ("structure", "vbhc", {}),
        ("structure", "vbhc-mc", {"paths": 10}),
        ("structure", "bhc", {}),
        ("structure", "eig", {"paths": 1}),
        ("structure", "eig", {"paths": 10}),
    ]
    for target, crit, kw in setups:
        post, fn, ref = (
            (ppost, param_scores, ref_p)
            if target == "parameters"
            else (spost, struct_scores, ref_s)
        )
        jitted = jax.jit(lambda p, k, crit=crit, kw=kw, fn=fn: fn(p, space, init, k, crit, **kw))
        ctime, compiled = compile_time(jitted, post, key)
        run = timeit(compiled, post, key, repeat=3, min_time=0.05)
        rhos = []
        for s in range(seeds):
            sc = np.asarray(compiled(post, jax.random.key(1000 + s)))
            rhos.append(scipy.stats.spearmanr(sc, ref).statistic)
        label = crit + "".join(f", {k}={v}" for k, v in kw.items())
        rec = {
            "target": target,
            "criterion": label,
            "compile_s": ctime,
            "run_s": run,
            "spearman_mean": float(np.mean(rhos)),
            "spearman_sd": float(np.std(rhos)),
            "interventions": 81,
            "N": 4,
        }
        records.append(rec)
        rows.append(
            f"| 4 | 81 | {target} | {label} | {fmt(ctime)} | {fmt(run)} | "
            f"{np.mean(rhos):.3f} ± {np.std(rhos):.3f} |"
        )
        print(rows[-1], flush=True)
    # ---- larger networks
    for N in [] if args.quick else [6, 8]:
        parents = jc.experiments.random_graph(jax.random.key(N), N, max_parents=2)
        model = jc.random_ctbn(jax.random.key(N + 1), parents, fast=[i % 2 == 1 for i in range(N)])
        tr = history(model, jax.random.key(N + 2))
        pp = jc.RatePosterior.for_model(model).update_with(
            jc.SufficientStatistics.from_trajectories(tr, model.cardinalities, model.parents)
        )
        full = jc.intervention_space(model.cardinalities)
        ini = jnp.zeros(N, jnp.int32)
        for crit in ("vbhc", "bhc"):
            jitted = jax.jit(lambda p, k, crit=crit: param_scores(p, full, ini, k, crit))
            ctime, compiled = compile_time(jitted, pp, key)
            run = timeit(compiled, pp, key, repeat=2, min_time=0.01)
            n_iv = int(full.targets.shape[0])
            records.append(
                {
                    "target": "parameters",
                    "criterion": crit,
                    "N": N,
                    "interventions": n_iv,
                    "compile_s": ctime,
                    "run_s": run,
                }
            )
            rows.append(f"| {N} | {n_iv} | parameters | {crit} | {fmt(ctime)} | {fmt(run)} | – |")
            print(rows[-1], flush=True)
        sp = jc.learn_structure(tr, model.names, model.cardinalities, max_parents=2)
        single = jax.tree_util.tree_map(lambda a: a[np.asarray(full.targets.sum(1) <= 1)], full)
        n_iv = int(single.targets.shape[0])
        jitted = jax.jit(lambda p, k: struct_scores(p, single, ini, k, "vbhc"))
        ctime, compiled = compile_time(jitted, sp, key)
        run = timeit(compiled, sp, key, repeat=2, min_time=0.01)
        records.append(
            {
                "target": "structure",
                "criterion": "vbhc (single-node interventions)",
                "N": N,
                "interventions": n_iv,
                "compile_s": ctime,
                "run_s": run,
            }
        )
        rows.append(
            f"| {N} | {n_iv} | structure | vbhc (single-node interventions) | {fmt(ctime)} | {fmt(run)} | – |"
        )
        print(rows[-1], flush=True)
    header = [
        f"# Design criteria: scoring the intervention space ({jax.default_backend()}, float64)",
        "",
        f"Machine: {environment()['device']}, {environment()['cpu_count']} cores. N_S = {NS}, tau = {TAU}, "
        "history of 5 trajectories. run = time to score all listed interventions after compilation.",
        "Spearman = rank correlation with a high-sample EIG over the 81 interventions of the 4-node "
        f"network (mean ± sd over {seeds} seeds of the criterion's draws).",
        "",
        "| N | interventions | target | criterion | compile | run | Spearman vs EIG reference |",
        "|---|---|---|---|---|---|---|",
    ]
    write_results(
        args.name + ("_quick" if args.quick else ""),
        {"environment": environment(), "records": records},
        header + rows,
    )


if __name__ == "__main__":
    main()
