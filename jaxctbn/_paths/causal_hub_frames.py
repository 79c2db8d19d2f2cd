"""causal-hub's trajectories as pandas frames (`CatTrj.to_pandas` / `from_pandas`, `CatTrjs` for
a list), converted without causal-hub itself; its CTBN JSON is in `_model/causal_hub_network.py`.

The frames have a float64 `time` column and one categorical column per variable (the
categories are the states). causal-hub sorts the rows by time (the times must be distinct), the
columns and the categories by text, and allows at most one change between rows; its statistics
count the time between consecutive rows and ignore everything after the last one. Its sampler
writes the initial state at time 0 and one row per jump, and no row at its `max_time`: the
observation of its own samples ends at their last jump.

Reading (a frame, a list of frames, or a `CatTrj(s)`), each frame is observed to its last row
unless `durations` (one, or one per frame) says otherwise; `model` gives the states as for
pyAgrum's CSV (`_paths/pyagrum_csv.py`; without one, the categories and values seen, in text
order, causal-hub's rule). The reader returns `(trajectories, ids, nodes)`. Writing, one frame
per trajectory (for `CatTrjs.from_pandas`), `model` giving the labels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._model.node_labels import Nodes, check_names, match_nodes, model_nodes, nodes_from_labels
from .path_arrays import StateCodes, build_trajectories, paths_of
from .sampling import Trajectories


def _frames(frames: Any) -> list:
    """A list of data frames from a frame, a list of frames, or causal-hub's `CatTrj` /
    `CatTrjs` (anything with `to_pandas()`)."""
    import pandas as pd

    if hasattr(frames, "to_pandas") and not isinstance(frames, pd.DataFrame):
        frames = frames.to_pandas()
    if isinstance(frames, pd.DataFrame):
        frames = [frames]
    frames = list(frames)
    if not frames or not all(isinstance(f, pd.DataFrame) for f in frames):
        raise ValueError(
            "frames: expected a causal-hub trajectory frame, a list of them, or a CatTrj(s)."
        )
    return frames


def trajectories_from_frames(
    frames: Any,
    model: Any = None,
    *,
    durations: Any = None,
    max_events: int | None = None,
) -> tuple[Trajectories, list, Nodes]:
    """causal-hub's trajectory frames as trajectories, the index of each one's frame and the
    nodes `{name: [labels]}` (see the module docstring)."""
    import pandas as pd

    frames = _frames(frames)
    columns = [str(c) for c in frames[0].columns]
    if "time" not in columns:
        raise ValueError(
            "frames[0]: no 'time' column; causal-hub's frames have 'time' and one column per variable."
        )
    found = [c for c in columns if c != "time"]
    if not found:
        raise ValueError("frames[0]: no variable columns besides 'time'.")
    for i, f in enumerate(frames):
        cols = [str(c) for c in f.columns]
        if sorted(cols) != sorted(columns) or len(set(cols)) != len(cols):
            raise ValueError(
                f"frames[{i}]: columns {cols}; expected those of frames[0], {columns}."
            )

    def texts(column: pd.Series, where: str) -> np.ndarray:
        if column.isna().any():
            row = int(np.flatnonzero(column.isna().to_numpy())[0])
            raise ValueError(
                f"{where} row {row}: missing state; causal-hub trajectories are fully observed."
            )
        return np.asarray([str(v) for v in column.tolist()], dtype=object)

    if model is not None:
        nodes, numeric = model_nodes(model)
        match_nodes(found, list(nodes), "frames")
    else:
        # causal-hub's rule: the categories (else the values seen) of all frames, in text order
        seen: dict[str, set[str]] = {v: set() for v in found}
        for i, f in enumerate(frames):
            for v in found:
                col = f[v]
                if isinstance(col.dtype, pd.CategoricalDtype):
                    seen[v] |= {str(c) for c in col.cat.categories}
                seen[v] |= set(texts(col, f"frames[{i}][{v!r}]").tolist())
        nodes, numeric = nodes_from_labels(seen, "frames"), False
    check_names(list(nodes), "frames")
    codes = StateCodes(nodes, numeric)
    names = list(nodes)
    if durations is not None:
        ends = np.broadcast_to(np.asarray(durations, dtype=float), (len(frames),))
    else:
        ends = None
    paths = []
    for i, f in enumerate(frames):
        where = f"frames[{i}]"
        try:
            times = f["time"].to_numpy(dtype=float)
        except (TypeError, ValueError):
            raise ValueError(f"{where}['time'] must be numeric.") from None
        if len(times) == 0:
            raise ValueError(f"{where} has no rows.")
        if not np.all(np.isfinite(times)) or np.any(times < 0):
            raise ValueError(f"{where}['time'] must be finite and >= 0.")
        order = np.argsort(times, kind="stable")  # causal-hub sorts the rows by time
        times = times[order]
        if np.any(np.diff(times) == 0):
            repeated = int(np.flatnonzero(np.diff(times) == 0)[0]) + 1
            row = int(order[repeated])
            raise ValueError(
                f"{where} row {row}: time {times[repeated]} repeats; causal-hub needs distinct "
                "times."
            )
        states = np.empty((len(times), len(names)), np.int64)
        for n, name in enumerate(names):
            values = texts(f[name], f"{where}[{name!r}]")[order]
            for r, label in enumerate(values):
                code = codes.code(name, label)
                if code is None:
                    raise ValueError(
                        f"{where}[{name!r}] row {int(order[r])}: state {label!r} is not one of {codes.valid(name)}."
                    )
                states[r, n] = code
        changes = (states[1:] != states[:-1]).sum(1)
        if np.any(changes > 1):
            row = int(order[int(np.argmax(changes > 1)) + 1])
            raise ValueError(
                f"{where} row {row}: {int(changes.max())} variables change at once; at most one may."
            )
        end = times[-1] if ends is None else float(ends[i])
        if not end >= times[-1]:
            raise ValueError(
                f"durations[{i}] = {end} is before the last row of {where} (time {times[-1]})."
            )
        if not end > times[0]:
            raise ValueError(
                f"{where} is observed for no time (one row and no duration); pass durations= "
                "(causal-hub's sampler's max_time) to say when its observation ended."
            )
        paths.append((i, np.append(times, end), np.vstack([states, states[-1:]])))
    trajectories, ids = build_trajectories(paths, nodes, max_events)
    return trajectories, ids, nodes


def trajectories_to_frames(trajectories: Trajectories, model: Any) -> list:
    """One causal-hub frame per trajectory: `time` (float64), then a categorical column per node
    (categories: the labels); the initial state at time 0, one row per jump, and a last row at
    the end of observation with the final state (causal-hub counts the time up to it and no
    transition), left out when the last jump is at the end."""
    import pandas as pd

    what = "causal-hub frames"
    nodes, _ = model_nodes(model)
    names = list(nodes)
    frames = []
    for r, (init, times, states, duration) in enumerate(paths_of(trajectories, len(names), what)):
        t = np.concatenate([[0.0], times])
        s = np.vstack([init[None], states]) if len(times) else init[None]
        if not (times.size and times[-1] >= duration):  # the end row
            t, s = np.append(t, duration), np.vstack([s, s[-1:]])
        if np.any(np.diff(t) <= 0):
            raise ValueError(
                f"{what}: trajectory {r} has two rows at one time (a jump at time 0 or two jumps at "
                "once); causal-hub needs distinct times."
            )
        frame = pd.DataFrame({"time": t.astype(np.float64)})
        for n, name in enumerate(names):
            frame[name] = pd.Categorical.from_codes(s[:, n].astype(int), categories=nodes[name])
        frames.append(frame)
    return frames
