"""Shared by the sequential panel-outcome benchmarks (`bench_panel_experiments.py`,
`bench_panel_structure_experiments.py`, `bench_panel_visit_times.py`): repetitions of one
design in compiled chunks, and means with 95% t intervals for paired comparisons."""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
from _common import argument_parser

import jaxctbn as jc
from jaxctbn._active_learning.designs import design_from_name

#: The sequential panel benchmarks' settings: tau, posterior draws per design step, fixed-point
#: iterations of the panel posterior, and the designs compared with the panel-aware BHC.
TAU = 3.0
NUM_SAMPLES = 10
PANEL_ITERATIONS = 10
DESIGNS = ("panel-bhc", "path-bhc", "random", "passive")
LABELS = {
    "panel-bhc": "BHC, panel-aware",
    "path-bhc": "BHC, assumes the whole path",
    "random": "random",
    "passive": "passive",
}
REFERENCE = "panel-bhc"


def make_design(name, panel):
    """The design behind a name of `DESIGNS` for the panel outcome `panel`."""
    if name == "panel-bhc":
        return jc.CriterionDesign(jc.BHC(), num_samples=NUM_SAMPLES, outcome=panel)
    if name == "path-bhc":
        # scored as if the whole path were seen (the parameter results were computed with an
        # equivalent subclass calling score_interventions(..., outcome=CompletePath()))
        return design_from_name("bhc-path", num_samples=NUM_SAMPLES, outcome=panel)
    if name == "random":
        return jc.RandomDesign()
    if name == "passive":
        return jc.PassiveDesign()
    raise ValueError(name)


def mean_ci(x, axis=0):
    """Mean and 95% t interval half-width of the mean over `axis` (NaN rows dropped)."""
    from scipy import stats

    x = np.asarray(x, float)
    n = np.sum(np.isfinite(x), axis=axis)
    mean = np.nanmean(x, axis=axis)
    sd = np.nanstd(x, axis=axis, ddof=1)
    half = stats.t.ppf(0.975, np.maximum(n - 1, 1)) * sd / np.sqrt(n)
    return mean, half


def paired_summary(runs, reference, metric):
    """Per design of `runs` (`{design: {metric: (repetitions, experiments + 1)}}`): the mean of
    `metric` per experiment with its 95% interval and, paired against `reference`, the mean
    difference (design - reference) per experiment with its interval, at the final experiment,
    and the fraction of repetitions where the design ends lower (ties half)."""
    ref = runs[reference][metric]
    rows = {}
    for name, run in runs.items():
        values = run[metric]
        mean, half = mean_ci(values)
        row = {
            "mean": mean.tolist(),
            "ci95": half.tolist(),
            "final_mean": float(mean[-1]),
            "final_ci95": float(half[-1]),
            "final_median": float(np.nanmedian(values[:, -1])),
        }
        if name != reference:
            d = values - ref
            ok = np.isfinite(d[:, -1])
            dm, dh = mean_ci(d)
            row.update(
                diff_mean=dm.tolist(),
                diff_ci95=dh.tolist(),
                final_diff=float(dm[-1]),
                final_diff_ci95=float(dh[-1]),
                final_diff_median=float(np.nanmedian(d[:, -1])),
                ends_lower=float((d[ok, -1] < 0).mean() + 0.5 * (d[ok, -1] == 0).mean()),
                paired_repetitions=int(ok.sum()),
            )
        rows[name] = row
    return rows


def run_design(task, design, keys, *, metrics, horizon, experiments, chunk, space, label):
    """All repetitions of one design, in chunks of `chunk` (one compiled program, reused):
    per metric name in `metrics` the `(repetitions, experiments + 1)` curves, the chosen
    candidates `index` (and with a panel outcome the visit `times`, `(repetitions,
    experiments, K)`), the failed repetitions and each chunk's seconds."""
    parts, failed, seconds = [], [], []
    for start in range(0, keys.shape[0], chunk):
        t0 = time.perf_counter()
        res, status = jc.run_repetitions(
            task,
            design,
            keys[start : start + chunk],
            num_experiments=experiments,
            horizon=horizon,
            candidates=space,
            throw=False,
        )
        res = jax.device_get(res)
        seconds.append(time.perf_counter() - t0)
        part = {m: np.asarray(res.metrics[m]) for m in metrics}
        part["index"] = np.asarray(res.intervention_index)
        if res.observation_times is not None:
            part["times"] = np.asarray(res.observation_times)
        parts.append(part)
        failed += [(start + i, m) for i, m in enumerate(status.messages) if m]
        done = min(start + chunk, keys.shape[0])
        print(
            f"  {label}: {done}/{keys.shape[0]} repetitions, chunk {seconds[-1]:.1f} s",
            flush=True,
        )
    out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    out.update(failed=failed, chunk_seconds=seconds)
    return out


def panel_posterior_arguments(ap: argparse.ArgumentParser) -> None:
    """`--panel-posterior sampled|moment` and `--particles` of the sequential panel
    benchmarks."""
    ap.add_argument(
        "--panel-posterior",
        choices=["sampled", "moment"],
        default="sampled",
        help="the loop's panel posterior: the particle filter (default) or the moment-matched "
        "Gamma / structural EM (the results then go to *_moment.*)",
    )
    ap.add_argument("--particles", type=int, default=256)


def panel_family(args, target: str = "parameters"):
    """The posterior family of `--panel-posterior` for the `target`, and its description."""
    if target == "structure":
        if args.panel_posterior == "moment":
            family = jc.panel.StructuralEM(PANEL_ITERATIONS)
            return family, f"structural EM from the history ({PANEL_ITERATIONS} iterations)"
        family = jc.panel.StructureParticleFilter(num_particles=args.particles)
        return family, (
            f"the structure particle filter ({args.particles} particles; exact as they grow)"
        )
    if args.panel_posterior == "moment":
        family = jc.panel.MomentMatchedGamma(PANEL_ITERATIONS)
        return family, f"the moment-matched Gamma ({PANEL_ITERATIONS} iterations)"
    family = jc.panel.ParticleFilter(num_particles=args.particles)
    return family, f"the particle filter ({args.particles} particles; exact as they grow)"


def experiment_arguments(
    repetitions: int, *, panel_posterior: bool = False, doc: str | None = None
) -> argparse.Namespace:
    """The command line of the sequential panel-outcome benchmarks (`doc`: the script's
    docstring, for `--help`)."""
    ap = argument_parser(doc)
    if panel_posterior:
        panel_posterior_arguments(ap)
    ap.add_common(repetitions=repetitions, experiments=15)
    ap.add_argument("--visits", default="2,3,5", help="comma-separated numbers of visits K")
    ap.add_common(chunk=25, seed=0, quick="4 repetitions x 3 experiments, K = 2")
    ap.add_argument(
        "--plot-only", action="store_true", help="redraw the figure from the results JSON"
    )
    return ap.parse_args()
