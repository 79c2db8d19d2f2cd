"""The law of a panel outcome (the global state seen at a few times): its KL divergence against
brute-force enumeration of every outcome sequence with scipy's `expm`, under jit, vmap and grad
(finite differences in the rates and the times); the data-processing inequalities against the
complete-path KL (maths §2); the sampler and the log-likelihood against the exact law."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from helpers import brute_force_generator, brute_force_panel_kl

import jaxctbn as jc
from jaxctbn._criteria.parameter import kl_divergence
from jaxctbn._panel.outcome_law import (
    panel_kl_divergence,
    panel_outcome_log_likelihood,
    sample_panel_outcome,
)

jax.config.update("jax_enable_x64", True)


def _chain(rates_a, rates_b, parents=((), (0,))):
    """Two binary nodes (A, B) with the given off-diagonal rates (flattened per node)."""
    cims = []
    for rates, par in zip((rates_a, rates_b), parents):
        r = np.asarray(rates, float).reshape(2 ** len(par), 2)
        cim = np.zeros((2 ** len(par), 2, 2))
        cim[:, 0, 1], cim[:, 1, 0] = r[:, 0], r[:, 1]
        cim[:, 0, 0], cim[:, 1, 1] = -r[:, 0], -r[:, 1]
        cims.append(jnp.asarray(cim))
    return jc.CTBN(cims=cims, parents=parents, names=("A", "B"))


MODEL = _chain([0.4, 1.1], [0.3, 2.0, 1.5, 0.2])
OTHER = _chain([1.3, 0.5], [0.9, 0.4, 0.6, 1.7])
# another graph over the same nodes: A <- B, B alone
REVERSED = _chain([0.7, 0.2, 1.9, 0.8], [0.5, 0.6], parents=((1,), ()))
TIMES = np.array([0.4, 1.1, 2.5])


def test_panel_kl_matches_brute_force_enumeration():
    kl = eqx.filter_jit(panel_kl_divergence)
    do_a = jc.Intervention(targets=jnp.array([True, False]), states=jnp.array([1, 0]))
    for other, iv, state in [
        (OTHER, None, [0, 0]),
        (REVERSED, None, [1, 0]),
        (OTHER, do_a, [0, 1]),
    ]:
        got = kl(MODEL, other, jnp.asarray(state), jnp.asarray(TIMES), intervention=iv)
        expected = brute_force_panel_kl(MODEL, other, state, TIMES, iv)
        np.testing.assert_allclose(got, expected, rtol=1e-10)
    assert float(kl(MODEL, MODEL, jnp.array([0, 0]), jnp.asarray(TIMES))) == pytest.approx(0)
    # vmap over pairs of models and over time grids
    stacked = jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), MODEL, OTHER)
    both = jax.vmap(lambda m, t: kl(m, OTHER, jnp.array([0, 0]), t))(
        stacked, jnp.stack([jnp.asarray(TIMES), jnp.asarray(TIMES) * 2])
    )
    np.testing.assert_allclose(
        both,
        [brute_force_panel_kl(MODEL, OTHER, [0, 0], TIMES), 0.0],
        rtol=1e-10,
        atol=1e-14,
    )
    # three binary nodes, two visits: 64 outcome sequences
    three = jc.CTBN(
        cims=[jnp.full((1, 2, 2), 0.8), jnp.full((2, 2, 2), 1.1), jnp.full((2, 2, 2), 0.4)],
        parents=((), (0,), (1,)),
    )
    three = eqx.tree_at(lambda m: m.cims, three, tuple(_with_diag(c) for c in three.cims))
    other3 = eqx.tree_at(
        lambda m: m.cims, three, tuple(c * f for c, f in zip(three.cims, (1.5, 0.5, 2.0)))
    )
    np.testing.assert_allclose(
        kl(three, other3, jnp.array([0, 1, 0]), jnp.array([0.7, 1.9])),
        brute_force_panel_kl(three, other3, [0, 1, 0], np.array([0.7, 1.9])),
        rtol=1e-10,
    )


def _with_diag(c):
    k = c.shape[-1]
    off = jnp.where(jnp.eye(k, dtype=bool), 0, c)
    return off - jnp.eye(k) * off.sum(-1, keepdims=True)


def test_panel_kl_gradients_match_finite_differences():
    def f(scale_a, scale_b, times):
        other = eqx.tree_at(
            lambda m: m.cims, OTHER, (OTHER.cims[0] * scale_a, OTHER.cims[1] * scale_b)
        )
        return panel_kl_divergence(MODEL, other, jnp.array([0, 1]), times)

    x = (jnp.asarray(1.3), jnp.asarray(0.8), jnp.asarray(TIMES))
    grads = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(*x)
    f = jax.jit(f)
    eps = 1e-6
    for i in range(2):
        up = list(x)
        down = list(x)
        up[i] = x[i] + eps
        down[i] = x[i] - eps
        np.testing.assert_allclose(grads[i], (f(*up) - f(*down)) / (2 * eps), rtol=1e-6)
    for k in range(len(TIMES)):
        e = np.zeros(len(TIMES))
        e[k] = eps
        fd = (f(x[0], x[1], x[2] + e) - f(x[0], x[1], x[2] - e)) / (2 * eps)
        np.testing.assert_allclose(grads[2][k], fd, rtol=1e-6)


def test_data_processing_inequalities_over_random_networks():
    # same graph, random rates: the panel KL never exceeds the path KL over [0, t_K], adding a
    # visit never lowers it, and a dense grid of visits approaches the path KL
    rng = np.random.default_rng(0)
    pairs = 12
    rates = rng.uniform(0.1, 3.0, size=(2, pairs, 6))
    models = [
        jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *[_chain(r[:2], r[2:]) for r in rates[j]])
        for j in range(2)
    ]
    start = jnp.array([0, 0])
    horizon = 2.0
    coarse = jnp.array([0.5, 2.0])
    finer = jnp.array([0.5, 1.2, 2.0])
    dense = jnp.linspace(horizon / 400, horizon, 400)

    @jax.jit
    def kls(m, o):
        return (
            panel_kl_divergence(m, o, start, coarse),
            panel_kl_divergence(m, o, start, finer),
            panel_kl_divergence(m, o, start, dense),
            kl_divergence(m, o, start, horizon, solver=jc.MatrixExponential()),
        )

    coarse_kl, finer_kl, dense_kl, path_kl = (np.asarray(x) for x in jax.vmap(kls)(*models))
    assert np.all(coarse_kl <= finer_kl * (1 + 1e-12))
    assert np.all(finer_kl <= dense_kl * (1 + 1e-12))
    assert np.all(dense_kl <= path_kl * (1 + 1e-12))
    np.testing.assert_allclose(dense_kl, path_kl, rtol=0.03)
    assert np.all(coarse_kl < 0.9 * path_kl)  # a sparse panel reveals markedly less


def test_sampler_and_log_likelihood_follow_the_exact_law():
    times = jnp.asarray(TIMES[:2])
    state = jnp.array([1, 0])
    keys = jax.random.split(jax.random.key(0), 20_000)
    draws = jax.jit(jax.vmap(lambda k: sample_panel_outcome(MODEL, state, times, key=k)))(keys)
    W = brute_force_generator(MODEL)
    P1 = scipy.linalg.expm(TIMES[0] * W)
    P2 = scipy.linalg.expm((TIMES[1] - TIMES[0]) * W)
    s0 = 2  # (A, B) = (1, 0)
    exact = P1[s0][:, None] * P2  # p(y1, y2)
    counts = np.zeros((4, 4))
    np.add.at(counts, (np.asarray(draws[:, 0]), np.asarray(draws[:, 1])), 1)
    freq = counts / len(keys)
    se = np.sqrt(exact * (1 - exact) / len(keys))
    assert np.all(np.abs(freq - exact) <= 5 * se + 1e-12)
    log_lik = jax.jit(jax.vmap(lambda y: panel_outcome_log_likelihood(MODEL, state, times, y)))(
        jnp.asarray([[y1, y2] for y1 in range(4) for y2 in range(4)])
    )
    np.testing.assert_allclose(np.exp(log_lik), exact.reshape(-1), rtol=1e-10)


def test_bad_times_are_refused():
    with pytest.raises(ValueError, match="times: expected one or more observation times"):
        panel_kl_divergence(MODEL, OTHER, jnp.array([0, 0]), jnp.zeros((0,)))
    for bad in ([0.5, 0.5], [0.0, 1.0], [1.0, 0.5], [0.5, np.inf]):
        with pytest.raises(Exception, match="strictly increasing"):
            panel_kl_divergence(MODEL, OTHER, jnp.array([0, 0]), jnp.asarray(bad))


def test_pairwise_kl_by_one_matrix_product_equals_pair_by_pair():
    from jaxctbn._panel.outcome_law import pairwise_panel_law_kl, panel_law

    rng = np.random.default_rng(4)
    models = [_chain(rng.uniform(0.2, 2, 2), rng.uniform(0.2, 2, 4)) for _ in range(5)]
    do_b = jc.Intervention(targets=jnp.array([False, True]), states=jnp.array([0, 1]))
    for iv in (None, do_b):
        laws = [panel_law(m, jnp.array([0, 0]), jnp.asarray(TIMES), iv) for m in models]
        stack = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *laws)
        a = jax.tree_util.tree_map(lambda x: x[:3], stack)
        b = jax.tree_util.tree_map(lambda x: x[3:], stack)
        got = jax.jit(pairwise_panel_law_kl)(a, b)
        for i in range(3):
            for j in range(2):
                expected = brute_force_panel_kl(models[i], models[3 + j], [0, 0], TIMES, iv)
                np.testing.assert_allclose(got[i, j], expected, rtol=1e-10)


def test_equally_spaced_visits_share_one_exponential():
    # equal gaps (here to rounding: 3k/5) use one exponential and a first-order correction:
    # the same transition matrices and gradients in the times as one exponential per gap;
    # unequal gaps: the gap derivative W P_k equals the generic derivative of exp(h W), and so
    # does the derivative in the generator
    from jaxctbn._master_equation.dense_linalg import transition_matrices
    from jaxctbn._panel import outcome_law

    model = jc.paper_network(jax.random.key(0), rates="softmax")
    W = outcome_law.prepare_experiment(model, jnp.zeros(4, jnp.int32), None)[1].dense()
    weights = jnp.arange(16.0)

    def loss(times, shared):
        gaps = jnp.diff(times, prepend=0.0)
        if shared:
            P = outcome_law._gap_transition_matrices(W, gaps)
        else:
            P = transition_matrices(gaps[:, None, None] * W)
        return (P**2 * weights).sum(), P

    for times in (3.0 * jnp.arange(1, 6) / 5, jnp.array([0.5, 2.0, 3.0])):
        (value, P), grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)(
            times, True
        )
        (value_ref, P_ref), grad_ref = jax.value_and_grad(loss, has_aux=True)(times, False)
        np.testing.assert_allclose(P, P_ref, atol=1e-14)
        np.testing.assert_allclose(grad, grad_ref, rtol=1e-10, atol=1e-11)

    def in_generator(W, separate):
        gaps = jnp.array([0.5, 1.5, 1.0])
        if separate:
            P = outcome_law.gap_transition_matrices(W, gaps)
        else:
            P = transition_matrices(gaps[:, None, None] * W)
        return (P**2 * weights).sum()

    np.testing.assert_allclose(
        jax.grad(in_generator)(W, True), jax.grad(in_generator)(W, False), rtol=1e-10, atol=1e-12
    )
