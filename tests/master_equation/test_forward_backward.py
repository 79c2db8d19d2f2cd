"""Backward solves and forward-backward interval integrals of the master-equation solvers,
against an independent dense reference (scipy's expm of Van Loan's block matrix built from the
brute-force generator).

Compilation dominates these tests, so each solver compiles a handful of programs, shared by the
properties: one `jit(vmap)` program per problem shape serves three end conditions at once (a
random $\\beta_\\tau$, an observation indicator and $\\beta_\\tau = 1$), and the single-call and
batched programs are compared with it."""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from helpers import brute_force_generator, random_model

import jaxctbn as jc
from jaxctbn._master_equation.generator import amalgamate as _amalgamate

SOLVERS = [jc.Uniformisation(), jc.DiffraxSolver(), jc.MatrixExponential()]
SOLVER_IDS = ["uniformisation", "diffrax", "expm"]
RTOL = {jc.Uniformisation: 1e-8, jc.DiffraxSolver: 1e-6, jc.MatrixExponential: 1e-8}

# (cardinalities, parents, stiff): mixed cardinalities (a ternary node with a binary parent, a
# binary node with a ternary and a binary parent) in a cycle; "stiff" mixes rates 1e-2 and 1e2.
# The two cases have the same shapes, so they share every compiled program.
CASES = {
    "mixed-cycle-stiff": ((2, 3, 2), ((2,), (0,), (1, 0)), True),
    "mixed-cycle": ((2, 3, 2), ((2,), (0,), (1, 0)), False),
}
TAU = 0.7
BETA_KINDS = ("random", "indicator", "ones")

amalgamate = eqx.filter_jit(_amalgamate)  # one program per model shape (eagerly: dozens)


def _both(solver, gen, alpha, beta, tau):
    return solver.solve_backward(gen, beta, tau), solver.forward_backward(gen, alpha, beta, tau)


_single = eqx.filter_jit(_both)
# over end conditions (rows of beta)
_batched = eqx.filter_jit(eqx.filter_vmap(_both, in_axes=(None, None, None, 0, None)))


def _problem(seed, case):
    """A random model of `case`, a random initial row vector and the three end conditions
    (rows of `betas`): random in [0.05, 1], an observation (node 0 seen in state 1, the other
    nodes unobserved) and all ones (no evidence). The vectors are drawn by numpy (the
    Dirichlet draw alone compiles for seconds in JAX)."""
    cards, parents, stiff = CASES[case]
    model = random_model(jax.random.key(seed), cards, parents, stiff=stiff)
    S = model.num_global_states
    rng = np.random.default_rng(seed)
    alpha = rng.dirichlet(np.ones(S))
    states = np.array(list(itertools.product(*(range(k) for k in cards))))
    betas = np.stack([rng.uniform(0.05, 1.0, S), (states[:, 0] == 1).astype(float), np.ones(S)])
    return model, alpha, betas


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


@pytest.mark.parametrize("solver", SOLVERS, ids=SOLVER_IDS)
def test_backward_and_forward_backward_match_van_loan(solver):
    """Per solver, both cases (stiff and not) and the three end conditions, in one vmapped
    program: the backward solve
    $(\\beta_0, \\int\\beta)$ and the interval integrals (dwell, flux) against Van Loan; the
    conserved $\\alpha_t\\beta_t$ (sum(dwell) = tau alpha_0 . beta_0); with $\\beta_\\tau = 1$
    the backward solution is 1 and its integral tau."""
    rtol = RTOL[type(solver)]
    for seed, case in enumerate(CASES):
        model, alpha, betas = _problem(seed, case)
        gen = amalgamate(model)
        (beta0s, ibetas), (dwells, fluxes) = _batched(
            solver, gen, jnp.asarray(alpha), jnp.asarray(betas), TAU
        )
        for kind, beta, beta0, ibeta, dwell, flux in zip(
            BETA_KINDS, betas, beta0s, ibetas, dwells, fluxes
        ):
            beta0_ref, ibeta_ref, dwell_ref, flux_ref, shifts = _reference(model, alpha, beta, TAU)
            assert list(gen.shifts) == shifts
            assert flux.shape == (len(shifts), model.num_global_states)
            for x, ref in [
                (beta0, beta0_ref),
                (ibeta, ibeta_ref),
                (dwell, dwell_ref),
                (flux, flux_ref),
            ]:
                assert _rel_err(x, ref) <= rtol, (case, kind)
            # alpha_t beta_t is constant in t, so sum(dwell) = tau * alpha_0 . beta_0
            Z = float(alpha @ np.asarray(beta0))
            assert abs(float(dwell.sum()) - TAU * Z) <= rtol * TAU * Z, (case, kind)
        # the backward solution of beta = 1 is 1 at every time (W has zero row sums)
        np.testing.assert_allclose(beta0s[2], 1.0, rtol=1e-9)
        np.testing.assert_allclose(ibetas[2], TAU, rtol=1e-9)


