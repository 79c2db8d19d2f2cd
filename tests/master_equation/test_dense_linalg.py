"""The dense matrix functions (`jaxctbn/_dense_linalg.py`): the batched linear solve and matrix
exponential against numpy/scipy, both solve routes (Gauss-Jordan for n <= 8, LAPACK one matrix
at a time above), and no batched LAPACK kernel in the compiled programs of the dense routes
(jaxlib 0.10's batched LAPACK kernels can deadlock XLA's CPU thread pool; see the module)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from helpers import brute_force_generator

import jaxctbn as jc
from jaxctbn._master_equation import dense_linalg
from jaxctbn._master_equation.dense_linalg import (
    expm,
    expm_batched,
    gap_transition_matrices,
    matmul,
    matrix_vector,
    short_sum,
    solve_batched,
    vector_matrix,
)
from jaxctbn._master_equation.generator import amalgamate
from jaxctbn._panel.fit import _fit
from jaxctbn._panel.gap_groups import gap_groups


@pytest.mark.parametrize("n", [1, 3, 4, 5, 16, 17])
def test_unrolled_contractions_match_numpy(n):
    """`short_sum`, `vector_matrix`, `matrix_vector` and `matmul` (unrolled for short axes,
    `jnp` above) against numpy, under `jit` and `vmap`, and their gradients against `jnp`'s."""
    rng = np.random.default_rng(n)
    x = rng.normal(size=(3, n, 2))
    v, u, M = rng.normal(size=n), rng.normal(size=4), rng.normal(size=(n, 4))
    A, B = rng.normal(size=(5, 4, n)), rng.normal(size=(5, n, 3))

    @jax.jit
    def values_and_gradients(x, v, u, M, A, B):  # one compiled program per n
        values = (
            short_sum(x, 1),
            vector_matrix(v, M),
            matrix_vector(M.T, v),
            matmul(A, B),
            jax.vmap(vector_matrix)(jnp.stack([v, 2 * v]), jnp.stack([M, M])),
        )
        # gradients (the custom VJPs of the vector products) against jnp's matmul
        pairs = [
            (
                jax.grad(lambda v, M: jnp.sum(jnp.sin(vector_matrix(v, M))), (0, 1))(v, M),
                jax.grad(lambda v, M: jnp.sum(jnp.sin(v @ M)), (0, 1))(v, M),
            ),
            (
                jax.grad(lambda M, u: jnp.sum(jnp.cos(matrix_vector(M, u))), (0, 1))(M, u),
                jax.grad(lambda M, u: jnp.sum(jnp.cos(M @ u)), (0, 1))(M, u),
            ),
            (
                jax.grad(lambda A, B: jnp.sum(matmul(A, B) ** 2), (0, 1))(A, B),
                jax.grad(lambda A, B: jnp.sum((A @ B) ** 2), (0, 1))(A, B),
            ),
        ]
        return values, pairs

    values, pairs = values_and_gradients(x, v, u, M, A, B)
    summed, vM, Mv, AB, batched = values
    np.testing.assert_allclose(summed, x.sum(1), rtol=1e-13)
    np.testing.assert_allclose(vM, v @ M, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(Mv, M.T @ v, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(AB, A @ B, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(batched, np.stack([v @ M, 2 * v @ M]), rtol=1e-12, atol=1e-14)
    for (ours, theirs), atol in zip(pairs, (1e-14, 1e-14, 1e-13)):
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=atol)


def batched_lapack_calls(hlo: str) -> list[str]:
    """The LAPACK custom calls of an optimised HLO module whose first operand has batch axes
    (rank > 2): each a `target shape` string."""
    calls = []
    for line in hlo.splitlines():
        target = re.search(r'custom_call_target="(lapack_\w+)"', line)
        if target is None:
            continue
        operand = re.search(r"operand_layout_constraints=\{(\w+)\[([\d,]*)\]", line)
        assert operand is not None, line
        if len(operand.group(2).split(",")) > 2:
            calls.append(f"{target.group(1)} {operand.group(1)}[{operand.group(2)}]")
    return calls


def batched_lapack_calls_lowered(text: str) -> list[str]:
    """As `batched_lapack_calls`, from a lowered (StableHLO) module: XLA adds no LAPACK call
    when it compiles, so the lowered program has every call the compiled one has (and costs
    no compilation)."""
    calls = []
    for line in text.splitlines():
        target = re.search(r"custom_call @(lapack_\w+)\(", line)
        if target is None:
            continue
        operand = re.search(r":\s*\(tensor<([\dx]+)x(\w+)>", line)
        assert operand is not None, line
        if len(operand.group(1).split("x")) > 2:
            calls.append(f"{target.group(1)} {operand.group(2)}[{operand.group(1)}]")
    return calls


def _compiled(fn, *args) -> str:
    return _compile(fn, *args)[0]


def _compile(fn, *args):
    """The optimised HLO text of `jax.jit(fn)` for `args`, and the compiled program."""
    compiled = jax.jit(fn).lower(*args).compile()
    text = compiled.as_text()
    assert text is not None
    return text, compiled


def test_the_check_finds_batched_lapack():
    # the check can fail: jnp.linalg.solve on a batch calls batched getrf/trsm
    M = jnp.asarray(np.random.default_rng(0).normal(size=(3, 12, 12)))
    assert batched_lapack_calls(_compiled(jnp.linalg.solve, M, M))


# n = 1 and 8: the smallest and largest order of the elimination route, 9: LAPACK
@pytest.mark.parametrize("n", [1, 8, 9])
@pytest.mark.parametrize("batch", [(), (5,), (2, 3)], ids=["single", "batch", "batch2d"])
def test_solve_matches_numpy(n, batch):
    rng = np.random.default_rng(n)
    M = rng.normal(size=batch + (n, n)) + 3 * np.eye(n)
    B = rng.normal(size=batch + (n, 4))
    ref = np.linalg.solve(M, B)
    out = np.asarray(jax.jit(solve_batched)(jnp.asarray(M), jnp.asarray(B)))
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n", [4, 12])
def test_solve_under_vmap_stays_one_matrix_at_a_time(n):
    rng = np.random.default_rng(1)
    M = jnp.asarray(rng.normal(size=(2, 3, n, n)) + 3 * np.eye(n))
    B = jnp.asarray(rng.normal(size=(2, 3, n, n)))
    twice = jax.vmap(jax.vmap(solve_batched))
    np.testing.assert_allclose(twice(M, B), np.linalg.solve(M, B), rtol=1e-10, atol=1e-12)
    assert batched_lapack_calls(_compiled(twice, M, B)) == []


def test_pivoting_handles_a_zero_leading_entry():
    # without pivoting the first step would divide by 0
    M = np.array([[0.0, 1.0, 2.0], [1.0, 0.0, 3.0], [4.0, -3.0, 8.0]])
    B = np.eye(3)
    np.testing.assert_allclose(solve_batched(jnp.asarray(M), jnp.asarray(B)), np.linalg.inv(M))


def test_singular_system_is_not_finite():
    # the caller's check (MatrixExponential._checked) relies on it
    M = jnp.ones((3, 3))
    assert not np.all(np.isfinite(np.asarray(solve_batched(M, jnp.eye(3)))))


def _generators(n, scales, rng):
    """Generators (rows sum to 0) of 1-norm `scales`, shape (len(scales), n, n)."""
    A = rng.uniform(0.1, 1.0, size=(len(scales), n, n)) * (1 - np.eye(n))
    A = A - A.sum(-1)[..., None] * np.eye(n)
    return A * np.asarray(scales)[:, None, None] / np.abs(A).sum(-2).max(-1)[:, None, None]


@pytest.mark.parametrize("n", [4, 12], ids=["elimination", "lapack"])
def test_batched_expm_and_its_gradient_match_scipy(n):
    # against scipy's expm, and the custom reverse-mode derivative against scipy's Frechet
    # derivative, over generators of 1-norm 1e-3..1e4
    rng = np.random.default_rng(0)
    A = _generators(n, [1e-3, 0.5, 7.0, 60.0, 1e4], rng)
    G = rng.normal(size=A.shape)

    @jax.jit
    def value_and_gradient(A):
        return expm_batched(A), jax.grad(lambda x: jnp.sum(G * expm_batched(x)))(A)

    out, grad = (np.asarray(a) for a in value_and_gradient(jnp.asarray(A)))
    for a, e in zip(A, out):
        ref = scipy.linalg.expm(a)
        np.testing.assert_allclose(e, ref, rtol=1e-9, atol=1e-12 * np.abs(ref).max())
    for a, g, gbar in zip(A[:4], G[:4], grad[:4]):
        E = rng.normal(size=a.shape)
        directional = np.sum(g * scipy.linalg.expm_frechet(a, E, compute_expm=False))
        np.testing.assert_allclose(np.sum(gbar * E), directional, rtol=1e-8)


@pytest.mark.parametrize("n", [4, 9])
def test_gap_tables_by_the_shared_series_match_scipy(n):
    """`gap_transition_matrices` over many gaps: the uniformisation series over shared powers
    (every gap within its mean-jump bound) and the per-gap exponentials (one gap beyond it)
    against scipy's `expm`; the derivatives in the generator against scipy's Frechet derivative
    and in the gaps against $WP_k$, under `jit`; second derivatives (reverse over reverse, as
    the observed information of a fit takes them) against central differences of the first."""
    from scipy.stats import poisson

    # the bound: Poisson(_SERIES_MAX_MEAN) leaves less than 1e-17 beyond the series' terms
    assert poisson.sf(dense_linalg._SERIES_TERMS - 1, dense_linalg._SERIES_MAX_MEAN) < 1e-17
    rng = np.random.default_rng(n)
    W = _generators(n, [1.0], rng)[0]
    rate = np.max(-np.diag(W))
    covered = np.concatenate([[0.0], rng.uniform(0, dense_linalg._SERIES_MAX_MEAN / rate, 11)])
    beyond = covered.copy()
    beyond[3] = 3 * dense_linalg._SERIES_MAX_MEAN / rate
    G = rng.normal(size=(covered.size, n, n))
    E = rng.normal(size=(n, n))
    assert bool(dense_linalg._series_covers(jnp.asarray(W), jnp.asarray(covered)))
    assert not bool(dense_linalg._series_covers(jnp.asarray(W), jnp.asarray(beyond)))

    @jax.jit
    def values_and_gradients(W, gaps):
        def loss(W, gaps):
            return jnp.sum(jnp.asarray(G) * gap_transition_matrices(W, gaps))

        d_W, d_gaps = jax.grad(loss, argnums=(0, 1))(W, gaps)
        # d/dt of <grad, E> at W + tE: a reverse-over-reverse directional second derivative
        second = jax.grad(lambda t: jnp.sum(jax.grad(loss)(W + t * E, gaps) * E))(0.0)
        return gap_transition_matrices(W, gaps), d_W, d_gaps, second

    for gaps in (covered, beyond):
        with jax.debug_nans(False):
            P, d_W, d_gaps, second = (
                np.asarray(a) for a in values_and_gradients(jnp.asarray(W), jnp.asarray(gaps))
            )
        for h, p, g, dg in zip(gaps, P, G, d_gaps):
            ref = scipy.linalg.expm(h * W)
            np.testing.assert_allclose(p, ref, rtol=1e-10, atol=1e-15)
            np.testing.assert_allclose(dg, np.sum(g * (W @ ref)), rtol=1e-9, atol=1e-12)
        frechet = sum(
            np.sum(g * scipy.linalg.expm_frechet(h * W, h * E, compute_expm=False))
            for h, g in zip(gaps, G)
        )
        np.testing.assert_allclose(np.sum(d_W * E), frechet, rtol=1e-9)

        def directional(t, gaps=gaps):
            return sum(
                np.sum(g * scipy.linalg.expm_frechet(h * (W + t * E), h * E, compute_expm=False))
                for h, g in zip(gaps, G)
            )

        step = 1e-5
        numeric = (directional(step) - directional(-step)) / (2 * step)
        np.testing.assert_allclose(second, numeric, rtol=1e-6)


def test_gap_tables_twice_differentiated_by_one_route():
    """Under `gap_tables_twice_differentiated` (the observed information of a panel fit), the
    gap tables' derivative rule takes one route for every gap (the squared series, its
    squarings skipped where no gap needs one): reverse-over-reverse second derivatives of one
    generator and of a stack, for gaps the shared series covers and beyond it, against central
    differences of scipy's Frechet derivative (the usual rule's first derivatives are checked
    against it above), and a program of fewer operations than the usual rule's `lax.cond`
    between the two series."""
    rng = np.random.default_rng(11)
    stack = np.stack([_generators(4, [1.0], rng)[0] * c for c in (1.0, 1.7)])
    rate = float(np.max(-np.diagonal(stack, axis1=1, axis2=2)))
    covered = np.sort(rng.uniform(0, dense_linalg._SERIES_MAX_MEAN / rate, 10))
    beyond = covered.copy()
    beyond[-1] = 5 * dense_linalg._SERIES_MAX_MEAN / rate  # two halvings
    G = rng.normal(size=(2, covered.size, 4, 4))
    E = rng.normal(size=(2, 4, 4))

    def second(W, gaps, G, E):
        def loss(W):
            return jnp.sum(G * gap_transition_matrices(W, gaps))

        # d/dt of <grad, E> at W + tE (reverse over reverse)
        return jax.grad(lambda t: jnp.sum(jax.grad(loss)(W + t * E) * E))(0.0)

    def one_route(*args):
        with dense_linalg.gap_tables_twice_differentiated():
            return second(*args)

    def numeric(W, gaps, G, E, step=1e-5):
        def directional(t):
            return sum(
                np.sum(g * scipy.linalg.expm_frechet(h * (W + t * E), h * E, compute_expm=False))
                for h, g in zip(gaps, G)
            )

        return (directional(step) - directional(-step)) / (2 * step)

    for gaps in (covered, beyond):
        for W, g, e in ((stack[0], G[0], E[0]), (stack, G, E)):
            args = tuple(jnp.asarray(a) for a in (W, gaps, g, e))
            if W.ndim == 2:
                reference = numeric(W, gaps, g, e)
            else:
                reference = sum(numeric(W[c], gaps, g[c], e[c]) for c in range(2))
            np.testing.assert_allclose(jax.jit(one_route)(*args), reference, rtol=1e-6)
    usual = jax.make_jaxpr(second)(*args)
    one = jax.make_jaxpr(one_route)(*args)
    assert _operations(one) < 0.9 * _operations(usual)


def _operations(jaxpr) -> int:
    """The operations of `jaxpr`, those of the jaxprs inside its operations included."""
    from jax._src import core

    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    return sum(
        1 + sum(_operations(sub) for sub in core.jaxprs_in_params(e.params)) for e in jaxpr.eqns
    )


def test_gap_tables_of_a_stack_of_generators_are_each_generators_table():
    """A stack of generators `(C, S, S)` (the covariate classes of a panel fit): one branch for
    all (series or per-gap exponentials, by the largest exit rate of any), each table and the
    derivatives in every generator and in the gaps those of the one-generator calls."""
    rng = np.random.default_rng(3)
    stack = jnp.asarray(np.stack([_generators(4, [1.0], rng)[0] * c for c in (1.0, 2.5)]))
    rate = float(np.max(-np.diagonal(np.asarray(stack), axis1=1, axis2=2)))
    G = rng.normal(size=(2, 12, 4, 4))
    # the second generator's rates push one gap beyond the series: every table exponentiated
    covered = np.sort(rng.uniform(0, dense_linalg._SERIES_MAX_MEAN / rate, 12))
    beyond = covered * 2.5 * rate / np.max(-np.diag(np.asarray(stack[0])))

    @jax.jit
    def stacked_and_each(stack, gaps):
        def loss(stack, gaps):
            return jnp.sum(jnp.asarray(G) * gap_transition_matrices(stack, gaps))

        def each(stack, gaps):
            return sum(
                jnp.sum(jnp.asarray(G[c]) * gap_transition_matrices(stack[c], gaps))
                for c in range(2)
            )

        return (
            (gap_transition_matrices(stack, gaps), jax.grad(loss, (0, 1))(stack, gaps)),
            (
                jnp.stack([gap_transition_matrices(W, gaps) for W in stack]),
                jax.grad(each, (0, 1))(stack, gaps),
            ),
        )

    for gaps, series in ((covered, True), (beyond, False)):
        assert bool(dense_linalg._series_covers(stack, jnp.asarray(gaps))) == series
        (P, (d_W, d_gaps)), (P_each, (d_W_each, d_gaps_each)) = stacked_and_each(
            stack, jnp.asarray(gaps)
        )
        assert P.shape == (2, 12, 4, 4)
        np.testing.assert_allclose(P, P_each, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(d_W, d_W_each, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(d_gaps, d_gaps_each, rtol=1e-10, atol=1e-13)


def test_expm_of_a_general_matrix_matches_scipy():
    # not only generators: mixed signs, a rotation block, the VJP's block form
    rng = np.random.default_rng(2)
    for n in (3, 10):
        a = rng.normal(size=(n, n)) * 2
        np.testing.assert_allclose(jax.jit(expm)(jnp.asarray(a)), scipy.linalg.expm(a), rtol=1e-11)


def test_matrix_exponential_solver_compiles_without_batched_lapack():
    # the dense solver under vmap (as the criteria call it), 3 binary nodes: 8 states, so the
    # moments' 16 x 16 blocks take the LAPACK route and the elimination route is checked below
    model = jc.CTBN(
        cims=[jnp.full((1, 2, 2), 0.7), jnp.full((2, 2, 2), 1.3), jnp.full((2, 2, 2), 0.4)],
        parents=((), (0,), (1,)),
    )
    generator = amalgamate(model)
    p0 = jnp.full((4, 8), 1 / 8)
    solver = jc.MatrixExponential()

    def moments(p0):
        return jax.vmap(lambda p: solver.solve(generator, p, jnp.asarray(1.5)))(p0)

    def smoothing(p0):
        return jax.vmap(
            lambda p: solver.forward_backward(generator, p, jnp.ones(8), jnp.asarray(1.5))
        )(p0)

    compiled = {}
    for fn in (moments, smoothing):
        text, compiled[fn] = _compile(fn, p0)
        assert batched_lapack_calls(text) == []
    # the same numbers as scipy's dense exponential (run by the program checked above)
    W = brute_force_generator(model)
    np.testing.assert_allclose(
        compiled[moments](p0)[0], p0 @ scipy.linalg.expm(1.5 * W), rtol=1e-12
    )


def test_panel_fit_compiles_without_batched_lapack():
    # the program that hung: a fit on a panel, 3 binary nodes (8 states): the exponentials of
    # the gaps take the elimination route, the 16 x 16 Van Loan blocks the LAPACK route; EM with
    # intervals grouped by length (eager data), L-BFGS with one interval at a time (traced data)
    rng = np.random.default_rng(3)
    model = jc.CTBN(
        cims=[jnp.full((1, 2, 2), 0.7), jnp.full((2, 2, 2), 1.1), jnp.full((2, 2, 2), 0.4)],
        parents=((), (0,), (1,)),
    )
    times = np.cumsum(rng.uniform(0.2, 1.0, size=(6, 4)), -1)
    obs = jc.panel.PanelObservations(times, rng.integers(0, 2, size=(6, 4, 3)))
    groups = gap_groups(obs)  # as fit_rates computes them eagerly
    no_prior = (jnp.ones(3), jnp.zeros(3), jnp.asarray(False))
    for method, route in ((jc.panel.EMFit(), groups), (jc.panel.GradientFit(), None)):
        lowered = _fit.lower(
            model, obs, method, no_prior, None, None, jc.MatrixExponential(), route, None
        )
        text = lowered.as_text()
        assert "lapack_dgetrf_ffi" in text  # the Van Loan blocks' LAPACK route is there
        assert batched_lapack_calls_lowered(text) == []
