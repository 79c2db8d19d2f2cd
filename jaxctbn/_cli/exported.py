"""The command line's main programs exported once (`jax.export`) and loaded afterwards.

A warm call of a command used to trace and lower its programs again only to find them in the
persistent compilation cache (seconds of a short call). `call_exported(name, fn, *args)`
instead looks for `fn`'s program for this structure of `args` (the Modules' static fields, the
arrays' shapes and dtypes) in `<cache>/exported/`; when it is there it is deserialised and
called with no tracing (its compiled executable then comes from the compilation cache as
before), else it is traced once, exported and written for the next call.

**Checks as values.** `jax.export` cannot serialise host callbacks, which every check inside
compiled code (`eqx.error_if`) is. The program is therefore traced with the library's checks
as `jax.experimental.checkify` checks (`jaxctbn._errors`) and returns one more value, whether
any check failed. When one did, the call is made again by the usual route (traced, with
callbacks), which raises the library's own one-line message: the messages and the results are
those of the usual route.

**The file.** The SHA-256 of the rest, then a pickle of the serialised program, of the
output with a zero-size stand-in for each array (its structure and non-array fields; tree
structures themselves do not pickle reliably) and of whether the program calls LAPACK. A file that is cut, altered or unreadable, or whose
program does not load, is rebuilt (never trusted); a file that cannot be written leaves the
call as it was (the cache's one warning line comes from the compilation cache's check).
`JAXCTBN_EXPORTED_PROGRAMS=off` (or no cache directory) uses the usual route.

**LAPACK only where it is called.** JAX prepares its CPU LAPACK kernels before it runs any
exported program, and that imports `scipy.linalg` (0.15-0.18 s, a tenth of a warm command).
A program whose module names no LAPACK routine (the structure scores of `learn`, for instance)
is run without that step; one that does is run as JAX runs it.

**Loading ahead.** Loading a program's executable from the compilation cache is most of a
warm call (XLA links its few hundred kernels, 0.3-0.45 s for the panel fit's). `load_ahead`
starts loading a program on a second thread, so that two load on two cores at once: `fit`
loads its fit's and its intervals' programs before it runs either. With an empty cache, the
fit's program compiles while the intervals' is traced.

**Less compile effort for the panel fit.** With an empty cache, XLA's compilation of the fit's
and the intervals' programs is most of `fit`'s first call. They are compiled with less
optimisation (`compiler_options`; `JAXCTBN_COMPILE_EFFORT=full` for XLA's defaults), which
changes their results in the last bits only.

Programs are traced for export with the checks' mode in JAX's trace context
(`_errors.mode_in_trace_context`), so that no function traced in one mode is reused in the
other. Where JAX's private names for that differ, exporting a program empties the process's jit
caches instead (`jax.clear_caches`, before and after), and `main()` called from a Python
session recompiles that session's programs after a first export (the test suite sets
`JAXCTBN_EXPORTED_PROGRAMS=off` for its in-process calls).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import re
import threading
from collections.abc import Callable
from typing import Any

#: The exported programs' format; part of every key (a new format never reads an old file).
FORMAT = 2


def _enabled() -> str | None:
    """The directory of the exported programs, or None (the usual route)."""
    from .._compilation import cache_directory

    if os.environ.get("JAXCTBN_EXPORTED_PROGRAMS", "").strip().lower() in ("off", "0", "no"):
        return None
    path = cache_directory()
    return None if path is None else os.path.join(path, "exported")


#: JAX settings that change the program (float width, partitioner)
_FLAGS = ("jax_enable_x64", "jax_use_shardy_partitioner")


def _key(name: str, leaves, in_tree, static) -> str:
    """The file name of `name`'s program for this structure, these shapes and dtypes, these
    versions of jaxctbn, JAX and jaxlib, this platform and this float width."""
    import importlib.metadata

    import equinox as eqx
    import jax

    from .. import __version__

    parts = [
        f"format={FORMAT}",
        f"jaxctbn={__version__}",
        f"jax={jax.__version__}",
        f"jaxlib={importlib.metadata.version('jaxlib')}",
        f"platform={jax.default_backend()}",
        *(f"{flag}={getattr(jax.config, flag)}" for flag in _FLAGS),
        f"tree={in_tree}",
        "leaves=" + ";".join(f"{x.dtype}{tuple(x.shape)}" for x in leaves),
        "static=" + eqx.tree_pformat(static, short_arrays=False),
    ]
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    plain = re.sub(r"[^A-Za-z0-9_.]+", "-", name).strip("-")  # "design --batch": design-batch
    return f"{plain}-{digest[:40]}.jaxexport"


def _load(path: str) -> tuple[Any, Any, bool] | None:
    """`(exported program, output template, whether it calls LAPACK)` from `path`, or None when
    the file is missing or fails its checksum or does not load."""
    from jax import export

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    checksum, payload = data[:32], data[32:]
    if len(data) < 32 or hashlib.sha256(payload).digest() != checksum:
        return None
    try:
        serialized, template, lapack = pickle.loads(payload)
        return export.deserialize(serialized), template, bool(lapack)
    except Exception:  # noqa: BLE001 (any failure to load means: rebuild it)
        return None


def _store(path: str, exported, template, lapack: bool) -> None:
    from .._files import write_atomically

    payload = pickle.dumps((bytes(exported.serialize()), template, lapack))

    def write(f) -> None:
        f.write(hashlib.sha256(payload).digest())
        f.write(payload)

    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomically(path, write)
    except (OSError, ValueError):  # a cache that cannot be written: the call goes on
        pass


def _has_check(jaxpr, known: dict) -> bool:
    """Whether `jaxpr` (or any jaxpr inside it) holds a checkify check (`known`: the answers
    found so far, by jaxpr identity, each with its jaxpr kept alive so that its id stays its
    own)."""
    from jax._src import checkify as checkify_internals
    from jax._src import core

    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    if id(jaxpr) not in known:
        found = any(
            eqn.primitive is checkify_internals.check_p
            or any(_has_check(sub, known) for sub in core.jaxprs_in_params(eqn.params))
            for eqn in jaxpr.eqns
        )
        known[id(jaxpr)] = (jaxpr, found)
    return known[id(jaxpr)][1]


@contextlib.contextmanager
def _checks_carried_only_where_they_are():
    """Within: checkify passes an operation that holds jaxprs (a loop, a branch, an inner
    `jit`, a custom derivative) through unchanged, bound as it was traced, when no check is
    inside it, rather than tracing every operation inside it again to carry an error that
    cannot arise there (with the user's checks only, as `_export` enables them, the program
    computes the same values). Most of a program holds no check. psor's two programs with an
    empty cache: checkify 0.57 s -> 0.12 s of the export; whole processes, paired: psor 0.92x
    (8 pairs), cav ~ sex 0.93x (5), the same output bytes. A batched while loop (a `vmap` of a
    loop, which checkify refuses) without a check is then exported too. (Private JAX names,
    checked: where they differ, nothing changes, and a program with such a loop is not
    exported.)"""
    try:
        from jax._src import checkify as checkify_internals
        from jax._src import core

        rules = checkify_internals.error_checks
        usual = dict(rules)
        core.jaxprs_in_params  # noqa: B018 (present)
    except (ImportError, AttributeError):
        yield
        return
    known: dict = {}

    def passing(primitive, rule):
        def checked(error, enabled_errors, *in_flat, **params):
            jaxprs = list(core.jaxprs_in_params(params))
            if not jaxprs or any(_has_check(j, known) for j in jaxprs):
                return rule(error, enabled_errors, *in_flat, **params)
            bind_params = primitive.get_bind_params(params)  # (as `core.eval_jaxpr` binds it)
            subfuns = ()
            if isinstance(bind_params, tuple):  # (an older JAX: its sub-functions apart)
                subfuns, bind_params = bind_params
            return error, primitive.bind(*subfuns, *in_flat, **bind_params)

        return checked

    for primitive, rule in usual.items():
        if primitive is not checkify_internals.check_p:
            rules[primitive] = passing(primitive, rule)
    try:
        yield
    finally:
        rules.clear()
        rules.update(usual)


def _export(fn: Callable, leaves, in_tree, static) -> tuple[Any, Any, bool]:
    """`fn`'s program traced with the checks as values and exported (it takes the array leaves
    of the arguments and returns `(any check failed, output array leaves)`), the output's
    template (the output with each array replaced by a zero-size numpy array of its dtype) and
    whether its module calls LAPACK (names one of JAX's CPU kernels `lapack_...`)."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import export
    from jax.experimental import checkify

    from .. import _errors

    structure: dict[str, Any] = {}

    def program(*arrays):
        args = eqx.combine(jax.tree_util.tree_unflatten(in_tree, arrays), static)
        error, out = checkify.checkify(lambda: fn(*args), errors=checkify.user_checks)()
        failed = [jnp.any(p) for p in jax.tree_util.tree_leaves(error) if p.dtype == jnp.bool_]
        dynamic, static_out = eqx.partition(out, eqx.is_array)
        out_leaves = jax.tree_util.tree_leaves(dynamic)
        stand_ins = jax.tree_util.tree_map(lambda x: np.zeros((0,), x.dtype), dynamic)
        structure["template"] = eqx.combine(stand_ins, static_out)
        return jnp.any(jnp.stack(failed)) if failed else jnp.zeros((), bool), out_leaves

    # programs traced before with callbacks (or after, with checkify's checks) must not be
    # reused in the other mode: the mode is part of JAX's trace context, else the jit caches
    # are emptied on both sides
    keyed = _errors.mode_in_trace_context()
    if not keyed:
        jax.clear_caches()
    try:
        with _errors.checks_as_values(), _checks_carried_only_where_they_are():
            exported = export.export(jax.jit(program))(*leaves)
    finally:
        if not keyed:
            jax.clear_caches()
    # (in the serialised module's string table: its text, `mlir_module()`, takes 0.08-0.12 s
    # to print; a name that merely contains the word only makes JAX prepare LAPACK)
    lapack = b"lapack_" in bytes(exported.mlir_module_serialized)
    return exported, structure["template"], lapack


#: per thread: whether JAX may skip preparing LAPACK for the exported program it lowers now
_SKIP_LAPACK = threading.local()


@contextlib.contextmanager
def _lapack_prepared_only_if(lapack: bool):
    """Within (this thread): JAX prepares its CPU LAPACK kernels (importing `scipy.linalg`) for
    an exported program only when `lapack` (the program calls one). (A private JAX name,
    checked: where it differs, JAX prepares them as usual.) The name is wrapped once, for the
    process, by a function that reads this thread's setting, so that programs loaded on two
    threads at once (`load_ahead`) each keep their own."""
    try:
        from jax._src.export import _export as export_internals

        usual = export_internals._ensure_backends_initialized
    except (ImportError, AttributeError):
        yield
        return
    if not getattr(usual, "_jaxctbn_wrapped", False):

        def ensure(platforms, usual=usual):
            if not getattr(_SKIP_LAPACK, "value", False):
                usual(platforms)

        ensure._jaxctbn_wrapped = True  # type: ignore[attr-defined]
        export_internals._ensure_backends_initialized = ensure
    previous = getattr(_SKIP_LAPACK, "value", False)
    _SKIP_LAPACK.value = not lapack
    try:
        yield
    finally:
        _SKIP_LAPACK.value = previous


def _arguments(directory: str, name: str, args: tuple):
    """`(file path, array leaves, their tree, static part)` of `name`'s program for `args`."""
    import equinox as eqx
    import jax

    dynamic, static = eqx.partition(args, eqx.is_array)
    leaves, in_tree = jax.tree_util.tree_flatten(dynamic)
    return os.path.join(directory, _key(name, leaves, in_tree, static)), leaves, in_tree, static


def _program(name: str, fn: Callable, args: tuple) -> tuple[Any, Any, bool, list] | None:
    """`(exported program, output template, whether it calls LAPACK, array leaves of args)` of
    `fn(*args)` for this structure of `args`, loaded or exported and stored; None for the usual
    route (no cache directory, inside a trace, or a program that does not export)."""
    import jax.core

    directory = _enabled()
    if directory is None:
        return None
    path, leaves, in_tree, static = _arguments(directory, name, args)
    if any(isinstance(x, jax.core.Tracer) for x in leaves):  # inside a trace: part of that one
        return None
    ahead = _AHEAD.pop(path, None)
    loaded = ahead[0] if ahead is not None else _load(path)
    if loaded is None:
        _wait_for_programs_loaded_ahead()  # (if exporting empties the jit caches: not meanwhile)
        try:
            loaded = _export(fn, leaves, in_tree, static)
        except Exception:  # noqa: BLE001 (a program that does not export: the usual route)
            if os.environ.get("JAXCTBN_DEBUG_EXPORT"):
                raise
            return None
        _store(path, *loaded)
    if ahead is not None:
        _COMPILED_AHEAD[id(loaded[0])] = ahead[1]
    exported, template, lapack = loaded
    return exported, template, lapack, leaves


#: programs being loaded ahead (`load_ahead`): file path -> (loaded file, Future of the
#: compiled executable)
_AHEAD: dict[str, Any] = {}
#: the executables of programs loaded ahead, by the loaded program's id, until it is called
_COMPILED_AHEAD: dict[int, Any] = {}


class _Captured(Exception):
    """Raised by `load_ahead`'s runner to stop the call once its program's arguments are known."""


def load_ahead(call: Callable[[], Any], *, beside_tracing: bool = False) -> None:
    """Start loading the exported program that `call()` would run (through
    `jaxctbn._programs.run_program`) on a second thread, so that it is compiled from the cache
    while this thread goes on (a `fit` loads its intervals' program while its fit's loads and
    runs: XLA links the two executables' kernels on two cores at once). `call` is stopped as
    soon as it reaches its program (its arguments checked, nothing computed) and may take
    stand-ins of the same structure, shapes and dtypes for values not known yet (the model
    given to a fit for the fitted one). A program not exported yet is exported now, on this
    thread, and compiled on the second thread at once; `beside_tracing`: this thread traces
    another program meanwhile (with an empty cache), so XLA generates this one's code on one
    thread (`compiler_options`). The later call of the same program with arguments of the
    same structure and shapes uses it, and any other call (or none) changes nothing.

    `fit` loads its fit's program first, beside tracing, then its intervals': with an empty
    cache the fit's compiles on one core while the intervals' (the longer trace, 1.5-1.9 s on
    psor) is traced on the other, and the intervals' compiles on both once traced. Paired
    whole processes with an empty cache against the other order (the intervals' exported
    first, then the fit's, then both compiled together on both cores): psor 0.93x (8 pairs),
    cav 0.94x (6), cav ~ sex 0.92x (5), the same output bytes."""
    from .._programs import programs_run_by

    captured: list[tuple[str, Callable, tuple]] = []

    def runner(name: str, fn: Callable, *args: Any) -> Any:
        captured.append((name, fn, args))
        raise _Captured

    directory = _enabled()
    if directory is None:
        return
    try:
        with programs_run_by(runner):
            call()
    except _Captured:
        pass
    except Exception:  # noqa: BLE001 (the real call will say what is wrong)
        return
    if not captured:
        return
    name, fn, args = captured[0]
    path, leaves, in_tree, static = _arguments(directory, name, args)
    loaded = _load(path)
    if loaded is None:
        _wait_for_programs_loaded_ahead()  # (if exporting empties the jit caches: not meanwhile)
        try:
            loaded = _export(fn, leaves, in_tree, static)
        except Exception:  # noqa: BLE001 (its own call takes the usual route)
            return
        _store(path, *loaded)
    _submit(path, name, loaded, leaves, beside_tracing)


def _submit(path: str, name: str, loaded, leaves, beside_tracing: bool) -> None:
    """Compile the loaded program `loaded` (of `name`) for `leaves` on a second thread
    (`load_ahead`)."""
    import concurrent.futures

    exported, _, lapack = loaded

    def compile_it():
        return _compiled(name, exported, lapack, leaves, beside_tracing=beside_tracing)

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    _AHEAD[path] = (loaded, pool.submit(compile_it))
    pool.shutdown(wait=False)


#: XLA's CPU options for a program that runs once on a small data set (`rate_uncertainty`):
#: no LLVM optimisation and the classic fusion code generator. Compiled alone, the panel
#: intervals' program compiles in 2.1-4.2 s instead of 4.8-8.3 s (psor, cav, cav ~ sex) and
#: runs in 0.04-0.8 s instead of 0.02-0.2 s.
_RUNS_ONCE = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 0}
#: ... for an EM fit's program (`fit_rates`, SQUAREM or EM): LLVM's first optimisation level
#: and the classic fusion code generator: compiled in 2.2 s instead of 3.0-3.5 s (psor, cav),
#: and run as fast. (Level 0 makes an iterated fit up to 5x slower.)
_ITERATES = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 1}
#: the options by program name (`run_program`'s); other programs take XLA's defaults. (A
#: gradient fit's program, `fit_rates_gradient`, L-BFGS, keeps them: LLVM's first level saved
#: no measurable time, paired whole processes on cav ~ sex 1.00x over 5 pairs, and moved the
#: fit by 1e-10 where L-BFGS stops at its tolerance on another iterate; with XLA's defaults its
#: rates, effects and log-likelihood are the library's bits.)
_OPTIONS_BY_NAME = {
    "rate_uncertainty": _RUNS_ONCE,
    "fit_rates": _ITERATES,
}
#: added to a program's options (`_OPTIONS_BY_NAME`) when it compiles beside the tracing of
#: another (`load_ahead`): XLA generates its code on one thread (one LLVM module, not 32 on a
#: thread pool), leaving the other core to the trace. psor's EM fit's program alone: 2.2-2.5 s
#: instead of 1.5-1.8 s, but 1.1-1.3 cores instead of 1.6; paired whole processes with an
#: empty cache against the fit's compiled on XLA's threads, psor 0.91x and 0.94x (two sets
#: of 8 pairs), cav 0.98x (6); run as fast.
#: (A gradient fit's program, which keeps XLA's defaults: cav ~ sex 1.00x, 5 pairs; left so.)
_ONE_CODEGEN_THREAD = {"xla_cpu_parallel_codegen_split_count": 1}
#: the most array elements (all arguments together) for which a program that runs once takes
#: `_RUNS_ONCE`: its running time grows with the data and its compile time does not (cav ~ sex
#: repeated 8 times, 166,437 elements: the intervals compile in 9.6 s instead of 15.8 s and run
#: in 1.2 s instead of 0.4 s)
_RUNS_ONCE_MAX_ELEMENTS = 400_000
#: set when this XLA refuses an option (another jaxlib): XLA's defaults from then on
_OPTIONS_REFUSED = threading.Event()


