"""Does designing for a panel outcome help parameter learning? The paper's parameter experiment
with panel outcomes, panel-aware design against the paper's path-assuming design.

The experiment: the paper's parameter experiment (`jaxctbn.paper_network(key(0),
rates="softmax")`, 4 binary nodes, the known graph, Gamma(1, 1) rate prior), all 81
interventions of `jaxctbn.intervention_space`, tau = 3, each experiment's initial state drawn
uniformly and revealed to the design (the paper's, `RandomInitialState()`), N_S = 10 posterior
draws per design step. Each simulated experiment reveals only its global state at K visits
equally spaced in (0, 3] (t_k = 3k/K, K in 2, 3, 5): the task is
`ParameterLearningTask(truth, outcome=Panel(times), panel_posterior=family)`, whose posterior is
updated after every experiment by `jaxctbn.panel.panel_rate_posterior` in the family of
`--panel-posterior`: `sampled` (default), the particle filter `ParticleFilter(--particles)`, a
mixture of Gammas exact as its particles grow; `moment`, the moment-matched Gamma (an
assumed-density filter, overconfident where the visits are sparse; the results before issue 60,
now in `results/panel_experiments_moment.*`). Designs:

- `panel-bhc`: the BHC scored under the outcome the experiment really has,
  `CriterionDesign(BHC(), outcome=Panel(times))` (panel-aware);
- `path-bhc`: the BHC scored as if the whole path were seen (the paper's design):
  `design_from_name("bhc-path", outcome=Panel(times))`, i.e.
  `CriterionDesign(BHC(), assume_complete_path=True)` (the committed results were computed
  with an equivalent design class making the same `score_interventions(...,
  outcome=CompletePath())` call, before that option existed);
- `random` (uniform over the 81) and `passive` (no intervention).

Every design runs with the same keys (repetition r uses `fold_in(key(seed), r)`, as `jaxctbn
run`), so the initial states and the random streams are shared: the comparison is paired.
Metrics, before and after each experiment: the loop's `mse`, the posterior-averaged squared
error of the rates, `posterior.mse(truth)` = E_post[(Lambda - Lambda*)^2] averaged over the
18 off-diagonal rates (the squared error of the posterior mean plus the posterior variance,
both of the loop's panel posterior), and `mean_se`, the squared error of the posterior-mean
rates alone (recorded by `ParameterTaskWithMeanError` below, the same task otherwise).
Reported per K, design and metric: the final mean with a 95% t interval of the mean; paired against
`panel-bhc`, the mean difference (design - panel-bhc; > 0: panel-bhc better) with a 95% t
interval over repetitions at the final experiment and at the midpoint (experiment E // 2); the
fraction of repetitions where `panel-bhc` ends lower than the design (ties half).

Sizes: 500 repetitions x 15 experiments per (K, design) by default, the paper's parameter runs
(`bench_active_learning.py`; `jaxctbn run`'s own default is 10 experiments). Measured cost on
one CPU core (K = 5): ~95 ms per panel-aware BHC step including the panel posterior update,
~1.4 s per 15-experiment repetition, at most ~6 ms per step for the other designs, ~1 min of
compilation per K; the full run took 30 min (`results/panel_experiments.md`). The
VBHC is not included: with a panel outcome one design step costs ~12 s
(`results/panel_design.md`), ~25 h for 500 x 15 per K.

Run (pinned to one core, as the recorded run):
`OMP_NUM_THREADS=1 XLA_FLAGS="--xla_cpu_use_fusion_emitters=false
--xla_cpu_parallel_codegen_split_count=1" taskset -c 1 python
benchmarks/panel/bench_panel_experiments.py [--repetitions R] [--experiments E] [--visits 2,3,5]
[--chunk C] [--seed S] [--panel-posterior sampled|moment] [--particles P] [--quick]`; writes
`results/panel_experiments.{json,md,png}` (`_moment` before the suffix with `--panel-posterior
moment`)
(`--quick`: 4 repetitions x 3 experiments, K = 2, to `results/panel_experiments_quick.*`;
`--plot-only`: redraw the figure from the JSON: top row the mean MSE per design, bottom row the
paired difference against the panel-aware BHC for the path-assuming BHC and passive, each
with its 95% band).
"""

