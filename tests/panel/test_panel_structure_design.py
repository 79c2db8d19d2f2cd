"""Structure design with panel outcomes (maths §7): the coupled divergences against brute-force
enumeration of the outcome sequences (scipy `expm`), the coupling itself (a node whose parent set
is unchanged keeps its rates), the EIG against an independent numpy computation of $I(G;Y)$ by
enumerating the graphs and the outcomes with high-sample averages over the rates, the order
EIG <= VBHC <= BHC with coupled rates (the bound), the plug-in's divergences at the
posterior-mean rates against enumeration, and the visit-time search never below equal
spacing."""

import functools
import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from helpers import brute_force_panel_kl, sample_trajectories_jit

import jaxctbn as jc
from jaxctbn._criteria.panel_structure import panel_structure_divergences, panel_structure_draws

jax.config.update("jax_enable_x64", True)

NAMES, CARDS = ("A", "B"), (2, 2)
PRIOR = jc.GammaPrior(2.0, 1.0)
START = jnp.array([0, 0])
TIMES = jnp.array([0.7, 2.0])
# none, do(A=1)
CANDIDATES = jc.Intervention(
    targets=jnp.array([[False, False], [True, False]]),
    states=jnp.array([[0, 0], [1, 0]]),
)


@functools.cache
def _posterior() -> jc.StructurePosterior:
    """A posterior that is unsure about the graph: B's rates learned with A clamped to 0 (which
    cannot tell whether A is B's parent: both sets score the same), A's parents unknown."""
    truth = jc.CTBN(
        cims=[
            jnp.array([[[-1.0, 1.0], [1.0, -1.0]]]),
            jnp.array([[[-0.2, 0.2], [2.0, -2.0]], [[-2.0, 2.0], [0.2, -0.2]]]),
        ],
        parents=((), (0,)),
        names=NAMES,
    )
    do_a0 = jc.Intervention.perfect(truth, {"A": 0})
    paths = sample_trajectories_jit(  # (one program; eagerly: one per operation)
        truth, START, 5.0, key=jr.key(0), num_trajectories=4, intervention=do_a0
    )
    prior = eqx.filter_jit(jc.StructurePosterior.from_prior)(
        NAMES, CARDS, max_parents=1, prior=PRIOR
    )
    return _update(prior, _family_statistics(paths, CARDS, prior.parent_sets))


# one compiled program each (eagerly, one per operation: ~7 s for the prior and the statistics)
_family_statistics = eqx.filter_jit(jc.internal.family_statistics)
_update = eqx.filter_jit(lambda posterior, statistics: posterior.update(statistics))


def _unbatch(tree, *index):
    return jax.tree_util.tree_map(lambda x: x[index], tree)


def _as_ctbn(padded, posterior, indices):
    sets = [
        tuple(int(p) for p in np.asarray(posterior.parent_sets[n][i]) if p >= 0)
        for n, i in enumerate(np.asarray(indices))
    ]
    cims = [np.asarray(padded.cims[n])[: 2 ** len(sets[n])] for n in range(2)]
    return jc.CTBN(cims=[jnp.asarray(c) for c in cims], parents=tuple(sets), names=NAMES)


@pytest.mark.slow
def test_coupled_divergences_are_exact_panel_kls_and_zero_for_the_same_graph():
    post = _posterior()
    draws = panel_structure_draws(post, jr.key(1), 6, coupled=True)
    D = np.asarray(jax.jit(panel_structure_divergences)(draws, START, TIMES, None))
    idx, alt = np.asarray(draws.indices), np.asarray(draws.alternative_indices)
    same = (idx[:, None, :] == alt[None, :, :]).all(-1)
    assert same.any() and (~same).any()
    np.testing.assert_allclose(D[same], 0.0, atol=1e-12)
    checked = 0
    for s, t in itertools.product(range(6), range(6)):
        if same[s, t] or checked >= 4:
            continue
        model = _as_ctbn(_unbatch(draws.models, s), post, idx[s])
        other = _as_ctbn(_unbatch(draws.alternatives, s, t), post, alt[t])
        # the coupling: a node whose parent set is the same in both keeps its rates
        for n in range(2):
            if idx[s, n] == alt[t, n]:
                np.testing.assert_array_equal(model.cims[n], other.cims[n])
        want = brute_force_panel_kl(model, other, START, TIMES)
        np.testing.assert_allclose(D[s, t], want, rtol=1e-9, atol=1e-13)
        checked += 1
    assert checked == 4


