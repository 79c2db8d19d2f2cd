"""How the library runs its main compiled programs: directly, or through a runner the command
line sets for its own process (`exported.call_exported`: programs exported once and loaded
afterwards, no tracing on a warm call).

`run_program(name, program, *args)` is `program(*args)` unless a runner is set
(`programs_run_by`); `program` is a jitted function of arrays and Modules whose results depend
on nothing else (the same results either way)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

_RUNNER: list[Callable[..., Any] | None] = [None]


def run_program(name: str, program: Callable[..., Any], *args: Any) -> Any:
    """`program(*args)`, through the runner set by `programs_run_by` if any (`name` names the
    program to it)."""
    runner = _RUNNER[0]
    return program(*args) if runner is None else runner(name, program, *args)


@contextlib.contextmanager
def programs_run_by(runner: Callable[..., Any] | None) -> Iterator[None]:
    """Within: `run_program` calls `runner(name, program, *args)` (None: the program itself)."""
    previous, _RUNNER[0] = _RUNNER[0], runner
    try:
        yield
    finally:
        _RUNNER[0] = previous
