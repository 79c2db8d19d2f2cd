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


def test_strength_design_frame():
    """`StrengthDesign.to_frame`: a row per candidate, its scale per strength node where it
    leaves that node free (as `design --strength` lists the scaled variants with their
    `rate_scales`), NaN where it clamps one; the grid's best score."""
    free = jnp.array([True, True, True, False, False, False, True, False, False])
    design = jc.criteria.StrengthDesign(
        scores=SCORES + 0.5,
        rate_scales=jnp.stack([jnp.linspace(0.5, 4.0, 9), jnp.linspace(1.0, 2.0, 9)], axis=1),
        grid_scores=jnp.stack([SCORES, SCORES + 0.25, SCORES - 1.0], axis=1),
        free=free,
    )
    strengths = jc.criteria.Strengths((1, 0), jnp.array([0.5, 1.0]), jnp.array([4.0, 2.0]))
    frame = design.to_frame(SPACE, NAMES, strengths=strengths)
    assert list(frame.columns) == [
        "intervention", "score", "free", "rate_scale[B]", "rate_scale[A]", "best_grid_score"
    ]  # fmt: skip
    assert frame["intervention"].tolist() == SPACE.to_frame(NAMES)["intervention"].tolist()
    np.testing.assert_array_equal(frame["score"], np.asarray(SCORES + 0.5))
    np.testing.assert_array_equal(frame["best_grid_score"], np.asarray(SCORES + 0.25))
    for i in range(9):
        if bool(free[i]):
            assert frame["rate_scale[B]"][i] == float(design.rate_scales[i, 0])
            assert frame["rate_scale[A]"][i] == float(design.rate_scales[i, 1])
        else:
            assert frame[["rate_scale[B]", "rate_scale[A]"]].iloc[i].isna().all()
    with pytest.raises(ValueError, match="strengths: 1 nodes, but the design holds 2 scales"):
        design.to_frame(SPACE, NAMES, strengths=jc.criteria.Strengths((0,), [0.5], [2.0]))
    with pytest.raises(ValueError, match="candidates: 5 interventions for 9 scores"):
        design.to_frame(jc.single_node_interventions((2, 2)), NAMES, strengths=strengths)


def test_uncertain_strength_frame():
    """`UncertainStrengthScores.to_frame`: the average and one column per posterior strength,
    in order, each the candidate's score at it."""
    at = jnp.stack([SCORES, 2 * SCORES, SCORES - 1.0], axis=1)
    answer = jc.criteria.UncertainStrengthScores(
        scores=at.mean(1), strengths=jnp.array([0.25, 1.0, 3.5]), scores_at_strengths=at
    )
    frame = answer.to_frame(SPACE, NAMES)
    assert list(frame.columns) == [
        "intervention", "score", "score_at[0.25]", "score_at[1]", "score_at[3.5]"
    ]  # fmt: skip
    np.testing.assert_allclose(frame["score"], np.asarray(SCORES) * 4 / 3 - 1 / 3, rtol=1e-12)
    np.testing.assert_array_equal(frame["score_at[1]"], 2 * np.asarray(SCORES))
