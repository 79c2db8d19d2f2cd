"""Whole-process wall time of the `jaxctbn` CLI on a small file, with and without JAX's
persistent compilation cache (`JAXCTBN_CACHE_DIR`).

Data: the paper's 4-node network (`jaxctbn.paper_network`, key 0), 30 trajectories of tau = 3
written by `jaxctbn sample`. Each command runs as a fresh `python -m jaxctbn._cli` process
(this checkout on PYTHONPATH, its modules byte-compiled first, as `pip install` leaves them):
cold = first call with a fresh, empty cache directory; warm = the next `--runs` calls with that
directory (median); new data = the first call on each of `--runs` other data sets of the same
design (seeds 1, 2, ...), the cache warm from the first (what a user's next file meets;
median); no cache = `JAXCTBN_CACHE_DIR=off` (mean of `--repeat` calls). Child CPU time (user +
sys) is recorded too: on a shared machine it varies less than wall time. Also `python -c
"import jaxctbn"` against `python -c "import jax"`, and `jaxctbn --help`. The targets of the
first-answer issue are in the table beside the medians.

Run: `python benchmarks/cli/bench_cli.py [--runs 5] [--repeat 2]`; writes
`results/cli.{json,md}`.
"""

from __future__ import annotations

import compileall
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

import jax

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import ROOT, argument_parser, environment, stopwatch, write_results  # noqa: E402

INITIAL = ["--initial-state", "X1=0,X2=0,X3=0,X4=0"]


def commands(net, data):
    """The timed commands on the network `net` and the path file `data`."""
    common = ["--duration", "3", *INITIAL, "--seed", "0"]
    return {
        "learn": ["learn", "--data", data],
        "moments": ["moments", "--network", net, "--duration", "3", *INITIAL],
        "design --target parameters": [
            "design",
            "--target",
            "parameters",
            "--network",
            net,
            "--data",
            data,
            *common,
        ],
        "design --target structure": ["design", "--target", "structure", "--data", data, *common],
    }


