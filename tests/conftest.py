import os

# The tests' problems are tiny, so compilation dominates their time: a lower LLVM optimisation
# level (~20% faster), XLA's CPU elemental emitters instead of its newer fusion emitters and one
# code-generation thread (the two workers already share two cores) compile the suite's programs
# with ~40% less CPU time (measured on test_criteria + test_panel_design: 125 s -> 76 s) and
# change no semantics (results agree to rounding). Set before JAX starts its backend (flags
# already set are kept); notebook kernels and CLI subprocesses started by the tests inherit them.
_flags = os.environ.get("XLA_FLAGS", "").split()
for _flag in (
    "--xla_backend_optimization_level=0",
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_cpu_parallel_codegen_split_count=1",
):
    if not any(f.split("=")[0] == _flag.split("=")[0] for f in _flags):
        _flags.append(_flag)
os.environ["XLA_FLAGS"] = " ".join(_flags)
# JAX's older GSPMD partitioner instead of Shardy: the suite's programs lower and compile with
# ~10% less CPU time (measured on test_panel_design: 60-68 s -> 54-55 s of user time), the
# same results; inherited by the notebook kernels and CLI subprocesses. The multi-device tests
# (test_sharding.py) keep Shardy, the default users get.
os.environ.setdefault("JAX_USE_SHARDY_PARTITIONER", "0")
# The programs' MLIR locations carry the one user frame of each operation instead of its whole
# Python stack (test_panel_posterior alone: 52-54 s -> 46-48 s); locations are debug
# information (XLA's error and profile annotations) and change no program's result. Inherited
# by the notebook kernels and the CLI subprocesses.
os.environ.setdefault("JAX_INCLUDE_FULL_TRACEBACKS_IN_LOCATIONS", "0")

# One persistent compilation cache for the whole run, in a fresh temporary directory (never the
# user's ~/.cache): set here, in the process that starts the xdist workers, so the workers, the
# notebook kernels and the CLI subprocesses all inherit it. A program compiled by one worker,
# test or subprocess is then loaded instead of compiled again by the others.
if "JAXCTBN_TEST_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _cache_dir = tempfile.mkdtemp(prefix="jaxctbn-test-compilation-cache-")
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
    os.environ["JAXCTBN_TEST_CACHE_DIR"] = _cache_dir
os.environ["JAXCTBN_CACHE_DIR"] = os.environ["JAXCTBN_TEST_CACHE_DIR"]  # the CLI's cache
# The in-process CLI calls take the usual route: exporting a program empties the process's jit
# caches (`_cli/exported.py`), which would cost every later test its compiled programs; the
# exported route has its own tests (tests/cli/test_cli_cache.py), and the notebooks and CLI
# subprocesses inherit the setting.
os.environ.setdefault("JAXCTBN_EXPORTED_PROGRAMS", "off")
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["JAXCTBN_TEST_CACHE_DIR"]
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"

import functools  # noqa: E402
import gc  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

from jaxctbn._cli.jax_setup import _setup_jax  # noqa: E402

# Eight CPU devices in every worker (before JAX starts its backend), so that the multi-device
# tests run in process; a program not sharded explicitly runs on the first device as before.
jax.config.update("jax_num_cpu_devices", 8)

# The command line's JAX set-up, once per worker, so that the in-process CLI calls change
# nothing: float64; the persistent cache above, which also stores programs with host
# callbacks (every `eqx.error_if` adds one, and JAX alone would not cache those: almost every
# program of the library); the CPU's straight-line Threefry lowering (the same random bits).
_setup_jax()
jax.config.update("jax_use_shardy_partitioner", os.environ["JAX_USE_SHARDY_PARTITIONER"] != "0")


def _remember_which_files_jax_hides() -> None:
    """Every check the library traces (`eqx.error_if`) walks the Python stack and asks JAX, for
    each frame, whether its file is one of JAX's hidden ones (`traceback_util.include_filename`:
    ~35 paths each normalised and compared, with a `stat` per comparison): ~6,400 checks and
    ~200,000 comparisons in test_panel_posterior alone. The answer depends only on the file
    name and the registered paths, so it is remembered per name, forgotten when a path is
    registered. Only the traceback kept for an error's message depends on it; no program
    changes. (A JAX without this function is left as it is.)"""
    from jax._src import traceback_util

    include_filename = getattr(traceback_util, "include_filename", None)
    register_exclusion = getattr(traceback_util, "register_exclusion", None)
    if include_filename is None or register_exclusion is None:
        return
    remembered = functools.lru_cache(maxsize=None)(include_filename)

    def register_and_forget(path):
        register_exclusion(path)
        remembered.cache_clear()

    traceback_util.include_filename = remembered
    traceback_util.register_exclusion = register_and_forget


_remember_which_files_jax_hides()


def _mapped_regions() -> int | None:
    try:
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:
        return None


def _max_mapped_regions() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65530


