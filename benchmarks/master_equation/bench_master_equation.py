"""Expected statistics of the master equation: every solver against a plain scipy baseline.

For N = 4 (batch 1000), 8 (batch 100), 12 and 16 (batch 10) binary nodes (random graphs with
in-degree <= 2, alternating fast Gamma(5,1) / slow Gamma(1/5,1) rates as in the paper, tau = 3,
random initial states) this measures, in one run:

- each jaxctbn solver (compile time separately, then best-of-3 steady-state time),
- scipy: per-sample `solve_ivp` (RK45) on the augmented system with a sparse generator,
- accuracy against the exact reference (block expm for S <= 256, else uniformisation),
- XLA's temporary memory per sample (bytes per global state: linear in S means constant),
- the floor: products needed x FLOPs / matmul rate where one loop's working set (56 bytes
  per state and problem) fits in the last-level cache, and x max(FLOPs / matmul rate, bytes /
  streaming bandwidth) where it does not, with both rates measured here. (Counting memory
  traffic for cache-resident loops gave floors above the measured times, time/floor 0.6-0.8.)

Run: `python benchmarks/master_equation/bench_master_equation.py [--quick]`. Writes
`benchmarks/results/master_equation.{json,md}`.
"""

from __future__ import annotations

import glob
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import scipy.integrate
import scipy.sparse

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc  # noqa: E402
from jaxctbn._master_equation.generator import amalgamate, shift_indices  # noqa: E402
from jaxctbn._master_equation.preparation import initial_distribution  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import (  # noqa: E402
    argument_parser,
    compile_time,
    environment,
    fmt,
    machine_rates,
    stopwatch,
    timeit,
    write_results,
)

TAU = 3.0
RTOL, ATOL = 1e-8, 1e-10  # requested accuracy for the ODE routes (scipy and diffrax)


def make_problem(num_nodes, batch, seed=0):
    key = jax.random.key(seed + num_nodes)
    k_graph, k_rates, k_init = jax.random.split(key, 3)
    parents = jc.experiments.random_graph(k_graph, num_nodes, max_parents=2)
    fast = [i % 2 == 1 for i in range(num_nodes)]
    models = jax.vmap(lambda k: jc.random_ctbn(k, parents, fast=fast))(
        jax.random.split(k_rates, batch)
    )
    inits = jax.random.randint(k_init, (batch, num_nodes), 0, 2).astype(jnp.int32)
    return models, inits


def scipy_baseline(models, p0s, samples):
    """Per-sample solve_ivp (RK45) with a scipy.sparse generator: [p, I]' = [W^T p, p]."""
    gens = jax.vmap(lambda m: amalgamate(m, expanded=True))(models)
    cards = gens.cardinalities
    src, dst = shift_indices(cards)
    rates = np.asarray(gens.expanded_rates)
    exits = np.asarray(gens.exit_rates)
    p0s = np.asarray(p0s)
    S = p0s.shape[1]
    out = []
    sw = stopwatch()
    for b in range(samples):
        WT = scipy.sparse.csr_matrix(
            (rates[b].ravel(), (dst.ravel(), src.ravel())), shape=(S, S)
        ) - scipy.sparse.diags(exits[b])

        def rhs(t, y, WT=WT):
            p = y[:S]
            return np.concatenate([WT @ p, p])

        sol = scipy.integrate.solve_ivp(
            rhs,
            (0.0, TAU),
            np.concatenate([p0s[b], np.zeros(S)]),
            method="RK45",
            rtol=RTOL,
            atol=ATOL,
        )
        out.append(sol.y[S:, -1])
    return sw.elapsed, np.stack(out)


