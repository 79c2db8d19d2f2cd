"""Panel trajectories of very unequal lengths in buckets (`jaxctbn.panel.PanelBuckets`): every
panel function gives, trajectory by trajectory and in the given order, what it gives on the same
data padded into one batch (the route tested against dense references elsewhere); the grouping
keeps the padded cells near the data's size; messages name a trajectory by its given index."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

import jaxctbn as jc
from jaxctbn._experiments.pool_subjects import pool_membership
from jaxctbn._panel.buckets import bucket_rows, per_trajectory_on_host, rounded_size
from jaxctbn._panel.fit_problem import fit_problem as _problem

jax.config.update("jax_enable_x64", True)

MODEL = jc.CTBN(
    cims=[
        jnp.array([[[-0.5, 0.5], [0.7, -0.7]], [[-0.2, 0.2], [0.3, -0.3]]]),
        jnp.array([[[-1.0, 1.0], [0.1, -0.1]], [[-0.1, 0.1], [1.0, -1.0]]]),
    ],
    parents=((1,), (0,)),
    names=("A", "B"),
)
LENGTHS = [2, 9, 3, 30, 5, 1, 12, 4, 7, 26, 2, 6]


def _sequences(seed=0, lengths=LENGTHS):
    """Per trajectory: increasing times and states of two binary nodes (some missing, every
    first observation complete), of the given lengths."""
    rng = np.random.default_rng(seed)
    times, states = [], []
    for m in lengths:
        times.append(np.cumsum(rng.choice([0.5, 1.0, 1.7], size=m)))
        y = rng.integers(0, 2, size=(m, 2))
        y = np.where(rng.random((m, 2)) < 0.2, -1, y)
        y[0] = rng.integers(0, 2, size=2)
        states.append(y)
    return times, states


def _buckets_by_hand(padded: jc.panel.PanelObservations, groups):
    """The trajectories of a padded flat batch in the given groups (rows in a scrambled order),
    each padded only to its own longest."""
    return jc.panel.PanelBuckets.from_observations(padded, groups=groups)


GROUPS = [np.array([5, 0, 10, 2, 7, 4, 11, 8, 1, 6]), np.array([9, 3])]
DENSE = jc.MatrixExponential()


@pytest.fixture(scope="module")
def data():
    times, states = _sequences()
    padded = jc.panel.PanelObservations.from_sequences(times, states)
    return padded, _buckets_by_hand(padded, GROUPS)


def test_bucket_rows_keeps_the_padding_near_the_data():
    # the data: one 50,000-visit subject among 5,000 with ten visits
    lengths = np.array([10] * 2500 + [50_000] + [10] * 2500)
    groups = bucket_rows(lengths)
    assert [len(g) for g in groups] == [5000, 1] and groups[1].tolist() == [2500]
    cells = sum(len(g) * lengths[g].max() for g in groups)
    assert cells == lengths.sum()  # the padded batch: 250,050,000 cells
    # alike lengths: one bucket; spread lengths: the padded cells within 2x of the data
    assert len(bucket_rows(np.full(300, 7))) == 1
    spread = np.random.default_rng(0).integers(1, 20_000, size=2_000)
    groups = bucket_rows(spread)
    assert len(groups) > 1 and len(groups) <= 8
    assert sorted(np.concatenate(groups).tolist()) == list(range(len(spread)))
    assert sum(len(g) * spread[g].max() for g in groups) <= 2 * spread.sum()
    assert len(bucket_rows(spread, max_buckets=1)) == 1
    with pytest.raises(ValueError, match="max_buckets"):
        bucket_rows(spread, max_buckets=0)


def test_buckets_round_trip_and_check_their_structure(data):
    padded, buckets = data
    assert buckets.batch_shape == (len(LENGTHS),) and buckets.num_nodes == 2
    again = buckets.padded()
    assert np.array_equal(np.asarray(again.num_observations), np.asarray(padded.num_observations))
    valid = np.arange(padded.times.shape[-1]) < np.asarray(padded.num_observations)[:, None]
    assert np.array_equal(np.asarray(again.times)[valid], np.asarray(padded.times)[valid])
    assert np.array_equal(np.asarray(again.states), np.asarray(padded.states))
    times, states = _sequences()
    auto = jc.panel.PanelBuckets.from_sequences(times, states)
    assert np.array_equal(np.asarray(auto.padded().states), np.asarray(padded.states))
    with pytest.raises(ValueError, match="order: expected a permutation"):
        jc.panel.PanelBuckets(buckets.buckets, np.zeros(len(LENGTHS), int))
    # a structure error names the trajectory by its given index (here 9, in a 2-row bucket)
    times[9] = times[9][::-1]
    with pytest.raises(ValueError, match=r"^times: trajectory 9 is not sorted"):
        jc.panel.PanelBuckets.from_sequences(times, states)
    times, states = _sequences()
    states[9][4] = [2, 0]
    with pytest.raises(ValueError, match=r"^states: trajectory 9 at time .* node 'A'"):
        jc.panel.PanelBuckets.from_sequences(times, states).checked(MODEL)


def test_likelihood_and_statistics_equal_the_padded_batch(data):
    padded, buckets = data
    R, S = len(LENGTHS), 4
    p0 = np.random.default_rng(1).dirichlet(np.ones(S), size=R)
    # (the log-likelihood without an initial distribution: the reader's test below)
    kwargs: dict = dict(solver=DENSE, initial_distribution=p0)
    expected = jc.panel.panel_expected_statistics(MODEL, padded, **kwargs)
    got = jc.panel.panel_expected_statistics(MODEL, buckets, **kwargs)
    for a, b in [
        (got.dwell_times, expected.dwell_times),
        (got.transitions, expected.transitions),
        (got.log_likelihood, expected.log_likelihood),
        (got.node_transitions("B", (0,)), expected.node_transitions("B", (0,))),
    ]:
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13)
    with pytest.raises(ValueError, match=r"initial_distribution: expected one row per trajectory"):
        jc.panel.panel_log_likelihood(MODEL, buckets, initial_distribution=p0[:3], solver=DENSE)


def test_impossible_observation_names_the_given_index(data):
    padded, _ = data
    zero = jc.CTBN(
        cims=[jnp.array([[[0.0, 0.0], [0.7, -0.7]]]), jnp.array([[[-1.0, 1.0], [0.1, -0.1]]])],
        parents=((), ()),
        names=("A", "B"),
    )
    times, states = _sequences()
    for y in states:  # A starts at 0 and can never leave it ...
        y[:, 0] = np.where(y[:, 0] >= 0, 0, -1)
    states[3][20, 0] = 1  # ... except in trajectory 3 (its own bucket of long trajectories)
    buckets = jc.panel.PanelBuckets.from_sequences(times, states)
    message = re.escape(f"trajectory 3 at time {times[3][20]:g} (observation 20) is impossible")
    with pytest.raises(ValueError, match=message):
        jc.panel.panel_log_likelihood(zero, buckets, solver=DENSE)


def test_fit_rates_problem_equals_the_padded_batch(data):
    # with per-trajectory rate scales (the trajectories' order matters in the M-step); the
    # intervals grouped by length: structure learning below
    padded, _ = data
    R = len(LENGTHS)
    scales = np.where(np.arange(R) % 3 == 0, 2.0, 1.0)
    intervention = jc.Intervention(
        targets=jnp.zeros((R, 2), bool),
        states=jnp.zeros((R, 2), jnp.int32),
        rate_scales=(jnp.asarray(scales), jnp.ones(R)),
    )
    padded = jc.panel.PanelObservations(
        padded.times,
        padded.states,
        num_observations=padded.num_observations,
        intervention=intervention,
    )
    buckets = _buckets_by_hand(padded, GROUPS)
    # one EM iteration of the fit's problem (the full loop: tests/panel/test_panel_fit.py; the
    # public fit_rates on buckets: the command line's fit, which reads buckets)
    no_prior = (jnp.ones(2), jnp.zeros(2), jnp.asarray(False))

    @eqx.filter_jit
    def em_step(observations):
        problem = _problem(MODEL, observations, no_prior, None, None, DENSE, None)
        start = problem.start()
        objective, stats, _ = problem.e_step(start)
        return objective, problem.m_step(start, stats)

    expected, got = em_step(padded), em_step(buckets)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-12)
    for a, b in zip(got[1], expected[1]):
        np.testing.assert_allclose(a, b, rtol=1e-10)


def test_structure_learning_and_the_pool_equal_the_padded_batch(data):
    padded, buckets = data
    kwargs: dict = dict(max_parents=1, max_iterations=2)
    fit = jc.panel.learn_structure_from_panels(padded, ["A", "B"], [2, 2], **kwargs)
    got = jc.panel.learn_structure_from_panels(buckets, ["A", "B"], [2, 2], **kwargs)
    np.testing.assert_allclose(got.trace, fit.trace, rtol=1e-11)
    for a, b in zip(got.posterior.log_marginal_likelihoods, fit.posterior.log_marginal_likelihoods):
        np.testing.assert_allclose(a, b, rtol=1e-10)
    # the pool's per-subject arrays on the host, in the given order (its statistics are
    # panel_expected_statistics, compared above)
    for root in (0, 1):
        np.testing.assert_array_equal(
            pool_membership(buckets, root, 2), pool_membership(padded, root, 2)
        )

    def first(t, y, m):  # the first observation and the last time of each subject
        return np.concatenate([y[:, 0, :], t[np.arange(len(m)), m - 1, None]], -1)

    np.testing.assert_array_equal(
        per_trajectory_on_host(buckets, first), per_trajectory_on_host(padded, first)
    )


def test_reader_buckets_a_long_subject_among_short_ones():
    # one 1,500-visit subject among 300 with two to four: two buckets holding the data's own
    # number of cells (the padded batch holds 450,000), the same likelihood, ids in order
    rng = np.random.default_rng(2)
    frames = []
    for tid, m in enumerate([3] * 150 + [1_500] + [2, 4] * 75):
        frames.append(
            pd.DataFrame(
                {
                    "trajectory_id": f"s{tid}",
                    "time": np.cumsum(rng.uniform(0.2, 1.0, m)),
                    "A": rng.integers(0, 2, m),
                    "B": rng.integers(0, 2, m),
                }
            )
        )
    df = pd.concat(frames)
    buckets, ids = jc.panel.PanelBuckets.from_dataframe(df, MODEL)
    padded, padded_ids = jc.panel.PanelObservations.from_dataframe(df, MODEL)
    assert ids == padded_ids == [f"s{i}" for i in range(301)]
    assert isinstance(buckets, jc.panel.PanelBuckets)
    assert len(buckets.buckets) == 2
    assert sum(int(np.prod(b.times.shape)) for b in buckets.buckets) <= 1_500 + 4 * 300
    np.testing.assert_allclose(
        jc.panel.panel_log_likelihood(MODEL, buckets, solver=jc.MatrixExponential()),
        jc.panel.panel_log_likelihood(MODEL, padded, solver=jc.MatrixExponential()),
        rtol=1e-12,
    )


def test_rounded_size_is_the_least_of_the_grid_at_least_n():
    grid = sorted({2**k for k in range(20)} | {3 * 2 ** (k - 1) for k in range(1, 20)})
    for n in range(1, 5000):
        assert rounded_size(n) == min(m for m in grid if m >= n), n
        assert rounded_size(n) < 1.5 * n + 1


def test_rounded_shapes_change_no_likelihood_statistic_or_fit(data):
    # padding trajectories have one observation with nothing observed: a likelihood of 1 with
    # or without an initial distribution, and no statistics; the given trajectories come first
    padded, buckets = data
    R, S = len(LENGTHS), 4
    rounded = buckets.with_rounded_shapes()
    shapes = [b.times.shape for b in rounded.buckets]
    assert shapes == [(12, 16), (2, 32)]  # (10, 12) and (2, 30) rounded up
    assert rounded.num_trajectories == 14
    p0 = np.random.default_rng(2).dirichlet(np.ones(S), size=R + 2)
    for initial in (None, p0):
        kwargs: dict = dict(solver=DENSE, initial_distribution=initial)
        expected = jc.panel.panel_log_likelihood(
            MODEL,
            padded,
            **(kwargs | {"initial_distribution": None if initial is None else p0[:R]}),
        )
        got = jc.panel.panel_log_likelihood(MODEL, rounded, **kwargs)
        np.testing.assert_allclose(got[:R], expected, rtol=1e-12)
        np.testing.assert_array_equal(got[R:], 0.0)
    stats = jc.panel.panel_expected_statistics(MODEL, rounded, solver=DENSE)
    np.testing.assert_array_equal(stats.transitions[R:], 0.0)
    np.testing.assert_array_equal(stats.dwell_times[R:], 0.0)
    with pytest.raises(ValueError, match="with_rounded_shapes: needs concrete"):
        jax.jit(lambda o: o.with_rounded_shapes())(buckets)


@pytest.mark.slow  # the likelihood and statistics above: the fit is made of them
def test_rounded_shapes_change_no_fit(data):
    # the fit (intervals grouped by their length, the group count rounded up too): the same
    _, buckets = data
    rounded = buckets.with_rounded_shapes()
    start = jc.CTBN(
        cims=[0.5 * jnp.abs(c) * (1 - 2 * jnp.eye(2)) for c in MODEL.cims],
        parents=MODEL.parents,
        names=MODEL.names,
    )
    fit, fit_rounded = (jc.panel.fit_rates(start, o) for o in (buckets, rounded))
    assert fit_rounded.iterations == fit.iterations and fit_rounded.converged == fit.converged
    np.testing.assert_allclose(fit_rounded.log_likelihood, fit.log_likelihood, rtol=1e-12)
    for a, b in zip(fit_rounded.model.cims, fit.model.cims):
        np.testing.assert_allclose(a, b, rtol=1e-9)


def test_gap_table_of_irregular_times_follows_the_buckets_slots_only():
    """Irregular visit times (every interval a length of its own): the gap table of buckets
    has at least a quarter of their interval slots' power of two (data sets of one design
    share its shape class), that of a flat batch the power of two of its gaps (its padding to
    the longest trajectory would double the table)."""
    from jaxctbn._panel.gap_groups import gap_groups

    lengths = [2, 3, 60, 2, 4, 3, 2, 5, 3, 2, 4, 3]
    rng = np.random.default_rng(4)
    times = [np.cumsum(rng.uniform(0.2, 2.0, size=m)) for m in lengths]
    states = [rng.integers(0, 2, size=(m, 2)) for m in lengths]
    flat = jc.panel.PanelObservations.from_sequences(times, states)
    buckets = jc.panel.PanelBuckets.from_observations(flat, groups=[np.array([2]), np.array(
        [i for i in range(len(lengths)) if i != 2])])  # fmt: skip
    distinct = sum(m - 1 for m in lengths)  # every gap its own length
    power = 1 << (distinct - 1).bit_length()
    assert gap_groups(flat).gaps.shape[0] == power  # not 12 x 59 slots' 1024 / 4
    slots = sum(b.times.shape[0] * (b.times.shape[1] - 1) for b in buckets.buckets)
    assert gap_groups(buckets).gaps.shape[0] == max(power, (1 << (slots - 1).bit_length()) // 4)
    # (the tables' padded rows repeat the last gap: the fits are equal, test_rounded_shapes_*)
