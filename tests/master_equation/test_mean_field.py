"""The mean-field expected statistics (jaxctbn.MeanField): exact where they must be, and the
approximation itself checked against an independent numpy/scipy implementation of its
equations."""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
from helpers import random_model

import jaxctbn as jc

NO_EDGES = ((2, 3, 2), ((), (), ()))


SETS = jnp.array([[-1, -1], [0, -1], [2, 0]])


@eqx.filter_jit
def _projections(model, init, iv, solver):
    """Every node's statistics on its own parents, on the empty set and on other nodes, and node
    1's on `SETS`, in one compiled program."""
    stats = jc.expected_statistics(model, init, 1.5, intervention=iv, solver=solver)
    out = []
    for n in range(model.num_nodes):
        others = tuple(m for m in range(model.num_nodes) if m != n)
        for P in (None, (), others, others[::-1], others[:1]):
            out += [stats.node_transitions(n, P), stats.node_dwell_times(n, P)]
    return out + list(stats.node_statistics_on_sets(1, SETS))


def test_no_edges_equals_exact(getkey):
    """Independent nodes: the product law is exact, so every projection (onto any parent set,
    under perfect and imperfect interventions, from a point mass or a product distribution)
    equals the exact solver's."""
    cards, parents = NO_EDGES
    model = random_model(getkey(), cards, parents)
    # both initial conditions as distributions over the global states, both interventions with
    # rate scales (ones for the perfect one): one program per solver serves both cases (the
    # integer initial state is the MeanField route of the other tests, against scipy)
    point = jnp.asarray(np.eye(12)[(0 * 3 + 2) * 2 + 1])  # the point mass at (0, 2, 1)
    marginals = [np.array([0.3, 0.7]), np.array([0.2, 0.5, 0.3]), np.array([1.0, 0.0])]
    product = jnp.asarray(np.einsum("a,b,c->abc", *marginals).reshape(-1))
    perfect = jc.Intervention.perfect(model, {"X1": 0}).with_rate_scales([1.0, 1.0, 1.0])
    imperfect = jc.Intervention.perfect(model, {}).with_rate_scales([2.0, 0.5, 1.0])
    for init, iv in [(point, perfect), (product, imperfect)]:
        exact = _projections(model, init, iv, jc.Uniformisation())
        mf = _projections(model, init, iv, jc.MeanField(rtol=1e-9, atol=1e-12))
        assert len(exact) == len(mf) == 32
        for a, b in zip(mf, exact):
            np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-9)


# ----------------------------------------------------------------------------- reference
def _reference(model, init_states, tau):
    """The mean-field equations solved by scipy, written from their definition: node marginals
    with parent configurations enumerated, projections integrated by adaptive quadrature."""
    cards, parents = model.cardinalities, model.parents
    cims = [np.asarray(c) for c in model.cims]
    offsets = np.cumsum([0, *cards])

    def split(y):
        return [y[offsets[n] : offsets[n + 1]] for n in range(len(cards))]

    def configs(nodes):
        return itertools.product(*(range(cards[p]) for p in nodes))

    def row(n, u):  # CIM row of node n for its parents' states u (first parent most significant)
        index = 0
        for p, s in zip(parents[n], u):
            index = index * cards[p] + s
        return cims[n][index] * (1 - np.eye(cards[n]))

    def rhs(t, y):
        mu = split(y)
        out = []
        for n in range(len(cards)):
            Q = sum(
                np.prod([mu[p][s] for p, s in zip(parents[n], u)]) * row(n, u)
                for u in configs(parents[n])
            )
            out.append(mu[n] @ Q - mu[n] * Q.sum(1))
        return np.concatenate(out)

    y0 = np.concatenate([np.eye(k)[s] for k, s in zip(cards, init_states)])
    sol = scipy.integrate.solve_ivp(
        rhs, (0, tau), y0, method="DOP853", rtol=1e-12, atol=1e-14, dense_output=True
    )

    def project(n, P):
        def integrand(t):
            mu = split(sol.sol(t))
            M = np.zeros((int(np.prod([cards[p] for p in P])), cards[n], cards[n]))
            T = np.zeros(M.shape[:2])
            for c, u in enumerate(configs(P)):
                occupancy = np.prod([mu[p][s] for p, s in zip(P, u)]) * mu[n]
                T[c] = occupancy
                fixed = dict(zip(P, u))
                for w in configs(parents[n]):
                    if any(fixed.get(p, s) != s for p, s in zip(parents[n], w)):
                        continue
                    weight = np.prod([mu[p][s] for p, s in zip(parents[n], w) if p not in fixed])
                    M[c] += weight * occupancy[:, None] * row(n, w)
            return np.concatenate([M.ravel(), T.ravel()])

        out, _ = scipy.integrate.quad_vec(integrand, 0, tau, epsabs=1e-13, epsrel=1e-11)
        size = int(np.prod([cards[p] for p in P])) * cards[n] ** 2
        k = cards[n]
        return out[:size].reshape(-1, k, k), out[size:].reshape(-1, k)

    return project, split(sol.y[:, -1])


