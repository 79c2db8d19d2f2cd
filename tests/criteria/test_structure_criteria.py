"""The structure design criteria: divergences $a_n(P')$, (V)BHC, EIG, the graph-draw schemes, the
priors' predictive likelihoods, and the scoring verb for a StructurePosterior.

Compilation is most of these tests' time, so each network is learned once per module (the
fixtures `bin3`, `nodelman`, `mixed`) and every test uses its fixture's draws: N_S =
`NUM_SAMPLES` posterior draws per candidate set from one compiled `structure_draws` per network
(tests that need more draws call it several times and concatenate the independent batches),
the initial state and the horizon are arrays (not static), and "no intervention" is
`Intervention.none` (the same pytree structure as a perfect one). `structure_divergences`,
`structure_draws` and the scoring verb then compile once per network and configuration."""

import functools
import itertools
import types

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import scipy.stats
from helpers import random_model

import jaxctbn as jc
from jaxctbn._criteria.node_divergences import StructureDraws, predictive_log_likelihood
from jaxctbn._criteria.structure import (
    joint_structure_draws,
    structure_bhc,
    structure_divergences,
    structure_draws,
    structure_eig,
    structure_vbhc_minimise,
    structure_vbhc_minimum,
)

NUM_SAMPLES = 3
HORIZON = jnp.asarray(2.0)
#: name: (cardinalities, parents of the true graph, prior, initial state)
NETWORKS = {
    # three binary nodes (parent sets of two nodes, clamp patterns over two other nodes)
    "bin3": ((2, 2, 2), ((), (0,), (1,)), jc.GammaPrior(), (1, 0, 1)),
    # three states, so the Dirichlet part of the Nodelman score is not trivial; two nodes of
    # equal shapes are drawn together (one rate sampler: the cheapest Nodelman program)
    "nodelman": ((3, 3), ((), (0,)), jc.NodelmanPrior(2.0, 1.0), (2, 1)),
    # two nodes of different cardinality (relabelling; the Monte Carlo estimator and the EIG)
    "mixed": ((2, 3), ((1,), ()), jc.GammaPrior(), (1, 2)),
}


@eqx.filter_jit
def _truth_and_paths(key, cards, parents, horizon, num_paths=3):
    k1, k2 = jr.split(key)
    truth = random_model(k1, cards, parents)
    init = jnp.zeros(len(cards), jnp.int32)
    return truth, jc.sample_trajectories(truth, init, horizon, key=k2, num_trajectories=num_paths)


def _network(name, seed, horizon=2.0):
    cards, parents, prior, init = NETWORKS[name]
    truth, traj = _truth_and_paths(jr.key(seed), cards, parents, jnp.asarray(horizon))
    post = jc.learn_structure(traj, truth.names, cards, max_parents=len(cards) - 1, prior=prior)
    key = jr.key(seed + 1)  # the scores' key; their draws come from its first half
    return types.SimpleNamespace(
        cards=cards,
        truth=truth,
        traj=traj,
        post=post,
        init=jnp.asarray(init, jnp.int32),
        none=jc.Intervention.none(len(cards)),
        key=key,
        draws=structure_draws(post, jr.split(key)[0], NUM_SAMPLES),
    )


@pytest.fixture(scope="module")
def bin3():
    net = _network("bin3", 100)
    # a second history of the same shapes, short (a diffuse posterior)
    net.post2 = _network("bin3", 110, horizon=0.5).post
    return net


@pytest.fixture(scope="module")
def nodelman():
    return _network("nodelman", 300)


@pytest.fixture(scope="module")
def mixed():
    return _network("mixed", 400)


def _more_draws(net, key, calls):
    """`calls * NUM_SAMPLES` draws per candidate set: independent batches from the one compiled
    `structure_draws` of the network, concatenated along the samples axis."""
    parts = [structure_draws(net.post, k, NUM_SAMPLES) for k in jr.split(key, calls)]
    return jax.tree_util.tree_map(lambda *x: np.concatenate(x, axis=1), *parts)


@eqx.filter_jit
def _vbhc_and_bhc(post, divergences):
    return structure_vbhc_minimum(post, divergences), structure_bhc(post, divergences)


@eqx.filter_jit
def _lbfgs(post, divergences):
    return structure_vbhc_minimise(post, divergences, jc.LBFGS(steps=500))


def _candidate(space, i):
    return jax.tree_util.tree_map(lambda x: x[i], space)