def test_plug_in_divergences_compare_the_graphs_at_their_posterior_mean_rates():
    post = _posterior()
    # one program each (eagerly, one per operation)
    draws = eqx.filter_jit(panel_structure_draws)(post, jr.key(1), 4, coupled=False)
    D = np.asarray(jax.jit(panel_structure_divergences)(draws, START, TIMES, None))
    idx, alt = np.asarray(draws.indices), np.asarray(draws.alternative_indices)
    mean_rates_given = eqx.filter_jit(lambda post, graph: post.mean_rates_given(graph))
    for s, t in itertools.product(range(4), range(4)):
        model = _as_ctbn(mean_rates_given(post, jnp.asarray(idx[s])), post, idx[s])
        other = _as_ctbn(mean_rates_given(post, jnp.asarray(alt[t])), post, alt[t])
        want = brute_force_panel_kl(model, other, START, TIMES)
        np.testing.assert_allclose(D[s, t], want, rtol=1e-9, atol=1e-13)
        if (idx[s] == alt[t]).all():
            assert D[s, t] == 0.0


def _numpy_transitions(post, graph, clamp, times, num_rates, rng):
    """Per visit, the transition matrices `(num_rates, 4, 4)` of `num_rates` numpy Gamma draws
    of the rates given the graph (a parent-set index per node) and the history, under the
    clamped nodes `clamp`, by numpy's batched eigendecomposition of the generators."""
    alpha, beta = float(PRIOR.alpha), float(PRIOR.beta)
    cims = []
    for n, i in enumerate(graph):
        parents = [int(p) for p in np.asarray(post.parent_sets[n][i]) if p >= 0]
        U = 2 ** len(parents)
        M = np.asarray(post.statistics.transitions[n][i])[:U]  # (U, 2, 2)
        T = np.asarray(post.statistics.dwell_times[n][i])[:U]  # (U, 2)
        up = rng.gamma(alpha + M[:, 0, 1], 1 / (beta + T[:, 0]), size=(num_rates, U))
        down = rng.gamma(alpha + M[:, 1, 0], 1 / (beta + T[:, 1]), size=(num_rates, U))
        cims.append((up, down, parents))
    W = np.zeros((num_rates, 4, 4))
    for a, b in itertools.product(range(2), range(2)):
        s = a * 2 + b
        for n, (up, down, parents) in enumerate(cims):
            if clamp[n]:
                continue
            u = (a, b)[parents[0]] if parents else 0
            rate = (up if (a, b)[n] == 0 else down)[:, u]
            t = (1 - a) * 2 + b if n == 0 else a * 2 + (1 - b)
            W[:, s, t] += rate
            W[:, s, s] -= rate
    lam, V = np.linalg.eig(W)  # random rates give distinct eigenvalues
    Vinv = np.linalg.inv(V)
    gaps = np.diff(np.concatenate([[0.0], np.asarray(times)]))
    return [np.real(np.einsum("rij,rj,rjk->rik", V, np.exp(h * lam), Vinv)) for h in gaps]


def _graphs(post):
    """Every graph (a parent-set index per node) and its posterior probability."""
    log_post = [np.asarray(lp) for lp in post.log_posterior()]
    graphs = list(itertools.product(*(range(len(lp)) for lp in log_post)))
    return graphs, np.array([np.exp(sum(lp[i] for lp, i in zip(log_post, g))) for g in graphs])


