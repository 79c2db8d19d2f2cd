"""Parameter design with panel outcomes (maths §7): the panel BHC against pairwise brute-force
enumeration of every outcome sequence (scipy `expm`) over the criterion's own draws, the VBHC's
minimum against scipy's L-BFGS-B on the same objective, the EIG against enumeration of the
outcomes with a high-sample numpy average over the rates (also with misclassified and
unmeasured nodes), the ordering EIG <= VBHC <= BHC, and the chosen visit times against a numpy
grid search."""

import itertools

import equinox as eqx
import jax
import jax.flatten_util
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import scipy.linalg
import scipy.optimize
from helpers import brute_force_generator, brute_force_panel_kl, network_dict

import jaxctbn as jc
from jaxctbn._criteria.panel_parameter import (
    draw_laws,
    panel_parameter_vbhc,
    posterior_log_kappa,
)
from jaxctbn._criteria.parameter import posterior_draws

jax.config.update("jax_enable_x64", True)

NAMES, CARDS, PARENTS = ("A", "B"), (2, 2), ((), (0,))
POSTERIOR = jc.RatePosterior.from_prior(NAMES, CARDS, PARENTS, prior=jc.GammaPrior(3.0, 2.0))
START = jnp.array([0, 0])
HORIZON = 3.0
TIMES = jnp.array([0.8, 3.0])
# none, do(A=1), do(B=0)
CANDIDATES = jc.Intervention(
    targets=jnp.array([[False, False], [True, False], [False, True]]),
    states=jnp.array([[0, 0], [1, 0], [0, 0]]),
)


@eqx.filter_jit
def _criterion_draws(posterior, key, num_samples):
    """The posterior draws and the reparameterised draws at q = posterior that the panel
    (V)BHC averages over (the same key split as the criterion's; one compiled program, not
    op-by-op ones)."""
    key_draws, key_variational = jr.split(key)
    draws = posterior_draws(posterior, key_draws, num_samples)
    log_alpha, log_beta = posterior_log_kappa(posterior)
    q = eqx.tree_at(
        lambda p: (p.alpha, p.beta),
        posterior,
        (tuple(jnp.exp(a) for a in log_alpha), tuple(jnp.exp(b) for b in log_beta)),
    )
    q_draws = jax.vmap(q.sample)(jr.split(key_variational, num_samples))
    return draws, q_draws


def _unbatch(models, i):
    return jax.tree_util.tree_map(lambda x: x[i], models)


def test_panel_bhc_is_the_pairwise_panel_kl_of_its_draws():
    key, N = jr.key(3), 3
    got = jc.score_interventions(
        POSTERIOR,
        CANDIDATES,
        START,
        HORIZON,
        criterion=jc.BHC(),
        key=key,
        num_samples=N,
        outcome=jc.PanelOutcome(TIMES),
    )
    draws, q_draws = _criterion_draws(POSTERIOR, key, N)
    for c in range(3):
        iv = _unbatch(CANDIDATES, c)
        expected = np.mean(
            [
                brute_force_panel_kl(
                    _unbatch(draws, s), _unbatch(q_draws, j), START, np.asarray(TIMES), iv
                )
                for s in range(N)
                for j in range(N)
            ]
        )
        np.testing.assert_allclose(got[c], expected, rtol=1e-8)


def test_vbhc_minimum_agrees_with_scipy_below_the_bhc():
    key, N = jr.key(0), 3
    outcome = jc.PanelOutcome(TIMES)
    kwargs: dict = dict(key=key, outcome=outcome)
    vbhc = np.asarray(
        jc.score_interventions(
            POSTERIOR, CANDIDATES, START, HORIZON, criterion=jc.VBHC(), num_samples=N, **kwargs
        )
    )
    # the same objective minimised by scipy's L-BFGS-B (jax gradients), per candidate; its
    # value at the start (q = the posterior) is the BHC
    key_draws, key_variational = jr.split(key)
    # (under `jit`: one compilation each instead of op-by-op ones)
    draws = eqx.filter_jit(posterior_draws)(POSTERIOR, key_draws, N)
    keys = jr.split(key_variational, N)
    log_kappa = eqx.filter_jit(posterior_log_kappa)(POSTERIOR)
    flat, unflatten = jax.flatten_util.ravel_pytree(log_kappa)

    @jax.jit
    def objective(x, iv):
        laws = draw_laws(draws, START, TIMES, iv)
        return jax.value_and_grad(
            lambda y: panel_parameter_vbhc(POSTERIOR, laws, unflatten(y), keys, START, TIMES, iv)
        )(x)

    for c in range(3):
        iv = _unbatch(CANDIDATES, c)
        result = scipy.optimize.minimize(
            lambda x: tuple(np.asarray(v, float) for v in objective(jnp.asarray(x), iv)),
            np.asarray(flat),
            jac=True,
            method="L-BFGS-B",
        )
        bhc = float(objective(flat, iv)[0])
        assert result.fun < bhc
        np.testing.assert_allclose(vbhc[c], result.fun, rtol=1e-4)


