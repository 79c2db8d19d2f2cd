"""The cost of a parameter design step with panel outcomes (issue 36), side by side with the
complete-path step in one run.

The step: the paper's parameter experiment (`jaxctbn.paper_network(key(0), rates="softmax")`,
4 binary nodes), a posterior after 5 trajectories of length 3 from the all-zero state, all 81
interventions, N_S = 10 posterior draws, tau = 3. Complete paths: the (V)BHC in closed form
(maths §3). Panel outcomes (maths §7), K = 3 visits: at 1, 2, 3 (`PanelOutcome(times)`: BHC,
VBHC minimised by Adam, nested-Monte-Carlo EIG with 10 outcomes per draw and 100 inner draws),
and chosen per candidate (`PanelOutcome(num_visits=3)`: BHC and VBHC, whose
`score_interventions` returns a `PanelDesign`, timed to its scores). Each is one compiled call
of `score_interventions`, timed warm (best of 5) after its compilation (timed too); the ratio is
against the complete-path VBHC step. Target: the panel step with given times within 3x the
complete-path step.

Run: `python benchmarks/panel/bench_panel_design.py`; writes `results/panel_design.{json,md}`.
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import argument_parser, environment, fmt, stopwatch, timeit, write_results  # noqa: E402

TAU = 3.0
NUM_SAMPLES = 10


def main():
    truth = jc.paper_network(jax.random.key(0), rates="softmax")
    init = jnp.zeros(truth.num_nodes, jnp.int32)
    traj = jc.sample_trajectories(truth, init, TAU, key=jax.random.key(1), num_trajectories=5)
    posterior = jc.RatePosterior.for_model(truth).update_with(
        jc.SufficientStatistics.from_trajectories(traj, truth.cardinalities, truth.parents)
    )
    space = jc.intervention_space(truth.cardinalities)
    key = jax.random.key(2)
    given = jc.PanelOutcome(jnp.array([1.0, 2.0, 3.0]))
    chosen = jc.PanelOutcome(num_visits=3)
    cases = [
        ("complete path", "VBHC", jc.VBHC(), jc.CompletePath(), False),
        ("complete path", "BHC", jc.BHC(), jc.CompletePath(), False),
        ("panel, visits at 1, 2, 3", "BHC", jc.BHC(), given, False),
        ("panel, visits at 1, 2, 3", "VBHC (Adam, 100 steps)", jc.VBHC(), given, False),
        (
            "panel, visits at 1, 2, 3",
            "EIG (10 outcomes x 100 inner)",
            jc.EIG(num_inner=100),
            given,
            False,
        ),
        ("panel, 3 visits chosen per candidate", "BHC", jc.BHC(), chosen, True),
        ("panel, 3 visits chosen per candidate", "VBHC", jc.VBHC(), chosen, True),
    ]
    rows = []
    for outcome_label, criterion_label, criterion, outcome, design in cases:
        if design:

            def step(k, criterion=criterion, outcome=outcome):
                # a PanelDesign: the scores, with the times chosen per candidate
                return jc.score_interventions(
                    posterior, space, init, TAU, outcome=outcome, criterion=criterion, key=k,
                    num_samples=NUM_SAMPLES,
                ).scores  # fmt: skip
        else:

            def step(k, criterion=criterion, outcome=outcome):
                return jc.score_interventions(
                    posterior, space, init, TAU, criterion=criterion, key=k,
                    num_samples=NUM_SAMPLES, outcome=outcome,
                )  # fmt: skip

        with stopwatch() as sw:
            scores = jax.block_until_ready(step(key))
        first = sw.seconds
        warm = timeit(step, key, repeat=5, min_time=0.5)
        rows.append(
            {
                "outcome": outcome_label,
                "criterion": criterion_label,
                "first_call_s": first,
                "step_s": warm,
                "best": int(jnp.argmax(scores)),
            }
        )
        print(rows[-1], flush=True)
    base = rows[0]["step_s"]
    for r in rows:
        r["ratio"] = r["step_s"] / base
    table = [
        "# A parameter design step with panel outcomes, against the complete-path step",
        "",
        "The paper's parameter experiment (4 binary nodes, 81 interventions, N_S = 10, tau = 3, a "
        "posterior after 5 paths); K = 3 visits. Step = one compiled call, best of 5 warm; first "
        "call includes compilation; ratio against the complete-path VBHC step.",
        "",
        "| outcome | criterion | step | ratio | first call (compiles) | best candidate |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        table.append(
            f"| {r['outcome']} | {r['criterion']} | {fmt(r['step_s'])} | {r['ratio']:.1f}x | "
            f"{fmt(r['first_call_s'])} | {r['best']} |"
        )
    write_results("panel_design", {"environment": environment(), "rows": rows}, table)


if __name__ == "__main__":
    argument_parser(__doc__).parse_args()  # --help; no flags
    main()