def _numpy_structure_eig(post, intervention, times, num_rates=20_000, seed=0):
    """I(G; Y) by enumeration: every graph (4), every outcome sequence (4^K), p(Y | G) averaged
    over `num_rates` numpy Gamma draws of the rates given G."""
    rng = np.random.default_rng(seed)
    clamp = np.asarray(intervention.targets)
    start = np.where(clamp, np.asarray(intervention.states), np.asarray(START))
    s0 = int(start[0] * 2 + start[1])
    graphs, weights = _graphs(post)
    laws = []
    for graph in graphs:
        P = _numpy_transitions(post, graph, clamp, times, num_rates, rng)
        probs = []
        for ys in itertools.product(range(4), repeat=len(P)):
            p, prev = np.ones(num_rates), s0
            for k, y in enumerate(ys):
                p, prev = p * P[k][:, prev, y], y
            probs.append(p.mean())
        laws.append(np.array(probs))
    laws = np.array(laws)
    marginal = weights @ laws
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(laws > 0, laws * np.log(laws / marginal), 0.0)
    return float(weights @ terms.sum(1))


def test_structure_eig_against_enumeration_and_the_bounds_above_it():
    post = _posterior()
    outcome = jc.PanelOutcome(TIMES)
    score = jax.jit(
        lambda criterion, n: jc.score_interventions(
            post,
            CANDIDATES,
            START,
            3.0,
            criterion=criterion,
            key=jr.key(2),
            num_samples=n,
            outcome=outcome,
            batching=jc.Vmap(),
        ),
        static_argnums=(0, 1),
    )
    eig = np.asarray(score(jc.EIG(num_paths=20, num_inner=300), 400))
    # the BHC and the VBHC in one program (they share their coupled divergences)
    bhc, vbhc = (
        np.asarray(x)
        for x in jax.jit(
            lambda: (
                score(jc.BHC(estimator=jc.RateCoupling()), 60),
                score(jc.VBHC(estimator=jc.RateCoupling()), 60),
            )
        )()
    )
    for c in range(2):
        iv = _unbatch(CANDIDATES, c)
        exact = _numpy_structure_eig(post, iv, TIMES)
        # 0.072 and 0.177 nats; the nested Monte Carlo estimate's standard deviation at this
        # size is about 0.005 and 0.01 (measured over six keys)
        assert exact > 0.05
        assert abs(eig[c] - exact) < 0.15 * exact + 0.005, (c, eig[c], exact)
        assert bhc[c] >= vbhc[c] >= exact, (c, bhc[c], vbhc[c], exact)


@pytest.mark.slow
def test_structure_visit_times_never_below_equal_spacing():
    post = _posterior()
    design = jax.jit(
        lambda: jc.score_interventions(
            post,
            CANDIDATES,
            START,
            3.0,
            outcome=jc.PanelOutcome(num_visits=2, steps=10),
            criterion=jc.VBHC(),
            key=jr.key(3),
            num_samples=8,
        )
    )()
    scores, equal = np.asarray(design.scores), np.asarray(design.equally_spaced_scores)
    assert np.all(scores >= equal) and np.all(np.isfinite(scores))
    times = np.asarray(design.times)
    assert np.all(np.diff(times, axis=1) > 0) and np.all((times > 0) & (times <= 3.0 + 1e-9))
    # the score at the chosen times is the criterion at those times
    again = jc.score_interventions(
        post,
        _unbatch(CANDIDATES, slice(0, 1)),
        START,
        3.0,
        criterion=jc.VBHC(),
        key=jr.key(3),
        num_samples=8,
        outcome=jc.PanelOutcome(jnp.asarray(times[0])),
    )
    np.testing.assert_allclose(float(again[0]), scores[0], rtol=1e-10)


