import dataclasses
import json
import os

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
import sklearn.metrics
from helpers import random_model

import jaxctbn as jc

CARDS, PARENTS = (2, 2, 2), ((), (0,), (1,))


def _replay(truth, result, horizon, key, K):
    """Re-simulate the recorded experiments from the recorded choices (independent of the
    scan: plain Python over experiments)."""
    paths = []
    for k, step_key in enumerate(jax.random.split(key, K)):
        _, _, k_path = jax.random.split(step_key, 3)
        iv = jc.Intervention(targets=result.targets[k], states=result.states[k])
        path = jc.sample_trajectory(
            truth, result.initial_states[k], horizon, key=k_path, intervention=iv, max_events=512
        )
        assert int(path.num_events) == int(result.num_events[k])
        paths.append(path)
    return jax.tree_util.tree_map(lambda *a: jnp.stack(a), *paths)


def test_structure_loop_equals_batch_learning_on_the_same_paths(getkey):
    truth = random_model(getkey(), CARDS, PARENTS)
    task = jc.StructureLearningTask(truth, max_parents=2, prior=jc.GammaPrior(1.5, 2.0))
    key, K = getkey(), 5
    result = jax.jit(
        lambda k: jc.run_active_learning(task, jc.RandomDesign(), key=k, num_experiments=K)
    )(key)
    assert result.metrics["auroc"].shape == (K + 1,)
    assert bool(result.targets.any())  # random design intervenes now and then
    paths = _replay(truth, result, 3.0, key, K)
    direct = jc.learn_structure(
        paths, truth.names, CARDS, max_parents=2, prior=jc.GammaPrior(1.5, 2.0)
    )
    for x, y in zip(result.posterior.log_posterior(), direct.log_posterior()):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)
    # metrics against independent implementations
    true = np.zeros((3, 3), bool)
    for n, ps in enumerate(PARENTS):
        true[list(ps), n] = True
    edges = np.asarray(direct.edge_marginals())
    off = ~np.eye(3, dtype=bool)
    np.testing.assert_allclose(
        result.metrics["auroc"][-1], sklearn.metrics.roc_auc_score(true[off], edges[off])
    )
    np.testing.assert_allclose(
        result.metrics["aupr"][-1], sklearn.metrics.average_precision_score(true[off], edges[off])
    )
    # before any data: the uniform prior over 4 candidate sets per node, AUROC of ties = 0.5
    np.testing.assert_allclose(result.metrics["entropy"][0], 3 * np.log(4), rtol=1e-12)
    np.testing.assert_allclose(result.metrics["auroc"][0], 0.5)


def test_parameter_loop_pools_interventional_data(getkey):
    truth = random_model(getkey(), (2, 3), ((1,), ()))
    task = jc.ParameterLearningTask(truth, prior=jc.GammaPrior(2.0, 1.0))
    key, K = getkey(), 4
    always_x1 = jc.CallableDesign(lambda post, ivs, s0, tau, k: ivs.targets[:, 1] * 1.0)
    result = jc.run_active_learning(task, always_x1, key=key, num_experiments=K, horizon=2.0)
    assert bool(result.targets[:, 1].all()) and not bool(result.targets[:, 0].any())
    # the intervened node learns nothing, the other one learns from every path
    np.testing.assert_array_equal(result.posterior.alpha[1], task.initial_posterior().alpha[1])
    paths = _replay(truth, result, 2.0, key, K)
    suff = jc.SufficientStatistics.from_trajectories(paths, truth.cardinalities, truth.parents)
    direct = task.initial_posterior().update_with(suff)
    for a, b in zip(result.posterior.alpha + result.posterior.beta, direct.alpha + direct.beta):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    np.testing.assert_allclose(result.metrics["mse"][-1], direct.mse(truth), rtol=1e-12)


def test_designs_choose_what_their_scores_say(getkey):
    truth = random_model(getkey(), (2, 2), ((), (0,)))
    task = jc.ParameterLearningTask(truth)
    key, K = getkey(), 2
    space = jc.intervention_space(truth.cardinalities)
    passive = jc.run_active_learning(task, jc.PassiveDesign(), key=key, num_experiments=K)
    assert not bool(passive.targets.any())
    best = jc.run_active_learning(
        task, jc.design_from_name("vbhc", num_samples=3), key=key, num_experiments=K
    )
    worst = jc.run_active_learning(
        task, jc.design_from_name("negative-vbhc", num_samples=3), key=key, num_experiments=K
    )
    # the same key: the same initial state is revealed to every design in experiment 1
    np.testing.assert_array_equal(best.initial_states[0], worst.initial_states[0])
    _, k_design, _ = jax.random.split(jax.random.split(key, K)[0], 3)
    scores = jc.score_interventions(
        task.initial_posterior(), space, best.initial_states[0], 3.0, key=k_design, num_samples=3
    )
    assert int(best.intervention_index[0]) == int(jnp.argmax(scores))
    assert int(worst.intervention_index[0]) == int(jnp.argmin(scores))


def test_repetitions_are_a_vmap_and_reproducible(getkey):
    truth = random_model(getkey(), CARDS, PARENTS)
    task = jc.StructureLearningTask(truth, max_parents=1)
    keys = jax.random.split(getkey(), 3)
    batch = jc.run_repetitions(task, jc.RandomDesign(), keys, num_experiments=3)
    again = jc.run_repetitions(task, jc.RandomDesign(), keys, num_experiments=3)
    for r in range(3):
        one = jc.run_active_learning(task, jc.RandomDesign(), key=keys[r], num_experiments=3)
        np.testing.assert_allclose(batch.metrics["aupr"][r], one.metrics["aupr"], rtol=1e-12)
        np.testing.assert_array_equal(batch.intervention_index[r], one.intervention_index)
    np.testing.assert_array_equal(batch.metrics["shd"], again.metrics["shd"])


