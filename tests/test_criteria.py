import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_model
from jax.scipy.special import polygamma

import jaxctbn as jc


def _history_posterior(key, cards, parents, num_paths=3, alpha=1.0, beta=1.0):
    k1, k2 = jax.random.split(key)
    truth = random_model(k1, cards, parents)
    traj = jc.sample_trajectories(
        truth, jnp.zeros(len(cards), jnp.int32), 2.0, key=k2, num_trajectories=num_paths
    )
    post = jc.RatePosterior.for_model(truth, prior=jc.GammaPrior(alpha, beta))
    return truth, post.update_with(jc.SufficientStatistics.from_trajectories(traj, cards, parents))


CASES = {
    "binary": ((2, 2), ((), (0,))),
    "ternary": ((3, 2), ((1,), ())),
}


# ----------------------------------------------------------------------------- KL
def test_kl_zero_nonnegative_and_monte_carlo(getkey):
    cards, parents = (2, 3), ((1,), (0,))
    a = random_model(getkey(), cards, parents)
    b = random_model(getkey(), cards, parents)
    init = jnp.array([0, 1])
    assert abs(float(jc.kl_divergence(a, a, init, 2.0))) < 1e-12
    for iv in [None, jc.Intervention.perfect(a, {"X0": 1})]:
        kl = float(jc.kl_divergence(a, b, init, 2.0, intervention=iv))
        assert kl > 0
        # Monte Carlo: E_{S ~ a}[ln p(S|a) - ln p(S|b)] from sampled path statistics
        traj = jc.sample_trajectories(
            a, init, 2.0, key=getkey(), num_trajectories=20000, intervention=iv
        )
        stats = jc.SufficientStatistics.from_trajectories(traj, cards, parents)
        llr = 0.0
        for n in range(2):
            if iv is not None and bool(iv.targets[n]):
                continue
            off = ~np.eye(cards[n], dtype=bool)
            la, lb = np.asarray(a.cims[n]), np.asarray(b.cims[n])
            M = np.asarray(stats.nodes[n].transitions)
            T = np.asarray(stats.nodes[n].dwell_times)
            log_ratio = np.where(off, np.log(np.where(off, la / lb, 1.0)), 0.0)
            llr = (
                llr
                + (M * log_ratio).sum((1, 2, 3))
                - (T[..., None] * np.where(off, la - lb, 0.0)).sum((1, 2, 3))
            )
        z = (llr.mean() - kl) / (llr.std() / np.sqrt(len(llr)))
        assert abs(z) < 4, (llr.mean(), kl)