# three binary nodes under the Gamma prior; two ternary nodes under the Nodelman prior (each
# prior compiles anew); each without and with a perfect intervention on X1
@pytest.mark.parametrize("name", ["bin3", "nodelman"])
def test_structure_vbhc_optax_equals_closed_form_and_graph_enumeration(name, request):
    net = request.getfixturevalue(name)
    post = net.post
    for iv in (net.none, jc.Intervention.perfect(net.truth, {"X1": 1})):
        a = structure_divergences(post, net.draws, net.init, HORIZON, intervention=iv)
        closed, bhc = (float(x) for x in _vbhc_and_bhc(post, a))
        value, _ = _lbfgs(post, a)
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
        np.testing.assert_allclose(bhc, ref_bhc, rtol=1e-10)
        assert bhc >= closed - 1e-12
        if bool(iv.targets.any()):  # the clamped node contributes nothing
            assert float(jnp.abs(a[1]).sum()) == 0.0


# ------------------------------------------------------------------ Monte Carlo and EIG
MC_HORIZON = jnp.asarray(3.0)
MC_PATHS = 20


def _draw_sets(net):
    """Four independent sets of 7 * NUM_SAMPLES draws per candidate set (made once)."""
    if not hasattr(net, "draw_sets"):
        net.draw_sets = [_more_draws(net, k, 7) for k in jr.split(jr.fold_in(net.key, 7), 4)]
    return net.draw_sets


def _monte_carlo_divergences(net, draws, iv, path_key):
    return structure_divergences(
        net.post,
        draws,
        net.init,
        MC_HORIZON,
        intervention=iv,
        estimator=jc.MonteCarlo(num_paths=MC_PATHS),
        path_key=path_key,
    )


def test_monte_carlo_estimator_is_nonnegative_and_plug_in_differs(mixed):
    draws = _draw_sets(mixed)[0]
    k1, k2 = jr.split(jr.key(5))
    mc = _monte_carlo_divergences(mixed, draws, mixed.none, k1)
    plug = structure_divergences(mixed.post, draws, mixed.init, MC_HORIZON, intervention=mixed.none)
    for m in mc:
        # a_n(P') is an expected KL: non-negative up to Monte Carlo error
        assert float(m.min()) > -0.02
    # the plug-in's bias (ell is convex in the statistics) is larger than the Monte Carlo
    # estimator's own noise: a second, independent set of paths moves it far less
    mc2 = _monte_carlo_divergences(mixed, draws, mixed.none, k2)
    mc, mc2, plug = (np.concatenate(x) for x in (mc, mc2, plug))
    noise = np.abs(mc - mc2).max()
    bias = np.abs((mc + mc2) / 2 - plug).max()
    assert 0 < 3 * noise < bias, (noise, bias)


@eqx.filter_jit
def _eigs(post, draw_sets, init, horizon, path_keys, iv):
    """The structure EIG of one candidate on each of a batch of draw sets (vmap)."""
    return jax.vmap(
        lambda draws, k: structure_eig(
            post, draws, init, horizon, path_key=k, num_paths=10, intervention=iv
        )
    )(draw_sets, path_keys)


@pytest.mark.parametrize(
    "name, assignments",
    # the Nodelman prior without an intervention only
    [("mixed", ({}, {"X0": 1})), ("nodelman", ({},))],
    ids=["gamma", "nodelman"],
)
def test_structure_eig_below_vbhc_below_bhc(name, assignments, request):
    net = request.getfixturevalue(name)
    mc_draws, *eig_draws = _draw_sets(net)
    eig_draws = jax.tree_util.tree_map(lambda *x: np.stack(x), *eig_draws)
    for j, assignment in enumerate(assignments):
        iv = jc.Intervention.perfect(net.truth, assignment)
        mc = _monte_carlo_divergences(net, mc_draws, iv, jr.key(10 + j))
        vbhc, bhc = (float(x) for x in _vbhc_and_bhc(net.post, mc))
        eigs = np.asarray(
            _eigs(net.post, eig_draws, net.init, MC_HORIZON, jr.split(jr.key(20 + j), 3), iv)
        )
        eig, se = np.mean(eigs), np.std(eigs) / np.sqrt(len(eigs))
        assert eig >= -4 * se - 1e-3
        assert vbhc <= bhc + 1e-12
        assert eig <= vbhc + 4 * se + 0.05 * vbhc, (eig, vbhc, bhc)


