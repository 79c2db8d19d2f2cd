"""The output directory of an experiment: atomic writes, the settings check before a rerun,
resumable chunk files, and the result files (metrics.csv, results.json, summary.md, figures)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings
import zipfile
import zlib
from typing import Any

import numpy as np

from .._files import json_bytes, write_atomically
from .._model.frames import intervention_labels
from .config import _LATER_SETTINGS, METRICS
from .report import round_curves, rounds_and_costs_tables, summary_table, verdicts


def _plot(target, results, names, out_dir, settings):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = list(METRICS[target])
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for design, res in results.items():
            v = np.asarray(res[metric], float)
            k = np.arange(v.shape[1])
            if target == "parameters":  # the paper: mean and 25-75% band
                lo, hi = np.nanquantile(v, 0.25, axis=0), np.nanquantile(v, 0.75, axis=0)
            else:  # the paper: mean and variance band (± one standard deviation)
                sd = np.nanstd(v, axis=0)
                lo, hi = np.nanmean(v, 0) - sd, np.nanmean(v, 0) + sd
            (line,) = ax.plot(k, np.nanmean(v, 0), label=design)
            ax.fill_between(k, lo, hi, color=line.get_color(), alpha=0.15)
        ax.set_xlabel("experiments")
        ax.set_title(METRICS[target][metric][0], fontsize=10)
        values = np.concatenate([np.ravel(res[metric]) for res in results.values()])
        if metric == "mse" and np.any(np.isfinite(values) & (values > 0)):
            ax.set_yscale("log")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"active {target} learning, {settings['repetitions']} repetitions", fontsize=10)
    if all("rounds" in res for res in results.values()):
        plt.close(fig)
        fig = _plot_rounds(target, results, settings)
    fig.tight_layout()
    write_atomically(
        os.path.join(out_dir, "figure.png"), lambda f: fig.savefig(f, dpi=120, format="png")
    )
    plt.close(fig)

    designs = list(results)
    fig, axes = plt.subplots(1, len(designs), figsize=(2.6 * len(designs) + 1, 2.6), squeeze=False)
    for ax, design in zip(axes[0], designs):
        p = np.asarray(results[design]["targets"], float).mean(0).T  # (nodes, experiments)
        im = ax.imshow(p, vmin=0, vmax=1, aspect="auto", cmap="viridis", origin="lower")
        ax.set_yticks(range(len(names)), names)
        ax.set_xticks(range(p.shape[1]), [str(i + 1) for i in range(p.shape[1])], fontsize=6)
        ax.set_xlabel("experiment")
        ax.set_title(design, fontsize=9)
    fig.colorbar(im, ax=axes[0].tolist(), label="P(intervene on node)")
    write_atomically(
        os.path.join(out_dir, "interventions.png"),
        lambda f: fig.savefig(f, dpi=120, format="png"),
    )
    plt.close(fig)


def _plot_rounds(target, results, settings):
    """Learning curves against experiments, rounds and cumulative cost (one row each)."""
    import matplotlib.pyplot as plt

    metrics = list(METRICS[target])
    fig, axes = plt.subplots(3, len(metrics), figsize=(4.2 * len(metrics), 9.6), squeeze=False)
    for j, metric in enumerate(metrics):
        for design, res in results.items():
            v = np.asarray(res[metric], float)
            (line,) = axes[0][j].plot(np.arange(v.shape[1]), np.nanmean(v, 0), label=design)
            rounds, spent, per_round = round_curves(res, metric)
            mean = np.nanmean(per_round, 0)
            axes[1][j].plot(rounds, mean, marker="o", ms=3, color=line.get_color())
            axes[2][j].plot(spent, mean, marker="o", ms=3, color=line.get_color())
        for row, label in enumerate(["experiments", "rounds", "cumulative cost"]):
            axes[row][j].set_xlabel(label)
            axes[row][j].set_title(METRICS[target][metric][0], fontsize=10)
            values = np.concatenate([np.ravel(res[metric]) for res in results.values()])
            if metric == "mse" and np.any(np.isfinite(values) & (values > 0)):
                axes[row][j].set_yscale("log")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(
        f"active {target} learning, {settings['repetitions']} repetitions, batches of "
        f"{settings.get('batch', 1)}",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def _visit_times_column(outcome: dict):
    """metrics.csv's `observation_times` of a panel outcome (`T1;T2;...`, each experiment's
    own with `visits`), as `fn(result, repetition, experiment)`; `None` for complete paths."""
    if outcome["type"] != "panel":
        return None
    if "visits" in outcome:
        return lambda res, r, e: ";".join(f"{t:.6g}" for t in res["observation_times"][r, e])
    given = ";".join(f"{t:.6g}" for t in outcome["observation_times"])
    return lambda res, r, e: given


def _write_outputs(target, report, truth, out, extra_columns=None):
    """`extra_columns`: `{column: {design: (repetitions, experiments) values}}` added to
    metrics.csv (empty at experiment 0), e.g. the pool experiment's subject ids."""
    import pandas as pd

    settings, results = report["settings"], report["results"]
    names = list(truth.names)
    visit_times = _visit_times_column(settings.get("outcome", {"type": "path"}))
    rows = []
    for design, res in results.items():
        R, K1 = np.asarray(res[next(iter(METRICS[target]))]).shape
        for r in range(R):
            ivs = intervention_labels(names, res["targets"][r], res["states"][r])
            if "rounds" in res:  # an experiment the budget could not afford did not run
                skipped = np.asarray(res["intervention_index"][r]) < 0
                ivs = ["skipped" if s else label for label, s in zip(ivs, skipped)]
            inits = [
                ";".join(f"{names[n]}={int(s[n])}" for n in range(len(names)))
                for s in res["initial_states"][r]
            ]
            for k in range(K1):
                row = {"design": design, "repetition": r, "experiment": k}
                for metric in METRICS[target]:
                    row[metric] = float(res[metric][r, k])
                row["intervention"] = ivs[k - 1] if k > 0 else ""
                row["initial_state"] = inits[k - 1] if k > 0 else ""
                if visit_times is not None:
                    row["observation_times"] = visit_times(res, r, k - 1) if k > 0 else ""
                if "rounds" in res:
                    row["round"] = int(res["rounds"][r, k - 1]) if k > 0 else 0
                    row["cost"] = float(res["costs"][r, k - 1]) if k > 0 else 0.0
                else:
                    row["round"] = k
                    row["cost"] = ""
                for column, values in (extra_columns or {}).items():
                    row[column] = values[design][r, k - 1] if k > 0 else ""
                rows.append(row)
    frame = pd.DataFrame(rows)
    write_atomically(
        os.path.join(out, "metrics.csv"), lambda f: f.write(frame.to_csv(index=False).encode())
    )
    payload = {
        "settings": settings,
        "timing": report["timing"],
        "summary": report["summary"],
        "failed_repetitions": report["failed_repetitions"],
        **({"input_format": report["input_format"]} if "input_format" in report else {}),
        "designs": {
            design: {
                "metrics": {m: np.asarray(res[m]).tolist() for m in METRICS[target]},
                "intervention_index": np.asarray(res["intervention_index"]).tolist(),
                **(
                    {"observation_times": np.asarray(res["observation_times"]).tolist()}
                    if "observation_times" in res
                    else {}
                ),
                # the pool's particle filter: each repetition's bound on a bridge
                **(
                    {"max_candidates": np.asarray(res["max_candidates"]).tolist()}
                    if "max_candidates" in res
                    else {}
                ),
                **(
                    {
                        "rounds": np.asarray(res["rounds"]).tolist(),
                        "costs": np.asarray(res["costs"]).tolist(),
                    }
                    if "rounds" in res
                    else {}
                ),
            }
            for design, res in results.items()
        },
    }
    write_atomically(os.path.join(out, "results.json"), lambda f: f.write(json_bytes(payload)))
    lines = summary_table(target, report["summary"], settings, report["failed_repetitions"])
    lines += ["", "Verdict (area under the learning curve, paired, 95% interval):", ""]
    lines += [f"- {line}" for line in verdicts(target, report["summary"])]
    lines += rounds_and_costs_tables(target, results)
    write_atomically(
        os.path.join(out, "summary.md"), lambda f: f.write(("\n".join(lines) + "\n").encode())
    )
    with warnings.catch_warnings():  # all-NaN designs (failures are reported separately)
        warnings.simplefilter("ignore", RuntimeWarning)
        _plot(target, results, names, out, settings)