def compile_effort() -> str:
    """`JAXCTBN_COMPILE_EFFORT`: `"low"` (unset or empty: the default, `compiler_options`) or
    `"full"` (XLA's defaults for every program). Raises a one-line `ValueError` for any other
    value (the command checks it before it starts)."""
    effort = os.environ.get("JAXCTBN_COMPILE_EFFORT", "").strip().lower() or "low"
    if effort not in ("low", "full"):
        raise ValueError(
            "JAXCTBN_COMPILE_EFFORT: 'low' (the default: less XLA optimisation for the panel "
            f"fit's programs) or 'full' (XLA's defaults), not {effort!r}."
        )
    return effort


def compiler_options(name: str, leaves, *, beside_tracing: bool = False) -> dict[str, Any]:
    """XLA's options for the command line's program `name` on arguments `leaves`
    (`beside_tracing`: compiled while another program is traced, `load_ahead`).

    On the CPU, the panel fit's programs (`_OPTIONS_BY_NAME`), whose compilation is most of a
    first call, are compiled with less optimisation: the intervals' program, which runs once,
    with none while the data are small (`_RUNS_ONCE_MAX_ELEMENTS`), the fit's with LLVM's
    first level (an EM or SQUAREM fit's; an L-BFGS fit's takes XLA's defaults). Other
    programs, other platforms, `JAXCTBN_COMPILE_EFFORT=full`, or an XLA that does not know
    these options: `{}` (XLA's defaults). The options are part of the compilation cache's key.
    Their results are those of XLA's defaults to rounding, not bit for bit (floating-point
    operations grouped otherwise: a converged EM fit or an interval moves by about 1e-14
    relative; the interval of a parameter the data do not identify, 1e-202 to 1e192, by about
    1e-10; measured in `benchmarks/cli/bench_first_fit.py`); `JAXCTBN_COMPILE_EFFORT=full`
    gives the library's bits. Beside the tracing of another program, a program with these
    options generates its code on one thread (`_ONE_CODEGEN_THREAD`: the same code, the same
    bits)."""
    import jax

    if compile_effort() == "full" or _OPTIONS_REFUSED.is_set() or jax.default_backend() != "cpu":
        return {}
    options = _OPTIONS_BY_NAME.get(name, {})
    if options is _RUNS_ONCE and sum(x.size for x in leaves) > _RUNS_ONCE_MAX_ELEMENTS:
        return {}
    if options and beside_tracing:
        return options | _ONE_CODEGEN_THREAD
    return dict(options)


