"""The files the commands read, in any of the four formats of `--format` and `jaxctbn convert`
(jaxctbn, pyAgrum, causal-hub, PyCTBN): networks with their states' labels, trajectories, and
other tools' trajectories as jaxctbn's long-format table. A command reads a peer's trajectories
as the text `convert --to jaxctbn` writes (`long_format`), parsed as its own CSV is, so that
`learn --format pyagrum X` and `learn` on the converted file are the same computation."""

from __future__ import annotations

import csv
import io
import json
import os
import re
from typing import Any, NamedTuple

from .file_formats import causal_hub_files, network_format, trajectory_format

#: the formats' names on the command line (`--format`, `--from`, `--to`)
FORMATS = ("jaxctbn", "pyagrum", "causal-hub", "pyctbn")
#: how the messages name them
TITLES = {
    "jaxctbn": "jaxctbn",
    "pyagrum": "pyAgrum",
    "causal-hub": "causal-hub",
    "pyctbn": "PyCTBN",
}
#: the jump slots of trajectories read here: as many as the longest trajectory needs, so that
#: each trajectory is one row (the commands cut long ones again as they read their table)
WHOLE = 2**31 - 1

NO_PYAGRUM_NETWORK = (
    "pyAgrum has no network file format: a pyAgrum CTBN is an in-memory object "
    "(pyagrum.ctbn.CTBN; in Python jaxctbn.CTBN.from_pyagrum(obj).to_json(path) and "
    "CTBN.to_pyagrum())"
)


class Network(NamedTuple):
    """A network read from a file: the model, its states' labels `{name: [labels]}` in the
    model's node order (`None`: the states are numbers) and the file's format."""

    model: Any
    labels: dict[str, list[str]] | None
    format: str

    def nodes(self) -> Any:
        """What the trajectory readers take as `model`: the labels, else the CTBN."""
        return self.model if self.labels is None else self.labels


class Paths(NamedTuple):
    """Trajectories read from a file: one row per trajectory, each row's id, the nodes
    `{name: [state labels]}` in the trajectories' node order, and the file's format."""

    trajectories: Any
    ids: list
    nodes: dict[str, list[str]]
    format: str


def resolve(path: Any, fmt: str, kind: str) -> tuple[str, bool]:
    """The format of one input under `--format fmt` (`kind`: `"network"` or `"trajectories"`)
    and whether it was detected: `auto` takes the tool whose format the content shows, and
    jaxctbn where none fits or several do, so that a jaxctbn file is read (and refused) as it
    always was."""
    if fmt != "auto":
        return fmt, False
    detect = network_format if kind == "network" else trajectory_format
    try:
        return detect(path), True
    except ValueError:
        return "jaxctbn", True


def network_flag_format(fmt: str) -> str:
    """A command's `--format` as the format of its `--network`: pyAgrum has no network file,
    so next to pyAgrum trajectories the network is read by its content."""
    return "auto" if fmt == "pyagrum" else fmt


#: the notes of formats detected, shown once the command has succeeded (an error is one line)
NOTES: list[str] = []


def _note(flag: str, path: Any, what: str, detected: bool) -> None:
    how = "detected" if detected else "--format"
    NOTES.append(f"note: {flag}: read {os.fspath(path)!r} as {what} ({how})")


def take_notes() -> list[str]:
    """The notes gathered while the command ran, and none left."""
    notes = NOTES[:]
    NOTES.clear()
    return notes


def read_network(path: Any, fmt: str = "auto", flag: str = "--network") -> Network:
    """The network in `path`, in format `fmt` (or `auto`). A jaxctbn network JSON may carry
    `"labels": {name: [labels]}` (ignored by `CTBN.from_json`), which name its states."""
    from .._model.ctbn import CTBN

    fmt, detected = resolve(path, fmt, "network")
    if fmt == "pyagrum":
        raise ValueError(
            f"{flag}: {NO_PYAGRUM_NETWORK}; give a jaxctbn, causal-hub or PyCTBN network file."
        )
    if fmt == "jaxctbn":
        if not os.path.exists(path):
            raise ValueError(f"{flag}: file {os.fspath(path)!r} does not exist.")
        model = CTBN.from_json(path)
        labels = _jaxctbn_labels(path, model)
    elif fmt == "causal-hub":
        model = CTBN.from_causal_hub_json(path)
        labels = _causal_hub_labels(path, model)
    else:
        model = CTBN.from_pyctbn_json(path)
        labels = None
    if fmt != "jaxctbn" and flag != "IN":  # (convert says what IN is)
        _note(flag, path, f"{TITLES[fmt]}'s network", detected)
    return Network(model, labels, fmt)


