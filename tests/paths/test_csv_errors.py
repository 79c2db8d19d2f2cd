"""The library route of the trajectory CSV and the network JSON (issue 10): malformed input
raises the same one-line `ValueError`s the CLI prints, and long trajectories are cut into
pieces with identical statistics."""

import equinox as eqx
import numpy as np
import pandas as pd
import pytest
from helpers import network_dict

import jaxctbn as jc
from jaxctbn._cli.demo import run_demo
from jaxctbn._paths.csv import infer_cardinalities, read_csv, trajectories_from_dataframe

HEADER = "trajectory_id,time,A,B\n"


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "is empty; expected a header"),
        (HEADER, "no rows after the header"),
        (HEADER.replace(",", ";") + "0;0;0;0\n0;1;1;0\n", "the file must be comma-separated"),
        ("trajectory_id,time,A,A,B\n0,0,0,0,0\n0,1,1,1,0\n", r"\['A'\] appear more than once"),
        ("trajectory_id,time,,B\n0,0,0,0\n0,1,1,0\n", "column 3 of the header has no name"),
        (HEADER + "0,0,0,0\n,1,1,0\n", r"empty trajectory_id in row 1 \(line 3"),
        (HEADER + "0,0,0,0\n0,1,x,0\n", "column 'A' must hold non-negative integer states"),
        (HEADER + "0,0,0,0\n0,1,1,0,7\n", "is not a readable CSV: Error tokenizing"),
    ],
)
def test_malformed_csv_raises_one_line(tmp_path, text, message):
    path = tmp_path / "data.csv"
    path.write_text(text)
    nodes = {"A": 2, "B": 2}
    for read in (
        lambda: jc.Trajectories.read_csv(path, nodes),
        lambda: infer_cardinalities(read_csv(path)),
    ):
        with pytest.raises(ValueError, match=message) as info:
            read()
        assert "\n" not in str(info.value)


def test_missing_file_or_directory(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_csv(tmp_path / "none.csv")
    with pytest.raises(ValueError, match="is a directory; give a trajectory CSV file"):
        read_csv(tmp_path)
    with pytest.raises(ValueError, match="is a directory; give a network JSON file"):
        jc.CTBN.from_json(tmp_path)


def test_dataframe_with_repeated_column():
    df = pd.DataFrame([[0, 0.0, 0, 0], [0, 1.0, 1, 1]], columns=["trajectory_id", "time", "A", "A"])
    with pytest.raises(ValueError, match=r"duplicate column\(s\) \['A'\]"):
        trajectories_from_dataframe(df, {"A": 2})


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["cims"]["B"][1].update(Q=[[-3], [1, -1]]), "Q must be 2x2: row 0 has 1"),
        (lambda d: d["cims"]["B"][1].update(Q=[[-3, 3]]), "Q must be 2x2 .* got 1 rows"),
        (lambda d: d["cims"]["B"][1].update(Q=[[-3, "3"], [1, -1]]), r"Q\[0\]\[1\] must be a"),
        (lambda d: d["cims"]["B"][1].update(Q=[[-3, True], [1, -1]]), r"Q\[0\]\[1\] must be a"),
        (lambda d: d["cims"]["B"][1]["parent_states"].update(A=1.0), r"\['A'\] must be an integer"),
        (
            lambda d: d["cims"]["B"][1]["parent_states"].update(A=None),
            r"\['A'\] must be an integer",
        ),
        (lambda d: d["cims"]["B"][1].update(parent_states=[1]), "parent_states must be an object"),
        (lambda d: d["nodes"][1].update(parents=[0]), r"nodes\[1\].parents .* list of node names"),
    ],
)
def test_network_fields_are_named(mutate, message):
    data = network_dict()
    mutate(data)
    with pytest.raises(ValueError, match=f"network: .*{message}"):
        jc.CTBN.from_dict(data)


def test_network_q_may_be_an_array():
    data = network_dict()
    data["cims"]["B"][1]["Q"] = np.array([[-3.0, 3.0], [1.0, -1.0]])
    data["cims"]["B"][1]["parent_states"] = {"A": np.int64(1)}
    model = jc.CTBN.from_dict(data)
    np.testing.assert_array_equal(model.cims[1][1], [[-3.0, 3.0], [1.0, -1.0]])


def test_demo_needs_two_trajectories(tmp_path):
    with pytest.raises(ValueError, match="trajectories: must be an integer >= 2"):
        run_demo(out_dir=str(tmp_path / "demo"), trajectories=1)
    assert not (tmp_path / "demo").exists()


