"""pyAgrum's trajectory CSV (`pyagrum.ctbn`); its `CTBN` objects are converted by
`_model/pyagrum_network.py`.

The CSV is what `ForwardSamplingInference.writeTrajectoryCSV` writes and
`readTrajectoryCSV` / `Learner` / `Trajectory` read: a header `IdSample,time,var,state` and one
row per event, states as labels. Per sample (the rows with one `IdSample`, an integer):

- first, one row per variable at time 0 with its initial state;
- then one row `(t, var, s)` per jump, `s` being the state that `var` *leaves* at time `t`
  (`0 < t <` the end); the state it enters is the one named by the next row of `var`;
- last, one row per variable at the end of observation (pyAgrum's `timeHorizon`) with the state
  it holds then.

pyAgrum's `Trajectory` takes the end of observation of every sample from the last row of
sample 0, so its statistics assume one horizon for all samples.

Reading, `model` (optional) gives each node's states: `{name: [labels]}` (state `i` is the
`i`-th label), or a CTBN or `{name: cardinality}` (the labels are the state numbers); without
one, a node's states are the labels it shows, in text order (pyAgrum's `CTBNFromData`). Errors
name the file and the line; `max_events` as in `Trajectories.from_dataframe`. The reader returns
`(trajectories, ids, nodes)`: each row's `IdSample` and `{name: [labels]}`. Writing, `model`
gives the labels in the same way, and the jumps must lie strictly inside `(0, duration)`.
"""

from __future__ import annotations

import csv
import io
import os
from typing import Any

import numpy as np

from .._files import checked_file, write_atomically
from .._model.node_labels import Nodes, check_names, match_nodes, model_nodes, nodes_from_labels
from .path_arrays import StateCodes, build_trajectories, paths_of
from .sampling import Trajectories

HEADER = ["IdSample", "time", "var", "state"]


def _rows(path: Any) -> list[list[str]]:
    name = checked_file(path, "pyAgrum trajectory file", "a CSV file")
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            return list(csv.reader(f))
    except (UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"pyAgrum trajectory file {name!r} is not a readable CSV: {e}") from None
    except OSError as e:
        raise ValueError(
            f"pyAgrum trajectory file {name!r} cannot be read: {e.strerror or e}."
        ) from None


