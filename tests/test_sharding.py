"""Issue 14, sharding: `Sharded` batching (repetitions and candidates across devices), `jaxctbn
run --shard` and `--distributed`. Several devices on a CPU need
`--xla_force_host_platform_device_count`, which JAX reads when it starts, so the multi-device
runs are small scripts in subprocesses; their results are compared with this (one-device)
process's."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

import jaxctbn as jc
from jaxctbn._cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout

# the small problem of every script here (2 binary nodes, A -> B)
SETUP = """
import jax, jax.numpy as jnp, numpy as np, equinox as eqx
jax.config.update("jax_enable_x64", True)
import jaxctbn as jc

truth = jc.CTBN(
    cims=[
        jnp.array([[[-1.0, 1.0], [2.0, -2.0]]]),
        jnp.array([[[-0.5, 0.5], [1.0, -1.0]], [[-2.0, 2.0], [0.3, -0.3]]]),
    ],
    parents={"A": [], "B": ["A"]},
    names=("A", "B"),
)
task = jc.ParameterLearningTask(truth)
keys = jax.random.split(jax.random.key(3), 5)  # 5 repetitions on 8 devices: padded


def flaky(posterior, candidates, initial_state, horizon, key):
    # fails in some design steps, depending on the key only
    scores = jnp.zeros(candidates.targets.shape[0])
    return eqx.error_if(scores, jax.random.uniform(key) < 0.3, "flaky design: failed")
