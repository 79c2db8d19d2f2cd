import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.stats
from helpers import random_model
from helpers import sample_trajectories_jit as sample

import jaxctbn as jc
from jaxctbn._active_learning.metrics import adjacency_from_parents, aupr, auroc
from jaxctbn._learning.candidates import candidate_parent_sets, enumerate_parent_sets
from jaxctbn._paths.sufficient_statistics import node_statistics

# Called eagerly, `jc.sample_trajectories` and `jc.internal.family_statistics` compile one small program
# per primitive (hundreds per test); compiled whole, one program per shape, which the tests
# below share by drawing their data at a few common sizes. The same paths and statistics (the
# sampler's compiled and eager calls are compared in test_sampling.py); the eager calls'
# checks on concrete data are tested on the public functions themselves below.
family_statistics = eqx.filter_jit(jc.internal.family_statistics)


def _concatenate(*trajectories):
    return jax.tree_util.tree_map(lambda *a: jnp.concatenate(a), *trajectories)


# ----------------------------------------------------------------------------- local scores
def _quadrature_gamma(M, T, alpha, beta):
    """ln prod_{u,x,x'} int lam^M e^{-lam T} Gam(lam; alpha, beta) dlam, by 1-d quadrature."""
    total = 0.0
    C, k, _ = M.shape
    for u, x, y in itertools.product(range(C), range(k), range(k)):
        if x == y:
            continue
        m, t = M[u, x, y], T[u, x]
        f = lambda lam, m=m, t=t: np.exp(
            m * np.log(lam) - lam * t + scipy.stats.gamma.logpdf(lam, alpha, scale=1 / beta)
        )
        val, _ = scipy.integrate.quad(f, 0, np.inf, epsabs=0, epsrel=1e-12, limit=200)
        total += np.log(val)
    return total


def _quadrature_nodelman(M, T, alpha, tau):
    """Exit rate q ~ Gam(a_x + 1, tau_x) and next state ~ Dirichlet(a_xx'), integrated numerically
    (k = 2: the next state is certain; k = 3: one Beta integral)."""
    C, k, _ = M.shape
    a_xx = alpha / ((k - 1) * k * C)
    a_x = (k - 1) * a_xx
    t_x = tau / (k * C)
    total = 0.0
    for u, x in itertools.product(range(C), range(k)):
        m = M[u, x].copy()
        m[x] = 0
        mx, t = m.sum(), T[u, x]
        f = lambda q, mx=mx, t=t: np.exp(
            mx * np.log(q) - q * t + scipy.stats.gamma.logpdf(q, a_x + 1, scale=1 / t_x)
        )
        val, _ = scipy.integrate.quad(f, 0, np.inf, epsabs=0, epsrel=1e-12, limit=200)
        total += np.log(val)
        if k == 3:
            m1, m2 = [m[y] for y in range(k) if y != x]
            g = lambda th, m1=m1, m2=m2: np.exp(
                m1 * np.log(th) + m2 * np.log1p(-th) + scipy.stats.beta.logpdf(th, a_xx, a_xx)
            )
            val, _ = scipy.integrate.quad(g, 0, 1, epsabs=0, epsrel=1e-12, limit=200)
            total += np.log(val)
    return total


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("alpha, beta", [(1.0, 1.0), (5.0, 1.0), (2.5, 0.4)])
def test_gamma_score_matches_quadrature(k, alpha, beta):
    rng = np.random.default_rng(k)
    C = 2
    M = rng.integers(0, 6, (C, k, k)).astype(float) * (1 - np.eye(k))
    T = rng.uniform(0.1, 3.0, (C, k))
    score = jc.GammaPrior(alpha, beta).log_marginal_likelihood(0, jnp.asarray(M), jnp.asarray(T), C)
    ref = _quadrature_gamma(M, T, alpha, beta)
    assert abs(float(score) - ref) < 1e-8 * max(1.0, abs(ref))


@pytest.mark.parametrize("k, alpha", [(2, 1.0), (2, 7.0), (3, 12.0), (3, 30.0)])
def test_nodelman_score_matches_quadrature(k, alpha):
    rng = np.random.default_rng(10 + k)
    C = 2
    M = rng.integers(0, 6, (C, k, k)).astype(float) * (1 - np.eye(k))
    T = rng.uniform(0.1, 3.0, (C, k))
    tau = 2.0
    score = jc.NodelmanPrior(alpha, tau).log_marginal_likelihood(
        0, jnp.asarray(M), jnp.asarray(T), C
    )
    ref = _quadrature_nodelman(M, T, alpha, tau)
    assert abs(float(score) - ref) < 1e-8 * max(1.0, abs(ref))


def test_conventions_differ_and_prior_terms_matter():
    M = jnp.array([[[0.0, 3.0], [2.0, 0.0]]])
    T = jnp.array([[1.5, 0.7]])
    g = jc.GammaPrior(5.0, 1.0).log_marginal_likelihood(0, M, T, 1)
    n = jc.NodelmanPrior(5.0, 1.0).log_marginal_likelihood(0, M, T, 1)
    assert abs(float(g - n)) > 1e-3
    with pytest.raises(ValueError, match="alpha: prior parameters must be > 0"):
        jc.GammaPrior(0.0, 1.0)
    with pytest.raises(ValueError, match="tau: prior parameters must be > 0"):
        jc.NodelmanPrior(1.0, -2.0)


