"""Bad values that used to give silent wrong answers (issue 10) now give one-line errors that
name the argument and what is valid: states outside the cardinalities on the array route of the
statistics, clamped states out of range, a horizon given as an array, and structure-learning
requests too large for the memory budget. All of these are raised before anything compiles."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxctbn as jc
from jaxctbn._learning.candidates import candidate_parent_sets
from jaxctbn._learning.memory import memory_budget_bytes
from jaxctbn._master_equation.preparation import initial_distribution
from jaxctbn._paths.sampling import Trajectories, sample_trajectory
from jaxctbn._paths.sufficient_statistics import node_statistics


def _trajectories(states, cards_n=2):
    """One hand-built trajectory of two nodes over 15 time units: jumps at 5 and 10."""
    return Trajectories(
        initial_states=jnp.array([[0, 0]]),
        jump_times=jnp.array([[5.0, 10.0]]),
        states=jnp.asarray(states)[None],
        num_events=jnp.array([2]),
        durations=jnp.array([15.0]),
        truncated=jnp.array([False]),
        intervention_targets=jnp.zeros((1, cards_n), bool),
        intervention_states=jnp.zeros((1, cards_n), jnp.int32),
    )


# node A jumps to state 2, then 1: with cardinalities (2, 2) the 5 time units in state 2 used to
# fall outside every bin (10 of 15 time units counted, no error)
BAD = _trajectories([[2, 0], [1, 0]])
MESSAGE = "trajectories: node 'A' has states 0..2, but its cardinality is 2 (states 0..1)"


def test_states_beyond_the_cardinalities_are_refused_on_the_array_route():
    with pytest.raises(ValueError, match=re.escape(MESSAGE.replace("'A'", "0"))):
        jc.SufficientStatistics.from_trajectories(BAD, (2, 2), ((), ()))
    with pytest.raises(ValueError, match=r"node 0 has states 0\.\.2"):
        jc.internal.family_statistics(BAD, (2, 2), candidate_parent_sets(2, 1))
    with pytest.raises(ValueError, match=r"node 0 has states 0\.\.2"):
        node_statistics(jax.tree_util.tree_map(lambda x: x[0], BAD), 0, (), (2, 2))
    with pytest.raises(ValueError, match=re.escape(MESSAGE)):
        jc.learn_structure(BAD, ("A", "B"), (2, 2), max_parents=1)
    negative = _trajectories([[-1, 0], [1, 0]])
    with pytest.raises(ValueError, match=r"node 'A' has states -1\.\.1"):
        jc.learn_structure(negative, ("A", "B"), (2, 2), max_parents=1)
    # numpy arrays take the same route
    as_numpy = jax.tree_util.tree_map(np.asarray, BAD)
    with pytest.raises(ValueError, match=r"node 0 has states 0\.\.2"):
        jc.SufficientStatistics.from_trajectories(as_numpy, (2, 2), ((), ()))
    # with the right cardinality every time unit is counted
    stats = jc.SufficientStatistics.from_trajectories(BAD, (3, 2), ((), ()))
    assert float(stats.total()[0].dwell_times.sum()) == pytest.approx(15.0)


def test_trajectory_shapes_are_checked():
    with pytest.raises(ValueError, match=r"trajectories: initial_states has shape \(1, 2\)"):
        jc.SufficientStatistics.from_trajectories(
            _trajectories([[1, 0], [1, 1]]), (2, 2, 2), ((), (), ())
        )


MODEL = jc.CTBN(
    cims=[jnp.array([[[-1.0, 1.0], [2.0, -2.0]]]), jnp.array([[[-1.0, 1.0], [1.0, -1.0]]] * 2)],
    parents=[(), (0,)],
    names=("A", "B"),
)


def test_clamped_state_out_of_range_is_reported_as_the_intervention(getkey):
    by_hand = jc.Intervention(targets=jnp.array([False, True]), states=jnp.array([0, 2]))
    message = r"intervention: clamped state 2 of node 'B' must be in 0\.\.1"
    with pytest.raises(ValueError, match=message):
        jc.expected_statistics(MODEL, jnp.array([0, 0]), 1.0, intervention=by_hand)
    with pytest.raises(ValueError, match=message):
        initial_distribution(MODEL, jnp.array([0, 0]), by_hand)
    with pytest.raises(ValueError, match=message):
        by_hand.apply(MODEL)
    with pytest.raises(ValueError, match=message):
        sample_trajectory(MODEL, jnp.array([0, 0]), 1.0, key=getkey(), intervention=by_hand)
    key = getkey()  # traced intervention: the check runs inside jit, still naming the node

    @jax.jit
    def sample(intervention):
        path = sample_trajectory(MODEL, jnp.array([0, 0]), 1.0, key=key, intervention=intervention)
        return path.jump_times

    with pytest.raises(
        Exception, match=r"intervention: clamped state of node 'B' must be in 0\.\.1"
    ):
        sample(by_hand)
    # a state that is not clamped is not used, so it is not checked
    jc.Intervention(targets=jnp.array([False, False]), states=jnp.array([0, 7])).checked(MODEL)
    with pytest.raises(ValueError, match=r"intervention: clamped state -1 of node 1 must be >= 0"):
        jc.Intervention(targets=jnp.array([False, True]), states=jnp.array([0, -1]))


def test_horizon_must_be_a_scalar():
    message = r"horizon: expected a scalar, got shape \(3,\)"
    with pytest.raises(ValueError, match=message):
        jc.expected_statistics(MODEL, jnp.array([0, 0]), jnp.ones(3))
    models = jax.tree_util.tree_map(lambda x: x[None], MODEL)
    with pytest.raises(ValueError, match=message):
        jc.expected_statistics_batch(models, jnp.zeros((1, 2), int), np.ones(3))


def test_memory_budget_refuses_large_requests(monkeypatch):
    """No real allocation: the request is estimated and refused before anything runs."""
    traj = _trajectories([[1, 0], [1, 1]])
    monkeypatch.setenv("JAXCTBN_MEMORY_BUDGET", "1K")
    with pytest.raises(
        ValueError, match=r"learn_structure: needs about .* more than the memory budget of 1\.0 KiB"
    ) as info:
        jc.learn_structure(traj, ("A", "B"), (2, 2), max_parents=1)
    assert "JAXCTBN_MEMORY_BUDGET" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ValueError, match=r"family_statistics: needs about"):
        jc.internal.family_statistics(traj, (2, 2), candidate_parent_sets(2, 1))
    with pytest.raises(ValueError, match=r"StructurePosterior.from_prior: needs about"):
        jc.StructurePosterior.from_prior(("A", "B"), (2, 2), max_parents=1)
    # a node with many states is named as the large part, with the states seen in the data
    with pytest.raises(
        ValueError, match=r"node 'B' has 5000 states: .*largest states in the data: \[1, 1\]"
    ):
        jc.learn_structure(traj, ("A", "B"), (2, 5000), max_parents=1, memory_budget="1G")
    # the keyword overrides the environment
    monkeypatch.setenv("JAXCTBN_MEMORY_BUDGET", "not a size")
    with pytest.raises(
        ValueError, match=r"JAXCTBN_MEMORY_BUDGET: expected a positive number of bytes"
    ):
        jc.StructurePosterior.from_prior(("A", "B"), (2, 2), max_parents=1)
    with pytest.raises(ValueError, match=r"memory budget of 2\.0 KiB"):
        jc.StructurePosterior.from_prior(("A", "B"), (2, 2), max_parents=1, memory_budget=2048)


def test_memory_budget_parsing(monkeypatch):
    monkeypatch.delenv("JAXCTBN_MEMORY_BUDGET", raising=False)
    assert memory_budget_bytes() == 4 * 2**30
    assert memory_budget_bytes("8G") == 8 * 2**30
    assert memory_budget_bytes("512MiB") == 512 * 2**20
    assert memory_budget_bytes(1000) == 1000
    monkeypatch.setenv("JAXCTBN_MEMORY_BUDGET", "2t")
    assert memory_budget_bytes() == 2 * 2**40
    for bad in ("-1", "8X", 0):
        with pytest.raises(ValueError, match="memory_budget: expected a positive number"):
            memory_budget_bytes(bad)


def test_padded_ctbn_parent_index_is_checked():
    cims = (jnp.zeros((2, 2, 2)), jnp.zeros((2, 2, 2)))
    for index, match in [
        ((jnp.array([2]), jnp.array([-1])), r"node 'A' holds 2; entries must be .* in 0\.\.1"),
        ((jnp.array([0]), jnp.array([-1])), r"node 'A' holds 0"),
        ((jnp.array([-1, -1]), jnp.array([0, 0])), r"node 'B' lists a parent twice"),
    ]:
        with pytest.raises(ValueError, match=match):
            jc.PaddedCTBN(cims=cims, parent_index=index, names=("A", "B"), cardinalities=(2, 2))
    padded = MODEL.padded(max_parents=1)
    assert [np.asarray(i).tolist() for i in padded.parent_index] == [[-1], [0]]
