"""`jaxctbn._compilation`: `use_unrolled_threefry_on_cpu` gives the same random bits as JAX's
default CPU lowering (a loop), compiled without the loop; `use_compilation_cache` lets a new
process load the programs an earlier one compiled (programs with host callbacks included), with
the same results. Run in fresh processes: both are process-wide."""

import json
import subprocess
import sys
import textwrap

import pytest
from helpers import network_dict

import jaxctbn as jc

_SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, jax.random as jr, numpy as np
    jax.config.update("jax_enable_x64", True)
    import jaxctbn as jc
    from jaxctbn._compilation import use_unrolled_threefry_on_cpu
    from jaxctbn._learning.gamma_variates import gamma_variates

    def draws():  # new function objects each time, so every call lowers afresh
        key = jr.key(7)
        truth = jc.paper_network(jr.key(0))
        fns = {
            "split": lambda k: jr.key_data(jr.split(k, (3, 5))),
            "fold_in": lambda k: jr.key_data(jr.fold_in(jr.fold_in(k, 11), 2**31 + 5)),
            "bits": lambda k: jr.bits(k, (257,), jnp.uint32),
            "uniform": lambda k: jr.uniform(k, (4, 33)),
            "normal": lambda k: jr.normal(k, (65,)),
            "categorical": lambda k: jr.categorical(k, jnp.log(jnp.arange(1.0, 6.0)), shape=(40,)),
            "gamma": lambda k: gamma_variates(k, jnp.linspace(0.2, 9.0, 300)),
            "raw key": lambda k: jr.uniform(jr.PRNGKey(3), (9,)),
            "paths": lambda k: jc.sample_trajectories(
                truth, jnp.zeros(4, jnp.int32), 3.0, key=k, num_trajectories=4, max_events=64
            ).jump_times,
        }
        out = {}
        for name, f in fns.items():
            compiled = jax.jit(f).lower(key).compile()
            out[name] = (np.asarray(compiled(key)), "while" in compiled.as_text())
        return out

    before = draws()
    assert use_unrolled_threefry_on_cpu() is True
    after = draws()
    for name in before:
        (x, loop_before), (y, loop_after) = before[name], after[name]
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert np.array_equal(x, y, equal_nan=True), name
        if name in ("split", "fold_in", "bits", "uniform", "normal", "raw key"):
            assert loop_before and not loop_after, (name, loop_before, loop_after)
    print("OK", len(before))
    """
)


def test_unrolled_threefry_gives_the_same_bits_without_a_loop():
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "OK 9" in done.stdout


# A new process: something compiled before the call (the cache still takes effect), then the
# first `expected_statistics` (its program has checks, so host callbacks) and
# `sample_trajectories`, counting JAX's persistent-cache events during those first calls.
_CACHED_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    import jaxctbn as jc

    jnp.zeros(3).block_until_ready()
    directory = jc.use_compilation_cache(sys.argv[1])
    model = jc.CTBN.from_dict(json.loads(sys.argv[2]))
    s0 = jnp.array([0, 1])
    events = []
    jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
    stats = jc.expected_statistics(model, s0, 1.5)
    paths = jc.sample_trajectories(model, s0, 1.5, key=jax.random.key(3), num_trajectories=4)
    leaves = jax.tree_util.tree_leaves((stats, paths.jump_times, paths.states))
    print(json.dumps({
        "directory": directory,
        "hits": events.count("/jax/compilation_cache/cache_hits"),
        "misses": events.count("/jax/compilation_cache/cache_misses"),
        "values": [np.asarray(a).tolist() for a in leaves],
    }))
    """
)


def test_a_new_process_loads_the_programs_an_earlier_one_compiled(tmp_path):
    cache = str(tmp_path / "cache")

    def run():
        argv = [sys.executable, "-c", _CACHED_SCRIPT, cache, json.dumps(network_dict())]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.splitlines()[-1])

    first, second = run(), run()
    assert first["directory"] == second["directory"] == cache
    assert first["misses"] > 0, first  # compiled and written
    assert second["misses"] == 0 and second["hits"] == first["hits"] + first["misses"], second
    assert second["values"] == first["values"]  # the same results, bit for bit


def test_an_unusable_cache_directory_is_one_warning_and_none(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.warns(UserWarning, match=r"compilation cache .*file/cache: Not a directory"):
        assert jc.use_compilation_cache(blocker / "cache") is None
    monkeypatch.setenv("JAXCTBN_CACHE_DIR", "off")
    assert jc.use_compilation_cache() is None
