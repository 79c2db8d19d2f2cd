"""`fit --observation panel --posterior`'s sampled rate posterior against Stan's NUTS on the same
model, side by side on msm's cav data (622 heart-transplant recipients, 2846 visits, 4 states,
death entered at exact times; msm's two-way illness-death generator, 8 free intensities).

R's msmbayes (Stan NUTS on the log-intensities with the panel likelihood by matrix
exponentials) is the peer users would compare with; it does not install here (it needs Stan >=
2.26 syntax, rstantools >= 2.4 and tidybayes; Debian ships rstan 2.21 and no tidybayes, and CRAN
is not reachable). The same computation is run with PyStan instead, as an external program in
its own virtual environment: `benchmarks/stan/panel_markov.stan` (written for this benchmark)
is msm's model with a Gamma(alpha, beta) prior on each free intensity and the likelihood
conditional on each subject's first visit, exact death times as msm's `deathexact`, sampled
with Stan's defaults (4 chains, 1,000 warm-up and 1,000 retained draws per chain).

jaxctbn: the route of `jaxctbn fit --posterior` (`SampledGammaMixture(num_draws=1000,
num_chains=4)`: NUTS on the log-rates with the exact forward-filter likelihood, each draw
Rao-Blackwellised by an exact path draw into a mixture of Gammas), same data, prior, structural
zeros. Reported per intensity: both posterior means and standard deviations, the z-score of the
difference of the means (Monte Carlo standard errors from each side's effective sample size),
the ratio of the standard deviations and both 95% intervals; the time of each (jaxctbn's first
call with compilation and a second call; Stan's compilation and sampling).

    python -m venv .stanenv && .stanenv/bin/pip install pystan
    python benchmarks/panel/bench_panel_posterior_stan.py [--stan-python .stanenv/bin/python]

Needs Rscript with msm for the data (`apt-get install r-cran-msm`). Writes
`results/panel_posterior_stan.{json,md}`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import jax
import numpy as np
import pandas as pd

jax.config.update("jax_enable_x64", True)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import BENCHMARKS, STAN_DIR, argument_parser, stopwatch, write_results  # noqa: E402
from bench_msm import CAV_Q0, DATA_DIR, export_msm_data, panel_from_long, single_node  # noqa: E402

import jaxctbn as jc  # noqa: E402
from jaxctbn._learning.chain_diagnostics import effective_sample_size, split_r_hat  # noqa: E402


def stan_data(df, free, alpha, beta):
    """The intervals of every subject (from, to, gap, exact entry) and the free intensities."""
    rows, cols = np.nonzero(free)
    dt, frm, to, exact = [], [], [], []
    for _, g in df.groupby("PTNUM", sort=False):
        g = g.sort_values("years", kind="stable")
        s, t = g.state.to_numpy(int), g.years.to_numpy(float)
        for i in range(1, len(s)):
            dt.append(t[i] - t[i - 1])
            frm.append(int(s[i - 1]))
            to.append(int(s[i]))
            exact.append(int(s[i] == 4))
    N = len(dt)
    return {
        "K": 4,
        "P": len(rows),
        "qrow": (rows + 1).tolist(),
        "qcol": (cols + 1).tolist(),
        "N": N,
        "dt": dt,
        "from": frm,
        "to": to,
        "exact": exact,
        "alpha": alpha,
        "beta": beta,
    }


def summary(draws):
    """Per column of `draws` (chains, draws, P): mean, sd, 2.5% and 97.5% quantiles, ESS,
    split R-hat (of the log-draws, as jaxctbn's diagnostics)."""
    flat = draws.reshape(-1, draws.shape[-1])
    logs = np.log(draws)
    return {
        "mean": flat.mean(0),
        "sd": flat.std(0, ddof=1),
        "lo": np.quantile(flat, 0.025, axis=0),
        "hi": np.quantile(flat, 0.975, axis=0),
        "ess": np.asarray(effective_sample_size(logs)),
        "r_hat": np.asarray(split_r_hat(logs)),
    }


def main():
    parser = argument_parser(__doc__)
    parser.add_argument(
        "--stan-python", default=os.path.join(BENCHMARKS, "..", ".stanenv/bin/python")
    )
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_common(seed=0)
    parser.add_argument(
        "--calls", type=int, default=2, help="timed jaxctbn calls (the first compiles)"
    )
    args = parser.parse_args()
    if not os.path.exists(os.path.join(DATA_DIR, "cav.csv")):
        export_msm_data()
    cav = pd.read_csv(os.path.join(DATA_DIR, "cav.csv"))
    observations = panel_from_long(cav, "PTNUM", "years", "state", deathexact=[4], bucketed=True)
    Q0 = np.array(CAV_Q0)
    free = Q0 > 0
    model = single_node(Q0)
    rows, cols = np.nonzero(free)
    labels = [f"{r + 1}->{c + 1}" for r, c in zip(rows, cols)]

    # jaxctbn: fit --posterior's route (the trajectories in buckets by length, as it reads them)
    prior = jc.RatePosterior.for_model(model, prior=jc.GammaPrior(args.alpha, args.beta))
    start = jc.GammaMixturePosterior.from_gamma(prior, free=[free[None]])
    family = jc.panel.SampledGammaMixture(num_draws=args.draws, num_chains=args.chains)
    times = []
    for _ in range(args.calls):
        with stopwatch() as sw:
            mixture = jc.panel.panel_rate_posterior(
                start, observations, family=family, key=jax.random.key(args.seed)
            )
            jax.block_until_ready(mixture)
        times.append(sw.seconds)
        print(f"jaxctbn call {len(times)}: {times[-1]:.1f} s", flush=True)
    d = mixture.diagnostics
    assert d is not None
    ours_draws = np.asarray(d.rate_draws[0])[:, :, 0][:, :, rows, cols]  # (chains, draws, P)
    ours = summary(ours_draws)
    # the mixture's own (Rao-Blackwellised) moments, what fit --posterior reports
    ours["mixture_mean"] = np.asarray(mixture.rate_means()[0])[0][rows, cols]
    ours["mixture_sd"] = np.asarray(mixture.rate_sds()[0])[0][rows, cols]
    print("jaxctbn means", ours["mixture_mean"].round(4), "sds", ours["mixture_sd"].round(4))
    print("r-hat", float(d.max_split_r_hat()), "ess", float(d.min_effective_sample_size()))
    print(flush=True)

    # Stan, an external program
    with tempfile.TemporaryDirectory() as work:
        data_path, out_path = os.path.join(work, "data.json"), os.path.join(work, "out.json")
        with open(data_path, "w") as f:
            json.dump(stan_data(cav, free, args.alpha, args.beta), f)
        with stopwatch() as sw:
            cmd = [args.stan_python, os.path.join(STAN_DIR, "run_stan.py"), data_path, out_path]
            cmd += [str(v) for v in (args.chains, args.warmup, args.draws, args.seed)]
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        stan_wall = sw.seconds
        with open(out_path) as f:
            stan_out = json.load(f)
    stan_draws = np.asarray(stan_out["q"])  # (chains, draws, P)
    theirs = summary(stan_draws)

    se = np.sqrt(ours["sd"] ** 2 / ours["ess"] + theirs["sd"] ** 2 / theirs["ess"])
    z = (ours["mixture_mean"] - theirs["mean"]) / se
    ratio = ours["mixture_sd"] / theirs["sd"]
    per_rate = [
        {
            "rate": lab,
            "jaxctbn_mean": float(ours["mixture_mean"][p]),
            "jaxctbn_sd": float(ours["mixture_sd"][p]),
            "jaxctbn_ci95": [float(ours["lo"][p]), float(ours["hi"][p])],
            "jaxctbn_ess": float(ours["ess"][p]),
            "stan_mean": float(theirs["mean"][p]),
            "stan_sd": float(theirs["sd"][p]),
            "stan_ci95": [float(theirs["lo"][p]), float(theirs["hi"][p])],
            "stan_ess": float(theirs["ess"][p]),
            "z_means": float(z[p]),
            "sd_ratio": float(ratio[p]),
        }
        for p, lab in enumerate(labels)
    ]
    payload = {
        "data": "msm cav (622 subjects, 2846 rows), two-way illness-death, death exact",
        "prior": {"alpha": args.alpha, "beta": args.beta},
        "settings": vars(args),
        "rates": per_rate,
        "jaxctbn": {
            "first_call_s": times[0],
            "second_call_s": times[1] if len(times) > 1 else None,
            "max_split_r_hat": float(d.max_split_r_hat()),
            "min_ess": float(d.min_effective_sample_size()),
            "divergent": int(d.divergent_transitions),
        },
        "stan": {
            "compile_s": stan_out["compile_s"],
            "sample_s": stan_out["sample_s"],
            "wall_s": stan_wall,
            "divergent": stan_out["divergent"],
            "max_split_r_hat": float(theirs["r_hat"].max()),
            "min_ess": float(theirs["ess"].min()),
        },
    }
    lines = [
        "# The sampled panel rate posterior against Stan's NUTS on msm's cav data",
        "",
        f"msm's two-way illness-death model of cav (8 free intensities), Gamma({args.alpha:g}, "
        f"{args.beta:g}) prior on each, likelihood conditional on each subject's first visit, "
        f"death times exact. {args.chains} chains x {args.draws} retained draws on both sides "
        f"(Stan: {args.warmup} warm-up draws per chain; jaxctbn: "
        f"{family.burn_in}). z: difference of the means over its Monte Carlo standard error.",
        "",
        "Command: `python benchmarks/panel/bench_panel_posterior_stan.py`.",
        "",
        "| rate | jaxctbn mean (sd) | Stan mean (sd) | z | sd ratio | jaxctbn 95% | Stan 95% |",
        "|---|---|---|---:|---:|---|---|",
    ]
    for r in per_rate:
        lines.append(
            f"| {r['rate']} | {r['jaxctbn_mean']:.4f} ({r['jaxctbn_sd']:.4f}) | "
            f"{r['stan_mean']:.4f} ({r['stan_sd']:.4f}) | {r['z_means']:+.2f} | "
            f"{r['sd_ratio']:.3f} | {r['jaxctbn_ci95'][0]:.4f}-{r['jaxctbn_ci95'][1]:.4f} | "
            f"{r['stan_ci95'][0]:.4f}-{r['stan_ci95'][1]:.4f} |"
        )
    j, s = payload["jaxctbn"], payload["stan"]
    lines += [
        "",
        "| | time (s) | largest split R-hat | smallest ESS | divergent |",
        "|---|---:|---:|---:|---:|",
        f"| jaxctbn, first call (incl. compilation) | {j['first_call_s']:.1f} | "
        f"{j['max_split_r_hat']:.3f} | {j['min_ess']:.0f} | {j['divergent']} |",
        *(
            [f"| jaxctbn, second call | {j['second_call_s']:.1f} | | | |"]
            if j["second_call_s"] is not None
            else []
        ),
        f"| Stan, compilation | {s['compile_s']:.1f} | | | |",
        f"| Stan, sampling | {s['sample_s']:.1f} | {s['max_split_r_hat']:.3f} | "
        f"{s['min_ess']:.0f} | {s['divergent']} |",
    ]
    write_results("panel_posterior_stan", payload, lines)


if __name__ == "__main__":
    main()