"""
namespace: dict = {}
exec(SETUP, namespace)  # the same problem in this process


def _env(devices: int) -> dict:
    flags = os.environ.get("XLA_FLAGS", "")
    flags += f" --xla_force_host_platform_device_count={devices}"
    return dict(os.environ, XLA_FLAGS=flags.strip(), PYTHONPATH=ROOT)


def _script(tmp_path, body: str, devices: int = 8, extra_flags: str = "", timeout=120):
    path = tmp_path / "script.py"
    path.write_text(SETUP + textwrap.dedent(body))
    env = _env(devices)
    env["XLA_FLAGS"] += extra_flags
    return subprocess.run(
        [sys.executable, str(path)],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=timeout,
    )


@pytest.mark.usefixtures("no_runtime_typecheck")
def test_sharded_checks_its_arguments():
    with pytest.raises(ValueError, match="Sharded: mesh must be a jax.sharding.Mesh or None"):
        jc.Sharded(mesh="devices")  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match=r"Sharded: inner must be Vmap\(\) or Chunked\(size\)"):
        jc.Sharded(inner=jc.Sharded())
    with pytest.raises(ValueError, match=r"Sharded: inner must be Vmap\(\) or Chunked\(size\)"):
        jc.Sharded(inner="vmap")  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match=r"batching: expected Vmap\(\), Chunked\(size\) or"):
        jc.run_repetitions(
            namespace["task"],
            jc.PassiveDesign(),
            namespace["keys"],
            num_experiments=1,
            batching="vmap",  # pyright: ignore[reportArgumentType]
        )


def test_sharded_map_on_one_device_equals_vmap(getkey):
    c = jax.random.normal(getkey(), (3,))

    def fn(x):
        y = jnp.sin(x["a"] * c) + x["b"]
        return eqx.error_if(y, x["b"] > 100.0, "member too large")

    xs = {"a": jax.random.normal(getkey(), (5,)), "b": jnp.arange(5.0)}
    expected = jax.vmap(fn)(xs)
    for batching in (jc.Sharded(), jc.Sharded(inner=jc.Chunked(2))):
        np.testing.assert_allclose(batching.map(fn, xs), expected, rtol=1e-15)  # from the host
        inside = jax.jit(lambda xs, batching=batching: batching.map(fn, xs))(xs)
        np.testing.assert_allclose(inside, expected, rtol=1e-15)
    assert jc.Sharded().chunk_size(5) == 5 and jc.Sharded(inner=jc.Chunked(2)).chunk_size(5) == 2
    bad = {"a": xs["a"], "b": xs["b"].at[3].set(1e3)}
    with pytest.raises(eqx.EquinoxRuntimeError, match="member too large"):
        jc.Sharded().map(fn, bad)
    # a criterion's candidates
    post = namespace["task"].initial_posterior()
    space = jc.intervention_space((2, 2))
    init, key = jnp.array([0, 1]), getkey()
    scores = [
        jc.score_interventions(post, space, init, 2.0, key=key, num_samples=3, batching=b)
        for b in (jc.Vmap(), jc.Sharded())
    ]
    np.testing.assert_allclose(scores[1], scores[0], rtol=1e-12, atol=1e-14)


def test_eight_devices_give_the_one_device_results(tmp_path):
    """Repetitions and a criterion's candidates sharded over 8 devices: the numbers of one
    vmap on one device (this process), with padding (5 repetitions, 9 candidates)."""
    proc = _script(
        tmp_path,
        """
        assert jax.device_count() == 8
        result = jc.run_repetitions(
            task, jc.RandomDesign(), keys, num_experiments=2, batching=jc.Sharded()
        )
        post = task.initial_posterior()
        space = jc.intervention_space((2, 2))
        scores = jc.score_interventions(
            post, space, jnp.array([0, 1]), 2.0, key=jax.random.key(0), num_samples=3,
            batching=jc.Sharded(),
        )
        np.savez(
            "out.npz", mse=result.metrics["mse"], index=result.intervention_index,
            events=result.num_events, scores=scores,
        )
        """,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = np.load(tmp_path / "out.npz")
    task, keys = namespace["task"], namespace["keys"]
    result = jc.run_repetitions(task, jc.RandomDesign(), keys, num_experiments=2)
    np.testing.assert_allclose(out["mse"], result.metrics["mse"], rtol=1e-12)
    np.testing.assert_array_equal(out["index"], result.intervention_index)
    np.testing.assert_array_equal(out["events"], result.num_events)
    space = jc.intervention_space((2, 2))
    scores = jc.score_interventions(
        task.initial_posterior(),
        space,
        jnp.array([0, 1]),
        2.0,
        key=jax.random.key(0),
        num_samples=3,
    )
    np.testing.assert_allclose(out["scores"], scores, rtol=1e-12, atol=1e-14)


def test_a_failing_repetition_raises_on_eight_devices(tmp_path):
    """A check that fails in one shard raises (throw=True) or is reported for its repetitions
    only (throw=False), exactly as on one device."""
    proc = _script(
        tmp_path,
        """
        design = jc.CallableDesign(flaky)
        try:
            jc.run_repetitions(task, design, keys, num_experiments=2, batching=jc.Sharded())
        except (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError) as error:
            assert "flaky design: failed" in str(error)
            print("raised")
        result, status = jc.run_repetitions(
            task, design, keys, num_experiments=2, throw=False, batching=jc.Sharded()
        )
        np.savez("out.npz", ok=status.ok, mse=result.metrics["mse"])
        print("messages", sorted(set(status.messages)))
        """,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "raised" in proc.stdout
    assert "messages ['', 'flaky design: failed']" in proc.stdout
    out = np.load(tmp_path / "out.npz")
    design = jc.CallableDesign(namespace["flaky"])
    task, keys = namespace["task"], namespace["keys"]
    result, status = jc.run_repetitions(task, design, keys, num_experiments=2, throw=False)
    assert status.ok.any() and not status.ok.all(), "choose keys with both outcomes"
    np.testing.assert_array_equal(out["ok"], status.ok)
    np.testing.assert_allclose(out["mse"], result.metrics["mse"], rtol=1e-12)  # NaN where failed


def test_a_failing_check_inside_a_larger_sharded_program_stops_the_process(tmp_path):
    """The documented limit: inside a larger compiled program, a device that stops at a failing
    check leaves the others waiting at the next collective, and XLA ends the process (here
    after 2 s) instead of raising. Never silently: the result is not returned."""
    proc = _script(
        tmp_path,
        """
        def one(i):
            return eqx.error_if(i * 1.0, i == 5, "member 5 failed")

        best = jax.jit(lambda xs: jnp.argmax(jc.Sharded().map(one, xs)))(jnp.arange(16))
        best = int(best)
        print("returned", best)
        """,
        extra_flags=" --xla_cpu_collective_call_terminate_timeout_seconds=2",
        timeout=60,
    )
    assert proc.returncode != 0 and "returned" not in proc.stdout


def _network(tmp_path):
    path = tmp_path / "net.json"
    namespace["truth"].to_json(path)
    return path


RUN = ["run", "parameters", "--designs", "passive,random", "--repetitions", "3"]
RUN += ["--experiments", "2", "--samples", "2", "--no-progress"]


def _same_results(a, b):
    ra, rb = (
        json.loads((a / "results.json").read_text()),
        json.loads((b / "results.json").read_text()),
    )
    assert ra["designs"] == rb["designs"] and ra["settings"] == rb["settings"]
    pd.testing.assert_frame_equal(pd.read_csv(a / "metrics.csv"), pd.read_csv(b / "metrics.csv"))


def test_run_shard_on_eight_devices(tmp_path):
    """`jaxctbn run --shard` over 8 devices gives the results of a run without it (this
    process), and reuses the chunks that run wrote (`--shard` is not a setting)."""
    net = _network(tmp_path)
    args = [*RUN, "--network", str(net), "--chunk", "3"]
    plain, sharded = tmp_path / "plain", tmp_path / "sharded"
    assert main([*args, "--out", str(plain)]) == 0
    command = [sys.executable, "-m", "jaxctbn._cli", *args, "--shard"]
    proc = subprocess.run(
        [*command, "--out", str(sharded)], env=_env(8), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    _same_results(plain, sharded)
    for out, devices in ((plain, 1), (sharded, 8)):  # the devices the chunks were split across
        timing = json.loads((out / "results.json").read_text())["timing"]
        assert all(t["devices"] == devices for t in timing.values())
    proc = subprocess.run(
        [*command, "--out", str(plain)], env=_env(8), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    timing = json.loads((plain / "results.json").read_text())["timing"]
    assert all(t["repetitions_computed"] == 0 for t in timing.values())  # all reused


def test_run_cpu_devices(tmp_path, capsys):
    """`jaxctbn run --shard --cpu-devices 2` makes a CPU-only process two devices (no XLA
    flag), splits the chunks across them and gives the results of a one-device run; the flag
    is refused without `--shard` and where JAX has started with another number of devices."""
    net = _network(tmp_path)
    args = [*RUN, "--network", str(net), "--chunk", "3"]
    plain, split = tmp_path / "plain", tmp_path / "split"
    assert main([*args, "--out", str(plain)]) == 0
    proc = subprocess.run(
        [sys.executable, "-m", "jaxctbn._cli", *args, "--out", str(split)]
        + ["--shard", "--cpu-devices", "2"],
        env=dict(os.environ, PYTHONPATH=ROOT),  # the tests' XLA_FLAGS: no device count
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    _same_results(plain, split)
    timing = json.loads((split / "results.json").read_text())["timing"]
    assert all(t["devices"] == 2 for t in timing.values())
    capsys.readouterr()
    assert main([*args, "--out", str(tmp_path / "a"), "--cpu-devices", "2"]) == 2
    assert "--cpu-devices: only with --shard" in capsys.readouterr().err
    many = len(jax.devices("cpu")) + 1  # this process's backend has started already
    command = [*args, "--out", str(tmp_path / "b"), "--shard", "--cpu-devices", str(many)]
    assert main(command) == 2
    assert "--cpu-devices: JAX has already started" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_run_distributed_over_two_processes(tmp_path, capsys):
    """Two processes (`--distributed`, a coordinator on localhost) share the chunks of one
    output directory; process 0 writes the results of a one-process run."""
    net = _network(tmp_path)
    args = [*RUN, "--network", str(net), "--chunk", "1"]
    single, shared = tmp_path / "single", tmp_path / "shared"
    address = f"localhost:{_free_port()}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "jaxctbn._cli", *args, "--out", str(shared), "--distributed"]
            + ["--coordinator", address, "--num-processes", "2", "--process-id", str(i)],
            env=_env(1),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    assert main([*args, "--out", str(single)]) == 0  # meanwhile, in this process
    outputs = [p.communicate(timeout=120) for p in procs]
    for p, (_, stderr) in zip(procs, outputs):
        assert p.returncode == 0, stderr[-3000:]
    assert "process 1: wrote its chunks" in outputs[1][0]
    _same_results(single, shared)
    timing = json.loads((shared / "results.json").read_text())["timing"]
    assert sum(t["repetitions_computed"] for t in timing.values()) == 6  # each chunk once
    assert sorted(os.listdir(shared / "processes")) == ["0.done", "1.done"]
    capsys.readouterr()
    for extra, message in [
        (["--distributed"], "--distributed: needs --out"),
        (["--coordinator", address, "--out", str(tmp_path / "o")], "--coordinator: only with"),
        (
            ["--distributed", "--num-processes", "2", "--process-id", "2"]
            + ["--out", str(tmp_path / "o")],
            "--process-id: must be below --num-processes (2), got 2.",
        ),
    ]:
        assert main([*args, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


STRUCTURE = """
def structure_problem():
    # 3 binary nodes, a posterior over parent sets learnt from 3 sampled paths, 10 candidates
    chain = jc.CTBN(
        cims=[
            jnp.array([[[-1.0, 1.0], [2.0, -2.0]]]),
            jnp.array([[[-0.5, 0.5], [1.0, -1.0]], [[-2.0, 2.0], [0.3, -0.3]]]),
            jnp.array([[[-0.2, 0.2], [1.5, -1.5]], [[-3.0, 3.0], [0.5, -0.5]]]),
        ],
        parents={"A": [], "B": ["A"], "C": ["B"]},
        names=("A", "B", "C"),
    )
    paths = jc.sample_trajectories(
        chain, jnp.zeros(3, jnp.int32), 2.0, key=jax.random.key(1), num_trajectories=3
    )
    post = jc.learn_structure(paths, chain.names, (2, 2, 2), max_parents=2)
    space = jc.intervention_space((2, 2, 2))
    space = jax.tree_util.tree_map(lambda x: x[jnp.arange(0, 27, 3)], space)
    return post, space


