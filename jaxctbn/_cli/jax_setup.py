"""The JAX process setup of the command line: 64-bit floats, the straight-line random hash on
the CPU, and the persistent compilation cache (which, by patching private JAX functions, also
keeps programs with host callbacks); and `_jit`, a sequence of steps compiled as one program."""

from __future__ import annotations

import os


def _cache_dir():
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


def _usable(path):
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


def use_one_blas_thread() -> bool:
    """One OpenBLAS thread for this process (`OPENBLAS_NUM_THREADS=1`, set before numpy is
    imported; a user's own setting is kept). The command computes with JAX, which has its own
    thread pool; numpy's and scipy's OpenBLAS libraries only start their threads at import,
    which then spin a while on the cores the call needs: a warm `jaxctbn fit` on the psor data
    took 0.3 s less CPU and about 0.1 s less wall time without them. Only the `jaxctbn` command
    does this; importing the library changes nothing. Returns whether it was set."""
    import sys

    if "OPENBLAS_NUM_THREADS" in os.environ or "numpy" in sys.modules:
        return False
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    return True


#: glibc's `mallopt` parameter number of the mmap threshold
_M_MMAP_THRESHOLD = -3


def fix_malloc_mmap_threshold(threshold: int = 128 * 1024) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes (its initial value) for this process:
    a freed block of at least that size then goes back to the system at once. Left alone, glibc
    raises the threshold to the size of each large block freed (up to 32 MiB), after which
    such blocks come from heaps it seldom returns; a structure search over a hundred nodes then
    holds freed memory from call to call (peak 545 MiB instead of 468 MiB at N = 100, against
    a floor of 249 MiB: `benchmarks/results/graph_search_memory.md`) at no measurable speed
    difference (docs/formats.md, "The allocator setting").
    Only the `jaxctbn` command does this (for its own process; a user's
    `MALLOC_MMAP_THRESHOLD_` is kept); importing the library changes no allocator setting.
    Returns whether it was set (False off glibc)."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, int(threshold)))


def _setup_jax():
    import logging

    import jax

    jax.config.update("jax_enable_x64", True)
    # A check inside compiled code (eqx.error_if) raises from a host callback, and JAX also logs
    # that callback's traceback to stderr; the CLI prints the library's own message instead.
    logging.getLogger("jax._src.callback").setLevel(logging.CRITICAL)
    # the same random bits, compiled in less time (see `threefry_lowering`)
    from .threefry_lowering import use_unrolled_threefry_on_cpu

    use_unrolled_threefry_on_cpu()
    path = _usable(_cache_dir())
    if path is not None:
        # Compilation dominates a CLI call on small data; JAX's persistent cache keeps the
        # compiled programs between calls. By default JAX only stores programs that took >= 1 s
        # to compile, so lower the thresholds: small CPU programs are worth caching too.
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        _cache_programs_with_callbacks()


def _cache_programs_with_callbacks():
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


def _jit(fn):
    """`fn` compiled as one program: a sequence of small eager operations costs one compilation
    (or persistent-cache lookup) per operation, a noticeable part of a short CLI call."""
    import equinox as eqx

    return eqx.filter_jit(fn)


def _exported(name: str, fn):
    """`fn` compiled as one program (`_jit`) and run through the command line's exported
    programs (`jaxctbn._programs.run_program`): a warm call loads it instead of tracing it;
    `name` names its file. Every argument that changes the program must be an argument."""
    from .._programs import run_program

    jitted = _jit(fn)
    return lambda *args: run_program(name, jitted, *args)
