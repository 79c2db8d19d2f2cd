"""Graph search (`jaxctbn.HillClimbing`): the score of every move against a from-scratch score
of the moved set (family statistics by the scatter route), the moves that break the prior
knowledge refused, and the search's exact posterior against exhaustive scoring where both run
(same MAP graph and score)."""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxctbn as jc
from jaxctbn._learning.candidates import knowledge_arrays
from jaxctbn._learning.moves import move_scores
from jaxctbn._learning.scores import score_parent_sets
from jaxctbn._learning.search import _set_scores, hill_climb
from jaxctbn._learning.search_data import search_data

move_scores = eqx.filter_jit(move_scores)  # one program per shape (eagerly: many)

jax.config.update("jax_enable_x64", True)


def _network(N, cards, seed, max_parents=2):
    rng = np.random.default_rng(seed)
    parents = tuple(
        tuple(
            sorted(
                rng.choice(
                    [m for m in range(N) if m != n],
                    size=rng.integers(0, max_parents + 1),
                    replace=False,
                ).tolist()
            )
        )
        for n in range(N)
    )
    return jc.experiments.scaled_softmax_ctbn(parents, cards, rate_fast=2.0)


def _paths(model, R, seed, duration=5.0):
    N = model.num_nodes
    key_start, key_paths = jax.random.split(jax.random.key(seed))
    high = jnp.asarray(model.cardinalities)
    starts = jax.random.randint(key_start, (R, N), 0, high).astype(jnp.int32)
    traj = jc.sample_trajectories(
        model, starts, duration, key=key_paths, num_trajectories=R, max_events=256
    )
    assert not np.any(traj.truncated)
    return traj


@pytest.fixture(scope="module")
def mixed():
    # five nodes of two and three states, some paths under do(X1 = 0) (pooling)
    cards = (2, 3, 2, 2, 3)
    model = _network(5, cards, seed=1)
    traj = _paths(model, 25, seed=2)
    targets = np.zeros((25, 5), bool)
    targets[:8, 1] = True
    clamped = jc.sample_trajectories(
        model,
        jnp.zeros((8, 5), jnp.int32),
        5.0,
        key=jax.random.key(9),
        num_trajectories=8,
        max_events=256,
        intervention=jc.Intervention(targets=jnp.asarray(targets[0]), states=jnp.zeros(5, int)),
    )
    return cards, traj, clamped


def _from_scratch(traj, cards, wanted, prior, log_odds):
    """The local score of each `(node, parents)` in `wanted`, by the scatter route (one call)."""
    K = 3
    rows = [[np.full(K, -1, np.int32)] for _ in cards]  # a dummy row per node
    where = []
    for n, parents in wanted:
        row = np.full(K, -1, np.int32)
        row[: len(parents)] = sorted(parents)
        where.append((n, len(rows[n])))
        rows[n].append(row)
    stats = jc.internal.family_statistics(
        traj, cards, [np.stack(r) for r in rows], method="scatter"
    )
    scores = [np.asarray(s) for s in score_parent_sets(stats, prior=prior)]
    return [
        float(scores[n][i]) + sum(float(log_odds[m, n]) for m in parents)
        for (n, i), (_, parents) in zip(where, wanted)
    ]


