"""Issue 10 for `sample` and `run`: buffers sized from the rates and capped, no NaN metrics, and
run directories that survive damaged chunks and refuse to mix settings."""

import json
import shutil
import zipfile

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxctbn as jc
from jaxctbn._active_learning.metrics import auroc
from jaxctbn._cli import main


def _network(tmp_path, rate, nodes=2, name="net.json"):
    flip = [[-rate, rate], [rate, -rate]]
    cims = [jnp.array([flip])]
    parents = {"A": []}
    if nodes == 2:
        cims.append(jnp.array([flip, flip]))
        parents["B"] = ["A"]
    model = jc.CTBN(cims=cims, parents=parents, names=tuple(parents))
    path = tmp_path / name
    model.to_json(path)
    return model, path


def _error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_sample_refuses_before_sampling_when_the_cap_is_too_small(tmp_path, capsys):
    _, fast = _network(tmp_path, 1e12)
    _, slow = _network(tmp_path, 1.0, name="slow.json")
    base = ["sample", "--trajectories", "2", "--seed", "0", "--out", str(tmp_path / "o.csv")]
    assert main([*base, "--network", str(fast), "--duration", "1"]) == 2
    line = _error_line(capsys)
    assert "--max-events: a path of duration 1 is expected to have up to ~2e+12 events" in line
    assert "raise --max-events or shorten the duration" in line
    assert main([*base, "--network", str(slow), "--duration", "1e6"]) == 2
    assert "duration 1e+06 is expected to have up to ~2e+06 events" in _error_line(capsys)
    assert main([*base, "--network", str(slow), "--duration", "1", "--max-events", "0"]) == 2
    assert "argument --max-events: must be an integer >= 1" in _error_line(capsys)
    assert not (tmp_path / "o.csv").exists()


def test_structure_needs_two_nodes_and_defined_metrics(tmp_path, capsys):
    one, one_path = _network(tmp_path, 1.0, nodes=1)
    with pytest.raises(ValueError, match="truth: structure learning needs at least 2 nodes"):
        jc.StructureLearningTask(one, max_parents=0)
    with pytest.raises(ValueError, match="truth: structure learning needs at least 2 nodes"):
        jc.experiments.ExperimentConfig(target="structure", truth=one)
    empty = jc.CTBN(cims=[jnp.array([[[-1.0, 1.0], [1.0, -1.0]]])] * 2, parents=[[], []])
    with pytest.raises(ValueError, match="at least one edge and one absent edge; this one has no"):
        jc.StructureLearningTask(empty, max_parents=1)
    run = ["run", "structure", "--network", str(one_path), "--out", str(tmp_path / "r")]
    assert main([*run, "--no-progress"]) == 2
    assert "truth: structure learning needs at least 2 nodes" in _error_line(capsys)
    # the metrics: an error, never a silent NaN
    probs = jnp.full((2, 2), 0.5)
    with pytest.raises(ValueError, match="1-node graph has no candidate edges"):
        jc.experiments.edge_auroc(jnp.zeros((1, 1)), jnp.zeros((1, 1), int))
    with pytest.raises(ValueError, match="edge AUPR needs a true graph with at least one edge"):
        jc.experiments.edge_aupr(probs, jnp.zeros((2, 2), int))
    with pytest.raises(ValueError, match="edge AUROC needs"):
        jc.experiments.edge_auroc(probs, jnp.ones((2, 2), int))
    with pytest.raises(ValueError, match="scores: empty"):
        auroc(jnp.zeros(0), jnp.zeros(0))
    traced = eqx.filter_jit(jc.experiments.edge_auroc)
    with pytest.raises(eqx.EquinoxRuntimeError, match="edge AUROC needs a true graph"):
        traced(probs, jnp.zeros((2, 2), int)).block_until_ready()
    np.testing.assert_allclose(traced(probs, jnp.array([[0, 1], [0, 0]])), 0.5)


