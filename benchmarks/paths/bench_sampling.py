"""Gillespie sampling throughput (events/s): jitted + vmapped jaxctbn vs a numpy per-path loop,
and side by side with CTBN-RLE's sampler (C++, an external program; `_ctbnrle.py`).

Networks: the paper's 4-node fast/slow network and a random 8-node binary network (in-degree
<= 2), tau = 3, random initial states. The numpy baseline is the textbook algorithm (per-node
rate lookup from the CIMs, exponential waiting time, categorical choice) in a Python loop. The
first table's jitted function returns only the jump counts, so XLA drops the event buffers from
the loop: it times the Gillespie steps alone.

Peer workload (issue 14): the 8-node network, 20,000 paths, tau = 3, max_events 256, initial
states uniform per node (CTBN-RLE draws them itself from a uniform initial distribution).
- in-process: jaxctbn's jitted `sample_trajectories` returning the whole `Trajectories` (event
  buffers included), best of 3 after compilation, against the driver's `samplebench`
  (`Markov::Sample` of all paths, timed inside the driver). The driver's start-up and IO are
  its whole-process time minus that in-process time, reported separately.
- whole process: `jaxctbn sample ... --max-events 256 --out X.csv` (a fresh process with a warm
  persistent compilation cache; the cold first call is reported too) against `ctbnrle_driver
  sample SPEC 20000 3 SEED X.csv`, and where `jaxctbn sample`'s time goes (import, loading
  the network and drawing initial states, sampling incl. loading the compiled program from the
  cache, writing the CSV), timed in a separate process that makes the same calls.
Without the driver (`_ctbnrle.find_driver()`) the peer columns are skipped with a note.

Run: `python benchmarks/paths/bench_sampling.py [--quick] [--no-peer]`; writes
`results/sampling.{json,md}`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
import _ctbnrle  # noqa: E402
from _common import (  # noqa: E402
    argument_parser,
    compile_time,
    environment,
    fmt,
    repeat_time,
    stopwatch,
    timeit,
    write_results,
)

TAU = 3.0
PEER_MAX_EVENTS = 256
PEER_SEED = 0

# `jaxctbn sample`'s steps (`jaxctbn._cli.sample._cmd_sample`), timed one by one in a fresh process
_CLI_PHASES = """
import json, sys, time
t0 = time.perf_counter()
from jaxctbn._cli import jax_setup as _cli
_cli._setup_jax()
import jax, jax.numpy as jnp, numpy as np
import jaxctbn as jc
from jaxctbn._paths.sampling import sample_within_cap
t1 = time.perf_counter()
network, R, tau, seed, max_events, out = sys.argv[1:7]
R, tau, seed, max_events = int(R), float(tau), int(seed), int(max_events)
model = jc.CTBN.from_json(network)
key_init, key_paths = jax.random.split(jax.random.key(seed))
initial = jnp.stack([jax.random.randint(k, (R,), 0, c) for k, c in
                     zip(jax.random.split(key_init, model.num_nodes), model.cardinalities)],
                    axis=1).astype(jnp.int32)
initial.block_until_ready()
t2 = time.perf_counter()
traj = sample_within_cap(model, initial, tau, key=key_paths, num_trajectories=R,
                         max_events=max_events, name="--max-events")
jax.block_until_ready(traj)
t3 = time.perf_counter()
traj.write_csv(out, model)
t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "setup_s": t2 - t1, "sample_s": t3 - t2,
                  "write_s": t4 - t3, "events": int(np.asarray(traj.num_events).sum())}))
