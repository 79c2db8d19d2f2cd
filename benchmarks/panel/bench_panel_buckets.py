"""Peak memory and wall time of structure learning from panels whose subjects have very unequal
numbers of visits: trajectories grouped by length (`jaxctbn.panel.PanelBuckets`, what `jaxctbn
learn --observation panel` reads) against one batch padded to the longest subject (the route
before issue 35), in the same run, each in its own process.

Data (seed 0): two binary nodes seen at gaps uniform in [0.2, 1]; one subject with L visits
among S subjects with ten (the issue's case: L = 50,000, S = 5,000, 100,000 rows). Each
process reads the CSV with `jaxctbn.panel.PanelObservations.read_csv` (or `PanelBuckets.read_csv`) and runs
`learn_structure_from_panels(max_parents=1, max_iterations=3)`; peak RSS by GNU `time -v`. The
padded route runs under a virtual-memory limit (`--padded-limit-gib`, default 12 GiB) and is
reported as failed when it needs more.

Run: `python benchmarks/panel/bench_panel_buckets.py`; writes `results/panel_buckets.{json,md}`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import ROOT, argument_parser, environment, measure_process, write_results  # noqa: E402

CHILD = """
import sys, time, jax
jax.config.update("jax_enable_x64", True)
import jaxctbn as jc
t0 = time.perf_counter()
reader = jc.panel.PanelBuckets if sys.argv[2] == "1" else jc.panel.PanelObservations
obs, ids = reader.read_csv(sys.argv[1], {"A": 2, "B": 2})
fit = jc.panel.learn_structure_from_panels(
    obs, ["A", "B"], [2, 2], max_parents=1, max_iterations=3
)
print("RESULT", time.perf_counter() - t0, float(fit.log_likelihood))
"""


def write_data(path, long_visits, short_subjects, seed=0):
    rng = np.random.default_rng(seed)
    frames = []
    for tid, m in enumerate([long_visits] + [10] * short_subjects):
        frames.append(
            pd.DataFrame(
                {
                    "trajectory_id": tid,
                    "time": np.cumsum(rng.uniform(0.2, 1.0, m)),
                    "A": rng.integers(0, 2, m),
                    "B": rng.integers(0, 2, m),
                }
            )
        )
    pd.concat(frames).to_csv(path, index=False)


def run(path, bucketed, limit_gib=None):
    cmd = [sys.executable, "-c", CHILD, path, "1" if bucketed else "0"]
    if limit_gib is not None:
        limit = int(limit_gib * 2**30 / 1024)
        cmd = ["bash", "-c", f'ulimit -v {limit} && exec "$@"', "bash", *cmd]
    env_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = ROOT + (os.pathsep + env_path if env_path else "")
    try:
        out = measure_process(cmd, timeout=1800)
    except subprocess.CalledProcessError as e:
        tail = (e.stderr or "").strip().splitlines()[-1:] or ["?"]
        return {"failed": tail[0][:200]}
    finally:
        if env_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = env_path
    line = [x for x in out["stdout"].splitlines() if x.startswith("RESULT")][-1].split()
    return {
        "wall_s": out["wall_s"],
        "learn_s": float(line[1]),
        "log_likelihood": float(line[2]),
        "peak_rss_mib": out["peak_rss_bytes"] / 2**20,
    }


def main():
    parser = argument_parser(__doc__)
    parser.add_argument("--padded-limit-gib", type=float, default=12.0)
    args = parser.parse_args()
    cases = [(2_000, 500), (10_000, 1_000), (50_000, 5_000)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for long_visits, short_subjects in cases:
            path = os.path.join(tmp, f"panel_{long_visits}.csv")
            write_data(path, long_visits, short_subjects)
            bucketed = run(path, True)
            padded = run(path, False, args.padded_limit_gib)
            rows.append(
                {
                    "long_visits": long_visits,
                    "short_subjects": short_subjects,
                    "rows": long_visits + 10 * short_subjects,
                    "padded_cells": (1 + short_subjects) * long_visits,
                    "bucketed": bucketed,
                    "padded": padded,
                }
            )
            print(rows[-1], flush=True)
    table = [
        "# Panel subjects of very unequal lengths: buckets against one padded batch",
        "",
        "One subject with L visits among S with ten (two binary nodes); "
        "`learn_structure_from_panels(max_parents=1, max_iterations=3)` after "
        "`PanelObservations.read_csv`/`PanelBuckets.read_csv`, each route in its own process; peak RSS by GNU `time -v`; the padded "
        f"route under a {args.padded_limit_gib:g} GiB virtual-memory limit.",
        "",
        "| L | S | rows | padded cells | buckets: peak RSS | buckets: time | padded: peak RSS "
        "| padded: time | same log-likelihood |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for r in rows:
        b, p = r["bucketed"], r["padded"]
        same = (
            "–"
            if "failed" in p or "failed" in b
            else (
                "yes"
                if abs(b["log_likelihood"] - p["log_likelihood"]) <= 1e-8 * abs(p["log_likelihood"])
                else "NO"
            )
        )
        cell = lambda d, k, f: "failed" if "failed" in d else f.format(d[k])  # noqa: E731
        table.append(
            f"| {r['long_visits']:,} | {r['short_subjects']:,} | {r['rows']:,} | "
            f"{r['padded_cells']:,} | {cell(b, 'peak_rss_mib', '{:.0f} MiB')} | "
            f"{cell(b, 'wall_s', '{:.1f} s')} | {cell(p, 'peak_rss_mib', '{:.0f} MiB')} | "
            f"{cell(p, 'wall_s', '{:.1f} s')} | {same} |"
        )
    write_results(
        "panel_buckets",
        {"environment": environment(), "padded_limit_gib": args.padded_limit_gib, "rows": rows},
        table,
    )


if __name__ == "__main__":
    main()
