"""Issue 14, sharding: `Sharded` batching (repetitions and candidates across devices), `jaxctbn
run --shard`, `--cpu-devices` and `--distributed`.

The test workers have 8 CPU devices (tests/conftest.py), so the multi-device computations run
in this process and are compared with one device's, in this process too. Subprocesses remain
where a fresh process is the point: `--cpu-devices` (it sets the devices before JAX starts),
`--distributed` (two processes) and a failing check that ends the process.

The problems are those of the other tests of the loop and the command line (the 2-node network
of `helpers.network_dict`, 3 repetitions of 2 experiments, 9 candidates), so that the one-device
programs are compiled once for all of them."""

import json
import os
import shutil
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
from helpers import flaky_design_scores, network_dict, repetition_keys, structure_design_problem

import jaxctbn as jc
from jaxctbn._cli import main
from jaxctbn._model.interventions import design_space

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout

TRUTH = jc.CTBN.from_dict(network_dict())  # A -> B, binary
TASK = jc.ParameterLearningTask(TRUTH)
KEYS = repetition_keys(0, 3)  # `jaxctbn run --seed 0`'s keys: 3 repetitions, padded to 8 devices
SPACE = design_space((2, 2))  # the candidates `jaxctbn run` passes (all 9)
ONE_DEVICE = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("members",))


@pytest.fixture(scope="module", autouse=True)
def _shardy():
    """The partitioner users get by default (Shardy), here and in this module's subprocesses;
    conftest.py lowers the rest of the suite with GSPMD, which compiles faster. The setting is
    part of JAX's compilation key, so no program is shared across the switch."""
    previous = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", True)
    env = pytest.MonkeyPatch()
    env.setenv("JAX_USE_SHARDY_PARTITIONER", "1")
    yield
    env.undo()
    jax.config.update("jax_use_shardy_partitioner", previous)


def test_eight_devices():
    assert jc.Sharded().num_devices == 8, "tests/conftest.py gives every worker 8 CPU devices"
    assert jc.Sharded(mesh=ONE_DEVICE).num_devices == 1


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
            TASK,
            jc.PassiveDesign(),
            KEYS,
            num_experiments=1,
            batching="vmap",  # pyright: ignore[reportArgumentType]
        )


def test_sharded_map_equals_vmap_on_one_and_eight_devices(getkey):
    """`Sharded.map` (from the host and inside `jit`, with `Vmap` or `Chunked` per device) gives
    `jax.vmap`'s numbers on one device and on eight (5 members: padded to 8); a failing check in
    one member raises from the host on both."""
    c = jax.random.normal(getkey(), (3,))

    def fn(x):
        y = jnp.sin(x["a"] * c) + x["b"]
        return eqx.error_if(y, x["b"] > 100.0, "member too large")

    xs = {"a": jax.random.normal(getkey(), (5,)), "b": jnp.arange(5.0)}
    bad = {"a": xs["a"], "b": xs["b"].at[3].set(1e3)}
    expected = jax.vmap(fn)(xs)
    for mesh, sizes in ((ONE_DEVICE, (5, 2)), (None, (1, 1))):  # chunks of one device's share
        for batching, size in zip(
            (jc.Sharded(mesh=mesh), jc.Sharded(mesh=mesh, inner=jc.Chunked(2))), sizes
        ):
            np.testing.assert_allclose(batching.map(fn, xs), expected, rtol=1e-15)  # from the host
            inside = jax.jit(lambda xs, batching=batching: batching.map(fn, xs))(xs)
            np.testing.assert_allclose(inside, expected, rtol=1e-15)
            assert batching.chunk_size(5) == size
        with pytest.raises(
            (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError), match="member too large"
        ):
            jc.Sharded(mesh=mesh).map(fn, bad)


def test_eight_devices_give_the_one_device_results():
    """Repetitions and a criterion's candidates sharded over 8 devices: the numbers of one
    vmap on one device, with padding (3 repetitions, 9 candidates)."""
    one = jc.run_repetitions(TASK, jc.RandomDesign(), KEYS, num_experiments=2, candidates=SPACE)
    eight = jc.run_repetitions(
        TASK, jc.RandomDesign(), KEYS, num_experiments=2, candidates=SPACE, batching=jc.Sharded()
    )
    for name in one.metrics:
        np.testing.assert_allclose(eight.metrics[name], one.metrics[name], rtol=1e-12)
    for field in ("intervention_index", "targets", "states", "initial_states", "num_events"):
        np.testing.assert_array_equal(getattr(eight, field), getattr(one, field))
    assert len(set(np.asarray(one.intervention_index).ravel().tolist())) > 1  # not trivial
    # the criterion's 9 candidates (the posterior after one repetition's data)
    post = jax.tree_util.tree_map(lambda x: x[0], one.posterior)
    space = jc.intervention_space((2, 2))
    init, key = jnp.array([0, 1], jnp.int32), jax.random.key(0)
    scores = [
        jc.score_interventions(post, space, init, 3.0, key=key, num_samples=3, batching=b)
        for b in (None, jc.Sharded())
    ]
    assert np.ptp(np.asarray(scores[0])) > 1e-3
    np.testing.assert_allclose(scores[1], scores[0], rtol=1e-12, atol=1e-14)


