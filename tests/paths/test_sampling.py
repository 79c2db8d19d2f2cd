import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from helpers import random_model
from helpers import sample_trajectories_jit as sample

import jaxctbn as jc
from jaxctbn._paths.csv import trajectories_from_dataframe, trajectories_to_dataframe
from jaxctbn._paths.sampling import sample_trajectory
from jaxctbn._paths.sufficient_statistics import node_statistics

# Called eagerly, the sampler and the statistics compile one small program per primitive
# (hundreds per test); compiled whole, one program per shape. The same paths: the compiled and
# eager samplers are compared in test_same_key_same_paths_and_buffer_growth_keeps_paths.
statistics = eqx.filter_jit(jc.SufficientStatistics.from_trajectories)


def _brute_force_node_stats(traj, node, parents, cards):
    """Plain Python loop over one padded trajectory."""
    C = int(np.prod([cards[p] for p in parents]))
    k = cards[node]
    T = np.zeros((C, k))
    M = np.zeros((C, k, k))
    s = np.asarray(traj.initial_states).copy()
    t = 0.0
    m = int(traj.num_events)
    times = np.asarray(traj.jump_times)
    states = np.asarray(traj.states)

    def cfg(state):
        u = 0
        for p in parents:
            u = u * cards[p] + state[p]
        return u

    for i in range(m):
        T[cfg(s), s[node]] += times[i] - t
        nxt = states[i]
        if nxt[node] != s[node]:
            M[cfg(s), s[node], nxt[node]] += 1
        s, t = nxt, times[i]
    T[cfg(s), s[node]] += float(traj.durations) - t
    return M, T


def test_statistics_match_brute_force_loop(getkey):
    cards, parents = (2, 3, 2), ((2,), (0,), (1, 0))
    model = random_model(getkey(), cards, parents)
    # 20 paths: the sampler's program of the CSV round trip below
    traj = sample(model, [0, 1, 1], 2.0, key=getkey(), num_trajectories=20)
    assert not bool(traj.truncated.any())
    cases = [
        (n, P)
        for n in range(3)
        for P in [parents[n], (), tuple(m for m in range(3) if m != n)[::-1]]
    ]

    @jax.jit
    def per_trajectory(traj):  # node_statistics of one trajectory at a time, vmapped
        return [
            jax.vmap(lambda t, n=n, P=P: node_statistics(t, n, P, cards))(traj) for n, P in cases
        ]

    stats = per_trajectory(traj)
    for r in range(20):
        one = jax.tree_util.tree_map(lambda a: np.asarray(a)[r], traj)
        for (n, P), st in zip(cases, stats):
            M, T = _brute_force_node_stats(one, n, P, cards)
            np.testing.assert_allclose(st.transitions[r], M)
            np.testing.assert_allclose(st.dwell_times[r], T, rtol=1e-12, atol=1e-14)
        assert abs(float(stats[cases.index((0, ()))].dwell_times[r].sum()) - 2.0) < 1e-12