def test_panel_eig_against_enumerated_outcomes():
    # one binary node, two visits: the exact EIG is a sum over the 4 outcome sequences of
    # averages over the rates (200,000 numpy Gamma draws); the criterion's nested Monte Carlo
    # estimate (outer 400 x 25 outcomes, 2000 inner draws) agrees within its sampling error
    post = jc.RatePosterior.from_prior(("A",), (2,), ((),), prior=jc.GammaPrior(2.0, 1.0))
    times = np.array([0.5, 1.5])
    rng = np.random.default_rng(0)
    lam = rng.gamma(2.0, 1.0, size=(200_000, 2))  # rates 0->1, 1->0
    s = lam.sum(1)
    gaps = np.diff(np.concatenate([[0.0], times]))
    probs = []
    for ys in itertools.product(range(2), repeat=2):
        p, prev = np.ones(len(lam)), 0
        for h, y in zip(gaps, ys):
            e = np.exp(-s * h)
            leave = np.where(prev == 0, lam[:, 0], lam[:, 1]) / s * (1 - e)
            p = p * (leave if y != prev else 1 - leave)
            prev = y
        probs.append(p)
    probs = np.stack(probs, 1)
    marginal = probs.mean(0)
    exact = np.mean(np.sum(probs * np.log(probs), 1)) - np.sum(marginal * np.log(marginal))
    # the BHC, E KL(p(Y | rates) || p(Y | other rates)) over independent pairs, bounds it
    half = len(probs) // 2
    bhc = np.mean(np.sum(probs[:half] * np.log(probs[:half] / probs[half:]), 1))
    assert bhc > exact > 0
    got = jc.score_interventions(
        post,
        jc.Intervention(targets=jnp.array([[False]]), states=jnp.array([[0]])),
        jnp.array([0]),
        2.0,
        criterion=jc.EIG(num_paths=25, num_inner=2000),
        key=jr.key(1),
        num_samples=400,
        outcome=jc.PanelOutcome(jnp.asarray(times)),
    )
    assert abs(float(got[0]) - exact) < 0.03, (float(got[0]), exact)


def _two_state_transitions(lam, h):
    """P(h) of the binary chain with rates lam[:, 0] (0 -> 1) and lam[:, 1] (1 -> 0), numpy."""
    a, b = lam[:, 0], lam[:, 1]
    s, e = a + b, np.exp(-(a + b) * h)
    return (
        np.stack([np.stack([b + a * e, a - a * e], -1), np.stack([b - b * e, a + b * e], -1)], -2)
        / s[:, None, None]
    )


def _exact_eig_of_symbols(lam, times, emission):
    """The EIG of the symbols recorded at `times` (one binary node started in 0, emission
    matrix `(2, M)`): every symbol sequence enumerated, each p(y | rates) by summing over the
    hidden states, the marginal averaged over the rate draws `lam`, numpy."""
    P = [_two_state_transitions(lam, h) for h in np.diff(np.concatenate([[0.0], times]))]
    M = emission.shape[1]
    probs = []
    for ys in itertools.product(range(M), repeat=len(times)):
        alpha = np.zeros((len(lam), 2))
        alpha[:, 0] = 1.0
        for P_k, y in zip(P, ys):
            alpha = np.einsum("ns,nst->nt", alpha, P_k) * emission[:, y]
        probs.append(alpha.sum(1))
    probs = np.stack(probs, 1)
    marginal = probs.mean(0)
    safe = np.where(probs > 0, probs, 1.0)
    return np.mean(np.sum(probs * np.log(safe), 1)) - np.sum(marginal * np.log(marginal))


