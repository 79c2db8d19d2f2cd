"""Design answers as pandas tables, against the JSON that `jaxctbn design` writes for the same
answer (its writer, `write_ranking`, on arguments parsed as the command line parses them): a
ranking of bare scores (`Intervention.to_frame` with the scores as a column), a panel design's
visit times (`PanelDesign.to_frame`) and a batch's members (`BatchDesign.to_frame`)."""

import json

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

import jaxctbn as jc
from jaxctbn._cli.main import build_parser
from jaxctbn._cli.ranking import write_ranking

NAMES = ["A", "B"]
SPACE = jc.intervention_space((2, 2))
SCORES = jnp.array([0.3, 1.2, -0.4, 2.5, 0.0, 0.7, 1.9, -1.0, 0.1])


def _ranking(tmp_path, extra, **answer):
    """The JSON `jaxctbn design ... EXTRA` writes for `answer` (the scores of `SPACE`, and a
    panel design or a batch)."""
    out = tmp_path / "rank.json"
    args = ["design", "--target", "parameters", "--network", "net.json", "--initial-state"]
    args += ["A=0,B=0", "--duration", "3", "--samples", "3", "--seed", "0", "--criterion", "bhc"]
    args += extra
    parsed = build_parser().parse_args([*args, "--out", str(out)])
    write_ranking(parsed, np.asarray(SCORES), SPACE, NAMES, {"A": 0, "B": 0}, 3.0, **answer)
    return json.loads(out.read_text())


def _label(intervention: dict) -> str:
    return ";".join(f"{k}={v}" for k, v in intervention.items()) or "none"


def test_scores_ranking(tmp_path):
    written = _ranking(tmp_path, [])["scores"]
    frame = SPACE.to_frame(NAMES).assign(score=np.asarray(SCORES))
    expected = pd.DataFrame(
        {"intervention": [_label(e["intervention"]) for e in written],
         "score": [e["score"] for e in written]}
    )  # fmt: skip
    pd.testing.assert_frame_equal(frame, expected)
    best = frame.sort_values("score", ascending=False).iloc[0]["intervention"]
    assert best == _label(_ranking(tmp_path, [])["best"]) == "A=0"


def test_panel_design_frame(tmp_path):
    design = jc.criteria.PanelDesign(
        scores=SCORES,
        times=jnp.stack([jnp.linspace(0.5, 1.0, 9), jnp.linspace(2.0, 3.0, 9)], axis=1),
        equally_spaced_scores=SCORES - 0.25,
    )
    written = _ranking(tmp_path, ["--outcome", "panel", "--visits", "2"], panel=design)
    frame = design.to_frame(SPACE, NAMES)
    assert list(frame.columns) == [
        "intervention",
        "score",
        "observation_times",
        "score_equally_spaced",
    ]
    assert frame["intervention"].tolist() == [_label(e["intervention"]) for e in written["scores"]]
    for column in ("score", "score_equally_spaced"):
        assert frame[column].tolist() == [e[column] for e in written["scores"]]
    assert [list(t) for t in frame["observation_times"]] == [
        e["observation_times"] for e in written["scores"]
    ]
    with pytest.raises(ValueError, match="candidates: 5 interventions for 9 scores"):
        design.to_frame(jc.single_node_interventions((2, 2)), NAMES)


def test_batch_design_frame(tmp_path):
    """The members in the order chosen, an empty slot (-1: nothing affordable) left out."""
    design = jc.criteria.BatchDesign(
        members=jnp.array([3, 6, -1]),
        scores=jnp.array([2.5, 1.9, 0.0]),
        gains=jnp.array([2.5, 1.1, 0.0]),
        costs=jnp.array([2.0, 3.0, 0.0]),
        batch_score=jnp.asarray(3.6),
        total_cost=jnp.asarray(5.0),
        round_scores=jnp.zeros((3, 9)),
    )
    written = _ranking(tmp_path, ["--batch", "3"], batch=design)["batch"]
    frame = design.to_frame(SPACE, NAMES)
    assert list(frame.columns) == ["candidate", "intervention", "score", "gain", "cost"]
    assert frame["candidate"].tolist() == [3, 6]
    expected = pd.DataFrame(
        [
            {
                "intervention": _label(e["intervention"]),
                **{k: e[k] for k in ("score", "gain", "cost")},
            }
            for e in written
        ]  # fmt: skip
    )
    pd.testing.assert_frame_equal(frame[expected.columns], expected)
    with pytest.raises(ValueError, match="the batch holds candidate 6"):
        design.to_frame(jc.single_node_interventions((2, 2)), NAMES)