@pytest.mark.slow
def test_structure_candidates_sharded_on_eight_devices():
    """The structure criteria's chunks of candidates (stratified draws, each node's chunks that
    clamp it skipped; the EIG's sampled paths) are split across 8 devices, with the numbers of
    one device. (The one-device calls are those of `jaxctbn design --target structure` in
    tests/cli/test_cli.py.)"""
    chain, paths = structure_design_problem()
    post = jc.learn_structure(paths, chain.names, (2, 2, 2), max_parents=2)
    space = jc.intervention_space((2, 2, 2))  # 27 candidates: padded to 32
    init, key = jnp.array([0, 1, 0], jnp.int32), jax.random.key(2)
    for criterion, inner in (
        (jc.VBHC(), jc.Vmap()),  # the paper's stratified VBHC (plug-in solves)
        (jc.EIG(num_paths=2), jc.Chunked(2)),  # sampled paths, each device in chunks
    ):
        one, eight = (
            jc.score_interventions(
                post, space, init, 2.0, key=key, num_samples=3, criterion=criterion, batching=b
            )
            for b in (None, jc.Sharded(inner=inner))
        )
        assert np.ptp(np.asarray(one)) > 1e-3  # not trivial
        assert len(eight.sharding.device_set) == 8  # computed on the 8 devices
        np.testing.assert_allclose(eight, one, rtol=1e-12, atol=1e-14)


def test_a_failing_repetition_raises_on_eight_devices():
    """A check that fails in one shard raises (throw=True) or is reported for its repetitions
    only (throw=False), exactly as on one device."""
    design = jc.CallableDesign(flaky_design_scores)
    with pytest.raises(
        (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError), match="flaky design: failed"
    ):
        jc.run_repetitions(
            TASK, design, KEYS, num_experiments=2, candidates=SPACE, batching=jc.Sharded()
        )
    runs = [
        jc.run_repetitions(
            TASK, design, KEYS, num_experiments=2, candidates=SPACE, throw=False, batching=b
        )
        for b in (None, jc.Sharded())
    ]
    (one, status_one), (eight, status_eight) = runs
    assert status_one.ok.any() and not status_one.ok.all(), "choose keys with both outcomes"
    np.testing.assert_array_equal(status_eight.ok, status_one.ok)
    assert status_eight.messages == status_one.messages
    assert sorted(set(status_eight.messages)) == ["", "flaky design: failed"]
    np.testing.assert_allclose(eight.metrics["mse"], one.metrics["mse"], rtol=1e-12)  # NaN: failed


def test_a_failing_check_inside_a_larger_sharded_program_stops_the_process(tmp_path):
    """The documented limit: inside a larger compiled program, a device that stops at a failing
    check leaves the others waiting at the next collective, and XLA ends the process (here
    after 1 + 2 s: warned as stuck, then terminated) instead of raising. Never silently: the
    result is not returned. (A subprocess: the process ends.)"""
    script = textwrap.dedent(
        """
        import equinox as eqx, jax, jax.numpy as jnp
        import jaxctbn as jc

        assert jax.device_count() == 8

        def one(i):
            return eqx.error_if(i * 1.0, i == 5, "member 5 failed")

        best = jax.jit(lambda xs: jnp.argmax(jc.Sharded().map(one, xs)))(jnp.arange(16))
        best = int(best)
        print("returned", best)
        """
    )
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    flags += " --xla_cpu_collective_call_warn_stuck_timeout_seconds=1"
    flags += " --xla_cpu_collective_call_terminate_timeout_seconds=2"
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=dict(os.environ, XLA_FLAGS=flags.strip(), PYTHONPATH=ROOT),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode != 0 and "returned" not in proc.stdout, proc.stderr[-3000:]
    assert "member 5 failed" in proc.stderr  # the check failed on its device, then XLA ended it


