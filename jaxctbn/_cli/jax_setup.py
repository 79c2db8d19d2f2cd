"""The JAX process setup of the command line: 64-bit floats and `jaxctbn.use_compilation_cache`
(the persistent compilation cache, also for programs with host callbacks, and the straight-line
random hash on the CPU); and `_jit`, a sequence of steps compiled as one program."""

from __future__ import annotations

import os


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


#: CPython's default collection thresholds, and the command's (as the test suite's workers)
_DEFAULT_GC_THRESHOLDS = (700, 10, 10)
_GC_THRESHOLDS = (50_000, 20, 20)


def fewer_garbage_collections() -> bool:
    """Collect cyclic garbage less often in this process (`gc.set_threshold(50_000, 20, 20)`
    instead of CPython's `700, 10, 10`): importing JAX and tracing a program allocate hundreds
    of thousands of objects that live on, and the default thresholds run a collection, which
    walks them, every 700 allocations. Paired whole processes (farm-bench, medians, the same
    output bytes): a warm `jaxctbn learn` 1.17 -> 1.13 s (10 pairs), a warm `jaxctbn fit` on
    a new psor data set 1.92 -> 1.81 s (8 pairs), a `fit` with an empty cache 14.8 -> 14.1 s (3
    pairs), peak memory within 12 MiB. Garbage is still collected, less often (the test
    suite's workers trace for hours with the same thresholds).
    Only the `jaxctbn` command does this, and not where the thresholds are not CPython's
    defaults (a user's own setting is kept); importing the library changes nothing. Returns
    whether it was set."""
    import gc

    if gc.get_threshold() != _DEFAULT_GC_THRESHOLDS:
        return False
    gc.set_threshold(*_GC_THRESHOLDS)
    return True


def exit_without_teardown(status: int) -> None:
    """End the command's process with `status` the way Python ends it, less the interpreter's
    teardown: the threads that are not daemons are joined and the exit functions run
    (`atexit`: JAX's, logging's), the standard streams flushed, then `os._exit`. The teardown
    skipped (every module's globals cleared, JAX's compiled programs, devices and thread pools
    destroyed one by one) took about 0.2 s of a warm `jaxctbn learn`'s 1.05 s (farm-bench, 10
    pairs: 1.05 -> 0.85 s, the same output bytes) and nothing of it is seen: the files are
    written and closed before. Where a stream cannot be flushed (a closed pipe), the
    interpreter has no `atexit._run_exitfuncs`, or a profiler or tracer is on (`python -m
    cProfile`, coverage: they write their results once the program is over), Python's own
    exit takes over (`sys.exit`). Only the `jaxctbn` console script ends this way; `main`
    returns its status as before."""
    import atexit
    import sys
    import threading

    run_exit_functions = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_functions is None or sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(status)
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    run_exit_functions()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):  # a closed pipe or stream: Python's exit reports it
        sys.exit(status)
    os._exit(status)


#: glibc's `mallopt` parameter number of the mmap threshold
_M_MMAP_THRESHOLD = -3
#: the mmap threshold for `fit`: glibc's largest (the most it raises its own threshold to).
#: With an empty cache, most of a `fit` is XLA compiling, which allocates and frees many
#: blocks between 128 KiB and a few MiB; at 128 KiB each is an `mmap` and a `munmap`. Paired
#: runs with an empty cache (psor 5 pairs, cav ~ sex 3): wall time 0.875x and 0.865x, peak
#: memory +2% and -6%.
_COMPILING_MMAP_THRESHOLD = 32 * 2**20


def mmap_threshold_for(argv) -> int:
    """The mmap threshold the `jaxctbn` command fixes for the command `argv` (its arguments):
    glibc's initial 128 KiB, for the bounded memory of a long structure search, except for
    `fit`, whose first call is mostly compilation (`_COMPILING_MMAP_THRESHOLD`)."""
    return _COMPILING_MMAP_THRESHOLD if list(argv[:1]) == ["fit"] else 128 * 1024


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

    from .._compilation import use_compilation_cache

    jax.config.update("jax_enable_x64", True)
    # A check inside compiled code (eqx.error_if) raises from a host callback, and JAX also logs
    # that callback's traceback to stderr; the CLI prints the library's own message instead.
    logging.getLogger("jax._src.callback").setLevel(logging.CRITICAL)
    # Compilation dominates a CLI call on small data: the persistent cache (JAXCTBN_CACHE_DIR)
    # keeps the compiled programs between calls, and the straight-line random hash compiles
    # in less time (the same bits)
    use_compilation_cache()


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