def test_rounded_shapes_add_empty_rows_and_change_no_statistic(getkey):
    """`Trajectories.with_rounded_shapes` (what the command line reads paths as): 20 rows to
    24, the event slots to a power of two; each given row's brute-force statistics unchanged,
    each added row's zero, and the pooled statistics (the update the CLI makes) equal bit for
    bit; one batch axis and concrete arrays only."""
    cards, parents = (2, 3, 2), ((2,), (0,), (1, 0))
    model = random_model(getkey(), cards, parents)
    traj = sample(model, [0, 1, 1], 2.0, key=getkey(), num_trajectories=20)
    rounded = traj.with_rounded_shapes()
    E = traj.max_events
    assert rounded.jump_times.shape == (24, 1 << (E - 1).bit_length())
    assert rounded.states.shape[:2] == rounded.jump_times.shape
    for r in (0, 7, 19, 20, 23):
        got = jax.tree_util.tree_map(lambda a: np.asarray(a)[r], rounded)
        for n in range(3):
            M, T = _brute_force_node_stats(got, n, parents[n], cards)
            if r < 20:
                given = jax.tree_util.tree_map(lambda a: np.asarray(a)[r], traj)
                M0, T0 = _brute_force_node_stats(given, n, parents[n], cards)
                np.testing.assert_array_equal(M, M0)
                np.testing.assert_allclose(T, T0, rtol=0, atol=1e-15)
            else:
                assert not M.any() and not T.any()
    pooled = jax.jit(
        lambda t: jc.SufficientStatistics.from_trajectories(t, cards, parents).pooled()
    )
    for a, b in zip(
        jax.tree_util.tree_leaves(pooled(traj)), jax.tree_util.tree_leaves(pooled(rounded))
    ):
        np.testing.assert_array_equal(a, b)
    two_axes = jax.tree_util.tree_map(lambda a: a.reshape(4, 5, *a.shape[1:]), traj)
    with pytest.raises(ValueError, match="with_rounded_shapes: needs one batch axis"):
        two_axes.with_rounded_shapes()
    with pytest.raises(ValueError, match="with_rounded_shapes: needs concrete trajectories"):
        jax.jit(lambda t: t.with_rounded_shapes().num_events)(traj)


@pytest.mark.parametrize("with_intervention", [False, True])
def test_monte_carlo_means_match_exact_expectations(with_intervention, getkey):
    cards, parents = (2, 3, 2), ((2,), (0,), (1, 0))
    model = random_model(getkey(), cards, parents)
    init = jnp.array([0, 2, 1])
    iv = jc.Intervention.perfect(model, {"X0": 1}) if with_intervention else None
    R = 4000
    traj = sample(
        model, init, 1.5, key=getkey(), num_trajectories=R, intervention=iv, max_events=128
    )
    assert not bool(traj.truncated.any())
    stats = statistics(traj, cards, parents)
    exact = jc.expected_statistics(model, init, 1.5, intervention=iv)
    zs = []
    for n in range(3):
        for sampled, expected in [
            (stats.nodes[n].dwell_times, exact.node_dwell_times(n)),
            (stats.nodes[n].transitions, exact.node_transitions(n)),
        ]:
            x = np.asarray(sampled).reshape(R, -1)
            e = np.asarray(expected).reshape(-1)
            se = x.std(0, ddof=1) / np.sqrt(R)
            ok = se > 0
            # entries never visited must be exactly zero in expectation too
            assert np.all(np.abs(e[~ok]) < 1e-3)
            zs.append((x.mean(0)[ok] - e[ok]) / se[ok])
    z = np.concatenate(zs)
    # ~40 statistics: all within 4.5 sd, and the z-scores look standard normal on average
    assert np.max(np.abs(z)) < 4.5, z
    assert abs(z.mean()) < 0.6 and 0.4 < z.std() < 1.6
    if with_intervention:
        assert np.all(np.asarray(traj.states)[..., 0] == 1)
        assert np.all(np.asarray(stats.nodes[0].transitions) == 0)


def test_truncation_is_flagged_and_refused(getkey):
    model = random_model(getkey(), (2, 2), ((), (0,)), scale=10.0)
    traj = sample(model, [0, 0], 5.0, key=getkey(), num_trajectories=3, max_events=4)
    assert bool(traj.truncated.all())
    assert np.all(np.asarray(traj.num_events) == 4)
    with pytest.raises(eqx.EquinoxRuntimeError, match="truncated"):
        statistics(traj, (2, 2), ((), (0,))).nodes[0].dwell_times.block_until_ready()
    with pytest.raises(ValueError, match="truncated"):
        trajectories_to_dataframe(traj, model)