def test_panel_structure_posteriors_against_the_exact_graph_posterior():
    # three panels of a free experiment (A moves, so B's dependence on A shows) seen at 0.7 and
    # 2.0; the exact p(G | H, Y) ∝ p(G | H) E[prod_r p(Y_r | G, rates) | G, H] with 40,000
    # numpy draws of the rates per graph, against structural EM from the history and the
    # sampled structure posterior (Gibbs over graph, rates and paths, Rao-Blackwellised)
    post = _posterior()
    truth = jc.CTBN(
        cims=[
            jnp.array([[[-1.0, 1.0], [1.0, -1.0]]]),
            jnp.array([[[-0.2, 0.2], [2.0, -2.0]], [[-2.0, 2.0], [0.2, -0.2]]]),
        ],
        parents=((), (0,)),
        names=NAMES,
    )
    paths = sample_trajectories_jit(truth, START, 2.0, key=jr.key(5), num_trajectories=3)
    grid = jnp.concatenate([jnp.zeros(1), TIMES])
    observations = jc.panel.PanelObservations.from_paths(paths, grid)
    got = np.asarray(
        jax.jit(  # (one program with the marginals; eagerly: one per operation)
            lambda p, o: jc.panel.panel_structure_posterior(
                p, o, family=jc.panel.StructuralEM()
            ).edge_marginals()
        )(post, observations)
    )
    family = jc.panel.SampledStructure(num_sweeps=300, burn_in=50, min_ess=50.0)
    mixture = jc.panel.panel_structure_posterior(post, observations, family=family, key=jr.key(0))

    @eqx.filter_jit  # one program for both samplers' mixtures (eagerly: one per operation)
    def summary(m):
        d = m.diagnostics
        return m.edge_marginals(), d.max_split_r_hat(), d.edge_draws.mean((0, 1))

    sampled, r_hat, edge_frequencies = (np.asarray(x) for x in summary(mixture))
    ys = np.asarray(observations.states)[:, 1:] @ np.array([2, 1])  # global states at the visits
    rng = np.random.default_rng(1)
    graphs, weights = _graphs(post)
    evidence = []
    for graph in graphs:
        P = _numpy_transitions(post, graph, np.zeros(2, bool), TIMES, 40_000, rng)
        like = np.ones(40_000)
        for y in ys:
            prev = 0
            for k, state in enumerate(y):
                like, prev = like * P[k][:, prev, state], state
        evidence.append(like.mean())
    exact = weights * np.array(evidence)
    exact /= exact.sum()
    edges = np.zeros((2, 2))
    for graph, w in zip(graphs, exact):
        for n, i in enumerate(graph):
            for p in np.asarray(post.parent_sets[n][i]):
                if p >= 0:
                    edges[p, n] += w
    print("exact", edges[0, 1], edges[1, 0], "structural EM", got[0, 1], got[1, 0])
    print("sampled", sampled[0, 1], sampled[1, 0])
    # the data speak: B's parent A gains (0.5 before) and structural EM follows, but
    # overconfidently (measured: exact 0.84, structural EM 0.99; the imputation under the MAP
    # graph favours that graph, maths §7)
    assert edges[0, 1] > 0.7 and got[0, 1] > edges[0, 1], (edges, got)
    assert got[0, 1] - edges[0, 1] < 0.2, (edges, got)
    np.testing.assert_allclose(got[1, 0], edges[1, 0], atol=0.15)
    # the sampled posterior is exact in the limit: within the 0.05 of the exact edges
    # (measured: 0.834 and 0.502 against 0.84 and 0.50), converged chains
    np.testing.assert_allclose(sampled, edges, atol=0.05)
    assert mixture.diagnostics is not None and float(r_hat) < 1.05
    assert mixture.num_components == 4 * 300
    # the Rao-Blackwellised marginals agree with the frequencies of the sampled graphs
    np.testing.assert_allclose(edge_frequencies, sampled, atol=0.06)
    # the same sampler with node-by-node Gibbs updates of the paths (for networks beyond exact
    # forward-backward): exact in the limit as well (measured: 0.852 and 0.502)
    gibbs = jc.panel.SampledStructure(
        num_sweeps=300, burn_in=50, min_ess=50.0, path_sampler=jc.panel.GibbsSampler()
    )
    by_gibbs = jc.panel.panel_structure_posterior(post, observations, family=gibbs, key=jr.key(0))
    assert by_gibbs.diagnostics is not None
    gibbs_edges, gibbs_r_hat, _ = summary(by_gibbs)
    np.testing.assert_allclose(np.asarray(gibbs_edges), edges, atol=0.05)
    assert float(gibbs_r_hat) < 1.05
    # the sequential loop's family, the particle filter, fed one trajectory at a time: exact in
    # the limit too (measured over six keys at 1,000 particles: 0.828-0.867 and 0.486-0.507)
    filter_family = jc.panel.StructureParticleFilter(num_particles=1000)
    update = jax.jit(
        lambda p, o, k: jc.panel.panel_structure_posterior(p, o, family=filter_family, key=k)
    )
    particles = filter_family.initial(post)
    for r, k in enumerate(jr.split(jr.key(0), 3)):
        particles = update(particles, _unbatch(observations, slice(r, r + 1)), k)
    assert isinstance(particles, jc.StructureMixturePosterior)
    filtered = eqx.filter_jit(lambda p: p.edge_marginals())(particles)  # (one program)
    np.testing.assert_allclose(np.asarray(filtered), edges, atol=0.05)