# A network of binary and ternary nodes, a cycle and a node with two parents, whose paths (30,
# one compiled sampler) serve the tests below that need some data of this shape.
CARDS3, PARENTS3 = (2, 3, 2), ((2,), (0,), (1, 0))


def test_node_score_invariant_to_parent_order(getkey):
    cards = CARDS3
    model = random_model(getkey(), cards, PARENTS3)
    traj = sample(model, [0, 1, 0], 3.0, key=getkey(), num_trajectories=30)

    @jax.jit
    def node_scores(traj):  # node 1 under both orders of its parents, by both priors
        scores = []
        for order in [(0, 2), (2, 0)]:
            st = jax.vmap(lambda t: node_statistics(t, 1, order, cards))(traj)
            M, T = st.transitions.sum(0), st.dwell_times.sum(0)
            for prior in (jc.GammaPrior(2.0, 1.5), jc.NodelmanPrior(2.0, 1.5)):
                scores.append(prior.log_marginal_likelihood(1, M, T, 4))
        return scores

    scores = node_scores(traj)
    np.testing.assert_allclose(scores[0], scores[2], rtol=1e-12)
    np.testing.assert_allclose(scores[1], scores[3], rtol=1e-12)


# ----------------------------------------------------------------------------- family statistics
def _pooled(key, cards, parents, iv_states, *, horizon=2.0, num=(12, 9), max_events=256):
    """Observational paths and paths under a perfect intervention, in one batch."""
    k_model, k_obs, k_iv = jax.random.split(key, 3)
    model = random_model(k_model, cards, parents)
    iv = jc.Intervention.perfect(model, iv_states)
    s0 = jnp.zeros(len(cards), jnp.int32)
    t1 = sample(model, s0, horizon, key=k_obs, num_trajectories=num[0], max_events=max_events)
    t2 = sample(
        model,
        s0,
        horizon,
        key=k_iv,
        num_trajectories=num[1],
        max_events=max_events,
        intervention=iv,
    )
    traj = _concatenate(t1, t2)
    assert not bool(traj.truncated.any())
    return model, traj


def _assert_same_statistics(a, b, atol=1e-9):
    for n in range(len(a.cardinalities)):
        np.testing.assert_allclose(a.transitions[n], b.transitions[n], atol=atol)
        np.testing.assert_allclose(a.dwell_times[n], b.dwell_times[n], atol=atol)


CARDS4, PARENTS4 = (2, 3, 2, 2), ((3,), (0, 2), (1,), (2, 1))


@pytest.fixture(scope="module")
def pooled4():
    """Paths of four binary and ternary nodes with up to two parents, observational and with
    X2 clamped (pooling), the candidate sets of up to two parents, and the family statistics
    by the scatter route (the reference of the other routes): shared by the route tests."""
    _, traj = _pooled(jax.random.key(4), CARDS4, PARENTS4, {"X2": 1})
    sets = candidate_parent_sets(4, 2)
    return traj, sets, family_statistics(traj, CARDS4, sets, method="scatter")


def test_scatter_and_matmul_routes_agree_with_node_statistics(pooled4):
    """The scatter and matmul routes agree, and equal per-trajectory `node_statistics` summed
    over the trajectories that pooling keeps, on every padded candidate set of the ternary
    node 1 and of node 2 (whose intervened trajectories must be left out), padding rows zero,
    and on the static-tuple route for the last (two-parent) set."""
    cards = CARDS4
    traj, sets, scatter = pooled4
    _assert_same_statistics(scatter, family_statistics(traj, cards, sets, method="matmul"), 1e-10)

    last = {n: tuple(int(p) for p in np.asarray(sets[n][-1])) for n in (1, 2)}

    @jax.jit
    def independent(traj):
        per_set, static = [], []
        for n in (1, 2):
            # per-trajectory node statistics on each padded candidate set
            configs = scatter.dwell_times[n].shape[1]
            per_set.append(
                jax.vmap(
                    lambda P, n=n, configs=configs: jax.vmap(
                        lambda t: node_statistics(t, n, P, cards, num_configs=configs)
                    )(traj)
                )(sets[n])
            )
            # and on the last (two-parent) set as a static tuple
            static.append(jax.vmap(lambda t, n=n: node_statistics(t, n, last[n], cards))(traj))
        return per_set, static

    per_sets, statics = independent(traj)
    for n, per_set, st in zip((1, 2), per_sets, statics):
        keep = ~np.asarray(traj.intervention_targets[:, n])
        if n == 2:
            assert 0 < keep.sum() < len(keep)  # some paths are left out
        np.testing.assert_allclose(
            scatter.dwell_times[n], per_set.dwell_times[:, keep].sum(1), atol=1e-10
        )
        np.testing.assert_allclose(scatter.transitions[n], per_set.transitions[:, keep].sum(1))
        for i, P in enumerate(np.asarray(sets[n])):  # padding rows past the configurations
            C = int(np.prod([cards[p] for p in P if p >= 0]))
            assert np.abs(np.asarray(scatter.dwell_times[n])[i, C:]).sum() == 0.0
        C = st.dwell_times.shape[1]
        np.testing.assert_allclose(
            scatter.dwell_times[n][-1, :C], st.dwell_times[keep].sum(0), atol=1e-10
        )