def _compiled(name: str, exported, lapack: bool, leaves, *, beside_tracing: bool = False):
    """`exported` (the program `name`) compiled for `leaves` (from the compilation cache when
    it is there) with `compiler_options`. Every route compiles it this one way (a program
    lowered by another way would have another cache key): called now, ahead on a second
    thread (`beside_tracing` as `load_ahead` was given it), or read for its memory first."""
    import jax

    # lowered for the leaves' types alone: where an argument lives (an array a program
    # computed, or one made from host data) would change the key, not the program
    types = [
        jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=getattr(x, "weak_type", False))
        for x in leaves
    ]
    with _lapack_prepared_only_if(lapack):
        lowered = jax.jit(exported.call).lower(*types)
        options = compiler_options(name, leaves, beside_tracing=beside_tracing)
        if not options:
            return lowered.compile()
        try:
            return lowered.compile(compiler_options=options)
        except Exception as error:  # (an XLA without these options: its defaults)
            if "compile option" not in str(error):
                raise
            _OPTIONS_REFUSED.set()
            return lowered.compile()


def _wait_for_programs_loaded_ahead() -> None:
    """Wait for the programs being compiled ahead, where exporting empties the jit caches (a
    JAX without the checks' mode in its trace context: `_errors.mode_in_trace_context`)."""
    from .. import _errors

    if _errors.mode_in_trace_context():
        return
    for _, future in list(_AHEAD.values()):
        with contextlib.suppress(Exception):  # (its own call reports any failure)
            future.result()


