"""Observed against expected prevalence (`jaxctbn.panel.prevalence`, `jaxctbn prevalence`):
the counts against a plain loop over the visits, the forecasts against scipy.linalg.expm of
the brute-force generator of each trajectory (its intervention applied), and the command
line's table and figure."""

import itertools

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
import scipy.linalg
from helpers import brute_force_generator

import jaxctbn as jc
from jaxctbn._cli import main
from jaxctbn._panel.prevalence import prevalence

MODEL = jc.CTBN(
    cims=[
        jnp.array([[[-0.5, 0.5], [1.0, -1.0]]]),
        jnp.array([[[-0.3, 0.3], [0.6, -0.6]], [[-1.2, 1.2], [0.2, -0.2]]]),
    ],
    parents=((), (0,)),
    names=("A", "B"),
)
# staggered entry, unequal visits, missing cells (-1); trajectory 2 under do(A = 1)
TIMES = [[0.0, 1.0, 2.5, 4.0], [0.5, 2.0, 3.0, 0.0], [1.0, 1.5, 3.5, 5.0], [0.0, 3.0, 0.0, 0.0]]
STATES = [
    [[0, 0], [1, -1], [1, 1], [0, 1]],
    [[1, 0], [-1, 1], [0, 1], [0, 0]],
    [[1, 0], [1, 0], [1, 1], [1, 1]],
    [[0, 1], [0, 0], [0, 0], [0, 0]],
]
COUNTS = [4, 3, 4, 2]
GRID = np.array([0.0, 0.75, 1.2, 2.0, 3.2, 4.5])


def _observations():
    targets = np.zeros((4, 2), bool)
    targets[2, 0] = True
    clamp = np.zeros((4, 2), np.int32)
    clamp[2, 0] = 1
    return jc.panel.PanelObservations(
        np.asarray(TIMES),
        np.asarray(STATES),
        num_observations=np.asarray(COUNTS),
        intervention=jc.Intervention(targets=jnp.asarray(targets), states=jnp.asarray(clamp)),
    )


def test_counts_and_forecasts_against_loops_and_dense_exponentials():
    result = prevalence(MODEL, _observations(), GRID)
    states = list(itertools.product(range(2), range(2)))
    for g, t in enumerate(GRID):
        at_risk = np.zeros(2, int)
        observed = np.zeros((2, 2), int)
        expected = np.zeros((2, 2))
        for r in range(4):
            times, seen = TIMES[r][: COUNTS[r]], STATES[r][: COUNTS[r]]
            if not times[0] <= t <= times[-1]:
                continue
            # the forecast from the first visit: unobserved nodes uniform (none here)
            iv = jc.Intervention(targets=jnp.asarray([r == 2, False]), states=jnp.asarray([1, 0]))
            W = brute_force_generator(iv.apply(MODEL) if r == 2 else MODEL)
            start = np.array([float(s == tuple(seen[0])) for s in states])
            p = start @ scipy.linalg.expm((t - times[0]) * W)
            for n in range(2):
                last = [y[n] for time, y in zip(times, seen) if time <= t and y[n] >= 0]
                if not last:
                    continue
                at_risk[n] += 1
                observed[n, last[-1]] += 1
                for s, prob in zip(states, p):
                    expected[n, s[n]] += prob
        np.testing.assert_array_equal(result.at_risk[g], at_risk)
        np.testing.assert_array_equal(result.observed[g], observed)
        np.testing.assert_allclose(result.expected[g], expected, rtol=1e-10, atol=1e-12)
    # the expected counts of a node sum to those at risk
    np.testing.assert_allclose(np.asarray(result.expected).sum(-1), result.at_risk, rtol=1e-12)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="times: must be strictly increasing"):
        prevalence(MODEL, _observations(), [1.0, 1.0])
    with pytest.raises(ValueError, match="observations: expected a PanelObservations with one"):
        prevalence(MODEL, _observations().times, GRID)  # pyright: ignore


def test_prevalence_from_the_command_line(tmp_path, capsys):
    # a fit JSON of the model (its network), the data as CSV: the table holds the library's
    # counts, in percent of those at risk, and the figure is written
    rows = []
    for r in range(4):
        for i in range(COUNTS[r]):
            cells = ["" if v < 0 else v for v in STATES[r][i]]
            rows.append([r, TIMES[r][i], *cells, "A=1" if r == 2 else ""])
    data = tmp_path / "visits.csv"
    pd.DataFrame(rows, columns=["trajectory_id", "time", "A", "B", "intervention"]).to_csv(
        data, index=False
    )
    fit = tmp_path / "fit.json"
    fit.write_text(__import__("json").dumps({"network": MODEL.to_dict()}))
    out = tmp_path / "prevalence"
    times = ",".join(str(t) for t in GRID)
    args = ["prevalence", "--data", str(data), "--fit", str(fit), "--observation", "panel"]
    assert main([*args, "--times", times, "--out", str(out)]) == 0
    table = pd.read_csv(out / "prevalence.csv")
    assert (out / "prevalence.png").stat().st_size > 0
    expected = prevalence(MODEL, _observations(), GRID)
    assert len(table) == len(GRID) * 2 * 2
    for _, row in table.iterrows():
        g, n = list(GRID).index(row.time), ["A", "B"].index(row.node)
        assert row.at_risk == int(expected.at_risk[g, n])
        assert row.observed == int(expected.observed[g, n, row.state])
        np.testing.assert_allclose(row.expected, float(expected.expected[g, n, row.state]))
        if row.at_risk:
            np.testing.assert_allclose(row.observed_percent, 100 * row.observed / row.at_risk)
    capsys.readouterr()
    assert main([*args, "--times", "2,1", "--out", str(tmp_path / "bad")]) == 2
    assert "strictly increasing" in capsys.readouterr().err