# ------------------------------------------------------------------ the scoring verb
SPACE3 = jc.intervention_space((2, 2, 2))  # 27 candidates, the last clamps every node
SUBSET = jnp.array([26, 13, 0, 5, 9, 21, 4, 17, 8, 3])
ALL_SETS3 = 4  # every candidate set of a node of `bin3` (max_parents=2)


@jax.jit
@eqx.debug.assert_max_traces(max_traces=1)
def _bin3_scores(post, key, init, space, subset):
    """The VBHC of every candidate (default batching); of a subset in another order, in chunks
    of 4 that do not divide it; and of every candidate with `max_sets` keeping every set."""

    def score(candidates, **options):
        return jc.score_interventions(
            post, candidates, init, HORIZON, key=key, num_samples=NUM_SAMPLES, **options
        )

    return dict(
        all=score(space),
        subset=score(_candidate(space, subset), batching=jc.Chunked(4)),
        all_sets=score(space, criterion=jc.VBHC(max_sets=ALL_SETS3)),
    )


@pytest.fixture(scope="module")
def bin3_scores(bin3):
    return _bin3_scores(bin3.post, bin3.key, bin3.init, SPACE3, SUBSET)


def test_structure_scoring_all_interventions(bin3, bin3_scores):
    scores = bin3_scores["all"]
    assert scores.shape == (27,)
    assert abs(float(scores[-1])) < 1e-12  # every node clamped: nothing to learn
    # the verb's scores (chunks share their solves by clamp pattern) are the closed-form
    # minimum of the divergences on the same draws, one candidate at a time
    for i in range(27):
        a = structure_divergences(
            bin3.post, bin3.draws, bin3.init, HORIZON, intervention=_candidate(SPACE3, i)
        )
        np.testing.assert_allclose(
            scores[i], _vbhc_and_bhc(bin3.post, a)[0], rtol=1e-10, atol=1e-12
        )
    # any subset, any order, chunks that do not divide the batch: the same scores
    np.testing.assert_allclose(bin3_scores["subset"], scores[SUBSET], rtol=1e-10, atol=1e-12)
    # a new history, same shapes: no recompilation (assert_max_traces)
    _bin3_scores(bin3.post2, bin3.key, bin3.init, SPACE3, SUBSET)


@pytest.mark.parametrize("name", ["bin3", "nodelman"])
def test_nodes_of_a_group_in_one_loop_give_the_node_by_node_numbers(name, request, monkeypatch):
    """The divergences of a group of nodes of equal shapes computed in one loop over the group,
    the node traced (`GroupNode`: one compiled body per group, the route the scorer takes), are
    the numbers of the node-by-node route bit for bit, from a program a fraction of the size
    (three binary nodes; two ternary nodes, two jumps each, under the Nodelman prior)."""
    from jaxctbn._criteria import structure

    net = request.getfixturevalue(name)
    space = jc.intervention_space(net.cards)
    assert net.post._node_groups() == [tuple(range(len(net.cards)))]

    def route(grouped):
        if not grouped:  # the node-by-node route: what the scorer took before the groups
            monkeypatch.setattr(structure, "pattern_route_takes_groups", lambda *a: False)
        fn = eqx.filter_jit(
            lambda post, draws, init: structure.divergences_all_candidates(
                post,
                draws,
                space,
                init,
                HORIZON,
                key=jr.key(0),
                solver=jc.AutomaticSolver(),
                estimator=jc.PlugIn(),
                batching=jc.Chunked(27),
            )
        )
        lowered = fn.lower(net.post, net.draws, net.init)
        values = lowered.compile()(net.post, net.draws, net.init)
        monkeypatch.undo()
        return values, lowered.as_text().count("stablehlo.while")

    grouped, loops_grouped = route(True)
    by_node, loops_by_node = route(False)
    for a, b in zip(grouped, by_node, strict=True):
        np.testing.assert_array_equal(a, b)
    assert float(jnp.abs(grouped[0]).max()) > 0  # not all skipped
    # the loops of one node's body instead of every node's, and the loop over the group
    N = len(net.cards)
    assert loops_by_node % N == 0 and loops_grouped == loops_by_node // N + 1, (
        loops_grouped,
        loops_by_node,
    )


