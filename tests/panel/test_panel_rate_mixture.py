"""The sampled panel rate posterior (`SampledGammaMixture`: NUTS on the log-rates with the exact
panel likelihood, Rao-Blackwellised over exact path draws into a mixture of Gammas) against the
exact posterior by quadrature on a grid of the two rates of a binary node (numpy, the
two-state chain's closed-form transition probabilities); the mixture's moments, quantiles and
conjugate update against scipy and direct formulas; the multi-chain diagnostics against the
known effective sample size of AR(1) traces."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
import scipy.stats
from helpers import sample_trajectories_jit, state_at

import jaxctbn as jc
from jaxctbn._learning.chain_diagnostics import effective_sample_size, split_r_hat
from jaxctbn._panel.gap_groups import gap_groups
from jaxctbn._panel.rate_posterior import _posterior
from jaxctbn._panel.rate_sampling import sampled_statistics

jax.config.update("jax_enable_x64", True)

TRUTH = jc.CTBN(cims=[jnp.array([[[-0.8, 0.8], [1.5, -1.5]]])], parents=((),), names=("A",))
PRIOR = jc.GammaPrior(2.0, 1.0)


def _exact_by_quadrature(states, grid, size=600):
    """The exact posterior of TRUTH's two rates under Gam(2, 1) priors on a log-spaced grid:
    its means, standard deviations, and the grid with the normalised weights."""
    lam = np.exp(np.linspace(np.log(1e-3), np.log(30.0), size))
    a, b = np.meshgrid(lam, lam, indexing="ij")  # rate 0->1, rate 1->0
    s = a + b
    log_w = scipy.stats.gamma.logpdf(a, 2.0) + scipy.stats.gamma.logpdf(b, 2.0)
    log_w += np.log(a) + np.log(b)  # the grid is uniform in log-rates
    for row in states:
        for h, x0, x1 in zip(np.diff(grid), row[:-1], row[1:]):
            leave = (a if x0 == 0 else b) / s * (1 - np.exp(-s * h))
            log_w += np.log(leave if x1 != x0 else 1 - leave)
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    means = np.array([(w * a).sum(), (w * b).sum()])
    sds = np.sqrt(np.array([(w * (a - means[0]) ** 2).sum(), (w * (b - means[1]) ** 2).sum()]))
    return means, sds, (lam, w.sum(1), w.sum(0))


@pytest.fixture(scope="module")
def sparse_panel():
    # 20 subjects seen 5 times over 4 time units: visits every 2.3 mixing times
    R, horizon = 20, 4.0
    paths = sample_trajectories_jit(
        TRUTH, jnp.zeros((R, 1), jnp.int32), horizon, key=jax.random.key(0), num_trajectories=R
    )
    grid = np.linspace(0.0, horizon, 5)
    states = np.stack([np.asarray(state_at(paths, t)) for t in grid], axis=1)
    return grid, states


# 1,600 draws thinned to 400 path draws (the default keeps 1,000; each costs a forward-backward
# pass over every subject)
FAMILY = jc.panel.SampledGammaMixture(num_draws=400, num_chains=4, burn_in=200, max_components=400)


# 1,600 draws are few for the 1.01 threshold (the family's default runs 2,000)
@pytest.mark.filterwarnings("ignore:panel rate posterior")
def test_sampled_posterior_matches_the_exact_posterior(sparse_panel):
    grid, states = sparse_panel
    R = states.shape[0]
    observations = jc.panel.PanelObservations(np.broadcast_to(grid, (R, len(grid))), states)
    prior = jc.RatePosterior.for_model(TRUTH, prior=PRIOR)
    mixture = jc.panel.panel_rate_posterior(
        prior, observations, family=FAMILY, key=jax.random.key(1)
    )
    # the path draws thinned to the family's max_components (400), the diagnostics of all
    assert mixture.num_components == 400 and mixture.diagnostics is not None
    assert mixture.diagnostics.rate_draws[0].shape[:2] == (4, 400)
    means, sds, (lam, marginal_a, marginal_b) = _exact_by_quadrature(states[..., 0], grid)

    @eqx.filter_jit  # one program for the mixture's numbers (eagerly: one per operation)
    def numbers(mixture):
        return (
            mixture.rate_means()[0],
            mixture.rate_sds()[0],
            mixture.diagnostics.max_split_r_hat(),
            mixture.rate_quantiles(jnp.array([0.025, 0.975]))[0],
        )

    got_means, got_sds, r_hat, quantiles = numbers(mixture)
    got_means = np.asarray(got_means)[0, [0, 1], [1, 0]]
    got_sds = np.asarray(got_sds)[0, [0, 1], [1, 0]]
    ess = min(np.asarray(mixture.diagnostics.effective_sample_size[0])[0, [0, 1], [1, 0]])
    assert ess > 150 and float(r_hat) < 1.05
    # means within 4 Monte Carlo standard errors, spreads within 12%
    assert np.all(np.abs(got_means - means) < 4 * sds / np.sqrt(ess))
    np.testing.assert_allclose(got_sds, sds, rtol=0.12)
    # the 95% interval holds 92-98% of the exact mass
    lo, hi = (np.asarray(q[0, [0, 1], [1, 0]]) for q in quantiles)
    for i, marginal in enumerate((marginal_a, marginal_b)):
        mass = marginal[(lam >= lo[i]) & (lam <= hi[i])].sum()
        assert 0.92 <= mass <= 0.98, (i, mass)
    # the moment-matched Gamma, on the same data, is far too sure (why it is not the default)
    moment = jc.panel.panel_rate_posterior(
        prior, observations, family=jc.panel.MomentMatchedGamma()
    )
    moment_sds = (
        np.sqrt(np.asarray(moment.alpha[0])[0, [0, 1], [1, 0]]) / np.asarray(moment.beta[0])[0]
    )
    assert np.all(moment_sds < 0.5 * sds)

    # no visit after the first: the components are the prior itself. Such a panel has no gaps
    # to group (the verb then takes the per-interval route, a program of its own: ~20 s of
    # compilation and 5 s of sampling); here it runs in the program above, with the intervals
    # grouped as above, where a trajectory's intervals past its last visit carry no weight
    # (the per-interval route's path draws against the grouped ones:
    # test_intervals_grouped_by_length_give_the_per_interval_path_draws)
    unseen = jc.panel.PanelObservations(
        np.broadcast_to(grid, (R, len(grid))), states, num_observations=np.ones(R, np.int32)
    )
    assert gap_groups(unseen) is None
    nothing = _posterior(FAMILY, prior, unseen, None, jax.random.key(2), gap_groups(observations))
    np.testing.assert_allclose(np.asarray(nothing.alpha[0]), 2.0 * np.ones((400, 1, 2, 2)))
    np.testing.assert_allclose(np.asarray(nothing.beta[0]), np.ones((400, 1, 2)))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:panel rate posterior")
def test_a_panel_without_gaps_through_the_verb_is_the_prior(sparse_panel):
    """The verb on a panel with no visit after the first (its per-interval route, a program of
    its own): every component is the prior. Its faster siblings: the same panel through the
    grouped route in test_sampled_posterior_matches_the_exact_posterior, and the per-interval
    route's path draws in test_intervals_grouped_by_length_give_the_per_interval_path_draws."""
    grid, states = sparse_panel
    R = states.shape[0]
    prior = jc.RatePosterior.for_model(TRUTH, prior=PRIOR)
    unseen = jc.panel.PanelObservations(
        np.broadcast_to(grid, (R, len(grid))), states, num_observations=np.ones(R, int)
    )
    nothing = jc.panel.panel_rate_posterior(prior, unseen, family=FAMILY, key=jax.random.key(2))
    np.testing.assert_allclose(np.asarray(nothing.alpha[0]), 2.0 * np.ones((400, 1, 2, 2)))
    np.testing.assert_allclose(np.asarray(nothing.beta[0]), np.ones((400, 1, 2)))


