"""`jaxctbn design --batch/--costs/--budget/--rank-by`: the JSON contract, the numbers of the
library call with the same key, and one-line errors (exit 2, nothing written)."""

import json
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import network_dict

import jaxctbn as jc
from jaxctbn._cli.main import main


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    root = tmp_path_factory.mktemp("batches")
    path = root / "small.json"
    path.write_text(json.dumps(network_dict()))
    hist = root / "hist.csv"
    sample = ["sample", "--network", str(path), "--trajectories", "5", "--duration", "2"]
    assert main([*sample, "--seed", "0", "--out", str(hist)]) == 0
    model = jc.CTBN.from_dict(network_dict())
    base = ["design", "--data", str(hist), "--target", "parameters", "--network", str(path)]
    base += ["--initial-state", "A=0,B=1", "--duration", "3", "--samples", "3", "--seed", "0"]
    return model, hist, base


def test_design_batch_matches_the_library(history, tmp_path):
    model, hist, base = history
    out = tmp_path / "batch.json"
    assert main([*base, "--batch", "3", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert len(res["batch"]) == 3 and res["batch_size"] == 3
    assert set(res["batch"][0]) == {"intervention", "score", "gain", "cost"}
    assert res["best"] == res["batch"][0]["intervention"]
    traj, _ = jc.Trajectories.read_csv(hist, model)
    post = eqx.filter_jit(
        lambda m, t: jc.RatePosterior.for_model(m).update_with(
            jc.SufficientStatistics.from_trajectories(t, m.cardinalities, m.parents)
        )
    )(model, traj)
    space = jc.intervention_space(model.cardinalities)
    ref = jc.score_interventions(
        post,
        space,
        jnp.array([0, 1], jnp.int32),
        3.0,
        key=jax.random.key(0),
        num_samples=3,
        batch=jc.Batch(3),
    )
    np.testing.assert_allclose(res["batch_score"], float(ref.batch_score), rtol=1e-9)
    np.testing.assert_allclose([e["gain"] for e in res["batch"]], ref.gains, rtol=1e-9)
    labels = [space_label(model, space, int(m)) for m in ref.members]
    assert [e["intervention"] for e in res["batch"]] == labels
    single = jc.score_interventions(
        post,
        space,
        jnp.array([0, 1], jnp.int32),
        3.0,
        key=jax.random.key(0),
        num_samples=3,
        # the criterion and outcome as the command line passes them: its compiled program
        criterion=jc.VBHC(),
        outcome=jc.CompletePath(),
    )
    np.testing.assert_allclose([e["score"] for e in res["scores"]], single, rtol=1e-9)


def space_label(model, space, i):
    t, s = np.asarray(space.targets[i]), np.asarray(space.states[i])
    return {model.names[n]: int(s[n]) for n in range(len(t)) if t[n]}


def test_design_costs_budget_and_rank_by(history, tmp_path):
    _, _, base = history
    out = tmp_path / "costs.json"
    prices = ["--costs", "A=100,B:0=2", "--experiment-cost", "1"]
    args = [*base, *prices, "--rank-by", "score-per-cost", "--budget", "4", "--batch", "2"]
    assert main([*args, "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["rank_by"] == "score-per-cost" and res["costs"]["budget"] == 4.0
    for entry in res["scores"]:
        want = 1.0 + (100.0 if "A" in entry["intervention"] else 0.0)
        want += 2.0 if entry["intervention"].get("B") == 0 else 0.0
        assert entry["cost"] == want
        np.testing.assert_allclose(entry["score_per_cost"], entry["score"] / want)
    assert all("A" not in e["intervention"] for e in res["batch"])
    assert res["batch_cost"] <= 4.0
    # without a batch: the best by score per cost among the affordable
    single = tmp_path / "single.json"
    assert main([*base, *prices, "--rank-by", "score-per-cost", "--out", str(single)]) == 0
    res = json.loads(single.read_text())
    ratios = [e["score_per_cost"] for e in res["scores"]]
    assert res["best"] == res["scores"][int(np.argmax(ratios))]["intervention"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--batch", "0"], "argument --batch"),
        (["--costs", "A=-1"], "--costs: 'A=-1': the cost must be a finite number >= 0"),
        (["--costs", "A=nan"], "--costs: 'A=nan': the cost must be a finite number >= 0"),
        (["--costs", "Z=1"], "--costs: unknown node 'Z'"),
        (["--costs", "A:5=1"], "the state of 'A' must be in 0..1"),
        (["--costs", "A=1,A=5"], "--costs: 'A' is priced twice (1 and 5)"),
        (["--costs", "A=1e308", "--experiment-cost", "1e308"], "total cost overflows"),
        (["--experiment-cost", "-1"], "argument --experiment-cost"),
        (["--experiment-cost", "nan"], "argument --experiment-cost"),
        (["--experiment-cost", "2", "--budget", "1"], "--budget: 1 is below the cheapest"),
        (["--rank-by", "score-per-cost"], "--rank-by score-per-cost: give the prices"),
        (["--costs", "A=1", "--rank-by", "score-per-cost"], "every experiment must cost > 0"),
        (["--batch", "2", "--criterion", "eig"], "--batch: batches are chosen by"),
    ],
)
def test_design_batch_and_cost_errors(history, tmp_path, capsys, flags, message):
    _, _, base = history
    out = tmp_path / "o.json"
    assert main([*base, *flags, "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not out.exists()


def test_run_in_rounds_with_costs_and_a_budget(history, tmp_path, capsys):
    """`run parameters --batch 2 --costs ... --budget`: metrics.csv's `round` and `cost`, the
    budget never exceeded, the settings recorded, the tables and a resume from the chunks."""
    import pandas as pd

    model, _, _ = history
    network = tmp_path / "net.json"
    network.write_text(json.dumps(network_dict()))
    out = tmp_path / "run"
    args = ["run", "parameters", "--network", str(network), "--designs", "random,bhc"]
    args += ["--repetitions", "2", "--experiments", "4", "--samples", "3", "--batch", "2"]
    args += ["--costs", "A=2", "--experiment-cost", "1", "--budget", "6", "--no-progress"]
    args += ["--max-events", "64", "--out", str(out)]
    assert main(args) == 0
    frame = pd.read_csv(out / "metrics.csv")
    assert {"round", "cost"} <= set(frame.columns)
    ran = frame[frame.experiment > 0]
    assert list(ran["round"][:4]) == [1, 1, 2, 2]
    assert ran["cost"].max() <= 6.0
    for (_, _), group in ran.groupby(["design", "repetition"]):
        assert np.all(np.diff(group["cost"].to_numpy()) >= 0)
        labels = group["intervention"].tolist()
        # what ran is paid for: each run experiment adds its price, a skipped one nothing
        prices = [0.0 if s == "skipped" else 1.0 + (2.0 if "A=" in s else 0.0) for s in labels]
        np.testing.assert_allclose(group["cost"].to_numpy(), np.cumsum(prices))
    config = json.loads((out / "config.json").read_text())
    assert config["batch"] == 2 and config["budget"] == 6.0 and config["rank_by"] == "score"
    assert config["costs"]["experiment"] == 1.0 and config["costs"]["clamp"][0] == [2.0, 2.0]
    summary = (out / "summary.md").read_text()
    assert "Against rounds and cumulative cost" in summary
    results = json.loads((out / "results.json").read_text())
    assert np.asarray(results["designs"]["bhc"]["costs"]).shape == (2, 4)
    capsys.readouterr()
    assert main(args) == 0  # the chunks are reused
    assert pd.read_csv(out / "metrics.csv").equals(frame)
    assert "damaged" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--batch", "3"], "--batch: 3 must divide --experiments (4)"),
        (["--budget", "3"], "--budget: give the prices"),
        (["--experiment-cost", "2", "--budget", "1"], "--budget: 1 is below the cheapest"),
        (["--costs", "A=1", "--rank-by", "score-per-cost"], "every experiment must cost > 0"),
    ],
)
def test_run_batch_and_cost_errors(tmp_path, capsys, flags, message):
    network = tmp_path / "net.json"
    network.write_text(json.dumps(network_dict()))
    out = tmp_path / "run"
    args = ["run", "parameters", "--network", str(network), "--experiments", "4"]
    assert main([*args, *flags, "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not out.exists()


STRENGTH_FLAGS = ["--strength", "B=0.5:4", "--costs", "B*=0.5", "--experiment-cost", "1"]


def _design_with_strength(base, tmp_path) -> dict:
    out = tmp_path / "strength.json"
    assert main([*base, *STRENGTH_FLAGS, "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_design_strength_matches_the_library(history, tmp_path):
    model, hist, base = history
    res = _design_with_strength(base, tmp_path)
    scaled = [e for e in res["scores"] if "rate_scales" in e]
    assert len(res["scores"]) == 9 + 3  # the 3 candidates leaving B free get a scaled variant
    assert all("B" not in e["intervention"] and set(e["rate_scales"]) == {"B"} for e in scaled)
    assert all(0.5 <= e["rate_scales"]["B"] <= 4.0 for e in scaled)
    assert all(e["cost"] == 1.5 for e in scaled)
    best = max(res["scores"], key=lambda e: e["score"])
    assert res["best"] == best["intervention"]
    assert res["rate_scales"] == best.get("rate_scales", {})
    # each scaled entry's score is the criterion of its intervention at its reported scale
    traj, _ = jc.Trajectories.read_csv(hist, model)
    post = eqx.filter_jit(
        lambda m, t: jc.RatePosterior.for_model(m).update_with(
            jc.SufficientStatistics.from_trajectories(t, m.cardinalities, m.parents)
        )
    )(model, traj)
    space = jc.intervention_space(model.cardinalities)
    labels = [space_label(model, space, i) for i in range(9)]
    rows = np.array([labels.index(e["intervention"]) for e in scaled])
    scales = jnp.asarray([e["rate_scales"]["B"] for e in scaled])
    chosen = jax.tree_util.tree_map(lambda a: a[rows], space)
    chosen = chosen.with_rate_scales([jnp.ones(len(rows)), scales])
    ref = jc.score_interventions(
        post, chosen, jnp.array([0, 1], jnp.int32), 3.0, key=jax.random.key(0), num_samples=3
    )
    np.testing.assert_allclose([e["score"] for e in scaled], ref, rtol=1e-9)
    # and no scaled entry scores below its perfect candidate's (s = 1 is in the range)
    plain = {
        json.dumps(e["intervention"]): e["score"] for e in res["scores"] if "rate_scales" not in e
    }
    assert all(e["score"] >= plain[json.dumps(e["intervention"])] - 1e-12 for e in scaled)


@pytest.mark.slow  # --batch: test_design_batch_matches_the_library; --strength: the test above
def test_design_batch_with_strength(history, tmp_path):
    # --batch with --strength: the greedy pair among the perfect and the scaled candidates,
    # each member reported with its scale (its first member is the best single entry)
    _, _, base = history
    res = _design_with_strength(base, tmp_path)
    pair = tmp_path / "pair.json"
    assert main([*base, *STRENGTH_FLAGS, "--batch", "2", "--out", str(pair)]) == 0
    res2 = json.loads(pair.read_text())
    first = res2["batch"][0]
    assert (
        first["intervention"] == res["best"] and first.get("rate_scales", {}) == res["rate_scales"]
    )
    assert len(res2["batch"]) == 2 and res2["batch_score"] >= first["score"] - 1e-12
    for e in res2["batch"]:
        if "rate_scales" in e:
            assert "B" not in e["intervention"] and 0.5 <= e["rate_scales"]["B"] <= 4.0
    assert res2["batch_cost"] == sum(e["cost"] for e in res2["batch"])


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--strength", "B=0:2"], "--strength: 'B=0:2': LOW must be > 0"),
        (["--strength", "B=-1:2"], "LOW must be > 0"),
        (["--strength", "B=3:2"], "empty range (HIGH < LOW)"),
        (["--strength", "B=1:1e300"], "--strength: 'B=1:1e300': HIGH must be at most 1000"),
        (["--strength", "Z=1:2"], "--strength: unknown node 'Z'"),
        (["--strength", "B=1"], "expected NODE=LOW:HIGH"),
        (["--strength", "B=1:2", "--criterion", "eig"], "gradient of the bhc or vbhc"),
        (["--strength", "B=1:2", "--batch", "2", "--criterion", "eig"], "--batch: batches"),
        (["--costs", "Z*=1"], "--costs: unknown node 'Z'"),
    ],
)
def test_design_strength_errors(history, tmp_path, capsys, flags, message):
    _, _, base = history
    out = tmp_path / "o.json"
    assert main([*base, *flags, "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not out.exists()


def test_design_memory_is_bounded(history, tmp_path, capsys, monkeypatch):
    """`design` compiles its scoring program first and compares XLA's account of its memory
    with the budget (JAXCTBN_MEMORY_BUDGET): over it, the candidates are scored in chunks (the
    same numbers: every candidate has the same posterior draws), and a request of which even
    one candidate is over the budget, or a batch over it, is refused in one line, nothing
    written (issue 61, item 4)."""
    _, _, base = history
    whole = tmp_path / "whole.json"
    assert main([*base, "--out", str(whole)]) == 0
    assert "note:" not in capsys.readouterr().err
    refused = tmp_path / "refused.json"
    monkeypatch.setenv("JAXCTBN_MEMORY_BUDGET", "1")
    lines = []
    for flags, scope in (([], "for one candidate"), (["--batch", "2"], "for the whole batch")):
        assert main([*base, *flags, "--out", str(refused)]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("jaxctbn: error:") and scope in line and "--samples" in line
        assert not refused.exists()
        lines.append(line)
    monkeypatch.setenv("JAXCTBN_MEMORY_BUDGET", "lots")
    assert main([*base, "--out", str(refused)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "JAXCTBN_MEMORY_BUDGET: expected a positive number of bytes" in line
    assert not refused.exists()
    # a budget of three candidates' memory: scored in chunks
    one = re.search(r"needs about ([\d.]+) KiB for one candidate", lines[0])
    assert one, lines[0]
    monkeypatch.setenv("JAXCTBN_MEMORY_BUDGET", f"{3 * float(one.group(1)):.0f}K")
    chunked = tmp_path / "chunked.json"
    assert main([*base, "--out", str(chunked)]) == 0
    note = capsys.readouterr().err
    assert "for all 9 candidates at once" in note and "at a time" in note, note
    a, b = (json.loads(p.read_text()) for p in (whole, chunked))
    assert a["best"] == b["best"]
    np.testing.assert_allclose(
        [e["score"] for e in b["scores"]], [e["score"] for e in a["scores"]], rtol=1e-12
    )
