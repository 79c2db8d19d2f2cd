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
  distinct gaps likewise; with covariates, `Covariates.padded_for`), so such a data set finds its compiled programs in the cache when its
  sizes fall in the same classes; `cache entries written` says whether it did (0: all found).

Cases: psor, cav, and cav with the recipient's sex as a covariate (msm `covariates = ~ sex`,
jaxctbn `--covariates sex`). Each row is a median of `--runs` runs (the given data set with a
fresh, empty cache each time; `--runs` new data sets, seeds 1, 2, ..., msm and jaxctbn on each),
msm and jaxctbn alternating run by run; the ratios are the medians of the runs' ratios.

Run: `python benchmarks/cli/bench_first_fit.py [--runs 5]` (needs `Rscript` with msm: `apt-get
install r-cran-msm`); writes `results/first_fit.{json,md}`.
"""

from __future__ import annotations

import compileall
import json
import os
import shutil
import subprocess
import sys
import tempfile
from statistics import median

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import MSM_DIR, ROOT, argument_parser, environment, measure_process, write_results  # noqa: E402

DATA_DIR = os.path.join(MSM_DIR, "data")

CASES = {
    # name: (subject, time, state columns, initial Q (msm's examples), exact-entry state
    # (1-based), covariates)
    "psor": (
        ("ptnum", "months", "state"),
        [[0, 0.1, 0, 0], [0, 0, 0.1, 0], [0, 0, 0, 0.1], [0, 0, 0, 0]],
        None,
        (),
    ),
    "cav": (
        ("PTNUM", "years", "state"),
        [[0, 0.148, 0, 0.0171], [0.2128, 0, 0.2127, 0.0171], [0, 0.1, 0, 0.2], [0, 0, 0, 0]],
        4,
        (),
    ),
    "cav ~ sex": (
        ("PTNUM", "years", "state"),
        [[0, 0.148, 0, 0.0171], [0.2128, 0, 0.2127, 0.0171], [0, 0.1, 0, 0.2], [0, 0, 0, 0]],
        4,
        ("sex",),
    ),
}
#: each case's data file
CSV = {"psor": "psor", "cav": "cav", "cav ~ sex": "cav"}

R_SCRIPT = """suppressPackageStartupMessages(library(msm))
d <- read.csv("{csv}")
Q <- matrix(c({q}), nrow = 4, byrow = TRUE)
m <- msm({state} ~ {time}, subject = {subject}, data = d, qmatrix = Q{exact}{covariates})
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


def msm_run(script: str) -> float:
    return measure_process(["Rscript", script])["wall_s"]


def jaxctbn_run(
    net: str, csv: str, exact: int | None, covariates, cache: str, out: str, effort: str = "low"
) -> dict:
    argv = [sys.executable, "-m", "jaxctbn._cli", "fit", "--network", net, "--data", csv]
    argv += ["--observation", "panel", "--out", out]
    if exact is not None:
        argv += ["--exact-entry", f"S={exact - 1}"]
    if covariates:
        argv += ["--covariates", ",".join(covariates)]
    before = set(os.listdir(cache))
    settings = [f"PYTHONPATH={ROOT}", f"JAXCTBN_CACHE_DIR={cache}"]
    rec = measure_process(["env", *settings, f"JAXCTBN_COMPILE_EFFORT={effort}", *argv])
    with open(out) as f:
        fit = json.load(f)
    return {
        "output": fit,
        "wall_s": rec["wall_s"],
        "peak_rss_bytes": rec["peak_rss_bytes"],
        "cache_entries_written": len(set(os.listdir(cache)) - before),
        "minus2loglik": fit["minus2loglik"],
    }


