"""The results of an experiment summarised: means with 95% intervals, paired differences against
the passive and random designs, verdicts, and the Markdown summary table."""

from __future__ import annotations

import warnings

import numpy as np

from .config import METRICS


def _ci(x):
    """Mean and 95% normal half-width over the first axis (NaN-aware)."""
    x = np.asarray(x, float)
    n = np.sum(np.isfinite(x), axis=0)
    mean = np.nanmean(x, axis=0)
    sd = np.nanstd(x, axis=0, ddof=1) if x.shape[0] > 1 else np.zeros_like(mean)
    return mean, 1.96 * sd / np.sqrt(np.maximum(n, 1))


def summarise(target: str, results: dict[str, dict[str, np.ndarray]]) -> dict:
    """Per design and metric: mean at the last experiment and the mean over experiments 1..K
    (the area under the learning curve), each with a 95% interval over repetitions; and paired
    differences of that area against `passive` and `random` (same repetition keys). Failed
    repetitions (NaN rows) are left out; a design whose repetitions all failed gets NaN."""
    with warnings.catch_warnings():  # all-NaN slices: failures are reported separately
        warnings.simplefilter("ignore", RuntimeWarning)
        return _summarise(target, results)


def _summarise(target, results):
    summary = {}
    for design, res in results.items():
        entry = {}
        for metric in METRICS[target]:
            values = np.asarray(res[metric], float)
            final_mean, final_hw = _ci(values[:, -1])
            area_mean, area_hw = _ci(np.nanmean(values[:, 1:], axis=1))
            entry[metric] = {
                "final_mean": float(final_mean),
                "final_ci95": float(final_hw),
                "final_median": float(np.nanmedian(values[:, -1])),
                "final_q25": float(np.nanquantile(values[:, -1], 0.25)),
                "final_q75": float(np.nanquantile(values[:, -1], 0.75)),
                "area_mean": float(area_mean),
                "area_ci95": float(area_hw),
            }
            for baseline in ("passive", "random"):
                if baseline in results and baseline != design:
                    other = np.asarray(results[baseline][metric], float)
                    diff = np.nanmean(values[:, 1:], axis=1) - np.nanmean(other[:, 1:], axis=1)
                    m, hw = _ci(diff)
                    entry[metric][f"area_minus_{baseline}"] = float(m)
                    entry[metric][f"area_minus_{baseline}_ci95"] = float(hw)
        summary[design] = entry
    return summary


def verdicts(target: str, summary: dict) -> list[str]:
    """One line per design: its paired differences of the area under the learning curve against
    passive and random observation, and whether the 95% interval excludes zero ("better",
    "worse") or not ("no clear difference")."""
    lines = []
    for design, entry in summary.items():
        parts = []
        for base in ("passive", "random"):
            if design == base:
                continue
            items = []
            for metric, (label, direction) in METRICS[target].items():
                e = entry[metric]
                key = f"area_minus_{base}"
                if key not in e or not np.isfinite(e[key]):
                    continue
                m, hw = e[key], e[key + "_ci95"]
                if abs(m) <= hw or not np.isfinite(hw):
                    word = "no clear difference"
                else:
                    word = "better" if (m > 0) == (direction == "higher") else "worse"
                items.append(f"{label.split(' (')[0]} {m:+.3f} ± {hw:.3f} ({word})")
            if items:
                parts.append(f"vs {base}: " + ", ".join(items))
        if parts:
            lines.append(f"{design}: " + "; ".join(parts))
    return lines


def _describe_prior(settings: dict) -> str:
    name = {"gamma": "Gamma", "nodelman": "Nodelman"}[settings.get("prior", "gamma")]
    text = f"{name}({settings.get('alpha', 1.0)}, {settings.get('beta', 1.0)})"
    eb = settings.get("empirical_bayes")
    if eb:
        text += " with empirical Bayes" + (" (per node)" if eb["per_node"] else "")
    return text


