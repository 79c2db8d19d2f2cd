"""Reading panel data from the long-format CSV (issue 12): missing cells, merged and
conflicting rows, exact entry times, interventions, and the paths reader's message for a
missing cell."""

import io

import numpy as np
import pandas as pd
import pytest

import jaxctbn as jc
from jaxctbn._paths.csv import infer_cardinalities, trajectories_from_dataframe

NET = {"A": 2, "B": 3}


def _frame(text: str) -> pd.DataFrame:
    return pd.read_csv(io.StringIO(text))


def test_panel_rows_missing_cells_and_merging():
    df = _frame(
        "trajectory_id,time,A,B\n"
        "s1,0.0,0,2\n"
        "s1,2.5,1,\n"  # B missing
        "s1,1.0,,1\n"  # out of order: sorted by time
        "s1,2.5,,0\n"  # same time, other node: merged
        "s2,0.0,1,1\n"
        "s2,3.0,,\n"  # nothing observed: dropped
        "s3,4.0,0,0\n"  # a single observation: kept
    )
    with pytest.warns(UserWarning, match=r"2 trajectory\(ies\) \('s2', 's3'\) have a single"):
        obs, ids = jc.panel.PanelObservations.from_dataframe(df, NET)
    assert ids == ["s1", "s2", "s3"]
    np.testing.assert_array_equal(obs.num_observations, [3, 1, 1])
    np.testing.assert_allclose(obs.times[0], [0.0, 1.0, 2.5])
    np.testing.assert_array_equal(obs.states[0], [[0, 2], [-1, 1], [1, 0]])
    np.testing.assert_array_equal(obs.states[1, 0], [1, 1])
    assert obs.intervention is None and not np.any(obs.exact_entry)


def test_panel_conflicts_and_bad_cells_are_clear_errors():
    with pytest.raises(ValueError, match=r"trajectory 's1' has two rows at time 1 .*node 'B'"):
        jc.panel.PanelObservations.from_dataframe(
            _frame("trajectory_id,time,A,B\ns1,0,0,0\ns1,1,1,2\ns1,1,,1\n"), NET
        )
    with pytest.raises(ValueError, match=r"column 'B' has state 3 outside 0..2"):
        jc.panel.PanelObservations.from_dataframe(
            _frame("trajectory_id,time,A,B\ns1,0,0,3\ns1,1,1,2\n"), NET
        )
    with pytest.raises(ValueError, match=r"column 'A' must hold non-negative integer states"):
        jc.panel.PanelObservations.from_dataframe(
            _frame("trajectory_id,time,A,B\ns1,0,x,0\ns1,1,1,2\n"), NET
        )
    with pytest.raises(ValueError, match=r"exact_entry: unknown node 'C'"):
        jc.panel.PanelObservations.from_dataframe(
            _frame("trajectory_id,time,A,B\ns1,0,0,0\n"), NET, exact_entry={"C": 1}
        )
    with pytest.raises(ValueError, match=r"do\(A=1\) but 'A' is observed in another state"):
        jc.panel.PanelObservations.from_dataframe(
            _frame("trajectory_id,time,A,B,intervention\ns1,0,1,0,A=1\ns1,1,0,2,A=1\n"), NET
        )
    # complete paths: an empty cell is an error that points to panel data
    with pytest.raises(ValueError, match=r"row 1 .* allowed only for panel data"):
        trajectories_from_dataframe(_frame("trajectory_id,time,A,B\ns1,0,0,0\ns1,1,,0\n"), NET)


def test_exact_entry_flags_and_interventions():
    df = _frame(
        "trajectory_id,time,A,B,intervention\n"
        "s1,0,0,0,\n"
        "s1,1,0,1,\n"
        "s1,2,,2,\n"  # entry into B=2: exact
        "s1,3,1,2,\n"  # B=2 already seen: not an entry
        "s2,0,1,2,A=1\n"  # first row: never an entry
        "s2,1,1,0,A=1\n"
        "s2,2,1,2,A=1\n"  # entry
    )
    obs, _ = jc.panel.PanelObservations.from_dataframe(df, NET, exact_entry={"B": 2})
    np.testing.assert_array_equal(obs.exact_entry[0], [False, False, True, False])
    np.testing.assert_array_equal(obs.exact_entry[1, :3], [False, False, True])
    assert obs.intervention is not None
    np.testing.assert_array_equal(obs.intervention.targets, [[False, False], [True, False]])
    np.testing.assert_array_equal(obs.intervention.states[1], [1, 0])


def test_read_panel_csv_and_cardinalities(tmp_path):
    path = tmp_path / "panel.csv"
    path.write_text("trajectory_id,time,A,B\n1,0,0,\n1,1.5,1,2\n2,0,,1\n2,1,0,0\n")
    assert infer_cardinalities(pd.read_csv(path), missing=True) == {"A": 2, "B": 3}
    obs, ids = jc.panel.PanelObservations.read_csv(path, NET)
    assert ids == [1, 2]
    np.testing.assert_array_equal(obs.states[1], [[-1, 1], [0, 0]])