def test_intervals_grouped_by_length_give_the_per_interval_path_draws(sparse_panel):
    """The sampled family's two routes to a draw of the hidden paths given the rates: called
    eagerly on a concrete panel without interventions, the intervals grouped by length (one
    transition matrix per distinct gap); under `jit` or with interventions, each interval's
    own (test_sampled_posterior_matches_the_exact_posterior checks the grouped route against the
    exact posterior). The same keys give the same paths, statistics and log-likelihoods. (The
    grouped log-likelihood of the chains' target: test_panel_fit's
    test_intervals_grouped_by_length_give_the_per_trajectory_statistics.)"""
    grid, states = sparse_panel
    R = states.shape[0]
    times = np.broadcast_to(grid, (R, len(grid))).copy()
    times[::2, 2:] += 0.3  # two gap lengths: 1 and 1.3
    observations = jc.panel.PanelObservations(times, states)
    groups = gap_groups(observations)
    assert groups is not None and groups.gaps.shape[0] == 2
    model = jc.CTBN(cims=[jnp.array([[[-0.6, 0.6], [1.9, -1.9]]])], parents=((),), names=("A",))

    @eqx.filter_jit  # one program for both routes
    def both(model, observations, groups, key):
        solver = jc.MatrixExponential()
        return (
            sampled_statistics(model, observations, None, key, solver, 64, groups),
            sampled_statistics(model, observations, None, key, solver, 64, None),
        )

    grouped, per_interval = both(model, observations, groups, jax.random.key(3))
    np.testing.assert_allclose(grouped.dwell_times, per_interval.dwell_times, rtol=1e-12)
    np.testing.assert_array_equal(grouped.transitions, per_interval.transitions)
    np.testing.assert_allclose(grouped.log_likelihood, per_interval.log_likelihood, rtol=1e-12)
    assert np.asarray(per_interval.transitions).sum() > 0  # paths that move


