"""Structure learning on 20-1000 binary nodes: hill climbing (`jaxctbn.HillClimbing`, in-degree
K = 3) against exhaustive scoring (K = 2, where it fits) on the same simulated data: time (first
call, with compilation, and a second call), peak memory of the process, SHD and AUROC of the
edge marginals against the truth.

Data: a random graph (each node 0-2 parents drawn uniformly), binary nodes with strongly
parent-dependent rates (`jaxctbn.experiments.scaled_softmax_ctbn`, rate_fast = 2), 50
trajectories of tau = 3 from uniform random starts (seed 0). Each configuration runs in its own
process (`--worker`), so its peak RSS is its own; the rates prior is Gamma(1, 1) and the
structure prior uniform over the candidate sets (the library's defaults). SHD counts the
missing and the extra edges of the MAP graph (a CTBN graph may be cyclic: no reversals).

Run: `python benchmarks/bench_graph_search.py [--sizes 20,50,100,200] [--quick]`; writes
`results/graph_search.{json,md}`. Peers (causal-hub's CTHC and CTPC, pyAgrum's CTPC, CTBN-RLE)
are not in this table yet.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _network(N: int):
    import numpy as np

    import jaxctbn as jc

    rng = np.random.default_rng(0)
    parents = tuple(
        tuple(
            sorted(
                rng.choice([m for m in range(N) if m != n], size=rng.integers(0, 3), replace=False)
                .astype(int)
                .tolist()
            )
        )
        for n in range(N)
    )
    return parents, jc.experiments.scaled_softmax_ctbn(parents, (2,) * N, rate_fast=2.0)


def sample(N: int, R: int, duration: float, path: str) -> None:
    """The data of size N, sampled in its own process (the learner's peak RSS is its own)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    import jaxctbn as jc

    _, truth = _network(N)
    starts = jax.random.bernoulli(jax.random.key(1), 0.5, (R, N)).astype(jnp.int32)
    traj = jc.sample_trajectories(
        truth, starts, duration, key=jax.random.key(2), num_trajectories=R,
        max_events=int(4 * N * duration),
    )  # fmt: skip
    assert not np.any(traj.truncated)
    np.savez(path, **{f: np.asarray(getattr(traj, f)) for f in traj.__dataclass_fields__})


def worker(N: int, search: str, K: int, path: str) -> dict:
    import jax
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    import jaxctbn as jc

    parents, _ = _network(N)
    with np.load(path) as f:
        traj = jc.Trajectories(**{k: jax.numpy.asarray(f[k]) for k in f.files})
    R = traj.num_events.shape[0]
    names = [f"X{i}" for i in range(N)]
    choice = jc.HillClimbing(swaps=False) if search == "hill-climbing" else jc.Exhaustive()
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        post = jc.learn_structure(traj, names, (2,) * N, max_parents=K, search=choice)
        edges = np.asarray(post.edge_marginals())
        graph = post.map_graph()
        times.append(time.perf_counter() - t0)
    true = np.zeros((N, N), bool)
    for n, ps in enumerate(parents):
        true[list(ps), n] = True
    off = ~np.eye(N, dtype=bool)
    learned = np.zeros((N, N), bool)
    for n, ps in enumerate(graph):
        learned[list(ps), n] = True
    missing = int((true & ~learned).sum())
    extra = int((~true & learned & off).sum())
    # AUROC of the edge marginals (ties counted half)
    pos, neg = edges[true & off], edges[~true & off]
    order = np.argsort(np.concatenate([pos, neg]), kind="stable")
    ranks = np.empty(len(order))
    values = np.concatenate([pos, neg])[order]
    ranks[order] = np.arange(1, len(order) + 1)
    for v in np.unique(values):  # average ranks over ties
        tie = np.concatenate([pos, neg]) == v
        ranks[tie] = ranks[tie].mean()
    auroc = (ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg))
    return {
        "nodes": N,
        "search": search,
        "max_parents": K,
        "trajectories": int(R),
        "events": int(np.asarray(traj.num_events).sum()),
        "true_edges": int(true.sum()),
        "first_s": times[0],
        "second_s": times[1],
        "missing": missing,
        "extra": extra,
        "shd": missing + extra,
        "auroc": float(auroc),
        "candidate_sets": int(sum(s.shape[0] for s in post.parent_sets)),
    }


def main():
    from _common import environment, measure_process, write_results

    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="20,50,100,200")
    ap.add_argument("--exhaustive-up-to", type=int, default=100, help="largest N for K = 2")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--name", default="graph_search")
    ap.add_argument("--worker", nargs=4, metavar=("N", "SEARCH", "K", "DATA"))
    ap.add_argument("--sample", nargs=2, metavar=("N", "DATA"))
    args = ap.parse_args()
    R, duration = (20, 2.0) if args.quick else (50, 3.0)
    if args.sample:
        sample(int(args.sample[0]), R, duration, args.sample[1])
        return
    if args.worker:
        N, search, K, data = args.worker
        print(json.dumps(worker(int(N), search, int(K), data)))
        return
    import tempfile

    work = tempfile.mkdtemp(prefix="jaxctbn-bench-graph-search-")
    records = []
    for N in (int(x) for x in args.sizes.split(",")):
        data = os.path.join(work, f"paths_{N}.npz")
        cmd = [sys.executable, __file__, "--sample", str(N), data]
        measure_process(cmd + (["--quick"] if args.quick else []))
        runs = [("hill-climbing", 3)]
        if N <= args.exhaustive_up_to:
            runs.append(("exhaustive", 2))
        for search, K in runs:
            cmd = [sys.executable, __file__, "--worker", str(N), search, str(K), data]
            cmd += ["--quick"] if args.quick else []
            rec = measure_process(cmd)
            out = json.loads(rec["stdout"].strip().splitlines()[-1])
            out["peak_rss_bytes"] = rec["peak_rss_bytes"]
            out["process_s"] = rec["wall_s"]
            records.append(out)
            print(json.dumps(out), flush=True)
    lines = [
        "# Structure learning on large networks: hill climbing and exhaustive scoring",
        "",
        f"Binary nodes, random graphs (0-2 parents per node), {R} trajectories of tau = "
        f"{duration}; Gamma(1, 1) rates prior, uniform structure prior. Hill climbing: additions "
        "and removals (`HillClimbing(swaps=False)`), then the exact posterior over each node's "
        "pool of 6 parents. Times: the first call (with compilation) and a second call; peak "
        "RSS of the whole process.",
        "",
        "| N | search | K | events | true edges | candidate sets | first call | second call | "
        "SHD (missing + extra) | AUROC | peak RSS |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['nodes']} | {r['search']} | {r['max_parents']} | {r['events']} | "
            f"{r['true_edges']} | {r['candidate_sets']} | {r['first_s']:.1f} s | "
            f"{r['second_s']:.2f} s | {r['shd']} ({r['missing']} + {r['extra']}) | "
            f"{r['auroc']:.3f} | {r['peak_rss_bytes'] / 2**20:.0f} MiB |"
        )
    write_results(args.name, {"environment": environment(), "records": records}, lines)


if __name__ == "__main__":
    main()
