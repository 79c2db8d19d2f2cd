"""The long-format panel CSV / DataFrame route (pandas is imported only when used)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Literal, overload

import jax.numpy as jnp
import numpy as np

from .._model.interventions import Intervention
from .._model.layout import parse_assignment
from .buckets import PanelBuckets
from .observations import PanelObservations

if TYPE_CHECKING:
    import pandas as pd
from .._paths.csv import node_spec, node_values, parse_intervention_label


@overload
def panel_from_dataframe(
    df: pd.DataFrame,
    model,
    *,
    exact_entry: dict[str, int] | None = None,
    bucketed: Literal[False] = False,
) -> tuple[PanelObservations, list]: ...


@overload
def panel_from_dataframe(
    df: pd.DataFrame,
    model,
    *,
    exact_entry: dict[str, int] | None = None,
    bucketed: Literal[True],
) -> tuple[PanelBuckets, list]: ...


@overload
def panel_from_dataframe(
    df: pd.DataFrame,
    model,
    *,
    exact_entry: dict[str, int] | None = None,
    bucketed: bool = False,
) -> tuple[PanelObservations | PanelBuckets, list]: ...


def panel_from_dataframe(
    df: pd.DataFrame,
    model,
    *,
    exact_entry: dict[str, int] | None = None,
    bucketed: bool = False,
) -> tuple[PanelObservations | PanelBuckets, list]:
    """The long format as panel data (see
    [`jaxctbn.panel.PanelObservations.from_dataframe`][]); `bucketed=True` returns
    [`jaxctbn.panel.PanelBuckets`][]."""
    names, cards = node_spec(model)
    values = node_values(df, names, cards, missing=True)
    entry = parse_assignment(
        None if not exact_entry else ",".join(f"{k}={v}" for k, v in exact_entry.items()),
        names,
        "exact_entry",
        cards,
    )
    try:
        times = df["time"].to_numpy(dtype=float)
    except (TypeError, ValueError):
        raise ValueError("data: column 'time' must be numeric.") from None
    if np.any(~np.isfinite(times)):
        raise ValueError("data: column 'time' has missing or non-finite values.")
    labels = df["intervention"].to_numpy(dtype=object) if "intervention" in df.columns else None
    ids = df["trajectory_id"].to_numpy()
    groups: dict = {}
    for row, tid in enumerate(ids.tolist()):
        groups.setdefault(tid, []).append(row)
    all_times, all_states, all_entry, all_targets, all_clamped, kept = [], [], [], [], [], []
    for tid, rows in groups.items():
        rows = np.asarray(rows)
        rows = rows[np.argsort(times[rows], kind="stable")]
        rows = rows[(values[rows] >= 0).any(1)]
        if rows.size == 0:
            continue
        t_rows, s_rows = times[rows], values[rows]
        merged_t, merged_s = [t_rows[0]], [s_rows[0].copy()]
        for t, s in zip(t_rows[1:], s_rows[1:]):
            if t != merged_t[-1]:
                merged_t.append(t)
                merged_s.append(s.copy())
                continue
            prev = merged_s[-1]
            both = (prev >= 0) & (s >= 0)
            if np.any(both & (prev != s)):
                n = int(np.argmax(both & (prev != s)))
                raise ValueError(
                    f"data: trajectory {tid!r} has two rows at time {t:g} with conflicting "
                    f"states {int(prev[n])} and {int(s[n])} of node {names[n]!r}."
                )
            merged_s[-1] = np.where(prev >= 0, prev, s)
        t_arr, s_arr = np.asarray(merged_t), np.stack(merged_s)
        flags = np.zeros(len(t_arr), bool)
        for name, state in entry.items():
            n = names.index(name)
            hit = s_arr[:, n] == state
            flags |= hit & np.concatenate([[False], ~hit[:-1]])
        label_values = (
            set()
            if labels is None
            else {
                str(v) if not (isinstance(v, float) and np.isnan(v)) else "" for v in labels[rows]
            }
        )
        if len(label_values) > 1:
            raise ValueError(f"data: trajectory {tid!r} has more than one intervention label.")
        label = label_values.pop() if label_values else ""
        targets, istates = parse_intervention_label(label, names, cards, tid)
        for n in np.nonzero(targets)[0]:
            seen = s_arr[:, n]
            if np.any((seen >= 0) & (seen != istates[n])):
                raise ValueError(
                    f"data: trajectory {tid!r} was recorded under do({names[n]}={istates[n]}) but "
                    f"{names[n]!r} is observed in another state."
                )
        all_times.append(t_arr)
        all_states.append(s_arr)
        all_entry.append(flags)
        all_targets.append(targets)
        all_clamped.append(istates)
        kept.append(tid)
    if not kept:
        raise ValueError("data: no row observes any node.")
    single = [tid for tid, t in zip(kept, all_times) if len(t) == 1]
    if single:
        shown = ", ".join(repr(t) for t in single[:3]) + (", ..." if len(single) > 3 else "")
        warnings.warn(
            f"data: {len(single)} trajectory(ies) ({shown}) have a single observation time and "
            "contribute nothing to the likelihood conditional on the first observation.",
            stacklevel=2,
        )
    intervention = None
    if any(t.any() for t in all_targets):
        intervention = Intervention(
            targets=jnp.asarray(np.stack(all_targets)),
            states=jnp.asarray(np.stack(all_clamped), jnp.int32),
        )
    if bucketed:
        buckets = PanelBuckets.from_sequences(
            all_times, all_states, exact_entry=all_entry, intervention=intervention
        )
        return buckets, kept
    lengths = np.asarray([len(t) for t in all_times])
    N = len(names)
    padded_bytes = len(lengths) * int(lengths.max()) * (8 + 4 * N + 1)
    if padded_bytes > 4 * int(lengths.sum()) * (8 + 4 * N + 1) and padded_bytes > 64 * 2**20:
        warnings.warn(
            f"data: padding every trajectory to the longest ({int(lengths.max())} visits) takes "
            f"{padded_bytes / 2**20:.0f} MiB for {int(lengths.sum())} visits; pass "
            "bucketed=True to group the trajectories by length.",
            stacklevel=2,
        )
    observations = PanelObservations.from_sequences(
        all_times, all_states, exact_entry=all_entry, intervention=intervention
    )
    return observations, kept