def test_equals_a_scipy_solution_of_the_mean_field_equations(getkey):
    """With edges the mean-field statistics are an approximation; the implementation of that
    approximation equals an independent scipy solution of its equations (parents inside and
    outside the projected set, a ternary node, a node with two parents)."""
    cards, parents = (2, 3, 2, 2), ((), (0,), (0, 1), (2,))
    model = random_model(getkey(), cards, parents)
    init = (1, 0, 0, 1)
    project, final = _reference(model, init, 2.0)
    solver = jc.MeanField(rtol=1e-11, atol=1e-13, panels=64, points=6)
    cases = [(1, (0,)), (2, (0, 1)), (2, (1,)), (2, (3,)), (3, ()), (3, (1, 0)), (0, (2,))]

    @jax.jit
    def ours(model):
        mf = jc.expected_statistics(model, jnp.array(init), 2.0, solver=solver)
        exact = jc.expected_statistics(model, jnp.array(init), 2.0)
        stats = [(mf.node_transitions(n, P), mf.node_dwell_times(n, P)) for n, P in cases]
        compare = [
            (s.node_dwell_times(n), s.node_dwell_times(0)) for s in (mf, exact) for n in (2,)
        ]
        return stats, mf.final_marginals, compare

    stats, final_ours, compare = ours(model)
    for (n, P), (M_ours, T_ours) in zip(cases, stats):
        M, T = project(n, P)
        np.testing.assert_allclose(M_ours, M, rtol=1e-8, atol=1e-11)
        np.testing.assert_allclose(T_ours, T, rtol=1e-8, atol=1e-11)
    for n, k in enumerate(cards):
        np.testing.assert_allclose(final_ours[n, :k], final[n], rtol=1e-8, atol=1e-11)
    # the approximation differs from the exact statistics where a node has parents, and equals
    # them for the root
    (mf_child, mf_root), (exact_child, exact_root) = compare
    assert np.abs(exact_child - mf_child).max() > 1e-4
    np.testing.assert_allclose(mf_root, exact_root, rtol=1e-8)


