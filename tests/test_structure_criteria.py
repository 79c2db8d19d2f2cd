import functools
import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from helpers import random_model

import jaxctbn as jc


def _posterior(key, cards, parents, num_paths=3, **kwargs):
    k1, k2 = jax.random.split(key)
    truth = random_model(k1, cards, parents)
    traj = jc.sample_trajectories(
        truth, jnp.zeros(len(cards), jnp.int32), 2.0, key=k2, num_trajectories=num_paths
    )
    return truth, jc.learn_structure(traj, truth.names, cards, max_parents=len(cards) - 1, **kwargs)


CASES = {"binary": ((2, 2, 2), ((), (0,), (1,))), "ternary": ((3, 2, 2), ((1,), (), (0,)))}
PRIORS = {"gamma": jc.GammaPrior(), "nodelman": jc.NodelmanPrior(2.0, 1.0)}


@pytest.mark.parametrize(
    "case, with_intervention, prior",
    [(case, iv, "gamma") for case in CASES for iv in (False, True)]
    # one case for the Nodelman prior (each prior compiles anew); three states, so the
    # Dirichlet part of its score is not trivial
    + [("ternary", False, "nodelman")],
)
def test_structure_vbhc_optax_equals_closed_form_and_graph_enumeration(
    case, with_intervention, prior, getkey
):
    cards, parents = CASES[case]
    truth, post = _posterior(getkey(), cards, parents, prior=PRIORS[prior])
    iv = jc.Intervention.perfect(truth, {"X1": 1}) if with_intervention else None
    draws = jc.structure_draws(post, getkey(), 4)
    a = jc.structure_divergences(post, draws, jnp.array([1, 0, 1]), 2.0, intervention=iv)
    closed = float(jc.structure_vbhc_minimum(post, a))
    value, _ = jax.jit(lambda p, a: jc.structure_vbhc_minimise(p, a, jc.LBFGS(steps=500)))(post, a)
    assert abs(float(value) - closed) < 1e-6 * abs(closed)
    # the node-wise closed form equals the minimum over whole graphs, -ln sum_G p(G) e^{-A(G)}
    logp = [np.asarray(x) for x in post.log_posterior()]
    a_np = [np.asarray(x) for x in a]
    joint_logp, joint_A = [], []
    for choice in itertools.product(*(range(len(x)) for x in logp)):
        joint_logp.append(sum(logp[n][c] for n, c in enumerate(choice)))
        joint_A.append(sum(a_np[n][c] for n, c in enumerate(choice)))
    joint_logp, joint_A = np.array(joint_logp), np.array(joint_A)
    ref_min = -np.log(np.sum(np.exp(joint_logp - joint_A)))
    ref_bhc = np.sum(np.exp(joint_logp) * joint_A)
    np.testing.assert_allclose(closed, ref_min, rtol=1e-10)
    np.testing.assert_allclose(jc.structure_bhc(post, a), ref_bhc, rtol=1e-10)
    assert float(jc.structure_bhc(post, a)) >= closed - 1e-12
    if with_intervention:
        assert float(jnp.abs(a[1]).sum()) == 0.0


def test_monte_carlo_estimator_is_nonnegative_and_plug_in_differs(getkey):
    cards, parents = CASES["binary"]
    truth, post = _posterior(getkey(), cards, parents, num_paths=2)
    draws = jc.structure_draws(post, getkey(), 6)
    init = jnp.array([0, 1, 0])
    mc = jc.structure_divergences(
        post, draws, init, 3.0, estimator=jc.MonteCarlo(num_paths=40), path_key=getkey()
    )
    plug = jc.structure_divergences(post, draws, init, 3.0)
    for m in mc:
        # a_n(P') is an expected KL: non-negative up to Monte Carlo error
        assert float(m.min()) > -0.02
    # the plug-in's bias (ell is convex in the statistics) is larger than the Monte Carlo
    # estimator's own noise: a second, independent set of paths moves it far less
    mc2 = jc.structure_divergences(
        post, draws, init, 3.0, estimator=jc.MonteCarlo(num_paths=40), path_key=getkey()
    )
    mc, mc2, plug = (np.concatenate(x) for x in (mc, mc2, plug))
    noise = np.abs(mc - mc2).max()
    bias = np.abs((mc + mc2) / 2 - plug).max()
    assert 0 < 3 * noise < bias, (noise, bias)


