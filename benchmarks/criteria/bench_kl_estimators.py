"""Structure KL estimators against a Monte Carlo reference (issue 4, MATH §5).

The structure (V)BHC needs $a_n(P')=\\sum_P p(P\\mid H)\\,\\mathsf E[\\ell_n(S;P)-\\ell_n(S;P')]$.
The paper's plug-in estimator evaluates $\\ell_n$ at the *expected* statistics (one master
equation solve per draw); the Monte Carlo estimator averages $\\ell_n$ over sampled paths.

Problem: 2 binary nodes, X0 -> X1 (X0 slow: rates 0.5; X1 follows X0: 3 towards X0's state,
0.3 away), prior alpha = beta = 1, initial state (0, 0), no intervention; horizons tau = 1, 3, 10;
history: none, or 10 sampled paths of length tau. For fixed posterior draws (N_S = 20 per
stratum) we compute every $a_n(P')$ by (i) plug-in, (ii) Monte Carlo with 10 paths per draw (what
`jc.MonteCarlo()` uses by default) and (iii) a reference:
Monte Carlo with 2000 paths per draw. A second reference with other path keys gives the
reference's own noise. Reported: relative error of each estimator's total BHC
$\\sum_n\\sum_{P'}p(P'\\mid H)a_n(P')$ and min-VBHC, and the largest relative error over the
entries $a_n(P')$ with $P'\\ne$ the entries that are exactly zero.

Run: `python benchmarks/criteria/bench_kl_estimators.py [--quick]`; writes `results/kl_estimators.{json,md}`.
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import argument_parser, environment, write_results

from jaxctbn._criteria.structure import (
    structure_bhc,
    structure_divergences,
    structure_draws,
    structure_vbhc_minimum,
)


def truth_model():
    return jc.CTBN(
        cims=[
            np.array([[[-0.5, 0.5], [0.5, -0.5]]]),
            np.array([[[-0.3, 0.3], [3.0, -3.0]], [[-3.0, 3.0], [0.3, -0.3]]]),
        ],
        parents=((), (0,)),
        names=("X0", "X1"),
    )


def divergences(post, draws, tau, estimator, key, paths):
    if estimator == "plug-in":
        est = jc.PlugIn()
    else:
        est = jc.MonteCarlo(num_paths=paths, max_events=64 + int(40 * tau))
    return jax.jit(
        lambda p, d, k: structure_divergences(
            p, d, jnp.array([0, 0]), tau, estimator=est, path_key=k
        )
    )(post, draws, key)


def main():
    ap = argument_parser(__doc__, quick=True, name="kl_estimators")
    args = ap.parse_args()
    ref_paths = 200 if args.quick else 2000
    ns = 10 if args.quick else 20
    truth = truth_model()
    rows, records = [], []
    for history in (0, 10):
        for tau in (1.0, 3.0, 10.0):
            if history:
                traj = jc.sample_trajectories(
                    truth,
                    jnp.array([0, 0]),
                    tau,
                    key=jax.random.key(7),
                    num_trajectories=history,
                    max_events=64 + int(40 * tau),
                )
            else:  # an empty history: one zero-length, fully intervened trajectory
                traj = jc.sample_trajectories(
                    truth, jnp.array([0, 0]), 1e-9, key=jax.random.key(7), num_trajectories=1
                )
                traj = jc.Trajectories(
                    **{
                        **{f: getattr(traj, f) for f in traj.__dataclass_fields__},
                        "intervention_targets": jnp.ones((1, 2), bool),
                    }
                )
            post = jc.learn_structure(traj, truth.names, (2, 2), max_parents=1)
            draws = structure_draws(post, jax.random.key(11), ns)
            est = {
                "plug-in": divergences(post, draws, tau, "plug-in", jax.random.key(0), 1),
                "monte-carlo (10 paths)": divergences(
                    post, draws, tau, "monte-carlo", jax.random.key(1), 10
                ),
                "reference repeat": divergences(
                    post, draws, tau, "monte-carlo", jax.random.key(2), ref_paths
                ),
            }
            ref = divergences(post, draws, tau, "monte-carlo", jax.random.key(3), ref_paths)
            bhc_ref = float(structure_bhc(post, ref))
            vbhc_ref = float(structure_vbhc_minimum(post, ref))
            ref_flat = np.concatenate([np.asarray(a) for a in ref])
            for name, a in est.items():
                bhc = float(structure_bhc(post, a))
                vbhc = float(structure_vbhc_minimum(post, a))
                flat = np.concatenate([np.asarray(x) for x in a])
                mask = np.abs(ref_flat) > 1e-12
                entry = (flat[mask] - ref_flat[mask]) / np.abs(ref_flat[mask])
                rec = {
                    "history_paths": history,
                    "tau": tau,
                    "estimator": name,
                    "bhc": bhc,
                    "bhc_reference": bhc_ref,
                    "bhc_rel_error": (bhc - bhc_ref) / abs(bhc_ref),
                    "min_vbhc": vbhc,
                    "min_vbhc_reference": vbhc_ref,
                    "min_vbhc_rel_error": (vbhc - vbhc_ref) / abs(vbhc_ref),
                    "entry_rel_error_min": float(entry.min()),
                    "entry_rel_error_max": float(entry.max()),
                }
                records.append(rec)
                rows.append(
                    f"| {history} | {tau:g} | {name} | {bhc:.4f} ({bhc_ref:.4f}) | "
                    f"{100 * rec['bhc_rel_error']:+.1f}% | {vbhc:.4f} ({vbhc_ref:.4f}) | "
                    f"{100 * rec['min_vbhc_rel_error']:+.1f}% | "
                    f"{100 * entry.min():+.0f}% … {100 * entry.max():+.0f}% |"
                )
                print(rows[-1], flush=True)
    header = [
        "# Structure KL estimators vs a Monte Carlo reference (2 binary nodes, float64)",
        "",
        f"Reference: Monte Carlo with {ref_paths} paths per draw, N_S = {ns} draws per stratum, "
        "the same draws for every estimator. 'reference repeat' = the reference with other path "
        "keys (its own noise). Command: `python benchmarks/criteria/bench_kl_estimators.py`.",
        "",
        "| history paths | τ | estimator | BHC (ref) | BHC error | min VBHC (ref) | "
        "min VBHC error | entries a_n(P') error range |",
        "|---|---|---|---|---|---|---|---|",
    ]
    write_results(
        args.name,
        {"environment": environment(), "records": records, "ref_paths": ref_paths, "ns": ns},
        header + rows,
    )


if __name__ == "__main__":
    main()