@pytest.mark.usefixtures("no_runtime_typecheck")
def test_structure_criteria_bad_input(bin3):
    post, draws, key = bin3.post, bin3.draws, jr.key(0)
    init = jnp.zeros(3, int)
    with pytest.raises(TypeError, match="criterion: expected"):
        jc.score_interventions(post, SPACE3, init, 1.0, key=key, criterion="x")
    with pytest.raises(ValueError, match="num_samples must be >= 1"):
        structure_draws(post, key, 0)
    with pytest.raises(ValueError, match="estimator: expected"):
        structure_divergences(post, draws, init, 1.0, estimator="second-order")
    with pytest.raises(ValueError, match="path_key"):
        structure_divergences(post, draws, init, 1.0, estimator=jc.MonteCarlo())
    with pytest.raises(ValueError, match="num_paths and max_events must be >= 1"):
        jc.MonteCarlo(num_paths=0)


def test_structure_criteria_under_the_nodelman_prior(nodelman):
    net = nodelman
    space = jc.intervention_space(net.cards)  # 16 candidates
    vbhc = jc.score_interventions(
        net.post, space, net.init, HORIZON, key=net.key, num_samples=NUM_SAMPLES
    )
    assert bool(jnp.all(jnp.isfinite(vbhc)))
    assert abs(float(vbhc[-1])) < 1e-12  # every node clamped: nothing to learn
    # the verb's one chunk of 16 candidates shares its solves and predictive terms by clamp
    # pattern (2 patterns of a node's other node); one candidate at a time cannot (one solve per
    # candidate): the closed-form minimum of `structure_divergences` on the verb's draws (BHC >=
    # VBHC under this prior: test_structure_eig_below_vbhc_below_bhc[nodelman])
    for i in range(space.targets.shape[0]):
        a = structure_divergences(
            net.post, net.draws, net.init, HORIZON, intervention=_candidate(space, i)
        )
        np.testing.assert_allclose(vbhc[i], _vbhc_and_bhc(net.post, a)[0], rtol=1e-10, atol=1e-12)


def test_structure_scores_invariant_to_relabelling_nodes(mixed):
    # two nodes of different cardinality, swapped: the divergences of every node and candidate
    # set and the (V)BHC must be the same numbers under the new labels
    traj, post, draws = mixed.traj, mixed.post, mixed.draws
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
    post_sw = jc.learn_structure(traj_sw, ("X1", "X0"), mixed.cards[::-1], max_parents=1)
    log_posteriors = eqx.filter_jit(
        lambda a, b: (a.log_posterior(), b.log_posterior())
    )  # one program (eagerly: one per operation)
    lps, lps_sw = log_posteriors(post, post_sw)
    for lp, lp_sw in zip(lps, lps_sw[::-1]):
        np.testing.assert_allclose(lp, lp_sw, rtol=1e-10)

    def swap(model):  # PaddedCTBN batch with the two nodes exchanged
        return jc.PaddedCTBN(
            cims=model.cims[::-1],
            parent_index=tuple(jnp.where(p >= 0, 1 - p, p) for p in model.parent_index[::-1]),
            names=model.names[::-1],
            cardinalities=model.cardinalities[::-1],
        )

    draws_sw = StructureDraws(models=tuple(swap(m) for m in draws.models[::-1]))
    init, init_sw = mixed.init, mixed.init[::-1]
    for assignment in [{}, {"X0": 1}, {"X1": 2}]:
        iv = jc.Intervention.perfect(mixed.truth, assignment)
        iv_sw = jc.Intervention(targets=iv.targets[::-1], states=iv.states[::-1])
        a = structure_divergences(post, draws, init, HORIZON, intervention=iv)
        b = structure_divergences(post_sw, draws_sw, init_sw, HORIZON, intervention=iv_sw)
        for x, y in zip(a, b[::-1]):
            np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(_vbhc_and_bhc(post, a), _vbhc_and_bhc(post_sw, b), rtol=1e-10)


# ------------------------------------------------------------------ joint graph draws
SINGLE3 = jc.single_node_interventions((2, 2, 2))  # 7 candidates


@eqx.filter_jit
def _node_ells(post, model, init, iv):
    """ell_n(S; P) on every node's candidate sets from one model's expected statistics."""
    st = jc.expected_statistics(model, init, HORIZON, intervention=iv)
    return [
        predictive_log_likelihood(post, n, *st.node_statistics_on_sets(n, post.parent_sets[n]))
        for n in range(len(post.names))
    ]