@pytest.mark.slow  # the same enumeration check with emissions: the plain one stays fast
def test_panel_eig_with_misclassified_and_unmeasured_nodes():
    # PanelOutcome(emissions=...): the EIG of the recorded symbols, each likelihood by the forward
    # filter, against enumeration of every symbol sequence (numpy, 200,000 rate draws); below
    # the error-free EIG (data processing); unmeasured nodes give 0 (to rounding). The Box-Hill
    # criteria and the loop refuse emissions.
    post = jc.RatePosterior.from_prior(("A",), (2,), ((),), prior=jc.GammaPrior(2.0, 1.0))
    times = np.array([0.5, 1.5])
    E = np.array([[0.9, 0.1], [0.2, 0.8]])
    lam = np.random.default_rng(0).gamma(2.0, 1.0, size=(200_000, 2))
    exact = _exact_eig_of_symbols(lam, times, E)
    assert 0 < exact < _exact_eig_of_symbols(lam, times, np.eye(2))
    none = jc.Intervention(targets=jnp.array([[False]]), states=jnp.array([[0]]))

    def eig(emissions):
        return jc.score_interventions(
            post,
            none,
            jnp.array([0]),
            2.0,
            criterion=jc.EIG(num_paths=25, num_inner=2000),
            key=jr.key(1),
            num_samples=400,
            outcome=jc.PanelOutcome(jnp.asarray(times), emissions=emissions),
        )[0]

    got = eig(jc.panel.Emissions([E]))
    assert abs(float(got) - exact) < 0.02, (float(got), exact)
    # the global emission matrix: E(s, y) = prod_n E_n(s_n, y_n) in the package's state order
    from jaxctbn._model.layout import all_global_states
    from jaxctbn._panel.outcome_law import global_emission_matrix

    model = jc.CTBN.from_dict(network_dict())
    per_node = [np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]]), np.ones((2, 1))]
    G = np.asarray(global_emission_matrix(jc.panel.Emissions(per_node), model, jnp.float64))
    states, symbols = all_global_states((2, 2)), all_global_states((3, 1))
    manual = [[per_node[0][x[0], y[0]] * per_node[1][x[1], y[1]] for y in symbols] for x in states]
    np.testing.assert_allclose(G, manual, rtol=1e-15)
    # structure (the same filter): nothing measured, nothing learned
    structure = jc.StructurePosterior.from_prior(NAMES, CARDS, max_parents=1)
    unmeasured = jc.score_interventions(
        structure,
        jc.Intervention(targets=jnp.array([[False, False]]), states=jnp.array([[0, 0]])),
        START,
        HORIZON,
        criterion=jc.EIG(num_paths=5, num_inner=20),
        key=jr.key(2),
        num_samples=10,
        outcome=jc.PanelOutcome(TIMES, emissions=jc.panel.Emissions([np.ones((2, 1))] * 2)),
    )
    assert abs(float(unmeasured[0])) < 1e-12
    with pytest.raises(ValueError, match="Box-Hill criteria assume error-free visits"):
        jc.score_interventions(
            post,
            none,
            jnp.array([0]),
            2.0,
            criterion=jc.BHC(),
            key=jr.key(1),
            outcome=jc.PanelOutcome(jnp.asarray(times), emissions=jc.panel.Emissions([E])),
        )
    with pytest.raises(ValueError, match="loop simulates error-free visits"):
        jc.ParameterLearningTask(
            jc.CTBN.from_dict(network_dict()),
            outcome=jc.PanelOutcome(TIMES, emissions=jc.panel.Emissions([E, None])),
        )
    with pytest.raises(ValueError, match="emissions: expected None or a jaxctbn.panel"):
        jc.PanelOutcome(TIMES, emissions=[E])


