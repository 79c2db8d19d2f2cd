"""The Monte Carlo (Gillespie) expected statistics (jaxctbn.Gillespie): unbiased against the
exact solver, with standard errors that match the spread over independent keys, and the same
numbers as an independent numpy computation on the same sampled paths."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_model

import jaxctbn as jc
from jaxctbn._paths.sampling import automatic_max_events
from jaxctbn._paths.sufficient_statistics import node_statistics

CARDS, PARENTS = (2, 3, 2, 2), ((), (0,), (0, 1), (2,))
INIT = jnp.array([1, 0, 0, 1])
TAU = 2.0
EXACT = jc.Uniformisation()  # the exact reference (not a default that may change)
MAX_EVENTS = 64  # above automatic_max_events of these rates (<= 2) x the rate scales (<= 3)
# (node, parent set): own parents (None), the empty set, sets with and without the true parents
CASES = [
    (0, None),
    (1, None),
    (2, None),
    (3, None),
    (1, ()),
    (2, ()),
    (2, (3,)),  # none of the true parents (0, 1)
    (2, (1,)),  # one of them
    (2, (3, 1, 0)),  # all of them and another, in another order
    (3, (0, 1)),  # not the true parent (2)
]
# node 2 on padded parent sets, and the same sets as cases
SETS = jnp.array([[-1, -1], [3, -1], [0, 1], [1, -1]])
SETS_AS_CASES = [(2, ()), (2, (3,)), (2, None), (2, (1,))]


def _interventions(model):
    """None, a perfect one (the ternary node clamped) and an imperfect one, as one batch."""
    ones = [1.0] * len(CARDS)
    none = jc.Intervention.none(len(CARDS)).with_rate_scales(ones)
    perfect = jc.Intervention.perfect(model, {"X1": 2}).with_rate_scales(ones)
    imperfect = jc.Intervention.none(len(CARDS)).with_rate_scales([2.0, 0.5, 1.0, 3.0])
    return jax.tree_util.tree_map(lambda *a: jnp.stack(a), none, perfect, imperfect)


MODEL = random_model(jax.random.key(7), CARDS, PARENTS)
KEYS, PATHS = 32, 100  # independent keys x paths per key: 3200 paths per intervention
PUBLIC = [(2, None), (2, (3,)), (1, ())]  # the cases read through the public means and errors


@pytest.fixture(scope="module")
def exact():
    """The exact statistics of `MODEL` for `CASES` under each of `_interventions`, as numpy
    arrays `[(M, T), ...]` with a leading intervention axis."""

    @jax.jit
    def run(ivs):
        def one(iv):
            st = jc.expected_statistics(MODEL, INIT, TAU, intervention=iv, solver=EXACT)
            return [(st.node_transitions(n, P), st.node_dwell_times(n, P)) for n, P in CASES]

        return jax.vmap(one)(ivs)

    return jax.tree_util.tree_map(np.asarray, run(_interventions(MODEL)))


@jax.jit
def _sample(keys, ivs):
    """For every key and intervention (one key shared by the interventions: common random
    numbers): the per-path statistics for `CASES`, node 2's means on `SETS`, and the public
    means and standard errors for `PUBLIC`. One compilation serves the tests below."""

    def one(key, iv):
        solver = jc.Gillespie(key=key, num_paths=PATHS, max_events=MAX_EVENTS)
        st = jc.expected_statistics(MODEL, INIT, TAU, intervention=iv, solver=solver)
        public = [
            (
                st.node_transitions(n, P),
                st.node_transitions_standard_error(n, P),
                st.node_dwell_times(n, P),
                st.node_dwell_times_standard_error(n, P),
            )
            for n, P in PUBLIC
        ]
        per_path = [st.path_statistics(n, P) for n, P in CASES]
        return per_path, st.node_statistics_on_sets(2, SETS), public, st.final_states

    return jax.vmap(lambda key: jax.vmap(lambda iv: one(key, iv))(ivs))(keys)


@pytest.fixture(scope="module")
def sampled():
    keys = jax.random.split(jax.random.key(11), KEYS)
    return keys, jax.tree_util.tree_map(np.asarray, _sample(keys, _interventions(MODEL)))


def test_unbiased_against_the_exact_solver(sampled, exact):
    """Means over all paths within 4 standard errors of the exact statistics, for every node on
    its own parents, on the empty set and on sets with and without its true parents, with no,
    a perfect and an imperfect intervention (vmapped); the standard errors are small (the check
    has power); the padded-set projections equal the per-set ones; a perfectly intervened node
    has no transitions."""
    _, (per_path, on_sets, _, _) = sampled
    R = KEYS * PATHS
    for (M, T), (M_x, T_x) in zip(per_path, exact):
        for est, ref in ((M, M_x), (T, T_x)):
            est = np.moveaxis(est, 1, 0).reshape(3, R, *est.shape[3:])  # (interventions, paths)
            mean, se = est.mean(1), est.std(1, ddof=1) / np.sqrt(R)
            assert np.all(np.abs(mean - ref) <= 4 * se + 1e-3)
            assert float(se.max()) < 0.03 and float(np.abs(ref).max()) > 0.3
    # the clamped ternary node (member 1: the perfect intervention) never moves
    np.testing.assert_array_equal(per_path[CASES.index((1, None))][0][:, 1], 0.0)
    # node 2 on the padded SETS equals the means of the per-set projections
    M_sets, T_sets = on_sets
    for s, case in enumerate(SETS_AS_CASES):
        M, T = per_path[CASES.index(case)]
        rows = T.shape[-2]
        np.testing.assert_allclose(M_sets[:, :, s, :rows], M.mean(2), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(T_sets[:, :, s, :rows], T.mean(2), rtol=1e-12, atol=1e-14)
        np.testing.assert_array_equal(T_sets[:, :, s, rows:], 0.0)


def test_standard_errors_match_the_spread_over_keys(sampled):
    """The means and standard errors are those of the per-path estimates, and over the 32
    independent keys the spread of the means equals the standard errors each run reports
    (loosely per entry, the sample std of 32 values being good to about 13%, and more tightly
    pooled over the entries)."""
    _, (per_path, _, public, _) = sampled
    spread2, reported2 = [], []
    for (M, M_se, T, T_se), case in zip(public, PUBLIC):
        M_path, T_path = per_path[CASES.index(case)]
        for mean, se, est in ((M, M_se, M_path), (T, T_se, T_path)):
            np.testing.assert_allclose(mean, est.mean(2), rtol=1e-12, atol=1e-15)
            want = est.std(2, ddof=1) / np.sqrt(PATHS)
            np.testing.assert_allclose(se, want, rtol=1e-10, atol=1e-15)
            spread = np.std(mean, axis=0, ddof=1)  # over the keys
            reported = np.sqrt(np.mean(se**2, axis=0))
            big = reported > 0.01
            ratio = spread[big] / reported[big]
            assert np.all((0.5 < ratio) & (ratio < 1.6)), ratio
            spread2.append(spread[big] ** 2)
            reported2.append(reported[big] ** 2)
    spread2, reported2 = np.concatenate(spread2), np.concatenate(reported2)
    assert spread2.size >= 40
    assert 0.85 < np.sqrt(spread2.sum() / reported2.sum()) < 1.15


def test_paths_and_estimates_by_an_independent_route(sampled):
    """The solver samples the paths `sample_trajectories` draws with its key (same key, same
    result; another key, another one): its per-path dwell times equal `node_statistics` of
    those trajectories, and its Rao-Blackwellised transitions equal a numpy sum of duration
    times rate over the segments; they have the mean of the jump counts and a smaller spread."""
    keys, (per_path, _, _, final) = sampled
    ivs = _interventions(MODEL)
    again = jax.tree_util.tree_map(np.asarray, _sample(keys, ivs))
    other = jax.tree_util.tree_map(np.asarray, _sample(jax.random.split(keys[0], KEYS), ivs))
    case = CASES.index((2, (3, 1, 0)))
    np.testing.assert_array_equal(again[0][case][0], per_path[case][0])
    assert np.abs(other[0][case][0].mean((0, 2)) - per_path[case][0].mean((0, 2))).max() > 1e-6
    member, node, parents = 2, 2, (3, 1, 0)  # the imperfect intervention
    iv = jax.tree_util.tree_map(lambda a: a[member], ivs)

    @jax.jit
    def sample_and_count(keys):
        def one(key):
            paths = jc.sample_trajectories(
                MODEL,
                INIT,
                TAU,
                key=key,
                num_trajectories=PATHS,
                intervention=iv,
                max_events=MAX_EVENTS,
            )
            return paths, jax.vmap(lambda t: node_statistics(t, node, parents, CARDS))(paths)

        return jax.vmap(one)(keys)

    paths, counted = jax.tree_util.tree_map(np.asarray, sample_and_count(keys))
    M, T = (a[:, member] for a in per_path[case])  # (keys, paths, ...)
    np.testing.assert_allclose(T, counted.dwell_times, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(final[:, member], paths.states[:, :, -1])

    # numpy: sum over the segments of duration x rate, binned by (X3, X1, X0) and X2
    rates = np.asarray(MODEL.cims[node])  # node 2's rate scale is 1
    for key in range(4):
        M_np = np.zeros((PATHS, 12, 2, 2))
        for r in range(PATHS):
            count = paths.num_events[key, r]
            seq = [paths.initial_states[key, r], *paths.states[key, r, :count]]
            times = [0.0, *paths.jump_times[key, r, :count], TAU]
            for s, t0, t1 in zip(seq, times[:-1], times[1:]):
                x, u_true, u = s[2], s[0] * 3 + s[1], s[3] * 6 + s[1] * 2 + s[0]
                M_np[r, u, x, 1 - x] += (t1 - t0) * rates[u_true, x, 1 - x]
        np.testing.assert_allclose(M[key], M_np, rtol=1e-10, atol=1e-13)

    # both unbiased for the same expectation; the integral has the smaller spread
    M, counts = M.reshape(-1, 12, 2, 2), counted.transitions.reshape(-1, 12, 2, 2)
    se_rb = np.std(M, axis=0, ddof=1) / np.sqrt(len(M))
    se_count = np.std(counts, axis=0, ddof=1) / np.sqrt(len(M))
    both = np.sqrt(se_rb**2 + se_count**2)
    assert np.all(np.abs(M.mean(0) - counts.mean(0)) <= 4 * both + 1e-3)
    off = ~np.eye(2, dtype=bool)
    assert np.sum(se_rb[:, off] ** 2) < 0.7 * np.sum(se_count[:, off] ** 2)


def test_design_criteria_and_gradients(getkey):
    """`score_interventions` takes the solver (the same paths for every candidate): the scores
    are close to the exact ones. Under `jax.grad` the transitions on the true parents have
    gradient T with respect to their rates (the paths held fixed) and the dwell times none."""
    cards, parents = (2, 3, 2), ((), (0,), (1,))
    truth = random_model(getkey(), cards, parents)
    post = jc.RatePosterior.for_model(truth, prior=jc.GammaPrior(1.0, 1.0))
    space = jc.single_node_interventions(cards)
    init, key = jnp.array([0, 1, 0]), getkey()
    solver = jc.Gillespie(key=getkey(), num_paths=500, max_events=64)
    exact = jc.score_interventions(post, space, init, 1.5, key=key, num_samples=3, solver=EXACT)
    mc = jc.score_interventions(post, space, init, 1.5, key=key, num_samples=3, solver=solver)
    np.testing.assert_allclose(mc, exact, rtol=0.05, atol=0.01 * float(np.abs(exact).max()))

    def loss(cims):
        m = eqx.tree_at(lambda m: m.cims, truth, cims)
        st = jc.expected_statistics(m, init, 1.5, solver=solver)
        total = sum((st.node_transitions(n) * (n + 1)).sum() for n in range(3))
        return total + (st.node_dwell_times(1, (0, 2)) ** 2).sum(), [
            st.node_dwell_times(n) for n in range(3)
        ]

    grad, dwell = jax.jit(jax.grad(loss, has_aux=True))(truth.cims)
    for n, k in enumerate(cards):
        T = np.asarray(dwell[n])
        want = (n + 1) * np.where(np.eye(k, dtype=bool), 0.0, T[:, :, None])
        np.testing.assert_allclose(grad[n], want, rtol=1e-12, atol=1e-14)
        assert float(np.abs(want).max()) > 0.1


def test_a_network_too_large_for_the_global_state_space(getkey):
    """N = 40 binary nodes (2^40 global states) in a chain: the root's statistics agree with the
    exact solution of the root alone, every path spends exactly the horizon in each node, and
    on the true parents the transitions are the rates times the dwell times, path by path."""
    N, tau = 40, 2.0
    chain = ((),) + tuple((n - 1,) for n in range(1, N))
    model = random_model(getkey(), (2,) * N, chain)
    solver = jc.Gillespie(key=getkey(), num_paths=300, max_events=automatic_max_events(model, tau))
    nodes = (0, 39)

    @jax.jit
    def run(model):
        st = jc.expected_statistics(model, jnp.zeros(N, jnp.int32), tau, solver=solver)
        return [st.path_statistics(n) for n in nodes], st.node_dwell_times_standard_error(0)

    per_path, se = run(model)
    # the root alone is a two-state chain from state 0 with rates a (0 -> 1) and b (1 -> 0):
    # its time in state 0 is b tau / (a + b) + a (1 - exp(-(a + b) tau)) / (a + b)^2
    a, b = float(model.cims[0][0, 0, 1]), float(model.cims[0][0, 1, 0])
    zero = b * tau / (a + b) + a * (1 - np.exp(-(a + b) * tau)) / (a + b) ** 2
    exact = np.array([[zero, tau - zero]])
    assert np.all(np.abs(per_path[0][1].mean(0) - exact) <= 4 * se + 1e-3)
    for n, (M, T) in zip(nodes, per_path):
        np.testing.assert_allclose(T.sum((1, 2)), tau, rtol=1e-12)
        rates = np.where(np.eye(2, dtype=bool), 0.0, np.asarray(model.cims[n]))
        np.testing.assert_allclose(M, T[..., None] * rates, rtol=1e-12, atol=1e-14)


@pytest.mark.usefixtures("no_runtime_typecheck")
def test_bad_input_truncation_and_automatic_buffer(getkey):
    """One-line errors naming the argument; a path longer than `max_events` raises instead of
    being cut; `max_events=None` sizes the buffer outside jit and asks for it inside."""
    key = getkey()
    for kwargs, name in [
        ({"num_paths": 1}, "num_paths"),
        ({"num_paths": 10.0}, "num_paths"),
        ({"num_paths": True}, "num_paths"),
        ({"max_events": 0}, "max_events"),
        ({"key": 3}, "key"),
        ({"key": jax.random.split(key, 2)}, "key"),
    ]:
        with pytest.raises(ValueError, match=name) as info:
            jc.Gillespie(**{"key": key, **kwargs})
        assert "\n" not in str(info.value)
    with pytest.raises(TypeError):
        jc.Gillespie(key, 10)  # type: ignore[misc]
    model = random_model(getkey(), (2, 2), ((), (0,)))
    solver = jc.Gillespie(key=key, num_paths=10, max_events=2)
    with pytest.raises(ValueError, match="initial_state"):
        jc.expected_statistics(model, jnp.array([0, 1, 0]), 1.0, solver=solver)

    @jax.jit
    def transitions(model, tau):
        st = jc.expected_statistics(model, jnp.array([0, 1]), tau, solver=solver)
        return st.node_transitions(1)

    transitions(model, 0.01)  # no jump is likely in 0.01
    with pytest.raises(Exception, match="max_events"):  # rates >= 0.2: >= 20 jumps expected
        jax.block_until_ready(transitions(model, 50.0))
    automatic = jc.Gillespie(key=key, num_paths=10)
    with pytest.raises(ValueError, match="max_events"):
        jax.jit(lambda m: jc.expected_statistics(m, jnp.array([0, 1]), 1.0, solver=automatic))(
            model
        )
    # outside jit, max_events=None sizes the buffer; float32 rates stay float32
    model32 = jax.tree_util.tree_map(lambda c: c.astype(jnp.float32), model)
    stats = jc.expected_statistics(model32, jnp.array([0, 1]), 1.0, solver=automatic)
    assert stats.segment_states.shape[1] - 1 == automatic_max_events(model32, 1.0)
    assert stats.segment_durations.dtype == jnp.float32
    assert jax.jit(lambda st: st.node_transitions(1))(stats).dtype == jnp.float32
