"""Structure design criteria with panel outcomes (issue 36): how well the panel structure BHC and
VBHC (coupled panel divergences, maths §7) and the complete-path criterion rank the candidates
against a high-sample nested-Monte-Carlo panel EIG, and what a step costs.

Problem: the paper's 4-node fast/slow structure network (`jc.paper_network(key(0),
rates="gamma")`, 81 interventions), a history of 5 complete trajectories from the all-zero state,
tau = 3, max in-degree 2, the next experiment seen at K = 2, 3 or 5 equally spaced visits.
Criteria (all through `jc.score_interventions`, N_S = 10): `panel-bhc` = `jc.BHC()` and
`panel-vbhc` = `jc.VBHC()` with `outcome=Panel(times)` (the default `PlugIn()`: drawn graphs at
their posterior-mean rates), `panel-bhc-coupled`/`panel-vbhc-coupled` the same with
`estimator=jc.RateCoupling()` (coupled rate draws: the upper bound of maths §7); `path-vbhc` =
`jc.VBHC()` assuming a complete path (what a design that ignores the panel scores). Reference: the panel EIG by
nested Monte Carlo (`jc.EIG(num_paths=10, num_inner=100)`, 200 outer draws; one candidate at a
time). Ranking accuracy = Spearman correlation over the 81 candidates with the reference, mean
over 3 seeds of the criterion; the reference's own noise is shown by its correlation with a
second reference run of another seed.

Run: `python benchmarks/panel/bench_panel_structure_criteria.py [--quick]`; writes
`results/panel_structure_criteria.{json,md}`.
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import argument_parser, environment, fmt, stopwatch, timeit, write_results  # noqa: E402

TAU, NS = 3.0, 10


def main():
    parser = argument_parser(__doc__, quick=True)
    args = parser.parse_args()
    visits = (2,) if args.quick else (2, 3, 5)
    outer, inner, seeds = (40, 30, 2) if args.quick else (200, 100, 3)

    truth = jc.paper_network(jax.random.key(0), rates="gamma")
    init = jnp.zeros(truth.num_nodes, jnp.int32)
    paths = jc.sample_trajectories(truth, init, TAU, key=jax.random.key(1), num_trajectories=5)
    posterior = jc.learn_structure(
        paths, truth.names, truth.cardinalities, max_parents=2, prior=jc.GammaPrior()
    )
    space = jc.intervention_space(truth.cardinalities)

    def scorer(criterion, outcome, num_samples, batching=None):
        return jax.jit(
            lambda key: jc.score_interventions(
                posterior,
                space,
                init,
                TAU,
                criterion=criterion,
                key=key,
                num_samples=num_samples,
                outcome=outcome,
                batching=batching,
            )
        )

    rows, records = [], []
    path_vbhc = scorer(jc.VBHC(), jc.CompletePath(), NS)
    path_scores = [np.asarray(path_vbhc(jax.random.key(10 + s))) for s in range(seeds)]
    path_time = timeit(lambda: path_vbhc(jax.random.key(10)).block_until_ready())
    for K in visits:
        times = TAU * jnp.arange(1, K + 1) / K
        outcome = jc.PanelOutcome(times)
        with stopwatch() as sw:
            reference = scorer(jc.EIG(num_paths=10, num_inner=inner), outcome, outer, jc.Chunked(1))
            ref = np.asarray(reference(jax.random.key(100)))
        ref_seconds = sw.seconds
        ref2 = np.asarray(reference(jax.random.key(101)))
        record = {
            "visits": K,
            "reference_seconds": ref_seconds,
            "reference_self_spearman": float(scipy.stats.spearmanr(ref, ref2).statistic),
            "reference_max": float(ref.max()),
            "reference_best": int(np.argmax(ref)),
            "criteria": {},
        }
        for name, criterion in (
            ("panel-bhc", jc.BHC()),
            ("panel-vbhc", jc.VBHC()),
            ("panel-bhc-coupled", jc.BHC(estimator=jc.RateCoupling())),
            ("panel-vbhc-coupled", jc.VBHC(estimator=jc.RateCoupling())),
        ):
            score = scorer(criterion, outcome, NS)
            with stopwatch() as sw:
                first = np.asarray(score(jax.random.key(10)))
            compile_seconds = sw.seconds
            step = timeit(lambda score=score: score(jax.random.key(10)).block_until_ready())
            all_scores = [first] + [
                np.asarray(score(jax.random.key(10 + s))) for s in range(1, seeds)
            ]
            rho = [scipy.stats.spearmanr(s, ref).statistic for s in all_scores]
            hit = [float(ref[int(np.argmax(s))] / ref.max()) for s in all_scores]
            record["criteria"][name] = {
                "spearman": float(np.mean(rho)),
                "reference_of_chosen": float(np.mean(hit)),
                "step_seconds": step,
                "compile_seconds": compile_seconds,
            }
        rho = [scipy.stats.spearmanr(s, ref).statistic for s in path_scores]
        hit = [float(ref[int(np.argmax(s))] / ref.max()) for s in path_scores]
        record["criteria"]["path-vbhc"] = {
            "spearman": float(np.mean(rho)),
            "reference_of_chosen": float(np.mean(hit)),
            "step_seconds": path_time,
            "compile_seconds": None,
        }
        records.append(record)
        for name, c in record["criteria"].items():
            rows.append(
                [
                    str(K),
                    name,
                    f"{c['spearman']:.2f}",
                    f"{c['reference_of_chosen']:.2f}",
                    fmt(c["step_seconds"]),
                    "" if c["compile_seconds"] is None else f"{c['compile_seconds']:.0f} s",
                ]
            )
        rows.append(
            [
                str(K),
                f"reference vs itself (another seed); max EIG {record['reference_max']:.3f} nats",
                f"{record['reference_self_spearman']:.2f}",
                "",
                f"{ref_seconds:.0f} s",
                "",
            ]
        )
        print(rows[-6:], flush=True)
    header = [
        "visits K",
        "criterion",
        "Spearman vs panel EIG",
        "EIG of its choice / best EIG",
        "step (81 candidates)",
        "compile",
    ]
    note = (
        "Paper's 4-node structure network, history of 5 complete trajectories, tau = 3, max "
        "in-degree 2, N_S = 10 (mean over "
        f"{seeds} seeds of the criterion). Reference: panel EIG by nested Monte Carlo "
        f"({outer} outer draws x 10 outcomes, {inner} inner draws). `path-vbhc` scores as if "
        "the whole path were seen (the same scores for every K)."
    )
    table = [
        "# Structure criteria with panel outcomes: ranking vs the panel EIG, and cost",
        "",
        note,
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]
    write_results(
        "panel_structure_criteria" + ("_quick" if args.quick else ""),
        {"environment": environment(), "records": records},
        table,
    )


if __name__ == "__main__":
    main()