def _loaded_ahead(exported, leaves):
    """The executable of `exported` compiled ahead (`load_ahead`), if it was and its arguments'
    types are those of `leaves`; else None (the usual call)."""
    future = _COMPILED_AHEAD.pop(id(exported), None)
    if future is None:
        return None
    try:
        compiled = future.result()
        types = [(x.dtype, x.shape, getattr(x, "weak_type", False)) for x in leaves]
        expected = [(a.dtype, a.shape, a.weak_type) for a in compiled.in_avals[0]]
    except Exception:  # noqa: BLE001 (the usual call compiles it as it would have)
        return None
    return compiled if types == expected else None


def _result(template, out_leaves):
    import equinox as eqx
    import jax

    stand_ins, static_out = eqx.partition(template, eqx.is_array)
    out_tree = jax.tree_util.tree_structure(stand_ins)
    return eqx.combine(jax.tree_util.tree_unflatten(out_tree, out_leaves), static_out)


def call_exported(name: str, fn: Callable, *args) -> Any:
    """`fn(*args)`, through the exported program of `fn` for the structure and shapes of `args`
    (see the module docstring); `name` names the program's file. Results and error messages are
    those of `fn(*args)`."""
    program = _program(name, fn, args)
    if program is None:
        return fn(*args)
    exported, template, lapack, leaves = program
    try:
        compiled = _loaded_ahead(exported, leaves)
        if compiled is None:
            compiled = _compiled(name, exported, lapack, leaves)
        failed, out_leaves = compiled(*leaves)
    except Exception:  # noqa: BLE001 (a program this JAX set-up does not run: the usual route)
        if os.environ.get("JAXCTBN_DEBUG_EXPORT"):
            raise
        return fn(*args)
    if bool(failed):  # the usual route raises the library's own message
        return fn(*args)
    return _result(template, out_leaves)


