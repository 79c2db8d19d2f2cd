"""Which tool's format a file is in, from its content (a CSV's header, a JSON document's keys;
the extension only says which of the two to try first): `"jaxctbn"`, `"pyagrum"`,
`"causal-hub"` or `"pyctbn"`. A file that fits none, or more than one, is a one-line
`ValueError` naming it and what each format looks like. causal-hub's trajectories on disk are
a directory of CSV files, one frame per file (`causal_hub_files`), or one such file."""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Mapping
from typing import Any

TRAJECTORY_FORMATS = (
    "jaxctbn: a CSV with columns trajectory_id,time,<nodes>[,intervention]; "
    "pyagrum: a CSV with columns IdSample,time,var,state; "
    "causal-hub: a CSV of one trajectory frame, columns time,<variables>, or a directory of "
    "such CSVs, one per trajectory; "
    "pyctbn: a JSON list of objects with 'variables' and 'samples'"
)
NETWORK_FORMATS = (
    "jaxctbn: a JSON object with 'nodes' and 'cims'; "
    "causal-hub: a JSON object with 'graph', 'cims' (a list) and type 'catctbn'; "
    "pyctbn: a JSON list of objects with 'variables', 'dyn.str' and 'dyn.cims'"
)


def _text(path: Any, what: str, *, whole: bool = True) -> str:
    """The file's text; with `whole=False` up to its first line that is not blank (a CSV's
    header: a large data file is not read twice), or all of it where that line starts a JSON
    document."""
    name = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"{what} file {name!r} does not exist or is not a file.")
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            if whole:
                return f.read()
            head = line = f.readline()
            while line and not line.strip():
                line = f.readline()
                head += line
            if head.lstrip()[:1] in ("[", "{"):
                head += f.read()
            return head
    except UnicodeDecodeError:
        raise ValueError(f"{what} file {name!r} is not UTF-8 text.") from None
    except OSError as e:
        raise ValueError(f"{what} file {name!r} cannot be read: {e.strerror or e}.") from None


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _csv_format(text: str) -> str | None:
    header = next((row for row in csv.reader(text.splitlines()) if row), None)
    if header is None:
        return None
    columns = [c.strip() for c in header]
    if columns == ["IdSample", "time", "var", "state"]:
        return "pyagrum"
    if "trajectory_id" in columns and "time" in columns:
        return "jaxctbn"
    if "time" in columns and len(columns) >= 2:
        return "causal-hub"
    return None


def _is_pyctbn(data: Any, keys: tuple[str, ...]) -> bool:
    sets = data if isinstance(data, list) else [data]
    return bool(sets) and all(isinstance(d, Mapping) and all(k in d for k in keys) for d in sets)


def causal_hub_files(folder: Any) -> list[str]:
    """The CSV files of a directory of causal-hub trajectories, one frame per file: every
    `*.csv` in it (not its sub-directories, not hidden files), in the order of their names with
    runs of digits compared as numbers (`trajectory_2.csv` before `trajectory_10.csv`)."""

    def order(name: str) -> list:
        return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name)]

    names = [
        n
        for n in os.listdir(folder)
        if n.lower().endswith(".csv")
        and not n.startswith(".")
        and os.path.isfile(os.path.join(folder, n))
    ]
    return [os.path.join(folder, n) for n in sorted(names, key=order)]


def _directory_format(path: Any) -> str:
    """`"causal-hub"` for a directory whose CSV files all have causal-hub's header."""
    name = os.fspath(path)
    try:
        files = causal_hub_files(path)
    except OSError as e:
        raise ValueError(
            f"trajectory directory {name!r} cannot be read: {e.strerror or e}."
        ) from None
    if not files:
        raise ValueError(
            f"trajectory directory {name!r} holds no CSV file; a directory of trajectories is "
            "causal-hub's, one CSV per trajectory (columns time,<variables>)."
        )
    for file in files:
        try:
            found = _csv_format(_text(file, "trajectory", whole=False))
        except ValueError:
            found = None
        if found != "causal-hub":
            raise ValueError(
                f"trajectory directory {name!r}: {os.path.basename(file)!r} is not a causal-hub "
                "trajectory frame; every CSV in the directory must be one (columns "
                "time,<variables>)."
            )
    return "causal-hub"


def trajectory_format(path: Any) -> str:
    """The format of the trajectory file (or directory) `path` (see the module docstring)."""
    if os.path.isdir(path):
        return _directory_format(path)
    text = _text(path, "trajectory", whole=False)
    stripped = text.lstrip()
    found = None
    if stripped[:1] in ("[", "{"):
        data = _json(text)
        if data is not None and _is_pyctbn(data, ("variables", "samples")):
            found = "pyctbn"
    if found is None and not os.fspath(path).lower().endswith(".json"):
        found = _csv_format(text)
    if found is None:
        raise ValueError(
            f"trajectory file {os.fspath(path)!r}: unknown format; expected one of ({TRAJECTORY_FORMATS})."
        )
    return found


def network_format(path: Any) -> str:
    """The format of the network file `path` (see the module docstring)."""
    name = os.fspath(path)
    data = _json(_text(path, "network"))
    if data is None:
        raise ValueError(f"network file {name!r} is not JSON; expected one of ({NETWORK_FORMATS}).")
    found = []
    if isinstance(data, Mapping) and "nodes" in data and "cims" in data:
        found.append("jaxctbn")
    if (
        isinstance(data, Mapping)
        and "graph" in data
        and isinstance(data.get("cims"), list)
        and data.get("type", "catctbn") == "catctbn"
    ):
        found.append("causal-hub")
    if _is_pyctbn(data, ("variables", "dyn.cims")):
        found.append("pyctbn")
    if len(found) != 1:
        what = "unknown format" if not found else f"ambiguous format (fits {found})"
        raise ValueError(f"network file {name!r}: {what}; expected one of ({NETWORK_FORMATS}).")
    return found[0]
