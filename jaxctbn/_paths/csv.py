"""The long-format trajectory CSV / DataFrame route (pandas is imported only when used)."""

from __future__ import annotations

import math
import os
import warnings
from typing import TYPE_CHECKING, cast

import jax
import jax.numpy as jnp
import numpy as np

from .._files import checked_file, write_atomically
from .._model.ctbn import AbstractCTBN
from .._model.layout import parse_assignment
from .sampling import Trajectories

if TYPE_CHECKING:
    import pandas as pd

RESERVED_COLUMNS = ("trajectory_id", "time", "intervention")


def format_intervention(targets, states, names) -> str:
    return ";".join(f"{names[n]}={int(states[n])}" for n in range(len(names)) if targets[n])


def _long_rows(
    trajectories: Trajectories, names
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """The rows of the long format, for all paths at once: trajectory ids `(rows,)`, times
    `(rows,)` (float64), node states `(rows, N)`, and the intervention label of each row as an
    index `(rows,)` into a list of labels (one per distinct intervention)."""
    t = jax.tree_util.tree_map(np.asarray, trajectories)
    if t.num_events.ndim == 0:
        t = jax.tree_util.tree_map(lambda a: a[None], t)
    if np.any(t.truncated):
        raise ValueError("trajectories: some paths are truncated (max_events too small).")
    m = t.num_events.astype(np.int64)
    B, E = t.jump_times.shape
    rows = m + 2  # the initial state, one row per jump, the end of observation
    ids = np.repeat(np.arange(B), rows)
    pos = np.arange(int(rows.sum())) - np.repeat(np.cumsum(rows) - rows, rows)
    last = np.repeat(m, rows) + 1 == pos
    jump = np.clip(pos - 1, 0, E - 1)
    times = np.where(pos == 0, 0.0, t.jump_times[ids, jump].astype(np.float64))
    times = np.where(last, np.repeat(t.durations.astype(np.float64), rows), times)
    # the state after jump pos - 1 (the last row repeats the state after the last jump)
    after = np.where(last, pos - 2, pos - 1)
    states = np.where(
        (after < 0)[:, None], t.initial_states[ids], t.states[ids, np.clip(after, 0, E - 1)]
    )
    interventions = np.concatenate(
        [t.intervention_targets.astype(np.int64), t.intervention_states.astype(np.int64)], axis=1
    )
    distinct, which = np.unique(interventions, axis=0, return_inverse=True)
    N = len(names)
    labels = [format_intervention(d[:N], d[N:], names) for d in distinct]
    return ids, times, states, np.repeat(which.reshape(-1), rows), labels


def trajectories_to_dataframe(trajectories: Trajectories, model: AbstractCTBN) -> pd.DataFrame:
    """Long format: `trajectory_id, time, <node columns>, intervention`. Each row is the state
    from that time on; the first row of a trajectory is its initial state at time 0, then one row
    per jump, and a last row at the end of observation."""
    import pandas as pd

    ids, times, states, which, labels = _long_rows(trajectories, model.names)
    df = pd.DataFrame({"trajectory_id": ids, "time": times})
    for n, name in enumerate(model.names):
        df[name] = states[:, n].astype(int)
    df["intervention"] = np.asarray(labels, dtype=object)[which]
    return df


def write_trajectories_csv(trajectories: Trajectories, model: AbstractCTBN, path) -> None:
    """Write `trajectories_to_dataframe`'s long format to the CSV file `path` (the
    same text as `DataFrame.to_csv(path, index=False)`, written without pandas: the per-cell
    formatting of `to_csv` dominated the time of `jaxctbn sample` on large samples)."""
    import csv
    import io

    ids, times, states, which, labels = _long_rows(trajectories, model.names)

    def line(cells) -> str:  # csv quoting, as pandas applies it (names with commas, quotes...)
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="").writerow(cells)
        return buffer.getvalue()

    # node states as one text per distinct global state (few distinct ones in practice)
    if math.prod(int(k) for k in model.cardinalities) < 2**62:  # a mixed-radix code fits
        radix = np.cumprod([1, *(int(k) for k in model.cardinalities[:-1])], dtype=np.int64)
        _, first, inverse = np.unique(
            states.astype(np.int64) @ radix, return_index=True, return_inverse=True
        )
        distinct = states[first]
    else:
        distinct, inverse = np.unique(states, axis=0, return_inverse=True)
    state_text = [",".join(map(str, u)) for u in distinct.tolist()]
    state_cells = [state_text[i] for i in inverse.reshape(-1).tolist()]
    # (a lone empty cell would be quoted by csv; pandas writes nothing)
    label_text = [line([label]) if label else "" for label in labels]
    label_cells = [label_text[i] for i in which.tolist()]
    id_text = [str(i) for i in range(int(ids.max(initial=-1)) + 1)]
    id_cells = [id_text[i] for i in ids.tolist()]
    # the shortest repr, as pandas writes floats (numpy's `astype(str)` gives the same text)
    time_cells = list(map(repr, times.tolist()))
    header = line(["trajectory_id", "time", *model.names, "intervention"])

    def write(f) -> None:
        f.write((header + os.linesep).encode())
        for start in range(0, len(id_cells), 1 << 16):  # bounded temporary strings
            chunk = slice(start, start + (1 << 16))
            cells = zip(id_cells[chunk], time_cells[chunk], state_cells[chunk], label_cells[chunk])
            f.write((os.linesep.join(map(",".join, cells)) + os.linesep).encode())

    # a failed write (a full disk) leaves no partial file and names `path`
    write_atomically(path, write)


