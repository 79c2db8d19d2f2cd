"""A notebook's first call of a verb, in a fresh process: `jaxctbn.expected_statistics` and
`jaxctbn.score_interventions` before issue 63 and now, without and with
`jaxctbn.use_compilation_cache`.

Each run is a fresh Python process (what a new kernel is) that imports JAX and jaxctbn, enables
float64, builds the paper's 4-node network (`paper_network`, key 0) and calls the verb twice:
`expected_statistics(net, s0, 3.0)`, or `score_interventions` of the prior `RatePosterior` over
the 81 interventions (key 1; the VBHC with 10 draws), and of the prior `StructurePosterior`
(at most two parents per node; the VBHC with 10 draws per candidate set). Reported: the first and second call
(inside the process) and the whole process, median of `--repeat` runs. Rows: the checkout at
`--before` (default ead4127, the commit before issue 63's first) and this checkout, both with
JAX's defaults (no persistent cache: what `import jaxctbn` gives); this checkout with
`jc.use_compilation_cache(dir)` on an empty directory (the first kernel), and on the directory the
first kernel filled (every later kernel). The outputs' bytes (SHA-256) are compared across the
rows: the same results.

Run: `python benchmarks/cli/bench_first_call.py [--repeat 3] [--before REV]`; writes
`results/first_call.{json,md}`.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import (  # noqa: E402
    BENCHMARKS,
    ROOT,
    argument_parser,
    environment,
    measure_process,
    write_results,
)

#: The child process: argv = verb, cache directory ("" for none).
CHILD = """
import hashlib, json, sys
from _common import block, stopwatch
import jax, jax.numpy as jnp, numpy as np
import jaxctbn as jc

verb, cache = sys.argv[1], sys.argv[2]
jax.config.update("jax_enable_x64", True)
if cache:
    jc.use_compilation_cache(cache)
net = jc.paper_network(jax.random.key(0))
s0 = jnp.zeros(4, jnp.int32)
if verb == "expected_statistics":
    call = lambda: jc.expected_statistics(net, s0, 3.0)
elif verb == "score_interventions":
    post = jc.RatePosterior.for_model(net)
    space = jc.intervention_space(net.cardinalities)
    call = lambda: jc.score_interventions(post, space, s0, 3.0, key=jax.random.key(1))
else:  # the structure design: the prior StructurePosterior (at most two parents per node)
    post = jc.StructurePosterior.from_prior(net.names, net.cardinalities, max_parents=2)
    space = jc.intervention_space(net.cardinalities)
    call = lambda: jc.score_interventions(post, space, s0, 3.0, key=jax.random.key(1))
with stopwatch() as first:
    out = block(call())
with stopwatch() as second:
    block(call())
digest = hashlib.sha256()
for leaf in jax.tree_util.tree_leaves(out):
    digest.update(np.asarray(leaf).tobytes())
print(json.dumps({"first_s": first.seconds, "second_s": second.seconds,
                  "sha256": digest.hexdigest()}))
"""

VERBS = ("expected_statistics", "score_interventions", "score_interventions (structure)")


def run(checkout: str, verb: str, cache: str) -> dict:
    """One fresh process: its wall time and peak memory, and the child's own timings."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([checkout, BENCHMARKS]))
    env.pop("XLA_FLAGS", None)  # JAX's defaults, as a user has them
    rec = measure_process([sys.executable, "-c", CHILD, verb, cache], env=env)
    child = json.loads(rec["stdout"].strip().splitlines()[-1])
    return {"process_s": rec["wall_s"], "peak_rss_bytes": rec["peak_rss_bytes"], **child}


def summary(runs: list[dict]) -> dict:
    keys = ("process_s", "first_s", "second_s")
    out = {f"{k}_median": statistics.median(r[k] for r in runs) for k in keys}
    digests = {r["sha256"] for r in runs}
    if len(digests) != 1:
        raise RuntimeError(f"runs of one row gave different results: {digests}")
    return {**out, "sha256": digests.pop(), "runs": runs}


def main():
    ap = argument_parser(__doc__)
    ap.add_argument("--repeat", type=int, default=3, help="processes per row (median)")
    ap.add_argument(
        "--before", default="ead4127", help="the earlier checkout (a git revision of this repo)"
    )
    ap.add_common(name="first_call")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="jaxctbn-bench-first-call-")
    before = os.path.join(work, "before")
    subprocess.run(
        ["git", "-C", ROOT, "worktree", "add", "--detach", before, args.before],
        check=True,
        capture_output=True,
    )
    records = []
    try:
        for verb in VERBS:
            rows = {}
            rows["before, JAX defaults"] = [run(before, verb, "") for _ in range(args.repeat)]
            rows["now, JAX defaults"] = [run(ROOT, verb, "") for _ in range(args.repeat)]
            empty = []
            for i in range(args.repeat):  # a fresh, empty directory each time
                empty.append(run(ROOT, verb, os.path.join(work, f"{verb}-empty-{i}")))
            rows["now, use_compilation_cache, empty (first kernel)"] = empty
            filled = os.path.join(work, f"{verb}-filled")
            run(ROOT, verb, filled)  # the first kernel fills it
            rows["now, use_compilation_cache, filled (later kernels)"] = [
                run(ROOT, verb, filled) for _ in range(args.repeat)
            ]
            for label, runs in rows.items():
                rec = {"verb": verb, "row": label, **summary(runs)}
                records.append(rec)
                print(json.dumps({k: v for k, v in rec.items() if k != "runs"}), flush=True)
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", before], check=False)
        shutil.rmtree(work, ignore_errors=True)

    same = {verb: len({r["sha256"] for r in records if r["verb"] == verb}) == 1 for verb in VERBS}
    env = environment()
    env["loadavg_1_5_15"] = os.getloadavg()
    env["before"] = args.before
    table = [
        "# A notebook's first call of a verb, in a fresh process",
        "",
        f"Each row: median of {args.repeat} fresh processes (import JAX and jaxctbn, float64, "
        "the paper's 4-node network, the verb called twice), JAX's default XLA flags. "
        f"Before: the checkout at {args.before} (before issue 63). `use_compilation_cache`: "
        "an empty directory for each process (a first kernel), or the directory a first kernel "
        f"filled (every later one). Load average {env['loadavg_1_5_15'][0]:.1f} at the end.",
        "",
        "| verb | row | first call s | second call s | whole process s |",
        "|---|---|---|---|---|",
        *(
            f"| `{r['verb']}` | {r['row']} | {r['first_s_median']:.2f} | "
            f"{r['second_s_median']:.3f} | {r['process_s_median']:.2f} |"
            for r in records
        ),
        "",
        "The same output bytes in every row: "
        + ", ".join(f"`{v}` {'yes' if ok else 'NO'}" for v, ok in same.items())
        + ".",
    ]
    write_results(args.name, {"environment": env, "same_results": same, "records": records}, table)


if __name__ == "__main__":
    main()