def main():
    ap = argument_parser(__doc__)
    ap.add_argument(
        "--runs",
        type=int,
        default=5,
        help="runs of each kind (the medians count), and new data sets",
    )
    ap.add_argument(
        "--records",
        help="write the results from the records a run printed (one JSON line each) to this "
        "file, instead of running",
    )
    ap.add_common(name="first_fit")
    args = ap.parse_args()
    if args.records:
        with open(args.records) as f:
            rows = [json.loads(line) for line in f if line.startswith("{")]
        return write(args, rows)
    if not os.path.isfile(os.path.join(DATA_DIR, "psor.csv")):
        subprocess.run(["Rscript", os.path.join(MSM_DIR, "export_data.R"), DATA_DIR], check=True)
    # what `pip install` leaves: compiled modules (where PYTHONDONTWRITEBYTECODE is set, each
    # process would otherwise compile jaxctbn's sources again)
    compileall.compile_dir(os.path.join(ROOT, "jaxctbn"), quiet=1)
    work = tempfile.mkdtemp(prefix="jaxctbn-bench-first-fit-")
    records = []
    for name, ((subject, time, state), q0, exact, covariates) in CASES.items():
        d = pd.read_csv(os.path.join(DATA_DIR, f"{CSV[name]}.csv"))
        net = os.path.join(work, f"{CSV[name]}_network.json")
        with open(net, "w") as f:
            json.dump(network(q0), f)

        def files(data, label):
            """The data set as msm's CSV, jaxctbn's CSV and msm's script."""
            raw = os.path.join(work, f"{CSV[name]}_{label}_msm.csv")
            data.to_csv(raw, index=False)
            ours = os.path.join(work, f"{CSV[name]}_{label}.csv")
            columns = {"trajectory_id": data[subject], "time": data[time], "S": data[state] - 1}
            pd.DataFrame({**columns, **{c: data[c] for c in covariates}}).to_csv(ours, index=False)
            script = os.path.join(work, f"{name}_{label}.R".replace(" ", "_"))
            with open(script, "w") as f:
                f.write(
                    R_SCRIPT.format(
                        csv=raw,
                        q=", ".join(str(v) for row in q0 for v in row),
                        state=state,
                        time=time,
                        subject=subject,
                        exact="" if exact is None else f", deathexact = {exact}",
                        covariates=""
                        if not covariates
                        else ", covariates = ~ " + " + ".join(covariates),
                    )
                )
            return ours, script

        def fit(csv, cache, effort="low"):
            out = os.path.join(work, "fit.json")
            return jaxctbn_run(net, csv, exact, covariates, cache, out, effort)

        # the given data set: each run a fresh, empty cache, then a second call with it
        ours, script = files(d, "given")
        msm_s, first, second, full = [], [], [], []
        for _ in range(args.runs):
            # msm's run, then XLA's default compile effort and the command's (each a fresh
            # cache): side by side, run by run (the machine's speed drifts over minutes)
            msm_s.append(msm_run(script))
            full.append(fit(ours, tempfile.mkdtemp(prefix="cache-", dir=work), "full"))
            cache = tempfile.mkdtemp(prefix="cache-", dir=work)  # fresh and empty
            first.append(fit(ours, cache))
            second.append(fit(ours, cache))
        rec = record(name, d, subject, "empty", msm_s, first, second)
        difference, where = largest_difference(first[0]["output"], full[0]["output"])
        rec.update(
            jaxctbn_first_full_effort_s=median(r["wall_s"] for r in full),
            full_effort_runs_s=[r["wall_s"] for r in full],
            full_effort_largest_relative_difference=difference,
            full_effort_largest_difference_at=where,
        )
        rec["first_over_full_effort"] = rec["jaxctbn_first_s"] / rec["jaxctbn_first_full_effort_s"]
        records.append(rec)
        print(json.dumps(records[-1]), flush=True)
        # new data sets of the kind, each with the cache the given one left (not what the new
        # data sets before it added): restored in the same directory before each, as JAX's
        # cache keys hold the directory's path (a copy elsewhere would miss every program)
        snapshot = os.path.join(tempfile.mkdtemp(prefix="snapshot-", dir=work), "cache")
        shutil.copytree(cache, snapshot)
        msm_s, first, second, sizes = [], [], [], []
        for seed in range(1, args.runs + 1):
            data = new_data_set(d, subject, time, seed=seed)
            ours, script = files(data, f"new{seed}")
            msm_s.append(msm_run(script))
            shutil.rmtree(cache)
            shutil.copytree(snapshot, cache)
            first.append(fit(ours, cache))
            second.append(fit(ours, cache))
            sizes.append((int(data[subject].nunique()), len(data)))
        rec = record(
            f"{name} (new data sets)", data, subject, f"left by {name}", msm_s, first, second
        )
        rec["subjects"], rec["rows"] = [s[0] for s in sizes], [s[1] for s in sizes]
        records.append(rec)
        print(json.dumps(rec), flush=True)
    write(args, records)