def pytest_collection_finish(session):
    """Python's cyclic garbage collector, set for a run that traces thousands of programs: the
    objects alive after collection (the modules of JAX, jaxctbn and the tests) are frozen, so
    that no full collection walks them again, and the youngest generation is collected every
    50,000 allocations instead of 700. Its share of a file's time, measured on
    tests/criteria/test_criteria.py: 2.6 s of 33 s before, 0.8 s after."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """An xdist worker ends here, after its last hook (its results are with the controller
    since `pytest_sessionfinish`), without the interpreter's teardown: destroying a worker's
    thousands of compiled programs one by one kept the run waiting ~5 s after its last test
    (measured from the tests' end times to the run's). `jaxctbn`'s console script ends the
    same way (`jax_setup.exit_without_teardown`). A run without workers ends as usual."""
    if hasattr(config, "workerinput"):
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_programs():
    """Free the compiled programs after a test module when the worker's memory mappings near
    the kernel's limit. XLA's CPU executables each hold memory mappings, and a worker that
    keeps a few hundred modules' programs reaches `vm.max_map_count` (65530 by default;
    measured ~5000 for tests/panel/test_panel.py alone), after which LLVM's next allocation fails and
    the worker dies (a crash, not a test failure). Below three quarters of the limit the
    programs are kept, so later modules that compile the same programs reuse them. Freeing
    costs ~0.2 ms per mapping (measured: 6,100 mappings in 1.2 s), whenever it happens, plus
    the tracing of every program used again afterwards: at half the limit it happened three
    times a run, at three quarters twice. A quarter still leaves ~16,000 mappings, over twice
    what the largest module adds (~6,100 for test_master_equation)."""
    yield
    regions = _mapped_regions()
    if regions is None or regions > _max_mapped_regions() * 3 // 4:
        jax.clear_caches()
        gc.collect()


@pytest.fixture(scope="session", autouse=True)
def _one_blas_thread():
    """numpy's and scipy's references on one OpenBLAS thread per worker: the two workers
    already share the two cores, and OpenBLAS's threads then wait on each other, so a small
    dense routine takes up to ~100 times longer (measured: 120 `scipy.linalg.expm` of 3 x 3
    matrices 1.7 s, on one thread 3 ms). threadpoolctl comes with scikit-learn (dev extras)."""
    import threadpoolctl

    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        yield


@pytest.fixture
def getkey():
    """A fresh key on each call, deterministic per test."""
    state = {"key": jax.random.key(1234)}

    def _getkey():
        state["key"], sub = jax.random.split(state["key"])
        return sub

    return _getkey


@pytest.fixture
def no_runtime_typecheck():
    """Turn off the jaxtyping/beartype run-time checks (pytest `--jaxtyping-packages`) for a test
    that passes arguments of the wrong type on purpose, to test jaxctbn's own error messages."""
    import jaxtyping

    previous = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping.config.update("jaxtyping_disable", previous)


#: The files that take longest (measured with `--durations`; tests/README.md), longest first.
#: `make test` sends each file whole to one worker (`--dist loadfile`: a module's fixtures and
#: programs are built once, not once per worker), in collection order; the longest files go
#: first, so that no worker is left with a long file at the end of the run while the other
#: waits. The rest follow in name order.
_LONGEST_FIRST = (
    "test_gibbs.py",
    "test_cli_panel.py",
    "test_notebooks.py",
    "test_panel_rate_mixture.py",
    "test_batches.py",
    "test_panel_fit.py",
    "test_structure_criteria.py",
    "test_master_equation.py",
    "test_priors_in_the_loop.py",
    "test_cli.py",
    "test_panel_covariates.py",
    "test_panel_structure_design.py",
    "test_strengths.py",
    "test_search.py",
    "test_learning.py",
    "test_panel_periods.py",
    "test_panel_design.py",
    "test_hostile_inputs.py",
    "test_panel_strength.py",
    "test_panel_mean_field.py",
    "test_sharding.py",
    "test_criteria.py",
    "test_mean_field.py",
    "test_panel_outcomes.py",
    "test_cli_batches.py",
    "test_panel_buckets.py",
    "test_runtime_types.py",
    "test_pool.py",
    "test_batches_loop.py",
    "test_panel_posterior.py",
    "test_readme.py",
)
_RANK = {name: i for i, name in enumerate(_LONGEST_FIRST)}


#: The files that tests/test_runtime_types.py runs again with the run-time type checks on: in a
#: run without those checks, they are collected only when named on the command line (the
#: checked run covers them, so `make test` runs them once).
RUNTIME_TYPED = (
    "model/test_model.py",
    "test_value_checks.py",
    "active_learning/test_metrics_ties.py",
    "panel/test_panel_io.py",
    "paths/test_csv_errors.py",
)
_TESTS = os.path.dirname(os.path.abspath(__file__))


def pytest_ignore_collect(collection_path, config):
    relative = os.path.relpath(collection_path, _TESTS)
    if relative not in RUNTIME_TYPED or config.getoption("jaxtyping_packages", None):
        return None
    named = {os.path.realpath(arg.split("::")[0]) for arg in config.args}
    return None if os.path.realpath(collection_path) in named else True


def pytest_collection_modifyitems(config, items):
    # stable: the tests of a file keep their order, the other files theirs
    items.sort(key=lambda item: _RANK.get(item.path.name, len(_RANK)))