def read_trajectory_csv(
    path: Any, model: Any = None, *, max_events: int | None = None
) -> tuple[Trajectories, list, Nodes]:
    """Read pyAgrum's trajectory CSV (see the module docstring for the layout and how labels
    become states); returns the trajectories, the `IdSample` of each row (an `int`) and the
    nodes `{name: [labels]}`."""
    source = f"pyAgrum trajectory file {os.fspath(path)!r}"
    rows = _rows(path)
    if not rows:
        raise ValueError(f"{source} is empty; expected the header {','.join(HEADER)}.")
    if [c.strip() for c in rows[0]] != HEADER:
        raise ValueError(
            f"{source}: line 1: header {rows[0]}; expected {','.join(HEADER)} (as pyAgrum's "
            "writeTrajectoryCSV writes it)."
        )
    # per sample, in order of first appearance: [(line, time, var, label)]
    samples: dict[int, list[tuple[int, float, str, str]]] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != 4:
            raise ValueError(
                f"{source}: line {line} has {len(row)} fields; expected 4 ({','.join(HEADER)})."
            )
        sid, time, var, label = row
        try:
            sample = int(sid)
        except ValueError:
            raise ValueError(
                f"{source}: line {line}: IdSample {sid!r} is not an integer."
            ) from None
        try:
            t = float(time)
        except ValueError:
            raise ValueError(f"{source}: line {line}: time {time!r} is not a number.") from None
        if not np.isfinite(t) or t < 0:
            raise ValueError(f"{source}: line {line}: time {time!r} must be finite and >= 0.")
        if not var or not label:
            raise ValueError(f"{source}: line {line}: empty var or state; every event names both.")
        samples.setdefault(sample, []).append((line, t, var, label))
    if not samples:
        raise ValueError(f"{source} has no rows after the header.")

    # the variables, in order of first appearance (or the model's order)
    found = list(dict.fromkeys(var for events in samples.values() for _, _, var, _ in events))
    if model is not None:
        nodes, numeric = model_nodes(model)
        match_nodes(found, list(nodes), source)
    else:
        # pyAgrum's own rule (`CTBNFromData`): the labels seen, in text order
        seen: dict[str, set[str]] = {v: set() for v in found}
        for events in samples.values():
            for _, _, var, label in events:
                seen[var].add(label)
        nodes, numeric = nodes_from_labels(seen, source), False
    check_names(list(nodes), source)
    codes = StateCodes(nodes, numeric)
    names = list(nodes)
    N = len(names)
    index = {v: n for n, v in enumerate(names)}

    paths = []
    for sample, events in samples.items():
        where = f"{source}: sample {sample}"

        def code(line: int, var: str, label: str) -> int:
            state = codes.code(var, label)
            if state is None:
                raise ValueError(
                    f"{source}: line {line}: state {label!r} of {var!r} is not one of {codes.valid(var)}."
                )
            return state

        def block(rows: list, what: str) -> np.ndarray:
            """The state of every variable, from one row each."""
            state = np.full(N, -1, np.int64)
            for line, _, var, label in rows:
                if state[index[var]] >= 0:
                    raise ValueError(
                        f"{source}: line {line}: {var!r} appears twice in the {what} of sample {sample}."
                    )
                state[index[var]] = code(line, var, label)
            if np.any(state < 0):
                missing = [names[n] for n in np.flatnonzero(state < 0)]
                raise ValueError(
                    f"{where}: the {what} (rows at time {rows[0][1] if rows else 0}) has no row for "
                    f"{missing}; it needs one row per variable."
                )
            return state

        times = [t for _, t, _, _ in events]
        for i in range(1, len(events)):
            if times[i] < times[i - 1]:
                raise ValueError(
                    f"{source}: line {events[i][0]}: time {times[i]} is before the previous row's "
                    f"({times[i - 1]}); a sample's rows must be in time order."
                )
        if times[0] != 0:
            raise ValueError(
                f"{source}: line {events[0][0]}: sample {sample} must start with its initial states at time 0."
            )
        n_start = next((i for i, t in enumerate(times) if t != 0), len(times))
        end = times[-1]
        if end <= 0:
            raise ValueError(
                f"{where} has no row after time 0; it needs the end of observation rows."
            )
        n_end = next(i for i, t in enumerate(times) if t == end)
        state = block(events[:n_start], "initial states")
        final = block(events[n_end:], "end of observation")
        # the state each event enters: the label of the next row of its variable
        following: list[str | None] = [None] * len(events)
        last_row: dict[str, int] = {}
        for i in range(len(events) - 1, -1, -1):
            var = events[i][2]
            nxt = last_row.get(var)
            following[i] = events[nxt][3] if nxt is not None else None
            last_row[var] = i
        rows_t, rows_s = [0.0], [state.copy()]
        for i in range(n_start, n_end):
            line, t, var, label = events[i]
            left = code(line, var, label)
            if left != state[index[var]]:
                raise ValueError(
                    f"{source}: line {line}: {var!r} leaves state {label!r} but is in "
                    f"{nodes[var][state[index[var]]]!r}; each event row names the state its "
                    "variable leaves."
                )
            enters = code(line, var, following[i] or "")
            if enters == left:
                raise ValueError(
                    f"{source}: line {line}: {var!r} leaves state {label!r} but its next row "
                    "names the same state; an event must change the state."
                )
            state[index[var]] = enters
            rows_t.append(t)
            rows_s.append(state.copy())
        if np.any(state != final):  # cannot happen: the last event enters the end row's state
            raise ValueError(f"{where}: the end of observation rows disagree with the events.")
        rows_t.append(end)
        rows_s.append(state.copy())
        paths.append((sample, np.asarray(rows_t), np.stack(rows_s)))
    trajectories, ids = build_trajectories(paths, nodes, max_events)
    return trajectories, ids, nodes


def csv_rows(trajectories: Trajectories, model: Any) -> list[list[str]]:
    """pyAgrum's rows (without the header) for the trajectories."""
    what = "pyAgrum trajectory CSV"
    nodes, _ = model_nodes(model)
    names = list(nodes)
    labels = list(nodes.values())
    rows = []
    for r, (init, times, states, duration) in enumerate(paths_of(trajectories, len(names), what)):
        sid = str(r)
        if len(times) and (times[0] <= 0 or times[-1] >= duration):
            raise ValueError(
                f"{what}: trajectory {r} has a jump at time {times[0] if times[0] <= 0 else times[-1]}; "
                f"pyAgrum reads a jump at time 0 as an initial state and one at the end of observation "
                f"({duration}) as the end, so jumps must lie strictly inside."
            )
        rows += [[sid, "0.0", name, labels[n][int(init[n])]] for n, name in enumerate(names)]
        previous = init
        for t, s in zip(times.tolist(), states):
            (changed,) = np.flatnonzero(s != previous)
            rows.append([sid, repr(t), names[changed], labels[changed][int(previous[changed])]])
            previous = s
        rows += [
            [sid, repr(duration), name, labels[n][int(previous[n])]] for n, name in enumerate(names)
        ]
    return rows


def write_trajectory_csv(trajectories: Trajectories, model: Any, path: Any) -> None:
    """Write pyAgrum's trajectory CSV (see the module docstring), atomically."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)  # "\r\n" line ends, as pyAgrum's csv.DictWriter
    writer.writerow(HEADER)
    writer.writerows(csv_rows(trajectories, model))
    blob = buffer.getvalue().encode()
    write_atomically(path, lambda f: f.write(blob))