def test_run_paths_and_max_events_are_checked(tmp_path, capsys):
    _, path = _network(tmp_path, 1.0)
    run = ["run", "parameters", "--network", str(path), "--out", str(tmp_path / "r")]
    assert main([*run, "--designs", "eig", "--paths", "0", "--no-progress"]) == 2
    assert "argument --paths: must be an integer >= 1, got '0'" in _error_line(capsys)
    assert main([*run, "--max-events", "0", "--no-progress"]) == 2
    assert "argument --max-events: must be an integer >= 1, got '0'" in _error_line(capsys)
    truth = jc.CTBN.from_json(path)
    with pytest.raises(ValueError, match="paths: must be a positive integer, got 0"):
        jc.experiments.ExperimentConfig(target="parameters", truth=truth, designs=("eig",), paths=0)
    with pytest.raises(ValueError, match="max_events: must be a positive integer, got 0"):
        jc.experiments.ExperimentConfig(target="parameters", truth=truth, max_events=0)
    task = jc.ParameterLearningTask(jc.CTBN.from_json(path))

    @jax.jit
    def traced(cims):
        truth = eqx.tree_at(lambda m: m.cims, task.truth, cims)
        return jc.run_active_learning(
            jc.ParameterLearningTask(truth),
            jc.PassiveDesign(),
            key=jax.random.key(0),
            num_experiments=1,
        )

    with pytest.raises(ValueError, match="max_events: cannot size the event buffer"):
        traced(task.truth.cims)


def _read(out):
    results = json.loads((out / "results.json").read_text())
    return (out / "metrics.csv").read_bytes(), results["designs"], results["failed_repetitions"]