def run(argv, cache):
    """Wall and child CPU seconds of one process; `cache` is the JAXCTBN_CACHE_DIR value."""
    env = dict(os.environ, PYTHONPATH=ROOT, JAXCTBN_CACHE_DIR=cache)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with stopwatch() as sw:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = sw.seconds
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} failed:\n{proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def cli(args, out, cache):
    return run([sys.executable, "-m", "jaxctbn._cli", *args, "--out", out], cache)


def mean(xs):
    return sum(xs) / len(xs)


median = statistics.median

#: the first-answer issue's targets for a warm cache on a new file
TARGETS = {"learn": "≤ 1.0 s", "design --target parameters": "≤ 1.5 s",
           "design --target structure": "≤ 1.5 s"}  # fmt: skip


def main():
    ap = argument_parser(__doc__)
    ap.add_argument("--repeat", type=int, default=2, help="no-cache calls per command")
    ap.add_argument(
        "--runs", type=int, default=5, help="warm calls, and new data sets, per command"
    )
    ap.add_common(name="cli")
    args = ap.parse_args()
    # what `pip install` leaves: compiled modules (where PYTHONDONTWRITEBYTECODE is set, each
    # process would otherwise compile jaxctbn's sources again, ~0.1-0.2 s of a call)
    compileall.compile_dir(os.path.join(ROOT, "jaxctbn"), quiet=1)
    work = tempfile.mkdtemp(prefix="jaxctbn-bench-cli-")
    net, data = os.path.join(work, "net.json"), os.path.join(work, "data.csv")
    with open(net, "w") as f:
        json.dump(jc.paper_network(jax.random.key(0)).to_dict(), f)
    sample = ["sample", "--network", net, "--trajectories", "30", "--duration", "3"]
    cli([*sample, "--seed", "0"], data, "off")
    # new data sets of the same design (other seeds): what a user's next files are
    new_files = [os.path.join(work, f"new_data_{i}.csv") for i in range(1, args.runs + 1)]
    for seed, path in enumerate(new_files, start=1):
        cli([*sample, "--seed", str(seed)], path, "off")

    imports = {}
    for label, argv in (
        ('python -c "import jax"', [sys.executable, "-c", "import jax"]),
        ('python -c "import jaxctbn"', [sys.executable, "-c", "import jaxctbn"]),
        ("jaxctbn --help", [sys.executable, "-m", "jaxctbn._cli", "--help"]),
    ):
        times = [run(argv, "off") for _ in range(3)]
        imports[label] = {"wall_s": min(t[0] for t in times), "cpu_s": min(t[1] for t in times)}
        print(label, imports[label], flush=True)

    records = []
    for label, argv in commands(net, data).items():
        out = os.path.join(work, "out.json")
        cache = tempfile.mkdtemp(prefix="cache-", dir=work)  # fresh and empty
        cold = cli(argv, out, cache)
        warm = [cli(argv, out, cache) for _ in range(args.runs)]
        # the first call on each new data set, the cache warm from the first
        new = (
            [cli([path if a == data else a for a in argv], out, cache) for path in new_files]
            if data in argv
            else None
        )
        entries = len(os.listdir(cache))
        off = [cli(argv, out, "off") for _ in range(args.repeat)]
        rec = {
            "command": f"jaxctbn {label}",
            "argv": argv,
            "cold_s": cold[0],
            "warm_s": [w[0] for w in warm],
            "no_cache_s": [o[0] for o in off],
            "cold_cpu_s": cold[1],
            "warm_cpu_s": [w[1] for w in warm],
            "no_cache_cpu_s": [o[1] for o in off],
            "cache_entries": entries,
            "new_data_s": None if new is None else [n[0] for n in new],
            "new_data_cpu_s": None if new is None else [n[1] for n in new],
        }
        rec["warm_over_cold"] = median(rec["warm_s"]) / rec["cold_s"]
        rec["warm_over_cold_cpu"] = median(rec["warm_cpu_s"]) / rec["cold_cpu_s"]
        records.append(rec)
        print(json.dumps({k: v for k, v in rec.items() if k != "argv"}), flush=True)

    env = environment()
    env["loadavg_1_5_15"] = os.getloadavg()

    def new_data(r, key):
        return "—" if r[key] is None else f"{median(r[key]):.2f}"

    def target(r):
        return TARGETS.get(r["command"].removeprefix("jaxctbn "), "—")

    rows = [
        f"| `{r['command']}` | {r['cold_s']:.2f} | {median(r['warm_s']):.2f} | "
        f"{new_data(r, 'new_data_s')} | {target(r)} | {r['warm_over_cold']:.0%} | "
        f"{mean(r['no_cache_s']):.2f} |"
        for r in records
    ]
    cpu_rows = [
        f"| `{r['command']}` | {r['cold_cpu_s']:.2f} | {median(r['warm_cpu_s']):.2f} | "
        f"{new_data(r, 'new_data_cpu_s')} | {r['warm_over_cold_cpu']:.0%} | "
        f"{mean(r['no_cache_cpu_s']):.2f} |"
        for r in records
    ]
    table = [
        "# CLI start-up: whole-process time on a small file",
        "",
        f"Machine: {env['device']}, {env['cpu_count']} cores (shared; load average "
        f"{env['loadavg_1_5_15'][0]:.1f} at the end), jax {env['jax']}. Data: paper 4-node "
        "network, 30 trajectories, tau = 3. Cold: first call with an empty cache directory; "
        f"warm: median of the next {args.runs} calls; new data: median of the first calls on "
        f"{args.runs} other data sets of the same design (other seeds), the cache warm from the "
        "first; no cache: `JAXCTBN_CACHE_DIR=off`, "
        f"mean of {args.repeat} calls. Modules byte-compiled, as an installed package's are.",
        "",
        "| command | cold s | warm s | new data, warm s | target (new data) | warm/cold | "
        "no-cache s |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Child CPU time (user + sys), the same runs:",
        "",
        "| command | cold CPU s | warm CPU s | new data, warm CPU s | warm/cold | no-cache CPU s |",
        "|---|---|---|---|---|---|",
        *cpu_rows,
        "",
        "| import | wall s | CPU s |",
        "|---|---|---|",
        *(f"| `{k}` | {v['wall_s']:.2f} | {v['cpu_s']:.2f} |" for k, v in imports.items()),
    ]
    write_results(args.name, {"environment": env, "imports": imports, "records": records}, table)


if __name__ == "__main__":
    main()
