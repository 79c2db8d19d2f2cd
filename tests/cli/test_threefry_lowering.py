"""`use_unrolled_threefry_on_cpu`: the same random bits as JAX's default CPU lowering (a loop),
compiled without the loop. Run in a fresh process: the lowering is process-wide."""

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, jax.random as jr, numpy as np
    jax.config.update("jax_enable_x64", True)
    import jaxctbn as jc
    from jaxctbn._cli.threefry_lowering import use_unrolled_threefry_on_cpu
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