def _joint_scores(post, init, key, num_samples, graph_draws):
    return jc.score_interventions(
        post,
        SINGLE3,
        init,
        HORIZON,
        key=key,
        num_samples=num_samples,
        criterion=jc.VBHC(graph_draws=graph_draws),
    )


@pytest.mark.slow
def test_joint_graph_draws_equal_an_explicit_loop_and_the_stratified_scores(bin3):
    post, init, key = bin3.post, bin3.init, jr.key(30)
    # the vectorised route against a Python loop over candidates, draws, nodes and sets (on the
    # same draws: `joint_structure_draws` with the same key, in the same program)
    a, draws = eqx.filter_jit(
        lambda p, candidates, init, k: (
            jc.criteria.JointGraphDraws().divergences(
                p,
                candidates,
                init,
                HORIZON,
                key=k,
                num_samples=NUM_SAMPLES,
                solver=jc.Uniformisation(),
                estimator=jc.PlugIn(),
                batching=jc.Chunked(2),
            ),
            joint_structure_draws(p, k, NUM_SAMPLES),
        )
    )(post, SINGLE3, init, key)
    for i in range(SINGLE3.targets.shape[0]):
        iv = _candidate(SINGLE3, i)
        ells = [
            [np.asarray(x) for x in _node_ells(post, _candidate(draws.models, s), init, iv)]
            for s in range(NUM_SAMPLES)
        ]
        for n in range(3):
            own = [ells[s][n][int(draws.indices[s, n])] for s in range(NUM_SAMPLES)]
            ref = np.mean([own[s] - ells[s][n] for s in range(NUM_SAMPLES)], axis=0)
            if bool(iv.targets[n]):
                ref = np.zeros_like(ref)
            np.testing.assert_allclose(a[n][i], ref, rtol=1e-10, atol=1e-12)
    # the same a_n in expectation as the paper's stratified draws: many draws of each, the
    # scores agree to Monte Carlo error (measured spread ~0.01 at these sizes) and in ranking.
    # The stratified a_n of 300 draws per set, candidate by candidate: the mean over 100
    # independent batches of N_S draws (a_n is a mean over the draws of each set)
    batches = [structure_draws(post, k, NUM_SAMPLES) for k in jr.split(jr.key(32), 100)]
    stratified = []
    for i in range(SINGLE3.targets.shape[0]):
        iv = _candidate(SINGLE3, i)
        a = [structure_divergences(post, d, init, HORIZON, intervention=iv) for d in batches]
        a = tuple(np.mean([a_b[n] for a_b in a], axis=0) for n in range(3))
        stratified.append(float(_vbhc_and_bhc(post, a)[0]))
    joint = _joint_scores(post, init, jr.key(31), 2000, jc.criteria.JointGraphDraws())
    np.testing.assert_allclose(joint, stratified, atol=0.04)
    assert float(scipy.stats.spearmanr(joint, stratified).statistic) > 0.9


def test_systematic_parent_sets_are_posterior_draws_with_proportional_counts(
    bin3, no_runtime_typecheck
):
    post = bin3.post2  # a diffuse posterior
    probs = [np.asarray(p) for p in post.parent_set_probabilities()]
    S, R = 7, 20000
    indices = np.asarray(
        eqx.filter_jit(jax.vmap(lambda k, p: p.systematic_parent_sets(k, S), in_axes=(0, None)))(
            jr.split(jr.key(40), R), post
        )
    )  # (R, S, nodes)
    assert indices.shape == (R, S, 3)
    # within each call, node n takes set P in floor(S p) or ceil(S p) of the S draws
    for n in range(3):
        counts = (indices[:, :, n, None] == np.arange(probs[n].size)).sum(1)  # (R, sets)
        assert np.all(counts >= np.floor(S * probs[n] - 1e-9))
        assert np.all(counts <= np.ceil(S * probs[n] + 1e-9))
    # over many calls, one draw (here the first) is distributed as the posterior, and the
    # nodes independently: frequencies against p(P|H) and their products (binomial error)
    first = indices[:, 0, :]
    for n in range(3):
        freq = np.bincount(first[:, n], minlength=probs[n].size) / R
        np.testing.assert_allclose(freq, probs[n], atol=5 * np.sqrt(0.25 / R))
    pair = np.zeros((probs[0].size, probs[1].size))
    np.add.at(pair, (first[:, 0], first[:, 1]), 1.0 / R)
    np.testing.assert_allclose(pair, np.outer(probs[0], probs[1]), atol=5 * np.sqrt(0.25 / R))
    # the same expectation as independent draws: both joint schemes against many draws
    systematic, independent = (
        _joint_scores(
            post, bin3.init, jr.key(41), 2000, jc.criteria.JointGraphDraws(systematic=flag)
        )
        for flag in (True, False)
    )
    np.testing.assert_allclose(systematic, independent, atol=0.04)
    with pytest.raises(ValueError, match="num_samples: expected a positive integer"):
        post.systematic_parent_sets(jr.key(0), 0)
    with pytest.raises(ValueError, match="systematic must be True or False"):
        jc.criteria.JointGraphDraws(systematic=1)  # pyright: ignore[reportArgumentType]


