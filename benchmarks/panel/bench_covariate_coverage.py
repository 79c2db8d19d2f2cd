"""Coverage of the 95% intervals of covariate effects (hazard ratios) and rates in panel fits
with a baseline covariate, a time-varying covariate and piecewise-constant rates.

One binary node (0 <-> 1), R subjects seen at 7 yearly visits from a random start. Each subject
has a binary baseline covariate `sex` (probability 1/2) and a binary time-varying covariate `z`
that switches on at a random visit (value at each visit, held until the next); the rates also
change at year 3 (`--pci 3`, the period `period[3,Inf)`). Each covariate acts on both rates with
its own effect: 2 rates and 6 log hazard ratios. Data are simulated exactly: the state at each
visit is drawn from the product of the pieces' matrix exponentials (numpy/scipy, independent of
the library). Per data set: `with_time_periods`, `fit_rates` (L-BFGS, the default with
covariates) and `rate_uncertainty`. Reported per sample size: the coverage of the true value by
each parameter's 95% interval (pooled over the 6 effects and, apart, the 2 rates at the
covariates' means, with binomial 95% intervals; the range over the parameters), the mean reported
standard error over the spread of the estimates (1 = calibrated), failures (not converged, not
positive definite, an effect not estimated) and the time per data set after compilation.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/panel/bench_covariate_coverage.py [--reps 200]

Writes `results/covariate_coverage.json` and `.md`.
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg
import scipy.stats

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import argument_parser, stopwatch, write_results

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc  # noqa: E402

VISITS = np.arange(7.0)
CUT = 3.0
RATES = {(0, 1): 0.4, (1, 0): 0.6}  # at the reference (sex 0, z 0, first period)
EFFECTS = {  # log hazard ratios per covariate, on (0 -> 1, 1 -> 0)
    "sex": {(0, 1): 0.5, (1, 0): -0.3},
    "z": {(0, 1): -0.6, (1, 0): 0.4},
    "period[3,Inf)": {(0, 1): 0.3, (1, 0): -0.5},
}
NAMES = tuple(EFFECTS)
TRANSITIONS = ((0, 1), (1, 0))


def generator(sex: float, z: float, period: float) -> np.ndarray:
    q = np.zeros((2, 2))
    for e in TRANSITIONS:
        log = EFFECTS["sex"][e] * sex + EFFECTS["z"][e] * z + EFFECTS["period[3,Inf)"][e] * period
        q[e] = RATES[e] * np.exp(log)
    return q - np.diag(q.sum(1))


def simulate(num_subjects: int, rng: np.random.Generator):
    sex = rng.integers(0, 2, num_subjects).astype(float)
    switch = rng.integers(1, len(VISITS) + 1, num_subjects)
    z = (np.arange(len(VISITS))[None] >= switch[:, None]).astype(float)
    states = np.zeros((num_subjects, len(VISITS)), int)
    states[:, 0] = rng.integers(0, 2, num_subjects)
    for r in range(num_subjects):
        for i in range(1, len(VISITS)):
            t0, t1 = VISITS[i - 1], VISITS[i]
            pieces = [(t0, min(t1, CUT)), (max(t0, CUT), t1)] if t0 < CUT < t1 else [(t0, t1)]
            P = np.eye(2)
            for a, b in pieces:
                P = P @ scipy.linalg.expm((b - a) * generator(sex[r], z[r, i - 1], float(a >= CUT)))
            states[r, i] = rng.choice(2, p=P[states[r, i - 1]] / P[states[r, i - 1]].sum())
    return sex, z, states


def one_size(num_subjects: int, reps: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    start = jc.CTBN(cims=[jnp.array([[[-1.0, 1.0], [1.0, -1.0]]])], parents=[()], names=("h",))
    effect_hits, rate_hits, betas, beta_se, failures, seconds = [], [], [], [], [0, 0, 0], []
    for rep in range(reps):
        sex, z, states = simulate(num_subjects, rng)
        observations = jc.panel.PanelObservations(
            np.broadcast_to(VISITS, states.shape), states[..., None]
        )
        values = np.stack([np.broadcast_to(sex[:, None], z.shape), z], -1)
        covariates = jc.panel.Covariates(values, names=("sex", "z"), per_observation=True)
        with stopwatch() as sw:
            periods, covariates = observations.with_time_periods([CUT], covariates=covariates)
            fit = jc.panel.fit_rates(start, periods, covariates=covariates)
            errors = fit.uncertainty(periods, covariates=covariates)
            jax.block_until_ready(errors)
        if rep > 0:  # the first data set compiles
            seconds.append(sw.seconds)
        failures[0] += not bool(fit.converged)
        failures[1] += not bool(errors.positive_definite)
        estimated = np.asarray(errors.effect_estimated[0])[:, 0]
        failures[2] += int(sum(not estimated[c][e] for c in range(3) for e in TRANSITIONS))
        lo = np.asarray(errors.hazard_ratio_lower[0])[:, 0]
        hi = np.asarray(errors.hazard_ratio_upper[0])[:, 0]
        b = np.asarray(errors.effects[0])[:, 0]
        se = np.asarray(errors.effect_standard_errors[0])[:, 0]
        truth = [np.exp(EFFECTS[name][e]) for name in NAMES for e in TRANSITIONS]
        effect_hits.append(
            [
                lo[c][e] <= t <= hi[c][e]
                for (c, e), t in zip([(c, e) for c in range(3) for e in TRANSITIONS], truth)
            ]
        )
        betas.append([b[c][e] for c in range(3) for e in TRANSITIONS])
        beta_se.append([se[c][e] for c in range(3) for e in TRANSITIONS])
        # the rates at the covariates' means: the truth at those means
        means = np.asarray(fit.covariate_means)
        rate_hits.append(
            [
                np.asarray(errors.lower[0])[0][e]
                <= RATES[e] * np.exp(sum(EFFECTS[n][e] * m for n, m in zip(NAMES, means)))
                <= np.asarray(errors.upper[0])[0][e]
                for e in TRANSITIONS
            ]
        )
    effect_hits, rate_hits = np.array(effect_hits), np.array(rate_hits)
    betas, beta_se = np.array(betas), np.array(beta_se)
    finite = np.isfinite(beta_se).all(1)
    calibration = beta_se[finite].mean(0) / betas[finite].std(0, ddof=1)

    def pooled(hits):
        k, n = int(hits.sum()), hits.size
        low, high = scipy.stats.binomtest(k, n).proportion_ci(0.95)
        return k / n, [low, high], hits.mean(0).tolist()

    effect_cov, effect_ci, effect_per = pooled(effect_hits)
    rate_cov, rate_ci, rate_per = pooled(rate_hits)
    return {
        "subjects": num_subjects,
        "data_sets": reps,
        "effect_coverage": effect_cov,
        "effect_coverage_binomial_ci95": effect_ci,
        "effect_coverage_per_parameter": effect_per,
        "effect_se_over_spread": calibration.tolist(),
        "rate_coverage": rate_cov,
        "rate_coverage_binomial_ci95": rate_ci,
        "rate_coverage_per_rate": rate_per,
        "not_converged": failures[0],
        "not_positive_definite": failures[1],
        "effects_not_estimated": failures[2],
        "seconds_per_data_set": float(np.median(seconds)) if seconds else None,
    }


def main():
    parser = argument_parser(__doc__)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--sizes", default="200,800")
    args = parser.parse_args()
    rows = [one_size(int(n), args.reps, seed=i) for i, n in enumerate(args.sizes.split(","))]
    out = {
        "benchmark": "covariate_coverage",
        "model": "one binary node; sex (baseline), z (time-varying), period[3,Inf) on both rates",
        "true_rates": {f"{x}->{y}": v for (x, y), v in RATES.items()},
        "true_log_hazard_ratios": {
            n: {f"{x}->{y}": v for (x, y), v in e.items()} for n, e in EFFECTS.items()
        },
        "method": "with_time_periods + fit_rates (GradientFit, default) + rate_uncertainty",
        "device": jax.devices()[0].platform,
        "rows": rows,
    }
    lines = [
        "# Coverage of the 95% intervals of hazard ratios and rates (covariates, periods)",
        "",
        f"{out['model']}; 7 yearly visits from a random start, exact simulation. Effects: "
        "coverage of the true hazard ratio pooled over the 6 (binomial 95% interval; range "
        "over the parameters), `se / spread` the mean reported se of the log hazard ratio over "
        "the standard deviation of its estimate across data sets (1 = calibrated). Rates: "
        "coverage of the true rate at the covariates' means. Target: 93-97%.",
        "",
        "| subjects | data sets | HR coverage | binomial 95% | per HR (min-max) | "
        "se / spread (min-max) | rate coverage | binomial 95% | not converged | "
        "not pos. def. | effects not estimated | s per data set |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per, cal = r["effect_coverage_per_parameter"], r["effect_se_over_spread"]
        lines.append(
            f"| {r['subjects']} | {r['data_sets']} | {r['effect_coverage']:.3f} | "
            f"{r['effect_coverage_binomial_ci95'][0]:.3f}-"
            f"{r['effect_coverage_binomial_ci95'][1]:.3f} | {min(per):.2f}-{max(per):.2f} | "
            f"{min(cal):.2f}-{max(cal):.2f} | {r['rate_coverage']:.3f} | "
            f"{r['rate_coverage_binomial_ci95'][0]:.3f}-{r['rate_coverage_binomial_ci95'][1]:.3f}"
            f" | {r['not_converged']} | {r['not_positive_definite']} | "
            f"{r['effects_not_estimated']} | {r['seconds_per_data_set']:.3f} |"
        )
    write_results("covariate_coverage", out, lines)


if __name__ == "__main__":
    main()
