"""Fitting the rates of a fixed graph to panel data (`fit_rates`): EM against L-BFGS on the
log-rates, both against scipy's L-BFGS-B on an independent numpy likelihood (products of
scipy.linalg.expm of the dense generator, a forward algorithm where observations are
misclassified), on data simulated by a numpy Gillespie sampler.

Compiling a fit dominates the time, so every compiled fit is shared by several checks, with one
data set per model shape: a 2-node binary CTBN with some trajectories under do(A = 1) (pooling)
and some with rates scaled by imperfect interventions, a 3-state illness-death node with
structural zeros, misclassification and exact entry times, and a binary node for the boundary
cases, the fit under an outer `jit` and float32."""

import functools
import itertools
from typing import cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
import scipy.optimize
import scipy.special
from helpers import brute_force_generator, finite_difference_hessian

import jaxctbn as jc


# --------------------------------------------------------------------------- numpy references
def _gillespie_panel(W, start, grid, rng):
    """The global state of a path of the dense generator W at each time of `grid`."""
    s, t, out = start, grid[0], []
    for g in grid:
        while True:
            exit_rate = -W[s, s]
            wait = rng.exponential(1 / exit_rate) if exit_rate > 0 else np.inf
            if t + wait > g:
                # memoryless: the remaining wait after g is again exponential
                t = g
                break
            t += wait
            rates = np.where(np.arange(len(W)) == s, 0.0, W[s])
            s = int(rng.choice(len(W), p=rates / rates.sum()))
        out.append(s)
    return np.array(out)


def _dense_log_likelihood(generators, grids, paths):
    """sum_r sum_i log P_r(t_i - t_{i-1})[s_{i-1}, s_i], P = expm(W_r h) (complete
    observations; conditional on the first one); one expm per distinct (generator, gap)."""
    cache, total = {}, 0.0
    for W, grid, path in zip(generators, grids, paths):
        for h, a, b in zip(np.diff(grid), path[:-1], path[1:]):
            key = (id(W), float(h))
            if key not in cache:
                with np.errstate(divide="ignore"):  # log 0 off the structural zeros' reach
                    cache[key] = np.log(scipy.linalg.expm(W * h))
            total += cache[key][a, b]
    return total


def _log_gamma_prior(rates, alpha, beta):
    return np.sum((alpha - 1) * np.log(rates) - beta * rates + alpha * np.log(beta))


def _scipy_fit(objective, x0):
    """Maximise `objective(rates)` by L-BFGS-B on the log-rates (finite-difference gradient)."""
    result = scipy.optimize.minimize(
        lambda z: -objective(np.exp(z)),
        np.log(x0),
        method="L-BFGS-B",
        options=dict(ftol=1e-14, gtol=1e-9, maxiter=2000),
    )
    return np.exp(result.x), -result.fun


def _free_rates(model):
    """The off-diagonal rates of every node, flattened (nonzero ones only)."""
    out = []
    for c in model.cims:
        c = np.asarray(c)
        k = c.shape[-1]
        out.append(c[:, ~np.eye(k, dtype=bool)].ravel())
    return np.concatenate(out)


# --------------------------------------------------------------------------- 2-node data
PARENTS = ((), (0,))
TRUE = jc.CTBN(
    cims=[
        jnp.array([[[0.0, 0.8], [1.5, 0.0]]]),
        jnp.array([[[0.0, 0.5], [1.2, 0.0]], [[0.0, 2.0], [0.4, 0.0]]]),
    ],
    parents=PARENTS,
    names=("A", "B"),
)
START = jc.CTBN(cims=[jnp.ones((1, 2, 2)), jnp.ones((2, 2, 2))], parents=PARENTS, names=("A", "B"))
STATES = np.array(list(itertools.product(range(2), range(2))))
R, CLAMPED = 40, 10  # the last CLAMPED trajectories run under do(A = 1)
# imperfect interventions (per trajectory, per node): A's rates scaled by 3 in trajectories
# 20-24, B's by 0.5 in 25-29 (EM's M-step is then sum M / sum cT)
SCALES = np.ones((R, 2))
SCALES[20:25, 0] = 3.0
SCALES[25:30, 1] = 0.5
GRID = np.linspace(0.0, 4.0, 9)


def _two_node_generators(rates):
    """The dense generator of each trajectory (one object per distinct one, for the expm
    cache of `_dense_log_likelihood`)."""
    distinct = {}
    gens = []
    for r in range(R):
        key = (r >= R - CLAMPED, *SCALES[r])
        if key not in distinct:
            distinct[key] = _two_node_generator(rates, key[0], key[1:])
        gens.append(distinct[key])
    return gens


