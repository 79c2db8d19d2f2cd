"""The first `jaxctbn fit` of a data set as a whole process, against R msm's whole `Rscript` run
of the same analysis, on msm's cav and psor panels and on a new data set of each kind.

What a user waits for: start-up, reading the CSV, the fit and its 95% intervals, writing the
result. msm: `Rscript` running `library(msm)`, `read.csv`, `msm(...)` with its defaults (BFGS,
the Hessian for the intervals; cav with `deathexact = 4`) and `qmatrix.msm` (intensities with
delta-method intervals), the shortest of `--repeat` runs. jaxctbn: `jaxctbn fit --observation
panel` (default method SQUAREM and `rate_uncertainty`), as a fresh process, with the persistent
compilation cache (`JAXCTBN_CACHE_DIR`) in four states:

- **cold**: a fresh, empty cache (the very first fit on a machine);
- **same data**: the second call on the same file;
- **new data set**: the first fit of a *different* data set of the same kind, with the cache
  left by the other one: the subjects resampled with replacement (seed 1, 95% as many) and each
  subject's visit times scaled by a factor in [0.9, 1.1], so the visit times, gaps and lengths
  all differ. The fit rounds its shapes up (`PanelBuckets.with_rounded_shapes`, the number of
  distinct gaps likewise), so such a data set finds its compiled programs in the cache when its
  sizes fall in the same classes; `cache entries written` says whether it did (0: all found).

Run: `python benchmarks/cli/bench_first_fit.py [--repeat 3]` (needs `Rscript` with msm: `apt-get
install r-cran-msm`); writes `results/first_fit.{json,md}`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import MSM_DIR, ROOT, argument_parser, environment, measure_process, write_results  # noqa: E402

DATA_DIR = os.path.join(MSM_DIR, "data")

CASES = {
    # name: (subject, time, state columns, initial Q (msm's examples), exact-entry state (1-based))
    "psor": (
        ("ptnum", "months", "state"),
        [[0, 0.1, 0, 0], [0, 0, 0.1, 0], [0, 0, 0, 0.1], [0, 0, 0, 0]],
        None,
    ),
    "cav": (
        ("PTNUM", "years", "state"),
        [[0, 0.148, 0, 0.0171], [0.2128, 0, 0.2127, 0.0171], [0, 0.1, 0, 0.2], [0, 0, 0, 0]],
        4,
    ),
}

R_SCRIPT = """suppressPackageStartupMessages(library(msm))
d <- read.csv("{csv}")
Q <- matrix(c({q}), nrow = 4, byrow = TRUE)
m <- msm({state} ~ {time}, subject = {subject}, data = d, qmatrix = Q{exact})
print(qmatrix.msm(m))
"""


def network(q0) -> dict:
    q = np.asarray(q0, float)
    np.fill_diagonal(q, -q.sum(1))
    return {
        "nodes": [{"name": "S", "cardinality": 4, "parents": []}],
        "cims": {"S": [{"Q": q.tolist(), "parent_states": {}}]},
    }


def new_data_set(d: pd.DataFrame, subject: str, time: str, seed: int = 1) -> pd.DataFrame:
    """The subjects resampled with replacement (95% as many), each one's times scaled."""
    rng = np.random.default_rng(seed)
    ids = d[subject].unique()
    parts = []
    for j, i in enumerate(rng.choice(ids, size=int(0.95 * len(ids)), replace=True)):
        part = d[d[subject] == i].copy()
        part[subject] = j + 1
        part[time] = part[time] * rng.uniform(0.9, 1.1)
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def msm_run(script: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        times.append(measure_process(["Rscript", script])["wall_s"])
    return min(times)


def jaxctbn_run(net: str, csv: str, exact: int | None, cache: str, out: str) -> dict:
    argv = [sys.executable, "-m", "jaxctbn._cli", "fit", "--network", net, "--data", csv]
    argv += ["--observation", "panel", "--out", out]
    if exact is not None:
        argv += ["--exact-entry", f"S={exact - 1}"]
    before = set(os.listdir(cache))
    rec = measure_process(["env", f"PYTHONPATH={ROOT}", f"JAXCTBN_CACHE_DIR={cache}", *argv])
    with open(out) as f:
        fit = json.load(f)
    return {
        "wall_s": rec["wall_s"],
        "peak_rss_bytes": rec["peak_rss_bytes"],
        "cache_entries_written": len(set(os.listdir(cache)) - before),
        "minus2loglik": fit["minus2loglik"],
    }


def main():
    ap = argument_parser(__doc__)
    ap.add_argument("--repeat", type=int, default=3, help="msm runs (the shortest counts)")
    ap.add_common(name="first_fit")
    args = ap.parse_args()
    if not os.path.isfile(os.path.join(DATA_DIR, "psor.csv")):
        subprocess.run(["Rscript", os.path.join(MSM_DIR, "export_data.R"), DATA_DIR], check=True)
    work = tempfile.mkdtemp(prefix="jaxctbn-bench-first-fit-")
    records = []
    for name, ((subject, time, state), q0, exact) in CASES.items():
        d = pd.read_csv(os.path.join(DATA_DIR, f"{name}.csv"))
        net = os.path.join(work, f"{name}_network.json")
        with open(net, "w") as f:
            json.dump(network(q0), f)
        cache = tempfile.mkdtemp(prefix=f"cache-{name}-", dir=work)  # fresh and empty
        for label, data in (("given", d), ("new", new_data_set(d, subject, time))):
            raw = os.path.join(work, f"{name}_{label}_msm.csv")
            data.to_csv(raw, index=False)
            ours = os.path.join(work, f"{name}_{label}.csv")
            pd.DataFrame(
                {"trajectory_id": data[subject], "time": data[time], "S": data[state] - 1}
            ).to_csv(ours, index=False)
            script = os.path.join(work, f"{name}_{label}.R")
            with open(script, "w") as f:
                f.write(
                    R_SCRIPT.format(
                        csv=raw,
                        q=", ".join(str(v) for row in q0 for v in row),
                        state=state,
                        time=time,
                        subject=subject,
                        exact="" if exact is None else f", deathexact = {exact}",
                    )
                )
            msm_s = msm_run(script, args.repeat)
            out = os.path.join(work, f"{name}_{label}_fit.json")
            first = jaxctbn_run(net, ours, exact, cache, out)
            second = jaxctbn_run(net, ours, exact, cache, out)
            rec = {
                "case": name if label == "given" else f"{name} (new data set)",
                "subjects": int(data[subject].nunique()),
                "rows": len(data),
                "msm_whole_process_s": msm_s,
                "jaxctbn_first_s": first["wall_s"],
                "jaxctbn_first_cache_entries_written": first["cache_entries_written"],
                "jaxctbn_second_s": second["wall_s"],
                "jaxctbn_peak_rss_bytes": first["peak_rss_bytes"],
                "first_over_msm": first["wall_s"] / msm_s,
                "second_over_msm": second["wall_s"] / msm_s,
                "minus2loglik": first["minus2loglik"],
                "cache": "empty" if label == "given" else f"left by {name}",
            }
            records.append(rec)
            print(json.dumps(rec), flush=True)
    payload = {"environment": environment(), "records": records}
    lines = [
        "# The first `jaxctbn fit` of a data set, as a whole process, against msm's whole run",
        "",
        "msm: `Rscript` with `library(msm)`, `read.csv`, `msm()` (defaults: BFGS, the Hessian) "
        "and `qmatrix.msm` (intervals), the shortest of "
        f"{args.repeat} runs. jaxctbn: `jaxctbn fit --observation panel` (SQUAREM + exact-"
        "information intervals) as a fresh process; first call with the cache given (empty, or "
        "left by the other data set of the kind), then a second call on the same file.",
        "",
        "| case | subjects | rows | cache at the first call | msm | jaxctbn first call | "
        "cache entries written | first / msm | jaxctbn second call | second / msm | peak RSS |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['case']} | {r['subjects']} | {r['rows']} | {r['cache']} | "
            f"{r['msm_whole_process_s']:.2f} s | {r['jaxctbn_first_s']:.2f} s | "
            f"{r['jaxctbn_first_cache_entries_written']} | {r['first_over_msm']:.1f}× | "
            f"{r['jaxctbn_second_s']:.2f} s | {r['second_over_msm']:.1f}× | "
            f"{r['jaxctbn_peak_rss_bytes'] / 2**20:.0f} MiB |"
        )
    write_results(args.name, payload, lines)


if __name__ == "__main__":
    main()