def test_mixture_moments_quantiles_and_update():
    rng = np.random.default_rng(0)
    C = 3
    alpha = jnp.asarray(rng.uniform(1, 5, (C, 1, 2, 2)))
    beta = jnp.asarray(rng.uniform(0.5, 3, (C, 1, 2)))
    log_w = jnp.log(jnp.asarray([0.2, 0.5, 0.3]))
    mixture = jc.GammaMixturePosterior(
        alpha=(alpha,),
        beta=(beta,),
        log_weights=log_w,
        names=("A",),
        cardinalities=(2,),
        parents=((),),
    )
    stats = [
        jc.internal.NodeStatistics(
            transitions=jnp.array([[[0.0, 3.0], [2.0, 0.0]]]), dwell_times=jnp.array([[1.5, 2.5]])
        )
    ]

    @jax.jit  # one program for the mixture's numbers below (eagerly: one per operation)
    def numbers(mixture, stats):
        single = jc.GammaMixturePosterior.from_gamma(mixture.component(1))
        draws = jax.vmap(mixture.sample)(jax.random.split(jax.random.key(0), 40_000))
        return (
            (mixture.rate_means()[0], mixture.rate_sds()[0]),
            mixture.rate_quantiles(jnp.array([0.1, 0.5, 0.9]))[0],
            single.rate_quantiles(jnp.array([0.025, 0.975]))[0],
            mixture.update(stats),
            draws.cims[0],
        )

    (means, sds), quantiles, single_quantiles, updated, drawn = numbers(mixture, stats)
    a, b, w = np.asarray(alpha)[:, 0, 0, 1], np.asarray(beta)[:, 0, 0], np.exp(log_w)
    mean = (w * a / b).sum()
    second = (w * a * (a + 1) / b**2).sum()
    np.testing.assert_allclose(means[0, 0, 1], mean, rtol=1e-12)
    np.testing.assert_allclose(sds[0, 0, 1], np.sqrt(second - mean**2))
    q = np.asarray(quantiles)[:, 0, 0, 1]
    cdf = [(w * scipy.stats.gamma.cdf(x, a, scale=1 / b)).sum() for x in q]
    np.testing.assert_allclose(cdf, [0.1, 0.5, 0.9], atol=1e-9)
    # one component: the quantiles are scipy's
    np.testing.assert_allclose(
        np.asarray(single_quantiles)[:, 0, 1, 0],
        scipy.stats.gamma.ppf(
            [0.025, 0.975], np.asarray(alpha)[1, 0, 1, 0], scale=1 / np.asarray(beta)[1, 0, 1]
        ),
        rtol=1e-9,
    )
    # complete-path statistics: each component updated conjugately, reweighted by its marginal
    M, T = np.array([[0, 3], [2, 0]]), np.array([1.5, 2.5])
    log_marginal = []
    for c in range(C):
        total = 0.0
        for x, y in ((0, 1), (1, 0)):
            al, be = np.asarray(alpha)[c, 0, x, y], np.asarray(beta)[c, 0, x]
            total += (
                scipy.special.gammaln(al + M[x, y])
                - scipy.special.gammaln(al)
                + al * np.log(be)
                - (al + M[x, y]) * np.log(be + T[x])
            )
        log_marginal.append(total)
    expected = np.log(w) + np.array(log_marginal)
    np.testing.assert_allclose(
        updated.log_weights, expected - scipy.special.logsumexp(expected), rtol=1e-10
    )
    np.testing.assert_allclose(updated.beta[0], np.asarray(beta) + T, rtol=1e-12)
    # a draw picks a component by weight: the draws' mean is the mixture's
    np.testing.assert_allclose(np.asarray(drawn[:, 0, 0, 1]).mean(), mean, rtol=0.02)