"""


def _jaxctbn_cli() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "jaxctbn")
    return (
        [exe]
        if os.access(exe, os.X_OK)
        else [sys.executable, "-c", "import jaxctbn._cli as c; c.main()"]
    )


def peer_comparison(model, R, driver, notes):
    """jaxctbn against CTBN-RLE on the peer workload (module docstring); `driver` may be None."""
    key = jax.random.key(3)
    inits = jax.random.randint(key, (R, model.num_nodes), 0, 2).astype(jnp.int32)

    def run(key, inits):
        return jc.sample_trajectories(
            model, inits, TAU, key=key, num_trajectories=R, max_events=PEER_MAX_EVENTS
        )

    ctime, compiled = compile_time(jax.jit(run), key, inits)
    traj = compiled(key, inits)
    assert not bool(traj.truncated.any())
    events = int(traj.num_events.sum())
    t_jax = timeit(compiled, key, inits, repeat=3, min_time=0.2)
    rec = {
        "network": "random 8-node",
        "trajectories": R,
        "max_events": PEER_MAX_EVENTS,
        "jax_events": events,
        "jax_compile_s": ctime,
        "jax_s": t_jax,
        "jax_events_per_s": events / t_jax,
    }
    work = tempfile.mkdtemp(prefix="jaxctbn-bench-sampling-")
    try:
        network = os.path.join(work, "net.json")
        model.to_json(network)
        env = dict(os.environ, JAXCTBN_CACHE_DIR=os.path.join(work, "cache"))
        out = os.path.join(work, "jaxctbn.csv")
        argv = [*_jaxctbn_cli(), "sample", "--network", network, "--trajectories", str(R)]
        argv += ["--duration", repr(TAU), "--seed", str(PEER_SEED)]
        argv += ["--max-events", str(PEER_MAX_EVENTS), "--out", out]
        # cold (empty cache), then warm twice
        proc, runs = repeat_time(
            lambda: subprocess.run(argv, env=env, capture_output=True, text=True, check=True),
            repeats=3,
        )
        rec["cli_cold_s"] = runs.times[0]
        rec["cli_warm_s"] = min(runs.times[1:])
        rec["cli_output"] = proc.stdout.strip()
        rec["cli_csv_bytes"] = os.path.getsize(out)
        # twice: the CLI's cache entry did not serve this script's first call (it compiled), the
        # second loads its own entry from the cache as the CLI does
        for _ in range(2):
            phases = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    _CLI_PHASES,
                    network,
                    str(R),
                    repr(TAU),
                    str(PEER_SEED),
                    str(PEER_MAX_EVENTS),
                    out,
                ],
                env=env,
                cwd=work,  # import jaxctbn as the CLI does (not from a checkout in the cwd)
                capture_output=True,
                text=True,
                check=True,
            )
        rec["cli_phases"] = json.loads(phases.stdout.strip().splitlines()[-1])
        if driver is not None:
            spec = os.path.join(work, "net.spec")
            _ctbnrle.write_spec(model, spec)
            bench = [_ctbnrle.sample(driver, spec, R, TAU, PEER_SEED + i) for i in range(3)]
            best = min(bench, key=lambda b: b["sample_s"])
            # start-up (and reading the spec): the whole process minus the timed sampling
            startup = min(b["wall_s"] - b["sample_s"] for b in bench)
            peer_out = os.path.join(work, "ctbnrle.csv")
            whole = [_ctbnrle.sample(driver, spec, R, TAU, PEER_SEED, peer_out) for _ in range(2)]
            w = min(whole, key=lambda b: b["wall_s"])
            rec.update(
                ctbnrle_events=best["events"],
                ctbnrle_sample_s=best["sample_s"],
                ctbnrle_events_per_s=best["events_per_s"],
                ctbnrle_startup_s=startup,
                ctbnrle_samplebench_wall_s=best["wall_s"],
                ctbnrle_cli_s=w["wall_s"],
                ctbnrle_cli_write_s=w["write_s"],
                ctbnrle_csv_bytes=os.path.getsize(peer_out),
                ctbnrle_command=" ".join(w["command"]).replace(work + "/", ""),
                in_process_ratio=rec["jax_events_per_s"] / best["events_per_s"],
                cli_ratio=rec["cli_warm_s"] / w["wall_s"],
            )
        else:
            notes.append(_ctbnrle.SKIP_MESSAGE)
        rec["jaxctbn_command"] = " ".join(argv[len(_jaxctbn_cli()) :]).replace(work + "/", "")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rec


def peer_lines(rec) -> list[str]:
    has = "ctbnrle_events_per_s" in rec
    na = "–"
    ph = rec["cli_phases"]
    return [
        "",
        f"## Side by side with CTBN-RLE ({rec['network']}, {rec['trajectories']} paths, "
        f"tau = {TAU:g}, max_events {rec['max_events']})",
        "",
        "| | jaxctbn | CTBN-RLE | jaxctbn / CTBN-RLE |",
        "|---|---|---|---|",
        f"| events (all paths) | {rec['jax_events']} | {rec['ctbnrle_events'] if has else na} | |",
        f"| in-process sampling | {fmt(rec['jax_s'])} | "
        f"{fmt(rec['ctbnrle_sample_s']) if has else na} | |",
        f"| in-process events/s | {rec['jax_events_per_s'] / 1e6:.2f} M | "
        + (
            f"{rec['ctbnrle_events_per_s'] / 1e6:.2f} M | {rec['in_process_ratio']:.2f}× faster |"
            if has
            else f"{na} | |"
        ),
        f"| process start-up (+ reading the network) | {fmt(ph['import_s'] + ph['setup_s'])} | "
        f"{fmt(rec['ctbnrle_startup_s']) if has else na} | |",
        f"| whole process, writing the CSV | {fmt(rec['cli_warm_s'])} (cold cache "
        f"{fmt(rec['cli_cold_s'])}) | {fmt(rec['ctbnrle_cli_s']) if has else na} | "
        + (f"{rec['cli_ratio']:.2f}× the time |" if has else "|"),
        "",
        f"`jaxctbn sample` ({rec['jaxctbn_command']}), step by step in a fresh process with a "
        f"warm cache: import {fmt(ph['import_s'])}, network + initial states "
        f"{fmt(ph['setup_s'])}, sampling (incl. loading the compiled program) "
        f"{fmt(ph['sample_s'])}, writing the CSV {fmt(ph['write_s'])}"
        + (f"; CTBN-RLE writes its CSV in {fmt(rec['ctbnrle_cli_write_s'])}." if has else "."),
        f"jaxctbn in-process: jitted `sample_trajectories` returning all trajectories, compile "
        f"{fmt(rec['jax_compile_s'])}, best of 3.",
    ]


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
    ap = argument_parser(__doc__, quick=True, name="sampling")
    ap.add_argument("--no-peer", action="store_true", help="skip the CTBN-RLE comparison")
    args = ap.parse_args()
    R = 2000 if args.quick else 20000
    R_np = 100 if args.quick else 500
    nets = {
        "paper 4-node": jc.paper_network(jax.random.key(0)),
        "random 8-node": jc.random_ctbn(
            jax.random.key(1),
            jc.experiments.random_graph(jax.random.key(2), 8, max_parents=2),
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
        with stopwatch() as sw:
            ev_np = numpy_gillespie(model, np.asarray(inits[:R_np]), TAU, rng)
        t_np = sw.seconds
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
    notes, peer = [], None
    if not args.no_peer:
        peer = peer_comparison(nets["random 8-node"], R, _ctbnrle.find_driver(), notes)
    header = [
        f"# Gillespie sampling throughput (tau = 3, float64, {jax.default_backend()})",
        "",
        f"Machine: {environment()['device']}, {environment()['cpu_count']} cores (load average "
        f"{os.getloadavg()[0]:.1f} at the end: compare numbers within one run). "
        "numpy baseline: per-path Python loop, same algorithm. The first table's programs "
        "return only the jump counts (XLA drops the event buffers).",
        "",
        "| network | trajectories | events/path | compile | run | jax events/s | "
        "numpy events/s | speedup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    write_results(
        args.name + ("_quick" if args.quick else ""),
        {
            "environment": environment(),
            "load_average": os.getloadavg()[0],
            "tau": TAU,
            "records": records,
            "peer": peer,
            "notes": notes,
        },
        header + rows + ([] if peer is None else peer_lines(peer)) + ["", *notes],
    )


if __name__ == "__main__":
    main()