@pytest.mark.parametrize("solver", SOLVERS, ids=SOLVER_IDS)
def test_jit_vmap_over_beta_and_backward_batch(solver):
    """The vmapped program (over end conditions) against single jitted calls, and the batched
    backward solve over a batch of generators against single solves."""
    model, alpha, betas = _problem(2, "mixed-cycle")
    gen = amalgamate(model)
    alpha, betas = jnp.asarray(alpha), jnp.asarray(betas)
    (beta0s, _), (dwell, flux) = _batched(solver, gen, alpha, betas, TAU)
    for i in range(len(betas)):
        (b0, _), (d, f) = _single(solver, gen, alpha, betas[i], TAU)
        np.testing.assert_allclose(dwell[i], d, rtol=1e-9)
        np.testing.assert_allclose(flux[i], f, rtol=1e-9)
        np.testing.assert_allclose(beta0s[i], b0, rtol=1e-9)

    # a batch of generators (three random models of this shape): the batched backward solve
    # agrees with the single solves
    gens = [amalgamate(_problem(seed, case)[0]) for seed, case in enumerate(CASES)]
    gens = jax.tree_util.tree_map(lambda *x: jnp.stack(x), gen, *gens)
    b0s, ibs = eqx.filter_jit(solver.solve_backward_batch)(gens, betas, jnp.asarray(TAU))
    for i in range(3):
        g = jax.tree_util.tree_map(lambda x: x[i], gens)
        (b0, ib), _ = _single(solver, g, alpha, betas[i], TAU)
        np.testing.assert_allclose(b0s[i], b0, rtol=1e-9)
        np.testing.assert_allclose(ibs[i], ib, rtol=1e-9)


def test_forward_backward_without_evidence_is_the_forward_solve():
    # beta_tau = 1: beta_t = 1, so dwell = flux[r] = int alpha_t dt for every shift r
    model, alpha, _ = _problem(1, "mixed-cycle")
    gen = amalgamate(model)
    solver = jc.Uniformisation()
    alpha = jnp.asarray(alpha)

    @jax.jit
    def both(gen, alpha):
        _, integral = solver.solve(gen, alpha, horizon=TAU)
        return integral, solver.forward_backward(gen, alpha, jnp.ones_like(alpha), horizon=TAU)

    integral, (dwell, flux) = both(gen, alpha)
    np.testing.assert_allclose(dwell, integral, rtol=1e-11)
    np.testing.assert_allclose(flux, jnp.broadcast_to(integral, flux.shape), rtol=1e-11)


def test_grad_of_smoothed_statistics_matches_finite_differences():
    """The reverse-mode derivative (uniformisation) of a smoothed statistic along a random
    direction against a central finite difference and against reverse mode through the dense
    Van Loan route; one compiled program for the three."""
    cards, parents, _ = CASES["mixed-cycle-stiff"]
    model, alpha, betas = _problem(0, "mixed-cycle-stiff")
    alpha, beta = jnp.asarray(alpha), jnp.asarray(betas[1])  # the observation indicator
    rng = np.random.default_rng(2)
    weights = rng.normal(size=model.num_global_states)

    def loss(cims, solver):
        gen = _amalgamate(jc.CTBN(cims=cims, parents=parents))
        beta0, _ = solver.solve_backward(gen, beta, TAU)
        Z = alpha @ beta0
        dwell, flux = solver.forward_backward(gen, alpha, beta, TAU)
        transitions = sum(gen.shift_rates(r) * flux[r] for r in range(len(gen.shifts)))
        return ((dwell * weights).sum() + transitions.sum()) / Z

    direction = [rng.normal(size=c.shape) * (1 - np.eye(c.shape[-1])) for c in model.cims]
    # central difference; eps balances truncation (eps^2) and rounding (1e-16 / eps) errors
    eps = 1e-5

    @jax.jit
    def derivatives(cims, direction):
        def along(g):
            return sum((a * d).sum() for a, d in zip(g, direction))

        ad = along(jax.grad(loss)(cims, SOLVERS[0]))
        shifted = jax.vmap(lambda e: loss([c + e * d for c, d in zip(cims, direction)], SOLVERS[0]))
        plus, minus = shifted(jnp.array([eps, -eps]))
        ad_dense = along(jax.grad(loss)(cims, jc.MatrixExponential()))
        return ad, (plus - minus) / (2 * eps), ad_dense

    ad, fd, ad_dense = (float(x) for x in derivatives(model.cims, direction))
    assert abs(ad - fd) < 1e-7 * max(1.0, abs(fd))
    # and the reverse-mode derivative of the dense Van Loan route
    assert abs(ad - ad_dense) < 1e-10 * max(1.0, abs(ad_dense))


def test_forward_backward_buffer_too_small_is_an_error(getkey):
    model = random_model(getkey(), (2, 2), ((), (0,)), scale=100.0)
    gen = amalgamate(model)
    p = jnp.full(4, 0.25)
    with pytest.raises(Exception, match="fb_max_terms"):
        jax.jit(jc.Uniformisation(fb_max_terms=16).forward_backward)(gen, p, jnp.ones(4), 5.0)[
            0
        ].block_until_ready()


def test_diffrax_dense_backward_step_limit_is_an_error():
    gen = amalgamate(_problem(1, "mixed-cycle")[0])
    p = jnp.full(12, 1 / 12)
    with pytest.raises(Exception, match="maximum number of solver steps"):
        jax.jit(jc.DiffraxSolver(dense_max_steps=2).forward_backward)(gen, p, jnp.ones(12), 1.0)[
            0
        ].block_until_ready()