@pytest.mark.parametrize(
    "rate, interior", [pytest.param(4.0, True, marks=pytest.mark.slow), (0.05, False)]
)
def test_visit_time_moves_where_a_grid_search_says(rate, interior):
    # one binary node with tight rate posteriors around `rate`, one visit in (0, 3]: a fast
    # node is best seen early, before it forgets its start; a slow one as late as possible.
    # The chosen time against the argmax of the BHC of the same draws on a numpy grid.
    alpha = 50.0
    post = jc.RatePosterior.from_prior(
        ("A",), (2,), ((),), prior=jc.GammaPrior(alpha, alpha / rate)
    )
    # (key 5: these six draws give the fast node a clear interior maximum, 10% above its
    # plateau; with other draws the BHC can be flat to 1e-10 past t ~ 1)
    key, N = jr.key(5), 6
    design = jc.score_interventions(
        post,
        jc.intervention_space((2,)),  # none, do(A=0), do(A=1)
        jnp.array([0]),
        HORIZON,
        outcome=jc.PanelOutcome(num_visits=1, steps=60, learning_rate=0.1),
        criterion=jc.BHC(),
        key=key,
        num_samples=N,
    )
    draws, q_draws = _criterion_draws(post, key, N)

    # the BHC on a grid by scipy's expm of the draws' dense generators (built once: one visit
    # from state 0, KL of the two rows of the exponentials)
    W = [brute_force_generator(_unbatch(draws, s)) for s in range(N)]
    V = [brute_force_generator(_unbatch(q_draws, j)) for j in range(N)]

    def bhc(t):
        p = [scipy.linalg.expm(t * w)[0] for w in W]
        q = [scipy.linalg.expm(t * v)[0] for v in V]
        return np.mean([np.sum(a * np.log(a / b)) for a in p for b in q])

    grid = np.linspace(0.02, HORIZON, 60)  # spacing 1.7% of the horizon
    values = np.array([bhc(t) for t in grid])
    best = grid[np.argmax(values)]
    chosen = float(design.times[0, 0])
    assert np.all(np.asarray(design.scores) >= np.asarray(design.equally_spaced_scores))
    np.testing.assert_allclose(design.scores[1:], 0.0, atol=1e-12)  # a clamped node: nothing
    at_chosen = [
        brute_force_panel_kl(_unbatch(draws, s), _unbatch(q_draws, j), [0], [chosen])
        for s in range(N)
        for j in range(N)
    ]  # the shared enumeration helper, at the chosen time
    np.testing.assert_allclose(bhc(chosen), np.mean(at_chosen), rtol=1e-12)
    np.testing.assert_allclose(float(design.scores[0]), bhc(chosen), rtol=1e-8)
    if interior:
        assert best < 0.5 * HORIZON
        assert abs(chosen - best) < 0.05 * HORIZON
        assert float(design.scores[0]) > float(design.equally_spaced_scores[0])
    else:
        assert best == grid[-1] and chosen == pytest.approx(HORIZON)


def test_bad_panel_outcomes_are_refused():
    with pytest.raises(ValueError, match="give the visit `times` or `num_visits`"):
        jc.PanelOutcome()
    # beyond the dense exponentials' state space: one line naming the outcome, before any
    # allocation (13 binary nodes, 8,192 global states)
    names = tuple(f"X{n}" for n in range(13))
    large = jc.RatePosterior.from_prior(names, (2,) * 13, ((),) * 13)
    for criterion in (jc.BHC(), jc.EIG()):
        with pytest.raises(ValueError, match="needs dense exponentials over the 8,192 global"):
            jc.score_interventions(
                large,
                jc.Intervention(targets=jnp.zeros((1, 13), bool), states=jnp.zeros((1, 13), int)),
                jnp.zeros(13, int),
                HORIZON,
                criterion=criterion,
                key=jr.key(0),
                outcome=jc.PanelOutcome(TIMES),
            )
    with pytest.raises(ValueError, match="num_visits: expected an integer >= 1"):
        jc.PanelOutcome(num_visits=0)
    with pytest.raises(ValueError, match="strictly increasing"):
        jc.PanelOutcome(jnp.array([1.0, 1.0]))
    kwargs: dict = dict(key=jr.key(3), num_samples=3)
    with pytest.raises(Exception, match="at most the horizon"):
        jc.score_interventions(
            POSTERIOR,
            CANDIDATES,
            START,
            1.0,
            criterion=jc.BHC(),
            outcome=jc.PanelOutcome(TIMES),
            **kwargs,
        )
    with pytest.raises(ValueError, match="EIG cannot choose visit times"):
        jc.score_interventions(
            POSTERIOR,
            CANDIDATES,
            START,
            HORIZON,
            criterion=jc.EIG(),
            outcome=jc.PanelOutcome(num_visits=2),
            **kwargs,
        )
    structure = jc.StructurePosterior.from_prior(NAMES, CARDS, max_parents=1)
    with pytest.raises(ValueError, match="panel structure criteria take PlugIn"):
        jc.score_interventions(
            structure,
            CANDIDATES,
            START,
            HORIZON,
            criterion=jc.BHC(estimator=jc.MonteCarlo(4)),
            outcome=jc.PanelOutcome(TIMES),
            **kwargs,
        )
    with pytest.raises(ValueError, match="EIG cannot choose visit times"):
        jc.score_interventions(
            structure,
            CANDIDATES,
            START,
            HORIZON,
            criterion=jc.EIG(),
            outcome=jc.PanelOutcome(num_visits=2),
            **kwargs,
        )