def test_enumeration_and_constraints():
    sets = enumerate_parent_sets(4, 1, 2)
    assert sets.shape == (1 + 3 + 3, 2)
    assert sets[0].tolist() == [-1, -1] and sets[-1].tolist() == [2, 3]
    sets = enumerate_parent_sets(4, 1, 2, required=[0], forbidden=[3])
    assert sets.tolist() == [[0, -1], [0, 2]]
    with pytest.raises(ValueError, match="max_parents must be between 0 and 3"):
        enumerate_parent_sets(4, 1, 4)
    with pytest.raises(ValueError, match="both required and forbidden"):
        enumerate_parent_sets(4, 1, 2, required=[0], forbidden=[0])
    with pytest.raises(ValueError, match="self-loops"):
        candidate_parent_sets(3, 1, required_edges=[(1, 1)])


# ----------------------------------------------------------------------------- posterior
def _brute_force_graph_posterior(post):
    """Enumerate whole graphs (product of per-node choices) and normalise jointly."""
    scores = [
        np.asarray(s) + np.asarray(p) for s, p in zip(post.log_marginal_likelihoods, post.log_prior)
    ]
    sets = [np.asarray(s) for s in post.parent_sets]
    N = len(scores)
    logps, graphs = [], []
    for choice in itertools.product(*(range(len(s)) for s in scores)):
        logps.append(sum(scores[n][c] for n, c in enumerate(choice)))
        graphs.append([set(int(p) for p in sets[n][c] if p >= 0) for n, c in enumerate(choice)])
    logps = np.array(logps)
    probs = np.exp(logps - logps.max())
    probs /= probs.sum()
    edges = np.zeros((N, N))
    for p, g in zip(probs, graphs):
        for n, ps in enumerate(g):
            for m in ps:
                edges[m, n] += p
    entropy = -np.sum(probs * np.log(probs))
    best = graphs[int(np.argmax(probs))]
    return edges, entropy, tuple(tuple(sorted(b)) for b in best)


@pytest.mark.parametrize(
    "prior",
    [
        jc.GammaPrior(jnp.array([0.5, 2.0, 1.5, 3.0]), 1.2),
        jc.NodelmanPrior(2.0, jnp.arange(1.0, 5.0)),
    ],
)
def test_scores_and_log_prior_grouped_over_nodes_equal_node_by_node(prior, getkey):
    """The posterior's scores and structure log prior are computed per group of nodes with
    equal shapes (their sets concatenated, the node index traced): against each node's own
    definition, node by node with a static index, per-node prior parameters, mixed
    cardinalities (nodes 0 and 2 share a group, their set counts differ) and an edge prior."""
    cards = (2, 3, 2, 2)
    model = random_model(getkey(), cards, ((3,), (0,), (1, 0), ()))
    traj = sample(model, [0, 0, 1, 1], 2.0, key=getkey(), num_trajectories=30)
    pi = np.asarray(jax.random.uniform(getkey(), (4, 4), minval=0.05, maxval=0.95))
    post = jc.learn_structure(
        traj,
        model.names,
        cards,
        max_parents=2,
        prior=prior,
        knowledge=jc.PriorKnowledge(
            edge_prior=pi,
            forbidden_edges=[(1, 0), (3, 0)],  # node 0: fewer sets than node 2
        ),
    )
    stats = post.statistics
    assert len(post.parent_sets[0]) < len(post.parent_sets[2])
    for n in range(4):
        for i, parents in enumerate(np.asarray(stats.parent_sets[n])):
            held = tuple(int(p) for p in parents if p >= 0)
            U = int(np.prod([cards[p] for p in held]))
            score = prior.log_marginal_likelihood(
                n, stats.transitions[n][i], stats.dwell_times[n][i], U
            )
            np.testing.assert_allclose(post.log_marginal_likelihoods[n][i], score, rtol=1e-13)
            log_prior = sum(
                np.log(pi[m, n]) if m in held else np.log1p(-pi[m, n]) for m in range(4) if m != n
            )
            np.testing.assert_allclose(post.log_prior[n][i], log_prior, rtol=1e-13)


@pytest.mark.parametrize("prior", [jc.GammaPrior(2.0, 1.0), jc.NodelmanPrior(2.0, 1.0)])
def test_factorised_posterior_matches_graph_enumeration(prior, getkey):
    cards = CARDS3
    model = random_model(getkey(), cards, PARENTS3)
    traj = sample(model, [0, 0, 1], 1.0, key=getkey(), num_trajectories=30)
    post = jc.learn_structure(
        traj,
        model.names,
        cards,
        max_parents=2,
        prior=prior,
        knowledge=jc.PriorKnowledge(edge_prior=jnp.full((3, 3), 0.3)),
    )
    edges, entropy, best = _brute_force_graph_posterior(post)
    ours = eqx.filter_jit(lambda post: (post.edge_marginals(), post.entropy()))(post)
    np.testing.assert_allclose(ours[0], edges, atol=1e-12)
    np.testing.assert_allclose(ours[1], entropy, rtol=1e-10)
    assert post.map_graph() == best


