"""Structure learning from panel data at N = 6-50 binary nodes: structural EM with the sampled
E-step (auxiliary-variable Gibbs sampling, `learn_structure_from_panels(e_step=, key=)`),
with the importance-sampling E-step (`e_step=PanelImportanceSampler()`: the mean-field
posterior as the proposal) and with the mean-field E-step (`e_step=PanelMeanField()`)
against structural EM with
exact forward-backward where the joint state space fits (tried up to N = 10: 1,024 states),
on the same panels: SHD and AUROC of the edge marginals against the truth,
time, E-steps, the chains' smallest effective sample size, peak memory of the process.

Data: the networks of `bench_graph_search.py` (each node 0-2 random parents, binary,
`scaled_softmax_ctbn` with rate_fast = 2), R trajectories from uniform random starts, seen at
7 equally spaced visits on [0, 3] (every node at every visit). Learning: in-degree K = 2,
Gamma(1, 1) rates prior, the sparse edge prior pi = 1/N, the empty graph as start. Each run
is its own process (`--worker`), so its peak RSS is its own.

Run: `python benchmarks/panel/bench_panel_sampling.py [--sizes 6,20,50] [--quick]`; writes
`results/panel_sampling.{json,md}`.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
# bench_graph_search (networks, truth, accuracy): the learning layer
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "learning")
)

VISITS = 7
DURATION = 3.0


def _trajectories(N: int) -> int:
    return 100 if N <= 20 else 60


def _sampler_settings(N: int, quick: bool) -> dict:
    samples, burn_in = (20, 10) if quick else (50, 20)
    # a path holds every node's jumps (about 2.3 per node on [0, 3] here); a node's own
    # buffer bounds the grid of its updates
    return dict(
        num_samples=samples,
        burn_in=burn_in,
        max_events=max(64, 8 * N),
        max_virtual=32,
        max_node_events=16,
    )


def _importance_settings(N: int, quick: bool) -> dict:
    # (8 uniformisation times per bridge at first: structural EM doubles them when needed)
    return dict(
        num_samples=32 if quick else 64,
        max_events=max(64, 8 * N),
        max_node_events=16,
        max_candidates=8,
    )


def worker(N: int, inference: str, quick: bool) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    from _common import stopwatch
    from bench_graph_search import _network, _truth, accuracy

    import jaxctbn as jc

    _, truth = _network(N)
    R = 30 if quick else _trajectories(N)
    starts = jax.random.bernoulli(jax.random.key(1), 0.5, (R, N)).astype(jnp.int32)
    paths = jc.sample_trajectories(
        truth, starts, DURATION, key=jax.random.key(2), num_trajectories=R,
        max_events=int(4 * N * DURATION),
    )  # fmt: skip
    assert not np.any(paths.truncated)
    observations = jc.panel.PanelObservations.from_paths(paths, jnp.linspace(0.0, DURATION, VISITS))
    names = [f"X{i}" for i in range(N)]
    options: dict[str, Any] = {}
    if inference == "sampling":
        options = dict(
            e_step=jc.panel.GibbsSampler(**_sampler_settings(N, quick)), key=jax.random.key(3)
        )
    elif inference == "mean-field":
        options = dict(e_step=jc.panel.PanelMeanField())
    elif inference == "importance":
        options = dict(
            e_step=jc.panel.PanelImportanceSampler(**_importance_settings(N, quick)),
            key=jax.random.key(3),
        )
    sw = stopwatch()
    fit = jc.panel.learn_structure_from_panels(
        observations, names, (2,) * N, max_parents=2, knowledge=jc.PriorKnowledge(edge_prior=np.full((N, N), 1.0 / N)),
        max_iterations=30, **options,
    )  # fmt: skip
    edges = np.asarray(fit.posterior.edge_marginals())
    seconds = sw.elapsed
    learned = np.zeros((N, N), bool)
    for n, ps in enumerate(fit.posterior.map_graph()):
        learned[list(ps), n] = True
    out = {
        "nodes": N,
        "inference": inference,
        "trajectories": R,
        "visits": VISITS,
        "seconds": seconds,
        "e_steps": fit.iterations,
        "converged": fit.converged,
        "evidence_lower_bound": None
        if fit.evidence_lower_bound is None
        else float(fit.evidence_lower_bound),
        "log_likelihood": None if fit.log_likelihood is None else float(fit.log_likelihood),
        **accuracy(_truth(N), learned, edges),
    }
    if fit.effective_sample_size is not None:
        grown = fit.sampler  # the buffers as the E-steps grew them
        assert grown is not None
        if isinstance(grown, jc.panel.PanelImportanceSampler):
            out["sampler"] = dict(
                _importance_settings(N, quick),
                max_events=grown.max_events,
                max_node_events=grown.max_node_events,
                max_candidates=grown.max_candidates,
            )
            out["median_effective_sample_size"] = float(
                np.median(np.asarray(fit.median_effective_sample_size))
            )
            assert fit.log_likelihood_estimate is not None
            out["log_likelihood_estimate"] = float(fit.log_likelihood_estimate)
        else:
            out["sampler"] = dict(
                _sampler_settings(N, quick),
                max_events=grown.max_events,
                max_virtual=grown.max_virtual,
                max_node_events=grown.max_node_events,
            )
        out["min_effective_sample_size"] = float(np.min(np.asarray(fit.effective_sample_size)))
        out["infeasible_updates"] = fit.infeasible_updates
    return out


def main():
    from _common import argument_parser, environment, measure_process, write_results

    ap = argument_parser(__doc__)
    ap.add_argument("--sizes", default="6,20,50")
    ap.add_argument(
        "--exact-up-to",
        type=int,
        default=6,
        help="largest N for exact inference (N = 8 ran over 7 min at 12 GB RSS; N = 10 asks "
        "for 181 GB)",
    )
    ap.add_argument(
        "--sampling-up-to",
        type=int,
        default=50,
        help="largest N for the sampled E-step (N = 50 took 400 s)",
    )
    ap.add_argument(
        "--importance-up-to",
        type=int,
        default=50,
        help="largest N for the importance-sampling E-step (its effective sample size falls "
        "with N)",
    )
    ap.add_common(quick=True)
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    ap.add_common(name="panel_sampling")
    ap.add_argument("--worker", nargs=2, metavar=("N", "INFERENCE"))
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(int(args.worker[0]), args.worker[1], args.quick)))
        return
    import subprocess

    records = []
    for N in (int(x) for x in args.sizes.split(",")):
        routes = (["exact"] if N <= args.exact_up_to else []) + ["mean-field"]
        routes += ["sampling"] if N <= args.sampling_up_to else []
        routes += ["importance"] if N <= args.importance_up_to else []
        for inference in routes:
            cmd = [sys.executable, __file__, "--worker", str(N), inference]
            cmd += ["--quick"] if args.quick else []
            try:
                rec = measure_process(cmd, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                out = {"nodes": N, "inference": inference, "timeout_s": args.timeout}
                records.append(out)
                print(json.dumps(out), flush=True)
                continue
            except subprocess.CalledProcessError as err:
                lines = (err.stderr or "").strip().splitlines()
                reason = [ln.strip() for ln in lines if "Error" in ln][-1:] or lines[-1:]
                out = {"nodes": N, "inference": inference, "error": reason}
                records.append(out)
                print(json.dumps(out), flush=True)
                continue
            out = json.loads(rec["stdout"].strip().splitlines()[-1])
            out["peak_rss_bytes"] = rec["peak_rss_bytes"]
            out["process_s"] = rec["wall_s"]
            records.append(out)
            print(json.dumps(out), flush=True)
    lines = [
        "# Structure learning from panel data: sampled and mean-field against exact inference",
        "",
        f"Binary nodes, random graphs (0-2 parents per node), trajectories seen at {VISITS} "
        f"visits on [0, {DURATION:g}]; structural EM with in-degree 2, the sparse edge prior "
        "1/N, from the empty graph. exact: forward-backward over the 2^N joint states, run "
        f"up to N = {args.exact_up_to} (--exact-up-to); "
        "sampling: auxiliary-variable Gibbs sampling of paths (samples / burn-in sweeps per "
        "E-step, and the buffers at the end: jumps per path / per node / virtual times per "
        "update, as listed; each node update works on its Markov blanket's paths), stopping at "
        "the third E-step, with the MAP graph unchanged, whose evidence did not rise (the "
        "default patience); mean-field: a product of node processes fitted to each "
        "trajectory's observations (8 steps per gap), stopping like exact with its evidence "
        "lower bound (shown) in place of the log-likelihood; importance: paths drawn from the "
        "mean-field posterior and weighted towards the exact one (samples per trajectory; "
        "buffers: jumps per path / per node / uniformisation times per node and step), "
        "resampled for the statistics, stopping like sampling; its ESS is that of the weights "
        "(smallest and median over the trajectories) and ~L its last E-step's estimate of the "
        "log-likelihood. Time: the "
        "whole fit with its compilations; peak RSS of the process.",
        "",
        "| N | inference | trajectories | sampler | time | E-steps | converged | "
        "SHD (missing + extra) | AUROC | min ESS | log-likelihood (bound) | peak RSS |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if "error" in r:
            why = " ".join(r["error"])[:160].replace("|", "/")
            lines.append(f"| {r['nodes']} | {r['inference']} | | | failed: {why} | | | | | | | |")
            continue
        if "timeout_s" in r:
            lines.append(
                f"| {r['nodes']} | {r['inference']} | | | timed out ({r['timeout_s']:.0f} s) "
                "| | | | | | | |"
            )
            continue
        s = r.get("sampler")
        sampler, ess = "", ""
        if s and r["inference"] == "importance":
            sampler = (
                f"{s['num_samples']}; {s['max_events']} / {s['max_node_events']} / "
                f"{s['max_candidates']}"
            )
            ess = (
                f"{r['min_effective_sample_size']:.1f} (median "
                f"{r['median_effective_sample_size']:.1f})"
            )
        elif s:
            sampler = (
                f"{s['num_samples']} / {s['burn_in']}; {s['max_events']} / "
                f"{s.get('max_node_events', '-')} / {s['max_virtual']}"
            )
            ess = f"{r['min_effective_sample_size']:.1f}"
        value = ""
        if r.get("log_likelihood") is not None:
            value = f"{r['log_likelihood']:.1f}"
        elif r.get("evidence_lower_bound") is not None:
            value = f"({r['evidence_lower_bound']:.1f})"
        elif r.get("log_likelihood_estimate") is not None:
            value = f"~{r['log_likelihood_estimate']:.1f}"
        lines.append(
            f"| {r['nodes']} | {r['inference']} | {r['trajectories']} | {sampler} | "
            f"{r['seconds']:.1f} s | {r['e_steps']} | {r['converged']} | "
            f"{r['shd']} ({r['missing']} + {r['extra']}) | {r['auroc']:.3f} | {ess} | {value} | "
            f"{r['peak_rss_bytes'] / 2**20:.0f} MiB |"
        )
    write_results(args.name, {"environment": environment(), "records": records}, lines)


if __name__ == "__main__":
    main()
