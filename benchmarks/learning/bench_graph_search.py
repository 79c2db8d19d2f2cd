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

Run: `python benchmarks/learning/bench_graph_search.py [--sizes 20,50,100,200] [--quick] [--methods M,...]
[--peers-python PY]`; writes `results/graph_search.{json,md}`. With `--peers-python` (an
environment made by `python3 -m venv peers && peers/bin/pip install causal-hub pyagrum
"pandas<3"`), causal-hub's CTHC and CTPC and pyAgrum's CTPC run on the same data, side by side
(`_graph_search_peers.py`). `--peers ctbnrle-greedy` (no `--peers-python` needed) adds
CTBN-RLE's greedy `GraphEditSearch` (C++, its driver's `greedy` mode built as in `_ctbnrle.py`)
on the same data written as its CSV, with `CTBNFamScore(1, 1)` and in-degree <= 3 imposed by the
driver, under the same `--peer-timeout`.

`--memory` (with `--sizes`, `--methods`, `--name`): per N, the floor (a process holding JAX,
jaxctbn and the data alone) and each method's peak RSS under pi = 1/N in a cold process (every
program compiled) and a warm one (loaded from the persistent cache the cold one filled), the
latter also with the `jaxctbn` command's allocator setting (glibc's mmap threshold fixed);
`results/graph_search_memory.{json,md}` is `--memory --sizes 20,50,100 --methods
hill-climbing,hill-climbing-sparse,exhaustive --name graph_search_memory`.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/


