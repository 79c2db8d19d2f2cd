"""`jaxctbn convert` and `--format` (issue 64's command-line contracts, `jaxctbn/_cli/convert.py`,
`inputs.py`): each peer fixture (`tests/model/peer_files/`) converted to jaxctbn and back gives
what the library's own methods give (the same bytes, events, CIMs exactly); `learn --format
pyagrum` is `learn` on the converted CSV; the detected format is stated; bad inputs are one
line, exit status 2, and nothing written."""

import json
import os
import shutil

import numpy as np
import pandas as pd
import pytest
from helpers import PEER_FILES

import jaxctbn as jc
from jaxctbn._cli.main import main
from jaxctbn._paths.path_arrays import paths_of

PYAGRUM_CSV = os.path.join(PEER_FILES, "pyagrum_trajectories.csv")
PYAGRUM_NET = os.path.join(PEER_FILES, "pyagrum_network.json")  # jaxctbn's JSON with "labels"
EATING = os.path.join(PEER_FILES, "causal_hub_eating.json")
PYCTBN = os.path.join(PEER_FILES, "pyctbn_network_and_samples.json")


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def events(trajectories, num_nodes: int) -> list:
    """Per trajectory: initial state, jump times, states after the jumps, duration."""
    return [
        (a.tolist(), b.tolist(), c.tolist(), d)
        for a, b, c, d in paths_of(trajectories, num_nodes, "test")
    ]


def cims_equal(a: jc.CTBN, b: jc.CTBN) -> bool:
    return (
        a.names == b.names
        and a.parents == b.parents
        and all(np.array_equal(x, y) for x, y in zip(a.cims, b.cims))
    )


@pytest.fixture
def causal_hub_dir(tmp_path):
    """The fixture's three frames in a directory of their own (causal-hub's on-disk form)."""
    folder = tmp_path / "causal_hub"
    folder.mkdir()
    for i in range(3):
        shutil.copy(os.path.join(PEER_FILES, f"causal_hub_trajectory_{i}.csv"), folder)
    return folder


def causal_hub_frames(folder) -> list:
    frames = []
    for i in range(3):
        frame = pd.read_csv(folder / f"causal_hub_trajectory_{i}.csv", dtype=str)
        frame["time"] = frame["time"].astype(float)
        frames.append(frame)
    return frames


def test_pyagrum_trajectories_to_jaxctbn_and_back(tmp_path, capsys):
    with open(PYAGRUM_NET) as f:
        spec = json.load(f)
    model, labels = jc.CTBN.from_dict(spec), spec["labels"]
    ours = tmp_path / "ours.csv"
    code, out, _ = run(capsys, "convert", "--to", "jaxctbn", "--network", PYAGRUM_NET,
                       PYAGRUM_CSV, ours)  # fmt: skip
    assert code == 0 and "(pyAgrum's 3 trajectories, detected)" in out
    assert "A: 0=lo, 1=hi" in out  # the states' numbering, from --network's labels
    trajectories, ids, _ = jc.Trajectories.read_pyagrum_csv(PYAGRUM_CSV, labels)
    trajectories.write_csv(tmp_path / "library.csv", model)
    assert ours.read_bytes() == (tmp_path / "library.csv").read_bytes()
    back = tmp_path / "back.csv"
    code, out, _ = run(capsys, "convert", "--from", "jaxctbn", "--to", "pyagrum", "--network",
                       PYAGRUM_NET, ours, back)  # fmt: skip
    assert code == 0 and "(jaxctbn's 3 trajectories, given)" in out
    jc.Trajectories.read_csv(ours, model)[0].write_pyagrum_csv(tmp_path / "library.csv", labels)
    assert back.read_bytes() == (tmp_path / "library.csv").read_bytes()
    again, again_ids, nodes = jc.Trajectories.read_pyagrum_csv(back, labels)
    assert events(again, 3) == events(trajectories, 3) and again_ids == ids == [0, 1, 2]
    # without --network the labels are ordered as text (pyAgrum's rule): A's states swap
    code, out, _ = run(capsys, "convert", "--to", "jaxctbn", PYAGRUM_CSV, ours)
    assert code == 0 and "A: 0=hi, 1=lo" in out