def _describe_policy(policy) -> str:
    if policy == "random-revealed":
        return "uniform at random, revealed to the design (the paper's)"
    if isinstance(policy, dict) and "fixed" in policy:
        return f"fixed at {policy['fixed']}"
    if isinstance(policy, dict) and "distribution" in policy:
        seen = "revealed" if policy["revealed"] else "hidden from the design"
        return f"drawn from the {'uniform' if policy['distribution'] == 'uniform' else 'given'} distribution, {seen}"
    return str(policy)


def summary_table(
    target: str, summary: dict, settings: dict, failures: dict | None = None
) -> list[str]:
    """The summary as Markdown lines; `failures` (`report["failed_repetitions"]`) adds a line
    per design whose failed repetitions are left out of the means."""
    lines = [
        f"# Active {target} learning: {settings['repetitions']} repetitions x "
        f"{settings['experiments']} experiments (tau = {settings['horizon']}, "
        f"N_S = {settings['samples']}, seed {settings['seed']})",
        "",
        f"Learning prior: {_describe_prior(settings)}; initial state: "
        f"{_describe_policy(settings.get('initial_state_policy', 'random-revealed'))}.",
        "",
        "Mean ± 95% interval over repetitions. 'area' = mean over experiments 1..K (area under "
        "the learning curve); 'vs passive' / 'vs random' = paired difference of the area "
        "(same repetition keys), with its 95% interval.",
        "",
        "| design | metric | last experiment | area | vs passive | vs random |",
        "|---|---|---|---|---|---|",
    ]
    for design, entry in summary.items():
        for metric, (label, _) in METRICS[target].items():
            e = entry[metric]

            def diff(base, e=e):
                key = f"area_minus_{base}"
                if key not in e:
                    return "–"
                return f"{e[key]:+.4f} ± {e[key + '_ci95']:.4f}"

            lines.append(
                f"| {design} | {label} | {e['final_mean']:.4f} ± {e['final_ci95']:.4f} | "
                f"{e['area_mean']:.4f} ± {e['area_ci95']:.4f} | {diff('passive')} | "
                f"{diff('random')} |"
            )
    for design, failed in (failures or {}).items():
        lines.append("")
        lines.append(
            f"**{design}: {len(failed)} of {settings['repetitions']} repetitions failed** and are "
            "left out of the means (NaN in metrics.csv); `failed_repetitions` in results.json "
            "has the errors."
        )
    return lines


def round_curves(results_of_design: dict, metric: str):
    """`(rounds, mean cumulative cost, metric (repetitions, rounds + 1))` of a design run in
    rounds: the metric before any experiment and after each round, and the mean cost spent by
    the end of each round (0 first)."""
    rounds = np.asarray(results_of_design["rounds"])
    R = int(rounds.max())
    B = rounds.shape[1] // R
    values = np.asarray(results_of_design[metric], float)[:, ::B]  # entry 0 and each round's end
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        spent = np.nanmean(np.asarray(results_of_design["costs"], float)[:, B - 1 :: B], axis=0)
    return np.arange(R + 1), np.concatenate([[0.0], spent]), values


def rounds_and_costs_tables(target: str, results: dict) -> list[str]:
    """summary.md's learning curves against rounds and cumulative cost (runs with batches or
    costs; none otherwise): per design and round, the mean cost spent and each metric's mean
    with its 95% interval."""
    if not results or any("rounds" not in res for res in results.values()):
        return []
    metrics = list(METRICS[target])
    lines = [
        "",
        "Against rounds and cumulative cost (each metric after the round, mean ± 95% interval; "
        "cost: mean over repetitions):",
        "",
        "| design | round | cost | " + " | ".join(METRICS[target][m][0] for m in metrics) + " |",
        "|---|---|---|" + "---|" * len(metrics),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for design, res in results.items():
            curves = {m: round_curves(res, m) for m in metrics}
            rounds, spent, _ = curves[metrics[0]]
            for r in rounds:
                cells = []
                for m in metrics:
                    mean, hw = _ci(curves[m][2][:, r])
                    cells.append(f"{float(mean):.4g} ± {float(hw):.2g}")
                lines.append(f"| {design} | {r} | {spent[r]:.4g} | " + " | ".join(cells) + " |")
    return lines