def parse_intervention_label(label, names, cards, tid) -> tuple[np.ndarray, np.ndarray]:
    targets = np.zeros(len(names), bool)
    states = np.zeros(len(names), np.int32)
    if label is None or (isinstance(label, float) and np.isnan(label)):
        return targets, states
    what = f"data: trajectory {tid!r}: intervention"
    for name, value in parse_assignment(str(label), names, what, cards, separators=";").items():
        targets[names.index(name)], states[names.index(name)] = True, value
    return targets, states


def node_spec(model) -> tuple[list[str], tuple[int, ...]]:
    if isinstance(model, AbstractCTBN):
        return list(model.names), model.cardinalities
    if isinstance(model, dict):
        return list(model), tuple(int(k) for k in model.values())
    raise ValueError("model: expected a CTBN or a dict {node name: cardinality}.")


def _check_frame(df: pd.DataFrame) -> None:
    """Checks of the columns and the row count shared by every reader of the long format."""
    cols = [str(c) for c in df.columns]
    if len(cols) == 1 and any(sep in cols[0] for sep in ";\t|"):
        raise ValueError(
            f"data: the header is the single column {cols[0]!r}; the file must be "
            "comma-separated: trajectory_id,time,<nodes>[,intervention]."
        )
    duplicated = sorted({c for c in cols if cols.count(c) > 1})
    if duplicated:
        raise ValueError(f"data: duplicate column(s) {duplicated}; each column must appear once.")
    for col in ("trajectory_id", "time"):
        if col not in cols:
            raise ValueError(
                f"data: missing column {col!r}; expected trajectory_id, time, <nodes>."
            )
    if len(df) == 0:
        raise ValueError("data: no rows after the header; a trajectory needs at least two rows.")
    missing = np.flatnonzero(df["trajectory_id"].isna().to_numpy())
    if missing.size:
        i = int(missing[0])
        raise ValueError(
            f"data: empty trajectory_id in row {i} (line {i + 2} of a CSV file); every row "
            "needs the id of its trajectory."
        )


def _node_states(df: pd.DataFrame, name: str, *, missing: bool = False) -> np.ndarray:
    """The integer states in node column `name`, with an error naming the column and row. With
    `missing=True` (panel data) an empty cell is allowed and read as `-1`."""
    import pandas as pd

    column = df[name]
    empty = column.isna().to_numpy()
    values = cast("pd.Series", pd.to_numeric(column, errors="coerce")).to_numpy(dtype=float)
    bad = ~np.isfinite(values) | (values != np.round(values)) | (values < 0)
    if pd.api.types.is_bool_dtype(column):
        bad[:] = True
    if missing:
        bad &= ~empty
    if bad.any():
        i = int(np.argmax(bad))
        value = column.iloc[i]
        value = value.item() if isinstance(value, np.generic) else value  # 1.5, not np.float64(1.5)
        hint = (
            "; empty cells (missing observations) are allowed only for panel data "
            "(--observation panel)"
            if empty[i]
            else ""
        )
        raise ValueError(
            f"data: column {name!r} must hold non-negative integer states; row {i} "
            f"(line {i + 2} of a CSV file) has {value!r}{hint}."
        )
    return np.where(empty, -1, np.nan_to_num(values)).astype(np.int64)