def test_fast_run_sized_from_the_rates_and_a_robust_directory(tmp_path, capsys):
    """Rates 100/s over tau = 3 (~600 jumps) overflowed the old fixed buffer of 512. Then the
    directory: kill-and-resume, damaged chunks and changed settings."""
    _, path = _network(tmp_path, 100.0)
    out = tmp_path / "run"
    args = ["run", "parameters", "--network", str(path), "--designs", "passive", "--samples", "2"]
    args += ["--repetitions", "2", "--experiments", "1", "--chunk", "1", "--horizon", "3"]
    args += ["--out", str(out), "--no-progress"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # no failed repetition
    config = json.loads((out / "config.json").read_text())
    assert config["max_events"] == 1024
    chunk0, chunk1 = (out / "chunks" / "passive" / f"{r}-{r}.npz" for r in (0, 1))
    with np.load(chunk0) as z:
        assert int(z["num_events"].max()) > 512 and z["errors"].tolist() == [""]
    reference = _read(out)
    summary = (out / "summary.md").read_bytes()

    # kill-and-resume: a lost chunk and no summary yet, as after an interruption
    chunk1.unlink()
    (out / "summary.md").unlink()
    assert main(args) == 0
    assert capsys.readouterr().err == ""
    assert _read(out) == reference and (out / "summary.md").read_bytes() == summary

    # a truncated chunk file and one with a key removed: named on stderr, then recomputed
    chunk0.write_bytes(chunk0.read_bytes()[:300])
    with np.load(chunk1) as z:
        kept = {k: z[k] for k in z.files if k != "num_events"}
    with open(chunk1, "wb") as f:
        np.savez(f, **kept)
    assert main(args) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert f"chunk file {chunk0} is damaged (BadZipFile" in err[0]
    assert f"chunk file {chunk1} is damaged (KeyError" in err[1] and "num_events" in err[1]
    assert all(e.endswith("recomputing it.") for e in err)
    assert _read(out) == reference and zipfile.is_zipfile(chunk0)

    # issue 35: one finite value edited by hand (the checksum kept) was reused silently
    with np.load(chunk1) as z:
        edited = {k: z[k] for k in z.files}
    assert "checksum" in edited
    edited["metric_mse"] = edited["metric_mse"] * 1.5
    with open(chunk1, "wb") as f:
        np.savez(f, **edited)
    assert main(args) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"chunk file {chunk1} is damaged (ValueError" in err[0], err
    assert "do not match the checksum" in err[0]
    assert _read(out) == reference

    # other settings into the same directory: refused, naming them; --overwrite replaces
    assert main([*args, "--seed", "1", "--samples", "3"]) == 2
    line = _error_line(capsys)
    assert "holds a run with other settings (samples 2 -> 3, seed 0 -> 1)" in line
    assert "--overwrite" in line
    assert json.loads((out / "config.json").read_text())["seed"] == 0
    assert (out / "summary.md").read_bytes() == summary
    assert main([*args, "--seed", "1", "--samples", "3", "--overwrite"]) == 0
    assert json.loads((out / "config.json").read_text())["seed"] == 1
    assert "N_S = 3, seed 1" in (out / "summary.md").read_text()
    assert capsys.readouterr().err == ""
    # chunks without a config.json are not trusted either
    (out / "config.json").unlink()
    assert main(args) == 2
    assert "holds chunk files but no config.json" in _error_line(capsys)
    shutil.rmtree(out)

    # a buffer set too small is an error naming it, not NaN repetitions
    assert main([*args, "--max-events", "64"]) == 2
    assert "max_events: a simulated path of passive had more than 64 jumps" in _error_line(capsys)


def test_chunk_contents_are_checked_and_failures_reported(tmp_path, capsys):
    from jaxctbn._experiments import outputs as _experiments

    layout = _experiments._chunk_layout("parameters", 2, 1, 2)
    dtypes = {"f": float, "iu": np.int32, "b": bool, "U": str}
    part = {k: np.zeros(shape, dtypes[kinds]) for k, (shape, kinds) in layout.items()}
    part["errors"] = np.array(["", "rates: negative"])
    part["metric_mse"][1] = np.nan  # a failed repetition: NaN rows
    path = tmp_path / "0-1.npz"
    with open(path, "wb") as f:
        np.savez(f, **part)
    loaded = _experiments._load_chunk(str(path), "parameters", 2, 1, 2)
    assert loaded is not None and capsys.readouterr().err == ""
    failures = {}
    _experiments._record_failures(failures, "vbhc", 4, loaded["errors"])
    assert failures == {"vbhc": [{"repetition": 5, "error": "rates: negative"}]}
    assert "vbhc repetition 5 failed: rates: negative" in capsys.readouterr().err
    settings = {"repetitions": 2, "experiments": 1, "horizon": 3.0, "samples": 2, "seed": 0}
    lines = _experiments.summary_table("parameters", {}, settings, failures)
    assert "**vbhc: 1 of 2 repetitions failed**" in lines[-1]
    # an edited chunk: NaN in a finished repetition, or a wrong shape
    part["metric_mse"][0] = np.nan
    with open(path, "wb") as f:
        np.savez(f, **part)
    assert _experiments._load_chunk(str(path), "parameters", 2, 1, 2) is None
    assert "is damaged (ValueError: metric_mse is not finite" in capsys.readouterr().err
    assert _experiments._load_chunk(str(path), "parameters", 3, 1, 2) is None
    assert "metric_mse has shape (2, 2)" in capsys.readouterr().err


def test_run_memory_is_bounded(tmp_path, capsys, monkeypatch):
    """Issue 61 item 4 for `run`: the loop's program is compiled first and XLA's account of its
    memory compared with the budget; over it the repetitions run a few at a time (the same
    numbers as all at once) with a warning, and one repetition over it is refused, by the
    library before it runs and by `run` before it writes anything."""
    from jaxctbn._active_learning import repetitions as loop
    from jaxctbn._learning.memory import compiled_bytes

    truth, path = _network(tmp_path, 1.0)
    task = jc.ParameterLearningTask(truth, prior=jc.GammaPrior(1.0, 1.0))
    design = jc.PassiveDesign()  # the smallest program to compile; the guard is the same
    keys = jax.random.split(jax.random.key(3), 4)
    settings = dict(num_experiments=1, horizon=1.0)
    shared = loop._repetition_settings(task, keys, **settings)
    fn = eqx.Partial(loop._one_repetition, task, design, *shared)
    whole = compiled_bytes(loop._map_batch.lower(jc.Vmap(), fn, keys).compile())
    assert whole > 0

    reference = jc.run_repetitions(task, design, keys, batching=jc.Vmap(), **settings)
    monkeypatch.setenv("JAXCTBN_MEMORY_BUDGET", str(whole - 1))
    with pytest.warns(RuntimeWarning, match=r"for all 4 repetitions at once.*running them \d"):
        chunked = jc.run_repetitions(task, design, keys, **settings)
    with pytest.warns(RuntimeWarning, match="running them"):
        planned = loop.batching_within_memory(task, design, keys, **settings)
    assert isinstance(planned, jc.Chunked) and planned.size < 4
    for a, b in zip(jax.tree_util.tree_leaves(reference), jax.tree_util.tree_leaves(chunked)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-12)

    monkeypatch.setenv("JAXCTBN_MEMORY_BUDGET", "1")
    with pytest.raises(ValueError, match="one repetition needs about .* num_samples"):
        jc.run_repetitions(task, design, keys, **settings)
    out = tmp_path / "run"
    args = ["run", "parameters", "--network", str(path), "--designs", "passive"]
    args += ["--repetitions", "2", "--experiments", "1", "--out", str(out), "--no-progress"]
    assert main(args) == 2
    line = _error_line(capsys)
    assert "one repetition needs about" in line and "--samples, --paths, --visits" in line
    assert not out.exists()
