"""Constraint-based pruning (`jaxctbn.CTPC`): the tests' p-values and the pruned pools against a
direct CTPC written here with numpy counts from the paths and scipy's F and chi-square laws
(mixed 2- and 3-state nodes, some paths under an intervention), the F test's level under known
independence, and the exact posterior over the survivors with the prior knowledge kept."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

import jaxctbn as jc
from jaxctbn._learning.independence import ctpc_pools, f_test_p_values, independence_p_values
from jaxctbn._learning.search_data import search_data

jax.config.update("jax_enable_x64", True)

CARDS = (2, 3, 2, 3, 2)
PARENTS = ((), (0,), (1,), (1, 2), ())  # X4 independent of everything


@pytest.fixture(scope="module")
def paths():
    model = jc.experiments.scaled_softmax_ctbn(PARENTS, CARDS, rate_fast=3.0)
    R, N = 40, len(CARDS)
    key_start, key_paths, key_clamped = jax.random.split(jax.random.key(7), 3)
    starts = jax.random.randint(key_start, (R, N), 0, jnp.asarray(CARDS)).astype(jnp.int32)
    free = jc.sample_trajectories(
        model, starts, 6.0, key=key_paths, num_trajectories=R, max_events=256
    )
    # a few paths under do(X0 = 1): X0's own statistics left out of them
    iv = jc.Intervention(
        targets=jnp.array([True, False, False, False, False]), states=jnp.array([1, 0, 0, 0, 0])
    )
    clamped = jc.sample_trajectories(
        model, starts[:8].at[:, 0].set(1), 6.0, key=key_clamped, num_trajectories=8,
        max_events=256, intervention=iv,
    )  # fmt: skip
    traj = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b]), free, clamped)
    assert not np.any(traj.truncated)
    return model, traj


def _counts(traj, n, parents):
    """numpy: dwell T[x, u] and transitions M[x, x', u] of node n under `parents` (mixed-radix
    configurations), path by path, leaving out the paths that clamp n."""
    arrays = jax.device_get(traj)
    k = CARDS[n]
    C = int(np.prod([CARDS[p] for p in parents])) if parents else 1
    T, M = np.zeros((k, C)), np.zeros((k, k, C))
    for r in range(arrays.initial_states.shape[0]):
        if arrays.intervention_targets[r, n]:
            continue
        J = int(arrays.num_events[r])
        states = np.concatenate([arrays.initial_states[r][None], arrays.states[r, :J]])
        edges = np.concatenate([[0.0], arrays.jump_times[r, :J], [arrays.durations[r]]])
        for i, s in enumerate(states):
            u = 0
            for p in parents:
                u = u * CARDS[p] + int(s[p])
            T[s[n], u] += edges[i + 1] - edges[i]
            if i + 1 < len(states) and states[i + 1][n] != s[n]:
                M[s[n], states[i + 1][n], u] += 1
    return T, M


def _p_values(traj, n, m, S):
    """The smallest F-test and chi-square p-values of X_n against X_m given S, by scipy."""
    T, M = _counts(traj, n, list(S) + [m])
    k, km = CARDS[n], CARDS[m]
    T = T.reshape(k, -1, km)
    M = M.reshape(k, k, -1, km)
    p_f, p_chi2 = [1.0], [1.0]
    for x in range(k):
        for s in range(T.shape[1]):
            for y in range(km):
                others = [v for v in range(km) if v != y]
                t1, t0 = T[x, s, y], T[x, s, others].sum()
                a = np.delete(M[x, :, s, y], x)
                b = np.delete(M[x, :, s, others].sum(0), x)
                r1, r0 = a.sum(), b.sum()
                if r1 == 0 or r0 == 0:
                    continue
                F = (r1 / t1) / (r0 / t0)
                cdf = scipy.stats.f.cdf(F, 2 * r0, 2 * r1)
                p_f.append(2 * min(cdf, 1 - cdf))
                if k >= 3:
                    K = np.sqrt(r0 / r1)
                    den = a + b
                    chi2 = np.sum(((K * a - b / K) ** 2 / np.where(den > 0, den, 1))[den > 0])
                    p_chi2.append(scipy.stats.chi2.sf(chi2, k - 2))
    return min(p_f), min(p_chi2)


def _direct_ctpc(traj, level, depth, pool_size, allowed, max_candidates=12):
    """CTPC as the module page states it, with the p-values of `_p_values`."""
    N = len(CARDS)
    candidates = {n: [m for m in range(N) if m != n and allowed[m, n]] for n in range(N)}
    strength = {}
    for size in range(depth + 1):
        removed = {}
        for n in range(N):
            removed[n] = set()
            for m in candidates[n]:
                others = [c for c in candidates[n] if c != m]
                if len(candidates[n]) <= size:
                    continue
                for S in itertools.combinations(others, size):
                    p_f, p_chi2 = _p_values(traj, n, m, S)
                    if size == 0:
                        strength[n, m] = min(p_f, p_chi2)
                    if p_f >= level and p_chi2 >= level:
                        removed[n].add(m)
                        break
        candidates = {n: [m for m in candidates[n] if m not in removed[n]] for n in range(N)}
        if size == 0:
            candidates = {
                n: sorted(candidates[n], key=lambda m: strength[n, m])[:max_candidates]
                for n in range(N)
            }
    pools = []
    for n in range(N):
        kept = sorted(candidates[n], key=lambda m: strength[n, m])[:pool_size]
        pools.append(tuple(sorted(kept)))
    return pools


def test_pools_equal_a_direct_ctpc_with_scipys_laws(paths):
    _, traj = paths
    allowed = ~np.eye(len(CARDS), dtype=bool)
    allowed[3, 1] = False  # X3 -> X1 forbidden
    search = jc.CTPC(alpha_f=0.05, alpha_chi2=0.05, pool_size=3)
    pools, summary = ctpc_pools(traj, CARDS, search, max_parents=3, forbidden_edges=[(3, 1)])
    got = [tuple(int(p) for p in row if p >= 0) for row in pools]
    assert got == _direct_ctpc(traj, 0.05, depth=2, pool_size=3, allowed=allowed)
    assert len(summary["tests"]) >= 2
    # only the most dependent candidate carried past the unconditional tests
    search = jc.CTPC(alpha_f=0.05, alpha_chi2=0.05, pool_size=3, max_candidates=1)
    pools, _ = ctpc_pools(traj, CARDS, search, max_parents=3, forbidden_edges=[(3, 1)])
    got_1 = [tuple(int(p) for p in row if p >= 0) for row in pools]
    assert got_1 == _direct_ctpc(traj, 0.05, 2, 3, allowed, max_candidates=1)
    assert all(len(g) <= 1 for g in got_1)
    # the true parents survive here (strong effects; false ones are left to the posterior)
    assert all(set(ps) <= set(g) for ps, g in zip(PARENTS, got))


def test_tests_restricted_to_candidates_equal_the_tests_over_every_node(paths, monkeypatch):
    """The tests of conditioning size >= 1 span only each node's surviving candidates
    (`columns`): their p-values equal those of the statistics over every node, in any order of
    the candidates, with empty slots; and with chunks cut short by the memory cap."""
    _, traj = paths
    N = len(CARDS)
    data = search_data(traj, CARDS)
    # conditioning sets of one node: node n's bases are (n + 1) % N and (n + 2) % N
    bases = np.array([[[(n + 1) % N], [(n + 2) % N]] for n in range(N)], np.int32)
    full = independence_p_values(data, jnp.asarray(bases), CARDS, 256)
    columns = np.full((N, 4), -1, np.int32)
    for n in range(N):  # three candidates, in a shuffled order, and an empty slot
        others = [m for m in range(N) if m != n]
        columns[n, :3] = np.random.default_rng(n).permutation(others)[:3]
    restricted = independence_p_values(data, jnp.asarray(bases), CARDS, 256, jnp.asarray(columns))
    for whole, part in zip(full, restricted):
        whole, part = np.asarray(whole), np.asarray(part)
        assert part.shape == (N, 2, 4)
        for n in range(N):
            np.testing.assert_allclose(part[n, :, :3], whole[n][:, columns[n, :3]], rtol=1e-10)
            np.testing.assert_array_equal(part[n, :, 3], 1.0)
        assert np.any(whole < 0.05)  # some tests reject: the comparison is not all ones
    # a cap of 37 segments per chunk (not a divisor of the segments: a padded last chunk)
    import jaxctbn._learning.moves as search_module

    per_row = N * (2 * 3 * 3 + 4 * 3)  # N x (sets x kmax x configurations + columns x kmax)
    monkeypatch.setattr(search_module, "_CHUNK_FLOATS", 37 * per_row)
    # (another chunk argument: a new trace, which reads the cap)
    capped = independence_p_values(data, jnp.asarray(bases), CARDS, 255, jnp.asarray(columns))
    assert data[0].shape[0] % 37 != 0 and data[0].shape[0] > 2 * 37
    for a, b in zip(restricted, capped):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-10)


def test_f_test_keeps_its_level_under_independence():
    """Under independence a state's rate is the same whatever Y's state, and the dwell until
    r jumps is Gamma(r, q): the F test at level 0.1 rejects 10% of the time up to Monte Carlo
    error; its p-values are scipy's."""
    rng = np.random.default_rng(0)
    n_tests, q = 4000, 0.8
    r1, r0 = rng.integers(1, 30, n_tests), rng.integers(1, 30, n_tests)
    t1, t0 = rng.gamma(r1, 1 / q), rng.gamma(r0, 1 / q)
    M_joint, M_base = np.zeros((n_tests, 2, 2)), np.zeros((n_tests, 2, 2))
    M_joint[:, 0, 1], M_base[:, 0, 1] = r1, r1 + r0
    ones = np.ones(n_tests)
    T_joint, T_base = np.stack([t1, ones], -1), np.stack([t1 + t0, 2 * ones], -1)
    p = np.asarray(f_test_p_values(M_joint, T_joint, M_base, T_base))
    assert np.all(np.isnan(p[:, 1]))  # state 1 never left: no test
    cdf = scipy.stats.f.cdf((r1 / t1) / (r0 / t0), 2 * r0, 2 * r1)
    np.testing.assert_allclose(p[:, 0], 2 * np.minimum(cdf, 1 - cdf), rtol=1e-9, atol=1e-12)
    rate = np.mean(p[:, 0] < 0.1)
    assert abs(rate - 0.1) < 4 * np.sqrt(0.1 * 0.9 / n_tests), rate
    # the published statistic (against the pooled rate, which contains this one; F(r1, r2))
    # is far from its level: why the module compares with the other states instead
    pooled = (r1 / t1) / ((r1 + r0) / (t1 + t0))
    cdf = scipy.stats.f.cdf(pooled, r1, r1 + r0)
    assert np.mean(2 * np.minimum(cdf, 1 - cdf) < 0.1) < 0.03


def test_learn_structure_with_ctpc_keeps_the_knowledge(paths):
    model, traj = paths
    names = [f"X{i}" for i in range(len(CARDS))]
    post = jc.learn_structure(
        traj, names, CARDS, max_parents=2, search=jc.CTPC(),
        knowledge=jc.PriorKnowledge(forbidden_edges=[(0, 1)], required_edges=[(4, 2)]),
    )  # fmt: skip
    edges = np.asarray(post.edge_marginals())
    assert edges[0, 1] == 0 and edges[4, 2] == pytest.approx(1.0)
    graph = post.map_graph()
    assert 4 in graph[2] and 0 not in graph[1]
    assert set(graph[3]) == {1, 2}  # the true parents where nothing forbids them
    with pytest.raises(ValueError, match="alpha_f: expected a level in"):
        jc.CTPC(alpha_f=1.5)
    with pytest.raises(ValueError, match="max_conditioning: expected an integer >= 0"):
        jc.CTPC(max_conditioning=-1)
