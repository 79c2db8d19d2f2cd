"""The special functions behind the conjugate formulas and the rate draws, each against an
independent route: ln Gamma against SciPy, Gamma variates against SciPy's CDF (Kolmogorov-Smirnov)
and their moments, their shape derivative against E[dx/da] = 1, their independence of how the
rejected proposals are scheduled (buffer sizes, batching), the off-diagonal layout against a
boolean mask."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
import scipy.stats

import jaxctbn._learning.gamma_variates as gamma_module
from jaxctbn._learning.conjugate import log_gamma_positive, off_diagonal_entries, with_zero_diagonal
from jaxctbn._learning.gamma_variates import gamma_variates

# Called eagerly, `gamma_variates` compiles one small program per primitive; compiled whole,
# one program per shape (the draws are the same: compared below, eager against compiled).
gamma_jit = jax.jit(gamma_variates)


def test_log_gamma_positive_matches_scipy_and_its_derivative_is_digamma():
    x = np.concatenate([np.geomspace(1e-8, 1e6, 20001), np.linspace(0.5, 30, 20001)])
    ref = scipy.special.gammaln(x)
    got = np.asarray(jax.jit(log_gamma_positive)(jnp.asarray(x)))
    assert np.max(np.abs(got - ref) / np.maximum(1, np.abs(ref))) < 5e-14
    grad = np.asarray(jax.jit(jax.vmap(jax.grad(log_gamma_positive)))(jnp.asarray(x)))
    dig = scipy.special.digamma(x)
    assert np.max(np.abs(grad - dig) / np.maximum(1, np.abs(dig))) < 1e-12
    x32 = jnp.asarray(x, jnp.float32)
    got32 = log_gamma_positive(x32)
    assert got32.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(got32)))
    ref32 = scipy.special.gammaln(np.asarray(x32, np.float64))  # at the float32 arguments
    err32 = np.abs(np.asarray(got32, np.float64) - ref32) / np.maximum(1, np.abs(ref32))
    assert np.max(err32) < 1e-5  # jax.scipy.special.gammaln: 2.5e-6


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_off_diagonal_entries_round_trip(k):
    tables = jnp.arange(3 * k * k, dtype=float).reshape(3, k, k) + 1
    entries, back = jax.jit(
        lambda t: (off_diagonal_entries(t), with_zero_diagonal(off_diagonal_entries(t)))
    )(tables)
    assert entries.shape == (3, k - 1, k)
    off = ~np.eye(k, dtype=bool)
    for b in range(3):
        assert sorted(np.asarray(entries[b]).ravel()) == sorted(np.asarray(tables[b])[off])
    np.testing.assert_array_equal(back, np.where(off, tables, 0))


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("a", [0.05, 0.2, 0.9, 1.0, 1.5, 3.7, 60.0])
def test_gamma_variates_have_the_gamma_distribution(a, dtype):
    if dtype == jnp.float32 and a < 0.1:
        # 1.3% of Gam(0.05) lies below float32's smallest normal number and is drawn as 0
        # (so does jax.random.gamma); the test's KS statistic would see that mass at 0
        pytest.skip("below float32's range")
    n = 40000
    x = gamma_jit(jax.random.key(3), jnp.full(n, a, dtype))  # one program per dtype
    assert x.dtype == dtype and x.shape == (n,)
    x = np.asarray(x, np.float64)
    assert np.all(x >= 0) and np.all(np.isfinite(x))
    assert scipy.stats.kstest(x, scipy.stats.gamma(a).cdf).pvalue > 1e-3
    assert abs(x.mean() - a) < 5 * np.sqrt(a / n)


def test_gamma_variates_pure_under_jit_and_vmap_with_shape_derivative():
    keys = jax.random.split(jax.random.key(0), 4)
    shapes = jnp.array([[0.3, 2.0], [5.0, 1.0], [0.9, 40.0], [1.0, 1.0]])
    batched = jax.jit(jax.vmap(gamma_variates))(keys, shapes)
    one_by_one = jnp.stack([gamma_jit(k, s) for k, s in zip(keys, shapes)])
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-14)
    # eagerly: the same draws as compiled
    np.testing.assert_array_equal(gamma_variates(keys[0], shapes[0]), one_by_one[0])
    # E[x] = a, so E[dx/da] = 1 for the implicit reparameterisation gradient
    grad = jax.jit(jax.grad(lambda a: gamma_variates(jax.random.key(5), jnp.full(20000, a)).mean()))
    for a in (0.3, 2.5):
        assert abs(float(grad(a)) - 1) < 0.03


def test_gamma_variates_do_not_depend_on_the_redraw_schedule(monkeypatch):
    # shapes near 1 (acceptance ~0.95) and below (boosted), so hundreds of elements are redrawn
    shapes = jnp.asarray(np.r_[np.full(3000, 1.0), np.full(1000, 0.3), np.full(1000, 7.0)])
    key = jax.random.key(11)
    reference = gamma_jit(key, shapes)
    # one slot per round: every rejected element waits for its own round, in another order
    monkeypatch.setattr(gamma_module, "_REDRAW", 10**9)
    monkeypatch.setattr(gamma_module, "_MIN_REDRAW", 1)
    # a new function, traced afresh with the new sizes (the module's program has the old ones)
    one_slot = jax.jit(lambda k, a: gamma_variates(k, a))(key, shapes)
    np.testing.assert_array_equal(one_slot, reference)
    monkeypatch.undo()
    # rows of a nested vmap (shared key, batched shapes, and the reverse) against one by one
    keys = jax.random.split(key, (2, 3))
    rows = shapes[:600].reshape(2, 3, 100)

    @jax.jit
    def batched(keys, rows):
        nested = jax.vmap(jax.vmap(gamma_variates))(keys, rows)
        shared_key = jax.vmap(lambda a: gamma_variates(key, a))(rows[0])
        shared_shape = jax.vmap(lambda k: gamma_variates(k, rows[0, 0]))(keys[1])
        return nested, shared_key, shared_shape

    nested, shared_key, shared_shape = batched(keys, rows)
    for i in range(2):
        for j in range(3):
            np.testing.assert_array_equal(nested[i, j], gamma_jit(keys[i, j], rows[i, j]))
    np.testing.assert_array_equal(shared_key[1], gamma_jit(key, rows[0, 1]))
    np.testing.assert_array_equal(shared_shape[2], gamma_jit(keys[1, 2], rows[0, 0]))
    # a raw uint32 key gives the stream of its typed key (the rows' shape: their program)
    raw = jax.random.PRNGKey(4)
    np.testing.assert_array_equal(
        gamma_jit(raw, rows[0, 0]), gamma_jit(jax.random.wrap_key_data(raw), rows[0, 0])
    )


@pytest.mark.parametrize("bad", [0.0, -1.0, np.nan, np.inf])
def test_gamma_variates_reject_shapes_that_are_not_positive_numbers(bad):
    shapes = jnp.asarray([1.0, bad, 2.0])
    with pytest.raises(Exception, match="shape_parameter"):
        jax.block_until_ready(gamma_jit(jax.random.key(0), shapes))