def test_multi_chain_diagnostics_of_autoregressive_traces():
    # AR(1) chains x_t = phi x_{t-1} + e_t: ESS = total (1 - phi) / (1 + phi); split R-hat ~1,
    # and large for chains centred apart
    rng = np.random.default_rng(0)
    chains, S = 4, 4000
    for phi in (0.0, 0.8):
        x = np.zeros((chains, S))
        for t in range(1, S):
            x[:, t] = phi * x[:, t - 1] + rng.normal(size=chains)
        ess = float(effective_sample_size(jnp.asarray(x)))
        expected = chains * S * (1 - phi) / (1 + phi)
        assert abs(ess / expected - 1) < 0.15, (phi, ess, expected)
        assert float(split_r_hat(jnp.asarray(x))) < 1.01
    apart = x + np.arange(chains)[:, None]
    assert float(split_r_hat(jnp.asarray(apart))) > 1.1
    with pytest.raises(ValueError, match="at least 4 draws"):
        split_r_hat(jnp.zeros((2, 3)))


# the sampled posterior against the exact one: test_sampled_posterior_matches_the_exact_posterior
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:panel rate posterior")
def test_structural_zeros_and_exact_entry_against_importance_sampling():
    # an illness-death node (0 <-> 1, both -> absorbing 2; 2 -> anything a structural zero),
    # death times exact (msm's deathexact): structural zeros stay zero, and the sampled
    # posterior against importance sampling of the exact posterior
    truth = jc.CTBN(
        cims=[jnp.array([[[0, 0.6, 0.15], [0.8, 0, 0.4], [0, 0, 0.0]]])], parents=[()], names=("h",)
    )
    R, horizon = 30, 6.0
    paths = sample_trajectories_jit(
        truth, jnp.zeros((R, 1), jnp.int32), horizon, key=jax.random.key(5), num_trajectories=R
    )
    grid = np.linspace(0.0, horizon, 5)
    times, states, exact = [], [], []
    for r in range(R):
        path = jax.tree_util.tree_map(lambda x: x[r : r + 1], paths)
        seen = [int(np.asarray(state_at(path, t))[0, 0]) for t in grid]
        jumps = np.asarray(paths.jump_times[r])
        values = np.asarray(paths.states[r])[:, 0]
        died = np.flatnonzero(values == 2)
        if len(died) and jumps[died[0]] < horizon:  # seen until death, its time exact
            t_death = float(jumps[died[0]])
            keep = grid < t_death
            times.append([*grid[keep], t_death])
            states.append([*np.array(seen)[keep], 2])
            exact.append([False] * int(keep.sum()) + [True])
        else:
            times.append(list(grid)), states.append(seen), exact.append([False] * len(grid))
    observations = jc.panel.PanelObservations.from_sequences(
        times, [np.asarray(s)[:, None] for s in states], exact_entry=exact
    )
    free = [np.array([[[False, True, True], [True, False, True], [False, False, False]]])]
    prior = jc.RatePosterior.for_model(truth, prior=jc.GammaPrior(1.0, 1.0))
    start = jc.GammaMixturePosterior.from_gamma(prior, free=free)
    # the hidden 0 <-> 1 jumps before an exact death mix slowly: 400 draws per chain left the
    # s.d. of those rates 23-34% above the exact ones (the means 6-10%), 2,000 within 6% (1%)
    family = jc.panel.SampledGammaMixture(
        num_draws=2000, num_chains=4, burn_in=500, max_components=2000
    )
    mixture = jc.panel.panel_rate_posterior(
        start, observations, family=family, key=jax.random.key(6)
    )
    draws = jax.vmap(mixture.sample)(jax.random.split(jax.random.key(7), 2000))
    assert np.all(np.asarray(draws.cims[0])[:, 0, 2, :2] == 0)  # structural zeros stay zero
    assert np.all(np.asarray(draws.cims[0])[:, 0, 0, 2] > 0)
    # importance sampling of the exact posterior with the mixture as the proposal: the weights
    # (exact panel likelihood x prior / mixture density) stay even, and move neither the means
    # nor the spreads, only if the mixture is the posterior
    idx = ([0, 0, 1, 1], [1, 2, 0, 2])
    rows = [0, 0, 1, 1]
    lam = np.asarray(draws.cims[0])[:, 0][:, idx[0], idx[1]]
    A = np.asarray(mixture.alpha[0])[:, 0][:, idx[0], idx[1]]
    B = np.asarray(mixture.beta[0])[:, 0][:, rows]
    log_q = scipy.special.logsumexp(
        scipy.stats.gamma.logpdf(lam[:, None, :], A[None], scale=1 / B[None]).sum(-1), axis=1
    ) - np.log(A.shape[0])
    log_lik = jax.jit(
        lambda cims: jax.lax.map(
            lambda c: jc.panel.panel_log_likelihood(
                jc.CTBN(cims=[c], parents=[()], names=("h",)),
                observations,
                solver=jc.MatrixExponential(),
            ).sum(),
            cims,
            batch_size=250,
        )
    )(draws.cims[0])
    log_w = np.asarray(log_lik) + scipy.stats.gamma.logpdf(lam, 1.0).sum(1) - log_q
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    effective = 1 / np.sum(w**2)
    assert effective > 0.6 * len(w)
    exact_mean = w @ lam
    exact_sd = np.sqrt(w @ (lam - exact_mean) ** 2)
    got_mean = np.asarray(mixture.rate_means()[0])[0][idx]
    got_sd = np.asarray(mixture.rate_sds()[0])[0][idx]
    np.testing.assert_allclose(got_mean, exact_mean, rtol=0.06)
    np.testing.assert_allclose(got_sd, exact_sd, rtol=0.12)