def test_structure_scoring_all_interventions(getkey):
    cards, parents = CASES["binary"]
    truth, post = _posterior(getkey(), cards, parents)
    space = jc.intervention_space(cards)
    init = jnp.array([0, 0, 1])
    key = getkey()

    @jax.jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def score(p, k):
        return jc.score_interventions(p, space, init, 2.0, key=k, num_samples=3)

    scores = score(post, key)
    assert scores.shape == (27,)
    assert abs(float(scores[-1])) < 1e-12  # every node clamped: nothing to learn
    draws = jc.structure_draws(post, jax.random.split(key)[0], 3)
    for i in (0, 4, 13):
        iv = jax.tree_util.tree_map(lambda x: x[i], space)
        a = jc.structure_divergences(post, draws, init, 2.0, intervention=iv)
        np.testing.assert_allclose(
            scores[i], jc.structure_vbhc_minimum(post, a), rtol=1e-10, atol=1e-12
        )
    # any subset, any order, chunks that do not divide the batch: the same scores
    subset = jnp.array([26, 13, 0, 5, 9, 21, 4, 17, 8, 3])
    part = jax.jit(
        lambda p, k: jc.score_interventions(
            p,
            jax.tree_util.tree_map(lambda x: x[subset], space),
            init,
            2.0,
            key=k,
            num_samples=3,
            batching=jc.Chunked(4),
        )
    )(post, key)
    np.testing.assert_allclose(part, scores[subset], rtol=1e-10, atol=1e-12)
    _, post2 = _posterior(getkey(), cards, parents, num_paths=4)
    score(post2, key)  # new history, same shapes: no recompilation


@pytest.mark.usefixtures("no_runtime_typecheck")
def test_structure_criteria_bad_input(getkey):
    cards, parents = CASES["binary"]
    truth, post = _posterior(getkey(), cards, parents)
    space = jc.intervention_space(cards)
    with pytest.raises(TypeError, match="criterion: expected"):
        jc.score_interventions(post, space, jnp.zeros(3, int), 1.0, key=getkey(), criterion="x")
    with pytest.raises(ValueError, match="num_samples must be >= 1"):
        jc.structure_draws(post, getkey(), 0)
    draws = jc.structure_draws(post, getkey(), 1)
    with pytest.raises(ValueError, match="estimator: expected"):
        jc.structure_divergences(post, draws, jnp.zeros(3, int), 1.0, estimator="second-order")
    with pytest.raises(ValueError, match="path_key"):
        jc.structure_divergences(post, draws, jnp.zeros(3, int), 1.0, estimator=jc.MonteCarlo())
    with pytest.raises(ValueError, match="num_paths and max_events must be >= 1"):
        jc.MonteCarlo(num_paths=0)


@pytest.mark.parametrize("prior", [jc.GammaPrior(2.0, 1.5), jc.NodelmanPrior(2.0, 1.5)])
def test_predictive_is_the_ratio_of_marginal_likelihoods(prior, getkey):
    # conjugacy: p(new | old) = p(old + new) / p(old), an independent route for both priors
    rng = np.random.default_rng(3)
    k, C = 3, 2
    old_M = jnp.asarray(rng.integers(0, 5, (C, k, k)) * (1 - np.eye(k)), float)
    new_M = jnp.asarray(rng.integers(0, 4, (C, k, k)) * (1 - np.eye(k)), float)
    old_T, new_T = jnp.asarray(rng.uniform(0.1, 2, (C, k))), jnp.asarray(rng.uniform(0, 1, (C, k)))
    direct = prior.log_predictive(1, new_M, new_T, old_M, old_T, C)
    ratio = prior.log_marginal_likelihood(
        1, old_M + new_M, old_T + new_T, C
    ) - prior.log_marginal_likelihood(1, old_M, old_T, C)
    np.testing.assert_allclose(direct, ratio, rtol=1e-10)


