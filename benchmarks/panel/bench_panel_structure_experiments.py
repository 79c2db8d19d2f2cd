"""Does designing for a panel outcome help structure learning? The paper's structure experiment
with panel outcomes, panel-aware design against the paper's path-assuming design (the
structure counterpart of `bench_panel_experiments.py`).

The experiment: the paper's structure experiment (`jaxctbn.paper_network(key(0),
rates="gamma")`, the 4-node fast/slow network of `jaxctbn run structure`, Gamma(5, 1) /
Gamma(1/5, 1) rates), exact posterior over every graph with in-degree <= 3 (`run structure`'s
default `max_parents`, N - 1), Gamma(1, 1) rate prior, all 81 interventions of
`jaxctbn.intervention_space`, tau = 3, each experiment's initial state drawn uniformly and
revealed to the design (the paper's, `RandomInitialState()`), N_S = 10 posterior draws per
design step. Each simulated experiment reveals only its global state at K visits equally spaced
in (0, 3] (t_k = 3k/K, K in 2, 3, 5): the task is
`StructureLearningTask(truth, max_parents=3, outcome=Panel(times), panel_posterior=family)`,
whose posterior is updated by `jaxctbn.panel.panel_structure_posterior` after each experiment:
`--panel-posterior sampled` (default) the structure particle filter
(`StructureParticleFilter(num_particles=--particles)`, 256; exact as the particles grow),
`moment` structural EM from the history (10 iterations, an assumed-density filter; results to
`*_moment.*`). Designs:

- `panel-bhc`: the BHC scored under the outcome the experiment really has,
  `CriterionDesign(BHC(), outcome=Panel(times))` (panel-aware; its panel structure divergences
  use the default `PlugIn()` estimator: each drawn graph at its posterior-mean rates);
- `path-bhc`: the BHC scored as if the whole path were seen (the paper's design),
  `design_from_name("bhc-path", outcome=Panel(times))` =
  `CriterionDesign(BHC(), outcome=Panel(times), assume_complete_path=True)`;
- `random` (uniform over the 81) and `passive` (no intervention).

Every design runs with the same keys (repetition r uses `fold_in(key(seed), r)`, as `jaxctbn
run`), so the initial states and the random streams are shared: the comparison is paired.
Metrics, before and after each experiment, the structure task's own: edge AUROC and AUPR of the
posterior edge marginals against the true graph (higher is better), SHD of the MAP graph and the
entropy of the structure posterior in nats (lower is better). Reported per K, design and
metric: the final mean with a 95% t interval of the mean; paired against `panel-bhc`, the mean
difference (design - panel-bhc) with a 95% t interval over repetitions at the final experiment
and at the midpoint (experiment E // 2): for AUROC and AUPR a difference < 0 means the
panel-aware design is better, for entropy and SHD a difference > 0; the fraction of repetitions
where `panel-bhc` ends better than the design (ties half).

Sizes: the paper's structure runs use 500 repetitions x 15 experiments
(`results/active_structure/config.json`); the defaults here are 15 experiments and 100
repetitions per (K, design) (see `results/panel_structure_experiments.md` for what was run and
its cost).

Run (pinned to one core, as the recorded run):
`OMP_NUM_THREADS=1 XLA_FLAGS="--xla_cpu_use_fusion_emitters=false
--xla_cpu_parallel_codegen_split_count=1" taskset -c 1 python
benchmarks/panel/bench_panel_structure_experiments.py [--repetitions R] [--experiments E]
[--visits 2,3,5] [--chunk C] [--seed S] [--quick]`; writes
`results/panel_structure_experiments.{json,md,png}` (`--quick`: 4 repetitions x 3 experiments,
K = 2, to `results/panel_structure_experiments_quick.*`; `--plot-only`: redraw the figure from
the JSON: AUROC (top row) and entropy (bottom row) against the experiment, one column per K,
one line per design with its 95% band).
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc  # noqa: E402
from jaxctbn._compilation import use_unrolled_threefry_on_cpu  # noqa: E402
from jaxctbn._experiments.config import default_max_parents  # noqa: E402

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
    paired_summary,
    panel_family,
    run_design,
)

#: The structure task's metrics, their labels and which direction is better.
METRICS = jc.StructureLearningTask.metric_labels
#: The metrics whose paired differences are tabulated (SHD is in the JSON and a final table).
REPORTED = ("auroc", "aupr", "entropy")


def summarise(runs, experiments, metric):
    """Per design: `paired_summary` against the reference, plus the difference at the midpoint
    experiment and the reference's win fraction (by `metric`'s direction)."""
    mid = experiments // 2
    rows = paired_summary(runs, REFERENCE, metric)
    higher = METRICS[metric][1] == "higher"
    ref = runs[REFERENCE][metric]
    for name, row in rows.items():
        if name == REFERENCE:
            continue
        x = runs[name][metric]
        d = x - ref
        ok = np.isfinite(d[:, -1])
        dm, dh = mean_ci(d)
        better = ref[ok, -1] > x[ok, -1] if higher else ref[ok, -1] < x[ok, -1]
        wins = better.mean() + 0.5 * (ref[ok, -1] == x[ok, -1]).mean()
        row.update(
            mid_diff=float(dm[mid]), mid_diff_ci95=float(dh[mid]), reference_wins=float(wins)
        )
    return rows


def plot(summary, visits, experiments, path):
    """AUROC (top row) and structure posterior entropy (bottom row) against the experiment,
    one column per K, one line per design with its 95% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        2, len(visits), figsize=(4.2 * len(visits), 6.4), squeeze=False, sharex=True
    )
    x = np.arange(experiments + 1)
    colors = dict(zip(DESIGNS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for col, K in enumerate(visits):
        for row, metric in enumerate(("auroc", "entropy")):
            ax = axes[row][col]
            for name in DESIGNS:
                r = summary[str(K)][metric][name]
                m, h = np.asarray(r["mean"]), np.asarray(r["ci95"])
                ax.plot(x, m, label=LABELS[name], lw=1.5, color=colors[name])
                ax.fill_between(x, m - h, m + h, color=colors[name], alpha=0.2, lw=0)
            ax.grid(alpha=0.3)
        times = ", ".join(f"{TAU * k / K:g}" for k in range(1, K + 1))
        axes[0][col].set_title(f"K = {K} visits at {times}")
        axes[1][col].set_xlabel("experiment")
    axes[0][0].set_ylabel("edge AUROC (higher is better)")
    axes[1][0].set_ylabel("structure posterior entropy, nats\n(lower is better)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    args = experiment_arguments(repetitions=100, panel_posterior=True, doc=__doc__)
    name = (
        "panel_structure_experiments"
        + ("_moment" if args.panel_posterior == "moment" else "")
        + ("_quick" if args.quick else "")
    )
    family, family_text = panel_family(args, "structure")
    if args.plot_only:
        import json

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
    unrolled = use_unrolled_threefry_on_cpu()  # as the CLI: the same random bits
    truth = jc.paper_network(jax.random.key(0), rates="gamma")
    max_parents = default_max_parents(truth.num_nodes, None)
    space = jc.intervention_space(truth.cardinalities)
    base = jax.random.key(args.seed)
    keys = jax.vmap(lambda r: jax.random.fold_in(base, r))(jnp.arange(R))
    total = stopwatch()
    runs, summary, timing, failures, choices = {}, {}, {}, {}, {}

    def write(done):
        """Write the results of the K values done so far (all of them at the end)."""
        wall = total.elapsed
        mid = E // 2
        settings = {
            "truth": "paper_network(key(0), rates='gamma')",
            "max_parents": max_parents,
            "prior": "GammaPrior(1, 1)",
            "initial_state_policy": "RandomInitialState() (uniform, revealed)",
            "candidates": int(space.targets.shape[0]),
            "horizon": TAU,
            "num_samples": NUM_SAMPLES,
            "panel_posterior": family_text,
            "panel_estimator": "PlugIn() (the default: graphs at posterior-mean rates)",
            "repetitions": R,
            "experiments": E,
            "midpoint_experiment": mid,
            "visits": done,
            "visits_requested": visits,
            "visit_times": {str(K): (TAU * np.arange(1, K + 1) / K).tolist() for K in done},
            "seed": args.seed,
            "keys": "fold_in(key(seed), r), the same for every design",
            "chunk": chunk,
            "threefry_lowering": "straight-line" if unrolled else "JAX's default",
            "command": "python benchmarks/panel/bench_panel_structure_experiments.py"
            + "".join(" " + a for a in sys.argv[1:]),
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
            "cores": f"{len(os.sched_getaffinity(0))} CPU core(s) available to the process",
        }
        payload = {
            "environment": environment(),
            "settings": settings,
            "wall_s": wall,
            "timing": timing,
            "failures": failures,
            "intervening_fraction": choices,
            "metric_labels": {m: list(v) for m, v in METRICS.items()},
            "summary": summary,
            "metrics": {
                str(K): {m: {d: runs[K][d][m].tolist() for d in DESIGNS} for m in METRICS}
                for K in done
            },
            "intervention_index": {
                str(K): {d: runs[K][d]["index"].tolist() for d in DESIGNS} for K in done
            },
        }
        table = [
            "# Panel outcomes in the structure experiment: panel-aware vs path-assuming design",
            "",
            f"The paper's structure experiment (4 binary nodes, the fast/slow Gamma(5,1)/Gamma(1/5,1) "
            f"truth, exact posterior over all graphs with in-degree <= {max_parents}, Gamma(1, 1) "
            f"rate prior, 81 interventions, tau = 3, random revealed initial states, "
            f"N_S = {NUM_SAMPLES}); each experiment seen only at K equally spaced visits "
            f"t_k = 3k/K, the structure posterior updated after each experiment by {family_text}. "
            "Entropy: of the posterior over whole graphs (the particle filter's mixture: "
            "enumerated). Panel-aware BHC = `CriterionDesign(BHC(), "
            "outcome=Panel(times))` (PlugIn() panel divergences); path-assuming BHC = "
            "`design_from_name('bhc-path', outcome=Panel(times))` (scored as if the whole path "
            "were seen; under the particle filter it scores the mixture's moment-matched "
            f"posterior). {R} repetitions x {E} experiments per (K, design), the same keys for "
            "every design (paired). Difference = design - panel-aware BHC, mean and 95% t interval "
            f"over repetitions, at the final experiment ({E}) and at the midpoint ({mid}); for "
            "AUROC and AUPR (higher is better) a difference < 0 means the panel-aware design is "
            "better, for entropy and SHD (lower is better) a difference > 0. An interval that "
            "contains 0: no detectable difference. Wins = fraction of repetitions where the "
            "panel-aware BHC ends better (ties half). `intervenes`: fraction of the design's "
            "experiments with an intervention (not the empty candidate).",
            "",
            f"Command: `{settings['command']}` ({settings['cores']}, "
            f'OMP_NUM_THREADS={settings["omp_num_threads"]}, XLA_FLAGS="{settings["xla_flags"]}"). '
            f"Wall time {wall / 60:.1f} min.",
        ]

        if len(done) < len(visits):
            table += [
                "",
                f"Partial: K = {', '.join(map(str, done))} done of "
                f"{', '.join(map(str, visits))} (written after each K).",
            ]

        def interval(m, h):
            return f"{m:+.4f} [{m - h:+.4f}, {m + h:+.4f}]"

        for metric in (*REPORTED, "shd"):
            label, direction = METRICS[metric]
            better = "< 0" if direction == "higher" else "> 0"
            table += [
                "",
                f"## {label} ({direction} is better; difference {better}: panel-aware better)",
                "",
                "| K | design | final (mean ± 95%) | final diff vs panel-aware [95% CI] | "
                "midpoint diff [95% CI] | panel-aware wins | intervenes |",
                "|---:|---|---:|---:|---:|---:|---:|",
            ]
            for K in done:
                for design in DESIGNS:
                    r = summary[str(K)][metric][design]
                    final = f"{r['final_mean']:.4f} ± {r['final_ci95']:.4f}"
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
        table += [
            "",
            "Time per (K, design), all repetitions (first chunk includes compilation):",
            "",
        ]
        table += [f"- {k}: {v['seconds']:.0f} s" for k, v in timing.items()]
        write_results(name, payload, table)
        plot(summary, done, E, os.path.join(RESULTS, f"{name}.png"))

    for K in visits:
        times = TAU * np.arange(1, K + 1) / K
        panel = jc.PanelOutcome(times)
        task = jc.StructureLearningTask(
            truth, max_parents=max_parents, outcome=panel, panel_posterior=family
        )
        runs[K] = {}
        for design in DESIGNS:
            sw = stopwatch()
            run = run_design(
                task,
                make_design(design, panel),
                keys,
                metrics=tuple(METRICS),
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
        summary[str(K)] = {m: summarise(runs[K], E, m) for m in METRICS}
        write(visits[: visits.index(K) + 1])


if __name__ == "__main__":
    main()
