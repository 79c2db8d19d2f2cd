"""CTBN-RLE as an external peer program in the benchmarks (structure learning, sampling).

CTBN-RLE (C++, GPL, github eudoxia0/ctbnrle @ 1296c8a) is only ever *run* here, as a separate
process, through a small command-line driver; none of its code is part of this repository.
Benchmarks call `find_driver()` and, when it returns `None`, skip the peer and say so.

Building the peer (outside the repository; instructions, patch, driver and build script are in
/work/shared/peers/ctbnrle: README.md, ctbnrle_patches.diff, ctbnrle_driver.cc, build.sh).
Needs g++ (tested with Debian g++ 12.2), make and patch; glpk 4.47 is bundled in the source
tree. The exact commands used (2 cores: -j1 and nice; ~6 minutes in all)::

    B=/work/scratch/ctbnrle_build
    mkdir -p $B/ctbnrle $B/drivers
    # source: the `fetch` tool on github:eudoxia0/ctbnrle gives a bare mirror
    git --git-dir=/work/.mirror/eudoxia0+ctbnrle/repo archive HEAD | tar -x -C $B/ctbnrle
    cd $B/ctbnrle && patch -p1 < /work/shared/peers/ctbnrle/ctbnrle_patches.diff
    # 1. bundled glpk (only the static library is used)
    cd $B/ctbnrle/glpk/glpk-4.47
    nice -n 10 ./configure --disable-shared CFLAGS="-O2 -w"
    nice -n 10 make -j1 -C src                 # -> src/.libs/libglpk.a
    # 2. the library, with its own flags (-O3 -std=c++03 -DUSE_PTHREADS)
    cd $B/ctbnrle/src && nice -n 10 make -j1 ctbn.a
    # 3. the driver (build.sh uses ./ctbnrle and ./drivers relative to $B: no edits needed)
    cd $B && cp /work/shared/peers/ctbnrle/ctbnrle_driver.cc drivers/
    cp /work/shared/peers/ctbnrle/build.sh . && nice -n 10 bash ./build.sh
    # -> $B/drivers/ctbnrle_driver  (set CTBNRLE_DRIVER to use another path)
    # peak RSS is read from GNU time: apt-get install time  (provides /usr/bin/time)
    # 4. the `greedy` mode (GraphEditSearch): our patch to the driver, then the same build
    #    (the copy from step 3 is read-only; the binary keeps its other modes)
    REPO=/work/main   # this repository's checkout
    cd $B && chmod u+w drivers/ctbnrle_driver.cc
    patch drivers/ctbnrle_driver.cc < $REPO/benchmarks/ctbnrle_greedy.diff
    nice -n 10 bash ./build.sh

Driver mode used here: ``ctbnrle_driver learn DATA.csv ALPHA TAU MAXPAR [NODE]``, i.e.
`BruteStructureSearch` (exhaustive, in-degree <= MAXPAR, single-threaded) with
`CTBNFamScore(ALPHA, TAU)` on complete data. Its family score is jaxctbn's
`jaxctbn.NodelmanPrior(alpha=ALPHA, tau=TAU)` (`score_parent_sets` /
`StructurePosterior.log_marginal_likelihoods` agree to ~1e-13 relative), and with a uniform
structure prior the learned graph is `learn_structure(..., prior=NodelmanPrior(ALPHA, TAU))`'s
`map_graph()`. Cost: N * sum_{j<=MAXPAR} C(N-1, j) family scores, each one pass over the
events of the node and its candidate parents (single-threaded; ~30-50 ms of CPU per score with
300 paths of length 100 of binary random networks: 189 s of CPU at N = 20 and 3,263 s at N = 50
for in-degree 2, peak RSS 62 MiB and 144 MiB; N = 100 would take ~7 h).

Driver mode ``ctbnrle_driver greedy DATA.csv ALPHA TAU MAXPAR [NODE]`` (step 4; `learn(...,
search="greedy")`, `bench_graph_search.py`'s peer `ctbnrle-greedy`): CTBN-RLE's
`GraphEditSearch(context, &famscore, false)` on the same `CTBNFamScore(ALPHA, TAU)`, the same
CSV and the same report. From the empty graph it scores every single-edge move (add a parent,
remove one, or reverse an edge: remove `j` from `i`'s parents and add `i` to `j`'s) as the
change of the family scores involved, keeps them in a priority queue, applies the best while
its gain is positive, and rescores only the changed nodes' moves; cycles are allowed (the
`false`). The library has no in-degree bound for it; the driver imposes MAXPAR (>= 0) with a
family score that gives families of more than MAXPAR parents -1e300 (never scored, so never
chosen); MAXPAR < 0 runs the library's search unbounded. The report's first line also carries
`search=greedy maxpar=.. family_scores=.. total_score=..` (families scored during the search;
the learned graph's summed family score, computed after the timing).

Driver modes used for sampling (`bench_sampling.py`): ``ctbnrle_driver samplebench SPEC NTRAJ
TEND SEED`` (`Markov::Sample` of NTRAJ paths over [0, TEND], initial states uniform per node,
nothing written; prints the in-process sampling time) and ``ctbnrle_driver sample SPEC NTRAJ
TEND SEED OUT.csv`` (the same, then writes the long CSV: the whole-process peer of `jaxctbn
sample`). SPEC is the plain-text network that `write_spec` writes.

The data file is jaxctbn's own long CSV (`jaxctbn.Trajectories.write_csv`:
`trajectory_id,time,<node columns>,intervention`, first row of a trajectory its initial state at
time 0, one row per jump, a last row at the end of observation carrying the final state), which
is what the driver reads: it takes the last row's time as the trajectory's end, ignores column
names, and refuses non-empty interventions. It infers each node's cardinality as the largest
state seen + 1 (so every state must occur in the data; `write_long_csv` checks this).
"""

