"""The message of an error raised inside compiled code, as one line for the user."""

from __future__ import annotations

import re


def error_message(error: BaseException) -> str:
    """The library's own one-line message of `error`.

    A check inside `jit` (`eqx.error_if`) surfaces as an `EquinoxRuntimeError` or, without
    `eqx.filter_jit`, a `JaxRuntimeError` whose text starts with boilerplate (stack notes, a
    callback traceback); the message that names the argument is on the line
    `...EquinoxRuntimeError: <message>`. Other errors give their first non-empty line."""
    text = str(error)
    match = re.search(r"EquinoxRuntimeError: (.+)", text)
    if match:
        return match.group(1).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__
