"""Batches of experiments (maths §8): `score_interventions` with `batch=Batch(...)` (choose a
batch) and `batch=GivenBatch()` (score one), and the costs.

Independent routes: one member against `score_interventions`; every pair of a 2-node network
scored by hand (each member's statistics solved on its own, summed, and the VBHC minimised
numerically for parameters, or the structure VBHC minimised in closed form over the whole
joint graph space with a hand-written predictive likelihood); greedy against the best pair by
enumeration; the batch EIG of one member against the single EIG; the batch BHC against the sum
of its members'. Compiled programs are shared through module fixtures."""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
from helpers import random_model

import jaxctbn as jc
from jaxctbn._criteria.parameter import design_statistics, parameter_vbhc_minimise, posterior_draws
from jaxctbn._criteria.structure import structure_draws
from jaxctbn.criteria import ByScore, ByScorePerCost, GivenBatch

HORIZON = jnp.asarray(2.0)
INIT = jnp.array([1, 0])
NUM_DRAWS = 4
CARDS = (2, 2)
PARENTS = ((), (0,))
NAMES = ("X0", "X1")
#: a panel's visits priced (as the loop prices them): 1 + 2 visits x 0.5 per member
VISITS = jc.Costs.of_nodes(NAMES, CARDS, experiment=1.0, visit=0.5)


@eqx.filter_jit  # one program (eagerly: one per operation)
def _truth_and_paths(key, cards, parents):
    k1, k2 = jax.random.split(key)
    truth = random_model(k1, cards, parents)
    init = jnp.zeros(len(cards), jnp.int32)
    return truth, jc.sample_trajectories(truth, init, 2.0, key=k2, num_trajectories=2)


def _rows(candidates, index):
    return jax.tree_util.tree_map(lambda a: a[jnp.asarray(index)], candidates)


@pytest.fixture(scope="module")
def problem():
    truth, traj = _truth_and_paths(jax.random.key(11), CARDS, PARENTS)

    @eqx.filter_jit  # one program (eagerly: one per operation)
    def posterior(truth, traj):
        stats = jc.SufficientStatistics.from_trajectories(traj, CARDS, PARENTS)
        return jc.RatePosterior.for_model(truth).update_with(stats)

    rates = posterior(truth, traj)
    structure = jc.learn_structure(traj, truth.names, CARDS, max_parents=1)
    return truth, rates, structure, jc.intervention_space(CARDS)


CRITERIA = {
    "parameters-vbhc": ("rates", jc.VBHC()),
    "parameters-bhc": ("rates", jc.BHC()),
    "structure-vbhc": ("structure", jc.VBHC()),
}