def _path_log_likelihood(rates, M, T):
    r"""$\sum_{u,x\ne x'}[M\ln\Lambda-T\Lambda]$ in numpy (with $0\ln0=0$), for a batch of
    rate draws `(draws, configs, k, k)`. For the Nodelman prior, with $\Lambda=q\theta$, this is
    $\sum_{u,x}[M_{xu}\ln q_{xu}-q_{xu}T_{xu}+\sum_{x'}M_{xx'u}\ln\theta_{xx'u}]$."""
    off = ~np.eye(M.shape[-1], dtype=bool)
    jumps = off & (M > 0)
    log_rates = np.log(np.where(jumps, rates, 1.0))
    return np.where(jumps, M * log_rates, 0.0).sum((-3, -2, -1)) - np.where(
        off, T[..., None] * rates, 0.0
    ).sum((-3, -2, -1))


@pytest.mark.parametrize("prior", [jc.GammaPrior(2.0, 1.5), jc.NodelmanPrior(2.0, 1.5)])
def test_marginal_and_predictive_likelihoods_by_monte_carlo_over_rate_draws(prior):
    # p(new | old) = E[path likelihood of the new statistics] over rates drawn from the
    # posterior given the old statistics (`sample_rates`); with no old statistics, over the
    # prior: the marginal likelihood. One parent configuration and few new jumps keep the
    # variance low (several configurations: see the quadrature test below)
    rng = np.random.default_rng(8)
    k, C, draws, chunk = 3, 1, 40_000, 2_000
    off = 1 - np.eye(k)
    new_M = rng.integers(0, 2, (C, k, k)) * off * (rng.random((C, k, k)) < 0.5)
    new_T = rng.uniform(0.1, 0.6, (C, k))
    old_M = rng.integers(0, 5, (C, k, k)) * off
    old_T = rng.uniform(0.5, 2.0, (C, k))
    assert new_M.sum() > 0

    @jax.jit
    def sample(keys, M, T):  # in chunks: one large vmap of the Gamma sampler is slower
        one = jax.vmap(lambda key: prior.sample_rates(1, M, T, C, key))
        return jax.lax.map(one, keys.reshape(-1, chunk, *keys.shape[1:])).reshape(-1, C, k, k)

    keys = jax.random.split(jax.random.key(6), draws)
    f = functools.partial(jnp.asarray, dtype=float)
    zeros = (np.zeros((C, k, k)), np.zeros((C, k)))
    for (M, T), exact in (
        (zeros, prior.log_marginal_likelihood(1, f(new_M), f(new_T), C)),
        ((old_M, old_T), prior.log_predictive(1, f(new_M), f(new_T), f(old_M), f(old_T), C)),
    ):
        rates = np.asarray(sample(keys, f(M), f(T)))
        log_lik = _path_log_likelihood(rates, new_M, new_T)
        shift = log_lik.max()
        lik = np.exp(log_lik - shift)
        estimate = np.log(lik.mean()) + shift
        rel_se = lik.std() / lik.mean() / np.sqrt(draws)
        assert rel_se < 0.02, rel_se  # so that the check below is tight
        assert abs(estimate - float(exact)) < 4 * rel_se, (estimate, float(exact), rel_se)