def test_same_key_same_paths_and_buffer_growth_keeps_paths(getkey):
    """The same key gives the same paths, eagerly and compiled (which the other tests use), and
    a larger event buffer keeps them."""
    model = random_model(getkey(), (2, 2), ((), (0,)))
    key = getkey()
    a = jc.sample_trajectories(model, jnp.array([0, 0]), 3.0, key=key, num_trajectories=4)
    b = sample(model, [0, 0], 3.0, key=key, num_trajectories=4)
    c = sample(model, [0, 0], 3.0, key=key, num_trajectories=4, max_events=512)
    assert eqx.tree_equal(a, b)
    m = int(a.num_events.max())
    np.testing.assert_array_equal(a.jump_times[:, :m], c.jump_times[:, :m])
    np.testing.assert_array_equal(a.num_events, c.num_events)


def test_csv_round_trip_gives_identical_statistics(tmp_path, getkey):
    cards, parents = (2, 3, 2), ((2,), (0,), (1, 0))
    model = random_model(getkey(), cards, parents)
    iv = jc.Intervention.perfect(model, {"X2": 0})
    t1 = sample(model, [0, 1, 1], 2.0, key=getkey(), num_trajectories=20)
    t2 = sample(model, [1, 1, 1], 2.0, key=getkey(), num_trajectories=10, intervention=iv)
    path = tmp_path / "traj.csv"
    for traj in (t1, t2):
        traj.write_csv(path, model)
        back, ids = jc.Trajectories.read_csv(path, model)
        assert len(ids) == traj.num_trajectories
        s1 = statistics(traj, cards, parents)
        s2 = statistics(back, cards, parents)
        for a, b in zip(s1.nodes, s2.nodes):
            np.testing.assert_array_equal(a.transitions, b.transitions)
            np.testing.assert_array_equal(a.dwell_times, b.dwell_times)
        np.testing.assert_array_equal(s1.intervention_targets, s2.intervention_targets)
        np.testing.assert_array_equal(s1.intervention_states, s2.intervention_states)
    df = pd.read_csv(path)
    assert list(df.columns) == ["trajectory_id", "time", "X0", "X1", "X2", "intervention"]
    assert set(df["intervention"]) == {"X2=0"}


def _model_ab():
    return jc.CTBN(
        cims=[
            jnp.array([[[-1.0, 1.0], [1.0, -1.0]]]),
            jnp.array([[[-1.0, 1.0], [1.0, -1.0]], [[-2.0, 2.0], [2.0, -2.0]]]),
        ],
        parents={"A": [], "B": ["A"]},
        names=("A", "B"),
    )


def test_csv_writer_writes_what_pandas_writes(tmp_path, getkey):
    """`Trajectories.write_csv` formats the rows itself; the text is `DataFrame.to_csv`'s,
    quoting included (names with a comma or a quote), with and without interventions."""
    model = jc.CTBN(
        cims=[
            jnp.array([[[-1.0, 1.0], [1.0, -1.0]]]),
            jnp.array([[[-1.0, 1.0, 0.0], [1.0, -3.0, 2.0], [0.5, 0.5, -1.0]]] * 2),
        ],
        parents={"a,b": [], 'q"x': ["a,b"]},
        names=("a,b", 'q"x'),
    )
    iv = jc.Intervention.perfect(model, {"a,b": 1})
    for intervention, horizon in ((None, 2.0), (iv, 2.0), (None, 1e-9)):
        traj = sample(
            model, [0, 2], horizon, key=getkey(), num_trajectories=7, intervention=intervention
        )
        ours, theirs = tmp_path / "ours.csv", tmp_path / "pandas.csv"
        traj.write_csv(ours, model)
        trajectories_to_dataframe(traj, model).to_csv(theirs, index=False)
        assert ours.read_bytes() == theirs.read_bytes()