def test_causal_hub_trajectories_to_jaxctbn_and_back(tmp_path, capsys, causal_hub_dir):
    model = jc.CTBN.from_causal_hub_json(EATING)
    labels = {n: ["no", "yes"] for n in model.names}
    ours = tmp_path / "ours.csv"
    code, out, err = run(capsys, "convert", "--to", "jaxctbn", "--network", EATING,
                         causal_hub_dir, ours)  # fmt: skip
    assert code == 0 and "(causal-hub's 3 trajectories, detected)" in out
    assert "--network: read" in err and "as causal-hub's network (detected)" in err
    trajectories, ids, nodes = jc.Trajectories.from_causal_hub(
        causal_hub_frames(causal_hub_dir), labels
    )
    trajectories.write_csv(tmp_path / "library.csv", model)
    assert ours.read_bytes() == (tmp_path / "library.csv").read_bytes()
    back = tmp_path / "back"
    code, out, _ = run(capsys, "convert", "--to", "causal-hub", "--network", EATING, ours, back)
    assert code == 0 and sorted(os.listdir(back)) == [f"trajectory_{i}.csv" for i in range(3)]
    frames = jc.Trajectories.read_csv(ours, model)[0].to_causal_hub(labels)
    for i, frame in enumerate(frames):
        written = (back / f"trajectory_{i}.csv").read_bytes()
        assert written == frame.to_csv(index=False).encode()
        # causal-hub's own sampled frames come back byte for byte
        assert written == (causal_hub_dir / f"causal_hub_trajectory_{i}.csv").read_bytes()
    # a later conversion replaces the directory as a whole
    code, _, _ = run(capsys, "convert", "--to", "causal-hub", ours, back)
    assert code == 0 and (back / "trajectory_0.csv").read_text().splitlines()[1] == "0.0,0,0,1"


def test_causal_hub_network_to_jaxctbn_and_back(tmp_path, capsys):
    model = jc.CTBN.from_causal_hub_json(EATING)
    ours = tmp_path / "ours.json"
    code, out, _ = run(capsys, "convert", "--to", "jaxctbn", EATING, ours)
    assert code == 0 and "(causal-hub's network, detected)" in out
    data = json.loads(ours.read_text())
    assert data["labels"] == {n: ["no", "yes"] for n in model.names}
    assert cims_equal(jc.CTBN.from_json(ours), model)  # the CIMs exactly
    back = tmp_path / "back.json"
    code, _, _ = run(capsys, "convert", "--to", "causal-hub", ours, back)
    assert code == 0
    model.to_causal_hub_json(tmp_path / "library.json", labels=data["labels"])
    assert back.read_bytes() == (tmp_path / "library.json").read_bytes()
    assert cims_equal(jc.CTBN.from_causal_hub_json(back), model)


def test_pyctbn_to_jaxctbn_and_back(tmp_path, capsys):
    """A PyCTBN file holds a network and samples: both converted (--network-out), or the
    network's loss said."""
    model = jc.CTBN.from_pyctbn_json(PYCTBN)
    trajectories, _, _ = jc.Trajectories.read_pyctbn_json(PYCTBN)
    ours, net = tmp_path / "ours.csv", tmp_path / "net.json"
    code, out, _ = run(capsys, "convert", "--to", "jaxctbn", PYCTBN, ours)
    assert code == 0 and "IN's network was not converted" in out and not net.exists()
    code, out, _ = run(capsys, "convert", "--to", "jaxctbn", "--network-out", net, PYCTBN, ours)
    assert code == 0 and "(PyCTBN's 3 trajectories and a network, detected)" in out
    assert cims_equal(jc.CTBN.from_json(net), model)
    assert events(jc.Trajectories.read_csv(ours, model)[0], 3) == events(trajectories, 3)
    back = tmp_path / "back.json"
    code, out, _ = run(capsys, "convert", "--to", "pyctbn", "--network", net, ours, back)
    assert code == 0 and "wrote PyCTBN's trajectories and network to" in out
    trajectories.write_pyctbn_json(tmp_path / "library.json", model)
    assert back.read_bytes() == (tmp_path / "library.json").read_bytes()
    assert cims_equal(jc.CTBN.from_pyctbn_json(back), model)


