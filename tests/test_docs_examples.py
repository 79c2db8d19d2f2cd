"""The worked conversions of docs/coming-from.md run as written, on files the other tools wrote
themselves (tests/model/peer_files/, their provenance in its README), each in a directory of its
own holding those files under the names the example reads."""

import pathlib
import re
import shutil

import numpy as np
import pandas as pd
from helpers import PEER_FILES as peer_files

import jaxctbn as jc

ROOT = pathlib.Path(__file__).parent.parent
PEER_FILES = pathlib.Path(peer_files)


def _examples() -> dict[str, str]:
    """The page's Python blocks by section title."""
    text = (ROOT / "docs" / "coming-from.md").read_text()
    blocks = {}
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        title = section.splitlines()[0].strip()
        code = re.findall(r"```python\n(.*?)```", section, re.S)
        assert len(code) == 1, title
        blocks[title] = code[0]
    return blocks


def _run(code: str, where: pathlib.Path, monkeypatch) -> dict:
    monkeypatch.chdir(where)
    namespace: dict = {}
    exec(compile(code, "docs/coming-from.md", "exec"), namespace)
    return namespace


def _same_paths(a: jc.Trajectories, b: jc.Trajectories) -> None:
    for field in ("initial_states", "num_events", "durations"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    for r, m in enumerate(np.asarray(a.num_events)):
        np.testing.assert_allclose(a.jump_times[r, :m], b.jump_times[r, :m], rtol=1e-12)
        np.testing.assert_array_equal(a.states[r, :m], b.states[r, :m])


def test_the_page_has_the_four_tools():
    assert list(_examples()) == ["pyAgrum", "causal-hub", "PyCTBN", "R's msm"]


def test_from_pyagrum(tmp_path, monkeypatch):
    shutil.copy(PEER_FILES / "pyagrum_trajectories.csv", tmp_path / "trajectories.csv")
    ns = _run(_examples()["pyAgrum"], tmp_path, monkeypatch)
    N = len(ns["nodes"])
    edges = ns["edges"]
    assert len(edges) == N * (N - 1) and edges.probability.between(0, 1).all()
    back, _, nodes = jc.Trajectories.read_pyagrum_csv(tmp_path / "from_jaxctbn.csv", ns["nodes"])
    assert nodes == ns["nodes"]
    _same_paths(back, ns["paths"])


def test_from_causal_hub(tmp_path, monkeypatch):
    shutil.copy(PEER_FILES / "causal_hub_eating.json", tmp_path / "eating.json")
    (tmp_path / "trajectories").mkdir()
    for i in range(3):
        shutil.copy(
            PEER_FILES / f"causal_hub_trajectory_{i}.csv", tmp_path / "trajectories" / f"{i}.csv"
        )
    ns = _run(_examples()["causal-hub"], tmp_path, monkeypatch)
    model, paths = ns["model"], ns["paths"]
    assert list(ns["nodes"]) == list(model.names) and paths.num_trajectories == 3
    # every trajectory's time, split over the states of each node, is its duration
    total = float(np.asarray(paths.durations).sum())
    for node in ns["stats"].nodes:
        np.testing.assert_allclose(float(np.asarray(node.dwell_times).sum()), total, rtol=1e-12)
    back = jc.CTBN.from_causal_hub_json(tmp_path / "back.json")
    for q, r in zip(back.cims, model.cims):
        np.testing.assert_array_equal(q, r)


def test_from_pyctbn(tmp_path, monkeypatch):
    shutil.copy(
        PEER_FILES / "pyctbn_network_and_samples.json", tmp_path / "network_and_samples.json"
    )
    ns = _run(_examples()["PyCTBN"], tmp_path, monkeypatch)
    model, graph = ns["model"], ns["graph"]
    assert sorted(graph.edges) == sorted(
        (model.names[p], model.names[n]) for n, ps in enumerate(model.parents) for p in ps
    )
    assert [graph.nodes[n]["cardinality"] for n in model.names] == list(model.cardinalities)
    again = jc.CTBN.from_pyctbn_json(tmp_path / "from_jaxctbn.json")
    for q, r in zip(again.cims, model.cims):
        np.testing.assert_allclose(q, r, rtol=1e-12)
    back, _, _ = jc.Trajectories.read_pyctbn_json(tmp_path / "from_jaxctbn.json", model)
    _same_paths(back, ns["paths"])


def _msm_panel(rng: np.random.Generator) -> pd.DataFrame:
    """msm's layout (subject, time, state from 1): a three-state illness-death chain (1 <-> 2,
    2 -> 3 absorbing) seen at five visits, simulated exactly between them."""
    rates = {0: [(1, 0.4)], 1: [(0, 0.3), (2, 0.25)], 2: []}
    rows = []
    for subject in range(1, 41):
        state, t = 0, 0.0
        for visit in np.arange(5.0):
            while True:
                out = rates[state]
                total = sum(r for _, r in out)
                wait = rng.exponential(1 / total) if total else np.inf
                if t + wait > visit:
                    t = visit
                    break
                t += wait
                probabilities = np.array([r for _, r in out]) / total
                state = out[rng.choice(len(out), p=probabilities)][0]
            rows.append({"ptnum": subject, "years": visit, "state": state + 1})
    return pd.DataFrame(rows)


def test_from_msm(tmp_path, monkeypatch):
    _msm_panel(np.random.default_rng(0)).to_csv(tmp_path / "panel.csv", index=False)
    ns = _run(_examples()["R's msm"], tmp_path, monkeypatch)
    fit, table = ns["fit"], ns["table"]
    assert bool(fit.converged)
    # one row per free rate (msm's qmatrix's non-zeros), the fit's own rates
    assert list(zip(table["from"], table["to"])) == [(0, 1), (1, 0), (1, 2)]
    q = np.asarray(fit.model.cims[0][0])
    np.testing.assert_allclose(table.rate, [q[0, 1], q[1, 0], q[1, 2]], rtol=1e-12)
    assert q[0, 2] == q[2, 0] == q[2, 1] == 0.0  # structural zeros stay zero