@functools.cache
def _two_node_data():
    rng = np.random.default_rng(0)
    targets = np.zeros((R, 2), bool)
    targets[R - CLAMPED :, 0] = True
    clamp = np.zeros((R, 2), np.int32)
    clamp[R - CLAMPED :, 0] = 1
    intervention = jc.Intervention(
        targets=jnp.asarray(targets), states=jnp.asarray(clamp)
    ).with_rate_scales([jnp.asarray(SCALES[:, 0]), jnp.asarray(SCALES[:, 1])])
    truth = _free_rates(TRUE)
    # the hand-written generator is the library's amalgamation
    np.testing.assert_allclose(_two_node_generator(truth, False), brute_force_generator(TRUE))
    paths = []
    for r, W in enumerate(_two_node_generators(truth)):
        clamped = r >= R - CLAMPED
        start = int(rng.integers(2)) + (2 if clamped else 2 * int(rng.integers(2)))
        paths.append(_gillespie_panel(W, start, GRID, rng))
    paths = np.array(paths)
    obs = jc.panel.PanelObservations(
        np.broadcast_to(GRID, (R, len(GRID))), STATES[paths], intervention=intervention
    )
    return obs, paths


def _two_node_generator(rates, clamped, scales=(1.0, 1.0)):
    """The dense generator over (A, B) in itertools.product order, written out by hand; under
    do(A = 1) A does not move; `scales` multiply A's and B's rates."""
    a01, a10, b01_0, b10_0, b01_1, b10_1 = rates
    c_a, c_b = scales
    Q = np.zeros((4, 4))
    if not clamped:
        Q[0, 2], Q[1, 3], Q[2, 0], Q[3, 1] = c_a * np.array([a01, a01, a10, a10])  # A moves
    Q[0, 1], Q[1, 0] = c_b * b01_0, c_b * b10_0  # B moves with A = 0
    Q[2, 3], Q[3, 2] = c_b * b01_1, c_b * b10_1  # B moves with A = 1
    return Q - np.diag(Q.sum(1))


def _two_node_objective(prior=None):
    """The numpy objective of the 6 rates (log-likelihood, + log Gamma prior density)."""
    _, paths = _two_node_data()

    def objective(rates):
        value = _dense_log_likelihood(_two_node_generators(rates), [GRID] * R, paths)
        if prior is not None:
            value += _log_gamma_prior(rates, *prior) - len(rates) * scipy.special.gammaln(prior[0])
        return value

    return objective


PRIOR = (20.0, 10.0)  # strong: mode (alpha - 1) / beta = 1.9


@functools.cache
def _two_node_fit(method_name, with_prior):
    obs, _ = _two_node_data()
    method = (
        jc.panel.EMFit(tolerance=1e-13, max_iterations=3000)
        if method_name == "em"
        else jc.panel.GradientFit(tolerance=1e-13)
    )
    prior = jc.GammaPrior(*PRIOR) if with_prior else None
    return jc.panel.fit_rates(START, obs, method=method, prior=prior)


@functools.cache
def _two_node_reference(with_prior):
    return _scipy_fit(_two_node_objective(PRIOR if with_prior else None), np.ones(6))


@pytest.mark.parametrize("with_prior", [False, True], ids=["ml", "map"])
def test_em_and_gradient_reach_the_scipy_optimum(with_prior):
    # pooling (a node learns nothing from the trajectories in which it is clamped) and
    # imperfect interventions (rates scaled per trajectory) in the same data; the prior is data
    # to the compiled fit, so both parameters share one program per method
    em, gradient = _two_node_fit("em", with_prior), _two_node_fit("gradient", with_prior)
    objective = _two_node_objective(PRIOR if with_prior else None)
    reference, best = _two_node_reference(with_prior)
    for fit in (em, gradient):
        assert bool(fit.converged), fit.method
        rates = _free_rates(fit.model)
        # the objective reported is the independent one at the fitted rates
        np.testing.assert_allclose(fit.log_posterior, objective(rates), rtol=1e-10)
        np.testing.assert_allclose(fit.log_posterior, best, rtol=1e-7)
        np.testing.assert_allclose(rates, reference, rtol=1e-3)
        assert not any(np.any(b) for b in fit.at_lower_bound + fit.at_upper_bound)
    np.testing.assert_allclose(em.log_posterior, gradient.log_posterior, rtol=1e-9)
    np.testing.assert_allclose(_free_rates(em.model), _free_rates(gradient.model), rtol=1e-3)
    if with_prior:
        # a prior term, not just the likelihood
        assert float(em.log_posterior) != pytest.approx(float(em.log_likelihood))
    else:
        assert float(em.log_posterior) == float(em.log_likelihood)
    print(
        f"prior={with_prior}: EM {int(em.iterations)} iterations, L-BFGS "
        f"{int(gradient.iterations)}; max rel. rate error vs scipy "
        f"{np.max(np.abs(_free_rates(em.model) / reference - 1)):.1e} (EM), "
        f"{np.max(np.abs(_free_rates(gradient.model) / reference - 1)):.1e} (L-BFGS)"
    )


@pytest.mark.parametrize("with_prior", [False, True], ids=["ml", "map"])
def test_em_objective_never_decreases(with_prior):
    fit = _two_node_fit("em", with_prior)
    trace = np.asarray(fit.trace)
    assert trace.shape == (3001,)
    steps = np.diff(trace)
    assert np.all(steps >= -1e-12 * (1 + np.abs(trace[1:]))), steps.min()
    assert trace[0] < trace[-1]
    # padded with the final value after the last iteration
    assert np.all(trace[int(fit.iterations) :] == trace[-1])
    np.testing.assert_allclose(trace[-1], fit.log_posterior, rtol=1e-12)