def test_nodelman_predictive_by_quadrature_for_a_binary_node():
    # two states: the Dirichlet over the one next state is trivial, so each rate is the exit
    # rate q_xu ~ Gam(a_xu + M_xu + 1, tau_xu + T_xu) a posteriori, and the predictive is a
    # product of one-dimensional integrals of q^M e^{-qT} against that density
    integrate = pytest.importorskip("scipy.integrate")
    stats = pytest.importorskip("scipy.stats")
    prior = jc.NodelmanPrior(jnp.array([1.0, 3.0]), jnp.array([2.0, 0.5]))  # per node: node 1
    k, C = 2, 3
    a_xx, tau = 3.0 / ((k - 1) * k * C), 0.5 / (k * C)
    rng = np.random.default_rng(7)
    off = 1 - np.eye(k)
    new_M = rng.integers(0, 4, (C, k, k)) * off
    new_T = rng.uniform(0.0, 1.5, (C, k))
    for old_M, old_T in (
        (np.zeros((C, k, k)), np.zeros((C, k))),
        (rng.integers(0, 6, (C, k, k)) * off, rng.uniform(0.1, 3.0, (C, k))),
    ):
        reference = 0.0
        for u in range(C):
            for x in range(k):
                shape, rate = a_xx + old_M[u, x].sum() + 1, tau + old_T[u, x]
                m, t = new_M[u, x].sum(), new_T[u, x]
                value, _ = integrate.quad(
                    lambda q, shape=shape, rate=rate, m=m, t=t: (
                        stats.gamma.pdf(q, shape, scale=1 / rate) * q**m * np.exp(-q * t)
                    ),
                    0.0,
                    np.inf,
                    epsabs=0.0,
                    epsrel=1e-12,
                    limit=200,
                )
                reference += np.log(value)
        ours = prior.log_predictive(
            1,
            jnp.asarray(new_M, float),
            jnp.asarray(new_T),
            jnp.asarray(old_M, float),
            jnp.asarray(old_T),
            C,
        )
        np.testing.assert_allclose(ours, reference, rtol=1e-9)


def test_structure_criteria_under_the_nodelman_prior(getkey):
    cards, parents = CASES["ternary"]
    truth, post = _posterior(getkey(), cards, parents, prior=jc.NodelmanPrior(2.0, 1.0))
    space = jc.intervention_space(cards)
    init = jnp.array([0, 1, 0])
    key = getkey()
    vbhc = jc.score_interventions(post, space, init, 2.0, key=key, num_samples=3)
    assert bool(jnp.all(jnp.isfinite(vbhc)))
    assert abs(float(vbhc[-1])) < 1e-12  # every node clamped: nothing to learn
    # the chunks of 27 candidates share their solves and predictive terms by clamp pattern
    # (4 patterns of a node's two others); chunks of 3 cannot (one solve per candidate)
    one_by_one = jc.score_interventions(
        post, space, init, 2.0, key=key, num_samples=3, batching=jc.Chunked(3)
    )
    np.testing.assert_allclose(vbhc, one_by_one, rtol=1e-10, atol=1e-12)
    # the verb's scores are the closed-form minimum of the divergences on the same draws
    # (BHC >= VBHC under this prior: test_structure_eig_below_vbhc_below_bhc[nodelman])
    draws = jc.structure_draws(post, jax.random.split(key)[0], 3)
    for i in (0, 13):
        iv = jax.tree_util.tree_map(lambda x: x[i], space)
        a = jc.structure_divergences(post, draws, init, 2.0, intervention=iv)
        np.testing.assert_allclose(
            vbhc[i], jc.structure_vbhc_minimum(post, a), rtol=1e-10, atol=1e-12
        )