def _two_node_mixture():
    """A two-node network A -> B, its prior Gamma posterior and a two-component mixture of
    Gammas around it (the criteria tests' posteriors)."""
    truth = jc.CTBN(
        cims=[
            jnp.array([[[-1.0, 1.0], [2.0, -2.0]]]),
            jnp.array([[[-1.0, 1.0], [1.0, -1.0]], [[-3.0, 3.0], [0.5, -0.5]]]),
        ],
        parents=[(), (0,)],
        names=("A", "B"),
    )
    gamma = jc.RatePosterior.for_model(truth, prior=PRIOR)
    mixture = jc.GammaMixturePosterior(
        alpha=tuple(jnp.stack([a, 3 * a]) for a in gamma.alpha),
        beta=tuple(jnp.stack([b, 0.5 * b]) for b in gamma.beta),
        log_weights=jnp.log(jnp.array([0.3, 0.7])),
        names=gamma.names,
        cardinalities=gamma.cardinalities,
        parents=gamma.parents,
    )
    return truth, gamma, mixture


def test_parameter_criteria_under_a_mixture_against_independent_routes():
    # the criteria read a rate posterior only through E[ln L], E[L], the marginal likelihood of
    # statistics and draws, so they score a mixture of Gammas: a one-component mixture gives
    # the Gamma's numbers; for a two-component mixture the closed forms agree with Monte Carlo
    # over the mixture: the BHC with the mean path KL between pairs of independent draws, the
    # VBHC's minimum with -ln E_p[L^m e^{-L t}] by averaging over draws, the EIG with the
    # nested estimator (inner draws, no conjugacy; its upward bias ~1/1000)
    from jaxctbn._criteria.parameter import (
        design_statistics,
        kl_divergence,
        parameter_bhc,
        parameter_eig,
        parameter_eig_nested,
        parameter_vbhc_minimum,
        posterior_draws,
    )

    truth, gamma, mixture = _two_node_mixture()
    init, tau = jnp.array([0, 0]), 2.0
    N = 1000

    @jax.jit  # one program for the routes below (eagerly: one per operation, ~300 in all)
    def routes(gamma, mixture):
        draws = posterior_draws(mixture, jax.random.key(1), N)
        stats = design_statistics(mixture, draws, init, tau)
        # (the one-component identities hold for any statistics: the mixture's, computed once)
        one = jc.GammaMixturePosterior.from_gamma(gamma)
        one_component = (
            (parameter_bhc(one, stats), parameter_bhc(gamma, stats)),
            (parameter_vbhc_minimum(one, stats), parameter_vbhc_minimum(gamma, stats)),
        )
        others = posterior_draws(mixture, jax.random.key(2), N)
        kls = jax.vmap(lambda m, o: kl_divergence(m, o, init, tau))(draws, others)

        def log_tilt(model):  # sum(m ln L - t L) over the free rates
            off = ~np.eye(2, dtype=bool)
            return sum(
                jnp.where(off, m * jnp.log(jnp.where(off, q, 1.0)) - t[..., None] * q, 0.0).sum()
                for q, m, t in zip(model.cims, stats.transitions, stats.dwell_times)
            )

        tilts = jax.vmap(log_tilt)(posterior_draws(mixture, jax.random.key(3), 50_000))
        by_draws = stats.energy - (jax.nn.logsumexp(tilts) - np.log(tilts.shape[0]))
        vbhc = (parameter_vbhc_minimum(mixture, stats), by_draws)
        return one_component, (parameter_bhc(mixture, stats), kls), vbhc

    one_component, (bhc, kls), vbhc = routes(gamma, mixture)
    for got, want in one_component:
        np.testing.assert_allclose(got, want, rtol=1e-12)
    assert abs(bhc - kls.mean()) < 4 * kls.std() / np.sqrt(N)
    np.testing.assert_allclose(*vbhc, rtol=0.01)
    eig = parameter_eig(mixture, init, tau, key=jax.random.key(5), num_samples=200, num_paths=2)
    nested = parameter_eig_nested(
        mixture, init, tau, key=jax.random.key(5), num_samples=200, num_inner=1000, num_paths=2
    )
    np.testing.assert_allclose(eig, nested, rtol=0.02)
    # the score_interventions seam: a mixture goes to the rate criteria; the numerical VBHC,
    # which varies a Gamma around the posterior, refuses it in one line
    space = jc.intervention_space(truth.cardinalities)
    scores = jc.score_interventions(
        mixture, space, init, tau, criterion=jc.BHC(), key=jax.random.key(6), num_samples=20
    )
    assert scores.shape == (space.targets.shape[0],) and np.all(np.isfinite(scores))
    with pytest.raises(ValueError, match="varies a Gamma per rate around a RatePosterior"):
        jc.score_interventions(
            mixture,
            space,
            init,
            tau,
            criterion=jc.VBHC(optimiser=jc.Adam(steps=2)),
            key=jax.random.key(6),
            num_samples=4,
        )