@pytest.mark.parametrize(
    "cards, parents",
    [
        ((2, 2, 2, 2), ((), (0,), (1,), (0, 2))),  # binary
        ((3, 3, 3), ((), (0,), (1,))),  # ternary
        ((2, 3, 2), ((), (0, 2), ())),  # mixed cardinalities
        ((2, 2, 2), ((2,), (0,), (1,))),  # a cycle
    ],
    ids=["binary", "ternary", "mixed", "cycle"],
)
def test_map_graph_recovers_truth(cards, parents, getkey):
    truth = jc.experiments.scaled_softmax_ctbn(parents, cards, gamma=3.0, rate_fast=2.0)
    N = len(cards)
    inits = jnp.stack([jax.random.randint(getkey(), (150,), 0, k) for k in cards], axis=1).astype(
        jnp.int32
    )
    traj = sample(truth, inits, 10.0, key=getkey(), num_trajectories=150, max_events=512)
    adj = adjacency_from_parents(parents, N)

    @eqx.filter_jit
    def metrics(post):
        auroc = jc.experiments.edge_auroc(post.edge_marginals(), adj)
        return auroc, jc.experiments.structural_hamming_distance(post.map_adjacency(), adj)

    for prior in (jc.GammaPrior(1.0, 1.0), jc.NodelmanPrior(1.0, 1.0)):
        post = jc.learn_structure(traj, truth.names, cards, max_parents=2, prior=prior)
        assert post.map_graph() == tuple(tuple(sorted(p)) for p in parents)
        auroc, shd = metrics(post)
        assert float(auroc) == 1.0
        assert int(shd) == 0


def test_pooling_interventional_equals_observational_for_other_nodes(getkey):
    cards, parents = (2, 2, 2), ((), (0,), (1,))
    truth = jc.experiments.scaled_softmax_ctbn(parents, cards, rate_fast=2.0)
    iv = jc.Intervention.perfect(truth, {"X0": 1})
    traj = sample(truth, [0, 0, 0], 3.0, key=getkey(), num_trajectories=40, intervention=iv)
    # the same paths, labelled observational
    unlabeled = jax.tree_util.tree_map(lambda a: a, traj)
    unlabeled = jax.tree_util.tree_map(lambda a: a, unlabeled)
    unlabeled = unlabeled.__class__(
        **{f: getattr(traj, f) for f in traj.__dataclass_fields__}
        | {"intervention_targets": jnp.zeros_like(traj.intervention_targets)}
    )
    a = jc.learn_structure(traj, truth.names, cards, max_parents=2)
    b = jc.learn_structure(unlabeled, truth.names, cards, max_parents=2)
    for n in (1, 2):
        np.testing.assert_allclose(a.log_posterior()[n], b.log_posterior()[n], rtol=1e-12)
    # the clamped node learned nothing: its posterior is the prior (uniform over candidates)
    np.testing.assert_allclose(a.parent_set_probabilities()[0], 1 / 4, rtol=1e-12)
    # rate posterior: same pooling rule
    rp = eqx.filter_jit(
        lambda traj: jc.RatePosterior.for_model(truth, prior=jc.GammaPrior(2.0, 3.0)).update_with(
            jc.SufficientStatistics.from_trajectories(traj, cards, parents)
        )
    )(traj)
    np.testing.assert_allclose(rp.alpha[0], 2.0)
    np.testing.assert_allclose(rp.beta[0], 3.0)


def test_incremental_update_equals_batch(getkey):
    cards, parents = (2, 2, 3), ((2,), (0,), (1,))
    model = random_model(getkey(), cards, parents)
    t1 = sample(model, [0, 0, 0], 2.0, key=getkey(), num_trajectories=8)
    t2 = sample(
        model,
        [1, 0, 2],
        2.0,
        key=getkey(),
        num_trajectories=1,
        intervention=jc.Intervention.perfect(model, {"X1": 1}),
    )
    sets = candidate_parent_sets(3, 2)

    @eqx.filter_jit
    def incremental(t1, t2):  # the posterior of t1, updated with the statistics of t2
        post = jc.StructurePosterior.from_statistics(
            jc.internal.family_statistics(t1, cards, sets),
            model.names,
            prior=jc.GammaPrior(1.5, 2.0),
        )
        return post.update(jc.internal.family_statistics(t2, cards, sets))

    updated = incremental(t1, t2)
    both = _concatenate(t1, t2)
    direct = jc.learn_structure(
        both, model.names, cards, max_parents=2, prior=jc.GammaPrior(1.5, 2.0)
    )
    for x, y in zip(updated.log_posterior(), direct.log_posterior()):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)


