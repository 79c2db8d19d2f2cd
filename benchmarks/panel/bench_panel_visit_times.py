"""Does choosing *when* to look help? Visit times optimised per candidate against equally spaced
visits at the same number K, in the sequential parameter experiment (issue 36).

Two truths, each a parameter-learning loop on its known graph (Gamma(1, 1) rate prior, all 81
interventions of `jaxctbn.intervention_space`, each experiment's initial state drawn uniformly
and revealed, N_S = 10 posterior draws per design step, the panel posterior updated by
`panel_rate_posterior` in the family of `--panel-posterior`: `sampled` (default), the particle
filter of `--particles` (256); `moment`, the moment-matched Gamma with 10 iterations, the results
before issue 60, in `results/panel_visit_times_<truth>_moment.*`):

- `paper`: the paper's parameter network (`paper_network(key(0), rates="softmax")`, 4 binary
  nodes), tau = 3;
- `pbcseq`: a truth fitted to the shipped PBC panel (`jaxctbn/data/pbcseq_panel.csv`, the four
  clinical signs ascites, hepato, spiders, edema; structural EM with at most 2 parents,
  `learn_structure_from_panels`; the MAP graph at the fit's rates, per year), tau = 5 years;
- `structure`: structure learning instead, on the paper's structure network
  (`paper_network(key(0), rates="gamma")`, the posterior over graphs with in-degree <= 3 from
  the panel history, `panel_structure_posterior` in the family of `--panel-posterior`: the
  structure particle filter by default, structural EM (10 iterations) with `moment`;
  the panel BHC with each drawn graph at its posterior-mean rates), tau = 3; metrics AUROC,
  AUPR and the entropy of the structure posterior.

Each experiment is seen at time 0 and at K visits. Designs (the same keys for every design:
repetition r uses `fold_in(key(seed), r)`, so the comparison is paired):

- `bhc-chosen`: the panel BHC choosing each candidate's K times (`Panel(num_visits=K)`: Adam
  on the gaps' logits from equal spacing, 30 steps, the better of that and equal spacing kept),
  the task observing at the chosen candidate's times;
- `bhc-equal`: the panel BHC at equally spaced visits t_k = tau k / K;
- `passive`: no intervention, equally spaced visits.

Metrics before and after each experiment: `mse` (the loop's posterior-averaged squared error
of the rates) and `entropy`, the differential entropy of the rate posterior over the free rates (a Gamma's in
closed form, sum of alpha - ln beta + ln Gamma(alpha) + (1 - alpha) digamma(alpha); the particle
filter's mixture by Monte Carlo over 256 draws, nats).
Reported per truth and design: final means with 95% t intervals; paired against `bhc-equal`, the
mean difference (design - bhc-equal; < 0: the design ends lower) with a 95% t interval, and the
fraction of repetitions where the design ends lower; where the chosen times lie.

Run (one CPU core per truth, as recorded):
`OMP_NUM_THREADS=1 XLA_FLAGS="--xla_cpu_use_fusion_emitters=false
--xla_cpu_parallel_codegen_split_count=1" taskset -c 1 python
benchmarks/panel/bench_panel_visit_times.py --truth paper|pbcseq|structure [--repetitions R] [--experiments E]
[--visits K] [--chunk C] [--seed S] [--quick]`; writes `results/panel_visit_times_<truth>.{json,md}`
(`--quick`: 4 repetitions x 3 experiments, to `..._quick.*`).
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
from _common import argument_parser, environment, stopwatch, write_results  # noqa: E402
from _paired import (  # noqa: E402
    NUM_SAMPLES,
    paired_summary,
    panel_family,
    panel_posterior_arguments,
    run_design,
)

DESIGNS = ("bhc-chosen", "bhc-equal", "passive")
#: `--designs` may also name the path-assuming BHC and the panel EIG at equally spaced visits
OPTIONAL_DESIGNS = ("bhc-path", "eig-equal")
REFERENCE = "bhc-equal"
PBC_NODES = ("ascites", "hepato", "spiders", "edema")
ENTROPY_DRAWS = 256


class ParameterTaskWithEntropy(jc.ParameterLearningTask):
    """`ParameterLearningTask` that also records `entropy`, the differential entropy of the
    rate posterior over the free (off-diagonal) rates: in closed form for a Gamma, by Monte
    Carlo for the particle filter's mixture ($-\frac1S\sum_s\ln p(\Lambda_s)$ over
    `ENTROPY_DRAWS` draws, the same key at every step)."""

    metric_labels: ClassVar[dict[str, tuple[str, str]]] = {
        "mse": ("posterior MSE of the rates", "lower"),
        "entropy": ("rate posterior entropy (nats)", "lower"),
    }

    def metrics(self, posterior):
        from jax.scipy.special import digamma, gammaln

        if isinstance(posterior, jc.GammaMixturePosterior):
            draws = jax.vmap(posterior.sample)(jax.random.split(jax.random.key(0), ENTROPY_DRAWS))
            entropy = -jnp.mean(jax.vmap(posterior.log_density)(draws))
            return {**super().metrics(posterior), "entropy": entropy}
        total = 0.0
        for a, b in zip(posterior.alpha, posterior.beta):
            k = a.shape[-1]
            h = a - jnp.log(b[..., None]) + gammaln(a) + (1 - a) * digamma(a)
            total = total + jnp.where(~jnp.eye(k, dtype=bool), h, 0.0).sum()
        return {**super().metrics(posterior), "entropy": total}


def pbcseq_truth() -> jc.CTBN:
    """The MAP graph of structural EM on the PBC panel's four clinical signs, at its rates."""
    import warnings

    from jaxctbn._paths.csv import infer_cardinalities, read_csv

    df = read_csv(jc.panel.dataset_path("pbcseq_panel"))[["trajectory_id", "time", *PBC_NODES]]
    cards = infer_cardinalities(df, missing=True)
    with warnings.catch_warnings():  # patients with a single visit: reported by the reader
        warnings.simplefilter("ignore")
        observations, _ = jc.panel.PanelBuckets.from_dataframe(df, cards)
    fit = jc.panel.learn_structure_from_panels(
        observations, list(PBC_NODES), [cards[n] for n in PBC_NODES], max_parents=2
    )
    graph = fit.posterior.map_graph()
    cims = [
        jnp.asarray(q)[: int(np.prod([cards[PBC_NODES[p]] for p in ps], dtype=int))]
        for q, ps in zip(fit.model.cims, graph)
    ]
    return jc.CTBN(cims=cims, parents=tuple(tuple(ps) for ps in graph), names=PBC_NODES)