# the panel criteria under a mixture in the loop: test_panel_posterior's
# test_loop_with_panel_outcomes_equals_a_replay (the particle filter's mixture)
@pytest.mark.slow
def test_panel_parameter_criteria_under_a_mixture():
    truth, gamma, mixture = _two_node_mixture()
    init, tau = jnp.array([0, 0]), 2.0
    space = jc.intervention_space(truth.cardinalities)
    # with panel outcomes the VBHC's family is the Gammas and the mixture itself: never above
    # the BHC of the same draws, below it where a Gamma fits better than the mixture's spread
    panel = jc.PanelOutcome(jnp.array([1.0, 2.0]))
    panel_scores = [
        jc.score_interventions(
            mixture,
            jax.tree_util.tree_map(lambda a: a[:3], space),
            init,
            tau,
            criterion=c,
            key=jax.random.key(7),
            num_samples=8,
            outcome=panel,
        )
        for c in (jc.BHC(), jc.VBHC(optimiser=jc.Adam(steps=10)))
    ]
    assert np.all(np.isfinite(panel_scores[1])) and np.all(panel_scores[1] <= panel_scores[0])
    # and choosing each candidate's visit times (the loop's PanelOutcome(num_visits=K) designs)
    chosen = jc.score_interventions(
        mixture,
        jax.tree_util.tree_map(lambda a: a[:3], space),
        init,
        tau,
        outcome=jc.PanelOutcome(num_visits=2, steps=2),
        criterion=jc.BHC(),
        key=jax.random.key(8),
        num_samples=4,
    )
    assert np.all(chosen.scores >= chosen.equally_spaced_scores - 1e-12)