def test_strong_prior_pulls_towards_its_mode():
    ml = _free_rates(_two_node_fit("em", False).model)
    fit = _two_node_fit("em", True)
    mode = (PRIOR[0] - 1) / PRIOR[1]
    rates = _free_rates(fit.model)
    # (jointly: the rates are coupled through the panel likelihood, so not every one need
    # move towards the mode)
    assert np.abs(rates - mode).sum() < 0.7 * np.abs(ml - mode).sum()
    assert np.abs(rates - mode).max() < np.abs(ml - mode).max()


def test_squarem_default_reaches_the_optimum_where_em_stops_short():
    # at the default tolerance, plain EM meets its objective-change criterion while still
    # crawling (here about 1e-5 below the optimum, rates 1e-3 off); the default, SQUAREM,
    # also asks for a small projected gradient and reaches scipy's optimum, its objective
    # never decreasing
    obs, _ = _two_node_data()
    reference, best = _two_node_reference(False)
    fit = jc.panel.fit_rates(START, obs)
    # (max_iterations as in _two_node_fit: the same compiled program, the tolerance is data)
    em = jc.panel.fit_rates(START, obs, method=jc.panel.EMFit(max_iterations=3000))
    assert fit.method == "squarem" and bool(fit.converged) and bool(em.converged)
    assert best - float(fit.log_posterior) < 1e-7
    assert best - float(em.log_posterior) > 100 * (best - float(fit.log_posterior))
    np.testing.assert_allclose(_free_rates(fit.model), reference, rtol=2e-4)
    np.testing.assert_allclose(fit.log_posterior, _two_node_objective()(_free_rates(fit.model)))
    trace = np.asarray(fit.trace)[: int(fit.iterations) + 1]
    assert np.all(np.diff(trace) >= -1e-12 * (1 + np.abs(trace[1:])))
    assert int(fit.iterations) < int(em.iterations)


def test_the_fit_program_holds_one_forward_backward_pass():
    """EM and SQUAREM run one E-step per pass of one loop (the start's included), so that the
    fit's program holds the loops of a single E-step, of the filter that tries the pushed
    rates and the fit's own loop, and nothing more (lowered, not compiled: `stablehlo.while`
    counted in the program and in the E-step's and the filter's own programs)."""
    from jaxctbn._master_equation import MatrixExponential
    from jaxctbn._panel.fit import _fit
    from jaxctbn._panel.fit_arguments import checked_fit_arguments
    from jaxctbn._panel.fit_problem import fit_problem

    obs, _ = _two_node_data()
    solver = MatrixExponential()

    def loops(fn, *args):
        return eqx.filter_jit(fn).lower(*args).as_text().count("stablehlo.while")

    def problem(parameters, groups):
        return fit_problem(START, obs, parameters, None, None, solver, groups, None)

    for method in (jc.panel.SquaremFit(), jc.panel.EMFit()):
        parameters, groups, method = checked_fit_arguments(
            START, obs, method, None, None, solver, "fit_rates"
        )
        fit = loops(_fit, START, obs, method, parameters, None, None, solver, groups, None)
        if isinstance(method, jc.panel.SquaremFit):
            e_step = loops(
                lambda p, g: problem(p, g).e_step(problem(p, g).start()), parameters, groups
            )
            filtered = loops(
                lambda p, g: problem(p, g).log_likelihood(problem(p, g).start()), parameters, groups
            )
            assert e_step > 0 and filtered > 0
        assert fit == e_step + filtered + 1, (type(method).__name__, fit, e_step, filtered)


# --------------------------------------------------------------------------- illness-death
ILLNESS = np.array([[0.0, 0.5, 0.2], [0.3, 0.0, 0.6], [0.0, 0.0, 0.0]])  # state 2 absorbing
# visits every half time unit (with yearly visits and exact entry times the direct rate 0 -> 2
# is not identified: its maximum-likelihood value is 0, at the boundary)
ILLNESS_GRID = np.arange(0.0, 6.0, 0.5)


@functools.cache
def _illness_data():
    rng = np.random.default_rng(1)
    W = ILLNESS - np.diag(ILLNESS.sum(1))
    grid = ILLNESS_GRID
    paths = np.array([_gillespie_panel(W, int(rng.integers(2)), grid, rng) for _ in range(30)])
    return grid, paths


def _illness_start():
    # structural zeros: no way out of the absorbing state 2
    start = np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    return jc.CTBN(cims=[start[None]], parents=[()], names=("health",))


# states 0 and 1 misclassified (10%); state 2 always seen as itself
ILLNESS_EMISSIONS = np.array([[0.9, 0.1, 0.0], [0.1, 0.9, 0.0], [0.0, 0.0, 1.0]])
ILLNESS_EM = jc.panel.EMFit(tolerance=1e-11, max_iterations=2000)
ILLNESS_FREE = [(0, 1), (0, 2), (1, 0), (1, 2)]


