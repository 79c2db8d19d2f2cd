"""The compiled active-learning loop against independent routes: replayed experiments learnt in
one batch, sklearn's metrics, single runs against the vmapped repetitions, and the designs'
choices against their scores.

The parameter-learning tests share one problem with tests/test_sharding.py and tests/cli/test_cli.py
(the 2-node network of `helpers.network_dict`, 3 repetitions with `jaxctbn run --seed 0`'s keys,
2 experiments, 3 posterior draws), so that the compiled loops are shared."""

import dataclasses
import json
import os

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from helpers import (
    flaky_design_scores,
    network_dict,
    random_model,
    repetition_keys,
    replay_experiments,
)

import jaxctbn as jc
from jaxctbn._active_learning.designs import design_from_name
from jaxctbn._model.interventions import design_space
from jaxctbn._paths.sampling import automatic_max_events

CARDS, PARENTS = (2, 2, 2), ((), (0,), (1,))

# the shared parameter-learning problem (see the module docstring)
TASK = jc.ParameterLearningTask(jc.CTBN.from_dict(network_dict()))
KEYS = repetition_keys(0, 3)
K = 2
SPACE = design_space((2, 2))  # the candidates `jaxctbn run` passes (all 9)
# the event buffer `run_repetitions` sizes from these rates for tau = 3 (given explicitly where
# a call must compile the same program with another horizon)
MAX_EVENTS = 64


def test_structure_loop_equals_batch_learning_on_the_same_paths(getkey):
    truth = random_model(getkey(), CARDS, PARENTS)
    task = jc.StructureLearningTask(truth, max_parents=2, prior=jc.GammaPrior(1.5, 2.0))
    key, K = getkey(), 5
    result = jax.jit(
        lambda k: jc.run_active_learning(task, jc.RandomDesign(), key=k, num_experiments=K)
    )(key)
    assert result.metrics["auroc"].shape == (K + 1,)
    assert bool(result.targets.any())  # random design intervenes now and then
    paths = replay_experiments(truth, result, 3.0, key)
    np.testing.assert_array_equal(paths.num_events, result.num_events)
    direct = jc.learn_structure(
        paths, truth.names, CARDS, max_parents=2, prior=jc.GammaPrior(1.5, 2.0)
    )
    for x, y in zip(result.posterior.log_posterior(), direct.log_posterior()):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)
    # metrics against independent implementations (scikit-learn imported here, not at
    # collection: 0.8 s for each worker that collects this file)
    import sklearn.metrics

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
    paths = replay_experiments(truth, result, 2.0, key)
    np.testing.assert_array_equal(paths.num_events, result.num_events)

    @eqx.filter_jit  # one program for the batch route (eagerly: one per operation)
    def direct(task, paths):
        suff = jc.SufficientStatistics.from_trajectories(
            paths, task.truth.cardinalities, task.truth.parents
        )
        posterior = task.initial_posterior().update_with(suff)
        return posterior, posterior.mse(task.truth)

    posterior, mse = direct(task, paths)
    for a, b in zip(
        result.posterior.alpha + result.posterior.beta, posterior.alpha + posterior.beta
    ):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    np.testing.assert_allclose(result.metrics["mse"][-1], mse, rtol=1e-12)


def test_designs_choose_what_their_scores_say():
    """Passive never intervenes; the VBHC design picks the argmax and its negative the argmin
    of `score_interventions` (called on its own, with the design step's key), in every
    repetition's first experiment."""
    passive = jc.run_repetitions(
        TASK, jc.PassiveDesign(), KEYS, num_experiments=K, candidates=SPACE
    )
    assert not bool(passive.targets.any())
    best, worst = (
        jc.run_repetitions(
            TASK,
            design_from_name(name, num_samples=3),
            KEYS,
            num_experiments=K,
            candidates=SPACE,
        )
        for name in ("vbhc", "negative-vbhc")  # one compiled loop: `worst` is traced
    )
    # the same keys: the same initial state is revealed to every design in experiment 1 (the
    # passive paths start there; the others' record it with their clamped nodes moved)
    revealed = passive.initial_states[:, 0]
    for run in (best, worst):
        clamped = np.where(run.targets[:, 0], run.states[:, 0], revealed)
        np.testing.assert_array_equal(run.initial_states[:, 0], clamped)
    space = jc.intervention_space((2, 2))
    for r in range(len(KEYS)):
        _, k_design, _ = jax.random.split(jax.random.split(KEYS[r], K)[0], 3)
        scores = jc.score_interventions(
            TASK.initial_posterior(), space, revealed[r], 3.0, key=k_design, num_samples=3
        )
        assert int(best.intervention_index[r, 0]) == int(jnp.argmax(scores))
        assert int(worst.intervention_index[r, 0]) == int(jnp.argmin(scores))


def test_repetitions_are_a_vmap_and_reproducible():
    assert automatic_max_events(TASK.truth, 3.0) == MAX_EVENTS  # the batch's buffer
    batch = jc.run_repetitions(TASK, jc.RandomDesign(), KEYS, num_experiments=K, candidates=SPACE)
    again = jc.run_repetitions(TASK, jc.RandomDesign(), KEYS, num_experiments=K, candidates=SPACE)
    for r in range(len(KEYS)):
        one = jc.run_active_learning(
            TASK,
            jc.RandomDesign(),
            key=KEYS[r],
            num_experiments=K,
            candidates=SPACE,
            max_events=MAX_EVENTS,
        )
        np.testing.assert_allclose(batch.metrics["mse"][r], one.metrics["mse"], rtol=1e-12)
        np.testing.assert_array_equal(batch.intervention_index[r], one.intervention_index)
        np.testing.assert_array_equal(batch.num_events[r], one.num_events)
    np.testing.assert_array_equal(batch.metrics["mse"], again.metrics["mse"])
    assert len(set(np.asarray(batch.intervention_index).ravel().tolist())) > 1  # not trivial


