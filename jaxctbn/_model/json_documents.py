"""Other tools' JSON files read with one-line errors that name them, and the tests of their
JSON numbers (the writers use `_files.write_json`, atomic)."""

from __future__ import annotations

import json
from typing import Any

from .._files import checked_file


def read_json(path: Any, what: str) -> Any:
    """The JSON document in `path`, with one-line errors naming the file."""
    name = checked_file(path, f"{what} file", "a JSON file")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        reason = " ".join(str(e).split())
        raise ValueError(f"{what} file {name!r} is not valid JSON: {reason}") from None
    except OSError as e:
        raise ValueError(f"{what} file {name!r} cannot be read: {e.strerror or e}.") from None


def is_integer(value: Any) -> bool:
    """A JSON integer (a float with an integer value, as pandas may write, included), not a
    boolean."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and value.is_integer()


def is_number(value: Any) -> bool:
    """A JSON number, not a boolean."""
    return isinstance(value, int | float) and not isinstance(value, bool)