# `jaxctbn run`: the shared small run (the other CLI and loop tests compile the same programs)
RUN = ["run", "parameters", "--designs", "passive,random", "--repetitions", "3"]
RUN += ["--experiments", "2", "--samples", "3", "--chunk", "3", "--no-progress"]


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    """The network file, the arguments, and a one-device run of them (in this process)."""
    root = tmp_path_factory.mktemp("run")
    net = root / "net.json"
    net.write_text(json.dumps(network_dict()))
    args = [*RUN, "--network", str(net)]
    assert main([*args, "--out", str(root / "plain")]) == 0
    return args, root / "plain"


def _same_results(a, b):
    ra, rb = (
        json.loads((a / "results.json").read_text()),
        json.loads((b / "results.json").read_text()),
    )
    assert ra["designs"] == rb["designs"] and ra["settings"] == rb["settings"]
    pd.testing.assert_frame_equal(pd.read_csv(a / "metrics.csv"), pd.read_csv(b / "metrics.csv"))


def _timing(out):
    return json.loads((out / "results.json").read_text())["timing"].values()


def test_run_shard_on_eight_devices(plain_run, tmp_path):
    """`jaxctbn run --shard` over this process's 8 devices gives the results of a run without
    it, and reuses the chunks that run wrote (`--shard` is not a setting)."""
    args, plain = plain_run
    sharded = tmp_path / "sharded"
    assert main([*args, "--shard", "--out", str(sharded)]) == 0
    _same_results(plain, sharded)
    assert all(t["devices"] == 1 for t in _timing(plain))  # the devices chunks were split across
    assert all(t["devices"] == 8 for t in _timing(sharded))
    again = tmp_path / "again"
    shutil.copytree(plain, again)
    assert main([*args, "--shard", "--out", str(again)]) == 0
    assert all(t["repetitions_computed"] == 0 for t in _timing(again))  # all reused
    _same_results(plain, again)


def test_run_cpu_devices(plain_run, tmp_path, capsys):
    """`jaxctbn run --shard --cpu-devices 8` makes a fresh CPU-only process (JAX's default: one
    device, no XLA flag) eight devices, splits the chunks across them and gives the results of
    a one-device run (the programs of --shard above, from the persistent compilation cache);
    the flag is refused without `--shard` and where JAX has started with another number of
    devices."""
    args, plain = plain_run
    split = tmp_path / "split"
    proc = subprocess.run(
        [sys.executable, "-m", "jaxctbn._cli", *args, "--out", str(split)]
        + ["--shard", "--cpu-devices", "8"],
        env=dict(os.environ, PYTHONPATH=ROOT),  # the tests' XLA_FLAGS: no device count
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    _same_results(plain, split)
    assert all(t["devices"] == 8 for t in _timing(split))
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


def test_run_distributed_over_two_processes(plain_run, tmp_path, capsys):
    """Two processes (`--distributed`, a coordinator on localhost) share the chunks of one
    output directory (one design's chunk each); process 0 writes the results of a
    one-process run."""
    args, single = plain_run
    shared = tmp_path / "shared"
    address = f"localhost:{_free_port()}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "jaxctbn._cli", *args, "--out", str(shared), "--distributed"]
            + ["--coordinator", address, "--num-processes", "2", "--process-id", str(i)],
            env=dict(os.environ, PYTHONPATH=ROOT),  # one CPU device each
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (_, stderr) in zip(procs, outputs):
        assert p.returncode == 0, stderr[-3000:]
    assert "process 1: wrote its chunks" in outputs[1][0]
    _same_results(single, shared)
    timing = json.loads((shared / "results.json").read_text())["timing"]
    assert sum(t["repetitions_computed"] for t in timing.values()) == 6  # each chunk once
    assert all(t["devices"] == 2 for t in timing.values())  # summed over the processes
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
        # issue 35: a raw IndexError; a silent wait of minutes, then a C++ abort; 6 GB
        (
            ["--distributed", "--coordinator", "abc", "--out", str(tmp_path / "o")],
            "--coordinator: expected HOST:PORT",
        ),
        (
            ["--distributed", "--coordinator", "no-such-host.invalid:1234"]
            + ["--num-processes", "2", "--process-id", "1", "--out", str(tmp_path / "o")],
            "--coordinator: cannot resolve the host 'no-such-host.invalid'.",
        ),
        (
            ["--distributed", "--coordinator", f"localhost:{_free_port()}"]
            + ["--num-processes", "2", "--process-id", "1", "--distributed-timeout", "1"]
            + ["--out", str(tmp_path / "o")],
            "within 1 s (--distributed-timeout)",
        ),
        (
            ["--shard", "--cpu-devices", "100000", "--out", str(tmp_path / "o")],
            "--cpu-devices: at most",
        ),
    ]:
        assert main([*args, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