@pytest.mark.usefixtures("no_runtime_typecheck")
def test_active_learning_bad_input(getkey):
    truth = random_model(getkey(), CARDS, PARENTS)
    task = jc.StructureLearningTask(truth, max_parents=1)
    with pytest.raises(ValueError, match="num_experiments must be >= 1"):
        jc.run_active_learning(task, jc.PassiveDesign(), key=getkey(), num_experiments=0)
    with pytest.raises(ValueError, match="max_parents must be in 0..2"):
        jc.StructureLearningTask(truth, max_parents=3)
    with pytest.raises(ValueError, match="unknown name 'mi'"):
        design_from_name("mi")
    with pytest.raises(ValueError, match="criterion: expected a criterion Module"):
        jc.CriterionDesign("mutual-information")
    with pytest.raises(eqx.EquinoxRuntimeError, match="horizon: must be positive"):
        # the horizon is traced: the loop of the single runs above, checked inside
        jc.run_active_learning(
            TASK,
            jc.RandomDesign(),
            key=KEYS[0],
            num_experiments=K,
            horizon=-1.0,
            candidates=SPACE,
            max_events=MAX_EVENTS,
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
    """The default structure experiment (the built-in 4-node truth) in chunks of one
    repetition: the documented files, a rerun that reuses every chunk, and other chunk sizes
    that give the same numbers."""
    out = str(tmp_path / "run")
    config = jc.experiments.ExperimentConfig(
        target="structure", designs=("passive", "random"), repetitions=2, experiments=1, chunk=1
    )
    report = jc.experiments.run_experiment(config, out=out, progress=False)
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
        "round",
        "cost",
    ]
    assert len(df) == 2 * 2 * 2
    assert set(df[(df.design == "passive") & (df.experiment > 0)].intervention) == {"none"}
    with open(os.path.join(out, "results.json")) as f:
        saved = json.load(f)
    np.testing.assert_allclose(
        saved["designs"]["random"]["metrics"]["auroc"], report["results"]["random"]["auroc"]
    )
    assert jc.CTBN.from_json(os.path.join(out, "truth.json")).names == ("X1", "X2", "X3", "X4")
    # a rerun reuses every finished chunk and gives the same numbers
    again = jc.experiments.run_experiment(config, out=out, progress=False)
    assert all(t["repetitions_computed"] == 0 for t in again["timing"].values())
    np.testing.assert_array_equal(
        again["results"]["random"]["aupr"], report["results"]["random"]["aupr"]
    )
    # chunking does not change results (up to rounding): repetition r always uses
    # fold_in(key(seed), r) (the random design: its choices depend on the keys)
    other = jc.experiments.run_experiment(
        dataclasses.replace(config, chunk=2, designs=("random",)), progress=False
    )
    np.testing.assert_allclose(
        other["results"]["random"]["aupr"], report["results"]["random"]["aupr"], rtol=1e-12
    )
    np.testing.assert_array_equal(
        other["results"]["random"]["intervention_index"],
        report["results"]["random"]["intervention_index"],
    )
    with pytest.raises(ValueError, match="designs: unknown design 'best'"):
        jc.experiments.ExperimentConfig(designs=("best",))
    with pytest.raises(ValueError, match="samples: must be a positive integer"):
        jc.experiments.ExperimentConfig(samples=0)


def test_no_throw_reports_failing_repetitions_and_keeps_the_others():
    """`throw=False`: the failing repetitions are reported (NaN metrics, index -1) and the
    others give the numbers of single runs, one at a time (not vmapped). (The same design and
    keys on eight devices: tests/test_sharding.py.)"""
    design = jc.CallableDesign(flaky_design_scores)
    singles = []
    for k in KEYS:
        try:
            singles.append(
                jc.run_active_learning(
                    TASK, design, key=k, num_experiments=K, candidates=SPACE, max_events=MAX_EVENTS
                )
            )
        except (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError):
            singles.append(None)
    expect_ok = np.array([s is not None for s in singles])
    assert expect_ok.any() and not expect_ok.all(), "choose keys with both outcomes"
    with pytest.raises(eqx.EquinoxRuntimeError, match="flaky design: failed"):
        jc.run_repetitions(TASK, design, KEYS, num_experiments=K, candidates=SPACE)
    result, status = jc.run_repetitions(
        TASK, design, KEYS, num_experiments=K, candidates=SPACE, throw=False
    )
    np.testing.assert_array_equal(status.ok, expect_ok)
    assert status.num_failed == int((~expect_ok).sum())
    for r, single in enumerate(singles):
        if single is None:
            assert status.messages[r] == "flaky design: failed"
            assert np.isnan(result.metrics["mse"][r]).all()
            assert (np.asarray(result.intervention_index[r]) == -1).all()
        else:
            assert status.messages[r] == ""
            np.testing.assert_allclose(result.metrics["mse"][r], single.metrics["mse"], rtol=1e-12)
            np.testing.assert_array_equal(result.intervention_index[r], single.intervention_index)