def test_rate_posterior_draws_match_gamma_moments(getkey):
    cards, parents = (2, 3), ((), (0,))
    model = random_model(getkey(), cards, parents)
    traj = sample(model, [0, 0], 2.0, key=getkey(), num_trajectories=5)
    prior = jc.GammaPrior(2.0, jnp.array([1.0, 2.0]))
    n_draws = 20000

    @eqx.filter_jit
    def posterior_and_draws(traj, key):
        post = jc.RatePosterior.for_model(model, prior=prior)
        post = post.update_with(jc.SufficientStatistics.from_trajectories(traj, cards, parents))
        return post, jax.vmap(post.sample)(jax.random.split(key, n_draws)), post.mse(model)

    post, draws, exact_mse = posterior_and_draws(traj, getkey())
    for n in range(2):
        a, b = np.asarray(post.alpha[n]), np.asarray(post.beta[n])[..., None]
        x = np.asarray(draws.cims[n])
        off = ~np.eye(cards[n], dtype=bool)
        mean, var = (a / b)[:, off], (a / b**2)[:, off]
        z_mean = (x.mean(0)[:, off] - mean) / np.sqrt(var / n_draws)
        assert np.max(np.abs(z_mean)) < 4.5
        # variance of the sample variance of a Gamma: (mu4 - var^2)/n with mu4 = 3(a+2)var^2/a
        mu4 = 3 * (a[:, off] + 2) * var**2 / a[:, off]
        z_var = (x.var(0)[:, off] - var) / np.sqrt((mu4 - var**2) / n_draws)
        assert np.max(np.abs(z_var)) < 4.5
    # posterior MSE = variance + squared bias (closed form) vs Monte Carlo over the draws
    errors = [
        ((np.asarray(draws.cims[n]) - np.asarray(model.cims[n])) ** 2)[
            :, :, ~np.eye(cards[n], dtype=bool)
        ]
        for n in range(2)
    ]
    mc = np.concatenate([e.reshape(n_draws, -1) for e in errors], axis=1).mean()
    exact = float(exact_mse)
    assert abs(mc - exact) < 0.05 * exact


def test_structure_rate_draws_given_graph(getkey):
    cards, parents = (2, 2), ((1,), (0,))
    model = random_model(getkey(), cards, parents)
    traj = sample(model, [0, 0], 3.0, key=getkey(), num_trajectories=10)
    post = jc.learn_structure(
        traj, model.names, cards, max_parents=1, prior=jc.GammaPrior(2.0, 1.0)
    )
    idx = jnp.array([1, 1])  # parent sets (1,) and (0,)
    draws = jax.jit(jax.vmap(lambda k: post.rates_given(idx, k)))(jax.random.split(getkey(), 20000))
    M = np.asarray(post.statistics.transitions[0][1])
    T = np.asarray(post.statistics.dwell_times[0][1])
    a, b = 2.0 + M[:, 0, 1], 1.0 + T[:, 0]
    x = np.asarray(draws.cims[0])[:, :2, 0, 1]
    z = (x.mean(0) - a / b) / np.sqrt(a / b**2 / 20000)
    assert np.max(np.abs(z)) < 4.5
    np.testing.assert_array_equal(np.asarray(draws.parent_index[0][0]), [1])
    # a PaddedCTBN draw runs through the master equation
    st = jc.expected_statistics(
        jax.tree_util.tree_map(lambda a: a[0], draws), jnp.array([0, 0]), 1.0
    )
    assert abs(float(st.dwell_times.sum()) - 1.0) < 1e-10


@pytest.mark.slow
# ----------------------------------------------------------------------------- metrics
def test_draws_vectorised_over_node_groups_equal_node_by_node(getkey):
    # rates_given, mean_rates_given, sample_parent_sets and structure_draws vectorise over the
    # nodes of equal shapes (here nodes 0 and 2 with k = 2; node 1 with k = 3 on its own): the
    # same numbers as the node-by-node formulas of the prior and jax.random, key for key
    from jaxctbn._criteria.structure import structure_draws
    from jaxctbn._model.layout import num_configurations

    cards = CARDS3  # the candidate sets (one parent at most) set the groups, not the truth
    model = random_model(getkey(), cards, PARENTS3)
    traj = sample(model, [0, 0, 0], 2.0, key=getkey(), num_trajectories=30)
    rate_prior = jc.GammaPrior(jnp.array([1.0, 2.0, 0.5]), 2.0)  # per node: a traced lookup
    post = jc.learn_structure(traj, model.names, cards, max_parents=1, prior=rate_prior)
    assert sorted(post._node_groups()) == [(0, 2), (1,)]
    key, idx, graph_key = getkey(), jnp.array([2, 0, 1]), getkey()
    strata = ((0, 2, 1), (1, 1, 0), (2, 0, 2))  # (node n, its candidate set P, draw s)

    @eqx.filter_jit
    def node_by_node(prior, n, transitions, dwell_times, sets, index, key_n):
        """Node n's posterior-mean rates and rate draw under its set `index`, by the prior's
        formulas, one node per call (nodes 0 and 2, of equal shapes, share this program)."""
        M, T = transitions[index], dwell_times[index]
        U = num_configurations(sets[index], cards)
        return prior.posterior_mean_rates(n, M, T, U), prior.sample_rates(n, M, T, U, key_n)

    keys = jax.random.split(key, 3)
    statistics = post.statistics
    rates = [
        node_by_node(
            post.prior,
            jnp.asarray(n),
            statistics.transitions[n],
            statistics.dwell_times[n],
            post.parent_sets[n],
            idx[n],
            keys[n],
        )
        for n in range(3)
    ]

    @eqx.filter_jit
    def graphs_and_strata(post, key, graph_key):
        """The vectorised mean rates and graph draw; the graph draw node by node by
        jax.random; and the draws of `structure_draws` for `strata`: node n's draw s of
        stratum P takes the other nodes' sets and the rates' key from the keys the docs name."""
        graphs = [
            jax.random.categorical(k, lp)
            for k, lp in zip(jax.random.split(graph_key, 3), post.log_posterior())
        ]
        indices, rate_keys = [], []
        for n, P, s in strata:
            k_graph, k_rates = jax.random.split(
                jax.random.split(jax.random.split(key, 3)[n], (3, 3))[P, s]
            )
            indices.append(post.sample_parent_sets(k_graph).at[n].set(P))
            rate_keys.append(k_rates)
        vectorised = (post.mean_rates_given(idx), post.sample_parent_sets(graph_key))
        return vectorised, graphs, indices, rate_keys

    (means, sampled_graph), graphs, indices, rate_keys = graphs_and_strata(post, key, graph_key)
    rates_given = eqx.filter_jit(lambda p, i, k: p.rates_given(i, k))  # one program, 4 calls
    drawn = rates_given(post, idx, key)
    for n, k in enumerate(cards):
        off = ~np.eye(k, dtype=bool)
        for model_, want in zip((means, drawn), rates[n]):
            np.testing.assert_allclose(
                np.asarray(model_.cims[n])[:, off], np.asarray(want)[:, off], rtol=1e-13
            )
    np.testing.assert_array_equal(sampled_graph, graphs)
    draws = structure_draws(post, key, 3)
    for (n, P, s), index, k_rates in zip(strata, indices, rate_keys):
        want = rates_given(post, index, k_rates)
        for m in range(3):
            np.testing.assert_allclose(draws.models[n].cims[m][P, s], want.cims[m], rtol=1e-13)
            np.testing.assert_array_equal(
                draws.models[n].parent_index[m][P, s], want.parent_index[m]
            )