@pytest.mark.parametrize(
    "prior, interventions",
    # the Nodelman prior without an intervention only: each prior and each intervention
    # structure compiles anew
    [
        pytest.param("gamma", ({}, {"X0": 1}), id="gamma"),
        pytest.param("nodelman", ({},), id="nodelman"),
    ],
)
def test_structure_eig_below_vbhc_below_bhc(prior, interventions, getkey):
    cards, parents = ((2, 2), ((), (0,)))
    truth, post = _posterior(getkey(), cards, parents, num_paths=2, prior=PRIORS[prior])
    init = jnp.array([0, 1])
    for assignment in interventions:
        iv = jc.Intervention.perfect(truth, assignment) if assignment else None
        draws = jc.structure_draws(post, getkey(), 20)
        path_key = getkey()
        mc = jc.structure_divergences(
            post,
            draws,
            init,
            3.0,
            intervention=iv,
            estimator=jc.MonteCarlo(num_paths=20),
            path_key=path_key,
        )
        vbhc = float(jc.structure_vbhc_minimum(post, mc))
        bhc = float(jc.structure_bhc(post, mc))
        eigs = np.asarray(
            jax.vmap(
                lambda k, k2, iv=iv: jc.structure_eig(
                    post,
                    jc.structure_draws(post, k, 20),
                    init,
                    3.0,
                    path_key=k2,
                    num_paths=10,
                    intervention=iv,
                )
            )(jax.random.split(getkey(), 3), jax.random.split(getkey(), 3))
        )
        eig, se = np.mean(eigs), np.std(eigs) / np.sqrt(len(eigs))
        assert eig >= -4 * se - 1e-3
        assert vbhc <= bhc + 1e-12
        assert eig <= vbhc + 4 * se + 0.05 * vbhc, (eig, vbhc, bhc)


def test_structure_scores_invariant_to_relabelling_nodes(getkey):
    # two nodes of different cardinality, swapped: the divergences of every node and candidate
    # set and the (V)BHC must be the same numbers under the new labels
    cards, parents = (2, 3), ((1,), ())
    truth = random_model(getkey(), cards, parents)
    traj = jc.sample_trajectories(
        truth, jnp.array([0, 2], jnp.int32), 2.0, key=getkey(), num_trajectories=3
    )
    post = jc.learn_structure(traj, ("X0", "X1"), cards, max_parents=1)
    traj_sw = eqx.tree_at(
        lambda t: (t.initial_states, t.states, t.intervention_targets, t.intervention_states),
        traj,
        tuple(
            x[..., ::-1]
            for x in (
                traj.initial_states,
                traj.states,
                traj.intervention_targets,
                traj.intervention_states,
            )
        ),
    )
    post_sw = jc.learn_structure(traj_sw, ("X1", "X0"), cards[::-1], max_parents=1)
    for lp, lp_sw in zip(post.log_posterior(), post_sw.log_posterior()[::-1]):
        np.testing.assert_allclose(lp, lp_sw, rtol=1e-10)
    draws = jc.structure_draws(post, getkey(), 4)

    def swap(model):  # PaddedCTBN batch with the two nodes exchanged
        return jc.PaddedCTBN(
            cims=model.cims[::-1],
            parent_index=tuple(jnp.where(p >= 0, 1 - p, p) for p in model.parent_index[::-1]),
            names=model.names[::-1],
            cardinalities=model.cardinalities[::-1],
        )

    draws_sw = jc.StructureDraws(models=tuple(swap(m) for m in draws.models[::-1]))
    init, init_sw = jnp.array([1, 2]), jnp.array([2, 1])
    for assignment in [{}, {"X0": 1}, {"X1": 2}]:
        iv = jc.Intervention.perfect(truth, assignment)
        iv_sw = jc.Intervention(targets=iv.targets[::-1], states=iv.states[::-1])
        a = jc.structure_divergences(post, draws, init, 2.0, intervention=iv)
        b = jc.structure_divergences(post_sw, draws_sw, init_sw, 2.0, intervention=iv_sw)
        for x, y in zip(a, b[::-1]):
            np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(
            jc.structure_vbhc_minimum(post, a), jc.structure_vbhc_minimum(post_sw, b), rtol=1e-10
        )