def _entries(states):
    """Each first observation of the absorbing state 2 (after the first visit): taken as the
    exact entry time."""
    before = np.concatenate([np.zeros((len(states), 1), bool), states[:, :-1] != 2], axis=1)
    return (states == 2) & before


def _illness_observations(seen):
    return jc.panel.PanelObservations(
        np.broadcast_to(ILLNESS_GRID, seen.shape), seen[..., None], exact_entry=_entries(seen)
    )


@functools.cache
def _misclassified():
    """The illness-death panel as seen: states 0 and 1 flipped with probability 0.1."""
    _, paths = _illness_data()
    rng = np.random.default_rng(7)
    flip = (paths < 2) & (rng.random(paths.shape) < 0.1)
    seen = np.where(flip, 1 - paths, paths)
    assert _entries(seen).sum() >= 3 and flip.sum() >= 3
    return seen


def _hidden_log_likelihood(W, grid, seen, E):
    """sum_r log p(y_1, y_2, ... | y_0) by the scaled forward algorithm (numpy, dense
    scipy.linalg.expm): the hidden state starts uniform times the first observation's emission
    probabilities; an exact entry into the observed state y at t contributes the probability of
    being elsewhere just before t times the rate into y (no emission); other observations their
    emission probabilities."""
    entered = _entries(seen)
    P = {h: scipy.linalg.expm(W * h) for h in np.unique(np.diff(grid))}
    total = 0.0
    for y, exact in zip(seen, entered):
        a = E[:, y[0]] / E[:, y[0]].sum()
        for i in range(1, len(grid)):
            predicted = a @ P[grid[i] - grid[i - 1]]
            if exact[i]:
                into = np.arange(len(W)) == y[i]
                a = predicted @ (W * (~into)[:, None] * into[None, :])
            else:
                a = predicted * E[:, y[i]]
            total += np.log(a.sum())
            a = a / a.sum()
    return total


@functools.cache
def _illness_fits():
    obs = _illness_observations(_misclassified())
    emissions = jc.panel.Emissions([ILLNESS_EMISSIONS])
    return {
        name: jc.panel.fit_rates(_illness_start(), obs, method=method, emissions=emissions)
        for name, method in [
            ("em", ILLNESS_EM),
            ("gradient", jc.panel.GradientFit(tolerance=1e-11)),
        ]
    }


def _illness_objective(rates):
    """The numpy log-likelihood of the four free rates of the misclassified panel."""
    Q = np.zeros((3, 3))
    for (x, y), v in zip(ILLNESS_FREE, rates):
        Q[x, y] = v
    W = Q - np.diag(Q.sum(1))
    return _hidden_log_likelihood(W, ILLNESS_GRID, _misclassified(), ILLNESS_EMISSIONS)