@pytest.mark.parametrize("prior", [jc.GammaPrior(1.5, 0.7), jc.NodelmanPrior(2.0, 0.5)])
def test_every_move_score_equals_the_moved_set_scored_from_scratch(mixed, prior):
    cards, traj, _ = mixed
    N, K = 5, 3
    # knowledge: X4 -> X0 forbidden, X2 -> X3 required, X0 in-degree 1, tiers put X4 last
    tiers = (0, 0, 0, 0, 1)
    allowed, required, in_degree = knowledge_arrays(N, (1, 3, 3, 3, 3), [(2, 3)], [(4, 0)], tiers)
    held = np.asarray([[1, -1, -1], [0, 2, -1], [-1, -1, -1], [2, 4, -1], [0, 1, 3]], np.int32)
    held[3] = [2, -1, -1]  # X3 holds its required parent; X4 in the last tier
    pi = np.full((N, N), 0.3)
    log_odds = np.where(np.eye(N, dtype=bool), 0.0, np.log(pi) - np.log1p(-pi))
    data = search_data(traj, cards)
    rest = (
        jnp.asarray(log_odds),
        jnp.asarray(allowed),
        jnp.asarray(required),
        jnp.asarray(np.asarray(in_degree, np.int32)),
        64,  # several chunks
    )
    adds, removals, bases = move_scores(data, jnp.asarray(held), cards, prior, *rest)
    adds, removals = np.asarray(adds), np.asarray(removals)
    wanted, got = [], []
    for n in range(N):
        P = [int(p) for p in held[n] if p >= 0]
        for b in range(K + 1):
            if b == 0:
                base = P
            elif b - 1 < len(P):
                base = [p for i, p in enumerate(P) if i != b - 1]
            else:
                assert np.all(adds[n, b] == -np.inf) and removals[n, b] == -np.inf
                continue
            removal_ok = b > 0 and not required[P[b - 1], n]
            if removal_ok:
                wanted.append((n, base))
                got.append(removals[n, b])
            else:
                assert removals[n, b] == -np.inf
            for m in range(N):
                ok = (
                    (b == 0 or removal_ok)
                    and len(base) < in_degree[n]
                    and allowed[m, n]
                    and m not in P
                )
                if ok:
                    wanted.append((n, base + [m]))
                    got.append(adds[n, b, m])
                else:
                    assert adds[n, b, m] == -np.inf, (n, b, m)
    # the held sets' own scores (where each climb starts from)
    for n in range(N):
        wanted.append((n, [int(p) for p in held[n] if p >= 0]))
    got += list(np.asarray(_set_scores(data, cards, jnp.asarray(held), prior, rest[0], 64)))
    expected = _from_scratch(traj, cards, wanted, prior, log_odds)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)
    # without swaps: the additions and removals alone, the same numbers
    no_swaps, removals_too, _ = move_scores(data, jnp.asarray(held), cards, prior, *rest, False)
    np.testing.assert_allclose(no_swaps[:, 0], adds[:, 0], rtol=1e-12)
    assert np.all(np.asarray(no_swaps)[:, 1:] == -np.inf)
    np.testing.assert_allclose(removals_too, removals, rtol=1e-12)
    checked = len(wanted) - N
    assert checked >= 15
    # with candidates (statistics spanning them alone): the same scores of their additions,
    # -inf for every other node
    columns = np.asarray([[1, 3, -1], [4, 0, 2], [-1, -1, -1], [0, 1, 4], [2, -1, -1]], np.int32)
    few, removals_few, _ = move_scores(
        data, jnp.asarray(held), cards, prior, *rest, True, jnp.asarray(columns)
    )
    few = np.asarray(few)
    for n in range(N):
        listed = np.isin(np.arange(N), columns[n])
        np.testing.assert_allclose(few[n][:, listed], adds[n][:, listed], rtol=1e-12)
        assert np.all(few[n][:, ~listed] == -np.inf)
    np.testing.assert_allclose(removals_few, removals, rtol=1e-12)


def test_pooling_leaves_out_the_clamped_node_in_move_scores(mixed):
    # paths under do(X1 = 0) add nothing to X1's statistics: its move scores with and without
    # them are equal; another node's change
    cards, traj, clamped = mixed
    both = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b]), traj, clamped)
    held = jnp.asarray(np.full((5, 3), -1, np.int32))
    allowed, required, in_degree = knowledge_arrays(5, 3)
    args = (
        cards,
        jc.GammaPrior(),
        jnp.zeros((5, 5)),
        jnp.asarray(allowed),
        jnp.asarray(required),
        jnp.asarray(np.asarray(in_degree, np.int32)),
        128,
    )
    alone, _, _ = move_scores(search_data(traj, cards), held, *args)
    pooled, _, _ = move_scores(search_data(both, cards), held, *args)
    np.testing.assert_allclose(pooled[1], alone[1], rtol=1e-12)
    assert not np.allclose(pooled[0][0][1:], alone[0][0][1:])


def test_pool_statistics_by_tables_equal_the_scatter_route(mixed, monkeypatch):
    """The pool sets' statistics from each node's contingency table over its pool equal the
    scatter route's on the same sets (mixed numbers of states; paths with a clamped node)."""
    from jaxctbn._learning.search_pool import pool_parent_sets, pool_statistics

    cards, traj, clamped = mixed
    both = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b]), traj, clamped)
    pools = np.asarray([[1, 2, 4], [0, 3, -1], [0, 1, 3], [4, -1, -1], [0, 2, 3]], np.int32)
    sets = pool_parent_sets(pools, 2, forbidden_edges=[(4, 0)])
    data = search_data(both, cards)
    tables = pool_statistics(data, cards, jnp.asarray(pools), sets, 128)
    scatter = jc.internal.family_statistics(both, cards, list(sets), method="scatter")
    for n in range(5):
        np.testing.assert_allclose(tables.dwell_times[n], scatter.dwell_times[n], rtol=1e-12)
        np.testing.assert_allclose(tables.transitions[n], scatter.transitions[n], rtol=1e-12)
    assert sum(int(np.asarray(m).sum()) for m in tables.transitions) > 50  # not all empty
    # tables too large (a cap of 100 entries): the search's scatter route, the same numbers
    import jaxctbn._learning.search_pool as search_module

    monkeypatch.setattr(search_module, "_TABLE_ENTRIES", 100)
    by_sets = pool_statistics(data, cards, jnp.asarray(pools), sets, 127)  # (a new trace)
    for a, b in zip(
        by_sets.transitions + by_sets.dwell_times, tables.transitions + tables.dwell_times
    ):
        np.testing.assert_allclose(a, b, rtol=1e-12)