def test_metrics_match_sklearn_with_ties():
    """`auroc` and `aupr` against sklearn on 40 random problems of two sizes, half with tied
    scores, and one with every score tied (vmapped over the problems of each size: one
    compilation per size)."""
    sklearn = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    problems = {7: [], 30: []}
    for trial in range(40):
        n = (7, 30)[trial % 2]
        labels = rng.integers(0, 2, n)
        if labels.min() == labels.max():
            labels[0] = 1 - labels[0]
        scores = rng.integers(0, 4, n) / 3 if trial % 4 < 2 else rng.uniform(size=n)
        problems[n].append((scores, labels))
    problems[7].append((np.full(7, 0.3), np.array([0, 1, 1, 0, 1, 0, 0])))  # all scores tied
    metrics = jax.jit(jax.vmap(lambda s, y: (auroc(s, y), aupr(s, y))))
    for n, batch in problems.items():
        scores, labels = (np.stack(a) for a in zip(*batch))
        roc, pr = metrics(scores, labels)
        for s, y, ours_roc, ours_pr in zip(scores, labels, roc, pr):
            np.testing.assert_allclose(ours_roc, sklearn.roc_auc_score(y, s), rtol=1e-12)
            np.testing.assert_allclose(ours_pr, sklearn.average_precision_score(y, s), rtol=1e-12)
        if n == 7:
            np.testing.assert_allclose(roc[-1], 0.5)  # the all-tied problem


def test_metrics_degenerate_cases_raise_instead_of_nan():
    scores = jnp.array([0.1, 0.5, 0.9])
    for labels in ([1, 1, 1], [0, 0, 0]):
        with pytest.raises(ValueError, match="AUROC needs at least one positive and one negative"):
            auroc(scores, jnp.array(labels))
        with pytest.raises(Exception, match="AUROC needs at least one positive and one negative"):
            jax.jit(auroc)(scores, jnp.array(labels))
    with pytest.raises(ValueError, match="AUPR needs at least one positive label"):
        aupr(scores, jnp.array([0, 0, 0]))
    with pytest.raises(Exception, match="AUPR needs at least one positive label"):
        jax.jit(jax.vmap(aupr))(scores[None], jnp.array([[0, 0, 0]]))
    np.testing.assert_allclose(aupr(scores, jnp.array([1, 1, 1])), 1.0)
    with pytest.raises(ValueError, match="same size"):
        auroc(scores, jnp.array([1, 0]))


def test_metrics_jit_inside_scan():
    truth = jnp.array([[0, 1, 0], [0, 0, 1], [1, 0, 0]])

    def step(carry, probs):
        return carry, (
            jc.experiments.edge_auroc(probs, truth),
            jc.experiments.edge_aupr(probs, truth),
            jc.experiments.structural_hamming_distance(probs > 0.5, truth),
        )

    probs = np.random.default_rng(0).uniform(size=(5, 3, 3))
    _, (roc, pr, shd) = jax.jit(lambda p: jax.lax.scan(step, 0, p))(jnp.asarray(probs))
    edge_auroc = jax.jit(jc.experiments.edge_auroc)  # one at a time, outside the scan
    for i in range(5):
        np.testing.assert_allclose(roc[i], edge_auroc(probs[i], truth))
    assert shd.shape == (5,)
    assert int(jc.experiments.structural_hamming_distance(truth, truth.T)) == 6