def test_padded_models_and_vmap_over_graphs(getkey):
    """A batch of padded models with different graphs gives, member by member, the statistics of
    the corresponding CTBN."""
    cards = (2, 2, 3)
    graphs = [((), (0,), (0, 1)), ((1,), (), ()), ((2,), (2, 0), ())]
    models = [random_model(getkey(), cards, g) for g in graphs]
    padded = [jc.PaddedCTBN.from_ctbn(m, max_parents=2) for m in models]
    batch = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *padded)
    init = jnp.broadcast_to(jnp.array([0, 1, 2]), (3, 3))
    sets = jnp.array([[-1, -1], [0, -1], [1, 0]])
    own_sets = [(), (0,), (1, 0)]

    @jax.jit
    def batched(batch):
        stats = jc.expected_statistics_batch(batch, init, 1.0, solver=jc.MeanField())
        own = [jax.vmap(lambda s, n=n: s.node_transitions(n))(stats) for n in range(3)]
        return own, jax.vmap(lambda s: s.node_statistics_on_sets(2, sets))(stats)

    @jax.jit
    def single(model, x):
        one = jc.expected_statistics(model, x, 1.0, solver=jc.MeanField())
        own = [one.node_transitions(n) for n in range(3)]
        return own, [(one.node_transitions(2, P), one.node_dwell_times(2, P)) for P in own_sets]

    own_batch, (M_all, T_all) = jax.tree_util.tree_map(np.asarray, batched(batch))
    for i, model in enumerate(models):
        own, on_sets = jax.tree_util.tree_map(np.asarray, single(model, init[i]))
        for n in range(3):
            rows = own[n].shape[0]
            np.testing.assert_allclose(own_batch[n][i, :rows], own[n], rtol=1e-10, atol=1e-12)
        for s, (M, T) in enumerate(on_sets):
            rows = T.shape[0]
            np.testing.assert_allclose(T_all[i, s, :rows], T, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(M_all[i, s, :rows], M, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(T_all[i, s, rows:], 0.0)


def test_projections_vectorised_over_nodes_equal_one_node_at_a_time(getkey):
    """`nodes_statistics_on_sets` (one vmap over the nodes, CIM rows and parent slots padded)
    equals the interface's default, one `node_statistics_on_sets` per node, for a CTBN whose
    nodes have different numbers of parents (CIM tables of different lengths) and for a padded
    model, and for a group of one ternary node."""
    cards = (2, 2, 2, 2, 3)
    graph = ((), (0,), (0, 1), (2,), (3,))
    model = random_model(getkey(), cards, graph)
    sets = jnp.array([[[-1, -1], [4, -1], [2, 0]], [[4, 2], [0, -1], [-1, -1]]])
    init = jnp.array([0, 1, 0, 1, 2])
    groups = [((1, 3), sets), ((3, 1), sets), ((4,), jnp.array([[[0, 1], [3, -1]]]))]

    @eqx.filter_jit
    def both_ways(m):  # one compiled program per model (eagerly: hundreds of small ones)
        stats = jc.expected_statistics(m, init, 1.0, solver=jc.MeanField())
        fast = [stats.nodes_statistics_on_sets(nodes, on) for nodes, on in groups]
        slow = [
            jc.AbstractExpectedStatistics.nodes_statistics_on_sets(stats, nodes, on)
            for nodes, on in groups
        ]
        return fast, slow

    for m in (model, jc.PaddedCTBN.from_ctbn(model, max_parents=2)):
        for fast, slow in zip(*both_ways(m)):
            for a, b in zip(fast, slow):
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_gradient_equals_finite_differences(getkey):
    cards, parents = (2, 2, 2), ((), (0,), (1,))
    model = random_model(getkey(), cards, parents)
    solver = jc.MeanField(rtol=1e-12, atol=1e-14)

    def loss(cims):
        m = eqx.tree_at(lambda m: m.cims, model, cims)
        st = jc.expected_statistics(m, jnp.array([0, 1, 0]), 1.3, solver=solver)
        return (st.node_transitions(2, (0,)) ** 2).sum() + (st.node_dwell_times(1) ** 3).sum()

    grad = jax.jit(jax.grad(loss))(model.cims)
    loss = jax.jit(loss)
    eps = 1e-6
    cims = [np.asarray(c) for c in model.cims]
    for n, u, x, y in [(0, 0, 0, 1), (1, 1, 1, 0), (2, 0, 0, 1), (2, 1, 1, 0)]:
        step = np.zeros_like(cims[n])
        step[u, x, y] = eps
        up = tuple(c + step if i == n else c for i, c in enumerate(cims))
        down = tuple(c - step if i == n else c for i, c in enumerate(cims))
        fd = (loss(up) - loss(down)) / (2 * eps)
        np.testing.assert_allclose(grad[n][u, x, y], fd, rtol=1e-6, atol=1e-9)


def test_parameter_scores_on_a_network_without_edges_equal_exact(getkey):
    """The criteria take the mean-field statistics unchanged: where they are exact, so are the
    scores."""
    cards, parents = NO_EDGES
    truth = random_model(getkey(), cards, parents)
    post = jc.RatePosterior.for_model(truth, prior=jc.GammaPrior(1.0, 1.0))
    space = jc.intervention_space(cards)
    init, key = jnp.array([0, 1, 0]), getkey()
    exact = jc.score_interventions(post, space, init, 2.0, key=key, num_samples=4)
    mf = jc.score_interventions(
        post, space, init, 2.0, key=key, num_samples=4, solver=jc.MeanField(rtol=1e-9, atol=1e-12)
    )
    np.testing.assert_allclose(mf, exact, rtol=1e-6, atol=1e-9)


def test_a_network_too_large_for_the_global_state_space(getkey):
    """N = 40 binary nodes (2^40 global states) in a chain: the root's statistics equal the
    exact solution of the root alone, every node's marginals stay distributions, dwell times
    add up to the horizon."""
    N = 40
    parents = ((),) + tuple((n - 1,) for n in range(1, N))
    model = random_model(getkey(), (2,) * N, parents)
    init = jnp.zeros(N, jnp.int32)
    solver = jc.MeanField(rtol=1e-9, atol=1e-12)
    nodes = range(0, N, 7)

    @jax.jit
    def run(model):
        stats = jc.expected_statistics(model, init, 2.0, solver=solver)
        root = jc.CTBN(cims=[model.cims[0]], parents=((),))
        exact = jc.expected_statistics(root, jnp.array([0]), 2.0)
        dwell = [stats.node_dwell_times(n) for n in nodes]
        return dwell, exact.node_dwell_times(0), stats.final_marginals

    dwell, exact_root, final = run(model)
    np.testing.assert_allclose(dwell[0], exact_root, rtol=1e-8)
    np.testing.assert_allclose(final.sum(1), 1.0, rtol=1e-9)
    assert float(final.min()) >= 0.0
    np.testing.assert_allclose([float(T.sum()) for T in dwell], 2.0, rtol=1e-9)


def test_bad_input():
    with pytest.raises(ValueError, match="panels"):
        jc.MeanField(panels=0)
    model = jc.CTBN(cims=[jnp.ones((1, 2, 2))], parents=((),))
    with pytest.raises(ValueError, match="initial_state"):
        jc.expected_statistics(model, jnp.array([0, 1]), 1.0, solver=jc.MeanField())
    with pytest.raises(Exception, match="horizon"):
        jc.expected_statistics(model, jnp.array([0]), -1.0, solver=jc.MeanField())
    with pytest.raises(Exception, match="initial_state"):
        jc.expected_statistics(model, jnp.array([2]), 1.0, solver=jc.MeanField())