def node_values(df: pd.DataFrame, names, cards, *, missing: bool) -> np.ndarray:
    """The checked frame's node columns as integer states `(rows, N)` in the order of `names`
    (`-1` for an empty cell when `missing`): every node has a column, no other column is a
    node, and every state is below its node's cardinality."""
    _check_frame(df)
    node_cols = [c for c in df.columns if c not in RESERVED_COLUMNS]
    unknown = [c for c in node_cols if c not in names]
    if unknown:
        raise ValueError(
            f"data: unknown node column(s) {unknown}; the network's nodes are {names}."
        )
    absent = [n for n in names if n not in node_cols]
    if absent:
        raise ValueError(f"data: missing node column(s) {absent}.")
    values = np.stack([_node_states(df, name, missing=missing) for name in names], axis=1)
    for n, name in enumerate(names):
        bad = values[:, n] >= cards[n]
        if bad.any():
            raise ValueError(
                f"data: column {name!r} has state {values[bad, n][0]} outside 0..{cards[n] - 1}."
            )
    return values


def infer_cardinalities(df: pd.DataFrame, *, missing: bool = False) -> dict[str, int]:
    """`{node: max observed state + 1 (at least 2)}` for the node columns of a long-format frame
    (`missing=True`: panel data, where empty cells are missing observations and are skipped).

    A node with more than 2 inferred states some of which never appear (e.g. states 0, 1 and a
    mistyped 400 give 401 states) gets a `UserWarning` naming the node and the states seen: a
    large inferred cardinality makes learning slow and memory-hungry (see the memory budget in
    [`jaxctbn.learn_structure`][]); pass the cardinalities explicitly if it is wrong."""
    _check_frame(df)
    cols = [c for c in df.columns if c not in RESERVED_COLUMNS]
    if not cols:
        raise ValueError("data: no node columns besides trajectory_id, time and intervention.")
    cards = {}
    for c in cols:
        seen = np.unique(_node_states(df, c, missing=missing))
        seen = seen[seen >= 0]
        if seen.size == 0:
            raise ValueError(f"data: node column {c!r} has no observed state.")
        cards[c] = max(2, int(seen.max()) + 1)
        if cards[c] > 2 and seen.size < cards[c]:
            shown = ", ".join(map(str, seen[:6])) + (", ..." if seen.size > 6 else "")
            warnings.warn(
                f"data: node {c!r} is inferred to have {cards[c]} states (largest state "
                f"{int(seen.max())}), but only {seen.size} distinct states appear ({shown}); "
                "give the cardinalities (--cardinalities NODE=K) if that is wrong.",
                stacklevel=2,
            )
    return cards


def _event_slots(num_jumps: np.ndarray, max_events: int | None) -> int:
    """The jump slots per row: `max_events` if given, else the 99th percentile of the jump
    counts; never more than the longest trajectory needs, at least 1."""
    longest = int(num_jumps.max())
    if max_events is None:
        max_events = int(np.percentile(num_jumps, 99, method="higher"))
    elif int(max_events) != max_events or max_events < 1:
        raise ValueError(f"max_events: must be a positive integer, got {max_events!r}.")
    return max(1, min(int(max_events), longest))