def test_standard_errors_are_the_inverse_of_afinite_difference_hessian():
    # the exact observed information (autodiff, reverse over reverse through the filter with
    # intervals grouped by length, misclassification and exact entry times) against central
    # second differences of the independent numpy forward algorithm in the log-rates
    fit = _illness_fits()["gradient"]
    obs = _illness_observations(_misclassified())
    emissions = jc.panel.Emissions([ILLNESS_EMISSIONS])
    uncertainty = fit.uncertainty(obs, emissions=emissions)
    q = np.asarray(fit.model.cims[0][0])
    theta = np.log([q[x, y] for x, y in ILLNESS_FREE])
    H = finite_difference_hessian(lambda t: _illness_objective(np.exp(t)), theta)
    covariance = np.linalg.inv(-H)
    se_log = np.asarray(uncertainty.log_rate_standard_errors[0][0])
    expected = np.sqrt(np.diag(covariance))
    np.testing.assert_allclose([se_log[x, y] for x, y in ILLNESS_FREE], expected, rtol=1e-4)
    assert bool(uncertainty.positive_definite)
    # the full covariance, in the flattened (from, to) order of the off-diagonal entries
    order = [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
    index = [order.index(e) for e in ILLNESS_FREE]
    np.testing.assert_allclose(
        np.asarray(uncertainty.covariance)[np.ix_(index, index)], covariance, rtol=1e-3, atol=1e-8
    )
    # structural zeros: no uncertainty; intervals symmetric on the log scale around the rate
    assert se_log[2, 0] == 0 and se_log[2, 1] == 0
    lower, upper = np.asarray(uncertainty.lower[0][0]), np.asarray(uncertainty.upper[0][0])
    for x, y in ILLNESS_FREE:
        np.testing.assert_allclose(lower[x, y] * upper[x, y], q[x, y] ** 2, rtol=1e-12)
        np.testing.assert_allclose(np.log(upper[x, y] / q[x, y]), 1.959964 * se_log[x, y], 1e-6)
    np.testing.assert_allclose(
        np.asarray(uncertainty.standard_errors[0][0]), q * se_log, rtol=1e-12
    )
    # the rows of the information are computed for the 4 free rates only (the model's zeros are
    # concrete); with the model traced by an outer jit, every row: the same intervals
    traced = eqx.filter_jit(lambda m: m.uncertainty(obs, emissions=emissions))(fit)
    for got, want in zip(jax.tree_util.tree_leaves(traced), jax.tree_util.tree_leaves(uncertainty)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=0)


def test_a_rate_at_a_bound_is_not_estimated_and_the_other_has_its_closed_form_error():
    # never-left data: the exit rate of state 1 is at the lower bound (se infinite, interval
    # [0, inf)); the rate 0 -> 1 has the binomial closed form: 3 stays and 3 leaves over unit
    # gaps, so the information in lambda is 3 p / (1 - p)^2 = 6 at p = e^-lambda = 1/2, and in
    # log lambda (log 2)^2 6
    fit = _never_left_fit("squarem")
    obs = jc.panel.PanelObservations(TIMES, np.asarray(NEVER_LEFT)[..., None])
    uncertainty = fit.uncertainty(obs)
    se_log = np.asarray(uncertainty.log_rate_standard_errors[0][0])
    np.testing.assert_allclose(se_log[0, 1], 1 / (np.log(2) * np.sqrt(6)), rtol=1e-5)
    assert np.isinf(se_log[1, 0]) and np.isinf(np.asarray(uncertainty.standard_errors[0])[0, 1, 0])
    assert float(uncertainty.lower[0][0, 1, 0]) == 0 and np.isinf(uncertainty.upper[0][0, 1, 0])
    np.testing.assert_array_equal(uncertainty.estimated[0][0], [[False, True], [False, False]])
    assert bool(uncertainty.positive_definite)
    with pytest.raises(ValueError, match="level: expected a number in"):
        fit.uncertainty(obs, level=1.5)


def test_em_and_gradient_reach_the_scipy_optimum_with_misclassification_and_exact_entry():
    # the illness-death panel with states 0 and 1 misclassified and each first observation of
    # the absorbing state 2 taken as its exact entry time: the EM route (smoothed statistics,
    # including the recorded jump) and the gradient route (L-BFGS; its gradient is checked
    # against autodiff of the filter in test_fisher_gradient_equals_autodiff_of_the_filter)
    # reach scipy's optimum of the independent forward algorithm; the structural zeros of the
    # start (no way out of state 2) stay exactly zero
    seen = _misclassified()
    obs = _illness_observations(seen)
    emissions = jc.panel.Emissions([ILLNESS_EMISSIONS])
    fits = _illness_fits()
    objective = _illness_objective
    reference, best = _scipy_fit(objective, np.ones(4))
    for fit in fits.values():
        assert bool(fit.converged), fit.method
        q = np.asarray(fit.model.cims[0][0])
        assert q[2, 0] == 0.0 and q[2, 1] == 0.0 and q[2, 2] == 0.0
        assert not np.any(fit.at_lower_bound[0][0, 2]) and not np.any(fit.at_upper_bound[0][0, 2])
        rates = np.array([q[x, y] for x, y in ILLNESS_FREE])
        # the log-likelihood reported is the independent one at the fitted rates
        np.testing.assert_allclose(fit.log_likelihood, objective(rates), rtol=1e-10)
        np.testing.assert_allclose(fit.log_likelihood, best, rtol=1e-8)
        np.testing.assert_allclose(rates, reference, rtol=1e-3)
    em, gradient = fits["em"], fits["gradient"]
    np.testing.assert_allclose(em.log_likelihood, gradient.log_likelihood, rtol=1e-8)
    np.testing.assert_allclose(em.model.cims[0], gradient.model.cims[0], rtol=2e-3, atol=1e-6)
    # the reported log-likelihood is the library's own (per-interval route) at the fitted rates
    again = jc.panel.panel_log_likelihood(
        em.model, obs, emissions=emissions, solver=jc.MatrixExponential()
    )
    np.testing.assert_allclose(em.log_likelihood, again.sum(), rtol=1e-12)


def test_observation_impossible_under_structural_zeros_names_the_trajectory():
    # (the compiled programs of the test above)
    seen = _misclassified().copy()
    seen[3, 4:] = 2
    seen[3, 5] = 0  # leaves the absorbing state (at time 2.5)
    obs = _illness_observations(seen)
    emissions = jc.panel.Emissions([ILLNESS_EMISSIONS])
    with pytest.raises(ValueError, match=r"observations: trajectory 3 at time 2.5 .*impossible"):
        jc.panel.fit_rates(_illness_start(), obs, method=ILLNESS_EM, emissions=emissions)
    # the same message from the log-likelihood with the dense solver
    with pytest.raises(ValueError, match=r"observations: trajectory 3 at time 2.5 .*impossible"):
        jc.panel.panel_log_likelihood(
            _illness_start(), obs, emissions=emissions, solver=jc.MatrixExponential()
        )


# --------------------------------------------------------------------------- one binary node
BINARY = jc.CTBN(cims=[jnp.array([[[0.0, 1.0], [1.0, 0.0]]])], parents=[()])
TIMES = np.broadcast_to(np.arange(6.0), (4, 6))
NEVER_LEFT = [[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]]
ALTERNATING = [[0, 1, 0, 1, 0, 1], [1, 0, 1, 0, 1, 0]] * 2


@functools.cache
def _never_left_fit(method_name):
    obs = jc.panel.PanelObservations(TIMES, np.asarray(NEVER_LEFT)[..., None])
    methods = {"em": jc.panel.EMFit(), "gradient": jc.panel.GradientFit()}
    return jc.panel.fit_rates(BINARY, obs, method=methods.get(method_name, jc.panel.SquaremFit()))


@pytest.mark.parametrize(
    "method",
    [jc.panel.EMFit(), jc.panel.GradientFit(), jc.panel.SquaremFit()],
    ids=["em", "gradient", "squarem"],
)
def test_boundary_rates_are_flagged_and_finite(method):
    # state 1 is never left: its exit rate is driven to 0; 0 -> 1 has the closed form log 2
    # (the chance of staying in 0 over a gap is 1/2 in the data)
    fit = _never_left_fit(method.name)
    q = np.asarray(fit.model.cims[0][0])
    assert np.all(np.isfinite(q)) and np.isfinite(float(fit.log_likelihood))
    np.testing.assert_array_equal(fit.at_lower_bound[0][0], [[False, False], [True, False]])
    assert not np.any(fit.at_upper_bound[0])
    np.testing.assert_allclose(q[0, 1], np.log(2), rtol=1e-5)
    np.testing.assert_allclose(fit.log_likelihood, 6 * np.log(0.5), rtol=1e-7)
    # alternating data: consistent with instantaneous equilibration; the rates go to the top
    # of the box (1e8 / longest gap / one rate per state), and the log-likelihood to its
    # supremum 20 log(1/2)
    obs = jc.panel.PanelObservations(TIMES, np.asarray(ALTERNATING)[..., None])
    fit = jc.panel.fit_rates(BINARY, obs, method=method)
    q = np.asarray(fit.model.cims[0][0])
    assert np.all(np.isfinite(q)) and np.isfinite(float(fit.log_likelihood))
    np.testing.assert_array_equal(fit.at_upper_bound[0][0], [[False, True], [True, False]])
    assert not np.any(fit.at_lower_bound[0])
    np.testing.assert_allclose(q[[0, 1], [1, 0]], 1e8, rtol=1e-3)
    np.testing.assert_allclose(fit.log_likelihood, 20 * np.log(0.5), rtol=1e-7)


def test_under_jit_gives_the_same_fit():
    # eagerly the intervals are grouped by length (shared exponentials); under jit they cannot
    # be (traced times), so this also compares the two routes
    obs = jc.panel.PanelObservations(TIMES, np.asarray(NEVER_LEFT)[..., None])
    eager = _never_left_fit("em")
    jitted = eqx.filter_jit(jc.panel.fit_rates)(BINARY, obs, method=jc.panel.EMFit())
    np.testing.assert_allclose(jitted.log_posterior, eager.log_posterior, rtol=1e-12)
    np.testing.assert_allclose(jitted.model.cims[0], eager.model.cims[0], rtol=1e-9)
    np.testing.assert_array_equal(jitted.at_lower_bound[0], eager.at_lower_bound[0])
    np.testing.assert_allclose(jitted.trace, eager.trace, rtol=1e-12)
    assert int(jitted.iterations) == int(eager.iterations) and jitted.method == "em"


# --------------------------------------------------------------------------- bad input
def test_bad_input_names_the_argument(no_runtime_typecheck):
    obs = jc.panel.PanelObservations(TIMES, np.asarray(NEVER_LEFT)[..., None])
    with pytest.raises(ValueError, match="model: fit_rates needs a CTBN"):
        jc.panel.fit_rates(BINARY.padded(), obs)  # pyright: ignore
    with pytest.raises(ValueError, match="prior: fit_rates needs a GammaPrior"):
        jc.panel.fit_rates(BINARY, obs, prior=jc.NodelmanPrior())  # pyright: ignore
    with pytest.raises(ValueError, match="alpha"):
        jc.panel.fit_rates(BINARY, obs, prior=jc.GammaPrior(alpha=jnp.ones(3)))
    with pytest.raises(ValueError, match="observations: have 2 nodes, the model has 1"):
        jc.panel.fit_rates(BINARY, jc.panel.PanelObservations(TIMES, np.zeros((4, 6, 2), int)))
    with pytest.raises(ValueError, match="observations: expected a PanelObservations"):
        jc.panel.fit_rates(BINARY, TIMES)  # pyright: ignore
    with pytest.raises(ValueError, match=r"method: expected SquaremFit\(\), EMFit"):
        jc.panel.fit_rates(BINARY, obs, method=jc.LBFGS())  # pyright: ignore
    with pytest.raises(ValueError, match="states: trajectory 0 .* node 'X0'"):
        jc.panel.fit_rates(BINARY, jc.panel.PanelObservations(TIMES, np.full((4, 6, 1), 2)))
    negative = jc.CTBN(cims=[jnp.array([[[0.0, -1.0], [1.0, 0.0]]])], parents=[()])
    with pytest.raises(ValueError, match="model: the starting rates of node 'X0'"):
        jc.panel.fit_rates(negative, obs)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="max_iterations"):
            jc.panel.EMFit(max_iterations=bad)  # pyright: ignore
        with pytest.raises(ValueError, match="max_iterations"):
            jc.panel.GradientFit(max_iterations=bad)  # pyright: ignore
    for bad in (-1e-3, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="tolerance"):
            jc.panel.EMFit(tolerance=bad)
        with pytest.raises(ValueError, match="tolerance"):
            jc.panel.GradientFit(tolerance=bad)
    with pytest.raises(TypeError):
        jc.panel.EMFit(1e-6)  # keyword-only  # pyright: ignore