from __future__ import annotations

import os
import sys
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc  # noqa: E402
from jaxctbn._compilation import use_unrolled_threefry_on_cpu  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import RESULTS, environment, stopwatch, write_results  # noqa: E402
from _paired import (  # noqa: E402
    DESIGNS,
    LABELS,
    NUM_SAMPLES,
    REFERENCE,
    TAU,
    experiment_arguments,
    make_design,
    mean_ci,
    panel_family,
    run_design,
)


class ParameterTaskWithMeanError(jc.ParameterLearningTask):
    """`ParameterLearningTask` (the same posterior, updates and `mse`) that also records
    `mean_se`, the squared error of the posterior-mean rates against the truth averaged over
    the off-diagonal rates: `mse` without the posterior-variance term."""

    metric_labels: ClassVar[dict[str, tuple[str, str]]] = {
        "mse": ("posterior MSE of the rates", "lower"),
        "mean_se": ("squared error of the posterior-mean rates", "lower"),
    }

    def metrics(self, posterior):
        total, count = 0.0, 0
        for q, q_true in zip(posterior.mean().cims, self.truth.cims):
            k = q.shape[-1]
            off = ~jnp.eye(k, dtype=bool)
            total = total + jnp.where(off, (q - q_true) ** 2, 0.0).sum()
            count += q.shape[0] * k * (k - 1)
        return {**super().metrics(posterior), "mean_se": total / count}


def summarise(runs, experiments, metric="mse"):
    """Per design: the final mean of `metric` and, paired against the reference, the
    differences."""
    mid = experiments // 2
    ref = runs[REFERENCE][metric]
    rows = {}
    for name, run in runs.items():
        mse = run[metric]
        mean, half = mean_ci(mse)
        row = {
            "mse_mean": mean.tolist(),
            "mse_ci95": half.tolist(),
            "final_mse_mean": float(mean[-1]),
            "final_mse_ci95": float(half[-1]),
            "final_mse_median": float(np.nanmedian(mse[:, -1])),
        }
        if name != REFERENCE:
            d = mse - ref  # > 0: the panel-aware design has the lower error
            ok = np.isfinite(d[:, -1])
            dm, dh = mean_ci(d)
            wins = (ref[ok, -1] < mse[ok, -1]).mean() + 0.5 * (ref[ok, -1] == mse[ok, -1]).mean()
            row.update(
                diff_mean=dm.tolist(),
                diff_ci95=dh.tolist(),
                final_diff=float(dm[-1]),
                final_diff_ci95=float(dh[-1]),
                mid_diff=float(dm[mid]),
                mid_diff_ci95=float(dh[mid]),
                final_diff_median=float(np.nanmedian(d[:, -1])),
                reference_wins=float(wins),
                paired_repetitions=int(ok.sum()),
            )
        rows[name] = row
    return rows


