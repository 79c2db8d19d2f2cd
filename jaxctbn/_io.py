"""The long-format trajectory CSV / DataFrame route (pandas is imported only when used)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, cast

import jax
import jax.numpy as jnp
import numpy as np

from ._ctbn import AbstractCTBN
from ._layout import parse_assignment
from ._sampling import Trajectories

if TYPE_CHECKING:
    import pandas as pd

RESERVED_COLUMNS = ("trajectory_id", "time", "intervention")


def format_intervention(targets, states, names) -> str:
    return ";".join(f"{names[n]}={int(states[n])}" for n in range(len(names)) if targets[n])


def trajectories_to_dataframe(trajectories: Trajectories, model: AbstractCTBN) -> pd.DataFrame:
    """Long format: `trajectory_id, time, <node columns>, intervention`. Each row is the state
    from that time on; the first row of a trajectory is its initial state at time 0, then one row
    per jump, and a last row at the end of observation."""
    t = jax.tree_util.tree_map(np.asarray, trajectories)
    if t.num_events.ndim == 0:
        t = jax.tree_util.tree_map(lambda a: a[None], t)
    if np.any(t.truncated):
        raise ValueError("trajectories: some paths are truncated (max_events too small).")
    import pandas as pd

    ids, times, states, interventions = [], [], [], []
    for r in range(t.num_events.shape[0]):
        m = int(t.num_events[r])
        rows_t = np.concatenate([[0.0], t.jump_times[r, :m], [t.durations[r]]])
        last = t.states[r, m - 1] if m > 0 else t.initial_states[r]
        rows_s = np.concatenate([t.initial_states[r][None], t.states[r, :m], last[None]])
        ids.append(np.full(m + 2, r))
        times.append(rows_t)
        states.append(rows_s)
        label = format_intervention(
            t.intervention_targets[r], t.intervention_states[r], model.names
        )
        interventions += [label] * (m + 2)
    states = np.concatenate(states)
    df = pd.DataFrame({"trajectory_id": np.concatenate(ids), "time": np.concatenate(times)})
    for n, name in enumerate(model.names):
        df[name] = states[:, n].astype(int)
    df["intervention"] = interventions
    return df


def write_trajectories_csv(trajectories: Trajectories, model: AbstractCTBN, path) -> None:
    trajectories_to_dataframe(trajectories, model).to_csv(path, index=False)


def _parse_intervention_label(label, names, cards, tid) -> tuple[np.ndarray, np.ndarray]:
    targets = np.zeros(len(names), bool)
    states = np.zeros(len(names), np.int32)
    if label is None or (isinstance(label, float) and np.isnan(label)):
        return targets, states
    what = f"data: trajectory {tid!r}: intervention"
    for name, value in parse_assignment(str(label), names, what, cards, separators=";").items():
        targets[names.index(name)], states[names.index(name)] = True, value
    return targets, states


def _node_spec(model) -> tuple[list[str], tuple[int, ...]]:
    if isinstance(model, AbstractCTBN):
        return list(model.names), model.cardinalities
    if isinstance(model, dict):
        return list(model), tuple(int(k) for k in model.values())
    raise ValueError("model: expected a CTBN or a dict {node name: cardinality}.")


def infer_cardinalities(df: pd.DataFrame) -> dict[str, int]:
    """`{node: max observed state + 1 (at least 2)}` for the node columns of a long-format frame."""
    import pandas as pd

    cols = [c for c in df.columns if c not in RESERVED_COLUMNS]
    if not cols:
        raise ValueError("data: no node columns besides trajectory_id, time and intervention.")
    out = {}
    for c in cols:
        values = cast("pd.Series", pd.to_numeric(df[c], errors="coerce"))
        if values.isna().any() or (values < 0).any() or (values != values.round()).any():
            raise ValueError(f"data: column {c!r} must hold non-negative integer states.")
        out[c] = max(2, int(values.max()) + 1)
    return out


def trajectories_from_dataframe(
    df: pd.DataFrame, model, *, dtype=None
) -> tuple[Trajectories, list]:
    """Parse the long format (see [`jaxctbn.trajectories_to_dataframe`][]).

    Rows of a trajectory are taken in file order; times must be non-decreasing, consecutive rows
    may share a time stamp (a zero-length stay). Consecutive rows may differ in at most one node
    (a CTBN changes one node at a time); identical rows are allowed and ignored. The last row of
    a trajectory marks the end of observation. `model` is a CTBN or a dict
    `{node name: cardinality}`. Returns the trajectories and their ids.
    """
    names, cards = _node_spec(model)
    for col in ("trajectory_id", "time"):
        if col not in df.columns:
            raise ValueError(
                f"data: missing column {col!r}; expected trajectory_id, time, <nodes>."
            )
    node_cols = [c for c in df.columns if c not in RESERVED_COLUMNS]
    unknown = [c for c in node_cols if c not in names]
    if unknown:
        raise ValueError(
            f"data: unknown node column(s) {unknown}; the network's nodes are {names}."
        )
    missing = [n for n in names if n not in node_cols]
    if missing:
        raise ValueError(f"data: missing node column(s) {missing}.")
    if len(df) == 0:
        raise ValueError("data: no rows.")
    values = df[names].to_numpy()
    if not np.issubdtype(values.dtype, np.number) or np.any(~np.isfinite(values.astype(float))):
        raise ValueError("data: node columns must hold integer states (no missing values).")
    if np.any(values != np.round(values)):
        raise ValueError("data: node states must be integers.")
    values = values.astype(np.int64)
    for n, name in enumerate(names):
        bad = (values[:, n] < 0) | (values[:, n] >= cards[n])
        if bad.any():
            raise ValueError(
                f"data: column {name!r} has state {values[bad, n][0]} outside 0..{cards[n] - 1}."
            )
    try:
        times = df["time"].to_numpy(dtype=float)
    except (TypeError, ValueError):
        raise ValueError("data: column 'time' must be numeric.") from None
    if np.any(~np.isfinite(times)):
        raise ValueError("data: column 'time' has missing or non-finite values.")
    labels = df["intervention"].to_numpy(dtype=object) if "intervention" in df.columns else None
    ids = df["trajectory_id"].to_numpy()
    order_ids = list(dict.fromkeys(ids.tolist()))
    groups: dict = {}
    for row, tid in enumerate(ids.tolist()):
        groups.setdefault(tid, []).append(row)
    parsed = []
    for tid in order_ids:
        rows = np.asarray(groups[tid])
        t, s = times[rows], values[rows]
        if len(rows) < 2:
            raise ValueError(
                f"data: trajectory {tid!r} has {len(rows)} row; need the initial state and an end row."
            )
        if np.any(np.diff(t) < 0):
            raise ValueError(
                f"data: trajectory {tid!r}: times must be non-decreasing in row order."
            )
        if not t[-1] > t[0]:
            raise ValueError(f"data: trajectory {tid!r} has zero observation time.")
        changes = (s[1:] != s[:-1]).sum(1)
        if np.any(changes > 1):
            i = int(np.argmax(changes > 1)) + 1
            raise ValueError(
                f"data: trajectory {tid!r}: row at time {t[i]} changes {int(changes[i - 1])} nodes "
                "at once; a CTBN changes one node at a time (split it into rows with the same time)."
            )
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
        targets, istates = _parse_intervention_label(label, names, cards, tid)
        clamped = np.nonzero(targets)[0]
        for n in clamped:
            if np.any(s[:, n] != istates[n]):
                raise ValueError(
                    f"data: trajectory {tid!r} was recorded under do({names[n]}={istates[n]}) but "
                    f"{names[n]!r} is not constantly {istates[n]}."
                )
        keep = np.nonzero(changes == 1)[0] + 1
        parsed.append((t[0], t[-1] - t[0], s[0], t[keep] - t[0], s[keep], targets, istates))
    E = max(1, max(len(p[3]) for p in parsed))
    R, N = len(parsed), len(names)
    # config flags are attributes set at run time, which the stubs of jax.config do not list
    dtype = dtype or (jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)  # pyright: ignore[reportAttributeAccessIssue]
    jump_times = np.zeros((R, E))
    states = np.zeros((R, E, N), np.int32)
    arr = {k: [] for k in ("init", "dur", "num", "tg", "ts")}
    for r, (_, dur, s0, jt, js, tg, ts) in enumerate(parsed):
        m = len(jt)
        jump_times[r, :m], jump_times[r, m:] = jt, dur
        states[r, :m] = js
        states[r, m:] = js[-1] if m else s0
        arr["init"].append(s0)
        arr["dur"].append(dur)
        arr["num"].append(m)
        arr["tg"].append(tg)
        arr["ts"].append(ts)
    traj = Trajectories(
        initial_states=jnp.asarray(np.stack(arr["init"]), jnp.int32),
        jump_times=jnp.asarray(jump_times, dtype),
        states=jnp.asarray(states),
        num_events=jnp.asarray(arr["num"], jnp.int32),
        durations=jnp.asarray(arr["dur"], dtype),
        truncated=jnp.zeros((R,), bool),
        intervention_targets=jnp.asarray(np.stack(arr["tg"])),
        intervention_states=jnp.asarray(np.stack(arr["ts"]), jnp.int32),
    )
    return traj, order_ids


def read_csv(path: str | os.PathLike) -> pd.DataFrame:
    """Read a long-format CSV with a clear error for missing or unreadable files."""
    import pandas as pd

    if not os.path.exists(path):
        raise ValueError(f"data file {os.fspath(path)!r} does not exist.")
    try:
        return pd.read_csv(path, keep_default_na=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ValueError(f"data file {os.fspath(path)!r} is not a readable CSV: {e}") from None


def read_trajectories_csv(path: str | os.PathLike, model) -> tuple[Trajectories, list]:
    """Read the long-format CSV (see [`jaxctbn.trajectories_from_dataframe`][])."""
    return trajectories_from_dataframe(read_csv(path), model)
