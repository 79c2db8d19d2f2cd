import jax
import pytest

jax.config.update("jax_enable_x64", True)


@pytest.fixture
def getkey():
    """A fresh key on each call, deterministic per test."""
    state = {"key": jax.random.key(1234)}

    def _getkey():
        state["key"], sub = jax.random.split(state["key"])
        return sub

    return _getkey