def test_rate_routes_and_shrinking_batches_give_the_same_paths(getkey, monkeypatch):
    """The sampler's shortcuts against the plain loop: rates from a table of every global
    state vs every node's conditional rates (the same numbers, so the same paths up to the
    rounding of their sums), and continuing the last running paths in smaller batches vs
    iterating over the whole batch to the end (exactly the same paths)."""
    import jaxctbn._paths.gillespie_loop as gillespie_loop
    import jaxctbn._paths.sampling as sampling

    model = random_model(getkey(), (2, 3, 2), ((2,), (0,), (1, 0)))
    iv = jc.Intervention.perfect(model, {"X2": 0})
    key = getkey()

    def sample():  # compiled whole, traced afresh (a new function) under each patch
        return eqx.filter_jit(
            lambda: jc.sample_trajectories(
                model,
                jnp.array([0, 1, 1]),
                2.0,
                key=key,
                num_trajectories=40,
                max_events=8,
                intervention=iv,
            )
        )()

    plain = sample()
    assert 0 < int(plain.truncated.sum()) < 40  # short and truncated paths both
    with monkeypatch.context() as m:
        m.setattr(gillespie_loop, "_SHRINK", 2)
        m.setattr(gillespie_loop, "_MIN_SHRUNK_BATCH", 3)  # batches of 40, 20, 10, 5
        assert eqx.tree_equal(sample(), plain)
    with monkeypatch.context() as m:
        m.setattr(sampling, "_MAX_TABLE_ENTRIES", 0)  # every node's rates, every jump
        nodes = sample()
    for field in ("states", "num_events", "truncated"):
        np.testing.assert_array_equal(getattr(nodes, field), getattr(plain, field))
    np.testing.assert_allclose(nodes.jump_times, plain.jump_times, rtol=1e-13)


def test_dataframe_with_shared_time_stamps_and_repeated_rows():
    model = _model_ab()
    df = pd.DataFrame(
        {
            "trajectory_id": ["a"] * 6,
            "time": [0.5, 1.0, 1.0, 1.5, 2.0, 2.5],
            "A": [0, 1, 1, 1, 1, 1],
            "B": [0, 0, 1, 1, 0, 0],
        }
    )
    traj, ids = trajectories_from_dataframe(df, model)
    assert ids == ["a"]
    A, B = statistics(traj, model.cardinalities, model.parents).total()
    np.testing.assert_allclose(A.dwell_times, [[0.5, 1.5]])
    np.testing.assert_allclose(A.transitions, [[[0, 1], [0, 0]]])
    # B: 0 under A=0 for 0.5; after the jump of A at t=1 (same time stamp) B jumps at once
    np.testing.assert_allclose(B.dwell_times, [[0.5, 0.0], [0.5, 1.0]])
    np.testing.assert_allclose(B.transitions[1], [[0, 1], [1, 0]])
    np.testing.assert_allclose(B.transitions[0], 0)


@pytest.mark.parametrize(
    "frame, message",
    [
        ({"trajectory_id": [0, 0], "time": [0, 1], "A": [0, 1], "B": [0, 1]}, "changes 2 nodes"),
        (
            {"trajectory_id": [0, 0], "time": [0, 1], "A": [0, 0], "C": [0, 1]},
            "unknown node column",
        ),
        ({"trajectory_id": [0, 0], "time": [0, 1], "A": [0, 0]}, "missing node column"),
        ({"trajectory_id": [0, 0], "time": [0, 1], "A": [0, 2], "B": [0, 0]}, "outside 0..1"),
        (
            {"trajectory_id": [0, 0, 0], "time": [0, 2, 1], "A": [0, 0, 0], "B": [0, 0, 0]},
            "non-decreasing",
        ),
        ({"trajectory_id": [0], "time": [0], "A": [0], "B": [0]}, "need the initial state"),
        (
            {
                "trajectory_id": [0, 0],
                "time": [0, 1],
                "A": [0, 0],
                "B": [0, 1],
                "intervention": ["B=0", "B=0"],
            },
            "not constantly",
        ),
        (
            {
                "trajectory_id": [0, 0],
                "time": [0, 1],
                "A": [0, 0],
                "B": [0, 0],
                "intervention": ["Z=0", "Z=0"],
            },
            "unknown node 'Z'",
        ),
        ({"trajectory_id": [0, 0], "A": [0, 0], "B": [0, 0]}, "missing column 'time'"),
    ],
)
def test_dataframe_bad_input(frame, message):
    with pytest.raises(ValueError, match=message):
        trajectories_from_dataframe(pd.DataFrame(frame), _model_ab())