def test_learn_format_pyagrum_is_learn_of_the_converted_csv(tmp_path, capsys):
    converted = tmp_path / "converted.csv"
    assert run(capsys, "convert", "--to", "jaxctbn", PYAGRUM_CSV, converted)[0] == 0
    results = {}
    for name, argv in {
        "given": ["--format", "pyagrum", "--data", PYAGRUM_CSV],
        "detected": ["--data", PYAGRUM_CSV],
        "converted": ["--data", converted],
    }.items():
        out = tmp_path / f"{name}.json"
        code, _, err = run(capsys, "learn", *argv, "--max-parents", "1", "--out", out)
        assert code == 0
        note = {"given": "(--format)", "detected": "(detected)"}.get(name)
        assert (f"as pyAgrum's trajectories {note}" in err) == (note is not None)
        results[name] = json.loads(out.read_text())
    assert results["given"]["input_format"] == results["detected"]["input_format"]
    assert results["given"].pop("input_format") == {"data": "pyagrum"}
    assert results["converted"].pop("input_format") == {"data": "jaxctbn"}
    assert results["given"] == results["converted"]


def test_fit_and_moments_read_peer_networks(tmp_path, capsys):
    """`fit --format pyctbn` (data and network from one PyCTBN file) and `moments` on a
    causal-hub network: the numbers of the converted files', the formats in `input_format`."""
    data, net = tmp_path / "data.csv", tmp_path / "net.json"
    assert run(capsys, "convert", "--to", "jaxctbn", "--network-out", net, PYCTBN, data)[0] == 0
    fits = {}
    for name, argv in {
        "peer": ["--format", "pyctbn", "--data", PYCTBN, "--network", PYCTBN],
        "converted": ["--data", data, "--network", net],
    }.items():
        out = tmp_path / f"fit_{name}.json"
        assert run(capsys, "fit", *argv, "--out", out)[0] == 0
        fits[name] = json.loads(out.read_text())
    assert fits["peer"].pop("input_format") == {"data": "pyctbn", "network": "pyctbn"}
    assert fits["converted"].pop("input_format") == {"data": "jaxctbn", "network": "jaxctbn"}
    peer, converted = fits["peer"].pop("data"), fits["converted"].pop("data")
    assert peer["observations_sha256"] == converted["observations_sha256"]
    assert fits["peer"] == fits["converted"]
    assert run(capsys, "convert", "--to", "jaxctbn", EATING, net)[0] == 0
    moments = {}
    for name, path in (("peer", EATING), ("converted", net)):
        out = tmp_path / f"moments_{name}.json"
        argv = ["moments", "--network", path, "--duration", "1", "--initial-state"]
        assert run(capsys, *argv, "Eating=0,FullStomach=1,Hungry=0", "--out", out)[0] == 0
        moments[name] = json.loads(out.read_text())
    assert moments["peer"].pop("input_format") == {"network": "causal-hub"}
    assert moments["converted"].pop("input_format") == {"network": "jaxctbn"}
    assert moments["peer"] == moments["converted"]


# ------------------------------------------------------------------ bad inputs


@pytest.fixture
def bad(tmp_path, causal_hub_dir):
    """Files that convert or --format refuse, by name."""
    files = {"out": str(tmp_path / "out" / "x"), "causal_hub": str(causal_hub_dir)}
    texts = {
        "odd.csv": "a,b\n1,2\n",
        "bad_pyagrum.csv": "IdSample,time,var,state\n0,0,A,lo\nx,1.0,A,hi\n",
        "with_intervention.csv": "trajectory_id,time,A,B,intervention\n0,0,1,0,A=1\n0,1,1,1,A=1\n",
        "both.json": json.dumps(
            {
                "nodes": [{"name": "A", "cardinality": 2, "parents": []}],
                "cims": {"A": [{"parent_states": {}, "Q": [[-1, 1], [1, -1]]}]},
                "variables": [{"Name": "A", "Value": 2}],
                "samples": [[{"Time": 0, "A": 0}, {"Time": 1, "A": -1}]],
            }
        ),
    }
    for name, text in texts.items():
        (tmp_path / name).write_text(text)
        files[name.split(".")[0]] = str(tmp_path / name)
    for name, old, new in (
        ("bad_times", "0.11168808403525379,", "abc,"),
        ("bad_labels", ",yes,", ",maybe,"),
    ):
        frames = tmp_path / name
        shutil.copytree(causal_hub_dir, frames)
        path = frames / "causal_hub_trajectory_1.csv"
        lines = path.read_text().splitlines()
        lines[2] = lines[2].replace(old, new)
        path.write_text("\n".join(lines) + "\n")
        files[name] = str(frames)
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    files["full"] = str(full)
    (tmp_path / "out").mkdir()
    return files