def test_eig_through_the_scoring_entry_point(getkey):
    cards, parents = CASES["binary"]
    truth, post = _posterior(getkey(), cards, parents, num_paths=2)
    space = jax.tree_util.tree_map(lambda x: x[jnp.array([0, 9])], jc.intervention_space(cards))
    init, key = jnp.array([0, 1, 0]), getkey()
    scores = jc.score_interventions(
        post, space, init, 2.0, key=key, num_samples=3, criterion=jc.EIG(num_paths=2)
    )
    k_draws, k_paths = jax.random.split(key)
    draws = jc.structure_draws(post, k_draws, 3)
    for j in range(2):
        iv = jax.tree_util.tree_map(lambda x, j=j: x[j], space)
        ref = jc.structure_eig(
            post, draws, init, 2.0, path_key=k_paths, num_paths=2, intervention=iv
        )
        np.testing.assert_allclose(scores[j], ref, rtol=1e-10)


def test_joint_graph_draws_equal_an_explicit_loop_and_the_stratified_scores(getkey):
    cards, parents = CASES["binary"]
    truth, post = _posterior(getkey(), cards, parents)
    init, tau = jnp.array([1, 0, 1]), 2.0
    space = jc.single_node_interventions(cards)
    key = getkey()
    # the vectorised route against a Python loop over candidates, draws, nodes and sets
    a = jax.jit(
        lambda p, k: jc.JointGraphDraws().divergences(
            p,
            space,
            init,
            tau,
            key=k,
            num_samples=3,
            solver=jc.Uniformisation(),
            estimator=jc.PlugIn(),
            batching=jc.Chunked(2),
        )
    )(post, key)
    draws = jc.joint_structure_draws(post, key, 3)
    for i in range(space.targets.shape[0]):
        iv = jax.tree_util.tree_map(lambda x: x[i], space)
        ells = []
        for s in range(3):
            model = jax.tree_util.tree_map(lambda x: x[s], draws.models)
            st = jc.expected_statistics(model, init, tau, intervention=iv)
            ells.append(
                [
                    np.asarray(
                        jc.predictive_log_likelihood(
                            post, n, *st.node_statistics_on_sets(n, post.parent_sets[n])
                        )
                    )
                    for n in range(3)
                ]
            )
        for n in range(3):
            own = [ells[s][n][int(draws.indices[s, n])] for s in range(3)]
            ref = np.mean([own[s] - ells[s][n] for s in range(3)], axis=0)
            if bool(iv.targets[n]):
                ref = np.zeros_like(ref)
            np.testing.assert_allclose(a[n][i], ref, rtol=1e-10, atol=1e-12)
    # the same a_n in expectation as the paper's stratified draws: many draws of each, the
    # scores agree to Monte Carlo error (measured spread ~0.01 at these sizes) and in ranking
    joint, stratified = jax.jit(
        lambda p, k1, k2: [
            jc.score_interventions(
                p,
                space,
                init,
                tau,
                key=k,
                num_samples=ns,
                criterion=jc.VBHC(graph_draws=draws_),
            )
            for k, ns, draws_ in [
                (k1, 2000, jc.JointGraphDraws()),
                (k2, 300, jc.StratifiedGraphDraws()),
            ]
        ]
    )(post, getkey(), getkey())
    np.testing.assert_allclose(joint, stratified, atol=0.04)
    assert float(scipy.stats.spearmanr(joint, stratified).statistic) > 0.9