def trajectories_from_dataframe(
    df: pd.DataFrame, model, *, dtype=None, max_events: int | None = None
) -> tuple[Trajectories, list]:
    """Parse the long format (see [`jaxctbn.Trajectories.from_dataframe`][])."""
    names, cards = node_spec(model)
    values = node_values(df, names, cards, missing=False)
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
        targets, istates = parse_intervention_label(label, names, cards, tid)
        clamped = np.nonzero(targets)[0]
        for n in clamped:
            if np.any(s[:, n] != istates[n]):
                raise ValueError(
                    f"data: trajectory {tid!r} was recorded under do({names[n]}={istates[n]}) but "
                    f"{names[n]!r} is not constantly {istates[n]}."
                )
        keep = np.nonzero(changes == 1)[0] + 1
        parsed.append((tid, t[-1] - t[0], s[0], t[keep] - t[0], s[keep], targets, istates))
    E = _event_slots(np.asarray([len(p[3]) for p in parsed]), max_events)
    # pieces: (id, start state, duration, jump times from the piece's start, states, targets,
    # intervention states); piece p of a trajectory holds its jumps p*E .. (p+1)*E - 1
    pieces = []
    for tid, dur, s0, jt, js, tg, ts in parsed:
        start, state = 0.0, s0
        for p in range(max(1, -(-len(jt) // E))):
            j_t, j_s = jt[p * E : (p + 1) * E], js[p * E : (p + 1) * E]
            last = (p + 1) * E >= len(jt)
            end = dur if last else j_t[-1]
            pieces.append((tid, state, end - start, j_t - start, j_s, tg, ts))
            if not last:
                start, state = j_t[-1], j_s[-1]
    R, N = len(pieces), len(names)
    # config flags are attributes set at run time, which the stubs of jax.config do not list
    dtype = dtype or (jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)  # pyright: ignore[reportAttributeAccessIssue]
    jump_times = np.zeros((R, E))
    states = np.zeros((R, E, N), np.int32)
    for r, (_, s0, dur, jt, js, _, _) in enumerate(pieces):
        m = len(jt)
        jump_times[r, :m], jump_times[r, m:] = jt, dur
        states[r, :m] = js
        states[r, m:] = js[-1] if m else s0
    # converted on the host and copied to the device as they are: no compiled conversions
    arrays = jax.device_put(
        {
            "initial_states": np.stack([p[1] for p in pieces]).astype(np.int32),
            "jump_times": jump_times.astype(dtype),
            "states": states,
            "num_events": np.asarray([len(p[3]) for p in pieces], np.int32),
            "durations": np.asarray([p[2] for p in pieces], float).astype(dtype),
            "truncated": np.zeros((R,), bool),
            "intervention_targets": np.stack([p[5] for p in pieces]).astype(bool),
            "intervention_states": np.stack([p[6] for p in pieces]).astype(np.int32),
        }
    )
    traj = Trajectories(**arrays)
    return traj, [p[0] for p in pieces]


def read_csv(path: str | os.PathLike) -> pd.DataFrame:
    """Read a long-format CSV, with one-line `ValueError`s naming the file for a missing,
    unreadable or malformed file (a directory, not UTF-8, a repeated or empty header name; the
    checks of the columns and rows follow in `trajectories_from_dataframe`)."""
    import csv

    import pandas as pd

    name = checked_file(path, "data file", "a trajectory CSV file")
    try:
        # pandas renames a repeated column `A` to `A.1` (which would read as one more node) and
        # an empty one to `Unnamed: 2`, so check the header as written
        with open(path, newline="", encoding="utf-8-sig") as f:
            header = next((row for row in csv.reader(f) if row), None)
        if header is None:
            raise ValueError(
                f"data file {name!r} is empty; expected a header trajectory_id,time,<nodes>."
            )
        repeated = sorted({c for c in header if header.count(c) > 1})
        if repeated:
            raise ValueError(
                f"data file {name!r}: column(s) {repeated} appear more than once in the header."
            )
        if "" in [c.strip() for c in header]:
            i = [c.strip() for c in header].index("")
            raise ValueError(f"data file {name!r}: column {i + 1} of the header has no name.")
        return pd.read_csv(path, keep_default_na=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, csv.Error) as e:
        reason = " ".join(str(e).split())
        raise ValueError(f"data file {name!r} is not a readable CSV: {reason}") from None
    except OSError as e:
        raise ValueError(f"data file {name!r} cannot be read: {e.strerror or e}.") from None