def test_statistics_are_additive_and_pooling_skips_intervened(getkey):
    cards, parents = (2, 2, 2), ((), (0,), (1,))
    model = random_model(getkey(), cards, parents)
    iv = jc.Intervention.perfect(model, {"X1": 1})
    obs = sample(model, [0, 0, 0], 1.0, key=getkey(), num_trajectories=7)
    itv = sample(model, [0, 0, 0], 1.0, key=getkey(), num_trajectories=5, intervention=iv)

    @eqx.filter_jit
    def sums(obs, itv):
        s_obs = jc.SufficientStatistics.from_trajectories(obs, cards, parents)
        s_itv = jc.SufficientStatistics.from_trajectories(itv, cards, parents)
        s_all = s_obs.concatenate(s_itv)
        return s_obs.total(), s_itv.total(), s_all.pooled(), s_all.intervention_targets

    total_obs, total_itv, pooled, targets = sums(obs, itv)
    for n in range(3):
        expected = total_obs[n] if n == 1 else total_obs[n] + total_itv[n]
        np.testing.assert_allclose(pooled[n].dwell_times, expected.dwell_times, rtol=1e-12)
        np.testing.assert_allclose(pooled[n].transitions, expected.transitions)
    np.testing.assert_array_equal(targets[7:, 1], True)


def test_sampling_bad_input(getkey):
    model = random_model(getkey(), (2, 2), ((), (0,)))
    with pytest.raises(ValueError, match="max_events must be >= 1"):
        sample_trajectory(model, jnp.array([0, 0]), 1.0, key=getkey(), max_events=0)
    with pytest.raises(ValueError, match="initial_state"):
        sample_trajectory(model, jnp.array([0, 0, 0]), 1.0, key=getkey())
    with pytest.raises(eqx.EquinoxRuntimeError, match="node states must be in"):
        sample_trajectory(
            model, jnp.array([0, 5]), 1.0, key=getkey()
        ).num_events.block_until_ready()
    with pytest.raises(eqx.EquinoxRuntimeError, match="horizon"):
        sample_trajectory(
            model, jnp.array([0, 0]), -1.0, key=getkey()
        ).num_events.block_until_ready()


def test_rates_are_checked_before_and_after_an_intervention(getkey):
    """Bad rates in the model are reported under any intervention (a perfect one zeroes the
    clamped node's rates, so the sampler checks them once, before it); an imperfect one that
    makes rates negative is reported as such."""
    model = random_model(getkey(), (2, 2), ((), (0,)))
    nan = eqx.tree_at(
        lambda m: m.cims, model, (model.cims[0].at[0, 0, 1].set(jnp.nan), model.cims[1])
    )
    scaled = jc.Intervention.none(2).with_rate_scales([-jnp.ones(()), jnp.ones(())])
    cases = (
        (nan, jc.Intervention.perfect(nan, {"X0": 0}), r"cims\['X0'\]: .* NaN"),
        (model, scaled, r"cims under the intervention\['X0'\]: .* negative"),
    )
    for m, intervention, message in cases:
        with pytest.raises(eqx.EquinoxRuntimeError, match=message):
            sample_trajectory(
                m, jnp.array([0, 0]), 1.0, key=getkey(), intervention=intervention
            ).num_events.block_until_ready()


