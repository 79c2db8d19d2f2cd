import os

# The tests' problems are tiny, so compilation dominates their time: a lower LLVM optimisation
# level compiles ~20% faster and changes no semantics (results agree to rounding). Set before JAX
# starts its backend; notebook kernels started by the tests inherit it.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

# One persistent compilation cache for the whole run, in a fresh temporary directory (never the
# user's ~/.cache): set here, in the process that starts the xdist workers, so the workers, the
# notebook kernels and the CLI subprocesses all inherit it. A program compiled by one test (or
# recompiled after `jax.clear_caches()` below) is then loaded instead of compiled again by the
# others: -9% on tests/test_criteria.py + tests/test_structure_criteria.py, measured.
if "JAXCTBN_TEST_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _cache_dir = tempfile.mkdtemp(prefix="jaxctbn-test-compilation-cache-")
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
    os.environ["JAXCTBN_TEST_CACHE_DIR"] = _cache_dir
os.environ["JAXCTBN_CACHE_DIR"] = os.environ["JAXCTBN_TEST_CACHE_DIR"]  # the CLI's cache
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["JAXCTBN_TEST_CACHE_DIR"]
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"

import gc  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_programs():
    """Free every compiled program after each test module. XLA's CPU executables each hold
    memory mappings, and a worker that runs a few hundred tests without freeing them reaches the
    kernel's `vm.max_map_count` (65530 by default; measured ~5000 for tests/test_panel.py alone),
    after which LLVM's next allocation fails and the worker dies (a CI crash, not a test
    failure). Programs shared between modules are simply compiled again."""
    yield
    jax.clear_caches()
    gc.collect()


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