def _jaxctbn_labels(path: Any, model: Any) -> dict[str, list[str]] | None:
    from .._model.node_labels import labels_of

    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or data.get("labels") is None:
        return None
    try:
        nodes = labels_of(model, data["labels"])
    except ValueError as e:
        raise ValueError(f"network file {os.fspath(path)!r}: {e}") from None
    return {n: nodes[n] for n in model.names}


def _causal_hub_labels(path: Any, model: Any) -> dict[str, list[str]]:
    """causal-hub's labels in its sorted order (the order of the model's states)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    labels = {}
    for cim in data["cims"]:  # checked by `CTBN.from_causal_hub_json`
        ((name, states),) = cim["states"].items()
        labels[name] = sorted(states)
    return {n: labels[n] for n in model.names}


def read_trajectories(path: Any, fmt: str, model: Any = None) -> Paths:
    """The trajectories in `path` in format `fmt`, one row each; `model` (a CTBN, or
    `{name: [labels]}`) gives the nodes and their states, else the file does (jaxctbn's CSV:
    the largest state seen + 1)."""
    from .._paths.sampling import Trajectories

    if fmt == "jaxctbn":
        from .._model.ctbn import AbstractCTBN
        from .._model.node_labels import default_labels
        from .._paths.csv import infer_cardinalities, read_csv, trajectories_from_dataframe

        df = read_csv(path)
        if model is None:
            cards = infer_cardinalities(df)
            nodes = {n: default_labels(k) for n, k in cards.items()}
        elif isinstance(model, AbstractCTBN):
            cards = dict(zip(model.names, model.cardinalities))
            nodes = {n: default_labels(k) for n, k in cards.items()}
        else:
            cards, nodes = {n: len(ls) for n, ls in model.items()}, dict(model)
        trajectories, ids = trajectories_from_dataframe(df, cards, max_events=WHOLE)
    elif fmt == "pyagrum":
        trajectories, ids, nodes = Trajectories.read_pyagrum_csv(path, model, max_events=WHOLE)
    elif fmt == "causal-hub":
        frames, files = _frames(path)
        try:
            trajectories, ids, nodes = Trajectories.from_causal_hub(frames, model, max_events=WHOLE)
        except ValueError as e:
            raise ValueError(_name_files(str(e), files, path)) from None
    else:
        trajectories, ids, nodes = Trajectories.read_pyctbn_json(path, model, max_events=WHOLE)
    return Paths(trajectories, list(ids), dict(nodes), fmt)


def _name_files(message: str, files: list[str], path: Any) -> str:
    """The reader's `frames[i]['X'] row r` as the file, column and row it came from."""

    def name(match: re.Match) -> str:
        where = f"causal-hub trajectory file {files[int(match.group(1))]!r}"
        return where + (f", column {match.group(2)}" if match.group(2) else "")

    message = re.sub(r"frames\[(\d+)\](?:\[('[^']*')\])?", name, message)
    return re.sub(r"^frames:", f"causal-hub trajectories {os.fspath(path)!r}:", message)


def _frames(path: Any) -> tuple[list, list[str]]:
    """causal-hub's frames on disk: a directory of CSV files, one frame each
    (`causal_hub_files`), or one CSV file; every cell read as text (the labels), `time` as
    numbers."""
    name = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"causal-hub trajectory file {name!r} does not exist.")
    files = causal_hub_files(path) if os.path.isdir(path) else [name]
    if not files:
        raise ValueError(
            f"causal-hub trajectory directory {name!r} holds no CSV file; it needs one CSV per "
            "trajectory (columns time,<variables>)."
        )
    return [_frame(file) for file in files], files


