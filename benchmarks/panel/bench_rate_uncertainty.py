"""Coverage of the 95% intervals of panel rate fits (`rate_uncertainty`) over simulated panels.

A <-> B (two binary nodes, every rate depends on the other node: 8 free rates), panels of R
subjects seen at 7 yearly visits from a random start, simulated exactly (`sample_trajectories`
then `PanelObservations.from_paths`); per data set the default fit (`fit_rates`, SQUAREM) and the observed
information (`rate_uncertainty`). Reported per sample size: the coverage of the true rate by
each rate's interval (pooled over the 8 rates, with its binomial 95% interval; and the range
over the rates), the ratio of the mean reported standard error of log(rate) to the spread of
log(estimate) over the data sets (1 when the errors are calibrated), how many fits did not
converge or had an information that was not positive definite, and the time per data set
after compilation.

    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/panel/bench_rate_uncertainty.py [--reps 200]

Writes `results/rate_uncertainty.json` and `.md`.
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import scipy.stats

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import argument_parser, stopwatch, write_results

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc  # noqa: E402

VISITS = np.arange(7.0)
PARENTS = ((1,), (0,))
CIMS = (
    [[[-0.3, 0.3], [0.5, -0.5]], [[-0.6, 0.6], [0.4, -0.4]]],
    [[[-1.0, 1.0], [0.5, -0.5]], [[-0.3, 0.3], [0.2, -0.2]]],
)
OFF = ~np.eye(2, dtype=bool)


def truth():
    return jc.CTBN(cims=[jnp.asarray(c) for c in CIMS], parents=PARENTS, names=("A", "B"))


def start():
    return jc.CTBN(cims=[jnp.ones((2, 2, 2))] * 2, parents=PARENTS, names=("A", "B"))


def free_rates(cims):
    return np.concatenate([np.asarray(c)[:, OFF].ravel() for c in cims])


def one_size(num_subjects: int, reps: int, seed: int) -> dict:
    model = truth()
    true = free_rates(model.cims)
    covered, estimates, errors, flags, seconds = [], [], [], [], []
    keys = jr.split(jr.key(seed), reps)
    for rep, key in enumerate(keys):
        k0, k1 = jr.split(key)
        initial = jr.bernoulli(k0, 0.5, (num_subjects, 2)).astype(jnp.int32)
        paths = jc.sample_trajectories(
            model, initial, float(VISITS[-1]), key=k1, num_trajectories=num_subjects
        )
        observations = jc.panel.PanelObservations.from_paths(paths, VISITS)
        with stopwatch() as sw:
            fit = jc.panel.fit_rates(start(), observations)
            uncertainty = fit.uncertainty(observations)
            jax.block_until_ready(uncertainty)
        if rep > 0:  # the first data set compiles
            seconds.append(sw.seconds)
        lower = free_rates(uncertainty.lower)
        upper = free_rates(uncertainty.upper)
        covered.append((lower <= true) & (true <= upper))
        estimates.append(np.log(free_rates(fit.model.cims)))
        errors.append(free_rates(uncertainty.log_rate_standard_errors))
        flags.append((bool(fit.converged), bool(uncertainty.positive_definite)))
    covered = np.array(covered)
    hits, trials = int(covered.sum()), covered.size
    low, high = scipy.stats.binomtest(hits, trials).proportion_ci(0.95)
    estimates, errors = np.array(estimates), np.array(errors)
    finite = np.isfinite(errors).all(1)
    calibration = errors[finite].mean(0) / estimates[finite].std(0, ddof=1)
    return {
        "subjects": num_subjects,
        "visits": len(VISITS),
        "data_sets": reps,
        "coverage": hits / trials,
        "coverage_binomial_ci95": [low, high],
        "coverage_per_rate": covered.mean(0).tolist(),
        "se_over_spread_per_rate": calibration.tolist(),
        "not_converged": sum(not c for c, _ in flags),
        "not_positive_definite": sum(not d for _, d in flags),
        "seconds_per_data_set": float(np.median(seconds)) if seconds else None,
    }


def main():
    parser = argument_parser(__doc__)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--sizes", default="100,400")
    args = parser.parse_args()
    rows = [one_size(int(n), args.reps, seed=i) for i, n in enumerate(args.sizes.split(","))]
    out = {
        "benchmark": "rate_uncertainty",
        "network": "A <-> B, binary, 8 free rates",
        "true_rates": free_rates(truth().cims).tolist(),
        "method": "fit_rates (SquaremFit, default) + rate_uncertainty (level 0.95)",
        "device": jax.devices()[0].platform,
        "rows": rows,
    }
    lines = [
        "# Coverage of the 95% intervals of panel rate fits",
        "",
        f"{out['network']}; 7 yearly visits from a random start; per data set the default fit "
        "and `rate_uncertainty` (exact observed information in the log-rates, intervals "
        "symmetric on the log scale). Coverage pooled over the 8 rates (binomial 95% "
        "interval); `se / spread`: the mean reported se of log(rate) over the standard "
        "deviation of log(estimate) across the data sets (1 = calibrated), range over the "
        "rates. Target: 93-97%.",
        "",
        "| subjects | data sets | coverage | binomial 95% | per-rate coverage (min-max) | "
        "se / spread (min-max) | not converged | not pos. def. | s per data set |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per, cal = r["coverage_per_rate"], r["se_over_spread_per_rate"]
        lines.append(
            f"| {r['subjects']} | {r['data_sets']} | {r['coverage']:.3f} | "
            f"{r['coverage_binomial_ci95'][0]:.3f}-{r['coverage_binomial_ci95'][1]:.3f} | "
            f"{min(per):.2f}-{max(per):.2f} | {min(cal):.2f}-{max(cal):.2f} | "
            f"{r['not_converged']} | {r['not_positive_definite']} | "
            f"{r['seconds_per_data_set']:.3f} |"
        )
    write_results("rate_uncertainty", out, lines)


if __name__ == "__main__":
    main()