def _frame(rng, tid, jumps, cards, intervention=""):
    """One trajectory in long format: `jumps` single-node changes at random times."""
    N = len(cards)
    free = [n for n in range(N) if not intervention.startswith(f"{'AB'[n]}=")]
    s = np.zeros((jumps + 2, N), int)
    for j in range(1, jumps + 1):
        s[j] = s[j - 1]
        n = free[rng.integers(len(free))]
        s[j, n] = (s[j, n] + rng.integers(1, cards[n])) % cards[n]
    s[-1] = s[-2]
    t = np.concatenate([[0.25], 0.25 + np.cumsum(rng.exponential(0.3, jumps + 1))])
    df = pd.DataFrame({"trajectory_id": tid, "time": t})
    for n in range(N):
        df["AB"[n]] = s[:, n]
    df["intervention"] = intervention
    return df


def test_long_trajectories_are_cut_into_pieces_with_identical_statistics():
    """200 short trajectories (3 jumps), one of 300 jumps and one of 60 under do(A=0): the
    automatic bound (99th percentile) is 3 jump slots, so the long ones become 100 and 20
    consecutive rows; statistics, pooling and structure scores are those of the whole paths."""
    rng = np.random.default_rng(0)
    cards = {"A": 2, "B": 3}
    frames = [_frame(rng, f"s{i}", 3, (2, 3)) for i in range(200)]
    frames.insert(50, _frame(rng, "long", 300, (2, 3)))
    frames.append(_frame(rng, "clamped", 60, (2, 3), intervention="A=0"))
    df = pd.concat(frames, ignore_index=True)
    whole, whole_ids = trajectories_from_dataframe(df, cards, max_events=10**6)
    pieces, piece_ids = trajectories_from_dataframe(df, cards)
    assert whole.jump_times.shape == (202, 300)
    assert pieces.jump_times.shape == (200 + 100 + 20, 3)
    assert pieces.states.shape == (320, 3, 2)
    assert list(dict.fromkeys(piece_ids)) == whole_ids
    assert piece_ids[50:150] == ["long"] * 100 and piece_ids[-20:] == ["clamped"] * 20
    np.testing.assert_array_equal(pieces.intervention_targets[-20:], [[True, False]] * 20)
    np.testing.assert_allclose(pieces.durations.sum(), whole.durations.sum(), rtol=1e-12)

    @eqx.filter_jit  # one program per shape: eagerly, each small operation compiles
    def pooled_and_total(t):
        stats = jc.SufficientStatistics.from_trajectories(t, (2, 3), ((1,), (0,)))
        return stats.pooled() + stats.total()

    for x, y in zip(pooled_and_total(whole), pooled_and_total(pieces)):
        np.testing.assert_allclose(y.dwell_times, x.dwell_times, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(y.transitions, x.transitions)
    scores = [
        jc.learn_structure(t, ["A", "B"], (2, 3), max_parents=1).log_marginal_likelihoods
        for t in (whole, pieces)
    ]
    for x, y in zip(*scores):
        np.testing.assert_allclose(y, x, rtol=1e-12)


def test_max_events_bounds_the_rows():
    df = pd.concat(
        [
            _frame(np.random.default_rng(1), 0, 10, (2, 2)),
            _frame(np.random.default_rng(2), 1, 0, (2, 2)),
        ]
    )
    traj, ids = trajectories_from_dataframe(df, {"A": 2, "B": 2}, max_events=4)
    assert traj.jump_times.shape == (4, 4) and ids == [0, 0, 0, 1]
    np.testing.assert_array_equal(traj.num_events, [4, 4, 2, 0])
    # a piece ends with its last jump; the next starts there, in the state after it
    np.testing.assert_array_equal(traj.jump_times[0, 3], traj.durations[0])
    np.testing.assert_array_equal(traj.initial_states[1], traj.states[0, 3])
    with pytest.raises(ValueError, match="max_events: must be a positive integer"):
        trajectories_from_dataframe(df, {"A": 2, "B": 2}, max_events=0)


def test_a_suspicious_inferred_cardinality_is_warned_about(tmp_path, capsys):
    """One mistyped state (400) among 0/1 gives 401 inferred states: a one-line warning names
    the node and the states seen; the library route raises a UserWarning."""
    path = tmp_path / "typo.csv"
    path.write_text(
        "trajectory_id,time,A,B\n0,0.0,0,1\n0,0.5,1,1\n0,1.0,1,400\n0,2.0,1,400\n"
        "1,0.0,0,0\n1,1.5,0,1\n1,2.0,0,1\n"
    )
    with pytest.warns(UserWarning, match=r"node 'B' is inferred to have 401 states"):
        assert infer_cardinalities(read_csv(path)) == {"A": 2, "B": 401}
    from jaxctbn._cli import main

    learn = ["learn", "--data", str(path), "--max-parents", "0", "--out", str(tmp_path / "o.json")]
    assert main([*learn, "--cardinalities", "B=401"]) == 0  # given: no warning
    assert capsys.readouterr().err == ""
    assert main(learn) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "jaxctbn: warning: data: node 'B' is inferred to have 401 states (largest state 400), "
        "but only 3 distinct states appear (0, 1, 400); give the cardinalities "
        "(--cardinalities NODE=K) if that is wrong."
    ]