from __future__ import annotations

import os
import re
import types

import numpy as np
from _common import measure_process

DEFAULT_DRIVER = "/work/scratch/ctbnrle_build/drivers/ctbnrle_driver"
SKIP_MESSAGE = (
    "CTBN-RLE driver not found (set CTBNRLE_DRIVER or build it as described in "
    "benchmarks/_ctbnrle.py); skipping the CTBN-RLE peer."
)


def find_driver() -> str | None:
    """Path of the CTBN-RLE driver: `$CTBNRLE_DRIVER` if set, else `DEFAULT_DRIVER`; `None` if
    that is not an executable file."""
    path = os.environ.get("CTBNRLE_DRIVER") or DEFAULT_DRIVER
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def write_long_csv(trajectories, path, model=None) -> None:
    """Write `trajectories` (complete, untruncated, no interventions) as the long CSV the driver
    reads, with jaxctbn's own writer (`jaxctbn.Trajectories.write_csv`). `model` (a CTBN) gives
    the column names and cardinalities; without it the columns are `X0..X{N-1}`. Raises
    `ValueError` for interventions (the driver refuses them) and, with `model`, when some node
    never takes its largest state (the driver would infer a smaller cardinality)."""

    t = types.SimpleNamespace(
        initial_states=np.asarray(trajectories.initial_states),
        states=np.asarray(trajectories.states),
        targets=np.asarray(trajectories.intervention_targets),
    )
    if t.targets.any():
        raise ValueError("write_long_csv: the CTBN-RLE driver does not support interventions.")
    N = t.initial_states.shape[-1]
    # padding slots past num_events hold the last state, so a plain max is exact
    seen = np.maximum(t.initial_states.reshape(-1, N).max(0), t.states.reshape(-1, N).max(0))
    if model is None:
        # the writer reads `.names` and `.cardinalities` (for its state codes) from the model:
        # the cardinalities the driver will infer
        model = types.SimpleNamespace(
            names=tuple(f"X{n}" for n in range(N)),
            cardinalities=tuple(int(k) + 1 for k in seen),
        )
    else:
        short = [
            f"{model.names[n]} (max state {int(seen[n])}, k={k})"
            for n, k in enumerate(model.cardinalities)
            if seen[n] != k - 1
        ]
        if short:
            raise ValueError(
                "write_long_csv: the driver infers cardinalities from the data; nodes not "
                "reaching their largest state: " + ", ".join(short)
            )
    trajectories.write_csv(path, model)


_HEADER = re.compile(r"^ctbnrle learn: (.*)$", re.M)
_PARENTS = re.compile(r"^PARENTS (\d+):(.*)$", re.M)
_SCORE = re.compile(r"^SCORE (\d+) \[(.*)\] (\S+)$", re.M)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split())