@functools.cache
def _mixture():
    """A structure posterior that is a mixture of two components that disagree: `_posterior()`
    (A's parents unknown, B's undecided) with weight 0.3 and the same history plus four free
    trajectories (which favour A -> B) with weight 0.7."""
    first = _posterior()
    truth = jc.CTBN(
        cims=[
            jnp.array([[[-1.0, 1.0], [1.0, -1.0]]]),
            jnp.array([[[-0.2, 0.2], [2.0, -2.0]], [[-2.0, 2.0], [0.2, -0.2]]]),
        ],
        parents=((), (0,)),
        names=NAMES,
    )
    # the same shapes as `_posterior`'s draw (one compiled sampler): four free trajectories
    free = jc.Intervention.perfect(truth, {})
    paths = sample_trajectories_jit(
        truth, START, 5.0, key=jr.key(7), num_trajectories=4, intervention=free
    )
    second = _update(first, _family_statistics(paths, CARDS, first.parent_sets))
    components = eqx.filter_jit(
        lambda a, b: jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), a, b)
    )(first, second)
    return jc.StructureMixturePosterior(components, jnp.log(jnp.array([0.3, 0.7]))), (
        (0.3, first),
        (0.7, second),
    )


def _numpy_mixture_structure_eig(parts, intervention, times, num_rates=20_000, seed=0):
    """I(G; Y) under a mixture of structure posteriors by enumeration: p(G) = sum_c w_c p_c(G),
    p(Y | G) = sum_c p(c | G) E_c[p(Y | G, rates)], the inner means over `num_rates` numpy
    Gamma draws of the rates given G from component c."""
    rng = np.random.default_rng(seed)
    clamp = np.asarray(intervention.targets)
    start = np.where(clamp, np.asarray(intervention.states), np.asarray(START))
    s0 = int(start[0] * 2 + start[1])
    per_component = [(w, *_graphs(post)) for w, post in parts]
    graphs = per_component[0][1]
    joint = np.array([[w * p for p in probs] for w, _, probs in per_component])  # (C, G)
    weights = joint.sum(0)
    laws = []
    for g, graph in enumerate(graphs):
        law = 0.0
        for c, (_, post) in enumerate(parts):
            P = _numpy_transitions(post, graph, clamp, times, num_rates, rng)
            probs = []
            for ys in itertools.product(range(4), repeat=len(P)):
                p, prev = np.ones(num_rates), s0
                for k, y in enumerate(ys):
                    p, prev = p * P[k][:, prev, y], y
                probs.append(p.mean())
            law = law + joint[c, g] / weights[g] * np.array(probs)
        laws.append(law)
    laws = np.array(laws)
    marginal = weights @ laws
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(laws > 0, laws * np.log(laws / marginal), 0.0)
    return float(weights @ terms.sum(1)), graphs, weights


