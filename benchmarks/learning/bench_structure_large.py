"""Exhaustive structure learning on 20-100 binary nodes (max in-degree 2), against CTBN-RLE.

The workload of issue 13: random graphs with in-degree <= 2, rates Gamma(2, 2), 300 trajectories
of length 100 from random initial states, every parent set of at most 2 parents of every node
scored (C(N-1, <= 2) sets per node) with the Nodelman et al. prior (alpha = tau = 1, the family
score of CTBN-RLE's `CTBNFamScore`).

Each run of jaxctbn is a **separate process** (`--worker`), so its peak resident memory is that
of the whole process (GNU `time -v`, or `wait4` where `time` is missing), as for the C++ peer:
it loads the data, calls `learn_structure` once (compile + run) and once more (run), and
reports both times. In the same benchmark, on the same data:

- the baseline, the segment route (`method="matmul"`, the default before the jumps route) at
  N = 20 (and at N = 50 with `--all`; it takes minutes there);
- CTBN-RLE's exhaustive `BruteStructureSearch` (`benchmarks/_ctbnrle.py`; skipped with a note
  when its driver is not built) at N = 20, and at N = 50 with `--all` (~50 min): time, peak
  memory, the learned graph, and the family scores of every parent set of node 0 against
  jaxctbn's;
- recovery against data size at N = 50 (10, 30, 100, 300 trajectories): MAP SHD, edge AUROC.

Run: `python benchmarks/learning/bench_structure_large.py [--quick] [--all] [--sizes 20,50,100]`;
writes `results/structure_large.{json,md}`.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc
from jaxctbn._active_learning.metrics import adjacency_from_parents
from jaxctbn._paths.sampling import automatic_max_events

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
import _ctbnrle
from _common import (
    argument_parser,
    environment,
    fmt,
    measure_process,
    repeat_time,
    write_results,
)

TAU, R, ALPHA, TAU_PRIOR = 100.0, 300, 1.0, 1.0
PRIOR = jc.NodelmanPrior(ALPHA, TAU_PRIOR)
FIELDS = tuple(jc.Trajectories.__dataclass_fields__)


def make_data(N: int, num: int = R, seed: int = 0):
    """A random binary network on N nodes and `num` trajectories (buffer trimmed to the most
    jumps of any path)."""
    kg, kr, ki, ks = jax.random.split(jax.random.key(seed + 1000 * N), 4)
    parents = jc.experiments.random_graph(kg, N, max_parents=2)
    truth = jc.random_ctbn(kr, parents, [2] * N, alpha_fast=2.0, beta=2.0)
    inits = jax.random.randint(ki, (num, N), 0, 2).astype(jnp.int32)
    cap = automatic_max_events(truth, TAU)
    traj = jax.jit(
        lambda: jc.sample_trajectories(
            truth, inits, TAU, key=ks, num_trajectories=num, max_events=cap
        )
    )()
    assert not bool(traj.truncated.any())
    used = max(int(traj.num_events.max()), 1)
    traj = jc.Trajectories(
        **{
            f: getattr(traj, f)[:, :used] if f in ("states", "jump_times") else getattr(traj, f)
            for f in FIELDS
        }
    )
    return truth, traj


def worker(path: str, method: str) -> None:
    """One `learn_structure` call in this process (compile + run, then run); JSON on stdout."""
    with np.load(path) as data:
        traj = jc.Trajectories(**{f: jnp.asarray(data[f]) for f in FIELDS})
    N = int(traj.initial_states.shape[-1])
    names = [f"X{n}" for n in range(N)]

    def learn():
        post = jc.learn_structure(traj, names, [2] * N, max_parents=2, prior=PRIOR, method=method)
        jax.block_until_ready(post.log_marginal_likelihoods)
        return post

    post, timing = repeat_time(learn, repeats=2)  # compile + run, then run
    times = timing.times
    print(
        json.dumps(
            {
                "first_s": times[0],
                "run_s": times[1],
                "map_graph": [list(p) for p in post.map_graph()],
                "node0_scores": np.asarray(post.log_marginal_likelihoods[0]).tolist(),
                "node0_sets": np.asarray(post.parent_sets[0]).tolist(),
                "edge_marginals": np.asarray(post.edge_marginals()).tolist(),
            }
        )
    )


def run_worker(path: str, method: str, timeout: float) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", path, "--method", method]
    out = measure_process(cmd, timeout=timeout)
    result = json.loads(out["stdout"].strip().splitlines()[-1])
    result.update(peak_rss_bytes=out["peak_rss_bytes"], wall_s=out["wall_s"])
    return result


def recovery(truth, traj) -> tuple[int, float]:
    N = truth.num_nodes
    post = jc.learn_structure(traj, truth.names, [2] * N, max_parents=2, prior=PRIOR)
    adj = adjacency_from_parents(truth.parents, N)
    shd = int(jc.experiments.structural_hamming_distance(post.map_adjacency(), adj))
    return shd, float(jc.experiments.edge_auroc(post.edge_marginals(), adj))


def mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


def main():
    ap = argument_parser(__doc__, quick="N = 20 only, no peer, no sweep")
    ap.add_argument("--worker")
    ap.add_argument("--method", default="auto")
    ap.add_argument("--all", action="store_true", help="also the slow baselines at N = 50")
    ap.add_argument("--sizes", default="20,50,100")
    ap.add_argument("--timeout", type=float, default=3600.0)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.method)
        return
    sizes = [20] if args.quick else [int(s) for s in args.sizes.split(",")]
    driver = None if args.quick else _ctbnrle.find_driver()
    notes = [] if driver or args.quick else [_ctbnrle.SKIP_MESSAGE]
    rows, records = [], []
    tmp = tempfile.mkdtemp(prefix="jaxctbn_bench_")
    baseline = {20} | ({50} if args.all else set())
    for N in sizes:
        truth, traj = make_data(N)
        events = int(traj.num_events.sum())
        path = os.path.join(tmp, f"data{N}.npz")
        np.savez(path, **{f: np.asarray(getattr(traj, f)) for f in FIELDS})
        adj = adjacency_from_parents(truth.parents, N)
        runs = [("jaxctbn (auto)", "auto")]
        if N in baseline:
            runs.append(("jaxctbn matmul (baseline)", "matmul"))
        results = {}
        for label, method in runs:
            res = run_worker(path, method, args.timeout)
            results[method] = res
            shd = int(
                jc.experiments.structural_hamming_distance(
                    adjacency_from_parents([tuple(p) for p in res["map_graph"]], N),
                    adj,
                )
            )
            rec = {
                "N": N,
                "engine": label,
                "events": events,
                "sets_per_node": len(res["node0_sets"]),
                "run_s": res["run_s"],
                "first_s": res["first_s"],
                "peak_rss_bytes": res["peak_rss_bytes"],
                "map_shd": shd,
                "edge_auroc": float(
                    jc.experiments.edge_auroc(jnp.asarray(res["edge_marginals"]), adj)
                ),
            }
            records.append(rec)
            rows.append(
                f"| {N} | {label} | {events} | {rec['sets_per_node']} | {fmt(rec['run_s'])} | "
                f"{fmt(rec['first_s'])} | {mib(rec['peak_rss_bytes'])} | {shd} | "
                f"{rec['edge_auroc']:.3f} | |"
            )
            print(rows[-1], flush=True)
        if "matmul" in results:
            a = np.asarray(results["auto"]["node0_scores"])
            b = np.asarray(results["matmul"]["node0_scores"])
            records[-1]["max_rel_score_diff_vs_auto"] = float(
                np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b)))
            )
        if driver and (N <= 20 or args.all):
            csv = os.path.join(tmp, f"data{N}.csv")
            _ctbnrle.write_long_csv(traj, csv)
            peer = _ctbnrle.learn(driver, csv, ALPHA, TAU_PRIOR, 2, node=0, timeout=args.timeout)
            ours = dict(
                zip(
                    [tuple(int(p) for p in P if p >= 0) for P in results["auto"]["node0_sets"]],
                    results["auto"]["node0_scores"],
                )
            )
            diff = max(
                abs(ours[tuple(sorted(P))] - s) / max(1.0, abs(s))
                for P, s in peer["scores"].items()
            )
            same = [tuple(sorted(p)) for p in results["auto"]["map_graph"]] == list(peer["parents"])
            shd = int(
                jc.experiments.structural_hamming_distance(
                    adjacency_from_parents(list(peer["parents"]), N), adj
                )
            )
            rec = {
                "N": N,
                "engine": "CTBN-RLE",
                "events": events,
                "run_s": peer["learn_s"],
                "read_s": peer["read_s"],
                "wall_s": peer["wall_s"],
                "peak_rss_bytes": peer["peak_rss_bytes"],
                "rss_source": peer["rss_source"],
                "map_shd": shd,
                "same_map_graph": same,
                "max_rel_score_diff_node0": diff,
                "speed_ratio": peer["learn_s"] / results["auto"]["run_s"],
                "memory_ratio": results["auto"]["peak_rss_bytes"] / peer["peak_rss_bytes"],
            }
            records.append(rec)
            rows.append(
                f"| {N} | CTBN-RLE | {events} | {len(peer['scores'])} | {fmt(peer['learn_s'])} | "
                f"{fmt(peer['wall_s'])} (process) | {mib(peer['peak_rss_bytes'])} | {shd} | – | "
                f"scores {diff:.0e}, same MAP {same}; jaxctbn {rec['speed_ratio']:.0f}× faster, "
                f"{rec['memory_ratio']:.1f}× its memory |"
            )
            print(rows[-1], flush=True)
        del traj
    sweep_rows, sweep = [], []
    if not args.quick:
        truth, traj = make_data(50)
        for num in (10, 30, 100, 300):
            part = jax.tree_util.tree_map(lambda a: a[:num], traj)
            shd, auroc = recovery(truth, part)
            sweep.append({"N": 50, "trajectories": num, "map_shd": shd, "edge_auroc": auroc})
            sweep_rows.append(f"| {num} | {int(part.num_events.sum())} | {shd} | {auroc:.3f} |")
            print(sweep_rows[-1], flush=True)
    idle = measure_process(
        [
            sys.executable,
            "-c",
            "import jax, jax.numpy as jnp, jaxctbn; "
            "jax.config.update('jax_enable_x64', True); jax.jit(lambda x: x + 1)(jnp.ones(3))",
        ]
    )["peak_rss_bytes"]
    notes.append(
        f"an idle jaxctbn process (import, one tiny compiled call) peaks at {mib(idle)}; the "
        "data (int32 states after every jump) is held twice by a worker (numpy and JAX)"
    )
    env = environment()
    header = [
        f"# Structure learning on 20-100 binary nodes, max in-degree 2 ({jax.default_backend()}, "
        "float64)",
        "",
        f"Machine: {env['device']}, {env['cpu_count']} cores. {R} trajectories of length {TAU:g} "
        "per network (random graph, in-degree <= 2, rates Gamma(2, 2)), every parent set of at "
        "most 2 parents scored (Nodelman prior alpha = tau = 1 = CTBN-RLE's CTBNFamScore). "
        "Each engine runs as its own process: *run* = learning after compilation (CTBN-RLE: its "
        "in-process search time), *first* = the first call with compilation (CTBN-RLE: the whole "
        "process), *peak memory* = the process's maximum resident set. `auto` picks the jumps "
        "route at these sizes.",
        *[f"Note: {n}" for n in notes],
        "",
        "| N | engine | events | sets/node | run | first | peak memory | MAP SHD | edge AUROC | "
        "vs jaxctbn |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    tail = []
    if sweep_rows:
        tail = [
            "",
            "## Recovery against data size (N = 50, same network, first R trajectories)",
            "",
            "| trajectories | events | MAP SHD | edge AUROC |",
            "|---|---|---|---|",
            *sweep_rows,
        ]
    write_results(
        "structure_large" + ("_quick" if args.quick else ""),
        {
            "environment": env,
            "records": records,
            "recovery": sweep,
            "notes": notes,
            "idle_process_peak_rss_bytes": idle,
        },
        header + rows + tail,
    )


if __name__ == "__main__":
    main()