@pytest.fixture(scope="module")
def ten_nodes():
    model = _network(10, (2,) * 10, seed=4)
    return model, _paths(model, 40, seed=5)


def test_hill_climbing_finds_the_exhaustive_map_graph(ten_nodes):
    model, traj = ten_nodes
    names = [f"X{i}" for i in range(10)]
    exhaustive = jc.learn_structure(traj, names, (2,) * 10, max_parents=2)
    search = jc.HillClimbing(restarts=1, key=jax.random.key(0))
    found = jc.learn_structure(traj, names, (2,) * 10, max_parents=2, search=search)
    assert found.map_graph() == exhaustive.map_graph()
    # the MAP set's score is the exhaustive one (the same family, scored by the same route)
    for n in range(10):
        i = int(found.map_indices()[n])
        j = int(exhaustive.map_indices()[n])
        assert float(found.log_marginal_likelihoods[n][i]) == pytest.approx(
            float(exhaustive.log_marginal_likelihoods[n][j]), rel=1e-12
        )
    # the search's sets are a subset of the exhaustive ones, at most 22 per node (pool of 6)
    for n in range(10):
        rows = {tuple(r) for r in np.asarray(found.parent_sets[n])}
        assert rows <= {tuple(r) for r in np.asarray(exhaustive.parent_sets[n])}
        assert len(rows) <= 1 + 6 + 15
    # the edges the data support most are in both with similar marginals
    strong = np.asarray(exhaustive.edge_marginals()) > 0.99
    assert np.all(np.asarray(found.edge_marginals())[strong] > 0.99)
    # same key, same result
    again = jc.learn_structure(traj, names, (2,) * 10, max_parents=2, search=search)
    for a, b in zip(again.parent_sets, found.parent_sets):
        np.testing.assert_array_equal(a, b)
    # the sparse candidates (4 per node, screened by one step of additions): the same MAP
    # graph, and every set scored within each node's 4 best single additions
    sparse = jc.HillClimbing(candidates=4)
    few = jc.learn_structure(traj, names, (2,) * 10, max_parents=2, search=sparse)
    assert few.map_graph() == exhaustive.map_graph()
    single = np.asarray(exhaustive.log_marginal_likelihoods[0])  # node 0's sets, scored
    sets0 = np.asarray(exhaustive.parent_sets[0])
    alone = {int(r[0]): single[i] for i, r in enumerate(sets0) if (r >= 0).sum() == 1}
    best4 = sorted(alone, key=lambda m: -alone[m])[:4]
    assert {int(p) for r in np.asarray(few.parent_sets[0]) for p in r if p >= 0} <= set(best4)


def test_tabu_search_escapes_local_maxima_and_keeps_the_best_set_seen():
    # little data (6 paths of 3 time units) and in-degree 3 without swaps: plain hill climbing
    # stops below the exhaustive best at four of the ten nodes (seed 32, measured)
    N = 10
    model = _network(N, (2,) * N, seed=32, max_parents=3)
    traj = _paths(model, 6, seed=33, duration=3.0)
    names = [f"X{i}" for i in range(N)]
    exhaustive = jc.learn_structure(traj, names, (2,) * N, max_parents=3)
    scored = [  # per node: parent set -> its exhaustive score
        {tuple(int(p) for p in row if p >= 0): float(v) for row, v in zip(rows, values)}
        for rows, values in zip(
            map(np.asarray, exhaustive.parent_sets),
            map(np.asarray, exhaustive.log_marginal_likelihoods),
        )
    ]
    best = np.array([max(d.values()) for d in scored])

    def climb(tabu):
        search = jc.HillClimbing(swaps=False, tabu=tabu)
        res = hill_climb(traj, (2,) * N, search, prior=exhaustive.prior, max_parents=3)
        return np.asarray(res.sets), np.asarray(res.scores)

    _, plain = climb(0)
    sets, tabu = climb(2)
    # every returned set's score is its exhaustive score (the best set seen, not the last)
    for n in range(N):
        key = tuple(sorted(int(p) for p in sets[n] if p >= 0))
        assert tabu[n] == pytest.approx(scored[n][key], rel=1e-9)
    assert np.all(tabu >= plain - 1e-9 * np.abs(plain)) and np.all(tabu <= best + 1e-9)
    stuck = plain < best - 1e-6
    assert stuck.sum() >= 3
    escaped = stuck & (tabu > best - 1e-6)
    assert escaped.sum() >= 2, (best - plain, best - tabu)
    with pytest.raises(ValueError, match="tabu: expected an integer >= 0"):
        jc.HillClimbing(tabu=-1)