@pytest.mark.usefixtures("no_runtime_typecheck")
def test_active_learning_bad_input(getkey):
    truth = random_model(getkey(), CARDS, PARENTS)
    task = jc.StructureLearningTask(truth, max_parents=1)
    with pytest.raises(ValueError, match="num_experiments must be >= 1"):
        jc.run_active_learning(task, jc.PassiveDesign(), key=getkey(), num_experiments=0)
    with pytest.raises(ValueError, match="max_parents must be in 0..2"):
        jc.StructureLearningTask(truth, max_parents=3)
    with pytest.raises(ValueError, match="unknown name 'mi'"):
        jc.design_from_name("mi")
    with pytest.raises(ValueError, match="criterion: expected a criterion Module"):
        jc.CriterionDesign("mutual-information")
    with pytest.raises(eqx.EquinoxRuntimeError, match="horizon: must be positive"):
        jc.run_active_learning(
            task, jc.PassiveDesign(), key=getkey(), num_experiments=1, horizon=-1.0
        )
    with pytest.raises(ValueError, match="candidates: expected a batch"):
        jc.run_active_learning(
            task,
            jc.PassiveDesign(),
            key=getkey(),
            num_experiments=1,
            candidates=jc.Intervention.none(3),
        )


def test_run_experiment_writes_outputs_and_resumes(tmp_path):
    out = str(tmp_path / "run")
    config = jc.ExperimentConfig(
        target="structure", designs=("passive", "random"), repetitions=4, experiments=2, chunk=2
    )
    report = jc.run_experiment(config, out=out, progress=False)
    for name in (
        "config.json",
        "truth.json",
        "metrics.csv",
        "results.json",
        "summary.md",
        "figure.png",
        "interventions.png",
    ):
        assert os.path.exists(os.path.join(out, name)), name
    df = pd.read_csv(os.path.join(out, "metrics.csv"), keep_default_na=False)
    assert list(df.columns) == [
        "design",
        "repetition",
        "experiment",
        "auroc",
        "aupr",
        "shd",
        "entropy",
        "intervention",
        "initial_state",
    ]
    assert len(df) == 2 * 4 * 3
    assert set(df[(df.design == "passive") & (df.experiment > 0)].intervention) == {"none"}
    with open(os.path.join(out, "results.json")) as f:
        saved = json.load(f)
    np.testing.assert_allclose(
        saved["designs"]["random"]["metrics"]["auroc"], report["results"]["random"]["auroc"]
    )
    assert jc.CTBN.from_json(os.path.join(out, "truth.json")).names == ("X1", "X2", "X3", "X4")
    # a rerun reuses every finished chunk and gives the same numbers
    again = jc.run_experiment(config, out=out, progress=False)
    assert all(t["repetitions_computed"] == 0 for t in again["timing"].values())
    np.testing.assert_array_equal(
        again["results"]["random"]["aupr"], report["results"]["random"]["aupr"]
    )
    # chunking does not change results (up to rounding): repetition r always uses fold_in(key(seed), r)
    other = jc.run_experiment(dataclasses.replace(config, chunk=4), progress=False)
    np.testing.assert_allclose(
        other["results"]["random"]["aupr"], report["results"]["random"]["aupr"], rtol=1e-12
    )
    np.testing.assert_array_equal(
        other["results"]["random"]["intervention_index"],
        report["results"]["random"]["intervention_index"],
    )
    with pytest.raises(ValueError, match="designs: unknown design 'best'"):
        jc.ExperimentConfig(designs=("best",))
    with pytest.raises(ValueError, match="samples: must be a positive integer"):
        jc.ExperimentConfig(samples=0)


def test_no_throw_reports_failing_repetitions_and_keeps_the_others(getkey):
    truth = random_model(getkey(), CARDS, PARENTS)
    task = jc.StructureLearningTask(truth, max_parents=1)

    def flaky(posterior, candidates, initial_state, horizon, key):
        # fails in about half of the design steps, depending on the key only
        scores = jnp.zeros(candidates.targets.shape[0])
        return eqx.error_if(scores, jax.random.uniform(key) < 0.2, "flaky design: failed")

    design = jc.CallableDesign(flaky)
    keys = jax.random.split(getkey(), 6)
    singles = []
    for k in keys:
        try:
            singles.append(jc.run_active_learning(task, design, key=k, num_experiments=2))
        except (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError):
            singles.append(None)
    expect_ok = np.array([s is not None for s in singles])
    assert expect_ok.any() and not expect_ok.all(), "choose keys with both outcomes"
    with pytest.raises(eqx.EquinoxRuntimeError, match="flaky design: failed"):
        jc.run_repetitions(task, design, keys, num_experiments=2)
    result, status = jc.run_repetitions(task, design, keys, num_experiments=2, throw=False)
    np.testing.assert_array_equal(status.ok, expect_ok)
    assert status.num_failed == int((~expect_ok).sum())
    for r, single in enumerate(singles):
        if single is None:
            assert status.messages[r] == "flaky design: failed"
            assert np.isnan(result.metrics["auroc"][r]).all()
            assert (np.asarray(result.intervention_index[r]) == -1).all()
        else:
            assert status.messages[r] == ""
            np.testing.assert_allclose(
                result.metrics["entropy"][r], single.metrics["entropy"], rtol=1e-12
            )
    # (the repetitions that succeed give the single runs' numbers, checked above: throw=False
    # changes nothing for them)
