"""The message of an error raised inside compiled code, as one line for the user."""

from __future__ import annotations

import contextlib
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


#: Whether checks are traced as values (`checks_as_values`) where JAX's private configuration
#: states are not available: set only while a program is traced for export.
_AS_VALUES: list[bool] = [False]
#: the same as a configuration state of JAX's (thread-local, part of the context JAX keys its
#: trace caches on; `mode_in_trace_context`): None until first asked for, False where JAX's
#: private names differ
_MODE_STATE: list = [None]


def mode_in_trace_context() -> bool:
    """Whether the checks' mode is part of the context that JAX keys its trace and jit caches
    on: a configuration state of JAX's, thread-local, registered on first use (private JAX
    names, checked). Where it is, a function traced in one mode is never reused in the other,
    and exporting a program need not empty the jit caches (`jax.clear_caches`)."""
    if _MODE_STATE[0] is None:
        state = registered_trace_state(
            "jaxctbn_checks_as_values",
            "jaxctbn: checks traced as checkify checks (a program traced for export).",
        )
        # (another JAX: the jit caches are emptied instead)
        _MODE_STATE[0] = False if state is None else state
    return _MODE_STATE[0] is not False


def registered_trace_state(name: str, help: str):
    """A new boolean configuration state of JAX's, False by default: thread-local, set with
    `with state(True):`, and part of the context JAX keys its trace and jit caches on, so that
    a function traced under one value is never reused under the other (private JAX names,
    checked). None where they differ, or where `name` is registered already. A state
    registered after functions were compiled changes their key: each is traced and compiled
    again on its next call (register at import where JAX is imported anyway; the checks' mode
    is registered on first use, so that the command line's help imports no JAX)."""
    try:
        from jax._src import config as jax_config

        return jax_config.bool_state(
            name, False, help=help, include_in_jit_key=True, include_in_trace_context=True
        )
    except Exception:  # noqa: BLE001 (another JAX)
        return None


def _as_values() -> bool:
    state = _MODE_STATE[0]
    if state is None or state is False:
        return _AS_VALUES[0]
    return bool(state.value)


@contextlib.contextmanager
def checks_as_values():
    """Within (this thread): the checks traced are `checkify` checks, values of the program
    (for a program traced by `jax.experimental.checkify.checkify` and exported; the command
    line's `exported.call_exported`)."""
    if mode_in_trace_context():
        with _MODE_STATE[0](True):
            yield
        return
    previous, _AS_VALUES[0] = _AS_VALUES[0], True
    try:
        yield
    finally:
        _AS_VALUES[0] = previous


def error_if(x, pred, msg: str):
    """`eqx.error_if(x, pred, msg)`, the library's check inside compiled code: `x`, raising
    `msg` at run time where any `pred` is true. While a program is traced for export
    (`checks_as_values`) the check is a `jax.experimental.checkify.check` instead: a value of
    the program (no host callback, which `jax.export` cannot serialise)."""
    if _as_values():
        return _checked_value(x, pred, msg)
    import equinox as eqx

    return eqx.error_if(x, pred, msg)


def branched_error_if(x, pred, index, msgs):
    """`eqx.branched_error_if(x, pred, index, msgs)` (the message `msgs[index]`), or, while a
    program is traced for export, a check as a value (see `error_if`)."""
    if _as_values():
        return _checked_value(x, pred, "; ".join(dict.fromkeys(msgs)))
    import equinox as eqx

    return eqx.branched_error_if(x, pred, index, msgs)


def _checked_value(x, pred, msg: str):
    import jax.numpy as jnp
    from jax.experimental import checkify

    checkify.check(~jnp.any(pred), msg.replace("{", "{{").replace("}", "}}"))
    return x