@pytest.mark.parametrize(
    "argv, message",
    [
        ("convert --to nope {odd} {out}", "argument --to: invalid choice: 'nope'"),
        ("learn --format nope --data {odd} --out {out}", "argument --format: invalid choice"),
        ("convert --to jaxctbn {odd} {out}", "odd.csv': unknown format; a network is one of"),
        ("convert --to pyctbn {both} {out}", "both.json' is ambiguous: it reads as jaxctbn's"),
        ("convert --to jaxctbn {bad_pyagrum} {out}", "bad_pyagrum.csv': line 3: IdSample 'x'"),
        (
            "convert --to jaxctbn {bad_times} {out}",
            "causal_hub_trajectory_1.csv': row 1 (line 3): time 'abc' is not a number",
        ),
        (
            f"convert --to jaxctbn --network {EATING} {{bad_labels}} {{out}}",
            "causal_hub_trajectory_1.csv', column 'Eating' row 1: state 'maybe' is not one of "
            "'no', 'yes'",
        ),
        ("convert --from pyctbn --to jaxctbn {bad_pyagrum} {out}", "is pyAgrum's trajectories"),
        (f"convert --to pyagrum {EATING} {{out}}", "pyAgrum has no network file format"),
        (f"convert --to jaxctbn --network {PYAGRUM_NET} {EATING} {{out}}", "--network: only for"),
        ("convert --to jaxctbn --network-out {out}.json {odd} {out}", "unknown format"),
        (
            f"convert --to jaxctbn --network-out {{out}}.json {PYAGRUM_CSV} {{out}}",
            "--network-out: ",
        ),
        ("convert --to pyagrum {with_intervention} {out}", "recorded under an intervention"),
        ("convert --to jaxctbn {full} {out}", "full' holds no CSV file"),
        ("convert --to causal-hub {with_intervention} {full}", "OUT: directory"),
        (
            "learn --observation panel --format pyagrum --data {odd} --out {out}",
            "--format pyagrum: pyAgrum's trajectories are complete paths; panel data "
            "(--observation panel) is read from jaxctbn's CSV only",
        ),
        (
            "learn --observation panel --data {causal_hub} --out {out}",
            "is causal-hub's trajectory format (detected); panel data",
        ),
        (
            "fit --observation panel --format causal-hub --data {causal_hub} --network "
            f"{EATING} --out {{out}}",
            "panel data (--observation panel) is read from jaxctbn's CSV only",
        ),
        (
            "run pool --format pyctbn --data {odd} --observation panel --root A --out {out}",
            "--format pyctbn: PyCTBN's trajectories are complete paths; panel data",
        ),
        (
            f"sample --format pyagrum --network {PYAGRUM_NET} --trajectories 1 --duration 1 "
            "--seed 0 --out {out}",
            "--network: pyAgrum has no network file format",
        ),  # fmt: skip
    ],
)
def test_bad_inputs_are_one_line(argv, message, bad, capsys):
    args = [a.format(**bad) for a in argv.split()]
    before = sorted(os.listdir(bad["full"]))
    code, out, err = run(capsys, *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("jaxctbn: error: "), err
    assert message in lines[0], lines[0]
    assert out == "" and os.listdir(os.path.dirname(bad["out"])) == []
    assert sorted(os.listdir(bad["full"])) == before