def learn(
    driver: str,
    csv_path,
    alpha: float,
    tau: float,
    max_parents: int,
    node: int | None = None,
    *,
    timeout: float | None = None,
    search: str = "exhaustive",
) -> dict:
    """Run ``driver learn csv_path alpha tau max_parents [node]`` and parse its report; with
    `search="greedy"`, ``driver greedy ...`` (GraphEditSearch; `max_parents` < 0: no in-degree
    bound), whose result also has `family_scores` (the families scored) and `total_score` (the
    learned graph's summed family score).

    Returns a dict with
    - `parents`: tuple over nodes of the learned parent tuple (sorted);
    - `num_nodes`, `num_trajectories`, `read_s`, `learn_s`: as the driver prints them
      (`read_s` parsing the CSV, `learn_s` the structure search, both timed in-process);
    - `wall_s`: wall time of the whole process (start, read, learn, node scores, exit), and
      `user_s`, `sys_s`: its CPU time (less sensitive than wall times to a busy machine);
    - `peak_rss_bytes`: the driver process's peak resident set size, and `rss_source`: how it
      was measured. The driver runs under ``/usr/bin/time -v`` when that exists ("time -v": its
      "Maximum resident set size", exact up to the ~2 MB of `time` itself). Otherwise
      ("wait4") it is `ru_maxrss` of the child from `os.wait4`, an upper bound only: Linux
      carries the spawning (Python) process's RSS across the exec into that number;
    - `scores` (only with `node`): `{parent tuple: CTBNFamScore}` for every parent set of
      `node` with at most `max_parents` (<= 2) parents;
    - `command`, `stdout`.
    Raises `subprocess.CalledProcessError` if the driver fails, `subprocess.TimeoutExpired`
    after `timeout` seconds (the driver is killed)."""
    if search not in ("exhaustive", "greedy"):
        raise ValueError(f"search must be 'exhaustive' or 'greedy', not {search!r}")
    cmd = [
        str(driver),
        "learn" if search == "exhaustive" else "greedy",
        str(csv_path),
        repr(float(alpha)),
        repr(float(tau)),
        str(int(max_parents)),
    ]
    if node is not None:
        cmd.append(str(int(node)))
    run = measure_process(cmd, timeout=timeout)
    stdout = run["stdout"]
    header = _HEADER.search(stdout)
    if header is None:
        raise RuntimeError(f"unexpected driver output:\n{stdout}\n{run['stderr']}")
    fields = dict(kv.split("=", 1) for kv in header.group(1).split())
    parents = {int(m.group(1)): _ints(m.group(2)) for m in _PARENTS.finditer(stdout)}
    result = {
        "parents": tuple(parents[n] for n in range(len(parents))),
        "num_nodes": int(fields["N"]),
        "num_trajectories": int(fields["trajectories"]),
        "read_s": float(fields["read_s"]),
        "learn_s": float(fields["learn_s"]),
        **{key: run[key] for key in ("wall_s", "peak_rss_bytes", "rss_source")},
        **{key: run[key] for key in ("user_s", "sys_s") if key in run},
        "command": cmd,
        "stdout": stdout,
    }
    if search == "greedy":
        result["family_scores"] = int(fields["family_scores"])
        result["total_score"] = float(fields["total_score"])
    if node is not None:
        result["scores"] = {_ints(m.group(2)): float(m.group(3)) for m in _SCORE.finditer(stdout)}
    return result


def write_spec(model, path) -> None:
    """Write `model` (a `jaxctbn.CTBN`) as the driver's plain-text SPEC: N, the cardinalities,
    then per node ``P p_1 .. p_P`` and one row-major k x k intensity matrix per parent
    configuration, in jaxctbn's configuration order (first parent most significant), which is
    the order the driver assumes."""
    lines = [str(model.num_nodes), " ".join(str(k) for k in model.cardinalities)]
    for n, cim in enumerate(model.cims):
        parents = model.parents[n]
        lines.append(" ".join(str(x) for x in (len(parents), *parents)))
        lines += [" ".join(repr(float(x)) for x in q.ravel()) for q in np.asarray(cim, float)]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


_SAMPLE = re.compile(r"^ctbnrle sample: (.*)$", re.M)


def sample(
    driver: str,
    spec_path,
    num_trajectories: int,
    tend: float,
    seed: int,
    out=None,
    *,
    timeout: float | None = None,
) -> dict:
    """Run ``driver samplebench SPEC NTRAJ TEND SEED`` (or ``sample ... OUT`` with `out`, which
    also writes the long CSV) and parse its report: `events` (jumps in all paths), `sample_s`
    (`Markov::Sample` of all paths, timed in-process: no start-up, reading or writing),
    `events_per_s` (events / sample_s), `write_s` (writing the CSV, 0 without `out`), `wall_s`,
    `user_s`, `sys_s` (the whole process) and `command`."""
    cmd = [str(driver), "sample" if out is not None else "samplebench", str(spec_path)]
    cmd += [str(int(num_trajectories)), repr(float(tend)), str(int(seed))]
    if out is not None:
        cmd.append(str(out))
    run = measure_process(cmd, timeout=timeout)
    m = _SAMPLE.search(run["stdout"])
    if m is None:
        raise RuntimeError(f"unexpected driver output:\n{run['stdout']}\n{run['stderr']}")
    fields = dict(kv.split("=", 1) for kv in m.group(1).split())
    return {
        "events": int(fields["events"]),
        "sample_s": float(fields["sample_s"]),
        "events_per_s": float(fields["events_per_s"]),
        "write_s": float(fields["write_s"]),
        **{key: run[key] for key in ("wall_s", "user_s", "sys_s") if key in run},
        "command": cmd,
    }
