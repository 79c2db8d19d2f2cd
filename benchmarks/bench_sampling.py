"""Gillespie sampling throughput (events/s): jitted + vmapped jaxctbn vs a numpy per-path loop.

Networks: the paper's 4-node fast/slow network and a random 8-node binary network (in-degree
<= 2), tau = 3, random initial states. The numpy baseline is the textbook algorithm (per-node
rate lookup from the CIMs, exponential waiting time, categorical choice) in a Python loop.

Run: `python benchmarks/bench_sampling.py [--quick]`; writes `results/sampling.{json,md}`.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc  # noqa: E402

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import compile_time, environment, fmt, timeit, write_results  # noqa: E402

TAU = 3.0


def numpy_gillespie(model, initial_states, tau, rng):
    cims = [np.asarray(c) for c in model.cims]
    cards = model.cardinalities
    parents = model.parents
    events = 0
    for s0 in initial_states:
        s = np.array(s0)
        t = 0.0
        while True:
            rates = []
            for n, _k in enumerate(cards):
                u = 0
                for p in parents[n]:
                    u = u * cards[p] + s[p]
                row = cims[n][u, s[n]].copy()
                row[s[n]] = 0.0
                rates.append(row)
            flat = np.concatenate(rates)
            total = flat.sum()
            t += rng.exponential() / total
            if t >= tau:
                break
            idx = np.searchsorted(np.cumsum(flat), rng.random() * total, side="right")
            n = np.searchsorted(np.cumsum(cards), idx, side="right")
            s[n] = idx - sum(cards[:n])
            events += 1
    return events


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--name", default="sampling", help="results file stem")
    args = ap.parse_args()
    R = 2000 if args.quick else 20000
    R_np = 100 if args.quick else 500
    nets = {
        "paper 4-node": jc.paper_network(jax.random.key(0)),
        "random 8-node": jc.random_ctbn(
            jax.random.key(1),
            jc.random_graph(jax.random.key(2), 8, max_parents=2),
            fast=[i % 2 == 1 for i in range(8)],
        ),
    }
    rows, records = [], []
    for label, model in nets.items():
        key = jax.random.key(3)
        inits = jax.random.randint(key, (R, model.num_nodes), 0, 2).astype(jnp.int32)

        def run(key, inits, model=model):
            t = jc.sample_trajectories(
                model, inits, TAU, key=key, num_trajectories=R, max_events=512
            )
            return t.num_events, t.truncated

        fn = jax.jit(run)
        ctime, compiled = compile_time(fn, key, inits)
        num, trunc = compiled(key, inits)
        assert not bool(trunc.any())
        events = int(num.sum())
        t_jax = timeit(compiled, key, inits, repeat=3, min_time=0.2)
        rng = np.random.default_rng(0)
        t0 = time.perf_counter()
        ev_np = numpy_gillespie(model, np.asarray(inits[:R_np]), TAU, rng)
        t_np = time.perf_counter() - t0
        rate_jax, rate_np = events / t_jax, ev_np / t_np
        rec = {
            "network": label,
            "trajectories": R,
            "events": events,
            "compile_s": ctime,
            "jax_s": t_jax,
            "jax_events_per_s": rate_jax,
            "numpy_trajectories": R_np,
            "numpy_events": ev_np,
            "numpy_s": t_np,
            "numpy_events_per_s": rate_np,
            "speedup": rate_jax / rate_np,
        }
        records.append(rec)
        rows.append(
            f"| {label} | {R} | {events / R:.1f} | {fmt(ctime)} | {fmt(t_jax)} | "
            f"{rate_jax / 1e6:.2f} M | {rate_np / 1e3:.1f} k | {rec['speedup']:.0f}× |"
        )
        print(rows[-1], flush=True)
    header = [
        f"# Gillespie sampling throughput (tau = 3, float64, {jax.default_backend()})",
        "",
        f"Machine: {environment()['device']}, {environment()['cpu_count']} cores. "
        "numpy baseline: per-path Python loop, same algorithm.",
        "",
        "| network | trajectories | events/path | compile | run | jax events/s | "
        "numpy events/s | speedup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    write_results(
        args.name + ("_quick" if args.quick else ""),
        {"environment": environment(), "tau": TAU, "records": records},
        header + rows,
    )


if __name__ == "__main__":
    main()