def test_truncated_posterior_keeps_the_most_probable_sets(bin3, bin3_scores):
    post = bin3.post
    cut = eqx.filter_jit(lambda p: p.truncated(2))(post)
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
    assert ALL_SETS3 == max(s.shape[0] for s in post.parent_sets)
    np.testing.assert_array_equal(bin3_scores["all"], bin3_scores["all_sets"])
    with pytest.raises(ValueError, match="max_sets: expected a positive integer"):
        post.truncated(0)
    with pytest.raises(ValueError, match="max_sets: expected None or a positive integer"):
        jc.BHC(max_sets=0)
    with pytest.raises(ValueError, match="estimator: JointGraphDraws takes the PlugIn"):
        jc.score_interventions(
            post,
            SINGLE3,
            bin3.init,
            HORIZON,
            key=jr.key(0),
            criterion=jc.VBHC(graph_draws=jc.criteria.JointGraphDraws(), estimator=jc.MonteCarlo()),
        )


# ------------------------------------------------------------------ the priors' likelihoods
@pytest.mark.parametrize("prior", [jc.GammaPrior(2.0, 1.5), jc.NodelmanPrior(2.0, 1.5)])
def test_predictive_is_the_ratio_of_marginal_likelihoods(prior):
    # conjugacy: p(new | old) = p(old + new) / p(old), an independent route for both priors
    rng = np.random.default_rng(3)
    k, C = 3, 2
    old_M = jnp.asarray(rng.integers(0, 5, (C, k, k)) * (1 - np.eye(k)), float)
    new_M = jnp.asarray(rng.integers(0, 4, (C, k, k)) * (1 - np.eye(k)), float)
    old_T, new_T = jnp.asarray(rng.uniform(0.1, 2, (C, k))), jnp.asarray(rng.uniform(0, 1, (C, k)))

    @jax.jit
    def both(old_M, new_M, old_T, new_T):
        direct = prior.log_predictive(1, new_M, new_T, old_M, old_T, C)
        ratio = prior.log_marginal_likelihood(
            1, old_M + new_M, old_T + new_T, C
        ) - prior.log_marginal_likelihood(1, old_M, old_T, C)
        return direct, ratio

    direct, ratio = both(old_M, new_M, old_T, new_T)
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

    @jax.jit
    def exact(new_M, new_T, old_M, old_T):
        return (
            prior.log_marginal_likelihood(1, new_M, new_T, C),
            prior.log_predictive(1, new_M, new_T, old_M, old_T, C),
        )

    keys = jr.split(jr.key(6), draws)
    f = functools.partial(np.asarray, dtype=float)
    zeros = (np.zeros((C, k, k)), np.zeros((C, k)))
    for (M, T), exact_value in zip(
        (zeros, (old_M, old_T)), exact(*map(f, (new_M, new_T, old_M, old_T)))
    ):
        rates = np.asarray(sample(keys, f(M), f(T)))
        log_lik = _path_log_likelihood(rates, new_M, new_T)
        shift = log_lik.max()
        lik = np.exp(log_lik - shift)
        estimate = np.log(lik.mean()) + shift
        rel_se = lik.std() / lik.mean() / np.sqrt(draws)
        assert rel_se < 0.02, rel_se  # so that the check below is tight
        assert abs(estimate - float(exact_value)) < 4 * rel_se, (
            estimate,
            float(exact_value),
            rel_se,
        )


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
    predictive = jax.jit(lambda *a: prior.log_predictive(1, *a, C))
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
        ours = predictive(
            jnp.asarray(new_M, float),
            jnp.asarray(new_T),
            jnp.asarray(old_M, float),
            jnp.asarray(old_T),
        )
        np.testing.assert_allclose(ours, reference, rtol=1e-9)
