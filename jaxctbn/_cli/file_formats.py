"""Which tool's format a file is in, from its content (a CSV's header, a JSON document's keys;
the extension only says which of the two to try first): `"jaxctbn"`, `"pyagrum"`,
`"causal-hub"` or `"pyctbn"`. A file that fits none, or more than one, is a one-line
`ValueError` naming it and what each format looks like."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Mapping
from typing import Any

TRAJECTORY_FORMATS = (
    "jaxctbn: a CSV with columns trajectory_id,time,<nodes>[,intervention]; "
    "pyagrum: a CSV with columns IdSample,time,var,state; "
    "causal-hub: a CSV of one trajectory frame, columns time,<variables>; "
    "pyctbn: a JSON list of objects with 'variables' and 'samples'"
)
NETWORK_FORMATS = (
    "jaxctbn: a JSON object with 'nodes' and 'cims'; "
    "causal-hub: a JSON object with 'graph', 'cims' (a list) and type 'catctbn'; "
    "pyctbn: a JSON list of objects with 'variables', 'dyn.str' and 'dyn.cims'"
)


def _text(path: Any, what: str) -> str:
    name = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"{what} file {name!r} does not exist or is not a file.")
    try:
        with open(path, encoding="utf-8-sig") as f:
            return f.read()
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


def trajectory_format(path: Any) -> str:
    """The format of the trajectory file `path` (see the module docstring)."""
    text = _text(path, "trajectory")
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