def structure_scores(batching):
    post, space = structure_problem()
    init, key = jnp.array([0, 1, 0]), jax.random.key(2)
    # the paper's stratified VBHC (plug-in solves) and the EIG (sampled paths)
    vbhc = jc.score_interventions(post, space, init, 2.0, key=key, num_samples=3, batching=batching)
    eig = jc.score_interventions(
        post, space, init, 2.0, key=key, num_samples=3, criterion=jc.EIG(num_paths=2),
        batching=None if batching is None else jc.Sharded(inner=jc.Chunked(2)),
    )
    return vbhc, eig
"""
exec(STRUCTURE, namespace)


def test_structure_candidates_sharded_on_eight_devices(tmp_path):
    """The structure criteria's chunks of candidates (stratified draws, each node's chunks that
    clamp it skipped) are split across 8 devices, with the numbers of one device."""
    proc = _script(
        tmp_path,
        STRUCTURE
        + textwrap.dedent(
            """
        assert jax.device_count() == 8
        vbhc, eig = structure_scores(jc.Sharded())
        post, space = structure_problem()
        lowered = jax.jit(
            lambda p: jc.score_interventions(
                p, space, jnp.array([0, 1, 0]), 2.0, key=jax.random.key(2), num_samples=3,
                batching=jc.Sharded(),
            )
        ).lower(post).as_text()
        np.savez("out.npz", vbhc=vbhc, eig=eig)
        print("manual computations", lowered.count("manual_computation"))
        """
        ),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "manual computations 0" not in proc.stdout  # split across the devices
    out = np.load(tmp_path / "out.npz")
    vbhc, eig = namespace["structure_scores"](None)
    assert np.ptp(np.asarray(vbhc)) > 1e-3 and np.ptp(np.asarray(eig)) > 1e-3  # not trivial
    np.testing.assert_allclose(out["vbhc"], vbhc, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out["eig"], eig, rtol=1e-12, atol=1e-14)