def random_parents(N: int, max_in_degree: int = 2, seed: int = 0):
    """Each node's parents: a number drawn uniformly from 0..`max_in_degree`, then that many
    other nodes uniformly (cycles allowed)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return tuple(
        tuple(
            sorted(
                rng.choice(
                    [m for m in range(N) if m != n],
                    size=rng.integers(0, max_in_degree + 1),
                    replace=False,
                )
                .astype(int)
                .tolist()
            )
        )
        for n in range(N)
    )


def _network(N: int):
    import jaxctbn as jc

    parents = random_parents(N)
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


def _truth(N: int):
    import numpy as np

    parents, _ = _network(N)
    true = np.zeros((N, N), bool)
    for n, ps in enumerate(parents):
        true[list(ps), n] = True
    return true


def accuracy(true, learned, scores) -> dict:
    """SHD (missing + extra edges of the learned graph; no reversals: a CTBN graph may be
    cyclic) and the AUROC of `scores` (edge marginals, or the 0/1 graph of a peer) against the
    true edges, ties counted half."""
    import numpy as np

    N = true.shape[0]
    off = ~np.eye(N, dtype=bool)
    missing = int((true & ~learned).sum())
    extra = int((~true & learned & off).sum())
    pos, neg = scores[true & off], scores[~true & off]
    values = np.concatenate([pos, neg])
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(order))
    ranks[order] = np.arange(1, len(order) + 1)
    for v in np.unique(values):  # average ranks over ties
        tie = values == v
        ranks[tie] = ranks[tie].mean()
    auroc = (ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg))
    return {
        "missing": missing,
        "extra": extra,
        "shd": missing + extra,
        "auroc": float(auroc),
        "true_edges": int(true.sum()),
    }


#: candidate parents per node of `hill-climbing-sparse` (`HillClimbing(candidates=...)`)
CANDIDATES = 16


def _load(path: str):
    """The sampled trajectories at `path` (`sample`'s `.npz`) on the device."""
    import jax
    import numpy as np

    import jaxctbn as jc

    with np.load(path) as f:
        return jc.Trajectories(**{k: jax.numpy.asarray(f[k]) for k in f.files})


def floor(path: str) -> dict:
    """The memory floor of structure learning on the data at `path`: a process that imports
    JAX and jaxctbn and holds the trajectories on the device, and nothing else (its peak RSS is
    measured from outside)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    traj = jax.block_until_ready(_load(path))
    return {"data_bytes": int(sum(x.nbytes for x in jax.tree_util.tree_leaves(traj)))}


def worker(N: int, search: str, K: int, path: str, edge_prior: float | None) -> dict:
    import jax
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    if os.environ.get("JAXCTBN_CACHE_DIR"):  # --memory: the command line's persistent cache
        from jaxctbn._cli.jax_setup import _setup_jax, fix_malloc_mmap_threshold

        _setup_jax()
        if os.environ.get("BENCH_FIXED_MMAP_THRESHOLD"):  # the `jaxctbn` command's allocator
            fix_malloc_mmap_threshold()
    from _common import repeat_time

    import jaxctbn as jc

    traj = _load(path)
    R = traj.num_events.shape[0]
    names = [f"X{i}" for i in range(N)]
    choice = {
        "hill-climbing": jc.HillClimbing(swaps=False),
        "hill-climbing-sparse": jc.HillClimbing(swaps=False, candidates=CANDIDATES),
        # CTBN-RLE's family score (CTBNFamScore(1, 1)): beside its greedy search, the same score
        "hill-climbing-nodelman": jc.HillClimbing(swaps=False),
        "ctpc": jc.CTPC(),
        "exhaustive": jc.Exhaustive(),
    }[search]
    prior = jc.NodelmanPrior(1.0, 1.0) if search.endswith("nodelman") else jc.GammaPrior()
    pi = None if edge_prior is None else np.full((N, N), edge_prior)

    def learn():
        post = jc.learn_structure(
            traj,
            names,
            (2,) * N,
            max_parents=K,
            search=choice,
            prior=prior,
            knowledge=jc.PriorKnowledge(edge_prior=pi),
        )
        return post, np.asarray(post.edge_marginals()), post.map_graph()

    (post, edges, graph), timing = repeat_time(learn, repeats=2)  # compile + run, then run
    times = timing.times
    learned = np.zeros((N, N), bool)
    for n, ps in enumerate(graph):
        learned[list(ps), n] = True
    return {
        "nodes": N,
        "method": f"jaxctbn {search}" + ("" if edge_prior is None else f", pi = {edge_prior:.3g}"),
        "search": search,
        "edge_prior": edge_prior,
        "max_parents": K,
        "trajectories": int(R),
        "events": int(np.asarray(traj.num_events).sum()),
        "first_s": times[0],
        "second_s": times[1],
        "candidate_sets": int(sum(s.shape[0] for s in post.parent_sets)),
        **accuracy(_truth(N), learned, edges),
    }


def peer(name: str, python: str, N: int, K: int, data: str, timeout: float) -> dict:
    """One peer on the same data, in its own environment and process (`_graph_search_peers`);
    `ctbnrle-greedy` is CTBN-RLE's C++ driver instead (`_ctbnrle.py`, no `python` needed)."""
    import subprocess

    import numpy as np
    from _common import measure_process

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_graph_search_peers.py")
    record = {"nodes": N, "method": name, "max_parents": K}
    if name == "ctbnrle-greedy":
        # GraphEditSearch on CTBNFamScore(alpha, tau) with bench_structure_large's ALPHA =
        # TAU_PRIOR = 1; the library has no in-degree bound: the driver imposes K
        import types

        import _ctbnrle

        import jaxctbn as jc

        alpha, tau = 1.0, 1.0
        record["note"] = (
            f"CTBN-RLE GraphEditSearch, CTBNFamScore({alpha:g}, {tau:g}), in-degree <= {K} "
            "imposed by the driver"
        )
        driver = _ctbnrle.find_driver()
        if driver is None:
            return {**record, "error": [_ctbnrle.SKIP_MESSAGE]}
        csv = os.path.splitext(data)[0] + ".csv"
        model = types.SimpleNamespace(names=[f"X{n}" for n in range(N)], cardinalities=(2,) * N)
        try:
            with np.load(data) as f:
                _ctbnrle.write_long_csv(jc.Trajectories(**{k: f[k] for k in f.files}), csv, model)
            rec = _ctbnrle.learn(driver, csv, alpha, tau, K, timeout=timeout, search="greedy")
        except subprocess.TimeoutExpired:
            return {**record, "timeout_s": timeout}
        except (subprocess.CalledProcessError, RuntimeError, ValueError) as err:
            lines = (getattr(err, "stderr", None) or str(err)).strip().splitlines()
            return {**record, "error": lines[-1:]}
        learned = np.zeros((N, N), bool)
        for n, ps in enumerate(rec["parents"]):
            learned[list(ps), n] = True
        keys = ("read_s", "family_scores", "total_score", "user_s", "sys_s", "rss_source")
        return {
            **record,
            "first_s": rec["learn_s"],
            "process_s": rec["wall_s"],
            "peak_rss_bytes": rec["peak_rss_bytes"],
            "peer_output": {
                "alpha": alpha,
                "tau": tau,
                "max_in_degree": int(learned.sum(0).max()),
                **{k: rec[k] for k in keys if k in rec},
                "command": rec["command"],
            },
            **accuracy(_truth(N), learned, learned.astype(float)),
        }
    try:
        rec = measure_process([python, script, name, data, str(K)], timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**record, "timeout_s": timeout}
    except subprocess.CalledProcessError as err:
        lines = (err.stderr or "").strip().splitlines()
        reason = [ln.strip() for ln in lines if "Exception" in ln or "Error" in ln][-1:]
        return {**record, "error": reason or lines[-1:]}
    out = json.loads(rec["stdout"].strip().splitlines()[-1])
    learned = np.zeros((N, N), bool)
    for n, ps in enumerate(out["parents"]):
        learned[ps, n] = True
    return {
        **record,
        "first_s": out["learn_s"],
        "process_s": rec["wall_s"],
        "peak_rss_bytes": rec["peak_rss_bytes"],
        "peer_output": {k: v for k, v in out.items() if k not in ("parents", "learn_s")},
        **accuracy(_truth(N), learned, learned.astype(float)),
    }


def memory(sizes: list[int], methods: list[str], R: int, duration: float, quick: bool) -> list:
    """`--memory`: per N, the floor (`floor`) and, per method under the sparse edge prior, the
    peak RSS of a cold process (every program compiled, and stored in a fresh persistent cache)
    and of a warm one (the same programs loaded from that cache: the peak of the learning
    itself, without the compiler's)."""
    import shutil
    import tempfile

    from _common import measure_process

    work = tempfile.mkdtemp(prefix="jaxctbn-bench-graph-memory-")
    flag = ["--quick"] if quick else []
    records = []
    for N in sizes:
        data = os.path.join(work, f"paths_{N}.npz")
        measure_process([sys.executable, __file__, "--sample", str(N), data, *flag])
        # the floor's peak varies by ~10% between processes: the least of three (the ratios
        # below are then the least flattering)
        floors = [
            measure_process([sys.executable, __file__, "--floor", data, *flag]) for _ in "123"
        ]
        rec = min(floors, key=lambda r: r["peak_rss_bytes"])
        base = {"nodes": N, "floor_rss_bytes": rec["peak_rss_bytes"]}
        base["floor_rss_runs_bytes"] = [r["peak_rss_bytes"] for r in floors]
        base |= json.loads(rec["stdout"].strip().splitlines()[-1])
        for method in methods:
            K = 2 if method == "exhaustive" else 3
            cache = tempfile.mkdtemp(dir=work)
            cmd = [sys.executable, __file__, "--worker", str(N), method, str(K), data]
            cmd += [repr(1.0 / N), *flag]
            env = {**os.environ, "JAXCTBN_CACHE_DIR": cache}
            peaks, outs = [], []
            fixed = {**env, "BENCH_FIXED_MMAP_THRESHOLD": "1"}
            for run_env in (env, env, fixed):  # cold, warm, warm as the command line runs
                rec = measure_process(cmd, env=run_env)
                peaks.append(rec["peak_rss_bytes"])
                outs.append(json.loads(rec["stdout"].strip().splitlines()[-1]))
            shutil.rmtree(cache, ignore_errors=True)
            out = {
                **base,
                "method": outs[0]["method"],
                "max_parents": K,
                "cold_peak_rss_bytes": peaks[0],
                "warm_peak_rss_bytes": peaks[1],
                "warm_fixed_threshold_peak_rss_bytes": peaks[2],
                "warm_first_s": outs[1]["first_s"],
                "shd": outs[1]["shd"],
            }
            records.append(out)
            print(json.dumps(out), flush=True)
    return records


def memory_table(records: list, R: int, duration: float) -> list[str]:
    """The markdown lines of `--memory`."""
    lines = [
        "# Structure learning's peak memory against the floor",
        "",
        f"The data of `graph_search.md` ({R} trajectories of tau = {duration}), the sparse edge "
        "prior pi = 1/N. Floor: the peak RSS of a process that imports JAX and jaxctbn and "
        "holds the trajectories on the device (the issue's 'idle JAX process + the data "
        "arrays'; the least of three such processes). Cold: a whole process that compiles "
        "every program (and stores it in a fresh persistent cache) and learns twice; warm: the same process again, its programs "
        "loaded from that cache (the learning's own peak, without the compiler's), under "
        "glibc's default allocator settings and (fixed threshold) with the mmap threshold "
        "fixed at 128 KiB as the `jaxctbn` command sets it for its own process "
        "(`fix_malloc_mmap_threshold`: freed large blocks go back to the system). Peak RSS "
        "from GNU time.",
        "",
        "| N | method | K | data | floor | cold peak | warm peak | warm, fixed threshold | "
        "cold / floor | warm / floor | fixed threshold / floor | first call (warm) | SHD |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        f, c, w = r["floor_rss_bytes"], r["cold_peak_rss_bytes"], r["warm_peak_rss_bytes"]
        x = r["warm_fixed_threshold_peak_rss_bytes"]
        lines.append(
            f"| {r['nodes']} | {r['method']} | {r['max_parents']} | "
            f"{r['data_bytes'] / 2**20:.1f} MiB | {f / 2**20:.0f} MiB | {c / 2**20:.0f} MiB | "
            f"{w / 2**20:.0f} MiB | {x / 2**20:.0f} MiB | {c / f:.2f} | {w / f:.2f} | "
            f"{x / f:.2f} | {r['warm_first_s']:.2f} s | {r['shd']} |"
        )
    return lines


def table(records: list, R: int, duration: float) -> list[str]:
    """The markdown lines of the results."""
    lines = [
        "# Structure learning on large networks: jaxctbn's search and scoring beside the peers",
        "",
        f"Binary nodes, random graphs (0-2 parents per node), {R} trajectories of tau = "
        f"{duration}, the same data for every method. jaxctbn: Gamma(1, 1) rates prior; the "
        "structure prior uniform over the candidate sets, or a sparse edge prior pi = 1/N; "
        "hill climbing: additions and removals (`HillClimbing(swaps=False)`), then the exact "
        "posterior over each node's pool of 6 parents; hill-climbing-sparse: the same among "
        f"each node's {CANDIDATES} best single parents (`candidates={CANDIDATES}`); "
        "hill-climbing-nodelman: hill climbing on CTBN-RLE's family score "
        "(`NodelmanPrior(1, 1)`, CTBNFamScore(1, 1)); ctpc: `CTPC()` (tests at level 0.1, "
        "conditioning sets up to 2), then the exact posterior over each node's 8 strongest "
        "survivors. Times: the first call (with "
        "compilation) and a second call; peak RSS of the whole process. Peers (in their own "
        "environment, `_graph_search_peers.py`; K = 3 where they take it): causal-hub 0.0.4's "
        "CTHC and CTPC (its only route is structural EM on evidence, one path per jump, each "
        "passed 2^N times to undo the 2^-N weight its E-step gives every path: it fits only up "
        "to N ~ 8, above which it is refused with the reason), pyAgrum's CTPC (the "
        "trajectories passed as one, end to end: its tests divide their statistics by the "
        "number of trajectories, so with 50 it finds no edge); their time is the learning call "
        "alone. AUROC of a peer: of its 0/1 graph.",
        "",
        "| N | method | K | candidate sets | first call | second call | "
        "SHD (missing + extra) | AUROC | peak RSS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if "shd" not in r:
            why = (
                f"timed out ({r['timeout_s']:.0f} s)"
                if "timeout_s" in r
                else "not run (--peer-max-nodes)"
                if r.get("skipped")
                else "failed: " + " ".join(r.get("error", []))
            )
            lines.append(f"| {r['nodes']} | {r['method']} | {r['max_parents']} | | {why} | | | | |")
            continue
        second = f"{r['second_s']:.2f} s" if "second_s" in r else ""
        sets = f"{r['candidate_sets']:,}" if "candidate_sets" in r else ""
        method = r["method"] + (f" ({r['note']})" if "note" in r else "")
        lines.append(
            f"| {r['nodes']} | {method} | {r['max_parents']} | {sets} | "
            f"{r['first_s']:.2f} s | {second} | {r['shd']} ({r['missing']} + {r['extra']}) | "
            f"{r['auroc']:.3f} | {r['peak_rss_bytes'] / 2**20:.0f} MiB |"
        )
    return lines


def main():
    from _common import argument_parser, environment, measure_process, write_results

    ap = argument_parser(__doc__)
    ap.add_argument("--sizes", default="20,50,100,200")
    ap.add_argument("--exhaustive-up-to", type=int, default=100, help="largest N for K = 2")
    ap.add_common(quick=True)
    ap.add_argument(
        "--methods",
        default="hill-climbing,ctpc,exhaustive",
        help="jaxctbn's methods, comma-separated: hill-climbing, hill-climbing-sparse (the "
        f"sparse candidates, {CANDIDATES} per node), hill-climbing-nodelman (CTBN-RLE's family "
        "score NodelmanPrior(1, 1)), ctpc, exhaustive (K = 2, up to "
        "--exhaustive-up-to nodes)",
    )
    ap.add_common(name="graph_search")
    ap.add_argument(
        "--peers-python",
        default=None,
        help="the python of an environment with causal-hub, pyAgrum and pandas < 3 (the peers "
        "run there, side by side, on the same data); without it, jaxctbn alone",
    )
    ap.add_argument("--peers", default="causal-hub-cthc,causal-hub-ctpc,pyagrum-ctpc")
    ap.add_argument("--peer-timeout", type=float, default=600.0, help="seconds per peer run")
    ap.add_argument(
        "--peer-max-nodes",
        default="pyagrum-ctpc=20",
        help="PEER=N,...: the largest network a peer is run on (pyAgrum's CTPC: 68 s at "
        "N = 20, 922 s at N = 50)",
    )
    ap.add_argument("--worker", nargs=5, metavar=("N", "SEARCH", "K", "DATA", "EDGE_PRIOR"))
    ap.add_argument("--sample", nargs=2, metavar=("N", "DATA"))
    ap.add_argument("--floor", metavar="DATA")
    ap.add_argument(
        "--memory",
        action="store_true",
        help="peak RSS against the floor (cold and warm cache) instead of the search table, for "
        "--sizes and --methods under pi = 1/N; writes results/<--name>.{json,md}",
    )
    args = ap.parse_args()
    R, duration = (20, 2.0) if args.quick else (50, 3.0)
    if args.sample:
        sample(int(args.sample[0]), R, duration, args.sample[1])
        return
    if args.floor:
        print(json.dumps(floor(args.floor)))
        return
    if args.memory:
        sizes = [int(x) for x in args.sizes.split(",")]
        methods = args.methods.split(",")
        records = memory(sizes, methods, R, duration, args.quick)
        lines = memory_table(records, R, duration)
        write_results(args.name, {"environment": environment(), "records": records}, lines)
        return
    if args.worker:
        N, search, K, data, pi = args.worker
        edge_prior = None if pi == "none" else float(pi)
        print(json.dumps(worker(int(N), search, int(K), data, edge_prior)))
        return
    import tempfile

    work = tempfile.mkdtemp(prefix="jaxctbn-bench-graph-search-")
    records = []
    for N in (int(x) for x in args.sizes.split(",")):
        data = os.path.join(work, f"paths_{N}.npz")
        cmd = [sys.executable, __file__, "--sample", str(N), data]
        measure_process(cmd + (["--quick"] if args.quick else []))
        # hill climbing under the uniform structure prior and under a sparse edge prior
        # (pi = 1 / N: one expected parent per node), exhaustive scoring where it fits
        runs = []
        for method in args.methods.split(","):
            if method == "exhaustive" and N > args.exhaustive_up_to:
                continue
            K = 2 if method == "exhaustive" else 3
            runs += [(method, K, "none"), (method, K, repr(1.0 / N))]
        for search, K, pi in runs:
            cmd = [sys.executable, __file__, "--worker", str(N), search, str(K), data, pi]
            cmd += ["--quick"] if args.quick else []
            rec = measure_process(cmd)
            out = json.loads(rec["stdout"].strip().splitlines()[-1])
            out["peak_rss_bytes"] = rec["peak_rss_bytes"]
            out["process_s"] = rec["wall_s"]
            records.append(out)
            print(json.dumps(out), flush=True)
        # the Python peers run with --peers-python only; CTBN-RLE's driver needs none
        names = [p for p in args.peers.split(",") if args.peers_python or p == "ctbnrle-greedy"]
        if names:
            limits = dict(item.split("=") for item in args.peer_max_nodes.split(",") if item)
            for name in names:
                if N > int(limits.get(name, N)):
                    out = {"nodes": N, "method": name, "max_parents": 3, "skipped": True}
                    records.append(out)
                    continue
                out = peer(name, args.peers_python, N, 3, data, args.peer_timeout)
                records.append(out)
                print(json.dumps(out), flush=True)
    lines = table(records, R, duration)
    write_results(args.name, {"environment": environment(), "records": records}, lines)


if __name__ == "__main__":
    main()
