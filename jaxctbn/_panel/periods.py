"""Piecewise-constant baseline rates (R msm's `pci`): the rates change at given times, as
censored rows and per-observation period dummies (see
[`jaxctbn.panel.PanelObservations.with_time_periods`][] for the model)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np
from jaxtyping import ArrayLike

from .._model.interventions import is_concrete
from .buckets import PanelBuckets
from .covariates import Covariates
from .observations import PanelObservations


def period_names(cut_times: Sequence[float]) -> list[str]:
    """The covariate names of the periods after the first: `period[c1,c2)`, ...,
    `period[cP,Inf)`."""
    ends = [f"{c:g}" for c in cut_times] + ["Inf"]
    return [f"period[{a},{b})" for a, b in zip(ends[:-1], ends[1:])]


@overload
def with_time_periods(
    observations: PanelObservations, cut_times: ArrayLike, *, covariates: Covariates | None = None
) -> tuple[PanelObservations, Covariates]: ...


@overload
def with_time_periods(
    observations: PanelBuckets, cut_times: ArrayLike, *, covariates: Covariates | None = None
) -> tuple[PanelBuckets, Covariates]: ...


def with_time_periods(
    observations: PanelObservations | PanelBuckets,
    cut_times: ArrayLike,
    *,
    covariates: Covariates | None = None,
) -> tuple[PanelObservations | PanelBuckets, Covariates]:
    """See [`jaxctbn.panel.PanelObservations.with_time_periods`][] (also a method of
    [`jaxctbn.panel.PanelBuckets`][])."""
    if isinstance(observations, PanelBuckets):
        flat = observations.padded()
    elif isinstance(observations, PanelObservations) and len(observations.batch_shape) == 1:
        flat = observations
    else:
        raise ValueError(
            "observations: expected PanelObservations with one batch axis (trajectories) or "
            "PanelBuckets."
        )
    if not is_concrete(flat.times, flat.states, flat.num_observations):
        raise ValueError("observations: with_time_periods needs concrete data (not under jit).")
    if covariates is not None and not isinstance(covariates, Covariates):
        raise ValueError(
            f"covariates: expected a jaxctbn.panel.Covariates or None, got "
            f"{type(covariates).__name__}."
        )
    cuts = np.asarray(cut_times, float).reshape(-1) if np.ndim(cut_times) <= 1 else None
    if cuts is None or cuts.size == 0 or not np.all(np.isfinite(cuts)):
        raise ValueError("cut_times: expected one or more finite times T1,T2,...")
    if np.any(np.diff(cuts) <= 0):
        raise ValueError(f"cut_times: must be strictly increasing, got {cuts.tolist()}.")
    times = np.asarray(flat.times, float)
    states = np.asarray(flat.states)
    entry = np.asarray(flat.exact_entry)
    counts = np.asarray(flat.num_observations)
    R = times.shape[0]
    first = times[:, 0]
    last = times[np.arange(R), counts - 1]
    lo, hi = float(first.min()), float(last.max())
    outside = [c for c in cuts if not lo < c < hi]
    if outside:
        raise ValueError(
            f"cut_times: {outside[0]:g} is outside the data's follow-up ({lo:g}, {hi:g}); every "
            "cut must fall strictly between the earliest first and the latest last observation."
        )
    # the merged rows of every trajectory: (time, source row or -1 for a cut)
    rows_of = []
    for r in range(R):
        own = times[r, : counts[r]]
        inserted = [c for c in cuts if own[0] < c < own[-1] and not np.any(own == c)]
        merged = sorted([(t, i) for i, t in enumerate(own)] + [(c, -1) for c in inserted])
        rows_of.append(merged)
    width = max(len(m) for m in rows_of)
    N = states.shape[-1]
    new_times = np.zeros((R, width))
    new_states = np.full((R, width, N), -1, np.int32)
    new_entry = np.zeros((R, width), bool)
    source = np.zeros((R, width), int)  # the original row whose covariates hold there
    for r, merged in enumerate(rows_of):
        previous = 0
        for j, (t, i) in enumerate(merged):
            new_times[r, j] = t
            if i >= 0:
                new_states[r, j] = states[r, i]
                new_entry[r, j] = entry[r, i]
                previous = i
            source[r, j] = previous
        new_times[r, len(merged) :] = merged[-1][0]
        source[r, len(merged) :] = previous
    new_counts = np.asarray([len(m) for m in rows_of], np.int32)
    real = np.arange(width)[None, :] < new_counts[:, None]
    starts = np.arange(width)[None, :] < (new_counts - 1)[:, None]  # rows that open an interval
    period = np.searchsorted(cuts, new_times, side="right")  # 0 = the first period
    dummies = np.stack([(period == p) for p in range(1, cuts.size + 1)], -1).astype(float)
    names = period_names(cuts.tolist())
    for p, name in enumerate([f"period[-Inf,{cuts[0]:g})"] + names):
        if not np.any((period == p)[starts]):
            raise ValueError(
                f"cut_times: no interval of the data starts in {name[len('period') :]}, so its "
                "rates are not identified; drop that cut."
            )
    dummies = np.where(real[..., None], dummies, 0.0)
    columns, labels, acts_on, shared = dummies, list(names), None, None
    if covariates is not None:
        given = np.asarray(covariates.values, float)
        if covariates.per_observation:
            if given.shape[:2] != (R, given.shape[1]) or given.shape[1] < times.shape[1]:
                raise ValueError(
                    f"covariates: per_observation values need leading axes "
                    f"({R}, {times.shape[1]}), got {given.shape}."
                )
            expanded = np.take_along_axis(given, source[..., None], axis=1)
        else:
            if given.shape[:-1] != (R,):
                raise ValueError(
                    f"covariates: expected one row per trajectory ({R}), got {given.shape}."
                )
            expanded = np.broadcast_to(given[:, None, :], (R, width, given.shape[-1]))
        columns = np.concatenate([expanded, dummies], -1)
        labels = list(covariates.names) + labels
        if covariates.acts_on is not None:
            acts_on = [
                np.concatenate([np.asarray(m), np.ones((cuts.size,) + m.shape[1:], bool)])
                for m in covariates.acts_on
            ]
        if covariates.shared is not None:  # the periods' effects are their own
            shared = [
                np.concatenate([np.asarray(a), np.full((cuts.size,) + a.shape[1:], -1)])
                for a in covariates.shared
            ]
    intervention = flat.intervention
    out = PanelObservations(
        new_times,
        new_states,
        num_observations=new_counts,
        exact_entry=new_entry,
        intervention=intervention,
    )
    result: PanelObservations | PanelBuckets = out
    if isinstance(observations, PanelBuckets):
        result = PanelBuckets.from_observations(out)
    return result, Covariates(
        columns, names=labels, acts_on=acts_on, shared=shared, per_observation=True
    )