def _frame(file: str) -> Any:
    import numpy as np
    import pandas as pd

    source = f"causal-hub trajectory file {file!r}"
    try:
        with open(file, newline="", encoding="utf-8-sig") as f:
            header = next((row for row in csv.reader(f) if row), None)
        if header is None:
            raise ValueError(f"{source} is empty; expected a header time,<variables>.")
        columns = [c.strip() for c in header]
        repeated = sorted({c for c in columns if columns.count(c) > 1})
        if repeated or "" in columns:
            raise ValueError(
                f"{source}: the header {header} repeats {repeated} or has an unnamed column; "
                "expected time,<variables>, each once."
            )
        if "time" not in columns:
            raise ValueError(f"{source}: no 'time' column; expected the header time,<variables>.")
        frame = pd.read_csv(file, dtype=str)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, csv.Error) as e:
        reason = " ".join(str(e).split())
        raise ValueError(f"{source} is not a readable CSV: {reason}") from None
    except OSError as e:
        raise ValueError(f"{source} cannot be read: {e.strerror or e}.") from None
    texts = frame["time"].tolist()
    times = np.empty(len(texts))
    for r, text in enumerate(texts):
        try:
            times[r] = float(text)
        except (TypeError, ValueError):
            raise ValueError(
                f"{source}: row {r} (line {r + 2}): time {text!r} is not a number."
            ) from None
    frame["time"] = times
    return frame


def long_format(paths: Paths) -> str:
    """jaxctbn's trajectory CSV of `paths` (the text `Trajectories.write_csv` writes, with the
    file's ids as `trajectory_id`): per trajectory its initial state at time 0, one row per
    jump and a last row at the end of observation."""
    import jax
    import numpy as np

    from .._paths.csv import format_intervention

    t = jax.tree_util.tree_map(np.asarray, paths.trajectories)
    names = list(paths.nodes)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator=os.linesep)
    writer.writerow(["trajectory_id", "time", *names, "intervention"])
    for r, tid in enumerate(paths.ids):
        m = int(t.num_events[r])
        label = format_intervention(t.intervention_targets[r], t.intervention_states[r], names)
        times = [0.0, *t.jump_times[r, :m].astype(np.float64).tolist()]
        states = [t.initial_states[r], *t.states[r, :m]]
        times.append(float(np.float64(t.durations[r])))
        states.append(states[-1])
        for time, state in zip(times, states):
            writer.writerow([tid, repr(time), *(int(s) for s in state), label])
    return buffer.getvalue()


def read_data(
    path: Any, fmt: str, *, model: Any = None, panel: bool = False, flag: str = "--data"
) -> tuple[Any, str, dict[str, int] | None]:
    """`--data` as jaxctbn's long-format table, its format, and the nodes' cardinalities where
    the file (or `model`) defines them (`None` for jaxctbn's CSV, whose cardinalities are
    inferred as always). Panel data is jaxctbn's CSV only."""
    fmt, detected = resolve(path, fmt, "trajectories")
    if fmt == "jaxctbn":
        from .._paths.csv import read_csv

        return read_csv(path), fmt, None
    if panel:
        which = (
            f"{flag}: {os.fspath(path)!r} is {TITLES[fmt]}'s trajectory format (detected)"
            if detected
            else f"--format {fmt}: {TITLES[fmt]}'s trajectories are complete paths"
        )
        raise ValueError(
            f"{which}; panel data (--observation panel) is read from jaxctbn's CSV only (empty "
            "cells for nodes not observed)."
        )
    import pandas as pd

    paths = read_trajectories(path, fmt, model)
    _note(flag, path, f"{TITLES[fmt]}'s trajectories", detected)
    frame = pd.read_csv(io.StringIO(long_format(paths)), keep_default_na=True)
    return frame, fmt, {n: len(ls) for n, ls in paths.nodes.items()}


def data_digest(path: Any) -> str:
    """The SHA-256 of a data file's bytes; of a directory (causal-hub's trajectories), of each
    CSV file's name and bytes in the order they are read."""
    import hashlib

    digest = hashlib.sha256()
    if not os.path.isdir(path):
        with open(path, "rb") as f:
            digest.update(f.read())
        return digest.hexdigest()
    for file in causal_hub_files(path):
        with open(file, "rb") as f:
            blob = f.read()
        digest.update(f"{os.path.basename(file)}\0{len(blob)}\0".encode() + blob)
    return digest.hexdigest()
