"""`run_pool_experiment`: the pool experiment on the host, every design in
resumable chunks, then the summary and the output files (`jaxctbn run pool`)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from .._panel.path_statistics import with_candidate_growth
from .._panel.structural_em import PanelStructureFit
from .._panel.structure_posterior import StructureParticleFilter
from .pool import (
    DEFAULT_POOL_FILTER,
    POOL_DESIGN_NAMES,
    check_pool_family,
    pool_design_from_name,
    run_pool_repetitions,
)
from .pool_subjects import PoolExperiment


# --------------------------------------------------------------------------- the experiment
def data_digest(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def run_pool_experiment(
    pool: PoolExperiment,
    fit: PanelStructureFit,
    *,
    designs: Sequence[str] = POOL_DESIGN_NAMES,
    repetitions: int = 100,
    experiments: int = 20,
    samples: int = 40,
    seed: int = 0,
    chunk: int = 10,
    data: str = "",
    out: str | None = None,
    progress: bool = True,
    overwrite: bool = False,
    panel_posterior: StructureParticleFilter | None = DEFAULT_POOL_FILTER,
    input_format: Mapping[str, str] | None = None,
) -> dict:
    """Run every design for `repetitions` repetitions of `experiments` subjects (each
    repetition learning by `panel_posterior`, see [`jaxctbn.experiments.run_pool`][]; when a
    chunk's paths need more uniformisation times than the filter's `max_candidates`, the chunk
    is redone with it doubled, up to 1,024, and the chunks after it keep the grown bound, which
    each chunk records) and return
    `{"settings", "results", "summary", "timing"}` like [`jaxctbn.experiments.run_experiment`][] (metrics
    `entropy`, `auroc`, `aupr`, each `(repetitions, experiments + 1)`; also
    `intervention_index` (the option), `subjects`). Repetition $r$ uses
    `fold_in(key(seed), r)` for every design. With `out`, the output directory of
    `jaxctbn run structure` (config.json, truth.json = the full-data network, resumable chunks,
    metrics.csv with a `subject` column, results.json, summary.md, figure.png,
    interventions.png). `input_format`: the format the data were read in (`{"data":
    "jaxctbn"}`), written to results.json as `input_format`."""
    from .._files import json_bytes, write_atomically
    from .outputs import _load_chunk, _prepare_out, _save_chunk, _write_outputs
    from .report import summarise

    designs = list(designs)
    unknown = [d for d in designs if d not in POOL_DESIGN_NAMES]
    if unknown or not designs:
        raise ValueError(
            f"designs: unknown pool design(s) {unknown or designs}; valid: "
            + ",".join(POOL_DESIGN_NAMES)
        )
    if not 1 <= experiments <= pool.num_subjects:
        raise ValueError(
            f"experiments: must be in 1..{pool.num_subjects} (the number of subjects), got "
            f"{experiments}."
        )
    check_pool_family(panel_posterior)
    names = list(pool.names)
    model = fit.posterior.map_model()
    settings = {
        "target": "pool",
        "posterior": {"method": "expected-statistics", "network": "full-data"}
        if panel_posterior is None
        else {
            "method": "particle-filter",
            "particles": panel_posterior.num_particles,
            "max_candidates": panel_posterior.max_candidates,
        },
        "designs": designs,
        "repetitions": repetitions,
        "experiments": experiments,
        "samples": samples,
        "horizon": "per option: median follow-up of its subjects "
        + ", ".join(
            f"{lab} {float(h):.3g}" for lab, h in zip(pool.option_labels, np.asarray(pool.horizons))
        ),
        "seed": seed,
        "data": data,
        "root": names[pool.root],
        "subjects": pool.num_subjects,
        "options": {
            lab: int(np.asarray(pool.membership[o]).sum())
            for o, lab in enumerate(pool.option_labels)
        },
        "option_initial_states": {
            lab: np.asarray(pool.initial_states[o]).tolist()
            for o, lab in enumerate(pool.option_labels)
        },
        "max_parents": int(pool.statistics.parent_sets[0].shape[-1]),
        **pool.prior_posterior.prior.settings(),  # pyright: ignore[reportAttributeAccessIssue]
        "initial_state_policy": "scored from each option's most common complete first observation",
        "full_data_graph": {names[n]: [names[p] for p in ps] for n, ps in enumerate(model.parents)},
        "full_data_iterations": fit.iterations,
        "full_data_converged": fit.converged,
        "full_data_log_likelihood": (
            None if fit.log_likelihood is None else float(fit.log_likelihood)
        ),
    }
    chunk_dir = None
    if out is not None:
        chunk_dir = _prepare_out(out, settings, overwrite)
        blob = json_bytes(settings, indent=1)
        write_atomically(os.path.join(out, "config.json"), lambda f: f.write(blob))
        net = json_bytes(model.to_dict(), indent=1)
        write_atomically(os.path.join(out, "truth.json"), lambda f: f.write(net))
    base = jr.key(seed)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(designs) * repetitions, desc="run pool", unit="rep")
    N, K = len(names), experiments
    results, timing = {}, {}
    # the filter's bound on one bridge's uniformisation times, doubled when a chunk's paths
    # need more and kept for the chunks after it (each chunk file records the bound it ran with)
    bound = 0 if panel_posterior is None else panel_posterior.max_candidates
    for design_name in designs:
        design = pool_design_from_name(design_name, num_samples=samples)
        parts, seconds, chunk_seconds = [], 0.0, []
        for start in range(0, repetitions, chunk):
            stop = min(start + chunk, repetitions)
            path = None
            if chunk_dir is not None:
                path = os.path.join(chunk_dir, design_name, f"{start}-{stop - 1}.npz")
                loaded = _load_chunk(path, "pool", stop - start, K, N)
                if loaded is not None:
                    bound = max(bound, int(loaded["max_candidates"].max()))
                    parts.append(loaded)
                    if bar is not None:
                        bar.update(stop - start)
                    continue
            keys = jax.vmap(lambda r: jr.fold_in(base, r))(jnp.arange(start, stop))
            t0 = time.perf_counter()

            def run_chunk(family, design=design, keys=keys):
                return jax.device_get(
                    run_pool_repetitions(
                        pool, design, keys, num_experiments=K, panel_posterior=family
                    )
                )

            if panel_posterior is None:
                res = run_chunk(None)
            else:  # from the largest bound of the chunks before it: the same when resumed
                family = dataclasses.replace(panel_posterior, max_candidates=bound)
                res, used = with_candidate_growth(run_chunk, family)
                bound = used.max_candidates
            chunk_seconds.append(time.perf_counter() - t0)
            seconds += chunk_seconds[-1]
            option = np.asarray(res.option)
            part = {
                "metric_entropy": np.asarray(res.entropy),
                "metric_auroc": np.asarray(res.auroc),
                "metric_aupr": np.asarray(res.aupr),
                "intervention_index": option,
                "targets": np.asarray(pool.candidates.targets)[option],
                "states": np.asarray(pool.candidates.states)[option],
                "initial_states": np.asarray(pool.initial_states)[option],
                "subjects": np.asarray(res.subject),
                "max_candidates": np.full(stop - start, bound),
                "errors": np.full(stop - start, "", dtype="U1"),
            }
            if path is not None:
                _save_chunk(path, part)
            parts.append(part)
            if bar is not None:
                bar.update(stop - start)
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0] if k != "errors"}
        results[design_name] = {
            **{k[len("metric_") :]: v for k, v in merged.items() if k.startswith("metric_")},
            **{k: v for k, v in merged.items() if not k.startswith("metric_")},
        }
        timing[design_name] = {"seconds_incl_compile": seconds, "chunk_seconds": chunk_seconds}
    if bar is not None:
        bar.close()
    report = {
        "settings": settings,
        "results": results,
        "summary": summarise("pool", results),
        "timing": timing,
        "failed_repetitions": {},
        **({"input_format": dict(input_format)} if input_format else {}),
    }
    if out is not None:
        ids = np.asarray(pool.subject_ids, dtype=object)
        subjects = {d: ids[np.asarray(res["subjects"])] for d, res in results.items()}
        _write_outputs("pool", report, model, out, extra_columns={"subject": subjects})
    return report
