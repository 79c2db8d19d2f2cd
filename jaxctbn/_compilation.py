r"""Compiling in less time: JAX's persistent compilation cache for the library's programs, and
the CPU's straight-line random hash.

**The cache.** Every check inside a compiled program (`eqx.error_if`) adds a host callback,
and JAX's persistent cache refuses programs with host callbacks, so without
`cache_programs_with_callbacks` almost no program of the library would be kept between
processes. [`jaxctbn.use_compilation_cache`][] turns both on for a script or notebook; the
`jaxctbn` command calls it for its own process.

**The random hash.** Every random draw of JAX's default keys (`split`, `fold_in`, `uniform`,
`normal`, ...) applies the Threefry-2x32 hash: 20 rounds of add, rotate and xor on 32-bit words.
On the CPU, JAX 0.10 lowers it as a `while` loop over five groups of four rounds (elsewhere, as
straight-line code). Each such loop is a separate program piece that XLA's CPU backend compiles
on its own; the graph and rate draws of a structure design step alone have more than a dozen of
them, most of their compile time. Upstream JAX has since changed the CPU lowering to
straight-line code (jax-ml/jax#37872: with XLA's thunk runtime the loop no longer saves compile
time, and it costs run time). `use_unrolled_threefry_on_cpu` makes the installed JAX do the
same: the same hash, so **the same random bits** for every key, compiled faster, at about the
same run time per step (`benchmarks/active_learning/bench_active_learning.py` reports the
compile and step times, with JAX's loop under `--rolled-threefry`; results in
`benchmarks/results/vbhc_run.md`).
"""

from __future__ import annotations

import os


def use_unrolled_threefry_on_cpu() -> bool:
    r"""Compile JAX's Threefry hash on the CPU as straight-line code instead of a loop
    (what JAX does on other platforms, and what upstream JAX has since made the CPU default,
    jax-ml/jax#37872): the same random bits, compiled in less time (compile times reported by
    `benchmarks/active_learning/bench_active_learning.py`, with JAX's loop under `--rolled-threefry`; results in
    `benchmarks/results/vbhc_run.md`).

    Global and process-wide, like `jax.config.update`: it applies to every program lowered
    afterwards, jaxctbn's or not (programs already compiled keep their code). The benchmarks
    call it, and [`jaxctbn.use_compilation_cache`][] (what the `jaxctbn` command line calls,
    and a script or notebook once at its start). Relies on a private part of JAX (checked
    against jax 0.10): returns `True` when it took effect, `False` (changing nothing) where
    that part is not as expected."""
    try:
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32 as threefry
    except ImportError:
        return False
    primitive = getattr(threefry, "threefry2x32_p", None)
    straight_line = getattr(threefry, "_threefry2x32_lowering_rule", None)
    register = getattr(mlir, "register_lowering", None)
    if primitive is None or straight_line is None or register is None:
        return False
    register(primitive, straight_line, platform="cpu")
    return True


def cache_directory() -> str | None:
    """The persistent compilation cache directory, or None when disabled.

    `JAXCTBN_CACHE_DIR` overrides it (empty or `off` disables the cache); the default is
    `$XDG_CACHE_HOME/jaxctbn/jax-compilation-cache` (`~/.cache/...` without XDG_CACHE_HOME).
    """
    value = os.environ.get("JAXCTBN_CACHE_DIR")
    if value is not None:
        value = value.strip()
        if not value or value.lower() == "off":
            return None
        return os.path.expanduser(value)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jaxctbn", "jax-compilation-cache")


def usable_directory(path: str | None) -> str | None:
    """`path` when a file can be written in it (creating the directory), else None after one
    warning line naming it: a cache that cannot be written falls back to compiling every
    program (the results are the same)."""
    import tempfile
    import warnings

    if path is None:
        return None
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path) as f:
            f.write(b"0")
    except OSError as e:
        warnings.warn(
            f"compilation cache {path}: {e.strerror or e}; compiling every program without it "
            "(JAXCTBN_CACHE_DIR names another directory, or off).",
            stacklevel=2,
        )
        return None
    return path


