"""The active-learning loop in rounds of experiments run together, with costs and a budget
(maths §8): one member and free experiments give the sequential loop exactly; a replay of the
rounds (the loop's own keys, each member's path simulated and learnt by hand) gives its
posterior; the budget is never exceeded and a prohibitive node never clamped."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from helpers import random_model

import jaxctbn as jc
from jaxctbn._paths.sampling import sample_trajectory
from jaxctbn.criteria import ByScorePerCost

CARDS = (2, 2)
PARENTS = ((), (0,))
MAX_EVENTS = 64
HORIZON = 2.0


@pytest.fixture(scope="module")
def setting():
    truth = random_model(jr.key(21), CARDS, PARENTS)
    task = jc.ParameterLearningTask(truth)
    return truth, task, jc.intervention_space(CARDS)


def _run(task, design, space, **kwargs):
    return jc.run_active_learning(
        task,
        design,
        key=jr.key(4),
        num_experiments=4,
        horizon=HORIZON,
        candidates=space,
        max_events=MAX_EVENTS,
        initial_state_policy=jc.FixedInitialState((1, 0)),
        **kwargs,
    )


DESIGNS = {
    "vbhc": jc.CriterionDesign(jc.VBHC(), num_samples=3),
    "random": jc.RandomDesign(),
}


@pytest.mark.parametrize("name", list(DESIGNS))
def test_one_member_and_free_experiments_are_the_sequential_loop(setting, name):
    truth, task, space = setting
    design = DESIGNS[name]
    sequential = _run(task, design, space)
    free = jc.Costs(jnp.zeros((2, 2)))
    rounds = _run(task, design, space, costs=free)
    np.testing.assert_array_equal(rounds.intervention_index, sequential.intervention_index)
    for metric in sequential.metrics:
        np.testing.assert_allclose(rounds.metrics[metric], sequential.metrics[metric], rtol=1e-12)
    np.testing.assert_array_equal(rounds.rounds, [1, 2, 3, 4])
    np.testing.assert_array_equal(rounds.costs, 0.0)


def test_a_replay_of_the_rounds_gives_the_loops_posterior(setting):
    """Round by round with the loop's keys: the first round's members are `Batch`'s,
    each member's path is simulated from its own key and the posterior learns from them all."""
    truth, task, space = setting
    design = DESIGNS["vbhc"]
    result = _run(task, design, space, batch_size=2)
    np.testing.assert_array_equal(result.rounds, [1, 1, 2, 2])
    posterior = task.initial_posterior()
    init = jnp.array([1, 0])
    sample = eqx.filter_jit(sample_trajectory)
    for r, key in enumerate(jr.split(jr.key(4), 2)):
        _, k_design, k_path = jr.split(key, 3)
        members = np.asarray(result.intervention_index[2 * r : 2 * r + 2])
        if r == 0:
            chosen = jc.score_interventions(
                posterior,
                space,
                init,
                jnp.asarray(HORIZON),
                key=k_design,
                num_samples=3,
                batch=jc.Batch(2),
            )
            np.testing.assert_array_equal(chosen.members, members)
        for b, m in enumerate(members):
            iv = jax.tree_util.tree_map(lambda a: a[m], space)
            k = k_path if b == 0 else jr.fold_in(k_path, b)
            path = sample(truth, init, HORIZON, key=k, intervention=iv, max_events=MAX_EVENTS)
            assert int(path.num_events) == int(result.num_events[2 * r + b])
            posterior = task.update(posterior, path)
        np.testing.assert_allclose(
            result.metrics["mse"][2 * r + 1], task.metrics(posterior)["mse"], rtol=1e-10
        )
    final = result.posterior
    assert isinstance(final, jc.RatePosterior)
    for a, b in zip(final.alpha, posterior.alpha):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    for a, b in zip(final.beta, posterior.beta):
        np.testing.assert_allclose(a, b, rtol=1e-12)


@pytest.mark.parametrize("name", ["vbhc", "random"])
def test_budget_never_exceeded_and_a_prohibitive_node_never_clamped(setting, name):
    truth, task, space = setting
    costs = jc.Costs.of_nodes(truth.names, CARDS, clamp={"X0": 1e6, "X1": 2.0}, experiment=1.0)
    skipped = 0
    for budget, ranking in [
        (7.0, jc.criteria.ByScore()),
        (5.0, ByScorePerCost()),
        (3.0, jc.criteria.ByScore()),
    ]:
        result = _run(
            task, DESIGNS[name], space, batch_size=2, costs=costs, budget=budget, ranking=ranking
        )
        members = np.asarray(result.intervention_index)
        spent = np.asarray(result.costs)
        run = members >= 0
        assert not np.asarray(space.targets)[members[run], 0].any()
        assert np.all(np.diff(spent) >= 0)
        assert float(spent[-1]) <= budget
        prices = np.asarray(costs.of(space))
        np.testing.assert_allclose(spent[-1], prices[members[run]].sum())
        # the skipped experiments (once nothing is affordable) leave the posterior unchanged
        if not run.all():
            skipped += 1
            first = int(np.argmin(run))
            assert np.all(~np.asarray(result.targets)[~run])
            assert float(result.metrics["mse"][-1]) == float(result.metrics["mse"][first])
    assert skipped  # the budget of 3 stops the loop after 3 experiments


def test_loop_batch_errors(setting):
    truth, task, space = setting
    design = DESIGNS["random"]
    with pytest.raises(ValueError, match="batch_size: 3 must divide num_experiments"):
        _run(task, design, space, batch_size=3)
    with pytest.raises(ValueError, match="batch_size: must be an integer"):
        _run(task, design, space, batch_size=0)
    with pytest.raises(ValueError, match="budget"):
        _run(task, design, space, costs=jc.Costs(jnp.zeros((2, 2))), budget=-1.0)