@pytest.mark.slow  # (the command line test runs the search with the same knowledge)
def test_hill_climbing_keeps_the_prior_knowledge(ten_nodes):
    model, traj = ten_nodes
    names = [f"X{i}" for i in range(10)]
    truth = model.parents
    child = next(n for n in range(10) if truth[n])
    parent = truth[child][0]
    forbidden = [(parent, child)]
    spare = next(m for m in range(10) if m != child and m not in truth[child])
    required = [(spare, child)]
    tiers = [0] * 5 + [1] * 5
    if tiers[spare] > tiers[child]:
        tiers = [0] * 10
    post = jc.learn_structure(
        traj, names, (2,) * 10, max_parents=3, search=jc.HillClimbing(),
        knowledge=jc.PriorKnowledge(
            forbidden_edges=forbidden, required_edges=required, tiers=tiers
        ),
    )  # fmt: skip
    edges = np.asarray(post.edge_marginals())
    assert edges[parent, child] == 0 and edges[spare, child] == pytest.approx(1.0)
    tier = np.asarray(tiers)
    assert np.all(edges[tier[:, None] > tier[None, :]] == 0)


def test_hill_climbing_arguments_and_jit(ten_nodes):
    _, traj = ten_nodes
    with pytest.raises(ValueError, match="restarts: expected an integer >= 0"):
        jc.HillClimbing(restarts=-1)
    with pytest.raises(ValueError, match="key: random restarts need a PRNG key"):
        jc.HillClimbing(restarts=2)
    with pytest.raises(ValueError, match="pool_size: expected an integer >= 1"):
        jc.HillClimbing(pool_size=0)
    with pytest.raises(ValueError, match="candidates: expected an integer >= 1"):
        jc.HillClimbing(candidates=0)
    names = [f"X{i}" for i in range(10)]
    with pytest.raises(ValueError, match="search: HillClimbing needs concrete trajectories"):
        jax.jit(
            lambda t: jc.learn_structure(
                t, names, (2,) * 10, max_parents=2, search=jc.HillClimbing()
            ).log_evidence()
        )(traj)
    with pytest.raises(ValueError, match="search: expected Exhaustive"):
        jc.learn_structure(traj, names, (2,) * 10, max_parents=2, search="hill")  # type: ignore
    # the searches read the data on the host: bad paths are one-line ValueErrors, before any
    # statistic (a state out of range names the node; a cut path; jump times out of order)
    jumps = np.asarray(traj.jump_times).copy()
    jumps[3, :2] = jumps[3, 1::-1]
    states = np.asarray(traj.states).copy()
    states[0, 0, 4] = 2
    bad = {
        "states of node 'X4' must be in 0..1|X4' has states 0..2": eqx.tree_at(
            lambda t: t.states, traj, jnp.asarray(states)
        ),
        "a path was truncated": eqx.tree_at(
            lambda t: t.truncated, traj, traj.truncated.at[1].set(True)
        ),
        "jump times of real events must be finite, non-decreasing": eqx.tree_at(
            lambda t: t.jump_times, traj, jnp.asarray(jumps)
        ),
    }
    for search in (jc.HillClimbing(), jc.CTPC()):
        for message, paths in bad.items():
            with pytest.raises(ValueError, match=message):
                jc.learn_structure(paths, names, (2,) * 10, max_parents=2, search=search)


def test_candidate_sets_from_pools_are_every_subset(ten_nodes):
    from jaxctbn._learning.search_pool import pool_parent_sets

    pools = np.full((4, 3), -1)
    pools[0] = [1, 2, 3]
    pools[1] = [0, -1, -1]
    sets = pool_parent_sets(pools, 2, forbidden_edges=[(3, 0)])
    got = {tuple(int(p) for p in r if p >= 0) for r in np.asarray(sets[0])}
    assert got == {c for k in range(3) for c in itertools.combinations((1, 2), k)}
    assert {tuple(int(p) for p in r if p >= 0) for r in np.asarray(sets[1])} == {(), (0,)}
    assert {tuple(int(p) for p in r if p >= 0) for r in np.asarray(sets[2])} == {()}
