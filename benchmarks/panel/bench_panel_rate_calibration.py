"""Simulation-based calibration of the sampled panel rate posterior (`SampledGammaMixture`).

Truths drawn from the prior (one binary node, Gam(2, 1) on both rates), each a data set of
`subjects` subjects seen at `visits` equally spaced times `gap` apart; the posterior of each data
set (all data sets of a chunk in one vmapped program, chains vmapped inside); per data set and
rate, the rank of the truth among `ranks` posterior draws (uniform on 0..ranks when the
posterior is calibrated) and whether its central 95% interval holds the truth (95% of the time).
Reported beside the moment-matched Gamma on the same data sets.

    python benchmarks/panel/bench_panel_rate_calibration.py [--datasets 200] [--chunk 25]
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import argument_parser, environment, stopwatch, write_results

import jaxctbn as jc
from jaxctbn._panel.gap_groups import gap_groups

jax.config.update("jax_enable_x64", True)

PRIOR = (2.0, 1.0)


def main():
    parser = argument_parser(__doc__)
    parser.add_argument("--datasets", type=int, default=200)
    parser.add_common(chunk=25)
    parser.add_argument("--subjects", type=int, default=20)
    parser.add_argument("--visits", type=int, default=5)
    parser.add_argument("--gap", type=float, default=0.5)
    parser.add_argument("--ranks", type=int, default=99)
    parser.add_argument("--draws", type=int, default=500)
    parser.add_common(name="panel_rate_calibration")
    args = parser.parse_args()
    family = jc.panel.SampledGammaMixture(num_draws=args.draws)
    moment = jc.panel.MomentMatchedGamma()
    shell = jc.CTBN(cims=[jnp.array([[[-1.0, 1.0], [1.0, -1.0]]])], parents=((),), names=("A",))
    prior = jc.RatePosterior.for_model(shell, prior=jc.GammaPrior(*PRIOR))
    grid = args.gap * np.arange(args.visits)
    R = args.subjects

    def data_set(key):
        key_rates, key_starts, key_paths = jax.random.split(key, 3)
        rates = jax.random.gamma(key_rates, PRIOR[0], (2,)) / PRIOR[1]
        model = jc.CTBN(
            cims=[jnp.array([[[-rates[0], rates[0]], [rates[1], -rates[1]]]])],
            parents=((),),
            names=("A",),
        )
        starts = jax.random.bernoulli(key_starts, 0.5, (R, 1)).astype(jnp.int32)
        paths = jc.sample_trajectories(
            model, starts, grid[-1], key=key_paths, num_trajectories=R, max_events=512
        )
        return rates, jc.panel.PanelObservations.from_paths(paths, jnp.asarray(grid))

    # every data set has the same visits: one gap grouping serves them all
    groups = gap_groups(
        jc.panel.PanelObservations(
            np.broadcast_to(grid, (R, len(grid))), np.zeros((R, len(grid), 1), int)
        )
    )

    @jax.jit
    def chunk(keys):
        def posterior(key):
            rates, observations = data_set(key)
            key_post, key_rank = jax.random.split(jax.random.fold_in(key, 1))
            mixture = family.posterior(prior, observations, None, key_post, groups)
            draws = jax.vmap(mixture.sample)(jax.random.split(key_rank, args.ranks))
            sampled = draws.cims[0][:, 0, [0, 1], [1, 0]]
            q = mixture.rate_quantiles(jnp.array([0.025, 0.975]))[0][:, 0, [0, 1], [1, 0]]
            gamma = moment.posterior(prior, observations, None, None)
            a = gamma.alpha[0][0, [0, 1], [1, 0]]
            b = gamma.beta[0][0]
            d = mixture.diagnostics
            return (
                rates,
                (sampled < rates).sum(0),
                q,
                a,
                b,
                d.max_split_r_hat(),
                d.min_effective_sample_size(),
                d.divergent_transitions,
            )

        return jax.vmap(posterior)(keys)

    keys = jax.random.split(jax.random.key(0), args.datasets)
    out = []
    sw = stopwatch()
    for start in range(0, args.datasets, args.chunk):
        out.append(jax.device_get(chunk(keys[start : start + args.chunk])))
        print(f"{start + args.chunk} data sets, {sw.elapsed:.0f} s", flush=True)
    seconds = sw.elapsed
    rates, ranks, q, a, b, r_hat, ess, divergent = (
        np.concatenate([np.asarray(o[i]) for o in out]) for i in range(8)
    )
    covered = (q[:, 0] <= rates) & (rates <= q[:, 1])
    m_lo = scipy.stats.gamma.ppf(0.025, a, scale=1 / b)
    m_hi = scipy.stats.gamma.ppf(0.975, a, scale=1 / b)
    m_covered = (m_lo <= rates) & (rates <= m_hi)
    m_ranks = scipy.stats.gamma.cdf(rates, a, scale=1 / b)  # the truth's quantile
    n = rates.size
    # rank uniformity: chi-square over 10 equal bins of the rank (0..ranks) or quantile
    bins = np.minimum((ranks / (args.ranks + 1) * 10).astype(int), 9).reshape(-1)
    chi2 = scipy.stats.chisquare(np.bincount(bins, minlength=10))
    m_bins = np.minimum((m_ranks * 10).astype(int), 9).reshape(-1)
    m_chi2 = scipy.stats.chisquare(np.bincount(m_bins, minlength=10))
    rows = {
        "datasets": args.datasets,
        "intervals": int(n),
        "sampled_coverage_95": float(covered.mean()),
        "sampled_rank_histogram": np.bincount(bins, minlength=10).tolist(),
        "sampled_rank_chi2_p": float(chi2.pvalue),
        "moment_coverage_95": float(m_covered.mean()),
        "moment_rank_histogram": np.bincount(m_bins, minlength=10).tolist(),
        "moment_rank_chi2_p": float(m_chi2.pvalue),
        "max_split_r_hat": float(r_hat.max()),
        "median_min_ess": float(np.median(ess)),
        "data_sets_with_divergences": int((divergent > 0).sum()),
        "seconds": seconds,
    }
    se = np.sqrt(0.95 * 0.05 / n)
    lines = [
        f"# Simulation-based calibration of the panel rate posterior ({args.datasets} data sets "
        f"from the Gam(2, 1) prior; {R} subjects, {args.visits} visits {args.gap} apart)",
        "",
        f"`python benchmarks/panel/bench_panel_rate_calibration.py --datasets {args.datasets}`",
        "",
        "| posterior | 95% intervals covering the truth | rank histogram (10 bins) | chi-square p |",
        "|---|---|---|---|",
        f"| sampled mixture | {covered.mean():.3f} (± {se:.3f}) | {rows['sampled_rank_histogram']} "
        f"| {chi2.pvalue:.3f} |",
        f"| moment-matched Gamma | {m_covered.mean():.3f} | {rows['moment_rank_histogram']} | "
        f"{m_chi2.pvalue:.2g} |",
        "",
        f"Chains: largest split R-hat {r_hat.max():.3f}, median of the smallest ESS "
        f"{np.median(ess):.0f}, {rows['data_sets_with_divergences']} data sets with a divergent "
        f"transition; {seconds:.0f} s for all data sets (with compilation).",
    ]
    write_results(args.name, {"environment": environment(), "args": vars(args), **rows}, lines)


if __name__ == "__main__":
    main()