def test_structure_criteria_under_a_mixture_against_enumeration():
    # what panels leave (a StructureMixturePosterior) scored by the panel structure criteria:
    # the graph draws follow the mixture's p(G), the rates given G its p(c | G)-weighted
    # components, and the EIG agrees with I(G; Y) by enumeration over graphs and outcomes,
    # with EIG <= VBHC <= BHC for the coupled bound
    mixture, parts = _mixture()
    exact, graphs, weights = _numpy_mixture_structure_eig(parts, _unbatch(CANDIDATES, 1), TIMES)
    graph = jnp.asarray(graphs[int(np.argmax(weights))])

    @eqx.filter_jit  # one program (eagerly: one per operation)
    def library(mixture, components, graphs, graph):
        return (
            jax.vmap(mixture.graph_log_probability)(graphs),
            mixture.systematic_parent_sets(jr.key(0), 4000),
            [p.log_posterior() for p in components],
            mixture.mean_rates_given(graph).cims,
            [p.mean_rates_given(graph).cims for p in components],
            jax.vmap(lambda k: mixture.rates_given(graph, k).cims)(jr.split(jr.key(1), 4000)),
        )

    log_p, draws, log_posteriors, mean, means, drawn = library(
        mixture, [p for _, p in parts], jnp.asarray(graphs), graph
    )
    # p(G) of the mixture, and the systematic draws' frequencies (4,000 draws)
    np.testing.assert_allclose(np.exp(log_p), weights, rtol=1e-12)
    draws = np.asarray(draws)
    freq = [np.mean((draws == np.asarray(g)).all(1)) for g in graphs]
    np.testing.assert_allclose(freq, weights, atol=0.02)
    # the posterior-mean rates given a graph: the p(c | G)-weighted components' means, and the
    # average of rate draws given it
    joint = np.array(
        [
            w * np.exp(float(lp[0][graph[0]] + lp[1][graph[1]]))
            for (w, _), lp in zip(parts, log_posteriors)
        ]
    )
    given = joint / joint.sum()
    for n in range(2):
        expected = sum(g * np.asarray(m[n]) for g, m in zip(given, means))
        np.testing.assert_allclose(mean[n], expected, rtol=1e-12)
        np.testing.assert_allclose(np.mean(np.asarray(drawn[n]), 0), expected, rtol=0.05, atol=0.01)

    @eqx.filter_jit
    def score(posterior, criterion, n):
        return jc.score_interventions(
            posterior,
            _unbatch(CANDIDATES, slice(1, 2)),
            START,
            3.0,
            criterion=criterion,
            key=jr.key(2),
            num_samples=n,
            outcome=jc.PanelOutcome(TIMES),
            batching=jc.Vmap(),
        )[0]

    eig = float(score(mixture, jc.EIG(num_paths=20, num_inner=300), 400))
    # the BHC and the VBHC in one program (they share their coupled divergences)
    bhc, vbhc = (
        float(x)
        for x in eqx.filter_jit(
            lambda m: (
                score(m, jc.BHC(estimator=jc.RateCoupling()), 60),
                score(m, jc.VBHC(estimator=jc.RateCoupling()), 60),
            )
        )(mixture)
    )
    print("exact", exact, "eig", eig, "vbhc", vbhc, "bhc", bhc)
    # 0.1906 nats (0.1910 with other numpy draws); the nested Monte Carlo estimate over five
    # keys: 0.166-0.221, mean 0.199 (the component draws add variance to a single
    # posterior's, whose estimates spread by about 0.005)
    assert exact > 0.05
    assert abs(eig - exact) < 0.25 * exact + 0.005, (eig, exact)
    assert bhc >= vbhc >= exact, (bhc, vbhc, exact)