def write(args, records) -> None:
    """`results/first_fit.{json,md}` of the records."""
    payload = {"environment": environment(), "records": records}
    lines = [
        "# The first `jaxctbn fit` of a data set, as a whole process, against msm's whole run",
        "",
        "msm: `Rscript` with `library(msm)`, `read.csv`, `msm()` (defaults: BFGS, the Hessian) "
        "and `qmatrix.msm` (intervals). jaxctbn: `jaxctbn fit --observation panel` (SQUAREM + "
        "exact-information intervals; with covariates L-BFGS) as a fresh process, its modules "
        "byte-compiled as an installed package's are; the first call with the cache given "
        f"(empty, or left by the given data set of the kind), then a second call on the same "
        f"file. Medians of {args.runs} runs, side by side: the given data set {args.runs} times "
        f"(each with a fresh cache), and {args.runs} new data sets of each kind (one run each, "
        "msm and jaxctbn on the same file, each jaxctbn run with the cache the given data set "
        "left, restored before each). `cache entries written`: the most any run wrote (0: "
        "every program found); `slowest first call`: the run that compiled most. `first / "
        "msm`, `second / msm`: the median of the runs' ratios, each jaxctbn call against the "
        "msm run on the same file just before it (msm, then jaxctbn, run by run: the "
        "machine's speed drifts by a fifth over minutes). Targets: "
        "first call on a new data set ≤ 2× msm, with an empty cache ≤ 6×.",
        "",
        "The command compiles the panel fit's programs with less XLA optimisation "
        "(`JAXCTBN_COMPILE_EFFORT`, docs/formats.md). `XLA's defaults`: the first call with an "
        "empty cache under `JAXCTBN_COMPILE_EFFORT=full`, alternating with the command's "
        "default in the same run (median); `largest difference`: the largest relative "
        "difference between the two outputs' numbers (the first run of each), and where.",
        "",
        "| case | subjects | rows | cache at the first call | msm | jaxctbn first call | "
        "cache entries written | first / msm | slowest first call | jaxctbn second call | "
        "second / msm | peak RSS | first call, XLA's defaults | largest difference |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        subjects = r["subjects"] if isinstance(r["subjects"], int) else median(r["subjects"])
        rows = r["rows"] if isinstance(r["rows"], int) else median(r["rows"])
        lines.append(
            f"| {r['case']} | {subjects:.0f} | {rows:.0f} | {r['cache']} | "
            f"{r['msm_whole_process_s']:.2f} s | {r['jaxctbn_first_s']:.2f} s | "
            f"{max(r['jaxctbn_first_cache_entries_written'])} | {r['first_over_msm']:.1f}× | "
            f"{max(r['runs']['jaxctbn_first_s']):.2f} s | "
            f"{r['jaxctbn_second_s']:.2f} s | {r['second_over_msm']:.1f}× | "
            f"{r['jaxctbn_peak_rss_bytes'] / 2**20:.0f} MiB | {defaults_cells(r)}"
        )
    write_results(args.name, payload, lines)


def defaults_cells(r: dict) -> str:
    """The row's cells of the first call with XLA's defaults and of the largest difference."""
    if "jaxctbn_first_full_effort_s" not in r:
        return "— | — |"
    time = f"{r['jaxctbn_first_full_effort_s']:.2f} s ({r['first_over_full_effort']:.2f}×)"
    difference = r["full_effort_largest_relative_difference"]
    if difference == 0:
        return f"{time} | 0 (bit for bit) |"
    return f"{time} | {difference:.1e} (`{r['full_effort_largest_difference_at']}`) |"


def largest_difference(a, b, where: str = "") -> tuple[float, str]:
    """The largest relative difference between the numbers of two outputs of one structure
    (parsed JSON), and where it is."""
    if isinstance(a, dict):
        found = [largest_difference(a[k], b[k], f"{where}/{k}") for k in a]
    elif isinstance(a, list):
        found = [largest_difference(x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b))]
    elif isinstance(a, float) and a != b:
        return abs(a - b) / max(abs(a), abs(b)), where
    else:
        return 0.0, where
    return max(found, default=(0.0, where))


def record(case, data, subject, cache, msm_s, first, second) -> dict:
    """One row: medians of the runs, the ratios to msm as the medians of the runs' ratios (each
    jaxctbn call against the msm run just before it), and the runs themselves."""
    msm, ours, again = (
        median(msm_s),
        median(r["wall_s"] for r in first),
        median(r["wall_s"] for r in second),
    )
    return {
        "case": case,
        "subjects": int(data[subject].nunique()),
        "rows": len(data),
        "cache": cache,
        "msm_whole_process_s": msm,
        "jaxctbn_first_s": ours,
        "jaxctbn_second_s": again,
        "first_over_msm": median(r["wall_s"] / m for r, m in zip(first, msm_s)),
        "second_over_msm": median(r["wall_s"] / m for r, m in zip(second, msm_s)),
        "first_over_msm_of_medians": ours / msm,
        "jaxctbn_first_cache_entries_written": [r["cache_entries_written"] for r in first],
        "jaxctbn_peak_rss_bytes": max(r["peak_rss_bytes"] for r in first),
        "minus2loglik": [r["minus2loglik"] for r in first],
        "runs": {
            "msm_s": msm_s,
            "jaxctbn_first_s": [r["wall_s"] for r in first],
            "jaxctbn_second_s": [r["wall_s"] for r in second],
        },
    }


if __name__ == "__main__":
    main()