def last_level_cache_bytes() -> int:
    """The largest CPU cache's size from sysfs (8 MiB where it cannot be read)."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        with open(path) as f:
            text = f.read().strip()
        scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=8 * 1024**2)


def rel_error(x, ref):
    x, ref = np.asarray(x), np.asarray(ref)
    scale = np.maximum(np.abs(ref), 1e-6 * TAU / ref.shape[-1])
    return float(np.max(np.abs(x - ref) / scale))


def main():
    ap = argument_parser(
        __doc__, quick="small sizes only (for a smoke test)", name="master_equation"
    )
    args = ap.parse_args()
    configs = [(4, 1000), (8, 100), (12, 10), (16, 10)]
    if args.quick:
        configs = [(4, 100), (8, 10)]
    flops_rate, bandwidth = machine_rates()
    cache = last_level_cache_bytes()
    print(f"measured: matmul {flops_rate / 1e9:.1f} GFLOP/s, streaming {bandwidth / 1e9:.1f} GB/s")
    rows, records = [], []
    for N, B in configs:
        models, inits = make_problem(N, B)
        S = 2**N
        J = N
        gens = jax.vmap(amalgamate)(models)
        p0s = jax.vmap(lambda m, s: initial_distribution(m, s))(models, inits)
        unif = jc.Uniformisation()
        products = np.asarray(jax.vmap(lambda g: unif.num_products(g, TAU))(gens))
        solvers = {
            "uniformisation (batched)": (unif, True),
            "uniformisation (vmap)": (unif, False),
            "diffrax Tsit5 (vmap)": (jc.DiffraxSolver(rtol=RTOL, atol=ATOL), False),
            "diffrax Tsit5 (shared steps)": (jc.DiffraxSolver(rtol=RTOL, atol=ATOL), True),
        }
        if S <= 256:
            solvers["block expm (lax.map)"] = (jc.MatrixExponential(), True)
        # right-hand-side evaluations of the ODE routes (Tsit5: 6 per attempted step, FSAL)
        ode = jc.DiffraxSolver(rtol=RTOL, atol=ATOL)

        def _steps(g, p):
            st = ode.diffeqsolve(g.apply, p, TAU).stats
            return st["num_accepted_steps"] + st["num_rejected_steps"]

        vmap_steps = np.asarray(jax.jit(jax.vmap(_steps))(gens, p0s))
        shared = ode.diffeqsolve(
            lambda p: jax.vmap(lambda g, q: g.apply(q))(gens, p), p0s, TAU
        ).stats
        shared_steps = int(shared["num_accepted_steps"] + shared["num_rejected_steps"])
        ode_products = {
            "diffrax Tsit5 (vmap)": 6 * vmap_steps.sum(),
            "diffrax Tsit5 (shared steps)": 6 * shared_steps * B,
        }
        results = {}
        for name, (solver, batched) in solvers.items():
            if batched:
                fn = jax.jit(
                    lambda m, s, solver=solver: (
                        jc.expected_statistics_batch(m, s, TAU, solver=solver).dwell_times
                    )
                )
            else:
                fn = jax.jit(
                    jax.vmap(
                        lambda m, s, solver=solver: (
                            jc.expected_statistics(m, s, TAU, solver=solver).dwell_times
                        )
                    )
                )
            ctime, compiled = compile_time(fn, models, inits)
            mem = compiled.memory_analysis()
            temp = getattr(mem, "temp_size_in_bytes", 0) if mem is not None else 0
            out = compiled(models, inits)
            run = timeit(compiled, models, inits, repeat=3, min_time=0.1)
            results[name] = dict(compile=ctime, run=run, out=np.asarray(out), temp=temp)
        ref_name = "block expm (lax.map)" if S <= 256 else "uniformisation (vmap)"
        ref = results[ref_name]["out"]
        scipy_samples = B if N <= 12 else 3
        scipy_time, scipy_out = scipy_baseline(models, p0s, scipy_samples)
        scipy_per_sample = scipy_time / scipy_samples
        scipy_err = rel_error(scipy_out, ref[:scipy_samples])
        # floor for uniformisation: flops and bytes per product with W
        # per product (factored generator): 3 flops per node and state for the scaled, flipped
        # flows plus 6 for the diagonal and accumulations; bytes: read p, exit rates and both
        # accumulators, write p and both accumulators (rate factors are tiny and stay in cache)
        flops_per = S * (3 * J + 6)
        bytes_per = 8 * S * 7

        def floor_of(products_needed, problems_per_loop):
            """(seconds, bound): a loop whose working set stays in the last-level cache is
            bound by its FLOPs only; beyond it, by the larger of FLOPs and memory traffic."""
            flop_time = flops_per / flops_rate
            if problems_per_loop * bytes_per > cache and bytes_per / bandwidth > flop_time:
                return products_needed * bytes_per / bandwidth, "memory"
            return products_needed * flop_time, "FLOPs"

        group = B if unif.group_size is None else min(B, unif.group_size)
        floors = {
            "uniformisation (batched)": floor_of(products.sum(), group),
            "uniformisation (vmap)": floor_of(products.sum(), B),
        }
        floors.update({k: floor_of(v, B) for k, v in ode_products.items()})
        for name, r in results.items():
            err = rel_error(r["out"], ref) if name != ref_name else 0.0
            floor, bound = floors.get(name, (None, None))
            rec = {
                "N": N,
                "S": S,
                "batch": B,
                "solver": name,
                "compile_s": r["compile"],
                "run_s": r["run"],
                "per_sample_s": r["run"] / B,
                "speedup_vs_scipy": scipy_per_sample * B / r["run"],
                "max_rel_error": err,
                "temp_bytes": r["temp"],
                "temp_bytes_per_state_per_sample": r["temp"] / (S * B),
                "floor_s": floor,
                "floor_bound_by": bound,
                "time_over_floor": (r["run"] / floor) if floor else None,
            }
            records.append(rec)
            rows.append(
                f"| {N} | {S} | {B} | {name} | {fmt(r['compile'])} | {fmt(r['run'])} | "
                f"{rec['speedup_vs_scipy']:.1f}× | {err:.1e} | "
                f"{rec['temp_bytes_per_state_per_sample']:.0f} | "
                f"{f'{fmt(floor)} ({bound})' if floor else '–'} | "
                f"{(r['run'] / floor) if floor else float('nan'):.1f} |"
            )
        records.append(
            {
                "N": N,
                "S": S,
                "batch": B,
                "solver": "scipy solve_ivp RK45 (sparse, loop)",
                "run_s": scipy_per_sample * B,
                "samples_timed": scipy_samples,
                "per_sample_s": scipy_per_sample,
                "max_rel_error": scipy_err,
                "uniformisation_products_mean": float(products.mean()),
                "diffrax_vmap_steps_mean": float(vmap_steps.mean()),
                "diffrax_shared_steps": shared_steps,
            }
        )
        extrap = "" if scipy_samples == B else f" (×{B}/{scipy_samples} timed)"
        rows.append(
            f"| {N} | {S} | {B} | scipy solve_ivp RK45, sparse W, loop{extrap} | – | "
            f"{fmt(scipy_per_sample * B)} | 1× | {scipy_err:.1e} | – | – | – |"
        )
        print(rows[-1], flush=True)
    header = [
        f"# Expected statistics of the master equation (binary nodes, tau = 3, float64, {jax.default_backend()})",
        "",
        f"Machine: {environment()['device']}, {environment()['cpu_count']} cores; "
        f"matmul {flops_rate / 1e9:.1f} GFLOP/s, streaming {bandwidth / 1e9:.1f} GB/s (measured).",
        f"ODE routes at rtol={RTOL}, atol={ATOL}; uniformisation tolerance 1e-13 (exact).",
        "Errors are max relative errors of E[T(s)] (entries below 1e-6·tau/S count as "
        "absolute) against the block matrix exponential (S ≤ 256) or uniformisation.",
        "temp B/state = XLA temporary bytes per global state per sample (constant = linear in S).",
        "floor = products with W needed × FLOPs / matmul rate where one loop's working set "
        f"(56·S bytes per problem) fits in the last-level cache ({cache / 2**20:.0f} MiB), "
        "else × max(FLOPs / matmul rate, 56·S bytes / bandwidth) (marked FLOPs / memory); per "
        "product S·(3N+6) FLOPs; products = Poisson terms (uniformisation, each problem at its own "
        "rate) or 6 × attempted steps (Tsit5), summed over the batch (a loop runs every member for "
        "its group's largest count, which the ratio includes).",
        "'batched' = `expected_statistics_batch` (batch axis last; one loop per group of at most "
        "`Uniformisation.group_size` problems of similar rate); 'vmap' = `jax.vmap` of "
        "`expected_statistics`.",
        "",
        "| N | S | batch | solver | compile | run (batch) | vs scipy | max rel err | "
        "temp B/state | floor | time/floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    payload = {
        "environment": environment(),
        "matmul_flops_per_s": flops_rate,
        "bandwidth_bytes_per_s": bandwidth,
        "tau": TAU,
        "rtol": RTOL,
        "atol": ATOL,
        "records": records,
    }
    write_results(args.name + ("_quick" if args.quick else ""), payload, header + rows)


if __name__ == "__main__":
    main()
