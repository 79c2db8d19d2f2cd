"""Output files written atomically: a temporary file next to the target, then a rename, so that
an interrupted or failing write (a full disk, a file-size limit) leaves the old file or none,
never half of one, and the error names the file."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import IO, Any


def checked_file(path: str | os.PathLike, what: str, expected: str) -> str:
    """The name of `path`, a file to read: a one-line `ValueError` naming it (as `what`) when it
    does not exist or is a directory (then saying to give `expected`)."""
    name = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"{what} {name!r} does not exist.")
    if os.path.isdir(path):
        raise ValueError(f"{what} {name!r} is a directory; give {expected}.")
    return name


def write_atomically(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> None:
    """`write(f)` to a temporary binary file next to `path`, then rename it to `path`. An
    `OSError` (e.g. no space left) removes the temporary file and is raised again with `path`
    in its message."""
    path = os.fspath(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as error:
        raise OSError(error.errno, f"cannot write {path!r}: {error.strerror or error}") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def json_bytes(data, indent: int | None = None) -> bytes:
    return json.dumps(data, indent=indent).encode()


def write_json(path: str | os.PathLike, data, *, indent: int | None = 1) -> None:
    """`data` as a JSON file, atomically (see `write_atomically`)."""
    blob = json_bytes(data, indent=indent)
    write_atomically(path, lambda f: f.write(blob))
