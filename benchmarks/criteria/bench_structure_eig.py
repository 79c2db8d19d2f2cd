"""The structure EIG design: seconds per scoring step, the path-by-path implementation it replaced
against the batched one.

Problem: the built-in 4-node binary network (`jaxctbn._experiments.default_truth("structure")`,
i.e. `paper_network(key(0), rates="gamma")`), a history of 3 trajectories of tau = 3 from state 0,
`learn_structure(max_parents=3)` (8 candidate parent sets per node), the whole intervention space
(81 candidates), initial state 0, tau = 3, N_S = 10 posterior draws and 10 paths per draw,
float64 (as `jaxctbn run` computes: `_cli._setup_jax` enables x64). One step = one call of
`score_interventions(..., criterion=EIG(num_paths=10), num_samples=10)`.

Rows:

- `old`: the implementation at commit 0ab2656 (`jaxctbn/_structure_criteria.py` read from git and
  loaded next to the current modules): per candidate a vmap over draws and paths of
  `sample_trajectory` (a 256-jump buffer per path), `node_statistics` on every candidate set and
  the prior's marginal likelihood; candidates mapped in chunks of 3 (its default, all candidates
  at once, needs 32 GB here).
- `new`: the current `score_interventions` (candidates x draws x paths of one node in one
  sampling loop that keeps only the paths' statistics, chunks of candidates that clamp the node
  skipped, lgamma looked up in a table for the Gamma prior), default batching `Chunked(9)` and
  `Chunked(27)`; and with `max_events=1024` to show that the cost no longer follows the buffer.
- `vbhc` (closed form, plug-in) and `vbhc-mc` (`MonteCarlo(num_paths=10)`) for reference.

Each row: compile time, then the median (and min, max) of `--repeat` timed steps after
compilation. The machine's 2 cores are shared with other jobs, so single timings are noisy; the
medians are what to compare. `max |new - old|` checks that the scores are the same numbers.

Run: `python benchmarks/criteria/bench_structure_eig.py [--repeat 5] [--skip-old]`; writes
`results/structure_eig.{json,md}`.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc
from jaxctbn._experiments.config import default_truth

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import (
    ROOT,
    argument_parser,
    block,
    compile_time,
    environment,
    fmt,
    repeat_time,
    write_results,
)

TAU, NS, PATHS, OLD_COMMIT = 3.0, 10, 10, "0ab2656"


def old_module():
    """`jaxctbn/_structure_criteria.py` as of `OLD_COMMIT`, as a module of the current package
    (its relative imports resolve to the current modules, whose interfaces it uses still exist)."""
    root = ROOT
    source = subprocess.run(
        ["git", "show", f"{OLD_COMMIT}:jaxctbn/_structure_criteria.py"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    # the flat modules of then, at their places of now
    moved = {
        "_batching": "_batching",
        "_interventions": "_model.interventions",
        "_kl_estimators": "_criteria.kl_estimators",
        "_layout": "_model.layout",
        "_master_equation": "_master_equation",
        "_optimisers": "_learning.optimisers",
        "_sampling": "_paths.sampling",
        "_solvers": "_master_equation",
        "_statistics": "_paths.sufficient_statistics",
        "_structure": "_learning.structure_posterior",
    }
    source = re.sub(
        r"^from \.(_\w+) import", lambda m: f"from .{moved[m.group(1)]} import", source, flags=re.M
    )
    name = f"jaxctbn._structure_criteria_{OLD_COMMIT}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "jaxctbn"
    sys.modules[name] = module
    exec(compile(source, f"{OLD_COMMIT}:jaxctbn/_structure_criteria.py", "exec"), module.__dict__)
    return module


def problem():
    truth = default_truth("structure")
    traj = jc.sample_trajectories(
        truth, jnp.zeros(4, jnp.int32), TAU, key=jr.key(1), num_trajectories=3
    )
    post = jc.learn_structure(traj, truth.names, truth.cardinalities, max_parents=3)
    return post, jc.intervention_space(truth.cardinalities), jnp.zeros(4, jnp.int32)


def timed(fn, args, repeat):
    """Compile time, and the step times after compilation."""
    compile_s, compiled = compile_time(jax.jit(fn), *args)
    out = block(compiled(*args))  # a warm-up call
    _, steps = repeat_time(compiled, *args, repeats=repeat)
    return compile_s, steps.times, np.asarray(out)


def main():
    ap = argument_parser(__doc__, name="structure_eig")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--skip-old", action="store_true")
    args = ap.parse_args()
    post, space, init = problem()
    key = jr.key(2)

    def new(criterion, batching=None):
        def score(post, key):
            return jc.score_interventions(
                post,
                space,
                init,
                TAU,
                key=key,
                num_samples=NS,
                criterion=criterion,
                batching=batching,
            )

        return score

    def old_eig(post, key):  # the old EIG.score_structure, candidates in chunks of 3
        key_draws, key_paths = jr.split(key)
        draws = old.structure_draws(post, key_draws, NS)
        return jc.Chunked(3).map(
            lambda iv: old.structure_eig(
                post, draws, init, TAU, path_key=key_paths, num_paths=PATHS, intervention=iv
            ),
            space,
        )

    setups = [
        ("eig", "new, Chunked(9) (default)", new(jc.EIG(num_paths=PATHS))),
        ("eig", "new, Chunked(27)", new(jc.EIG(num_paths=PATHS), jc.Chunked(27))),
        (
            "eig",
            "new, max_events=1024",
            new(jc.EIG(num_paths=PATHS, max_events=1024)),
        ),
        ("vbhc", "closed form, plug-in (default)", new(jc.VBHC())),
        (
            "vbhc-mc",
            "MonteCarlo(num_paths=10), new sampler",
            new(jc.VBHC(estimator=jc.MonteCarlo(num_paths=PATHS))),
        ),
    ]
    if not args.skip_old:
        old = old_module()
        setups.insert(0, ("eig", f"old ({OLD_COMMIT}), Chunked(3)", old_eig))
    rows, records, scores = [], [], {}
    for criterion, label, fn in setups:
        compile_s, times, out = timed(fn, (post, key), args.repeat)
        scores[label] = out
        rec = {
            "criterion": criterion,
            "implementation": label,
            "compile_s": compile_s,
            "median_s": float(np.median(times)),
            "min_s": float(np.min(times)),
            "max_s": float(np.max(times)),
            "times_s": times,
        }
        records.append(rec)
        rows.append(
            f"| {criterion} | {label} | {fmt(compile_s)} | {fmt(rec['median_s'])} | "
            f"{fmt(rec['min_s'])} – {fmt(rec['max_s'])} |"
        )
        print(rows[-1], flush=True)
    checks = {}
    labels = [r["implementation"] for r in records if r["criterion"] == "eig"]
    for label in labels[1:]:
        checks[f"max |{label} - {labels[0]}|"] = float(
            np.max(np.abs(scores[label] - scores[labels[0]]))
        )
    env = environment()
    header = [
        f"# Structure EIG: seconds per scoring step ({jax.default_backend()}, float64)",
        "",
        f"Machine: {env['device']}, {env['cpu_count']} cores, shared with other jobs (timings "
        "noisy: compare medians). Built-in 4-node binary network, 3 trajectories of history, "
        f"max_parents = 3 (8 sets per node), 81 candidates, N_S = {NS}, {PATHS} paths per draw, "
        f"tau = {TAU}. step = one `score_interventions` call after compilation, median of "
        f"{args.repeat} (range min – max).",
        "",
        "| criterion | implementation | compile | step (median) | step (range) |",
        "|---|---|---|---|---|",
    ]
    footer = [""] + [f"- {name}: {value:.2e}" for name, value in checks.items()]
    write_results(
        args.name,
        {"environment": env, "records": records, "checks": checks},
        header + rows + footer,
    )


if __name__ == "__main__":
    main()