@pytest.fixture(scope="module")
def greedy(problem):
    """A greedy pair and the single scores of a criterion, computed when a test first asks
    (so a worker compiles only the criteria its tests use)."""
    _, rates, structure, space = problem
    cache = {}

    def get(name):
        if name not in cache:
            target, criterion = CRITERIA[name]
            posterior = rates if target == "rates" else structure
            key = jax.random.key(3)
            design = jc.score_interventions(
                posterior, space, INIT, HORIZON, criterion=criterion, key=key,
                num_samples=NUM_DRAWS, batch=jc.Batch(2),
            )  # fmt: skip
            single = jc.score_interventions(
                posterior, space, INIT, HORIZON, criterion=criterion, key=key,
                num_samples=NUM_DRAWS,
            )  # fmt: skip
            cache[name] = (posterior, criterion, design, single)
        return cache[name]

    return get


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n == "structure-vbhc" else n for n in CRITERIA],
)
def test_one_member_every_pair_and_greedy_against_the_best_pair(problem, greedy, name):
    """One member gives the single scores; round 2's scores are the pairs (first member,
    candidate), scored directly; the greedy pair is within the enumerated optimum (the ratio is
    reported). One test per criterion, so each criterion compiles on one worker."""
    _check_one_member(greedy, name)
    if name == "structure-vbhc":
        _check_structure_pair_by_hand(problem, greedy)
    _, _, _, space = problem
    posterior, criterion, design, single = greedy(name)
    C = space.targets.shape[0]
    pairs = np.array(list(itertools.product(range(C), repeat=2)))
    score = eqx.filter_jit(
        jax.vmap(
            lambda members: jc.score_interventions(
                posterior,
                members,
                INIT,
                HORIZON,
                criterion=criterion,
                key=jax.random.key(3),
                num_samples=NUM_DRAWS,
                batch=GivenBatch(),
            )
        )
    )
    values = np.asarray(score(_rows(space, pairs))).reshape(C, C)
    first = int(design.members[0])
    np.testing.assert_allclose(design.round_scores[1], values[first], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(values, values.T, rtol=1e-10, atol=1e-12)  # order is irrelevant
    greedy_value = float(design.batch_score)
    assert greedy_value <= values.max() + 1e-10
    ratio = greedy_value / values.max()
    print(f"{name}: greedy pair / best pair = {ratio:.4f}")
    assert ratio > 0.5
    if name.startswith("parameters"):
        # given the rates, the members' outcomes are independent: a pair is at least its best
        # member, and the BHC of a pair is the sum of its members'
        both = np.asarray(single)[pairs].reshape(C, C, 2)
        assert np.all(values >= both.max(-1) - 1e-10)
        assert np.all(values <= both.sum(-1) + 1e-10)
        if name == "parameters-bhc":
            np.testing.assert_allclose(values, both.sum(-1), rtol=1e-10)


def _check_one_member(greedy, name):
    _, _, design, single = greedy(name)
    np.testing.assert_allclose(design.round_scores[0], single, rtol=1e-11, atol=1e-12)
    assert int(design.members[0]) == int(jnp.argmax(single))
    np.testing.assert_allclose(design.scores[0], single.max(), rtol=1e-12)
    np.testing.assert_allclose(design.batch_score, design.gains.sum(), rtol=1e-12)


def test_parameter_pair_vbhc_by_hand(problem):
    """Each member's statistics solved on its own and summed by hand, the VBHC minimised by
    L-BFGS: the closed-form batch value."""
    _, rates, _, space = problem
    key = jax.random.key(3)
    draws = eqx.filter_jit(posterior_draws)(rates, key, NUM_DRAWS)
    minimise = eqx.filter_jit(parameter_vbhc_minimise)
    statistics = eqx.filter_jit(  # one program (eagerly: one per operation)
        lambda rates, draws, iv: design_statistics(rates, draws, INIT, HORIZON, intervention=iv)
    )
    for pair in [(0, 4), (0, 3), (2, 7), (5, 5)]:  # (5, 5) clamps both nodes: 0
        stats = [statistics(rates, draws, _rows(space, i)) for i in pair]
        summed = jax.tree_util.tree_map(jnp.add, *stats)
        by_hand, _ = minimise(rates, summed, jc.LBFGS())
        direct = jc.score_interventions(
            rates,
            _rows(space, list(pair)),
            INIT,
            HORIZON,
            key=key,
            num_samples=NUM_DRAWS,
            batch=GivenBatch(),
        )
        np.testing.assert_allclose(direct, by_hand, rtol=1e-7, atol=1e-12)


def test_structure_batch_by_pattern_against_the_dense_route():
    """The structure batch from the clamp-pattern bins (perfect candidates) against the
    per-candidate statistics on every padded set (the same candidates with unit rate scales,
    which take the general route): three nodes, two-parent sets, three rounds."""
    cards, parents = (2, 2, 2), ((), (0,), (0, 1))
    truth, traj = _truth_and_paths(jax.random.key(5), cards, parents)
    init = jnp.zeros(3, jnp.int32)
    structure = jc.learn_structure(traj, truth.names, cards, max_parents=2)
    space = jc.intervention_space(cards)
    C = space.targets.shape[0]
    unit = space.with_rate_scales([jnp.ones(C)] * 3)
    by_route = [
        jc.score_interventions(
            structure, ivs, init, HORIZON, key=jax.random.key(4), num_samples=3, batch=jc.Batch(3)
        )
        for ivs in (space, unit)
    ]
    fast, dense = by_route
    np.testing.assert_allclose(fast.round_scores, dense.round_scores, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(fast.members, dense.members)
    assert len(set(np.asarray(fast.round_scores[1]).round(12))) > 2  # the rounds discriminate


def _gamma_predictive(alpha_bar, beta_bar, M, T):
    """ln p(M, T | history) for Gamma rates, written out with scipy (off-diagonal rates)."""
    k = M.shape[-1]
    off = ~np.eye(k, dtype=bool)
    a = np.broadcast_to(alpha_bar, M.shape)[..., off]
    m = M[..., off]
    t = np.repeat(T[..., :, None], k, -1)[..., off]
    b = np.repeat(np.broadcast_to(beta_bar, T.shape)[..., :, None], k, -1)[..., off]
    return np.sum(
        scipy.special.gammaln(a + m)
        - scipy.special.gammaln(a)
        + a * np.log(b)
        - (a + m) * np.log(b + t)
    )


def _check_structure_pair_by_hand(problem, greedy):
    """The structure VBHC of pairs by hand: per node and draw each member's expected
    statistics (solved alone), projected and summed; a_n(P') from a scipy predictive; the
    minimum over q of the whole graph space (all 4 graphs) in closed form."""
    _, _, structure, space = problem
    _, _, design, _ = greedy("structure-vbhc")
    key_draws, _ = jax.random.split(jax.random.key(3))
    draws = structure_draws(structure, key_draws, NUM_DRAWS)
    alpha, beta = structure.prior.node_parameters(0)
    probs = [np.asarray(p) for p in structure.parent_set_probabilities()]
    sets = [np.asarray(s) for s in structure.parent_sets]

    solve = eqx.filter_jit(
        jax.vmap(
            lambda model, iv: jc.expected_statistics(model, INIT, HORIZON, intervention=iv),
            in_axes=(0, None),
        )
    )

    def a_n(pair, n):
        models = jax.tree_util.tree_map(
            lambda x: x.reshape(-1, *x.shape[2:]), draws.models[n]
        )  # (sets * samples,)
        free = [i for i in pair if not bool(space.targets[i, n])]
        if not free:
            return np.zeros(len(sets[n]))
        M, T = 0.0, 0.0
        for i in free:
            st = solve(models, _rows(space, i))
            m, t = jax.vmap(lambda s: s.node_statistics_on_sets(n, structure.parent_sets[n]))(st)
            M, T = M + np.asarray(m), T + np.asarray(t)
        M, T = np.asarray(M), np.asarray(T)
        S = len(sets[n])
        hist_M = np.asarray(structure.statistics.transitions[n])
        hist_T = np.asarray(structure.statistics.dwell_times[n])
        ell = np.array(
            [
                [
                    _gamma_predictive(alpha + hist_M[p], beta + hist_T[p], M[d, p], T[d, p])
                    for p in range(S)
                ]
                for d in range(M.shape[0])
            ]
        ).reshape(S, NUM_DRAWS, S)  # [stratum P, draw, P']
        own = np.stack([ell[p, :, p] for p in range(S)])  # [P, draw]
        return np.einsum("p,pq->q", probs[n], (own[:, :, None] - ell).mean(1))

    first = int(design.members[0])
    for second in [0, first, 3, 8]:
        a = [a_n((first, second), n) for n in range(2)]
        # every graph G' = (par'(0), par'(1)): A(G') = a_0 + a_1, p(G') = p_0 p_1
        log_terms = [
            np.log(probs[0][p] * probs[1][q]) - (a[0][p] + a[1][q])
            for p in range(len(sets[0]))
            for q in range(len(sets[1]))
        ]
        by_hand = -scipy.special.logsumexp(log_terms)
        np.testing.assert_allclose(design.round_scores[1][second], by_hand, rtol=1e-8)


def _one_member_is_the_single_eig(posterior, space, criterion):
    key, idx = jax.random.key(5), [0, 3]
    single = jc.score_interventions(
        posterior, _rows(space, idx), INIT, HORIZON, criterion=criterion, key=key, num_samples=3
    )
    one = eqx.filter_jit(
        jax.vmap(
            lambda member: jc.score_interventions(
                posterior,
                member,
                INIT,
                HORIZON,
                criterion=criterion,
                key=key,
                num_samples=3,
                batch=GivenBatch(),
            )
        )
    )(_rows(space, np.asarray(idx)[:, None]))
    np.testing.assert_allclose(one, single, rtol=1e-12)


@pytest.mark.slow  # the same identity for the parameter EIG: the test below
def test_structure_batch_eig_of_one_member_is_the_single_eig(problem):
    _, _, structure, space = problem
    _one_member_is_the_single_eig(structure, space, jc.EIG(num_paths=4))


def test_batch_eig_of_one_member_is_the_single_eig(problem):
    _, rates, _, space = problem
    _one_member_is_the_single_eig(rates, space, jc.EIG(num_paths=20))


@pytest.mark.slow  # a second check of the batch EIG (two more programs): the test above
def test_batch_eig_of_a_pair_orders_below_the_bhc(problem):
    _, rates, _, space = problem
    eig = jc.EIG(num_paths=20)
    # the parameter EIG of a pair: at least its best member (up to Monte Carlo error), below
    # the pair's BHC (EIG <= VBHC <= BHC)
    key_big = jax.random.key(6)

    def score(members, criterion):
        return jc.score_interventions(
            rates, members, INIT, HORIZON, criterion=criterion, key=key_big, num_samples=30,
            batch=GivenBatch(),
        )  # fmt: skip

    # member 0 alone: paired with the candidate that clamps every node (it adds nothing)
    silent = int(np.argmax(np.asarray(space.targets).all(-1)))
    eig_pair, eig_one = eqx.filter_jit(jax.vmap(lambda m: score(m, eig)))(
        _rows(space, np.array([[0, 0], [0, silent]]))
    )
    bhc_pair = score(_rows(space, [0, 0]), jc.BHC())
    assert eig_one < eig_pair < bhc_pair


def test_costs_prices_candidates():
    names, cards = ("A", "B"), (2, 3)
    costs = jc.Costs.of_nodes(
        names,
        cards,
        clamp={"A": 2.0},
        clamp_state={("B", 2): 5.0},
        experiment=1.0,
        visit=0.5,
        default_clamp=1.0,
    )
    space = jc.intervention_space(cards)
    got = np.asarray(costs.of(space, num_visits=2))
    targets, states = np.asarray(space.targets), np.asarray(space.states)
    want = []
    for t, s in zip(targets, states):
        c = 1.0 + 2 * 0.5
        c += 2.0 if t[0] else 0.0
        c += (5.0 if s[1] == 2 else 1.0) if t[1] else 0.0
        want.append(c)
    np.testing.assert_allclose(got, want)
    scaled = jc.Intervention.none(2).with_rate_scales([jnp.asarray(1.0), jnp.asarray(0.5)])
    with_scale = jc.Costs.of_nodes(names, cards, scale={"B": 3.0}, experiment=1.0)
    assert float(with_scale.of(scaled)) == 4.0
    for bad in [{"clamp": {"A": -1.0}}, {"clamp": {"A": float("nan")}}, {"experiment": -2.0}]:
        with pytest.raises(ValueError, match="Costs"):
            jc.Costs.of_nodes(names, cards, **bad)
    with pytest.raises(ValueError, match="unknown node 'C'"):
        jc.Costs.of_nodes(names, cards, clamp={"C": 1.0})
    with pytest.raises(ValueError, match="state 3 of node 'B'"):
        jc.Costs.of_nodes(names, cards, clamp_state={("B", 3): 1.0})


def _choose(rates, space, budget=1e9, key=None, **kwargs):
    """A batch with costs (a budget array): one compiled program per ranking."""
    return jc.score_interventions(
        rates, space, INIT, HORIZON, key=jax.random.key(3) if key is None else key,
        num_samples=NUM_DRAWS, batch=jc.Batch(2, budget=jnp.asarray(budget), **kwargs),
    )  # fmt: skip


def test_costs_and_budgets_in_a_batch(problem, greedy, panel_greedy):
    _, rates, _, space = problem
    posterior, criterion, design, single = greedy("parameters-vbhc")
    names = NAMES

    def choose(budget=1e9, **kwargs):
        return _choose(rates, space, budget, **kwargs)

    # equal costs: the same choice by score and by score per cost
    equal = jc.Costs.of_nodes(names, CARDS, experiment=2.0)
    for ranking in (ByScore(), ByScorePerCost()):
        same = choose(costs=equal, ranking=ranking)
        np.testing.assert_array_equal(same.members, design.members)
        np.testing.assert_allclose(same.costs, [2.0, 2.0])
    # a prohibitive price on clamping X0: never clamped, under either ranking
    dear = jc.Costs.of_nodes(names, CARDS, clamp={"X0": 1e6}, experiment=1.0)
    for ranking in (ByScore(), ByScorePerCost()):
        chosen = choose(costs=dear, ranking=ranking, budget=10.0)
        members = np.asarray(chosen.members)
        assert np.all(members >= 0)
        assert not np.asarray(space.targets)[members, 0].any()
        assert float(chosen.total_cost) <= 10.0
    # a budget for one experiment: the second slot stays empty
    tight = choose(costs=equal, budget=3.0)
    assert int(tight.members[0]) == int(design.members[0]) and int(tight.members[1]) == -1
    assert float(tight.total_cost) == 2.0 and float(tight.gains[1]) == 0.0
    # score per cost prefers the cheap: free observation vs a costly clamp
    cheap = jc.Costs.of_nodes(names, CARDS, default_clamp=100.0, experiment=1.0)
    chosen = choose(costs=cheap, ranking=ByScorePerCost())
    assert not np.asarray(space.targets)[np.asarray(chosen.members)].any()
    # a panel's visits are priced (as the loop prices them): 1 + 2 visits x 0.5 per member (the
    # panel batch of `panel_greedy`, priced by `VISITS`: one compiled program)
    panel = panel_greedy("parameters-bhc")[2]
    np.testing.assert_allclose(panel.costs, [2.0, 2.0])
    assert float(panel.total_cost) == 4.0


def test_batch_bad_input(problem):
    _, rates, _, space = problem
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="size"):
        jc.score_interventions(rates, space, INIT, HORIZON, key=key, batch=jc.Batch(0))
    with pytest.raises(ValueError, match="budget"):
        jc.score_interventions(rates, space, INIT, HORIZON, key=key, batch=jc.Batch(1, budget=-1.0))
    with pytest.raises(ValueError, match="EIG"):
        jc.score_interventions(
            rates, space, INIT, HORIZON, key=key, criterion=jc.EIG(), batch=jc.Batch(1)
        )
    with pytest.raises(ValueError, match="panel batches are scored at given visit times"):
        jc.score_interventions(
            rates,
            space,
            INIT,
            HORIZON,
            key=key,
            outcome=jc.PanelOutcome(num_visits=2),
            batch=jc.Batch(1),
        )
    with pytest.raises(Exception, match="ByScorePerCost needs every candidate's cost > 0"):
        # the default costs (nothing) in the program of test_costs_and_budgets_in_a_batch
        _choose(
            rates, space, key=key, costs=jc.Costs.of_nodes(NAMES, CARDS), ranking=ByScorePerCost()
        )


@pytest.fixture(scope="module")
def panel_greedy(problem):
    """Greedy pairs with a panel outcome at given times, computed when a test first asks (so a
    worker compiles only the criterion its tests use); the members priced by `VISITS` (the
    choice is by score with no budget: the costs change nothing else)."""
    _, rates, structure, space = problem
    panel = jc.PanelOutcome(times=jnp.array([0.7, 2.0]))
    settings = {"parameters-bhc": (rates, jc.BHC()), "structure-vbhc": (structure, jc.VBHC())}
    cache = {}

    def get(name):
        if name not in cache:
            posterior, criterion = settings[name]
            key = jax.random.key(3)
            design = jc.score_interventions(
                posterior, space, INIT, HORIZON, criterion=criterion, key=key,
                num_samples=NUM_DRAWS, outcome=panel, batch=jc.Batch(2, costs=VISITS),
            )  # fmt: skip
            single = jc.score_interventions(
                posterior, space, INIT, HORIZON, criterion=criterion, key=key,
                num_samples=NUM_DRAWS, outcome=panel,
            )  # fmt: skip
            cache[name] = (posterior, criterion, design, single, panel)
        return cache[name]

    return get


@pytest.mark.parametrize(
    "name", ["parameters-bhc", pytest.param("structure-vbhc", marks=pytest.mark.slow)]
)
def test_panel_batches(problem, panel_greedy, name):
    """Panel outcomes at given times: one member gives the single panel scores; given the
    models the members' panel KLs add, so the parameter BHC of a pair is the sum of its
    members' and the structure criteria of a pair come from the summed divergences (at least
    the best member's VBHC, at most the pair's BHC); round 2 equals the pairs scored directly."""
    _, _, _, space = problem
    posterior, criterion, design, single, panel = panel_greedy(name)
    np.testing.assert_allclose(design.round_scores[0], single, rtol=1e-10, atol=1e-12)
    first = int(design.members[0])
    C = space.targets.shape[0]
    pairs = np.stack([np.full(C, first), np.arange(C)], 1)
    score = eqx.filter_jit(
        jax.vmap(
            lambda members, criterion: jc.score_interventions(
                posterior, members, INIT, HORIZON, criterion=criterion,
                key=jax.random.key(3), num_samples=NUM_DRAWS, outcome=panel, batch=GivenBatch(),
            ),
            in_axes=(0, None),
        )
    )  # fmt: skip
    values = np.asarray(score(_rows(space, pairs), criterion))
    np.testing.assert_allclose(design.round_scores[1], values, rtol=1e-10, atol=1e-12)
    both = np.asarray(single)[pairs]
    if name == "parameters-bhc":
        np.testing.assert_allclose(values, both.sum(1), rtol=1e-10)
    if name == "structure-vbhc":
        bhc = np.asarray(score(_rows(space, pairs), jc.BHC()))
        assert np.all(values >= both.max(1) - 1e-10) and np.all(values <= bhc + 1e-10)
    if name == "parameters-bhc":
        # the loop's design chooses its rounds with that outcome (through `Batch`'s greedy rounds)
        loop_design = jc.CriterionDesign(criterion, num_samples=NUM_DRAWS, outcome=panel)
        members, times = eqx.filter_jit(  # one program (eagerly: one per operation)
            lambda design, posterior, space: design.choose_batch(
                posterior, space, INIT, HORIZON, jax.random.key(3), outcome=panel, size=2,
                costs=jnp.zeros(C), remaining=jnp.asarray(jnp.inf), ranking=ByScore(),
            )
        )(loop_design, posterior, space)  # fmt: skip
        np.testing.assert_array_equal(members, design.members)
        assert times is not None
        np.testing.assert_allclose(times, [[0.7, 2.0], [0.7, 2.0]])
    with pytest.raises(ValueError, match="panel batches for parameter learning take the BHC"):
        jc.score_interventions(
            problem[1], space, INIT, HORIZON, key=jax.random.key(0), outcome=panel,
            batch=jc.Batch(2),
        )  # fmt: skip


def test_batches_with_an_initial_state_per_member(problem, greedy):
    """Each member from its own initial state: the same state in every slot is the shared
    batch; with two states, the parameter BHC of the greedy pair is the sum of the members'
    single BHC from their own states (score_interventions), round 2 equals GivenBatch's score of the
    pairs, and the first member is the best single experiment from slot 0's state."""
    _, rates, _, space = problem
    _, _, shared, _ = greedy("parameters-bhc")
    kwargs = {"criterion": jc.BHC(), "key": jax.random.key(3), "num_samples": NUM_DRAWS}
    same = jc.score_interventions(
        rates, space, jnp.stack([INIT, INIT]), HORIZON, batch=jc.Batch(2), **kwargs
    )
    np.testing.assert_array_equal(same.members, shared.members)
    np.testing.assert_allclose(same.round_scores, shared.round_scores, rtol=1e-12)
    states = jnp.array([[1, 0], [0, 1]])
    design = jc.score_interventions(rates, space, states, HORIZON, batch=jc.Batch(2), **kwargs)
    singles = [jc.score_interventions(rates, space, s, HORIZON, **kwargs) for s in states]
    first, second = (int(m) for m in design.members)
    assert first == int(jnp.argmax(singles[0]))
    np.testing.assert_allclose(design.round_scores[1], singles[0][first] + singles[1], rtol=1e-10)
    np.testing.assert_allclose(design.scores, [singles[0][first], singles[1][second]], rtol=1e-10)
    C = space.targets.shape[0]
    pairs = np.stack([np.full(C, first), np.arange(C)], 1)
    values = eqx.filter_jit(
        jax.vmap(
            lambda m: jc.score_interventions(
                rates, m, states, HORIZON, batch=GivenBatch(), **kwargs
            )
        )
    )(_rows(space, pairs))
    np.testing.assert_allclose(design.round_scores[1], values, rtol=1e-10)
    with pytest.raises(ValueError, match=r"initial_state: one state \(2,\) shared"):
        jc.score_interventions(
            rates, space, jnp.zeros((3, 2), int), HORIZON, batch=jc.Batch(2), **kwargs
        )
