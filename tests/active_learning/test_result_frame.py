"""The record of active-learning runs as a pandas table, against metrics.csv that `jaxctbn run`
writes for the same repetitions (the problem of the loop and sharding tests: the 2-node network,
3 repetitions with `jaxctbn run --seed 0`'s keys, 2 experiments) and against the record's own
arrays (a panel outcome's visit times, rounds, costs and an experiment the budget skipped)."""

import json
import sys

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from helpers import network_dict, repetition_keys

import jaxctbn as jc
from jaxctbn._cli.main import main
from jaxctbn._model.interventions import design_space

TASK = jc.ParameterLearningTask(jc.CTBN.from_dict(network_dict()))
KEYS = repetition_keys(0, 3)
SPACE = design_space((2, 2))  # the candidates `jaxctbn run` passes (all 9)


def test_repetitions_frame_is_metrics_csv(tmp_path):
    network = tmp_path / "net.json"
    network.write_text(json.dumps(network_dict()))
    out = tmp_path / "run"
    args = ["run", "parameters", "--network", str(network), "--designs", "random"]
    args += ["--repetitions", "3", "--experiments", "2", "--samples", "3", "--chunk", "3"]
    assert main([*args, "--no-progress", "--out", str(out)]) == 0
    written = pd.read_csv(out / "metrics.csv", keep_default_na=False)
    result = jc.run_repetitions(TASK, jc.RandomDesign(), KEYS, num_experiments=2, candidates=SPACE)
    frame = result.to_frame()
    columns = ["repetition", "experiment", "mse", "intervention", "initial_state", "round", "cost"]
    assert list(frame.columns) == columns and len(frame) == 3 * 3
    expected = written[written.design == "random"].drop(columns="design").reset_index(drop=True)
    # metrics.csv leaves the cost empty without prices: the frame's 0
    assert (expected["cost"] == "").all() and (frame["cost"] == 0.0).all()
    pd.testing.assert_frame_equal(frame.drop(columns="cost"), expected.drop(columns="cost"))
    assert len(set(frame["intervention"][frame.experiment > 0])) > 1  # not trivial
    # one run: the same table with repetition 0
    one = jc.run_active_learning(
        TASK, jc.RandomDesign(), key=KEYS[0], num_experiments=2, candidates=SPACE
    )
    single = one.to_frame()
    pd.testing.assert_frame_equal(single, frame[frame.repetition == 0], check_exact=False)


def test_panel_rounds_costs_and_skipped_experiments():
    """A hand-made record of two runs of three experiments in rounds, with visit times and an
    experiment the budget could not afford: each column is the record's arrays."""
    targets = jnp.array([[[True, False], [False, False], [False, True]]] * 2)
    states = jnp.array([[[1, 0], [0, 0], [0, 1]]] * 2)
    index = jnp.array([[6, 0, 2], [6, 0, -1]])
    record = jc.ActiveLearningResult(
        metrics={"mse": jnp.arange(8.0).reshape(2, 4)},
        intervention_index=index,
        targets=targets.at[1, 2].set(False),
        states=states,
        initial_states=jnp.array([[[0, 1], [1, 1], [0, 0]]] * 2),
        num_events=jnp.zeros((2, 3), jnp.int32),
        posterior=TASK.initial_posterior(),
        observation_times=jnp.tile(jnp.array([1.0, 2.5]), (2, 3, 1)),
        rounds=jnp.array([[1, 1, 2]] * 2),
        costs=jnp.array([[2.0, 3.0, 5.0], [2.0, 3.0, 3.0]]),
    )
    frame = record.to_frame()
    assert list(frame.columns) == [
        "repetition", "experiment", "mse", "intervention", "initial_state",
        "observation_times", "round", "cost",
    ]  # fmt: skip
    assert frame["mse"].tolist() == list(np.arange(8.0))
    assert frame["intervention"].tolist() == [
        "",
        "A=1",
        "none",
        "B=1",
        "",
        "A=1",
        "none",
        "skipped",
    ]
    assert frame["initial_state"].tolist()[:4] == ["", "A=0;B=1", "A=1;B=1", "A=0;B=0"]
    assert frame["observation_times"].tolist()[:2] == [None, (1.0, 2.5)]
    assert frame["round"].tolist() == [0, 1, 1, 2] * 2
    assert frame["cost"].tolist() == [0.0, 2.0, 3.0, 5.0, 0.0, 2.0, 3.0, 3.0]


def test_a_missing_package_is_one_line(monkeypatch):
    record = jc.ActiveLearningResult(
        metrics={"mse": jnp.zeros(2)},
        intervention_index=jnp.zeros(1, jnp.int32),
        targets=jnp.zeros((1, 2), bool),
        states=jnp.zeros((1, 2), jnp.int32),
        initial_states=jnp.zeros((1, 2), jnp.int32),
        num_events=jnp.zeros(1, jnp.int32),
        posterior=TASK.initial_posterior(),
    )
    assert record.to_frame()["intervention"].tolist() == ["", "none"]
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match=r"ActiveLearningResult.to_frame needs pandas: pip "):
        record.to_frame()
