"""Panel rate posteriors against the exact posterior: the sampled mixture of Gammas
(`SampledGammaMixture`, the default) and the moment-matched Gamma (`MomentMatchedGamma`) beside
the exact posterior by quadrature, side by side in one run.

One binary node (rates 0.8 and 1.5, mixing time 1 / 2.3 = 0.43), Gamma(1, 1) priors, panels of
`subjects` subjects seen at equal spacings of 0.2 to 2 mixing times over a fixed number of
visits; per case and rate: the posterior mean and s.d. against the exact ones (a 600 x 600
quadrature grid over the two log-rates, numpy), the exact posterior mass inside each method's
central 95% interval, the chains' diagnostics and the wall time of each method (with its
compilation: the first call of a case shape compiles).

    python benchmarks/panel/bench_panel_rate_posterior.py [--subjects 40] [--visits 6] [--repeats 3]
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

jax.config.update("jax_enable_x64", True)

RATES = (0.8, 1.5)
TRUTH = jc.CTBN(
    cims=[jnp.array([[[-RATES[0], RATES[0]], [RATES[1], -RATES[1]]]])],
    parents=((),),
    names=("A",),
)
MIXING_TIME = 1 / sum(RATES)


def exact_posterior(states, grid, alpha, beta, size=600):
    lam = np.exp(np.linspace(np.log(1e-3), np.log(40.0), size))
    a, b = np.meshgrid(lam, lam, indexing="ij")
    s = a + b
    log_w = scipy.stats.gamma.logpdf(a, alpha, scale=1 / beta)
    log_w += scipy.stats.gamma.logpdf(b, alpha, scale=1 / beta) + np.log(a) + np.log(b)
    for row in states:
        for h, x0, x1 in zip(np.diff(grid), row[:-1], row[1:]):
            leave = (a if x0 == 0 else b) / s * (1 - np.exp(-s * h))
            log_w += np.log(leave if x1 != x0 else 1 - leave)
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    marginals = (w.sum(1), w.sum(0))
    means = np.array([m @ lam for m in marginals])
    sds = np.sqrt(np.array([m @ (lam - mu) ** 2 for m, mu in zip(marginals, means)]))
    return lam, marginals, means, sds


def mass_inside(lam, marginal, lo, hi):
    return float(marginal[(lam >= lo) & (lam <= hi)].sum())


def main():
    parser = argument_parser(__doc__)
    parser.add_argument("--subjects", type=int, default=40)
    parser.add_argument("--visits", type=int, default=6)
    parser.add_argument("--spacings", default="0.2,0.5,1,2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--draws", type=int, default=500)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_common(name="panel_rate_posterior")
    args = parser.parse_args()
    family = jc.panel.SampledGammaMixture(num_draws=args.draws, num_chains=args.chains)
    moment = jc.panel.MomentMatchedGamma()
    prior = jc.RatePosterior.for_model(TRUTH, prior=jc.GammaPrior(1.0, 1.0))
    rows, lines = [], []
    lines.append(
        "| spacing (mixing times) | rep | rate | exact mean | exact s.d. | sampled mean | "
        "sampled s.d. / exact | exact mass in sampled 95% | moment mean | moment s.d. / exact "
        "| exact mass in moment 95% | max split R-hat | min ESS | sampled time | moment time |"
    )
    lines.append("|" + "---|" * 15)
    for spacing in (float(x) for x in args.spacings.split(",")):
        gap = spacing * MIXING_TIME
        grid = gap * np.arange(args.visits)
        for rep in range(args.repeats):
            key = jax.random.key(1000 * rep + int(100 * spacing))
            paths = jc.sample_trajectories(
                TRUTH,
                jnp.zeros((args.subjects, 1), jnp.int32),
                grid[-1],
                key=key,
                num_trajectories=args.subjects,
            )
            observations = jc.panel.PanelObservations.from_paths(paths, jnp.asarray(grid))
            states = np.asarray(observations.states)[..., 0]
            lam, marginals, means, sds = exact_posterior(states, grid, 1.0, 1.0)
            with stopwatch() as sw:
                mixture = jc.panel.panel_rate_posterior(
                    prior, observations, family=family, key=jax.random.fold_in(key, 1)
                )
                jax.block_until_ready(mixture)
            t_sampled = sw.seconds
            with stopwatch() as sw:
                gamma = jc.panel.panel_rate_posterior(prior, observations, family=moment)
                jax.block_until_ready(gamma)
            t_moment = sw.seconds
            index = ([0, 1], [1, 0])
            s_mean = np.asarray(mixture.rate_means()[0])[0][index]
            s_sd = np.asarray(mixture.rate_sds()[0])[0][index]
            lo, hi = (
                np.asarray(q)[0][index]
                for q in mixture.rate_quantiles(jnp.array([0.025, 0.975]))[0]
            )
            a = np.asarray(gamma.alpha[0])[0][index]
            b = np.asarray(gamma.beta[0])[0]
            m_lo = scipy.stats.gamma.ppf(0.025, a, scale=1 / b)
            m_hi = scipy.stats.gamma.ppf(0.975, a, scale=1 / b)
            assert mixture.diagnostics is not None
            r_hat = float(mixture.diagnostics.max_split_r_hat())
            ess = float(mixture.diagnostics.min_effective_sample_size())
            for i in range(2):
                row = dict(
                    spacing=spacing,
                    repeat=rep,
                    rate=["0->1", "1->0"][i],
                    exact_mean=means[i],
                    exact_sd=sds[i],
                    sampled_mean=s_mean[i],
                    sampled_sd_ratio=s_sd[i] / sds[i],
                    sampled_mass_95=mass_inside(lam, marginals[i], lo[i], hi[i]),
                    moment_mean=a[i] / b[i],
                    moment_sd_ratio=np.sqrt(a[i]) / b[i] / sds[i],
                    moment_mass_95=mass_inside(lam, marginals[i], m_lo[i], m_hi[i]),
                    max_split_r_hat=r_hat,
                    min_ess=ess,
                    sampled_seconds=t_sampled,
                    moment_seconds=t_moment,
                )
                rows.append(
                    {k: (float(v) if isinstance(v, np.floating) else v) for k, v in row.items()}
                )
                lines.append(
                    f"| {spacing:g} | {rep} | {row['rate']} | {means[i]:.3f} | {sds[i]:.3f} | "
                    f"{s_mean[i]:.3f} | {row['sampled_sd_ratio']:.2f} | "
                    f"{row['sampled_mass_95']:.3f} | {row['moment_mean']:.3f} | "
                    f"{row['moment_sd_ratio']:.2f} | {row['moment_mass_95']:.3f} | {r_hat:.3f} | "
                    f"{ess:.0f} | {t_sampled:.1f} s | {t_moment:.2f} s |"
                )
            print(lines[-2], lines[-1], sep="\n", flush=True)
    ratios = np.array([r["sampled_sd_ratio"] for r in rows])
    masses = np.array([r["sampled_mass_95"] for r in rows])
    m_ratios = np.array([r["moment_sd_ratio"] for r in rows])
    m_masses = np.array([r["moment_mass_95"] for r in rows])
    summary = [
        "",
        f"Sampled mixture: s.d. / exact {ratios.min():.2f}-{ratios.max():.2f} (target 0.85-1.15), "
        f"exact mass in its 95% interval {masses.min():.3f}-{masses.max():.3f} (target 0.92-0.98).",
        f"Moment-matched Gamma: s.d. / exact {m_ratios.min():.2f}-{m_ratios.max():.2f}, exact mass "
        f"in its 95% interval {m_masses.min():.3f}-{m_masses.max():.3f}.",
    ]
    print("\n".join(summary))
    header = [
        f"# Panel rate posteriors against the exact posterior ({args.subjects} subjects, "
        f"{args.visits} visits, Gamma(1, 1) priors; {args.chains} chains x {args.draws} draws)",
        "",
        "`python benchmarks/panel/bench_panel_rate_posterior.py "
        f"--subjects {args.subjects} --visits {args.visits} --repeats {args.repeats}`",
        "",
    ]
    write_results(
        args.name,
        {"environment": environment(), "args": vars(args), "rows": rows},
        header + lines + summary,
    )


if __name__ == "__main__":
    main()