def structure_task(truth, outcome, family):
    return jc.StructureLearningTask(truth, max_parents=3, outcome=outcome, panel_posterior=family)


def make(name, K, tau):
    """The task and design of `name` with K visits in (0, tau]."""
    equal = jc.PanelOutcome(tau * np.arange(1, K + 1) / K)
    if name == "bhc-chosen":
        chosen = jc.PanelOutcome(num_visits=K)
        return chosen, jc.CriterionDesign(jc.BHC(), num_samples=NUM_SAMPLES, outcome=chosen)
    if name == "bhc-equal":
        return equal, jc.CriterionDesign(jc.BHC(), num_samples=NUM_SAMPLES, outcome=equal)
    if name == "passive":
        return equal, jc.PassiveDesign()
    if name == "eig-equal":  # the panel EIG (nested Monte Carlo) at equally spaced visits
        return equal, jc.CriterionDesign(jc.EIG(), num_samples=NUM_SAMPLES, outcome=equal)
    if name == "bhc-path":
        design = jc.CriterionDesign(
            jc.BHC(), num_samples=NUM_SAMPLES, outcome=equal, assume_complete_path=True
        )
        return equal, design
    raise ValueError(name)


def main():
    ap = argument_parser(__doc__)
    ap.add_argument("--truth", choices=["paper", "pbcseq", "structure"], default="paper")
    ap.add_common(repetitions=100, experiments=10)
    ap.add_argument("--visits", type=int, default=3)
    ap.add_common(chunk=10, seed=0, quick=True)
    ap.add_argument(
        "--designs",
        default=",".join(DESIGNS),
        help="comma-separated, among " + ", ".join(DESIGNS + OPTIONAL_DESIGNS) + " (bhc-equal "
        "is the reference; results of another set go to ..._<designs>.*)",
    )
    panel_posterior_arguments(ap)
    args = ap.parse_args()
    R, E, K, chunk = args.repetitions, args.experiments, args.visits, args.chunk
    if args.quick:
        R, E, chunk = 4, 3, 4
    target = "structure" if args.truth == "structure" else "parameters"
    family, family_text = panel_family(args, target)
    moment = args.panel_posterior == "moment"
    designs = tuple(d for d in args.designs.split(",") if d)
    if REFERENCE not in designs or not set(designs) <= set(DESIGNS + OPTIONAL_DESIGNS):
        raise SystemExit(f"--designs: include {REFERENCE}; valid: {DESIGNS + OPTIONAL_DESIGNS}")
    name = f"panel_visit_times_{args.truth}" + ("_moment" if moment else "")
    if designs != DESIGNS:
        name += "_" + "-".join(designs)
    name += "_quick" if args.quick else ""
    unrolled = use_unrolled_threefry_on_cpu()  # as the CLI: the same random bits
    if args.truth == "paper":
        truth, tau = jc.paper_network(jax.random.key(0), rates="softmax"), 3.0
    elif args.truth == "structure":
        truth, tau = jc.paper_network(jax.random.key(0), rates="gamma"), 3.0
    else:
        truth, tau = pbcseq_truth(), 5.0
    if args.truth == "structure":
        metrics = {"auroc": "AUROC", "aupr": "AUPR", "entropy": "structure entropy (nats)"}
    else:
        metrics = {"mse": "posterior MSE of the rates", "entropy": "rate entropy (nats)"}
    space = jc.intervention_space(truth.cardinalities)
    base = jax.random.key(args.seed)
    keys = jax.vmap(lambda r: jax.random.fold_in(base, r))(jnp.arange(R))
    total = stopwatch()
    runs, timing = {}, {}
    for design_name in designs:
        outcome, design = make(design_name, K, tau)
        if args.truth == "structure":
            task = structure_task(truth, outcome, family)
        else:
            task = ParameterTaskWithEntropy(truth, outcome=outcome, panel_posterior=family)
        with stopwatch() as sw:
            runs[design_name] = run_design(
                task,
                design,
                keys,
                metrics=tuple(metrics),
                horizon=tau,
                experiments=E,
                chunk=chunk,
                space=space,
                label=design_name,
            )
        timing[design_name] = sw.seconds
    wall = total.elapsed
    summary = {m: paired_summary(runs, REFERENCE, m) for m in metrics}
    equal_times = tau * np.arange(1, K + 1) / K
    intervenes = {d: float((runs[d]["index"] != 0).mean()) for d in designs}
    settings = {
        "truth": {
            "paper": "paper_network(key(0), rates='softmax')",
            "structure": "paper_network(key(0), rates='gamma'), structure learning",
            "pbcseq": "structural EM on pbcseq_panel.csv (ascites, hepato, spiders, edema; max "
            "2 parents), the MAP graph at the fit's rates (per year)",
        }[args.truth],
        "truth_network": truth.to_dict(),
        "prior": "GammaPrior(1, 1)",
        "horizon": tau,
        "visits": K,
        "equally_spaced_times": equal_times.tolist(),
        "candidates": int(space.targets.shape[0]),
        "num_samples": NUM_SAMPLES,
        "panel_posterior": family_text,
        "repetitions": R,
        "experiments": E,
        "seed": args.seed,
        "threefry_lowering": "straight-line" if unrolled else "JAX's default",
        "command": "python benchmarks/panel/bench_panel_visit_times.py"
        + "".join(" " + a for a in sys.argv[1:]),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
    payload = {
        "environment": environment(),
        "settings": settings,
        "wall_s": wall,
        "timing_s": timing,
        "summary": summary,
        "intervening_fraction": intervenes,
        "curves": {m: {d: runs[d][m].tolist() for d in designs} for m in metrics},
        "intervention_index": {d: runs[d]["index"].tolist() for d in designs},
        "failures": {d: runs[d]["failed"] for d in designs if runs[d]["failed"]},
    }
    graph = "; ".join(
        f"{truth.names[n]} <- {','.join(truth.names[p] for p in ps) or '(none)'}"
        for n, ps in enumerate(truth.parents)
    )
    learning = (
        "Structure learning (the graph posterior with in-degree <= 3 from the panel history) "
        f"of the paper's structure network ({graph})"
        if args.truth == "structure"
        else f"Parameter learning on the known graph ({graph})"
    )
    table = [
        f"# Chosen vs equally spaced visit times, {args.truth} truth",
        "",
        f"{learning}, Gamma(1, 1) prior, 81 interventions, "
        f"tau = {tau:g}, K = {K} visits, random revealed initial states, N_S = {NUM_SAMPLES}; the "
        f"panel posterior by {family_text}. {R} repetitions x {E} experiments per "
        "design, the same keys for every design (paired). Difference = design - BHC at equally "
        "spaced visits (< 0: the design ends lower; lower is better for the error and the "
        "entropy, higher for AUROC/AUPR), mean [95% t interval] at the final experiment; `ends "
        "lower` = fraction of repetitions where it does (ties half).",
        "",
        f"Command: `{settings['command']}` (one CPU core, OMP_NUM_THREADS=1, "
        f'XLA_FLAGS="{settings["xla_flags"]}"). Wall time {wall / 60:.1f} min.',
    ]
    for metric, label in metrics.items():
        table += [
            "",
            f"## {label}",
            "",
            "| design | final (mean ± 95%) | diff vs bhc-equal [95% CI] | ends lower | intervenes |",
            "|---|---:|---:|---:|---:|",
        ]
        for d in designs:
            r = summary[metric][d]
            final = f"{r['final_mean']:.4g} ± {r['final_ci95']:.2g}"
            if d == REFERENCE:
                diff = lower = "–"
            else:
                m, h = r["final_diff"], r["final_diff_ci95"]
                diff = f"{m:+.4g} [{m - h:+.4g}, {m + h:+.4g}]"
                lower = f"{r['ends_lower']:.2f}"
            table.append(f"| {d} | {final} | {diff} | {lower} | {intervenes[d]:.2f} |")
    if "bhc-chosen" in runs:
        chosen_times = runs["bhc-chosen"]["times"]  # (R, E, K)
        moved = np.abs(chosen_times - equal_times).max(-1) > 1e-6 * tau
        mean_times = chosen_times.reshape(-1, K).mean(0)
        table += [
            "",
            f"Chosen times: in {moved.mean():.0%} of the experiments the BHC's chosen candidate "
            f"kept times away from equal spacing ({', '.join(f'{t:g}' for t in equal_times)}); "
            f"mean chosen times {', '.join(f'{t:.3g}' for t in mean_times)}.",
        ]
        payload["chosen_times"] = chosen_times.tolist()
        payload["chosen_times_moved_fraction"] = float(moved.mean())
    table += [
        "",
        "Seconds per design (all repetitions, first chunk with compilation): "
        + ", ".join(f"{d} {s:.0f}" for d, s in timing.items()),
    ]
    write_results(name, payload, table)


if __name__ == "__main__":
    main()
