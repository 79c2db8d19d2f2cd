"""Intervals, covariates and the likelihood-ratio test against R msm, side by side on msm's cav
data (622 heart-transplant recipients, 4 states, death entered at exact times).

Cases: no covariates, `~ sex`, `~ dage + sex` (donor age and recipient sex, baseline per
subject: the first row's value), `~ age` (the recipient's age at each visit: time-varying, the
value at the start of each interval holding over it) and `pci = c(5, 10)` (rates piecewise
constant, changing at 5 and 10 years). msm: `msm(..., hessian = TRUE)` from its documented initial
intensities (`twoway4.q`), `qmatrix.msm(ci = "delta")` and `hazard.msm` (R, external process,
`benchmarks/msm/run_msm_intervals.R`); jaxctbn: `fit_rates` (SQUAREM without covariates,
L-BFGS with; tolerance 1e-12, as msm's reltol) and `rate_uncertainty`, same data, same
structural zeros, covariates centred as msm centres them (over the observations that start an
interval). Reported: -2LL of both (and the difference), the largest relative difference
of the intensities, of their standard errors and of the interval ends, the same for the hazard
ratios (transitions whose effect is not identified, msm's interval spanning more than 1e6,
left out and counted), the LR tests of each covariate model against the one without, and the
time of each fit (jaxctbn after its first, compiling call; its compile time separately).

    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/panel/bench_msm_intervals.py [--reuse-msm]

Writes `results/msm_intervals.json` and `.md`.
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
import scipy.stats

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import argument_parser, stopwatch, write_results

jax.config.update("jax_enable_x64", True)

from bench_msm import CAV_Q0, DATA_DIR, MSM_DIR, panel_from_long, single_node  # noqa: E402

import jaxctbn as jc  # noqa: E402

CASES = [  # (name, msm formula, columns, pci cut times)
    ("none", None, [], None),
    ("sex", "~ sex", ["sex"], None),
    ("dage+sex", "~ dage + sex", ["dage", "sex"], None),
    ("age", "~ age", ["age"], None),  # the recipient's age at each visit: time-varying
    ("pci5,10", None, [], [5.0, 10.0]),  # rates piecewise constant, changing at 5 and 10 years
]
CONTROL = {"fnscale": 4000, "reltol": 1e-12, "maxit": 100000}  # as bench_msm: to the optimum
IDENTIFIED = 1e6  # an interval wider than this ratio (upper / lower): not identified
REUSE = False  # --reuse-msm


def msm(csv, formula, workdir, tag, pci=None):
    """msm's fit; kept in `benchmarks/msm/data/` (ignored by git) and reused while its spec is
    unchanged (with --reuse-msm: the covariate fits take minutes)."""
    spec = dict(
        data=csv, subject="PTNUM", time="years", state="state", qmatrix=CAV_Q0, deathexact=[4],
        covariates=formula, control=CONTROL, repeats=1,
    )  # fmt: skip
    if pci is not None:
        spec["pci"] = pci
    key = {k: v for k, v in spec.items() if k != "data"}
    cache = os.path.join(DATA_DIR, f"intervals_{tag}.json")
    if REUSE and os.path.exists(cache):
        with open(cache) as f:
            kept = json.load(f)
        if kept.get("spec") == key:
            return kept["out"]
    spec_path, out_path = (os.path.join(workdir, f"{tag}.{x}.json") for x in ("spec", "out"))
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    sw = stopwatch()
    subprocess.run(
        ["Rscript", os.path.join(MSM_DIR, "run_msm_intervals.R"), spec_path, out_path],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    with open(out_path) as f:
        out = json.load(f)
    out["rscript_wall_s"] = sw.elapsed
    with open(cache, "w") as f:
        json.dump({"spec": key, "out": out}, f)
    return out


# to the optimum, as msm's reltol 1e-12: along the flat directions of the covariate models the
# default tolerance (1e-8) stops where some hazard ratios still differ from msm's in the 2nd digit
TOLERANCE = 1e-12


def jaxctbn_fit(obs, covariates):
    start = single_node(CAV_Q0)
    method = (jc.panel.SquaremFit if covariates is None else jc.panel.GradientFit)(
        tolerance=TOLERANCE, max_iterations=5000
    )
    with stopwatch() as sw:
        fit = jc.panel.fit_rates(start, obs, covariates=covariates, method=method)
        unc = fit.uncertainty(obs, covariates=covariates)
        jax.block_until_ready(unc)
    first = sw.seconds
    with stopwatch() as sw:
        fit = jc.panel.fit_rates(start, obs, covariates=covariates, method=method)
        jax.block_until_ready(fit)
    fit_time = sw.seconds
    return fit, unc, first, fit_time


def covariates_of(cav, obs, columns, pci):
    """The cases' covariates: baseline (the first row's value) when constant within every
    subject, else per observation (the value recorded at each visit, msm's convention), and
    the observations with the periods of `pci` (censored rows at the cuts)."""
    covariates = None
    if columns:
        groups = [
            g.sort_values("years", kind="stable") for _, g in cav.groupby("PTNUM", sort=False)
        ]
        if all(g[c].nunique() == 1 for g in groups for c in columns):
            first = np.stack([g[columns].to_numpy(float)[0] for g in groups])
            covariates = jc.panel.Covariates(first, names=columns)
        else:
            values = np.zeros(obs.times.shape + (len(columns),))
            for r, g in enumerate(groups):
                v = g[columns].to_numpy(float)
                values[r, : len(v)], values[r, len(v) :] = v, v[-1]
            covariates = jc.panel.Covariates(values, names=columns, per_observation=True)
    if pci is not None:
        obs, covariates = obs.with_time_periods(pci, covariates=covariates)
    return obs, covariates


def msm_name(name):
    """msm's name of a covariate: its periods are `timeperiod[a,b)`."""
    return "time" + name if name.startswith("period[") else name


def rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    keep = np.abs(b) > 0
    return float(np.max(np.abs(a[keep] - b[keep]) / np.abs(b[keep]))) if keep.any() else 0.0


def main():
    cav = pd.read_csv(os.path.join(DATA_DIR, "cav.csv"))
    obs = panel_from_long(cav, "PTNUM", "years", "state", deathexact=[4])
    rows, fits = [], {}
    with tempfile.TemporaryDirectory() as workdir:
        csv = os.path.join(workdir, "cav.csv")
        cav.to_csv(csv, index=False)
        for name, formula, columns, pci in CASES:
            peer = msm(csv, formula, workdir, name, pci)
            case_obs, covariates = covariates_of(cav, obs, columns, pci)
            fit, unc, first_call, fit_time = jaxctbn_fit(case_obs, covariates)
            q = np.asarray(fit.model.cims[0][0])
            off = ~np.eye(4, dtype=bool) & (q > 0)
            # intervals compared where both tools identify the rate (an unidentified effect
            # makes its rate's interval span orders of magnitude in both)
            ratio = np.maximum(
                np.asarray(peer["upper"]) / np.maximum(np.asarray(peer["lower"]), 1e-300),
                np.asarray(unc.upper[0][0]) / np.maximum(np.asarray(unc.lower[0][0]), 1e-300),
            )
            identified = off & (ratio < IDENTIFIED)
            if covariates is not None:
                # a rate whose covariate effect is not identified (jaxctbn holds the effect
                # fixed, msm's interval for it spans more than IDENTIFIED) is a rate at the
                # covariates' means that depends on where each tool stopped along the ridge
                transitions = [(x, y) for x in range(4) for y in range(4) if off[x, y]]
                for c, column in enumerate(covariates.names):
                    h = peer["hazard_ratios"][msm_name(column)]
                    for (x, y), L, U in zip(transitions, h["L"], h["U"]):
                        estimated = bool(np.asarray(unc.effect_estimated[0])[c, 0, x, y])
                        if not estimated or U / max(L, 1e-300) > IDENTIFIED:
                            identified[x, y] = False
            row = {
                "case": name,
                "msm_minus2loglik": peer["minus2loglik"],
                "jaxctbn_minus2loglik": -2 * float(fit.log_likelihood),
                "msm_converged": peer["converged"],
                "jaxctbn_converged": bool(fit.converged),
                "positive_definite": bool(unc.positive_definite),
                "rate_rel_diff": rel(q[identified], np.asarray(peer["Q"])[identified]),
                "se_rel_diff": rel(
                    np.asarray(unc.standard_errors[0][0])[identified],
                    np.asarray(peer["se"])[identified],
                ),
                "ci_rel_diff": max(
                    rel(
                        np.asarray(unc.lower[0][0])[identified],
                        np.asarray(peer["lower"])[identified],
                    ),
                    rel(
                        np.asarray(unc.upper[0][0])[identified],
                        np.asarray(peer["upper"])[identified],
                    ),
                ),
                "rates_not_identified": int(off.sum() - identified.sum()),
                "msm_time_s": peer["time_fit_s"],
                "jaxctbn_first_call_s": first_call,
                "jaxctbn_fit_s": fit_time,
                "msm_parameters": peer["n_parameters"],
            }
            row["minus2loglik_diff"] = row["jaxctbn_minus2loglik"] - row["msm_minus2loglik"]
            if covariates is not None:
                hr_diffs, skipped = [], 0
                transitions = [(x, y) for x in range(4) for y in range(4) if off[x, y]]
                for c, column in enumerate(covariates.names):
                    h = peer["hazard_ratios"][msm_name(column)]
                    for (x, y), HR, L, U in zip(transitions, h["HR"], h["L"], h["U"]):
                        b = float(np.asarray(unc.effects[0])[c, 0, x, y])
                        lo = float(np.asarray(unc.hazard_ratio_lower[0])[c, 0, x, y])
                        hi = float(np.asarray(unc.hazard_ratio_upper[0])[c, 0, x, y])
                        estimated = bool(np.asarray(unc.effect_estimated[0])[c, 0, x, y])
                        if not estimated or max(U / max(L, 1e-300), hi / max(lo, 1e-300)) > (
                            IDENTIFIED
                        ):
                            skipped += 1
                            continue
                        hr_diffs.append(max(rel([np.exp(b)], [HR]), rel([lo], [L]), rel([hi], [U])))
                row["hazard_ratio_rel_diff"] = max(hr_diffs) if hr_diffs else None
                row["hazard_ratios_not_identified"] = skipped
            rows.append(row)
            fits[name] = row
    tests = []
    for name, *_ in CASES[1:]:
        for tool in ("msm", "jaxctbn"):
            statistic = fits["none"][f"{tool}_minus2loglik"] - fits[name][f"{tool}_minus2loglik"]
            df = fits[name]["msm_parameters"] - fits["none"]["msm_parameters"]
            tests.append(
                {"model": name, "tool": tool, "lr_statistic": statistic, "df": df,
                 "p_value": float(scipy.stats.chi2.sf(max(statistic, 0), df))}
            )  # fmt: skip
    out = {"benchmark": "msm_intervals", "rows": rows, "lr_tests": tests}
    lines = [
        "# Intervals, covariates and LR tests: jaxctbn vs R msm on cav",
        "",
        'msm: `hessian = TRUE`, `qmatrix.msm(ci = "delta")`, `hazard.msm`, control '
        f"{CONTROL}; jaxctbn: `fit_rates` (tolerance {TOLERANCE:g}) + `rate_uncertainty`. "
        "Relative differences are the largest over the free intensities that both tools "
        "identify: intervals narrower than a factor 1e6 in both, and every covariate effect on "
        "the transition identified (msm's hazard-ratio interval narrower than 1e6, and not "
        "held fixed by jaxctbn as unidentified); likewise for the hazard ratios. The rates are "
        "those at the covariates' means, both tools centring over the observations that start "
        "an interval.",
        "",
        "| case | msm -2LL | jaxctbn -2LL | diff | msm converged | rates | se | 95% ends | "
        "rates not identified | hazard ratios (ends) | HR not identified | msm fit | "
        "jaxctbn first call | jaxctbn fit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        hr = r.get("hazard_ratio_rel_diff")
        lines.append(
            f"| {r['case']} | {r['msm_minus2loglik']:.4f} | {r['jaxctbn_minus2loglik']:.4f} | "
            f"{r['minus2loglik_diff']:+.1e} | {r['msm_converged']} | {r['rate_rel_diff']:.1e} | "
            f"{r['se_rel_diff']:.1e} | {r['ci_rel_diff']:.1e} | {r['rates_not_identified']} | "
            f"{'-' if hr is None else f'{hr:.1e}'} | {r.get('hazard_ratios_not_identified', '-')} | "
            f"{r['msm_time_s']:.2f} s | {r['jaxctbn_first_call_s']:.2f} s | "
            f"{r['jaxctbn_fit_s'] * 1e3:.0f} ms |"
        )
    lines += ["", "| model vs none | tool | LR statistic | df | p |", "|---|---|---|---|---|"]
    for t in tests:
        lines.append(
            f"| {t['model']} | {t['tool']} | {t['lr_statistic']:.4f} | {t['df']} | "
            f"{t['p_value']:.4g} |"
        )
    write_results("msm_intervals", out, lines)


if __name__ == "__main__":
    parser = argument_parser(__doc__)
    parser.add_argument(
        "--reuse-msm",
        action="store_true",
        help="reuse msm's fits kept in benchmarks/msm/data/ while their spec is unchanged",
    )
    REUSE = parser.parse_args().reuse_msm
    main()