@eqx.filter_jit
def _fisher_and_autodiff(model, obs, prior, emissions, groups, factors):
    """GradientFit's objective and gradient (Fisher's identity) and reverse-mode autodiff of the
    filter, at the start's free rates times `factors`; one compiled program per problem."""
    from jaxctbn._panel.fit_problem import fit_problem as _problem

    N = model.num_nodes
    if prior is None:
        parameters = (jnp.ones(N), jnp.zeros(N), jnp.asarray(False))
    else:
        parameters = (jnp.full(N, prior[0]), jnp.full(N, prior[1]), jnp.asarray(True))
    problem = _problem(model, obs, parameters, emissions, None, jc.MatrixExponential(), groups)
    rates = tuple(jnp.where(f, q * c, 0) for q, f, c in zip(problem.start(), problem.free, factors))
    by_fisher = jax.value_and_grad(problem.objective_by_fisher)(rates)
    by_autodiff = jax.value_and_grad(problem.objective)(rates)
    return by_fisher, by_autodiff, problem.free


def test_fisher_gradient_equals_autodiff_of_the_filter():
    # GradientFit differentiates the objective by Fisher's identity (smoothed statistics of one
    # forward-backward pass); reverse-mode autodiff through the filter is the independent route.
    # Per free rate, at rates away from the optimum: perfect interventions (pooling) and
    # imperfect ones (rate scales) with a prior (the intervals solved one by one), and
    # misclassification with exact entry times (the intervals grouped by length)
    from jaxctbn._panel.gap_groups import gap_groups

    rng = np.random.default_rng(11)
    illness = _illness_observations(_misclassified())
    problems = [
        (START, _two_node_data()[0], PRIOR, None, None),
        (
            _illness_start(),
            illness,
            None,
            jc.panel.Emissions([ILLNESS_EMISSIONS]),
            gap_groups(illness),
        ),
    ]
    assert problems[1][-1] is not None
    for model, obs, prior, emissions, groups in problems:
        factors = tuple(rng.uniform(0.5, 2.0, c.shape) for c in model.cims)
        (fisher, ours), (value, autodiff), free = _fisher_and_autodiff(
            model, obs, prior, emissions, groups, factors
        )
        np.testing.assert_allclose(fisher, value, rtol=1e-13)
        for a, b, f in zip(ours, autodiff, free):
            assert np.any(np.asarray(f))
            np.testing.assert_allclose(
                np.asarray(a)[np.asarray(f)], np.asarray(b)[np.asarray(f)], rtol=1e-8, atol=1e-9
            )