# ----------------------------------------------------------------------------- bad input
@pytest.mark.usefixtures("no_runtime_typecheck")
def test_learning_bad_input(getkey):
    cards, parents = (2, 2), ((), (0,))
    model = random_model(getkey(), cards, parents)
    with pytest.raises(ValueError, match="must be > 0"):
        jc.RatePosterior.for_model(model, prior=jc.GammaPrior(alpha=0.0))
    with pytest.raises(ValueError, match="must be > 0"):
        jc.RatePosterior.for_model(model, prior=jc.GammaPrior(beta=-1.0))
    with pytest.raises(ValueError, match="alpha: need a scalar or one value per node"):
        jc.RatePosterior.for_model(model, prior=jc.GammaPrior(alpha=jnp.ones(3)))
    with pytest.raises(ValueError, match="RatePosterior needs a GammaPrior"):
        jc.RatePosterior.for_model(model, prior=jc.NodelmanPrior())
    post = jc.RatePosterior.for_model(model)
    bad = [
        jc.internal.NodeStatistics(transitions=jnp.zeros((2, 2, 2)), dwell_times=jnp.zeros((2, 2)))
    ] * 2
    with pytest.raises(ValueError, match="shapes"):
        post.update(bad)
    neg = [
        jc.internal.NodeStatistics(transitions=jnp.zeros((1, 2, 2)), dwell_times=-jnp.ones((1, 2))),
        jc.internal.NodeStatistics(transitions=jnp.zeros((2, 2, 2)), dwell_times=jnp.ones((2, 2))),
    ]
    with pytest.raises(eqx.EquinoxRuntimeError, match="dwell times must be finite and >= 0"):
        post.update(neg).beta[0].block_until_ready()
    traj = sample(model, [0, 0], 1.0, key=getkey(), num_trajectories=2)
    with pytest.raises(ValueError, match="max_parents must be between 0 and 1"):
        jc.learn_structure(traj, model.names, cards, max_parents=2)
    with pytest.raises(ValueError, match="prior parameters must be > 0"):
        jc.learn_structure(traj, model.names, cards, max_parents=1, prior=jc.GammaPrior(-1.0))
    with pytest.raises(
        eqx.EquinoxRuntimeError, match="edge_prior: off-diagonal edge probabilities"
    ):
        jc.learn_structure(
            traj, model.names, cards, max_parents=1,
            knowledge=jc.PriorKnowledge(edge_prior=jnp.ones((2, 2))),
        )  # fmt: skip
    with pytest.raises(ValueError, match="beta: need a scalar or one value per node"):
        jc.learn_structure(
            traj, model.names, cards, max_parents=1, prior=jc.GammaPrior(1.0, jnp.ones(3))
        )
    with pytest.raises(ValueError, match="cardinalities"):
        jc.internal.family_statistics(traj, (2, 2, 2), candidate_parent_sets(3, 1))


def test_matmul_route_without_aggregation(getkey):
    # fewer path segments than global states: the products run on the raw segments
    cards = (2, 3, 2, 2, 3, 2)
    parents = ((1,), (0, 2), (), (4,), (3, 5), ())
    model = random_model(getkey(), cards, parents)
    traj = sample(model, [0, 1, 0, 1, 2, 0], 0.5, key=getkey(), num_trajectories=3, max_events=16)
    assert not bool(traj.truncated.any())
    assert 3 * (traj.max_events + 1) < np.prod(cards)
    sets = candidate_parent_sets(6, 2)

    @jax.jit
    def both_routes(traj):
        return (
            jc.internal.family_statistics(traj, cards, sets, method="scatter"),
            jc.internal.family_statistics(traj, cards, sets, method="matmul", chunk=64),
        )

    _assert_same_statistics(*both_routes(traj), atol=1e-10)


@pytest.mark.parametrize("chunk", [None, 7])
def test_jumps_route_equals_segment_routes(pooled4, chunk):
    """The sums by parts over the jumps (method='jumps') give the statistics of the per-segment
    routes: ternary and binary nodes, a perfect intervention (pooling), the default chunk and
    chunks that split a transition's jumps (chunk=7), under jit."""
    traj, sets, scatter = pooled4
    _assert_same_statistics(
        scatter, family_statistics(traj, CARDS4, sets, method="jumps", chunk=chunk)
    )


def test_jumps_route_many_nodes_and_auto_choice(getkey):
    """On 12 binary nodes (more global states than path segments, and the products over the
    jumps cheaper than those over the segments) the jumps route equals the matmul route, and
    `"auto"` picks it for such data."""
    from jaxctbn._learning.memory import _plan_family_statistics

    N = 12
    parents = tuple((n - 1,) if n % 3 else () for n in range(N))
    _, traj = _pooled(getkey(), (2,) * N, parents, {"X4": 1}, horizon=1.0, num=(6, 4))
    sets = candidate_parent_sets(N, 2)
    plan = lambda method: _plan_family_statistics(  # noqa: E731
        "test",
        traj,
        (2,) * N,
        [tuple(S.shape) for S in sets],
        method=method,
        chunk=None,
        names=None,
        budget=2**32,
    )
    assert plan("auto") == "jumps"
    matmul = family_statistics(traj, (2,) * N, sets, method="matmul")
    jumps = family_statistics(traj, (2,) * N, sets, method="jumps")
    _assert_same_statistics(matmul, jumps)


