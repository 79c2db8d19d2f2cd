"""Precision of the exact solver for large lambda * tau (issue 10): float32 and float64 against
exact references, the checks that guard every output under jit and vmap, and gradients through
the stepped solve."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import brute_force_generator, one_hot_state, random_model

import jaxctbn as jc
from jaxctbn._master_equation.generator import amalgamate


def reference_moments(W, p0, tau):
    """`(p_tau, int_0^tau p_t dt)` in extended precision (numpy longdouble, 64-bit mantissa):
    Taylor series of exp(h A), A = [[W, c I], [0, 0]] (the integral block scaled like W), with
    ||h A|| <= 1/4, then repeated squaring. Independent of jaxctbn and of scipy; its error grows
    like 2^squarings * 1e-19 * S: ~1e-12 at lambda * tau = 1e5, 6e-12 at 1e6 (S = 12)."""
    W = np.asarray(W, np.longdouble)
    S = W.shape[0]
    c = max(float(np.abs(W).sum(1).max()), 1.0 / float(tau))
    A = np.zeros((2 * S, 2 * S), np.longdouble)
    A[:S, :S] = W
    A[:S, S:] = np.eye(S, dtype=np.longdouble) * np.longdouble(c)
    j = max(0, math.ceil(math.log2(float(np.abs(A).sum(1).max()) * float(tau) / 0.25)))
    hA = A * (np.longdouble(tau) / np.longdouble(2) ** j)
    E = np.eye(2 * S, dtype=np.longdouble)
    term = np.eye(2 * S, dtype=np.longdouble)
    for k in range(1, 25):
        term = term @ hA / k
        E = E + term
    for _ in range(j):
        E = E @ E
    z = np.concatenate([np.asarray(p0, np.longdouble), np.zeros(S, np.longdouble)]) @ E
    return np.asarray(z[:S], np.float64), np.asarray(z[S:] / np.longdouble(c), np.float64)


def two_state(a, b, tau):
    """Exact `(p_tau, int p)` of one binary node with rates a (0 -> 1) and b (1 -> 0), from 0."""
    r = a + b
    decay = -math.expm1(-r * tau)  # 1 - exp(-r tau)
    p1 = a / r * decay
    i1 = a / r * (tau - decay / r)
    return np.array([1 - p1, p1]), np.array([tau - i1, i1])


def _cast(model, dtype):
    return jc.CTBN(cims=[c.astype(dtype) for c in model.cims], parents=model.parents)


def test_reference_is_exact_for_two_states():
    for tau in [0.5, 1e3, 1e6]:
        p, i = reference_moments(np.array([[-0.7, 0.7], [0.2, -0.2]]), [1.0, 0.0], tau)
        p_ex, i_ex = two_state(0.7, 0.2, tau)
        assert np.abs(p - p_ex).max() < 1e-12 and np.abs(i - i_ex).max() < 1e-12 * tau


def test_issue_case_float32_rate_600_horizon_100():
    # the issue's example: the float32 Poisson weights summed to 6.6e5 and p_tau was 329610
    model = jc.CTBN(
        cims=[jnp.array([[[-600.0, 600.0], [600.0, -600.0]]], jnp.float32)], parents=[[]]
    )
    run = jax.jit(lambda m, tau: jc.expected_statistics(m, jnp.array([0]), tau))
    for tau in [1.0, 100.0, 1000.0]:  # lambda tau = 6e2, 6e4, 6e5
        st = run(model, jnp.float32(tau))
        assert st.final_marginal.dtype == jnp.float32 and st.dwell_times.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(st.final_marginal), 0.5, rtol=1e-5)
        p_ex, i_ex = two_state(600.0, 600.0, tau)
        assert np.abs(np.asarray(st.dwell_times, float) - i_ex).max() < 1e-5 * tau
        assert abs(float(st.dwell_times.sum()) - tau) < 1e-5 * tau


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_large_lambda_tau_stiff_mixed_model(dtype, getkey):
    # mixed cardinalities, rates 1e-2 and 1e2 (ratio 1e4): slow modes that never mix within a
    # step, where the rounding of a direct chain of products accumulates
    cards, parents = (2, 3, 2), ((2,), (0,), (1, 0))
    model = _cast(random_model(getkey(), cards, parents, stiff=True), dtype)
    W = brute_force_generator(_cast(model, jnp.float64))  # the rates as the solver sees them
    lam = float(np.max(-np.diag(W)))
    run = jax.jit(lambda m, tau: jc.expected_statistics(m, jnp.array([0, 0, 0]), tau))
    tol = {jnp.float32: 1e-5, jnp.float64: 1e-10}[dtype]
    for lam_tau in [1e2, 1e4, 1e5]:
        tau = lam_tau / lam
        st = run(model, jnp.asarray(tau, dtype))
        assert st.dwell_times.dtype == dtype
        p_ref, i_ref = reference_moments(W, one_hot_state(model, [0, 0, 0]), tau)
        assert np.abs(np.asarray(st.final_marginal, float) - p_ref).max() < tol
        assert np.abs(np.asarray(st.dwell_times, float) - i_ref).max() < tol * tau
        assert abs(float(st.dwell_times.sum()) - tau) < tol * tau


def test_float64_two_state_lambda_tau_1e5():
    model = jc.CTBN(cims=[jnp.array([[[-3.0, 3.0], [0.01, -0.01]]])], parents=[[]])
    tau = 1e5 / 3.0
    st = jax.jit(lambda m: jc.expected_statistics(m, jnp.array([0]), tau))(model)
    p_ex, i_ex = two_state(3.0, 0.01, tau)
    assert np.abs(np.asarray(st.final_marginal) - p_ex).max() < 1e-10
    assert np.abs(np.asarray(st.dwell_times) - i_ex).max() < 1e-10 * tau


def test_float32_runs_in_float32(getkey):
    # with x64 on, float32 rates must not be promoted anywhere in the solve
    model = _cast(random_model(getkey(), (2, 3), ((1,), (0,))), jnp.float32)
    jaxpr = jax.make_jaxpr(lambda m: jc.expected_statistics(m, jnp.array([0, 1]), 2.0).dwell_times)(
        model
    )
    assert "f64" not in str(jaxpr)


@pytest.mark.parametrize("transpose", [False, True], ids=["forward", "backward"])
def test_many_steps_match_reference(transpose, getkey):
    # a small max_step_mean forces many chained steps (~80) at a cheap lambda tau (~300)
    model = random_model(getkey(), (3, 2), ((1,), (0,)), scale=5.0)
    gen = jax.jit(amalgamate)(model)
    W = brute_force_generator(model)
    v = np.random.default_rng(6).dirichlet(np.ones(6))
    tau = 300.0 / float(np.max(-np.diag(W)))
    solver = jc.Uniformisation(max_step_mean=4.0)
    fn = jax.jit(solver.solve_backward if transpose else solver.solve)
    out, integral = fn(gen, jnp.asarray(v), tau)
    ref, ref_i = reference_moments(W.T if transpose else W, v, tau)
    assert np.abs(np.asarray(out) - ref).max() < 1e-12
    assert np.abs(np.asarray(integral) - ref_i).max() < 1e-12 * tau


def test_batch_matches_single_solves_over_many_steps(getkey):
    # solve_batch shares one lambda (the batch's largest rate) and so one schedule
    cards, parents = (2, 2), ((), (0,))
    models = [random_model(getkey(), cards, parents, scale=s) for s in (0.5, 3.0, 10.0)]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *models)
    init = jnp.zeros((3, 2), int)
    solver = jc.Uniformisation(max_step_mean=16.0)
    batch = jax.jit(lambda m: jc.expected_statistics_batch(m, init, 20.0, solver=solver))(stacked)
    single = jax.jit(lambda m: jc.expected_statistics(m, init[0], 20.0, solver=solver))
    for i, m in enumerate(models):
        st = single(m)
        np.testing.assert_allclose(batch.dwell_times[i], st.dwell_times, rtol=1e-12)
        np.testing.assert_allclose(batch.final_marginal[i], st.final_marginal, atol=1e-13)


# --------------------------------------------------------------------- checks on every output
# eqx.error_if raises EquinoxRuntimeError under eqx.filter_jit, JaxRuntimeError under jax.jit
RUNTIME_ERRORS = (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError)


def _too_long():
    model = jc.CTBN(cims=[jnp.array([[[-50.0, 50.0], [50.0, -50.0]]])], parents=[[]])
    return model, jc.Uniformisation(max_terms=1000)  # lambda tau = 50 per unit horizon


@pytest.mark.parametrize("output", ["final_marginal", "dwell_times"])
def test_max_terms_check_guards_each_output_under_jit(output):
    # an error_if whose result is unused is compiled away: each output must carry the check
    model, solver = _too_long()
    fn = jax.jit(
        lambda m, tau: getattr(
            jc.expected_statistics(m, jnp.array([0]), tau, solver=solver), output
        )
    )
    with pytest.raises(RUNTIME_ERRORS, match="max_terms reached"):
        fn(model, 40.0).block_until_ready()
    fn(model, 1.0).block_until_ready()  # lambda tau = 50: fine


@pytest.mark.parametrize("which", [0, 1])
def test_max_terms_check_guards_each_output_under_vmap(which):
    model, solver = _too_long()
    gen = amalgamate(model)
    p0 = jnp.array([[1.0, 0.0], [0.5, 0.5]])
    with pytest.raises(RUNTIME_ERRORS, match="max_terms reached"):
        jax.jit(jax.vmap(lambda p: solver.solve(gen, p, 40.0)[which]))(p0).block_until_ready()
    with pytest.raises(RUNTIME_ERRORS, match="max_terms reached"):
        batch = jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), gen)
        jax.jit(lambda p: solver.solve_batch(batch, p, 40.0)[which])(p0).block_until_ready()


def test_non_finite_horizon_is_an_error_not_nan():
    model, _ = _too_long()
    gen = amalgamate(model)
    with pytest.raises(RUNTIME_ERRORS, match="not finite"):
        jax.jit(lambda: jc.Uniformisation().solve(gen, jnp.array([1.0, 0.0]), jnp.inf)[1])()


@pytest.mark.parametrize("which", [0, 1], ids=["dwell", "flux"])
def test_forward_backward_check_guards_each_output(which, getkey):
    gen = amalgamate(random_model(getkey(), (2, 2), ((), (0,)), scale=100.0))
    solver = jc.Uniformisation(fb_max_terms=16)
    p = jnp.full(4, 0.25)
    with pytest.raises(RUNTIME_ERRORS, match="fb_max_terms"):
        jax.jit(lambda b: solver.forward_backward(gen, p, b, 5.0)[which])(
            jnp.ones(4)
        ).block_until_ready()
    with pytest.raises(RUNTIME_ERRORS, match="fb_max_terms"):
        jax.jit(jax.vmap(lambda b: solver.forward_backward(gen, p, b, 5.0)[which]))(
            jnp.ones((2, 4))
        ).block_until_ready()


@pytest.mark.parametrize("which", [0, 1], ids=["final", "integral"])
def test_matrix_exponential_check_guards_each_output(which):
    # jax's expm returns NaN past its squaring limit; MatrixExponential must raise instead
    model, _ = _too_long()
    gen = amalgamate(model)
    solver = jc.MatrixExponential()
    p0 = jnp.array([[1.0, 0.0], [0.5, 0.5]])
    with pytest.raises(RUNTIME_ERRORS, match="MatrixExponential: the matrix exponential"):
        jax.jit(lambda p: solver.solve(gen, p, 1e12)[which])(p0[0]).block_until_ready()
    with pytest.raises(RUNTIME_ERRORS, match="MatrixExponential: the matrix exponential"):
        jax.jit(jax.vmap(lambda p: solver.forward_backward(gen, p, p, 1e12)[which]))(
            p0
        ).block_until_ready()
    if which:
        return
    # lambda tau = 5e7, past jax's default of 16 squarings: finite, and right to the accuracy
    # that 25 squarings leave (about 2^25 eps)
    p, integral = jax.jit(solver.solve)(gen, p0[0], 1e6)
    np.testing.assert_allclose(p, 0.5, rtol=1e-7)
    np.testing.assert_allclose(integral, 5e5, rtol=1e-7)


# --------------------------------------------------------------------------------- gradients
def test_gradient_through_many_steps(getkey):
    model = random_model(getkey(), (2, 3), ((), (0,)), scale=3.0)
    init = jnp.array([1, 0])
    weights = jax.random.normal(getkey(), (6,))
    stepped = jc.Uniformisation(max_step_mean=8.0)  # ~10 steps at tau = 6

    def loss(cims, tau):
        st = jc.expected_statistics(
            jc.CTBN(cims=cims, parents=model.parents), init, tau, solver=stepped
        )
        return weights @ st.dwell_times + weights @ st.final_marginal

    g_cims, g_tau = jax.jit(jax.grad(loss, argnums=(0, 1)))(model.cims, 6.0)
    # rates: central differences along a random direction (the loss is smooth in the rates)
    rng = np.random.default_rng(3)
    cims = [np.asarray(c) for c in model.cims]
    direction = [rng.normal(size=c.shape) for c in cims]
    f = jax.jit(loss)
    eps = 1e-5
    plus = f([c + eps * d for c, d in zip(cims, direction)], 6.0)
    minus = f([c - eps * d for c, d in zip(cims, direction)], 6.0)
    ad = sum(float((g * d).sum()) for g, d in zip(g_cims, direction))
    assert abs(ad - float(plus - minus) / (2 * eps)) < 1e-7 * max(1.0, abs(ad))
    # horizon: d/dtau of (p_tau, int p) is (p_tau W, p_tau)
    W = brute_force_generator(model)
    p_tau, _ = reference_moments(W, one_hot_state(model, [1, 0]), 6.0)
    np.testing.assert_allclose(g_tau, float(weights @ (p_tau @ W) + weights @ p_tau), rtol=1e-9)
