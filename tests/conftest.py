import os

# The tests' problems are tiny, so compilation dominates their time: a lower LLVM optimisation
# level compiles ~20% faster and changes no semantics (results agree to rounding). Set before JAX
# starts its backend; notebook kernels started by the tests inherit it.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

import gc  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)


@pytest.fixture(scope="session", autouse=True)
def _cli_compilation_cache(tmp_path_factory):
    """The CLI's persistent compilation cache goes to one temporary directory for the session
    (not the user's ~/.cache); subprocesses inherit it, and repeated CLI calls reuse it."""
    old = os.environ.get("JAXCTBN_CACHE_DIR")
    os.environ["JAXCTBN_CACHE_DIR"] = str(tmp_path_factory.mktemp("jax-compilation-cache"))
    yield
    if old is None:
        os.environ.pop("JAXCTBN_CACHE_DIR", None)
    else:
        os.environ["JAXCTBN_CACHE_DIR"] = old


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