def cache_programs_with_callbacks() -> None:
    """Let JAX's persistent cache store programs that contain host callbacks.

    Every `eqx.error_if` puts a host callback into its program, and JAX does not cache such
    programs, so without this the commands' main programs would be recompiled on every call.
    JAX refuses them because a deserialised executable needs the callbacks of the running
    process. The cache key hashes the lowered module, which refers to its callbacks by their
    index in the lowering's callback list, and every call lowers its program afresh, so a hit
    can be loaded with the current lowering's callbacks (the same functions, in the same order).

    This wraps three private JAX functions (checked against jax 0.10); where they are not
    as expected it does nothing, and such programs are simply compiled as before.
    """
    import inspect
    import threading

    try:
        from jax._src import compilation_cache, compiler
    except ImportError:
        return
    if getattr(compiler, "_jaxctbn_callbacks_cached", False):
        return
    compile_or_get_cached = getattr(compiler, "compile_or_get_cached", None)
    cache_write = getattr(compiler, "_cache_write", None)
    get_executable = getattr(compilation_cache, "get_executable_and_time", None)
    if compile_or_get_cached is None or cache_write is None or get_executable is None:
        return
    expected = [
        (compile_or_get_cached, ["backend", "computation", "devices", "compile_options"]),
        (cache_write, ["cache_key", "compile_time_secs", "module_name", "backend"]),
        (get_executable, ["cache_key", "compile_options", "backend", "executable_devices"]),
    ]
    try:
        for fn, names in expected:
            params = list(inspect.signature(fn).parameters)
            if params[: len(names)] != names:
                return
        if list(inspect.signature(compile_or_get_cached).parameters)[4] != "host_callbacks":
            return
        if list(inspect.signature(cache_write).parameters)[5:] != ["host_callbacks"]:
            return
    except (TypeError, ValueError, IndexError):
        return
    state = threading.local()

    class _WithCallbacks:  # the backend, deserialising with this lowering's callbacks
        def __init__(self, backend, callbacks):
            self._backend, self._callbacks = backend, list(callbacks)

        def __getattr__(self, name):
            return getattr(self._backend, name)

        def deserialize_executable(self, serialized, executable_devices, compile_options=None):
            return self._backend.deserialize_executable(
                serialized, executable_devices, compile_options, host_callbacks=self._callbacks
            )

    def compile_or_get_cached_(
        backend, computation, devices, compile_options, host_callbacks, *a, **k
    ):
        previous, state.callbacks = getattr(state, "callbacks", None), host_callbacks
        try:
            return compile_or_get_cached(
                backend, computation, devices, compile_options, host_callbacks, *a, **k
            )
        finally:
            state.callbacks = previous

    def cache_write_(
        cache_key, compile_time_secs, module_name, backend, executable, host_callbacks
    ):
        return cache_write(cache_key, compile_time_secs, module_name, backend, executable, ())

    def get_executable_(cache_key, compile_options, backend, executable_devices):
        callbacks = getattr(state, "callbacks", None)
        if callbacks:
            backend = _WithCallbacks(backend, callbacks)
        return get_executable(cache_key, compile_options, backend, executable_devices)

    compiler.compile_or_get_cached = compile_or_get_cached_
    compiler._cache_write = cache_write_
    compilation_cache.get_executable_and_time = get_executable_
    setattr(compiler, "_jaxctbn_callbacks_cached", True)  # noqa: B010 (a module of jax)


def use_compilation_cache(directory: str | os.PathLike | None = None) -> str | None:
    r"""Keep this process's compiled programs on disk, as the `jaxctbn` command does, so that a
    later process (a new notebook kernel, the next run of a script) loads each program it has
    compiled before instead of compiling it again: in a fresh process, the first
    `expected_statistics` on the paper's network then takes 0.28 s instead of 1.17 s, the first
    `score_interventions` 1.46 s instead of 4.23 s, and the whole process a third of the time
    (what is left is tracing and lowering; `benchmarks/results/first_call.md`).

    It sets JAX's persistent compilation cache to `directory` for every program (not only
    those that took a second to compile, JAX's default), lets the cache keep programs with
    host callbacks (every check inside a compiled program has one; JAX alone does not cache
    them, so setting `jax_compilation_cache_dir` yourself keeps almost nothing of jaxctbn's),
    and lowers JAX's random hash on the CPU as straight-line code (the same random bits;
    upstream JAX's lowering since jax-ml/jax#37872), as the command line does, so that the
    command line and a notebook find each other's programs. It takes effect even after
    programs were compiled; those are simply not in the cache.

    Process-wide, like `jax.config.update`; `import jaxctbn` alone changes nothing. The cache
    is trusted as code: do not share its directory with users you do not trust.

    **Arguments:**

    - `directory`: where the programs are kept; `None` (default) uses `$JAXCTBN_CACHE_DIR`
      if set (empty or `off` disables the cache), else
      `$XDG_CACHE_HOME/jaxctbn/jax-compilation-cache` (`~/.cache/...` without
      `XDG_CACHE_HOME`): the command line's cache, shared with it.

    **Returns** the directory in use, or `None` when the cache is disabled or the directory
    cannot be written (one warning line names it; programs are then compiled as before, with
    the same results). The random hash's lowering is changed in every case.
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    use_unrolled_threefry_on_cpu()
    path = usable_directory(
        cache_directory() if directory is None else os.fspath(os.path.expanduser(directory))
    )
    if path is None:
        return None
    if getattr(jax.config, "jax_compilation_cache_dir", None) != path:
        jax.config.update("jax_compilation_cache_dir", path)
        # JAX decides whether to use its cache once, at the first compilation: decide again
        compilation_cache.reset_cache()
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    cache_programs_with_callbacks()
    return path