def test_initial_distribution_is_sampled(getkey):
    model = random_model(getkey(), (2, 3), ((), (0,)))
    p0 = jnp.array([0.1, 0.0, 0.2, 0.3, 0.25, 0.15])
    traj = sample(model, p0, 0.5, key=getkey(), num_trajectories=20000)
    init = np.asarray(traj.initial_states)
    idx = init[:, 0] * 3 + init[:, 1]
    freq = np.bincount(idx, minlength=6) / 20000
    se = np.sqrt(np.asarray(p0) * (1 - np.asarray(p0)) / 20000) + 1e-12
    assert np.max(np.abs(freq - np.asarray(p0)) / se) < 4.5
    assert freq[1] == 0.0
    # expected statistics from the distribution agree with the Monte Carlo mean
    st = statistics(traj, (2, 3), ((), (0,)))
    exact = jc.expected_statistics(model, p0, 0.5).node_dwell_times(1)
    mc = np.asarray(st.nodes[1].dwell_times)
    z = (mc.mean(0) - np.asarray(exact)) / (mc.std(0) / np.sqrt(20000))
    assert np.max(np.abs(z)) < 4.5
    with pytest.raises(ValueError, match="needs 6 probabilities"):
        sample_trajectory(model, jnp.ones(5) / 5, 1.0, key=getkey())


@pytest.mark.usefixtures("no_runtime_typecheck")
def test_sampling_argument_checks(getkey):
    model = random_model(getkey(), (2, 2), ((), (0,)))
    s0 = jnp.array([0, 0])
    for bad in (-1, 0):
        with pytest.raises(ValueError, match="num_trajectories must be >= 1"):
            jc.sample_trajectories(model, s0, 1.0, key=getkey(), num_trajectories=bad)
    with pytest.raises(ValueError, match="num_trajectories must be an integer"):
        jc.sample_trajectories(model, s0, 1.0, key=getkey(), num_trajectories=2.5)  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="max_events must be >= 1"):
        jc.sample_trajectories(model, s0, 1.0, key=getkey(), num_trajectories=2, max_events=0)
    with pytest.raises(ValueError, match="horizon: expected one number"):
        jc.sample_trajectories(model, s0, jnp.ones(2), key=getkey(), num_trajectories=2)


def test_capped_sampler_batches_doubles_and_refuses(getkey, monkeypatch, capsys):
    """The CLI's sampler: the same paths as one big buffer, whatever the batches and however
    the buffer grew; an estimate or a path over the cap raises."""
    from jaxctbn._paths import sampling as _sampling

    model = random_model(getkey(), (2, 2), ((), (0,)))
    key, R = getkey(), 5
    inits = jnp.array([[0, 0], [1, 0], [0, 1], [1, 1], [0, 0]])
    expect = sample(model, inits, 3.0, key=key, num_trajectories=R, max_events=64)
    assert not expect.truncated.any()
    monkeypatch.setattr(_sampling, "events_bound", lambda mean: 2)  # start too small: doubles
    monkeypatch.setattr(_sampling, "_BATCH_BYTES", 2 * 2 * 16)  # batches of 2 paths
    monkeypatch.setattr(_sampling, "_LONG_SAMPLING", 0.0)  # show the progress bar
    got = _sampling.sample_within_cap(model, inits, 3.0, key=key, num_trajectories=R, max_events=64)
    assert "sampling" in capsys.readouterr().err
    m = int(expect.num_events.max())
    assert got.max_events == m and not got.truncated.any()
    np.testing.assert_array_equal(got.num_events, expect.num_events)
    np.testing.assert_array_equal(got.jump_times, expect.jump_times[:, :m])
    np.testing.assert_array_equal(got.states, expect.states[:, :m])
    with pytest.raises(ValueError, match=f"--cap: a path of duration 3 has more than {m - 1}"):
        _sampling.sample_within_cap(
            model, inits, 3.0, key=key, num_trajectories=R, max_events=m - 1, name="--cap"
        )
    monkeypatch.undo()
    fast = random_model(getkey(), (2, 2), ((), (0,)), scale=1e12)
    with pytest.raises(ValueError, match=r"max_events: a path of duration 1 is expected to have"):
        _sampling.sample_within_cap(fast, inits, 1.0, key=key, num_trajectories=R, max_events=10**6)