# ------------------------------------------------------------------ the output directory

#: Files derived from a finished run (removed when a changed run starts in the directory).
_OUTPUTS = ("metrics.csv", "results.json", "summary.md", "figure.png", "interventions.png")
#: Settings that may change between runs that share chunks.
_FREE_SETTINGS = ("designs", "repetitions")


def _describe_differences(old: dict, new: dict) -> str:
    diffs = []
    # a setting missing on either side (written before it existed, or not one of this kind of
    # run's, e.g. the pool's outcome) holds its default
    old = {**_LATER_SETTINGS, **old}
    new = {**_LATER_SETTINGS, **new}
    for key in sorted(set(old) | set(new)):
        if key in _FREE_SETTINGS or old.get(key) == new.get(key):
            continue
        if key == "truth":
            diffs.append("truth")
        else:
            diffs.append(f"{key} {old.get(key)!r} -> {new.get(key)!r}")
    return ", ".join(diffs)


def _prepare_out(out: str, settings: dict, overwrite: bool) -> str:
    """Check that `out` holds nothing or a run with compatible settings, and remove what a
    changed run would leave stale. Returns the chunk directory."""
    os.makedirs(out, exist_ok=True)
    chunk_dir = os.path.join(out, "chunks")
    cfg_path = os.path.join(out, "config.json")
    new = json.loads(json.dumps(settings))
    hint = "choose another directory or pass --overwrite (overwrite=True) to discard it"
    if overwrite:
        shutil.rmtree(chunk_dir, ignore_errors=True)
        old = None
    elif os.path.exists(cfg_path):
        try:
            with open(cfg_path) as f:
                old = json.load(f)
            if not isinstance(old, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as error:
            raise ValueError(
                f"out: {cfg_path} is unreadable ({error}), so the results in {out} cannot be "
                f"checked; {hint}."
            ) from None
        diffs = _describe_differences(old, new)
        if diffs:
            raise ValueError(f"out: {out} holds a run with other settings ({diffs}); {hint}.")
    else:
        old = None
        if os.path.isdir(chunk_dir) and any(files for _, _, files in os.walk(chunk_dir)):
            raise ValueError(f"out: {out} holds chunk files but no config.json; {hint}.")
    if old != new:  # other designs or repetitions, or a fresh start: old summaries are stale
        for name in _OUTPUTS:
            path = os.path.join(out, name)
            if os.path.exists(path):
                os.remove(path)
    return chunk_dir


def _chunk_layout(
    target, reps, experiments, nodes, visits=None, rounds=False
) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every array of a chunk file: name -> (shape, numpy dtype kinds); `visits`: the number
    of visit times the designs choose per experiment (`observation_times`), if they do;
    `rounds`: whether each experiment's round and cumulative cost are kept (batches, costs)."""
    layout: dict[str, tuple[tuple[int, ...], str]] = {
        f"metric_{m}": ((reps, experiments + 1), "f") for m in METRICS[target]
    }
    layout.update(
        intervention_index=((reps, experiments), "iu"),
        targets=((reps, experiments, nodes), "b"),
        states=((reps, experiments, nodes), "iu"),
        initial_states=((reps, experiments, nodes), "iu"),
        num_events=((reps, experiments), "iu"),
        errors=((reps,), "U"),
    )
    if visits is not None:
        layout["observation_times"] = ((reps, experiments, visits), "f")
    if rounds:
        layout["rounds"] = ((reps, experiments), "iu")
        layout["costs"] = ((reps, experiments), "f")
    if target == "pool":  # subjects drawn from a pool: no simulated paths
        del layout["num_events"]
        layout["subjects"] = ((reps, experiments), "iu")
        # the particle filter's bound on a bridge's uniformisation times (0: not used)
        layout["max_candidates"] = ((reps,), "iu")
    return layout


#: The entry of a chunk file that holds the SHA-256 of its arrays.
_CHECKSUM = "checksum"


def _chunk_checksum(part: dict[str, np.ndarray]) -> str:
    """SHA-256 of every array of a chunk (name, dtype, shape and bytes, in name order)."""
    import hashlib

    digest = hashlib.sha256()
    for name in sorted(part):
        if name == _CHECKSUM:
            continue
        a = np.ascontiguousarray(part[name])
        digest.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


def _save_chunk(path: str, part: dict[str, np.ndarray]) -> None:
    """A finished chunk's arrays and their checksum, written atomically."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    stored: dict[str, Any] = {**part, _CHECKSUM: np.asarray(_chunk_checksum(part))}
    write_atomically(path, lambda f: np.savez(f, **stored))


def _load_chunk(
    path, target, reps, experiments, nodes, visits=None, rounds=False
) -> dict[str, np.ndarray] | None:
    """The arrays of a finished chunk, or `None` when it must be computed: missing, or damaged
    or edited (its arrays no longer match the checksum written with them; then a line on stderr
    names the file and why). Chunks written before checksums were kept have none and are
    reused after the layout checks alone."""
    if not os.path.exists(path):
        return None
    layout = _chunk_layout(target, reps, experiments, nodes, visits, rounds)
    try:
        with np.load(path, allow_pickle=False) as z:
            files = set(z.files) - {_CHECKSUM}
            if files != set(layout):
                missing, extra = set(layout) - files, files - set(layout)
                raise KeyError(
                    f"missing {sorted(missing)}" if missing else f"unexpected {sorted(extra)}"
                )
            part = {name: z[name] for name in layout}
            stored = str(z[_CHECKSUM]) if _CHECKSUM in z.files else None
        if stored is not None and stored != _chunk_checksum(part):
            raise ValueError("its arrays do not match the checksum written with them (edited?)")
        for name, (shape, kinds) in layout.items():
            a = part[name]
            if a.shape != shape or a.dtype.kind not in kinds:
                raise ValueError(
                    f"{name} has shape {a.shape} and dtype {a.dtype}, expected {shape}"
                )
        ok = part["errors"] == ""
        checked = [f"metric_{m}" for m in METRICS[target]]
        if visits is not None:
            checked.append("observation_times")
        if rounds:
            checked.append("costs")
        for m in checked:
            if not np.all(np.isfinite(part[m][ok])):
                raise ValueError(f"{m} is not finite in a finished repetition")
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(
            f"jaxctbn run: chunk file {path} is damaged ({type(error).__name__}: {reason}); "
            "recomputing it.",
            file=sys.stderr,
        )
        return None
    return part


def _record_failures(failures, design, start, errors) -> None:
    for r, message in enumerate(np.asarray(errors, dtype=str)):
        if message:
            failures.setdefault(design, []).append({"repetition": start + r, "error": str(message)})
            print(
                f"jaxctbn run: {design} repetition {start + r} failed: {message}",
                file=sys.stderr,
            )
