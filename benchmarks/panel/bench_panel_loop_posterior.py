"""The sequential loop's posterior with panel outcomes: is it calibrated, and what does it cost?

`ParameterLearningTask(truth, outcome=Panel(times))` updates its posterior after every
experiment from that experiment's panel alone. Two families:

- `ParticleFilter(P)` (the default since issue 60): sequential Monte Carlo over the hidden
  paths (Storvik's filter), a mixture of P Gamma components, exact as P grows;
- `MomentMatchedGamma(10)` (the former default): an assumed-density filter, the Gamma of the
  smoothed expected statistics.

**Calibration (simulation-based).** The paper's parameter network's graph (4 binary nodes,
18 rates); in each repetition the truth's rates are drawn from the Gamma(1, 1) prior, so that a
calibrated posterior puts the truth at a uniform quantile: the probability integral transform
u = F_post(truth) of every rate is uniform on (0, 1) and central 95% intervals cover 95% of the
truths. Each repetition runs E experiments of tau = 3 seen at K = 3 visits (t = 1, 2, 3), random
interventions among the 81 and random revealed initial states (the design does not matter for
calibration; it is cheap). Reported per family: the coverage of the central 50% and 95%
intervals over all rates and repetitions (with a 95% binomial interval), the
Kolmogorov-Smirnov distance of the u's from uniform, the mean posterior s.d., and the mean
squared error of the posterior mean.

**Cost.** A loop step (design + update) with the panel-aware BHC (N_S = 10, the 81
candidates, K = 3 given visits), batched over `--cost-repetitions` repetitions (one compiled
call, timed after compilation), per family; the ratio to the moment-matched step (target of
issue 60: within 10x).

Run: `python benchmarks/panel/bench_panel_loop_posterior.py [--repetitions R] [--experiments E]
[--particles P] [--cost-repetitions C] [--quick]`; writes
`results/panel_loop_posterior.{json,md}` (`--quick`: 20 repetitions x 3 experiments, to
`results/panel_loop_posterior_quick.*`).
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special
import scipy.stats

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import (  # noqa: E402
    argument_parser,
    environment,
    repeat_time,
    stopwatch,
    write_results,
)

TAU = 3.0
TIMES = np.array([1.0, 2.0, 3.0])
MAX_EVENTS = 512


def families(particles):
    return {
        "particle-filter": jc.panel.ParticleFilter(num_particles=particles),
        "moment-matched": jc.panel.MomentMatchedGamma(10),
    }


def posterior_tables(posterior):
    """Per node, the (weights, alpha, beta) of the posterior as a mixture (a Gamma: one
    component), numpy, with a leading repetition axis."""
    if isinstance(posterior, jc.GammaMixturePosterior):
        w = np.exp(np.asarray(posterior.log_weights))
        return [(w, np.asarray(a), np.asarray(b)) for a, b in zip(posterior.alpha, posterior.beta)]
    out = []
    for a, b in zip(posterior.alpha, posterior.beta):
        a, b = np.asarray(a), np.asarray(b)
        out.append((np.ones(a.shape[:1] + (1,)), a[:, None], b[:, None]))
    return out


def calibration(posterior, truths):
    """The PIT values, posterior s.d.s and squared errors of the posterior mean of every
    off-diagonal rate of every repetition."""
    pit, sds, errors = [], [], []
    for (w, a, b), q in zip(posterior_tables(posterior), truths):
        k = a.shape[-1]
        off = ~np.eye(k, dtype=bool)
        q = np.asarray(q)  # (R, configs, k, k)
        b = b[..., None]  # (R, C, configs, k, 1)
        ww = w.reshape(w.shape + (1,) * (a.ndim - 2))
        cdf = (ww * scipy.special.gammainc(np.where(off, a, 1.0), b * q[:, None])).sum(1)
        mean = (ww * a / b).sum(1)
        second = (ww * a * (a + 1) / b**2).sum(1)
        sel = np.broadcast_to(off, cdf.shape)
        pit.append(cdf[sel])
        sds.append(np.sqrt(np.maximum(second - mean**2, 0))[sel])
        errors.append(((mean - q) ** 2)[sel])
    return np.concatenate(pit), np.concatenate(sds), np.concatenate(errors)


def coverage(pit, level):
    inside = np.abs(pit - 0.5) < level / 2
    n = inside.size
    p = inside.mean()
    lo, hi = scipy.stats.binomtest(int(inside.sum()), n).proportion_ci(0.95)
    return float(p), [float(lo), float(hi)]


def main():
    ap = argument_parser(__doc__, repetitions=200, experiments=10)
    ap.add_argument("--particles", type=int, default=256)
    ap.add_argument("--cost-repetitions", type=int, default=100)
    ap.add_common(chunk=50, seed=0, quick=True)
    args = ap.parse_args()
    R, E, C = args.repetitions, args.experiments, args.cost_repetitions
    if args.quick:
        R, E, C = 20, 3, 10
    name = "panel_loop_posterior" + ("_quick" if args.quick else "")
    graph = jc.paper_network(jax.random.key(0), rates="softmax")
    space = jc.intervention_space(graph.cardinalities)
    panel = jc.PanelOutcome(TIMES)
    prior = jc.GammaPrior(1.0, 1.0)
    base = jax.random.key(args.seed)

    def truth_of(key):
        """Rates drawn from the prior on the paper network's graph."""
        return jc.RatePosterior.for_model(graph, prior=prior).sample(key)

    results, timing = {}, {}
    for label, family in families(args.particles).items():

        def one(key, family=family):
            key_truth, key_run = jax.random.split(key)
            truth = truth_of(key_truth)
            task = jc.ParameterLearningTask(
                truth, prior=prior, outcome=panel, panel_posterior=family
            )
            res = jc.run_active_learning(
                task,
                jc.RandomDesign(),
                key=key_run,
                num_experiments=E,
                horizon=TAU,
                candidates=space,
                max_events=MAX_EVENTS,
            )
            return res.posterior, truth.cims

        run = jax.jit(jax.vmap(one))
        sw = stopwatch()
        parts = []
        for start in range(0, R, args.chunk):
            keys = jax.vmap(lambda r: jax.random.fold_in(base, r))(
                jnp.arange(start, min(R, start + args.chunk))
            )
            posterior, truths = jax.device_get(run(keys))
            parts.append(calibration(posterior, truths))
            print(f"  {label}: {min(R, start + args.chunk)}/{R}", flush=True)
        pit, sds, errors = (np.concatenate(x) for x in zip(*parts))
        results[label] = {
            "coverage_50": coverage(pit, 0.5),
            "coverage_95": coverage(pit, 0.95),
            "ks_distance": float(scipy.stats.kstest(pit, "uniform").statistic),
            "ks_p_value": float(scipy.stats.kstest(pit, "uniform").pvalue),
            "mean_sd": float(sds.mean()),
            "mse_of_mean": float(errors.mean()),
            "rates": int(pit.size),
            "seconds": sw.elapsed,
        }
        print(label, results[label], flush=True)

        # the cost of a loop step with the panel-aware BHC, batched over C repetitions
        truth = graph
        task = jc.ParameterLearningTask(truth, prior=prior, outcome=panel, panel_posterior=family)
        design = jc.CriterionDesign(jc.BHC(), num_samples=10, outcome=panel)
        keys = jax.vmap(lambda r: jax.random.fold_in(base, 10_000 + r))(jnp.arange(C))
        steps = 3
        call = jax.jit(
            lambda ks, task=task: jc.run_repetitions(
                task, design, ks, num_experiments=steps, horizon=TAU, candidates=space,
                max_events=MAX_EVENTS,
            ).metrics["mse"]
        )  # fmt: skip
        # the first call (with compilation), then the best of three
        _, calls = repeat_time(call, keys, repeats=1 + 3)
        first, best = calls.times[0], min(calls.times[1:])
        timing[label] = {
            "step_seconds": best / steps,
            "first_call_seconds": first,
            "repetitions": C,
        }
        print(label, timing[label], flush=True)
    ratio = timing["particle-filter"]["step_seconds"] / timing["moment-matched"]["step_seconds"]
    settings = {
        "graph": "paper_network(key(0), rates='softmax') (its graph; rates drawn per repetition)",
        "prior": "GammaPrior(1, 1), the truths' law",
        "visit_times": TIMES.tolist(),
        "horizon": TAU,
        "design": "random (calibration); panel-aware BHC, N_S = 10 (cost)",
        "repetitions": R,
        "experiments": E,
        "particles": args.particles,
        "cost_repetitions": C,
        "seed": args.seed,
        "command": "python benchmarks/panel/bench_panel_loop_posterior.py"
        + "".join(" " + a for a in sys.argv[1:]),
    }
    payload = {
        "environment": environment(),
        "settings": settings,
        "calibration": results,
        "cost": timing,
        "step_ratio": ratio,
    }
    lines = [
        "# The sequential loop's posterior with panel outcomes: calibration and cost",
        "",
        f"The paper network's graph (4 binary nodes, 18 rates), truths drawn from the "
        f"Gamma(1, 1) prior per repetition; {R} repetitions x {E} experiments of tau = 3 seen "
        f"at t = 1, 2, 3, random interventions and revealed initial states. A calibrated "
        "posterior covers 50% / 95% of the truths with its central 50% / 95% intervals and has "
        "uniform PIT values (KS distance ~0). Command: "
        f"`{settings['command']}`.",
        "",
        "| posterior | 50% interval covers | 95% interval covers | KS distance (p) | mean s.d. "
        "| MSE of the mean |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, r in results.items():
        c50, c95 = r["coverage_50"], r["coverage_95"]
        lines.append(
            f"| {label} | {100 * c50[0]:.1f}% [{100 * c50[1][0]:.1f}, {100 * c50[1][1]:.1f}] "
            f"| {100 * c95[0]:.1f}% [{100 * c95[1][0]:.1f}, {100 * c95[1][1]:.1f}] "
            f"| {r['ks_distance']:.3f} ({r['ks_p_value']:.2g}) | {r['mean_sd']:.3f} "
            f"| {r['mse_of_mean']:.3f} |"
        )
    lines += [
        "",
        f"Cost of one loop step (panel-aware BHC design + update), {C} repetitions in one "
        "compiled call, best of 3 after compilation:",
        "",
        "| posterior | seconds per step (all repetitions) | first call (compile + run) |",
        "|---|---:|---:|",
    ]
    for label, t in timing.items():
        lines.append(f"| {label} | {t['step_seconds']:.3f} | {t['first_call_seconds']:.1f} |")
    lines += ["", f"Particle filter / moment-matched step: {ratio:.2f}x."]
    write_results(name, payload, lines)


if __name__ == "__main__":
    main()