# ----------------------------------------------------------------------------- VBHC
@pytest.mark.parametrize("with_intervention", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_optax_minimum_equals_closed_form(case, with_intervention, getkey):
    cards, parents = CASES[case]
    truth, post = _history_posterior(getkey(), cards, parents)
    iv = jc.Intervention.perfect(truth, {"X1": 1}) if with_intervention else None
    draws = jc.posterior_draws(post, getkey(), 10)
    stats = jc.design_statistics(post, draws, jnp.array([1, 0]), 3.0, intervention=iv)
    closed = jc.parameter_vbhc_minimum(post, stats)
    value, kappa = jax.jit(lambda p, s: jc.parameter_vbhc_minimise(p, s, jc.LBFGS(steps=100)))(
        post, stats
    )
    assert abs(float(value - closed)) < 1e-6 * abs(float(closed))
    a_star, b_star = jc.parameter_vbhc_minimiser(post, stats)
    np.testing.assert_allclose(jc.parameter_vbhc(post, stats, a_star, b_star), closed, rtol=1e-12)
    for n, k in enumerate(cards):
        off = ~np.eye(k, dtype=bool)
        np.testing.assert_allclose(
            np.asarray(kappa[0][n])[:, off], np.asarray(a_star[n])[:, off], rtol=1e-5
        )
    # BHC is the VBHC at the posterior, never below the minimum
    assert float(jc.parameter_bhc(post, stats)) >= float(closed) - 1e-12
    if with_intervention:  # the clamped node contributes nothing
        assert float(jnp.abs(stats.transitions[1]).sum() + jnp.abs(stats.dwell_times[1]).sum()) == 0


def test_adam_with_new_learning_rate_does_not_recompile(getkey):
    cards, parents = CASES["binary"]
    truth, post = _history_posterior(getkey(), cards, parents)
    stats = jc.design_statistics(
        post, jc.posterior_draws(post, getkey(), 5), jnp.array([0, 0]), 2.0
    )

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def run(opt, p, s):
        return jc.parameter_vbhc_minimise(p, s, opt)[0]

    closed = float(jc.parameter_vbhc_minimum(post, stats))
    for lr in (0.05, 0.02):
        value = run(jc.Adam(steps=3000, learning_rate=jnp.asarray(lr)), post, stats)
        assert abs(float(value) - closed) < 1e-4 * abs(closed)


def test_autodiff_gradient_equals_corrected_analytic_gradient(getkey):
    cards, parents = CASES["ternary"]
    truth, post = _history_posterior(getkey(), cards, parents)
    stats = jc.design_statistics(
        post, jc.posterior_draws(post, getkey(), 6), jnp.array([2, 1]), 1.5
    )
    # an arbitrary point kappa
    ka = tuple(
        a * jax.random.uniform(getkey(), a.shape, minval=0.5, maxval=2.0) for a in post.alpha
    )
    kb = tuple(b * jax.random.uniform(getkey(), b.shape, minval=0.5, maxval=2.0) for b in post.beta)
    ga, gb = jax.grad(lambda a, b: jc.parameter_vbhc(post, stats, a, b), argnums=(0, 1))(ka, kb)
    for n, k in enumerate(cards):
        off = ~np.eye(k, dtype=bool)
        a_bar, b_bar = np.asarray(post.alpha[n]), np.asarray(post.beta[n])[..., None]
        m, t = np.asarray(stats.transitions[n]), np.asarray(stats.dwell_times[n])[..., None]
        a_k, b_k = np.asarray(ka[n]), np.asarray(kb[n])[..., None]
        d_alpha = (a_k - a_bar - m) * np.asarray(polygamma(1, jnp.asarray(a_k))) + (
            b_bar + t - b_k
        ) / b_k
        d_beta = np.where(off, (a_bar + m) / b_k - a_k * (b_bar + t) / b_k**2, 0.0).sum(-1)
        np.testing.assert_allclose(
            np.asarray(ga[n])[:, off], d_alpha[:, off], rtol=1e-8, atol=1e-10
        )
        np.testing.assert_allclose(np.asarray(gb[n]), d_beta, rtol=1e-8, atol=1e-10)


def test_eig_below_vbhc_below_bhc(getkey):
    cards, parents = CASES["binary"]
    truth, post = _history_posterior(getkey(), cards, parents, num_paths=2)
    key = getkey()
    init = jnp.array([0, 1])
    for iv in [None, jc.Intervention.perfect(truth, {"X0": 1})]:
        stats = jc.design_statistics(
            post, jc.posterior_draws(post, key, 400), init, 3.0, intervention=iv
        )
        vbhc = float(jc.parameter_vbhc_minimum(post, stats))
        bhc = float(jc.parameter_bhc(post, stats))
        gains = jax.vmap(
            lambda k: jc.parameter_eig(post, init, 3.0, key=k, num_samples=200, intervention=iv)
        )(jax.random.split(getkey(), 10))
        eig, se = float(gains.mean()), float(gains.std() / np.sqrt(10))
        assert vbhc <= bhc + 1e-9
        assert eig <= vbhc + 4 * se + 0.02 * vbhc, (eig, vbhc, bhc)
        assert eig > 0


def test_scoring_all_interventions(getkey):
    cards, parents = (2, 2, 2), ((), (0,), (1,))
    truth, post = _history_posterior(getkey(), cards, parents)
    space = jc.intervention_space(cards)
    key = getkey()
    init = jnp.array([0, 1, 0])

    @jax.jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def score(p, crit_key):
        return jc.score_interventions(p, space, init, 2.0, key=crit_key, num_samples=8)

    scores = score(post, key)
    assert scores.shape == (27,)
    # same key: the same draws (common random numbers) -> identical scores one by one
    for i in (0, 5, 26):
        iv = jax.tree_util.tree_map(lambda a: a[i], space)
        draws = jc.posterior_draws(post, key, 8)
        st = jc.design_statistics(post, draws, init, 2.0, intervention=iv)
        np.testing.assert_allclose(
            scores[i], jc.parameter_vbhc_minimum(post, st), rtol=1e-10, atol=1e-12
        )
    # clamping every node leaves nothing to learn
    assert abs(float(scores[-1])) < 1e-12
    # a new history (same shapes) does not recompile
    _, post2 = _history_posterior(getkey(), cards, parents, num_paths=5)
    score(post2, key)
    bhc = jc.score_interventions(post, space, init, 2.0, key=key, num_samples=8, criterion=jc.BHC())
    # the optax route through the same verb gives the same scores
    optax_scores = jc.score_interventions(
        post,
        space,
        init,
        2.0,
        key=key,
        num_samples=8,
        criterion=jc.VBHC(optimiser=jc.LBFGS(steps=100)),
    )
    np.testing.assert_allclose(optax_scores, scores, rtol=1e-6, atol=1e-9)
    # chunked execution gives the same numbers as one vmap
    chunked = jc.score_interventions(
        post, space, init, 2.0, key=key, num_samples=8, batching=jc.Chunked(4)
    )
    np.testing.assert_allclose(chunked, scores, rtol=1e-12, atol=1e-14)
    assert bool(jnp.all(bhc >= scores - 1e-9))


def test_scores_invariant_to_relabelling_nodes(getkey):
    cards, parents = (2, 3), ((1,), ())
    truth, post = _history_posterior(getkey(), cards, parents)
    # the same network with the node order swapped
    post_sw = jc.RatePosterior(
        alpha=post.alpha[::-1],
        beta=post.beta[::-1],
        names=post.names[::-1],
        cardinalities=post.cardinalities[::-1],
        parents=((), (0,)),
    )
    key = getkey()
    for assignment in [{}, {"X0": 1}, {"X1": 2}]:
        iv = jc.Intervention.perfect(truth, assignment)
        iv_sw = jc.Intervention(targets=iv.targets[::-1], states=iv.states[::-1])
        a = jc.design_statistics(
            post, jc.posterior_draws(post, key, 5), jnp.array([1, 2]), 2.0, intervention=iv
        )
        draws = jc.posterior_draws(post, key, 5)
        draws_sw = jax.vmap(
            lambda c0, c1: jc.CTBN(cims=[c1, c0], parents=((), (0,)), names=post_sw.names)
        )(*draws.cims)
        b = jc.design_statistics(post_sw, draws_sw, jnp.array([2, 1]), 2.0, intervention=iv_sw)
        np.testing.assert_allclose(
            jc.parameter_vbhc_minimum(post, a), jc.parameter_vbhc_minimum(post_sw, b), rtol=1e-10
        )


@pytest.mark.usefixtures("no_runtime_typecheck")
def test_criteria_bad_input(getkey):
    cards, parents = CASES["binary"]
    truth, post = _history_posterior(getkey(), cards, parents)
    space = jc.intervention_space(cards)
    with pytest.raises(TypeError, match="criterion: expected a jaxctbn criterion Module"):
        jc.score_interventions(post, space, jnp.array([0, 0]), 1.0, key=getkey(), criterion="mi")
    with pytest.raises(ValueError, match="num_samples must be a positive integer"):
        jc.score_interventions(post, space, jnp.array([0, 0]), 1.0, key=getkey(), num_samples=0)
    with pytest.raises(ValueError, match="the parameter criteria are linear"):
        jc.score_interventions(
            post,
            space,
            jnp.array([0, 0]),
            1.0,
            key=getkey(),
            criterion=jc.VBHC(estimator=jc.MonteCarlo()),
        )
    with pytest.raises(TypeError, match="posterior: expected"):
        jc.score_interventions(truth, space, jnp.array([0, 0]), 1.0, key=getkey())
    with pytest.raises(ValueError, match="steps must be >= 1"):
        jc.LBFGS(steps=0)
    with pytest.raises(ValueError, match="size must be a positive integer"):
        jc.Chunked(0)


def test_nested_eig_tends_to_eig_from_above(getkey):
    cards, parents = CASES["binary"]
    truth, post = _history_posterior(getkey(), cards, parents, num_paths=2)
    init = jnp.array([0, 1])
    key = getkey()
    stats = jc.design_statistics(post, jc.posterior_draws(post, getkey(), 400), init, 3.0)
    bhc = float(jc.parameter_bhc(post, stats))
    eig = float(
        jax.vmap(lambda k: jc.parameter_eig(post, init, 3.0, key=k, num_samples=200))(
            jax.random.split(getkey(), 5)
        ).mean()
    )
    nested = {
        K: float(
            jax.vmap(
                lambda k, K=K: jc.parameter_eig_nested(
                    post, init, 3.0, key=k, num_samples=200, num_inner=K
                )
            )(jax.random.split(key, 5)).mean()
        )
        for K in (1, 30)
    }
    # K = 1 estimates the BHC; more inner draws come down towards the EIG
    assert abs(nested[1] - bhc) < 0.1 * bhc, (nested, bhc)
    assert eig - 0.05 * eig <= nested[30] < nested[1], (nested, eig)


def test_initial_state_distribution(getkey):
    cards, parents = CASES["binary"]
    truth, post = _history_posterior(getkey(), cards, parents)
    space = jc.intervention_space(cards)
    key = getkey()
    point = jnp.array([0.0, 0.0, 1.0, 0.0])  # the state (1, 0)
    a = jc.score_interventions(post, space, jnp.array([1, 0]), 2.0, key=key, num_samples=4)
    b = jc.score_interventions(post, space, point, 2.0, key=key, num_samples=4)
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    # a mixture is the average of the design statistics of its states (linearity)
    mix = jnp.array([0.25, 0.25, 0.5, 0.0])
    draws = jc.posterior_draws(post, key, 4)
    st_mix = jc.design_statistics(post, draws, mix, 2.0)
    parts = [jc.design_statistics(post, draws, jnp.array(s), 2.0) for s in ([0, 0], [0, 1], [1, 0])]
    for n in range(2):
        ref = (
            0.25 * parts[0].dwell_times[n]
            + 0.25 * parts[1].dwell_times[n]
            + 0.5 * parts[2].dwell_times[n]
        )
        np.testing.assert_allclose(st_mix.dwell_times[n], ref, rtol=1e-10)
