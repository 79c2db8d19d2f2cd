"""Backward solves and forward-backward interval integrals of the master-equation solvers,
against an independent dense reference (scipy's expm of Van Loan's block matrix built from the
brute-force generator)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from helpers import brute_force_generator, random_model

import jaxctbn as jc

SOLVERS = [jc.Uniformisation(), jc.DiffraxSolver(), jc.MatrixExponential()]
SOLVER_IDS = ["uniformisation", "diffrax", "expm"]
RTOL = {jc.Uniformisation: 1e-8, jc.DiffraxSolver: 1e-6, jc.MatrixExponential: 1e-8}

# (cardinalities, parents, stiff): mixed cardinalities; "stiff" mixes rates 1e-2 and 1e2
CASES = {
    "mixed-cycle-stiff": ((2, 3, 2), ((2,), (0,), (1, 0)), True),
    "ternary-pair": ((3, 2), ((1,), (0,)), False),
}
TAU = 0.7


def _problem(key, case, beta_kind):
    cards, parents, stiff = CASES[case]
    k1, k2, k3 = jax.random.split(key, 3)
    model = random_model(k1, cards, parents, stiff=stiff)
    S = model.num_global_states
    alpha = np.asarray(jax.random.dirichlet(k2, jnp.ones(S)))
    if beta_kind == "random":
        beta = np.asarray(jax.random.uniform(k3, (S,), minval=0.05, maxval=1.0))
    else:  # an observation: node 0 seen in state 1, the other nodes unobserved
        states = np.array(list(itertools.product(*(range(k) for k in cards))))
        beta = (states[:, 0] == 1).astype(float)
    return model, alpha, beta


def _reference(model, alpha, beta, tau):
    """Independent dense reference: (beta_0, int beta, dwell, flux)."""
    W = brute_force_generator(model)
    S = W.shape[0]
    Z = np.zeros((S, S))
    # column form of the backward equation: d/ds [g; I] = [[W, 0], [I, 0]] [g; I]
    z = scipy.linalg.expm(tau * np.block([[W, Z], [np.eye(S), Z]])) @ np.concatenate(
        [beta, np.zeros(S)]
    )
    # Van Loan: upper-right block of exp(tau [[W^T, a b^T], [0, W^T]]) = int alpha_t^T beta_t^T
    C = scipy.linalg.expm(tau * np.block([[W.T, np.outer(alpha, beta)], [Z, W.T]]))[:S, S:]
    cards = model.cardinalities
    states = list(itertools.product(*(range(k) for k in cards)))
    index = {s: i for i, s in enumerate(states)}
    shifts = [(n, j) for n, k in enumerate(cards) for j in range(1, k)]
    flux = np.zeros((len(shifts), S))
    for r, (n, j) in enumerate(shifts):
        for i, s in enumerate(states):
            t = list(s)
            t[n] = (s[n] + j) % cards[n]
            flux[r, i] = C[i, index[tuple(t)]]
    return z[:S], z[S:], np.diag(C).copy(), flux, shifts


def _rel_err(x, ref):
    x, ref = np.asarray(x), np.asarray(ref)
    scale = np.maximum(np.abs(ref), 1e-12 * np.abs(ref).max())
    return float(np.max(np.abs(x - ref) / scale))


@pytest.mark.parametrize("beta_kind", ["random", "indicator"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("solver", SOLVERS, ids=SOLVER_IDS)
def test_backward_and_forward_backward_match_van_loan(solver, case, beta_kind, getkey):
    rtol = RTOL[type(solver)]
    model, alpha, beta = _problem(getkey(), case, beta_kind)
    gen = jc.amalgamate(model)
    beta0_ref, ibeta_ref, dwell_ref, flux_ref, shifts = _reference(model, alpha, beta, TAU)
    assert list(gen.shifts) == shifts

    beta0, ibeta = jax.jit(solver.solve_backward)(gen, jnp.asarray(beta), TAU)
    dwell, flux = jax.jit(solver.forward_backward)(gen, jnp.asarray(alpha), jnp.asarray(beta), TAU)
    assert flux.shape == (len(shifts), model.num_global_states)
    for x, ref in [(beta0, beta0_ref), (ibeta, ibeta_ref), (dwell, dwell_ref), (flux, flux_ref)]:
        assert _rel_err(x, ref) <= rtol
    # alpha_t beta_t is constant in t, so sum(dwell) = tau * alpha_0 . beta_0
    Z = float(alpha @ np.asarray(beta0))
    assert abs(float(dwell.sum()) - TAU * Z) <= rtol * TAU * Z


@pytest.mark.parametrize("solver", SOLVERS, ids=SOLVER_IDS)
def test_backward_of_ones_is_ones(solver, getkey):
    model, _, _ = _problem(getkey(), "mixed-cycle-stiff", "random")
    gen = jc.amalgamate(model)
    ones = jnp.ones(model.num_global_states)
    beta0, ibeta = solver.solve_backward(gen, ones, horizon=1.3)
    np.testing.assert_allclose(beta0, 1.0, rtol=1e-9)
    np.testing.assert_allclose(ibeta, 1.3, rtol=1e-9)


def test_forward_backward_without_evidence_is_the_forward_solve(getkey):
    # beta_tau = 1: beta_t = 1, so dwell = flux[r] = int alpha_t dt for every shift r
    model, alpha, _ = _problem(getkey(), "ternary-pair", "random")
    gen = jc.amalgamate(model)
    solver = jc.Uniformisation()
    alpha = jnp.asarray(alpha)
    _, integral = solver.solve(gen, alpha, horizon=TAU)
    dwell, flux = solver.forward_backward(gen, alpha, jnp.ones_like(alpha), horizon=TAU)
    np.testing.assert_allclose(dwell, integral, rtol=1e-11)
    np.testing.assert_allclose(flux, jnp.broadcast_to(integral, flux.shape), rtol=1e-11)


@pytest.mark.parametrize("solver", SOLVERS, ids=SOLVER_IDS)
def test_jit_vmap_over_beta_and_backward_batch(solver, getkey):
    cards, parents, _ = CASES["ternary-pair"]
    model, alpha, _ = _problem(getkey(), "ternary-pair", "random")
    gen = jc.amalgamate(model)
    S = model.num_global_states
    betas = jax.random.uniform(getkey(), (3, S))
    alpha = jnp.asarray(alpha)

    run = jax.jit(jax.vmap(lambda b: solver.forward_backward(gen, alpha, b, TAU)))
    dwell, flux = run(betas)
    back = jax.jit(jax.vmap(lambda b: solver.solve_backward(gen, b, TAU)))(betas)
    single_fb = jax.jit(solver.forward_backward)  # one compilation for all single calls
    single_back = jax.jit(solver.solve_backward)
    for i in range(3):
        d, f = single_fb(gen, alpha, betas[i], TAU)
        np.testing.assert_allclose(dwell[i], d, rtol=1e-9)
        np.testing.assert_allclose(flux[i], f, rtol=1e-9)
        b0, _ = single_back(gen, betas[i], TAU)
        np.testing.assert_allclose(back[0][i], b0, rtol=1e-9)

    # a batch of generators: the batched backward solve agrees with the single solves
    models = jax.vmap(lambda k: random_model(k, cards, parents))(jax.random.split(getkey(), 3))
    gens = jax.vmap(jc.amalgamate)(models)
    b0s, ibs = jax.jit(solver.solve_backward_batch)(gens, betas, TAU)
    for i in range(3):
        g = jax.tree_util.tree_map(lambda x: x[i], gens)
        b0, ib = single_back(g, betas[i], TAU)
        np.testing.assert_allclose(b0s[i], b0, rtol=1e-9)
        np.testing.assert_allclose(ibs[i], ib, rtol=1e-9)


def test_grad_of_smoothed_statistics_matches_finite_differences(getkey):
    cards, parents, _ = CASES["mixed-cycle-stiff"]
    model, alpha, beta = _problem(getkey(), "mixed-cycle-stiff", "indicator")
    alpha, beta = jnp.asarray(alpha), jnp.asarray(beta)
    weights = jax.random.normal(getkey(), (model.num_global_states,))

    def loss(cims, solver=SOLVERS[0]):
        gen = jc.amalgamate(jc.CTBN(cims=cims, parents=parents))
        beta0, _ = solver.solve_backward(gen, beta, TAU)
        Z = alpha @ beta0
        dwell, flux = solver.forward_backward(gen, alpha, beta, TAU)
        transitions = sum(gen.shift_rates(r) * flux[r] for r in range(len(gen.shifts)))
        return ((dwell * weights).sum() + transitions.sum()) / Z

    direction = [
        jax.random.normal(getkey(), c.shape) * (1 - jnp.eye(c.shape[-1])) for c in model.cims
    ]
    grads = jax.jit(jax.grad(loss))(model.cims)
    ad = float(sum((g * d).sum() for g, d in zip(grads, direction)))
    # central difference; eps balances truncation (eps^2) and rounding (1e-16 / eps) errors
    eps = 1e-5
    plus = loss([c + eps * d for c, d in zip(model.cims, direction)])
    minus = loss([c - eps * d for c, d in zip(model.cims, direction)])
    fd = float((plus - minus) / (2 * eps))
    assert abs(ad - fd) < 1e-7 * max(1.0, abs(fd))
    # and the reverse-mode derivative of the dense Van Loan route
    dense = jax.grad(lambda c: loss(c, jc.MatrixExponential()))(model.cims)
    ad_dense = float(sum((g * d).sum() for g, d in zip(dense, direction)))
    assert abs(ad - ad_dense) < 1e-10 * max(1.0, abs(ad_dense))


def test_forward_backward_buffer_too_small_is_an_error(getkey):
    model = random_model(getkey(), (2, 2), ((), (0,)), scale=100.0)
    gen = jc.amalgamate(model)
    p = jnp.full(4, 0.25)
    with pytest.raises(Exception, match="fb_max_terms"):
        jax.jit(jc.Uniformisation(fb_max_terms=16).forward_backward)(gen, p, jnp.ones(4), 5.0)[
            0
        ].block_until_ready()


def test_diffrax_dense_backward_step_limit_is_an_error(getkey):
    gen = jc.amalgamate(random_model(getkey(), (2, 3), ((1,), (0,))))
    p = jnp.full(6, 1 / 6)
    with pytest.raises(Exception, match="maximum number of solver steps"):
        jax.jit(jc.DiffraxSolver(dense_max_steps=2).forward_backward)(gen, p, jnp.ones(6), 1.0)[
            0
        ].block_until_ready()