class CompiledRoute:
    """`fn(*args)` through its exported program, compiled and not yet run: `compiled` is the
    executable (XLA's account of its memory: `compiled.memory_analysis()`), calling the route
    runs it (and, when a check fails, `fn(*args)`, which raises the library's message)."""

    def __init__(self, compiled, template, leaves, fn, args):
        self.compiled = compiled
        self._template, self._leaves, self._fn, self._args = template, leaves, fn, args

    def __call__(self) -> Any:
        failed, out_leaves = self.compiled(*self._leaves)
        if bool(failed):
            return self._fn(*self._args)
        return _result(self._template, out_leaves)


def compiled_route(name: str, fn: Callable, *args) -> CompiledRoute | None:
    """The exported program of `fn(*args)` (as `call_exported` uses it) compiled for `args`, so
    that its memory can be read before it runs; None for the usual route."""
    program = _program(name, fn, args)
    if program is None:
        return None
    exported, template, lapack, leaves = program
    try:
        compiled = _compiled(name, exported, lapack, leaves)
    except Exception:  # noqa: BLE001 (a program this JAX set-up does not run: the usual route)
        if os.environ.get("JAXCTBN_DEBUG_EXPORT"):
            raise
        return None
    return CompiledRoute(compiled, template, leaves, fn, args)
