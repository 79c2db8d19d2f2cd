"""The paper's synthetic experiments (§6) on the host: chunks of repetitions, resumable result
files, summary statistics, tables and figures. `jaxctbn run` is a thin layer over
[`jaxctbn.experiments.run_experiment`][].

Output layout of `run_experiment(..., out=DIR)`:

- `DIR/config.json`: every setting, and the ground truth (`DIR/truth.json`, a network JSON);
- `DIR/chunks/<design>/<first>-<last>.npz`: finished repetitions, written as they finish; a
  rerun with the same settings loads them instead of recomputing (resume after interruption).
  A damaged chunk file (truncated, edited, missing keys or wrong shapes) is reported on stderr
  and recomputed. A rerun with other settings into the same directory is refused unless
  `overwrite=True` (`--overwrite`), which discards the old results;
- `DIR/processes/<i>.done`, `<i>.failed`: written by process `i` of a distributed run
  (`distributed=True`) when it has finished its chunks, or failed;
- `DIR/metrics.csv`: one row per design x repetition x experiment: `design, repetition,
  experiment` (0 = before any experiment), every metric, `intervention` (e.g. `X1=0;X3=1`,
  `none`; empty at experiment 0; `skipped` for an experiment the budget could not afford),
  `initial_state`, `round` (the batch the experiment ran in, from 1; 0 at experiment 0) and
  `cost` (the cumulative cost after it; empty without costs);
- `DIR/results.json`: the settings, per design every metric per repetition
  (`[repetition][experiment]`), the chosen intervention indices and the summary;
- `DIR/summary.md`: the summary table (with batches or costs also each metric after every
  round and against the cumulative cost); `DIR/figure.png`: learning curves like the paper's
  figures (with batches or costs also against rounds and against cumulative cost); `DIR/interventions.png`: the marginal probability of intervening on each node at
  each experiment, per design.

Every file is written atomically (a temporary file, then `os.replace`), so an interrupted run
never leaves a half-written file, and files that describe other settings (`summary.md`, ...)
are removed before a changed run starts.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._active_learning.designs import design_from_name
from .._active_learning.repetitions import batching_within_memory, run_repetitions
from .._active_learning.tasks import ParameterLearningTask, StructureLearningTask
from .._batching import AbstractBatching, Sharded
from .._criteria.structure import JointGraphDraws, StratifiedGraphDraws
from .._files import json_bytes, write_atomically
from .._learning.priors import GammaPrior
from .._model.interventions import design_space, intervention_space, single_node_interventions
from .._panel.rate_families import AbstractPanelRateFamily
from .._panel.structure_posterior import AbstractPanelStructureFamily
from .._paths.sampling import automatic_max_events
from .config import (
    ExperimentConfig,
    default_graph_draws,
    default_max_parents,
    default_truth,
)
from .outputs import (
    _load_chunk,
    _prepare_out,
    _record_failures,
    _save_chunk,
    _write_outputs,
)
from .report import summarise


def run_experiment(
    config: ExperimentConfig | None = None,
    *,
    out: str | None = None,
    progress: bool = True,
    overwrite: bool = False,
    batching: AbstractBatching | None = None,
    distributed: bool = False,
    input_format: Mapping[str, str] | None = None,
) -> dict:
    """Run the paper's synthetic experiment for several designs and return
    `{"settings", "results", "summary", "timing"}` (`results[design][metric]` is an array
    `(repetitions, experiments + 1)`; also `intervention_index`, `targets`).

    With `out`, results are written as described in the module docstring and finished chunks
    are reused on a rerun with the same settings (only `designs` and `repetitions` may change).
    A directory that holds results for other settings raises a `ValueError` naming them, unless
    `overwrite=True`, which deletes the old results and starts afresh.

    `batching` executes each chunk's repetitions (see [`jaxctbn.run_repetitions`][]; e.g.
    [`jaxctbn.Sharded`][] across this process's devices). It changes no result, so it is not a
    setting: chunks written with one batching are reused with another.

    `distributed=True` (after `jax.distributed.initialize()`, and with `out` on a file system
    every process reaches) splits the chunks across the `jax.process_count()` processes:
    process $i$ computes chunks $i$, $i + P$, ... (in the order designs x chunks) and writes
    their files; process 0 prepares `out` first, every process waits for the others, and
    process 0 writes the summary from the chunk files. Every process returns the same report
    (the timing sums the processes' own times and devices). The results are those of one
    process.
    See [Multiple devices and hosts](../multi-device.md).

    `input_format`: the formats the inputs were read in (`{"network": "pyagrum"}`, the
    command line's `--format`), written to results.json as `input_format`; not a setting (a
    rerun reads the same network from any format).
    """
    config = ExperimentConfig() if config is None else config
    target, designs = config.target, list(config.designs)
    repetitions, experiments = config.num_repetitions, config.num_experiments
    samples, paths, chunk, horizon = config.samples, config.paths, config.chunk, config.horizon
    seed, truth_seed = config.seed, config.truth_seed
    truth = default_truth(target, truth_seed) if config.truth is None else config.truth
    max_events = config.max_events
    if max_events is None:
        # None only for non-finite rates, which the sampler reports itself
        max_events = automatic_max_events(truth, horizon) or 512
    max_parents = config.max_parents
    if target == "structure":
        max_parents = default_max_parents(truth.num_nodes, max_parents)
        family = config.panel_family()
        assert isinstance(family, AbstractPanelStructureFamily)
        task = StructureLearningTask(
            truth,
            max_parents=max_parents,
            prior=config.prior,
            empirical_bayes=config.empirical_bayes,
            outcome=config.outcome(),
            panel_posterior=family,
        )
    else:
        assert isinstance(config.prior, GammaPrior)  # checked by ExperimentConfig
        family = config.panel_family()
        assert isinstance(family, AbstractPanelRateFamily)
        task = ParameterLearningTask(
            truth,
            prior=config.prior,
            outcome=config.outcome(),
            panel_posterior=family,
        )
    space = {
        "auto": design_space,
        "all": intervention_space,
        "single": single_node_interventions,
    }[config.interventions](truth.cardinalities)
    graph_draws, max_sets = default_graph_draws(
        truth.num_nodes, config.graph_draws, config.max_sets
    )
    settings = {
        "target": target,
        "designs": designs,
        "repetitions": repetitions,
        "experiments": experiments,
        "samples": samples,
        "paths": paths,
        "horizon": horizon,
        "seed": seed,
        "truth_seed": truth_seed,
        "max_parents": max_parents,
        **config.prior.settings(),
        "empirical_bayes": None
        if config.empirical_bayes is None
        else config.empirical_bayes.settings(),
        "initial_state_policy": config.initial_state_policy.settings(),
        "outcome": config.outcome_settings(),
        **config.batch_settings(),
        "max_events": max_events,
        "interventions": int(space.targets.shape[0]),
        "intervention_space": config.interventions,
        **({"graph_draws": graph_draws, "max_sets": max_sets} if target == "structure" else {}),
        "truth": truth.to_dict(),
    }
    base = jax.random.key(seed)
    make_design = {
        name: design_from_name(
            name,
            num_samples=samples,
            num_paths=paths,
            graph_draws=JointGraphDraws() if graph_draws == "joint" else StratifiedGraphDraws(),
            max_sets=max_sets,
        )  # the designs score under the task's outcome (the loop gives it them)
        for name in designs
    }
    loop_settings: dict[str, Any] = dict(
        num_experiments=experiments,
        horizon=horizon,
        candidates=space,
        max_events=max_events,
        initial_state_policy=config.initial_state_policy,
        batch_size=config.batch,
        costs=config.costs,
        budget=config.budget,
        ranking=config.ranking(),
    )
    starts = list(range(0, repetitions, chunk))

    def chunk_keys(start):
        stop = min(start + chunk, repetitions)
        return jax.vmap(lambda r: jax.random.fold_in(base, r))(jnp.arange(start, stop))

    def chunk_file(design_name, start):
        """A chunk's file inside the chunk directory."""
        stop = min(start + chunk, repetitions)
        return os.path.join(design_name, f"{start}-{stop - 1}.npz")

    # Each design's program is compiled and its memory checked before anything is written (a
    # design whose first chunk is already on disk is checked when its next chunk runs): over
    # the memory budget its repetitions run a few at a time, or the run is refused.
    batchings = {name: batching for name in designs}
    if batching is None:
        for name in designs:
            first = out is not None and os.path.join(out, "chunks", chunk_file(name, 0))
            if not first or overwrite or not os.path.exists(first):
                batchings[name] = batching_within_memory(
                    task, make_design[name], chunk_keys(0), **loop_settings
                )
    process, processes = (jax.process_index(), jax.process_count()) if distributed else (0, 1)
    if distributed and out is None:
        raise ValueError("out: a distributed run needs an output directory every process reaches.")
    chunk_dir = None
    if out is not None:
        if process == 0:
            chunk_dir = _prepare_out(out, settings, overwrite)
            write_atomically(
                os.path.join(out, "config.json"),
                lambda f: f.write(json_bytes(settings, indent=1)),
            )
            write_atomically(
                os.path.join(out, "truth.json"),
                lambda f: f.write(json_bytes(truth.to_dict(), indent=1)),
            )
            if distributed:
                shutil.rmtree(os.path.join(out, _PROCESS_DIR), ignore_errors=True)
        if distributed:  # the others start once process 0 has checked and prepared `out`
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("jaxctbn run: output directory prepared")
        if process != 0:
            chunk_dir = _prepare_out(out, settings, overwrite=False)
    timing = _empty_timing(designs, batching.num_devices if isinstance(batching, Sharded) else 1)

    def chunk_path(design_name, start):
        if chunk_dir is None:
            return None
        return os.path.join(chunk_dir, chunk_file(design_name, start))

    def compute(design_name, start):
        """Run one chunk of repetitions, record its time and write its file."""
        stop = min(start + chunk, repetitions)
        keys = chunk_keys(start)
        t0 = time.perf_counter()
        res, status = run_repetitions(  # pyright: ignore[reportGeneralTypeIssues] (throw=False: a pair)
            task,
            make_design[design_name],
            keys,
            throw=False,
            batching=batchings[design_name],
            **loop_settings,
        )
        res = jax.device_get(res)
        errors = np.asarray(status.messages, dtype=str).reshape(stop - start)
        truncated = [m for m in status.messages if "truncated" in m]
        if truncated:  # a setting, not bad luck: stop rather than record NaN repetitions
            raise ValueError(
                f"max_events: a simulated path of {design_name} had more than {max_events} "
                "jumps; raise it (--max-events) or leave it unset (sized from the rates)."
            )
        entry = timing[design_name]
        entry["chunk_seconds"].append(time.perf_counter() - t0)
        entry["seconds_incl_compile"] += entry["chunk_seconds"][-1]
        entry["repetitions_computed"] += stop - start
        part: dict[str, Any] = {f"metric_{k}": np.asarray(v) for k, v in res.metrics.items()}
        part.update(
            intervention_index=np.asarray(res.intervention_index),
            targets=np.asarray(res.targets),
            states=np.asarray(res.states),
            initial_states=np.asarray(res.initial_states),
            num_events=np.asarray(res.num_events),
            errors=errors,
        )
        if config.visits is not None:
            part["observation_times"] = np.asarray(res.observation_times)
        if config.rounds:
            part["rounds"] = np.asarray(res.rounds)
            part["costs"] = np.asarray(res.costs)
        path = chunk_path(design_name, start)
        if path is not None:
            _save_chunk(path, part)
        return part

    def load(design_name, start):
        path = chunk_path(design_name, start)
        if path is None:
            return None
        stop = min(start + chunk, repetitions)
        return _load_chunk(
            path, target, stop - start, experiments, truth.num_nodes, config.visits, config.rounds
        )

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(designs) * repetitions, desc=f"run {target}", unit="rep")
    if distributed:
        # Process i computes chunks i, i + P, ... of all designs' chunks, writing their files,
        # then every process waits for the others; below, each process loads every chunk.
        assert out is not None
        jobs = [(name, start) for name in designs for start in starts]
        marker = os.path.join(out, _PROCESS_DIR, f"{process}")
        try:
            for design_name, start in jobs[process::processes]:
                if bar is not None:
                    bar.set_postfix_str(design_name)
                if load(design_name, start) is None:
                    compute(design_name, start)
                if bar is not None:
                    bar.update(min(start + chunk, repetitions) - start)
        except BaseException as error:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            write_atomically(marker + ".failed", lambda f: f.write(reason.encode()))
            raise
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        write_atomically(marker + ".done", lambda f: f.write(json_bytes(timing)))
        timing = _wait_for_processes(os.path.join(out, _PROCESS_DIR), processes, designs)
        if bar is not None:
            bar.close()
            bar = None
    results, failures = {}, {}
    for design_name in designs:
        parts = []
        for start in starts:
            stop = min(start + chunk, repetitions)
            part = load(design_name, start)
            if part is None:
                if bar is not None:
                    bar.set_postfix_str(design_name)
                part = compute(design_name, start)
            if process == 0:  # one report of each failure
                _record_failures(failures, design_name, start, part["errors"])
            parts.append(part)
            if bar is not None:
                bar.update(stop - start)
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0] if k != "errors"}
        results[design_name] = {
            **{k[len("metric_") :]: v for k, v in merged.items() if k.startswith("metric_")},
            **{k: v for k, v in merged.items() if not k.startswith("metric_")},
        }
    if bar is not None:
        bar.close()
    summary = summarise(target, results)
    report = {
        "settings": settings,
        "results": results,
        "summary": summary,
        "timing": timing,
        "failed_repetitions": failures,
        **({"input_format": dict(input_format)} if input_format else {}),
    }
    if out is not None and process == 0:
        _write_outputs(target, report, truth, out)
    return report