def plot(summary, visits, experiments, path):
    """Top row: the mean MSE per design with its 95% band; bottom row: the paired difference
    against the panel-aware BHC (design - panel-aware) with its 95% band, for the path-assuming
    BHC and passive (random's, an order of magnitude larger, would flatten them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        2, len(visits), figsize=(4.2 * len(visits), 6.4), squeeze=False, sharex=True
    )
    x = np.arange(experiments + 1)
    colors = dict(zip(DESIGNS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for col, K in enumerate(visits):
        top, bottom = axes[0][col], axes[1][col]
        for name in DESIGNS:
            row = summary[str(K)][name]
            m, h = np.asarray(row["mse_mean"]), np.asarray(row["mse_ci95"])
            top.plot(x, m, label=LABELS[name], lw=1.5, color=colors[name])
            top.fill_between(x, m - h, m + h, color=colors[name], alpha=0.2, lw=0)
            if name not in (REFERENCE, "random"):  # random is far above: see the table
                m, h = np.asarray(row["diff_mean"]), np.asarray(row["diff_ci95"])
                bottom.plot(x, m, lw=1.5, color=colors[name], label=LABELS[name])
                bottom.fill_between(x, m - h, m + h, color=colors[name], alpha=0.2, lw=0)
        times = ", ".join(f"{TAU * k / K:g}" for k in range(1, K + 1))
        top.set_title(f"K = {K} visits at {times}")
        top.set_yscale("log")
        bottom.axhline(0.0, color="k", lw=0.8)
        bottom.legend(fontsize=8, title="random: off the scale", title_fontsize=8)
        bottom.set_xlabel("experiment")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("posterior MSE of the rates")
    axes[1][0].set_ylabel("MSE difference vs panel-aware BHC\n(> 0: panel-aware better)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    args = experiment_arguments(repetitions=500, panel_posterior=True, doc=__doc__)
    if args.plot_only:
        import json

        name = "panel_experiments" + ("_moment" if args.panel_posterior == "moment" else "")
        name += "_quick" if args.quick else ""
        with open(os.path.join(RESULTS, f"{name}.json")) as f:
            saved = json.load(f)
        plot(
            saved["summary"],
            saved["settings"]["visits"],
            saved["settings"]["experiments"],
            os.path.join(RESULTS, f"{name}.png"),
        )
        return
    R, E, chunk = args.repetitions, args.experiments, args.chunk
    visits = [int(k) for k in args.visits.split(",")]
    if args.quick:
        R, E, chunk, visits = 4, 3, 4, [2]
    name = "panel_experiments" + ("_moment" if args.panel_posterior == "moment" else "")
    name += "_quick" if args.quick else ""
    family, family_text = panel_family(args)
    unrolled = use_unrolled_threefry_on_cpu()  # as the CLI: the same random bits
    truth = jc.paper_network(jax.random.key(0), rates="softmax")
    space = jc.intervention_space(truth.cardinalities)
    base = jax.random.key(args.seed)
    keys = jax.vmap(lambda r: jax.random.fold_in(base, r))(jnp.arange(R))
    total = stopwatch()
    runs, summary, summary_mean, timing, failures, choices = {}, {}, {}, {}, {}, {}
    for K in visits:
        times = TAU * np.arange(1, K + 1) / K
        panel = jc.PanelOutcome(times)
        task = ParameterTaskWithMeanError(truth, outcome=panel, panel_posterior=family)
        runs[K] = {}
        for design in DESIGNS:
            sw = stopwatch()
            run = run_design(
                task,
                make_design(design, panel),
                keys,
                metrics=("mse", "mean_se"),
                horizon=TAU,
                experiments=E,
                chunk=chunk,
                space=space,
                label=f"K={K} {design}",
            )
            runs[K][design] = run
            timing[f"{K}/{design}"] = {
                "seconds": sw.elapsed,
                "chunk_seconds": run["chunk_seconds"],
            }
            if run["failed"]:
                failures[f"{K}/{design}"] = run["failed"]
            # how often each design intervenes at all (candidate 0 = no intervention)
            choices[f"{K}/{design}"] = float((run["index"] != 0).mean())
        summary[str(K)] = summarise(runs[K], E)
        summary_mean[str(K)] = summarise(runs[K], E, "mean_se")
    wall = total.elapsed

    mid = E // 2
    settings = {
        "truth": "paper_network(key(0), rates='softmax')",
        "prior": "GammaPrior(1, 1)",
        "initial_state_policy": "RandomInitialState() (uniform, revealed)",
        "candidates": int(space.targets.shape[0]),
        "horizon": TAU,
        "num_samples": NUM_SAMPLES,
        "panel_posterior": family_text,
        "repetitions": R,
        "experiments": E,
        "midpoint_experiment": mid,
        "visits": visits,
        "visit_times": {str(K): (TAU * np.arange(1, K + 1) / K).tolist() for K in visits},
        "seed": args.seed,
        "keys": "fold_in(key(seed), r), the same for every design",
        "chunk": chunk,
        "threefry_lowering": "straight-line" if unrolled else "JAX's default",
        "command": "python benchmarks/panel/bench_panel_experiments.py"
        + "".join(" " + a for a in sys.argv[1:]),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
    payload = {
        "environment": environment(),
        "settings": settings,
        "wall_s": wall,
        "timing": timing,
        "failures": failures,
        "intervening_fraction": choices,
        "summary": summary,
        "summary_mean_se": summary_mean,
        "mse": {str(K): {d: runs[K][d]["mse"].tolist() for d in DESIGNS} for K in visits},
        "mean_se": {str(K): {d: runs[K][d]["mean_se"].tolist() for d in DESIGNS} for K in visits},
        "intervention_index": {
            str(K): {d: runs[K][d]["index"].tolist() for d in DESIGNS} for K in visits
        },
    }
    table = [
        "# Panel outcomes in the parameter experiment: panel-aware vs path-assuming design",
        "",
        f"The paper's parameter experiment (4 binary nodes, softmax rates, Gamma(1, 1) prior, "
        f"81 interventions, tau = 3, random revealed initial states, N_S = {NUM_SAMPLES}); each "
        f"experiment seen only at K equally spaced visits t_k = 3k/K, the posterior updated by "
        f"{family_text}. {R} repetitions x "
        f"{E} experiments per (K, design), the same keys for every design (paired). "
        "Two metrics, each before and after every experiment: MSE = the loop's metric, the "
        "posterior-averaged squared error of the rates (`posterior.mse`: squared error of "
        "the posterior mean + posterior variance, averaged over the 18 off-diagonal rates); "
        "SE of the mean = the squared error of the posterior-mean rates alone. "
        "Difference = design - panel-aware BHC (> 0: the panel-aware design has the lower "
        f"error), mean and 95% t interval over repetitions, at the final experiment ({E}) and "
        f"at the midpoint ({mid}). Wins = fraction of repetitions where the panel-aware BHC "
        "ends with the lower value (ties half). `intervenes`: fraction of the design's "
        "experiments with an intervention (not the empty candidate).",
        "",
        f"Command: `{settings['command']}` (one CPU core: `taskset -c 1`, OMP_NUM_THREADS=1, "
        f'XLA_FLAGS="{settings["xla_flags"]}"). Wall time {wall / 60:.1f} min.',
    ]

    def interval(m, h):
        return f"{m:+.4f} [{m - h:+.4f}, {m + h:+.4f}]"

    for title, summ, label in (
        ("Posterior MSE of the rates (the loop's `mse`)", summary, "MSE"),
        ("Squared error of the posterior-mean rates", summary_mean, "SE of the mean"),
    ):
        table += [
            "",
            f"## {title}",
            "",
            f"| K | design | final {label} (mean ± 95%) | final diff vs panel-aware [95% CI] | "
            "midpoint diff [95% CI] | panel-aware wins | intervenes |",
            "|---:|---|---:|---:|---:|---:|---:|",
        ]
        for K in visits:
            for design in DESIGNS:
                r = summ[str(K)][design]
                final = f"{r['final_mse_mean']:.4f} ± {r['final_mse_ci95']:.4f}"
                if design == REFERENCE:
                    diff = midd = wins = "–"
                else:
                    diff = interval(r["final_diff"], r["final_diff_ci95"])
                    midd = interval(r["mid_diff"], r["mid_diff_ci95"])
                    wins = f"{r['reference_wins']:.2f}"
                table.append(
                    f"| {K} | {LABELS[design]} | {final} | {diff} | {midd} | {wins} | "
                    f"{choices[f'{K}/{design}']:.2f} |"
                )
    if failures:
        table += ["", f"Failed repetitions (NaN, dropped from the statistics): {failures}"]
    table += ["", "Time per (K, design), all repetitions (first chunk includes compilation):", ""]
    table += [f"- {k}: {v['seconds']:.0f} s" for k, v in timing.items()]
    write_results(name, payload, table)
    plot(summary, visits, E, os.path.join(RESULTS, f"{name}.png"))


if __name__ == "__main__":
    main()