def test_one_gamma_as_a_mixture_has_its_errors_on_every_configuration():
    """A mixture of one Gamma (`free` left out: every off-diagonal rate free) has the Gamma's
    posterior-averaged squared error, over the rates of every parent configuration (node B has
    two), and free-rate masks of the rates' own shape."""
    truth = jc.CTBN(
        cims=[
            jnp.array([[[-0.8, 0.8], [1.5, -1.5]]]),
            jnp.array([[[-0.5, 0.5], [1.0, -1.0]], [[-3.0, 3.0], [0.2, -0.2]]]),
        ],
        parents=((), (0,)),
        names=("A", "B"),
    )
    rng = np.random.default_rng(3)
    gamma = jc.RatePosterior(
        alpha=tuple(jnp.asarray(rng.uniform(1, 4, q.shape)) for q in truth.cims),
        beta=tuple(jnp.asarray(rng.uniform(0.5, 2, q.shape[:-1])) for q in truth.cims),
        cardinalities=truth.cardinalities,
        parents=truth.parents,
        names=truth.names,
    )
    mixture = jc.GammaMixturePosterior.from_gamma(gamma)
    assert [m.shape for m in mixture.free_rates()] == [(1, 2, 2), (2, 2, 2)]
    np.testing.assert_allclose(mixture.mse(truth), gamma.mse(truth), rtol=1e-12)