def test_jumps_route_refuses_what_it_cannot_sum(getkey):
    """Data the sums by parts do not cover raise under method='jumps' (a jump that changes two
    nodes at once; a node that moves in a path that records it as intervened on), and `"auto"`
    then takes a segment route with the right statistics; float32 times are refused."""
    cards, parents = (2, 2, 2), ((), (0,), (1,))
    # 40 intervened paths: the sampler's program of the pooling test above
    _, traj = _pooled(getkey(), cards, parents, {"X2": 1}, num=(12, 40))
    sets = candidate_parent_sets(3, 2)
    from jaxctbn._learning.memory import _plan_family_statistics

    plan = lambda t: _plan_family_statistics(  # noqa: E731
        "test",
        t,
        cards,
        [tuple(S.shape) for S in sets],
        method="auto",
        chunk=None,
        names=None,
        budget=2**32,
    )
    r = int(np.argmax(np.asarray(traj.num_events) >= 2))
    states = np.asarray(traj.states).copy()
    states[r, 0] = 1 - np.asarray(traj.initial_states)[r]  # first jump flips every node
    states[r, 1:] = states[r, 0]
    states[r, 1, 0] = 1 - states[r, 1, 0]
    two_at_once = eqx.tree_at(lambda t: t.states, traj, jnp.asarray(states))
    targets = np.asarray(traj.intervention_targets).copy()
    moving = int(np.argmax(np.asarray(traj.num_events[:12]) >= 1))
    targets[moving, 0] = True  # node 0 moves in this path: inconsistent with a perfect intervention
    held_but_moving = eqx.tree_at(lambda t: t.intervention_targets, traj, jnp.asarray(targets))
    for bad in (two_at_once, held_but_moving):
        with pytest.raises(eqx.EquinoxRuntimeError, match="method='jumps' needs each jump"):
            jax.block_until_ready(family_statistics(bad, cards, sets, method="jumps"))
        # "auto" on such concrete data plans a segment route, and that route is right
        assert plan(bad) != "jumps"
        _assert_same_statistics(
            family_statistics(bad, cards, sets, method="scatter"),
            family_statistics(bad, cards, sets, method=plan(bad)),
        )
    single = jax.tree_util.tree_map(
        lambda a: a.astype(jnp.float32) if a.dtype == jnp.float64 else a, traj
    )
    with pytest.raises(ValueError, match="method='jumps' needs float64"):
        jc.internal.family_statistics(single, cards, sets, method="jumps")
    with pytest.raises(ValueError, match="method must be"):
        jc.internal.family_statistics(traj, cards, sets, method="jump")
    with pytest.raises(ValueError, match="chunk must be a positive integer"):
        jc.internal.family_statistics(traj, cards, sets, method="jumps", chunk=0)


def test_path_log_likelihood_event_by_event(getkey):
    cards, parents = (2, 3), ((1,), ())
    model = random_model(getkey(), cards, parents)
    iv = jc.Intervention.perfect(model, {"X1": 2})
    t1 = sample(model, [0, 1], 2.0, key=getkey(), num_trajectories=4)
    t2 = sample(model, [1, 0], 2.0, key=getkey(), num_trajectories=2, intervention=iv)
    traj = _concatenate(t1, t2)

    @jax.jit
    def likelihood_and_gradient(model, traj):
        suff = jc.SufficientStatistics.from_trajectories(traj, cards, parents)
        ll, grad = jax.value_and_grad(jc.path_log_likelihood)(model, suff)
        return ll, grad, suff.pooled()

    ll, g, pooled = likelihood_and_gradient(model, traj)
    # reference: walk every path, log rate of each jump minus the integrated exit rate, skipping
    # the intervened node in the trajectories where it was clamped
    cims = [np.asarray(c) for c in model.cims]
    traj = jax.tree_util.tree_map(np.asarray, traj)
    ref = 0.0
    for r in range(6):
        skip = traj.intervention_targets[r]
        s = traj.initial_states[r].copy()
        t = 0.0
        n_ev = int(traj.num_events[r])
        times = list(traj.jump_times[r][:n_ev]) + [float(traj.durations[r])]
        for e, t_next in enumerate(times):
            for n in range(2):
                if skip[n]:
                    continue
                u = s[parents[n][0]] if parents[n] else 0
                ref -= (t_next - t) * -cims[n][u, s[n], s[n]]
            if e < n_ev:
                new = traj.states[r][e]
                (n,) = np.flatnonzero(new != s)
                if not skip[n]:
                    u = s[parents[n][0]] if parents[n] else 0
                    ref += np.log(cims[n][u, s[n], new[n]])
                s, t = new.copy(), t_next
    np.testing.assert_allclose(ll, ref, rtol=1e-10)
    # the gradient with respect to a rate is M / lambda - T (closed form)
    M, T = np.asarray(pooled[0].transitions), np.asarray(pooled[0].dwell_times)
    np.testing.assert_allclose(
        g.cims[0][1, 0, 1], M[1, 0, 1] / cims[0][1, 0, 1] - T[1, 0], rtol=1e-10
    )