@eqx.filter_jit
def _grouped_and_per_trajectory(model, obs, emissions, groups):
    """The pooled statistics and the per-trajectory log-likelihoods by the fit's grouped route,
    and the pooled statistics of the per-interval route (`panel_expected_statistics`)."""
    from jaxctbn._panel.gap_groups import pooled_by_gaps as _pooled_by_gaps

    reference = jc.panel.panel_expected_statistics(
        model, obs, emissions=emissions, solver=jc.MatrixExponential()
    ).sum()
    grouped = _pooled_by_gaps(model, obs, emissions, None, groups, "statistics")[1]
    per_trajectory = _pooled_by_gaps(model, obs, emissions, None, groups, "likelihood")[1]
    return reference, grouped, per_trajectory


def test_intervals_grouped_by_length_give_the_per_trajectory_statistics():
    # the fit's route (one exponential and one Van Loan block per distinct gap, summed rank-one
    # terms) against the per-interval route summed over trajectories: regular and irregular
    # gaps, padding, missing values, misclassification and exact entry times
    from jaxctbn._panel.gap_groups import gap_groups

    model = jc.CTBN(
        cims=[
            jnp.array([[[-0.5, 0.5], [0.7, -0.7]], [[-0.2, 0.2], [0.3, -0.3]]]),
            jnp.array([[[-1.0, 1.0], [0.1, -0.1]], [[-0.1, 0.1], [1.0, -1.0]]]),
        ],
        parents=((1,), (0,)),
    )
    rng = np.random.default_rng(5)
    R, K = 12, 6
    W = brute_force_generator(model)
    times = np.broadcast_to(np.arange(K, dtype=float), (R, K)).copy()
    times[: R // 2, 1:] += rng.uniform(0, 0.5, (R // 2, K - 1))  # half irregular
    global_states = np.array([_gillespie_panel(W, 0, t, rng) for t in times])
    states = np.stack([global_states // 2, global_states % 2], axis=-1)
    states = np.where(rng.random(states.shape) < 0.15, -1, states)
    states[:, 0] = [0, 0]
    exact = np.zeros((R, K), bool)
    exact[:3, 4] = True  # an entry into the observed configuration (sure to be possible)
    states[:3, 4] = [1, 1]
    states[:3, 3] = [0, 0]
    counts = [K] * 10 + [4, 3]
    with_entries = jc.panel.PanelObservations(
        times, states, num_observations=counts, exact_entry=exact
    )
    panel_only = jc.panel.PanelObservations(times, states, num_observations=counts)
    emissions = jc.panel.Emissions([np.array([[0.9, 0.1], [0.2, 0.8]]), None])
    # with exact entry times and emissions; without either (then the grouped filter leaves the
    # entry terms out, and every observation is exact)
    for obs, e in [(with_entries, emissions), (panel_only, None)]:
        groups = gap_groups(obs)
        assert groups is not None and 1 < groups.gaps.shape[0] < R * (K - 1)
        assert groups.exact_entries == (obs is with_entries)
        reference, grouped, per_trajectory = _grouped_and_per_trajectory(model, obs, e, groups)
        grouped = cast(jc.panel.PanelExpectedStatistics, grouped)
        np.testing.assert_allclose(grouped.dwell_times, reference.dwell_times, rtol=1e-10)
        np.testing.assert_allclose(
            grouped.transitions, reference.transitions, rtol=1e-9, atol=1e-12
        )
        np.testing.assert_allclose(grouped.log_likelihood, reference.log_likelihood, rtol=1e-12)
        assert per_trajectory.shape == (R,)
        np.testing.assert_allclose(per_trajectory.sum(), reference.log_likelihood, rtol=1e-12)


@functools.cache
def _binary_data():
    rng = np.random.default_rng(2)
    truth = np.array([[0.0, 0.7], [0.4, 0.0]])
    grid = np.arange(0.0, 8.0)
    W = truth - np.diag(truth.sum(1))
    paths = np.array([_gillespie_panel(W, int(rng.integers(2)), grid, rng) for _ in range(12)])
    return grid, paths


def test_float32_fits_reach_the_float64_optimum():
    # a binary node's panel in float32 (times, rates): both methods converge to the optimum of
    # the independent float64 objective, to float32 accuracy, with float32 results
    grid, paths = _binary_data()
    obs = jc.panel.PanelObservations(np.broadcast_to(grid, paths.shape), paths[..., None])
    obs32 = eqx.tree_at(lambda o: o.times, obs, jnp.asarray(obs.times, jnp.float32))
    start32 = jc.CTBN(cims=[c.astype(jnp.float32) for c in BINARY.cims], parents=[()])

    def objective(rates):
        Q = np.array([[0.0, rates[0]], [rates[1], 0.0]])
        W = Q - np.diag(Q.sum(1))
        return _dense_log_likelihood([W] * len(paths), [grid] * len(paths), paths)

    reference, best = _scipy_fit(objective, np.ones(2))
    for method in (jc.panel.EMFit(tolerance=1e-6), jc.panel.GradientFit(tolerance=1e-6)):
        fit = jc.panel.fit_rates(start32, obs32, method=method)
        assert bool(fit.converged), fit.method
        assert fit.log_likelihood.dtype == jnp.float32
        assert all(c.dtype == jnp.float32 for c in fit.model.cims)
        rates = _free_rates(fit.model).astype(np.float64)
        assert not np.any(fit.at_lower_bound[0]) and not np.any(fit.at_upper_bound[0])
        np.testing.assert_allclose(float(fit.log_likelihood), objective(rates), rtol=1e-5)
        np.testing.assert_allclose(objective(rates), best, rtol=1e-5)
        np.testing.assert_allclose(rates, reference, rtol=3e-2)


def test_squarem_stopped_short_is_polished_by_l_bfgs():
    # SQUAREM cut off after 2 iterations (as on a boundary optimum where its extrapolations
    # stall until max_iterations): the fit goes on with L-BFGS from there and reaches scipy's
    # optimum of the independent numpy objective, saying so in `method`; without the polish
    # the fit stays short and unconverged
    obs, _ = _two_node_data()
    reference, best = _two_node_reference(False)
    short = jc.panel.fit_rates(
        START, obs, method=jc.panel.SquaremFit(max_iterations=2, polish=None)
    )
    assert not bool(short.converged) and short.method == "squarem"
    assert float(short.log_posterior) < best - 1e-3
    polished = jc.panel.fit_rates(START, obs, method=jc.panel.SquaremFit(max_iterations=2))
    assert bool(polished.converged) and polished.method == "squarem+gradient"
    np.testing.assert_allclose(polished.log_posterior, best, rtol=1e-7)
    np.testing.assert_allclose(_free_rates(polished.model), reference, rtol=1e-3)
    assert int(polished.iterations) > 2
    trace = np.asarray(polished.trace)
    assert trace[0] == pytest.approx(float(short.trace[0])) and trace[-1] == pytest.approx(best)
    with pytest.raises(ValueError, match="polish: expected a jaxctbn.panel.GradientFit"):
        jc.panel.SquaremFit(polish=jc.panel.EMFit())  # pyright: ignore[reportArgumentType]