def test_systematic_parent_sets_are_posterior_draws_with_proportional_counts(
    getkey, no_runtime_typecheck
):
    cards, parents = CASES["binary"]
    truth, post = _posterior(getkey(), cards, parents, num_paths=1)
    probs = [np.asarray(p) for p in post.parent_set_probabilities()]
    S = 7
    draw = jax.jit(lambda k: post.systematic_parent_sets(k, S))
    # within one call, node n takes set P in floor(S p) or ceil(S p) of the S draws
    for key in jax.random.split(getkey(), 5):
        indices = np.asarray(draw(key))
        assert indices.shape == (S, 3)
        for n in range(3):
            counts = np.bincount(indices[:, n], minlength=probs[n].size)
            assert np.all(counts >= np.floor(S * probs[n] - 1e-9))
            assert np.all(counts <= np.ceil(S * probs[n] + 1e-9))
    # over many calls, one draw (here the first) is distributed as the posterior, and the
    # nodes independently: frequencies against p(P|H) and their products (binomial error)
    R = 20000
    first = np.asarray(jax.vmap(draw)(jax.random.split(getkey(), R))[:, 0, :])
    for n in range(3):
        freq = np.bincount(first[:, n], minlength=probs[n].size) / R
        np.testing.assert_allclose(freq, probs[n], atol=5 * np.sqrt(0.25 / R))
    pair = np.zeros((probs[0].size, probs[1].size))
    np.add.at(pair, (first[:, 0], first[:, 1]), 1.0 / R)
    np.testing.assert_allclose(pair, np.outer(probs[0], probs[1]), atol=5 * np.sqrt(0.25 / R))
    # the same expectation as independent draws: both joint schemes against many draws
    init, space = jnp.array([1, 0, 1]), jc.single_node_interventions(cards)
    systematic, independent = jax.jit(
        lambda p, k: [
            jc.score_interventions(
                p,
                space,
                init,
                2.0,
                key=k,
                num_samples=1000,
                criterion=jc.VBHC(graph_draws=jc.JointGraphDraws(systematic=flag)),
            )
            for flag in (True, False)
        ]
    )(post, getkey())
    np.testing.assert_allclose(systematic, independent, atol=0.04)
    with pytest.raises(ValueError, match="num_samples: expected a positive integer"):
        post.systematic_parent_sets(getkey(), 0)
    with pytest.raises(ValueError, match="systematic must be True or False"):
        jc.JointGraphDraws(systematic=1)  # pyright: ignore[reportArgumentType]


def test_truncated_posterior_keeps_the_most_probable_sets(getkey):
    cards, parents = CASES["binary"]
    truth, post = _posterior(getkey(), cards, parents)
    cut = jax.jit(lambda p: p.truncated(2))(post)
    for n in range(3):
        lp = np.asarray(post.log_posterior()[n])
        kept = np.sort(np.argsort(-lp, kind="stable")[:2])
        np.testing.assert_array_equal(cut.parent_sets[n], np.asarray(post.parent_sets[n])[kept])
        ref = lp[kept] - np.logaddexp.reduce(lp[kept])  # renormalised over the kept sets
        np.testing.assert_allclose(cut.log_posterior()[n], ref, rtol=1e-12)
        np.testing.assert_array_equal(
            cut.statistics.dwell_times[n], np.asarray(post.statistics.dwell_times[n])[kept]
        )
    # keeping every set changes nothing, also in the scores
    everything = max(s.shape[0] for s in post.parent_sets)
    init, space, key = jnp.array([1, 0, 1]), jc.single_node_interventions(cards), getkey()
    full, kept_all = jax.jit(
        lambda p, k: [
            jc.score_interventions(p, space, init, 2.0, key=k, num_samples=2, criterion=c)
            for c in (jc.VBHC(), jc.VBHC(max_sets=everything))
        ]
    )(post, key)
    np.testing.assert_array_equal(full, kept_all)
    with pytest.raises(ValueError, match="max_sets: expected a positive integer"):
        post.truncated(0)
    with pytest.raises(ValueError, match="max_sets: expected None or a positive integer"):
        jc.BHC(max_sets=0)
    with pytest.raises(ValueError, match="estimator: JointGraphDraws takes the PlugIn"):
        jc.score_interventions(
            post,
            space,
            init,
            2.0,
            key=key,
            criterion=jc.VBHC(graph_draws=jc.JointGraphDraws(), estimator=jc.MonteCarlo()),
        )