#: Under the output directory: `<process>.done` (its timing) or `<process>.failed` (its error)
#: for each process of a distributed run.
_PROCESS_DIR = "processes"


def _empty_timing(designs, devices: int) -> dict:
    """The `timing` entry of each design before any chunk: `devices`, the devices its chunks
    are split across (summed over the processes of a distributed run)."""
    return {
        name: {
            "seconds_incl_compile": 0.0,
            "repetitions_computed": 0,
            "chunk_seconds": [],
            "devices": devices,
        }
        for name in designs
    }


def _wait_for_processes(folder: str, processes: int, designs) -> dict:
    """Wait until every process of a distributed run has written its chunks (`<i>.done`);
    raise a `ValueError` as soon as one reports a failure (`<i>.failed`). Returns the timing
    summed over the processes (seconds are each process's own)."""
    while True:
        names = set(os.listdir(folder)) if os.path.isdir(folder) else set()
        for i in range(processes):
            if f"{i}.failed" in names:
                with open(os.path.join(folder, f"{i}.failed")) as f:
                    raise ValueError(f"process {i} of the distributed run failed: {f.read()}")
        if all(f"{i}.done" in names for i in range(processes)):
            break
        time.sleep(0.5)
    timing = _empty_timing(designs, 0)
    for i in range(processes):
        with open(os.path.join(folder, f"{i}.done")) as f:
            theirs = json.load(f)
        for name, entry in timing.items():
            entry["seconds_incl_compile"] += theirs[name]["seconds_incl_compile"]
            entry["repetitions_computed"] += theirs[name]["repetitions_computed"]
            entry["chunk_seconds"] += theirs[name]["chunk_seconds"]
            entry["devices"] += theirs[name]["devices"]
    return timing
