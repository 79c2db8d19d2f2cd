"""The command line's contracts (flags, file schemas, output keys, one-line errors, exit codes),
in process (`main([...])`), with one end-to-end subprocess per kind of contract: an error raised
inside compiled code, the installed console script, and the compilation cache.

The design and run tests use the problems of the loop and sharding tests (the 2-node network of
`helpers.network_dict`, 3 repetitions of 2 experiments, 3 posterior draws; the structure problem
of `helpers.structure_design_problem`), so that their compiled programs are shared."""

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from helpers import (
    brute_force_generator,
    network_dict,
    one_hot_state,
    scipy_moments,
    structure_design_problem,
)

import jaxctbn as jc
from jaxctbn._cli.design import _box_hill_options
from jaxctbn._cli.main import build_parser, main
from jaxctbn._experiments.config import default_graph_draws
from jaxctbn._master_equation.automatic_solver import resolve_solver
from jaxctbn._model.interventions import design_space


def _chain(num_nodes: int, k: int, seed: int) -> jc.CTBN:
    """A chain X0 -> X1 -> ... of `k`-state nodes with random rates in [0.2, 2) (numpy)."""
    rng = np.random.default_rng(seed)
    cims = []
    for n in range(num_nodes):
        rates = rng.uniform(0.2, 2.0, (1 if n == 0 else k, k, k)) * (1 - np.eye(k))
        cims.append(jnp.asarray(rates - np.eye(k) * rates.sum(-1, keepdims=True)))
    return jc.CTBN(cims=cims, parents=[(n - 1,) if n else () for n in range(num_nodes)])


@pytest.fixture(scope="module")
def ternary_chain():
    """A chain of 9 ternary nodes: 19683 global states, beyond the automatic solver's 16384."""
    return _chain(9, 3, seed=4)


@pytest.fixture
def small_network(tmp_path):
    """The 2-node binary network of the loop and sharding tests, as a JSON file."""
    path = tmp_path / "small.json"
    path.write_text(json.dumps(network_dict()))
    return jc.CTBN.from_dict(network_dict()), path


@pytest.fixture
def network(tmp_path):
    model = jc.CTBN(
        cims=[
            jnp.array([[[-1.0, 1.0], [2.0, -2.0]]]),
            jnp.array(
                [
                    [[-0.5, 0.3, 0.2], [1.0, -1.5, 0.5], [0.1, 0.1, -0.2]],
                    [[-2.0, 1.0, 1.0], [0.2, -0.4, 0.2], [3.0, 0.0, -3.0]],
                ]
            ),
        ],
        parents={"A": [], "B": ["A"]},
        names=("A", "B"),
    )
    data = model.to_dict()
    data["name"] = "test network"  # extra keys load
    path = tmp_path / "net.json"
    path.write_text(json.dumps(data))
    return model, path


def test_moments_layout_and_values(network, tmp_path):
    model, path = network
    out = tmp_path / "moments.json"
    rc = main(
        [
            "moments",
            "--network",
            str(path),
            "--duration",
            "2.0",
            "--initial-state",
            "A=0,B=2",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["duration"] == 2.0
    assert res["initial_state"] == {"A": 0, "B": 2}
    assert res["intervention"] == {}
    assert res["global"]["nodes"] == ["A", "B"]
    _, dwell = scipy_moments(brute_force_generator(model), one_hot_state(model, [0, 2]), 2.0)
    np.testing.assert_allclose(res["global"]["expected_dwell"], dwell, rtol=1e-9)
    B = res["nodes"]["B"]
    assert B["parents"] == ["A"]
    assert np.shape(B["expected_dwell"]) == (2, 3)
    assert np.shape(B["expected_transitions"]) == (2, 3, 3)
    # [config][state]: B's dwell under A=a is the sum over global states (a, b)
    np.testing.assert_allclose(np.asarray(B["expected_dwell"]).ravel(), dwell, rtol=1e-9)


def test_moments_solver_choice(network, ternary_chain, tmp_path, capsys):
    """`--solver auto` is exact on a small network and mean-field on one with more than 16384
    global states (a chain of 9 ternary nodes: 19683), where it says so; the mean-field numbers
    are those of `jc.MeanField`."""
    _, small = network
    out = tmp_path / "m.json"
    base = ["moments", "--duration", "1.5", "--out", str(out)]
    assert main([*base, "--network", str(small), "--initial-state", "A=0,B=1"]) == 0
    res = json.loads(out.read_text())
    assert res["solver"]["name"] == "uniformisation" and res["solver"]["exact"]
    assert res["solver"]["global_states"] == 6 and "global" in res
    assert "exact, uniformisation over 6 global states" in capsys.readouterr().out
    chain, N = ternary_chain, 9
    big = tmp_path / "chain.json"
    big.write_text(json.dumps(chain.to_dict()))
    init = ",".join(f"{name}=0" for name in chain.names)
    assert main([*base, "--network", str(big), "--initial-state", init]) == 0
    res = json.loads(out.read_text())
    assert res["solver"] == {
        "name": "mean-field",
        "exact": False,
        "global_states": 3**9,
        "chosen": "automatically",
        "max_global_states": 2**14,
    }
    assert "global" not in res
    assert (
        "approximate: mean-field, the 19683 global states exceed 16384" in capsys.readouterr().out
    )

    @eqx.filter_jit  # one program (eagerly, each node's marginalisation: one per operation)
    def mean_field_dwell(chain):
        stats = jc.expected_statistics(chain, jnp.zeros(N, jnp.int32), 1.5, solver=jc.MeanField())
        return [stats.node_dwell_times(n) for n in (0, 4, 8)]

    for n, dwell in zip((0, 4, 8), mean_field_dwell(chain)):
        np.testing.assert_allclose(
            res["nodes"][chain.names[n]]["expected_dwell"], dwell, rtol=1e-12
        )
    assert resolve_solver(jc.AutomaticSolver(), chain) == jc.MeanField()
    assert resolve_solver(jc.AutomaticSolver(max_global_states=3**9), chain) == jc.Uniformisation()
    with pytest.raises(ValueError, match="max_global_states must be an integer >= 1"):
        jc.AutomaticSolver(max_global_states=0)


def test_moments_with_intervention(network, tmp_path):
    _, path = network
    out = tmp_path / "m.json"
    rc = main(
        [
            "moments",
            "--network",
            str(path),
            "--duration",
            "1",
            "--initial-state",
            "A=0",
            "B=0",
            "--intervention",
            "A=1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["intervention"] == {"A": 1} and res["initial_state"] == {"A": 1, "B": 0}
    np.testing.assert_allclose(res["nodes"]["A"]["expected_dwell"], [[0.0, 1.0]], atol=1e-12)


def test_sample_writes_csv_that_reads_back(network, tmp_path):
    model, path = network
    out = tmp_path / "traj.csv"
    sample = ["sample", "--network", str(path), "--trajectories", "25", "--duration", "3"]
    sample += ["--intervention", "A=1", "--seed", "3"]
    rc = main([*sample, "--max-events", "64", "--out", str(out)])
    assert rc == 0
    df = pd.read_csv(out)
    assert list(df.columns) == ["trajectory_id", "time", "A", "B", "intervention"]
    assert (df["A"] == 1).all() and set(df["intervention"]) == {"A=1"}
    traj, ids = jc.Trajectories.read_csv(out, model)
    assert len(ids) == 25 and not bool(traj.truncated.any())
    assert np.allclose(np.asarray(traj.durations), 3.0)
    # same seed, same file
    out2 = tmp_path / "traj2.csv"
    main([*sample, "--out", str(out2)])
    assert out.read_text() == out2.read_text()


@pytest.mark.parametrize(
    "args, message",
    [
        (
            [
                "moments",
                "--network",
                "missing.json",
                "--duration",
                "1",
                "--initial-state",
                "A=0,B=0",
            ],
            "does not exist",
        ),
        (
            ["moments", "--network", "{net}", "--duration", "-1", "--initial-state", "A=0,B=0"],
            "--duration: must be a positive",
        ),
        (
            ["moments", "--network", "{net}", "--duration", "1", "--initial-state", "A=0"],
            "missing node(s) ['B']",
        ),
        (
            ["moments", "--network", "{net}", "--duration", "1", "--initial-state", "A=0,B=3"],
            "must be in 0..2",
        ),
        (
            ["moments", "--network", "{net}", "--duration", "1", "--initial-state", "A=0,C=0"],
            "unknown node 'C'",
        ),
        (
            ["moments", "--network", "{bad}", "--duration", "1", "--initial-state", "A=0,B=0"],
            "not valid JSON",
        ),
        (
            [
                "sample",
                "--network",
                "{net}",
                "--trajectories",
                "0",
                "--duration",
                "1",
                "--seed",
                "1",
            ],
            "argument --trajectories: must be an integer >= 1",
        ),
        (
            [
                "sample",
                "--network",
                "{net}",
                "--trajectories",
                "2",
                "--duration",
                "x",
                "--seed",
                "1",
            ],
            "expected a number",
        ),
        (
            ["sample", "--network", "{net}", "--trajectories", "2", "--duration", "1"]
            + ["--seed", str(2**64)],
            "argument --seed: must be between 0 and 2**63 - 1",
        ),
    ],
)
def test_cli_errors_are_one_line(args, message, network, tmp_path, capsys):
    """Exit code 2, one line `jaxctbn: error: ...` on stderr, nothing written (in process; the
    same contract end to end in the subprocess test below)."""
    _, path = network
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    args = [a.replace("{net}", str(path)).replace("{bad}", str(bad)) for a in args]
    args += ["--out", str(tmp_path / "o")]
    assert main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert message in lines[0] and lines[0].startswith("jaxctbn: error:")
    assert not (tmp_path / "o").exists()


def test_an_error_inside_compiled_code_is_one_line_end_to_end(network, tmp_path):
    """The whole process (`python -m jaxctbn._cli`): a check raised inside compiled code exits
    with 2 and one line on stderr; JAX's callback traceback must not reach stderr."""
    _, path = network
    args = ["moments", "--network", str(path), "--duration", "1e12", "--initial-state", "A=0,B=0"]
    proc = subprocess.run(
        [sys.executable, "-m", "jaxctbn._cli", *args, "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    # the series' check inside the compiled solve, in the command's terms (issue 35)
    assert lines[0].startswith("jaxctbn: error: --duration: 1e+12 is too long for the exact")
    assert proc.stdout == "" and not (tmp_path / "o").exists()


def _unwritable(folder) -> bool:
    try:
        with tempfile.TemporaryFile(dir=folder):
            return False
    except OSError:
        return True


@pytest.fixture
def inputs(network, tmp_path):
    """Files for the error table: `{name}` in an argument is replaced by its path."""
    _, net = network
    data = json.loads(net.read_text())
    paths = {"net": str(net), "tmp": str(tmp_path), "out": str(tmp_path / "out")}

    def network_file(name, mutate):
        d = json.loads(json.dumps(data))
        mutate(d)
        (tmp_path / name).write_text(json.dumps(d))
        paths[name] = str(tmp_path / name)

    network_file(
        "ragged", lambda d: d["cims"]["B"][1].update(Q=[[-2, 1, 1], [0.2, -0.2], [0, 1, -1]])
    )
    network_file("text_q", lambda d: d["cims"]["A"][0]["Q"][1].__setitem__(0, "2"))
    network_file("half_state", lambda d: d["cims"]["B"][1]["parent_states"].update(A=1.5))
    network_file("text_state", lambda d: d["cims"]["B"][1]["parent_states"].update(A="one"))
    network_file("list_states", lambda d: d["cims"]["B"][1].update(parent_states=[1]))
    network_file("index_parent", lambda d: d["nodes"][1].update(parents=[0]))
    header = "trajectory_id,time,A,B\n"
    for name, text in {
        "good": header + "0,0,0,0\n0,1,1,0\n0,2,1,2\n",
        "header_only": header,
        "empty": "",
        "semicolons": header.replace(",", ";") + "0;0;0;0\n0;1;1;0\n",
        "duplicate": "trajectory_id,time,A,A,B\n0,0,0,0,0\n0,1,1,1,0\n",
        "no_name": "trajectory_id,time,,B\n0,0,0,0\n0,1,1,0\n",
        "empty_id": header + "0,0,0,0\n0,1,1,0\n,0,0,0\n,2,0,1\n",
        "half_node": header + "0,0,0,0\n0,1,0.5,0\n",
    }.items():
        (tmp_path / f"{name}.csv").write_text(text)
        paths[name] = str(tmp_path / f"{name}.csv")
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    read_only.chmod(0o555)
    if not _unwritable(read_only):  # root ignores permission bits; sysfs refuses even root
        read_only.chmod(0o755)
        if not _unwritable("/sys"):
            pytest.skip("no read-only directory to test with")
        read_only = Path("/sys")
    paths["read_only"] = str(read_only)
    yield paths
    (tmp_path / "read_only").chmod(0o755)


MOMENTS = "moments --duration 1 --initial-state A=0,B=0 --network"
SAMPLE = "sample --network {net} --trajectories 2 --duration 1 --seed 0"
DESIGN = "design --initial-state A=0,B=0 --duration 1 --seed 0 --target"
RUN = "run parameters --network {net} --repetitions 1 --experiments 1 --samples 2"


@pytest.mark.parametrize(
    "command, message",
    [
        # issue 10, as reported
        (f"{DESIGN} parameters --data {{good}}", "--network: required with --target parameters"),
        (
            f"{SAMPLE} --seed 18446744073709551616",
            "argument --seed: must be between 0 and 2**63 - 1",
        ),
        (f"{SAMPLE} --seed -1", "argument --seed: must be between 0 and 2**63 - 1, got '-1'"),
        (f"{RUN} --truth-seed 9223372036854775808", "argument --truth-seed: must be between 0"),
        ("learn --data {empty_id}", "empty trajectory_id in row 2 (line 4 of a CSV file)"),
        ("demo --trajectories -5", "argument --trajectories: must be an integer >= 2, got '-5'"),
        ("demo --trajectories 0", "argument --trajectories: must be an integer >= 2, got '0'"),
        ("learn --data {header_only}", "data: no rows after the header"),
        (
            "learn --data {semicolons}",
            "single column 'trajectory_id;time;A;B'; the file must be comma-separated",
        ),
        ("learn --data {duplicate}", "column(s) ['A'] appear more than once in the header"),
        (f"{MOMENTS} {{ragged}}", "network: cims['B'][1].Q must be 3x3: row 1 has 2 entries"),
        (f"{MOMENTS} {{text_q}}", "network: cims['A'][0].Q[1][0] must be a number, got '2'"),
        (
            f"{MOMENTS} {{half_state}}",
            "cims['B'][1].parent_states['A'] must be an integer state, got 1.5",
        ),
        (
            f"{MOMENTS} {{text_state}}",
            "cims['B'][1].parent_states['A'] must be an integer state, got 'one'",
        ),
        (f"{MOMENTS} {{list_states}}", "cims['B'][1].parent_states must be an object"),
        (f"{MOMENTS} {{net}} --out {{read_only}}/m.json", "is not writable"),
        (f"{RUN} --out {{read_only}}/run", "is not writable"),
        (f"{MOMENTS} {{net}} --out {{net}}/m.json", "is not a directory"),
        (f"{MOMENTS} {{net}} --out {{tmp}}/missing/m.json", "missing' does not exist"),
        ("learn --data {good} --out {tmp}", "is a directory; give a file path"),
        (f"{RUN} --out {{net}}", "exists and is not a directory; give a directory"),
        ("demo --trajectories 2 --out {net}/demo", "cannot create directory"),
        # the same kind, found on the way
        (
            f"{DESIGN} structure --data {{good}} --samples 0",
            "argument --samples: must be an integer >= 1",
        ),
        (
            f"{DESIGN} structure --data {{good}} --paths 0",
            "argument --paths: must be an integer >= 1",
        ),
        (f"{DESIGN} structure --data {{good}} --max-parents -1", "argument --max-parents: must be"),
        (f"{RUN} --horizon -1", "argument --horizon: must be a positive finite number, got '-1'"),
        (f"{MOMENTS} {{net}} --duration abc", "argument --duration: expected a number, got 'abc'"),
        (f"{RUN} --chunk 0", "argument --chunk: must be an integer >= 1, got '0'"),
        (f"{RUN} --repetitions 0", "argument --repetitions: must be an integer >= 1"),
        (f"{RUN} --experiments 0", "argument --experiments: must be an integer >= 1"),
        ("learn --data {good} --beta inf", "argument --beta: must be a positive finite number"),
        ("demo --trajectories 1", "argument --trajectories: must be an integer >= 2, got '1'"),
        ("learn --data {tmp}/none.csv", "data file '{tmp}/none.csv' does not exist"),
        ("learn --data {tmp}", "data file '{tmp}' is a directory; give a trajectory CSV file"),
        (f"{MOMENTS} {{tmp}}", "network file '{tmp}' is a directory; give a network JSON file"),
        ("learn --data {empty}", "is empty; expected a header trajectory_id,time,<nodes>"),
        ("learn --data {no_name}", "column 3 of the header has no name"),
        ("learn --data {half_node}", "column 'A' must hold non-negative integer states; row 1"),
        (
            f"{MOMENTS} {{index_parent}}",
            "nodes[1].parents of node 'B' must be a list of node names",
        ),
    ],
)
def test_cli_input_errors(command, message, inputs, capsys):
    """Issue 10: each bad input gives exit code 2, one line naming the argument, field or file
    (and what is valid), and writes nothing, before any compilation."""
    args = [a.format(**inputs) for a in command.split()]
    if "--out" not in args:
        args += ["--out", inputs["out"]]
    assert main(args) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("jaxctbn: error: ")
    assert message.format(**inputs) in lines[0], lines[0]
    assert captured.out == "" and not os.path.exists(inputs["out"])


def test_console_script_is_installed(tmp_path):
    # the entry point from [project.scripts], installed next to this interpreter
    script = Path(sys.executable).parent / "jaxctbn"
    assert script.is_file(), (
        f"console script {script} is missing: install the package (pip install -e .[dev])"
    )
    # the script may import an installed copy: point it at this checkout's package
    env = {**os.environ, "PYTHONPATH": str(Path(jc.__file__).parent.parent)}
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    for command in ["sample", "moments", "learn", "design", "run", "demo"]:
        assert re.search(rf"^\s+{command}\s", proc.stdout, re.M), (command, proc.stdout)
    # the command fixes glibc's mmap threshold for its own process (a user's setting kept);
    # in a fresh interpreter, not this one: importing or calling `main` changes nothing
    code = (
        "import os; from jaxctbn._cli.jax_setup import fix_malloc_mmap_threshold as f; "
        "print(f()); os.environ['MALLOC_MMAP_THRESHOLD_'] = '262144'; print(f())"
    )
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert proc.stdout.split() == ["True" if glibc else "False", "False"], proc.stderr
    # at 128 KiB, except for `fit` (mostly compilation on a first call): 32 MiB
    from jaxctbn._cli.jax_setup import mmap_threshold_for

    assert mmap_threshold_for(["learn", "--data", "x.csv"]) == 128 * 1024
    assert mmap_threshold_for([]) == 128 * 1024
    assert mmap_threshold_for(["fit", "--network", "n.json"]) == 32 * 2**20
    # and one OpenBLAS thread, set before numpy is imported (a user's setting kept)
    code = (
        "import os, sys; from jaxctbn._cli.jax_setup import use_one_blas_thread as f; "
        "print(f(), os.environ['OPENBLAS_NUM_THREADS'], 'numpy' in sys.modules); "
        "os.environ['OPENBLAS_NUM_THREADS'] = '3'; print(f(), os.environ['OPENBLAS_NUM_THREADS'])"
    )
    env.pop("OPENBLAS_NUM_THREADS", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.stdout.split() == ["True", "1", "False", "False", "3"], proc.stderr
    # and fewer garbage collections, from CPython's default thresholds only (a user's kept)
    code = (
        "import gc; from jaxctbn._cli.jax_setup import fewer_garbage_collections as f; "
        "print(f(), *gc.get_threshold()); gc.set_threshold(900, 10, 10); "
        "print(f(), *gc.get_threshold())"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    expected = ["True", "50000", "20", "20", "False", "900", "10", "10"]
    assert proc.stdout.split() == expected, proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "jaxctbn._cli", "--help"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0 and "demo" in proc.stdout, proc.stderr
    # and it ends without the interpreter's teardown, as Python would end it otherwise: a
    # thread that is not a daemon finishes, the exit functions run, buffered output reaches
    # the pipe, the status is main's (2 for a bad flag)
    code = (
        "import atexit, sys, threading, time; "
        "atexit.register(lambda: print('exit function ran', flush=False)); "
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread ran'))).start(); "
        "sys.argv = ['jaxctbn', *sys.argv[1:]]; print('buffered'); "
        "from jaxctbn._cli import console; console()"
    )
    for argv, status in ((["--help"], 0), (["learn", "--no-such-flag"], 2)):
        proc = subprocess.run(
            [sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env
        )
        assert proc.returncode == status, proc.stderr
        assert proc.stdout.startswith("buffered\n"), proc.stdout
        assert proc.stdout.endswith("thread ran\nexit function ran\n"), proc.stdout
        assert ("usage:" in proc.stdout) == (status == 0), proc.stdout
    # under a profiler, Python's own exit: the profiler writes its results at the very end
    stats = tmp_path / "cli.prof"
    proc = subprocess.run(
        [sys.executable, "-m", "cProfile", "-o", str(stats), "-m", "jaxctbn._cli", "--help"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert proc.returncode == 0 and stats.stat().st_size > 0, proc.stderr


def test_demo_runs_small(tmp_path):
    report = __import__("jaxctbn._cli.demo", fromlist=["run_demo"]).run_demo(
        out_dir=str(tmp_path), seed=1, trajectories=300
    )
    assert (tmp_path / "marginals.png").exists() and (tmp_path / "network.json").exists()
    zs = [v["max_abs_z"] for d in report["designs"].values() for v in d.values()]
    assert max(zs) < 5.0


def test_learn_writes_the_documented_layout(tmp_path):
    """`sample` (observational and under do(A=1), the same sizes: one compiled sampler) and
    `learn` with either prior convention: the documented keys, the true graph, a posterior over
    parent sets that sums to 1, and rates that load as a network."""
    truth = jc.experiments.scaled_softmax_ctbn(
        ((), (0,), (1,)), (2, 2, 2), rate_fast=2.0, names=("A", "B", "C")
    )
    net = tmp_path / "truth.json"
    truth.to_json(net)
    obs, itv, both = tmp_path / "obs.csv", tmp_path / "itv.csv", tmp_path / "both.csv"
    sample = ["sample", "--network", str(net), "--trajectories", "40", "--duration", "10"]
    assert main([*sample, "--seed", "0", "--out", str(obs)]) == 0
    assert main([*sample, "--intervention", "A=1", "--seed", "1", "--out", str(itv)]) == 0
    b = pd.read_csv(itv)
    b["trajectory_id"] += 1000
    pd.concat([pd.read_csv(obs), b]).to_csv(both, index=False)
    out = tmp_path / "result.json"
    learn = ["learn", "--data", str(both), "--max-parents", "2", "--alpha", "1", "--beta", "1"]
    for conv in ("gamma", "nodelman"):
        assert main([*learn, "--prior-convention", conv, "--out", str(out)]) == 0
        res = json.loads(out.read_text())
        assert res["map_graph"] == {"A": [], "B": ["A"], "C": ["B"]}
        sets = res["nodes"]["B"]["parent_sets"]
        assert {tuple(s["parents"]) for s in sets} == {(), ("A",), ("C",), ("A", "C")}
        assert abs(sum(s["posterior"] for s in sets) - 1) < 1e-9
        assert all("log_marginal_likelihood" in s for s in sets)
        assert set(res["nodes"]["B"]["edge_marginals"]) == {"A", "C"}
        learned = jc.CTBN.from_dict(res["rates"])  # the rates are a loadable network
        assert learned.parents == truth.parents


def test_learn_errors(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("trajectory_id,time,A,B\n0,0,0,0\n0,1,1,1\n")
    for args, message in [
        (["--data", str(bad)], "changes 2 nodes"),
        (["--data", str(tmp_path / "none.csv")], "does not exist"),
        (["--data", str(bad), "--max-parents", "5"], "--max-parents: must be between 0 and 1"),
        (["--data", str(bad), "--alpha", "0"], "--alpha: must be a positive"),
        (["--data", str(bad), "--cardinalities", "Z=3"], "unknown node 'Z'"),
    ]:
        assert main(["learn", *args, "--out", str(tmp_path / "o")]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], lines
        assert lines[0].startswith("jaxctbn: error:")
    assert not (tmp_path / "o").exists()


def test_design_parameters_ranks_the_whole_space(small_network, tmp_path):
    """`design --target parameters` on a sampled history: all 9 candidates in
    `intervention_space` order, the best one, the numbers of the library call with the same
    key; the BHC bounds the VBHC from above."""
    model, path = small_network
    hist = tmp_path / "hist.csv"
    sample = ["sample", "--network", str(path), "--trajectories", "5", "--duration", "2"]
    assert main([*sample, "--seed", "0", "--out", str(hist)]) == 0
    out = tmp_path / "rank.json"
    base = ["design", "--data", str(hist), "--target", "parameters", "--network", str(path)]
    base += ["--initial-state", "A=0,B=1", "--duration", "3", "--samples", "3", "--seed", "0"]
    assert main([*base, "--criterion", "vbhc", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["criterion"] == "vbhc" and res["target"] == "parameters"
    assert len(res["scores"]) == 3 * 3
    assert res["scores"][0]["intervention"] == {}
    assert res["scores"][-1]["intervention"] == {"A": 1, "B": 1}
    values = [r["score"] for r in res["scores"]]
    assert res["best"] == res["scores"][int(np.argmax(values))]["intervention"]
    # the library call with the same key gives the same numbers (the posterior from the CSV in
    # one compiled function; the scores: the program of the sharding and loop tests)
    traj, _ = jc.Trajectories.read_csv(hist, model)
    post = eqx.filter_jit(
        lambda m, t: jc.RatePosterior.for_model(m).update_with(
            jc.SufficientStatistics.from_trajectories(t, m.cardinalities, m.parents)
        )
    )(model, traj)
    ref = jc.score_interventions(
        post,
        jc.intervention_space(model.cardinalities),
        jnp.array([0, 1], jnp.int32),
        3.0,  # a Python number is static: the value the other tests use, for one program
        key=jax.random.key(0),
        num_samples=3,
        # the criterion and outcome as the command line passes them: its compiled program
        criterion=jc.VBHC(),
        outcome=jc.CompletePath(),
    )
    np.testing.assert_allclose(values, np.asarray(ref), rtol=1e-9, atol=1e-12)
    out_bhc = tmp_path / "bhc.json"
    assert main([*base, "--criterion", "bhc", "--out", str(out_bhc)]) == 0
    bhc = [r["score"] for r in json.loads(out_bhc.read_text())["scores"]]
    assert all(b >= v - 1e-9 for b, v in zip(bhc, values))
    assert max(b - v for b, v in zip(bhc, values)) > 1e-6  # a bound, not the same number


@pytest.mark.slow
def test_design_parameters_on_a_large_network(ternary_chain, tmp_path):
    """A chain of 9 ternary nodes (19683 global states, 4^9 candidate interventions): `design`
    ranks the 28 single-node candidates (`--interventions auto`) with mean-field statistics
    (the automatic solver's choice for this network), the numbers of the library call with the
    same key (the same compiled program)."""
    chain, N = ternary_chain, 9
    net = tmp_path / "chain.json"
    net.write_text(json.dumps(chain.to_dict()))
    out = tmp_path / "rank.json"
    init = ",".join(f"{name}={n % 3}" for n, name in enumerate(chain.names))
    args = ["design", "--target", "parameters", "--network", str(net), "--initial-state", init]
    args += ["--duration", "1", "--samples", "3", "--seed", "5", "--out", str(out)]
    assert main(args) == 0
    res = json.loads(out.read_text())
    assert len(res["scores"]) == 1 + 3 * N
    assert res["scores"][0]["intervention"] == {}
    assert res["scores"][1]["intervention"] == {chain.names[0]: 0}
    assert all(len(r["intervention"]) <= 1 for r in res["scores"])
    assert resolve_solver(jc.AutomaticSolver(), chain) == jc.MeanField()
    ref = jc.score_interventions(
        jc.RatePosterior.for_model(chain),
        jc.single_node_interventions(chain.cardinalities),
        jnp.arange(N, dtype=jnp.int32) % 3,
        1.0,
        key=jax.random.key(5),
        num_samples=3,
        criterion=jc.VBHC(
            graph_draws=jc.criteria.JointGraphDraws(), max_sets=32
        ),  # as `design` passes
    )
    np.testing.assert_allclose([r["score"] for r in res["scores"]], ref, rtol=1e-9)
    assert design_space((2,) * 7).targets.shape[0] == 3**7  # 2187 <= 4096: all
    assert design_space((2,) * 8).targets.shape[0] == 17


@pytest.mark.slow  # the CLI's structure design: test_design_structure; the defaults: below
def test_design_structure_on_a_large_network(tmp_path):
    """9 binary nodes, no history: `design --target structure` scores the 19 single-node
    candidates with joint graph draws over each node's 32 most probable parent sets (the
    defaults beyond 8 nodes), the numbers of the library call with the same settings and key
    (from the prior posterior: the same compiled program)."""
    N = 9
    chain = _chain(N, 2, seed=4)  # (only its nodes matter: no history)
    net = tmp_path / "chain.json"
    net.write_text(json.dumps(chain.to_dict()))
    init = ",".join(f"{name}={n % 2}" for n, name in enumerate(chain.names))
    out = tmp_path / "rank.json"
    args = ["design", "--target", "structure", "--network", str(net), "--initial-state", init]
    args += ["--duration", "1", "--samples", "2", "--seed", "5", "--out", str(out)]
    assert main(args) == 0
    res = json.loads(out.read_text())
    assert (res["graph_draws"], res["max_sets"]) == ("joint", 32)
    prior = eqx.filter_jit(jc.StructurePosterior.from_prior)(chain.names, (2,) * N, max_parents=2)
    ref = jc.score_interventions(
        prior,
        jc.single_node_interventions((2,) * N),
        jnp.arange(N, dtype=jnp.int32) % 2,
        1.0,
        key=jax.random.key(5),
        num_samples=2,
        criterion=jc.VBHC(graph_draws=jc.criteria.JointGraphDraws(), max_sets=32),
    )
    np.testing.assert_allclose([r["score"] for r in res["scores"]], ref, rtol=1e-9)


@pytest.mark.usefixtures("no_runtime_typecheck")  # passes a bad graph_draws on purpose
def test_graph_draw_defaults_and_their_flags(tmp_path):
    """The structure criteria's defaults by network size (joint draws over each node's 32 most
    probable parent sets beyond 8 nodes, stratified below), `--graph-draws` and `--max-sets`
    overriding them, and their one-line errors."""
    N = 9
    args = ["design", "--target", "structure", "--network", "net.json", "--initial-state", "A=0"]
    args += ["--duration", "1", "--seed", "5", "--out", str(tmp_path / "rank.json")]
    assert _box_hill_options(build_parser().parse_args(args), N) == {
        "graph_draws": jc.criteria.JointGraphDraws(),
        "max_sets": 32,
    }
    assert _box_hill_options(build_parser().parse_args(args), 8) == {
        "graph_draws": jc.criteria.StratifiedGraphDraws(),
        "max_sets": None,
    }
    parsed = build_parser().parse_args([*args, "--graph-draws", "stratified", "--max-sets", "4"])
    options = _box_hill_options(parsed, N)
    assert options == {"graph_draws": jc.criteria.StratifiedGraphDraws(), "max_sets": 4}
    assert default_graph_draws(8, "auto", None) == ("stratified", None)
    assert default_graph_draws(9, "stratified", 5) == ("stratified", 5)
    with pytest.raises(ValueError, match="graph_draws must be 'auto', 'stratified' or 'joint'"):
        jc.experiments.ExperimentConfig(graph_draws="bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_sets: must be a positive integer"):
        jc.experiments.ExperimentConfig(max_sets=0)


def test_design_structure(tmp_path):
    """`design --target structure` from a history CSV (the structure problem of the sharding
    tests): all 27 candidates ranked by the VBHC and the EIG, the numbers of the library calls
    with the same key; clamping every node scores zero."""
    chain, paths = structure_design_problem()
    hist = tmp_path / "hist.csv"
    paths.write_csv(hist, chain)
    out = tmp_path / "rank.json"
    args = ["design", "--data", str(hist), "--target", "structure", "--initial-state"]
    args += ["A=0,B=1,C=0", "--duration", "2", "--samples", "3", "--seed", "2", "--max-parents"]
    args += ["2"]
    assert main([*args, "--criterion", "vbhc", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["target"] == "structure" and len(res["scores"]) == 27
    assert (res["graph_draws"], res["max_sets"]) == ("stratified", None)
    vbhc = [r["score"] for r in res["scores"]]
    assert res["best"] == res["scores"][int(np.argmax(vbhc))]["intervention"]
    assert res["scores"][-1]["intervention"] == {"A": 1, "B": 1, "C": 1}
    assert abs(vbhc[-1]) < 1e-12  # every node clamped: nothing to learn
    assert main([*args, "--criterion", "eig", "--paths", "2", "--out", str(out)]) == 0
    eig = [r["score"] for r in json.loads(out.read_text())["scores"]]
    assert len(eig) == 27 and abs(eig[-1]) < 1e-12 and min(eig) > -0.5
    post = jc.learn_structure(paths, chain.names, (2, 2, 2), max_parents=2)
    space, init = jc.intervention_space((2, 2, 2)), jnp.array([0, 1, 0], jnp.int32)
    for values, criterion in ((vbhc, jc.VBHC()), (eig, jc.EIG(num_paths=2))):
        ref = jc.score_interventions(
            post,
            space,
            init,
            2.0,
            key=jax.random.key(2),
            num_samples=3,
            criterion=criterion,
            outcome=jc.CompletePath(),  # as the command line passes it: its compiled program
        )
        np.testing.assert_allclose(values, ref, rtol=1e-9, atol=1e-12)


def test_run_parameters_small(small_network, tmp_path, capsys):
    """`run parameters` writes the documented files (the loop programs of the loop and
    sharding tests: 3 repetitions of 2 experiments in one chunk)."""
    model, path = small_network
    out = tmp_path / "run"
    args = ["run", "parameters", "--network", str(path), "--designs", "passive,vbhc"]
    args += ["--repetitions", "3", "--experiments", "2", "--samples", "3", "--chunk", "3"]
    assert main([*args, "--out", str(out), "--no-progress"]) == 0
    for name in ("summary.md", "metrics.csv", "results.json", "figure.png", "interventions.png"):
        assert (out / name).exists(), name
    df = pd.read_csv(out / "metrics.csv", keep_default_na=False)
    assert list(df.columns) == [
        "design",
        "repetition",
        "experiment",
        "mse",
        "intervention",
        "initial_state",
        "round",
        "cost",
    ]
    assert (df["round"] == df.experiment).all() and (df["cost"] == "").all()
    assert set(df.design) == {"passive", "vbhc"} and set(df.experiment) == {0, 1, 2}
    assert (df.mse > 0).all() and len(df) == 2 * 3 * 3
    res = json.loads((out / "results.json").read_text())
    assert [n["name"] for n in res["settings"]["truth"]["nodes"]] == ["A", "B"]
    assert res["input_format"] == {"network": "jaxctbn"}  # the format of --network
    assert np.asarray(res["designs"]["vbhc"]["metrics"]["mse"]).shape == (3, 3)
    assert "| vbhc | posterior MSE" in (out / "summary.md").read_text()
    capsys.readouterr()
    for extra, message in [
        (["--designs", "passive,best"], "--designs: unknown design(s) ['best']"),
        (["--designs", ""], "--designs: give one or more comma-separated design names"),
        (["--designs", "passive,,vbhc"], "without empty entries, got 'passive,,vbhc'"),
        (["--horizon", "-1"], "--horizon: must be a positive"),
        (["--repetitions", "0"], "argument --repetitions: must be an integer >= 1"),
    ]:
        assert main([*args, *extra, "--out", str(tmp_path / "bad"), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_cli_compilation_cache(network, tmp_path, monkeypatch):
    """The CLI fills the cache directory named by JAXCTBN_CACHE_DIR; `off` or empty disables it
    (the default lives under XDG_CACHE_HOME)."""
    import os

    import jax

    from jaxctbn._cli.jax_setup import _setup_jax
    from jaxctbn._compilation import cache_directory

    _, path = network
    cache = tmp_path / "cache"
    argv = ["moments", "--network", str(path), "--duration", "1", "--initial-state", "A=0,B=1"]
    root = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )  # this checkout
    env = dict(os.environ, JAXCTBN_CACHE_DIR=str(cache), PYTHONPATH=root)
    proc = subprocess.run(
        [sys.executable, "-m", "jaxctbn._cli", *argv, "--out", str(tmp_path / "m.json")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert any(cache.iterdir())

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    for value in ("off", "", " OFF "):
        monkeypatch.setenv("JAXCTBN_CACHE_DIR", value)
        assert cache_directory() is None
    monkeypatch.delenv("JAXCTBN_CACHE_DIR")
    assert cache_directory() == str(tmp_path / "xdg" / "jaxctbn" / "jax-compilation-cache")
    previous = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        monkeypatch.setenv("JAXCTBN_CACHE_DIR", "off")
        _setup_jax()
        assert jax.config.jax_compilation_cache_dir is None
    finally:
        jax.config.update("jax_compilation_cache_dir", previous)
