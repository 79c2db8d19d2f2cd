"""Execute the notebooks with small settings (as optax does when building its docs).

Each notebook runs end to end in its own kernel and its own working directory. They run one
after the other in one test, so that every notebook finds the programs that the notebooks
before it compiled in the run's persistent compilation cache (the structure-learning loops of
active_structure_learning, for instance, are those of gpu_batch); as separate tests, pytest-xdist
would run them at the same time on different workers, each compiling them again."""

import os
import pathlib
import time

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = pathlib.Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _execute(path: pathlib.Path, workdir: pathlib.Path) -> str | None:
    """Run the notebook at `path` in a fresh kernel in `workdir`; the reason it failed, or
    None."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(workdir)}},
        # The kernel first runs the command line's JAX set-up, as conftest.py does in every
        # worker: the persistent compilation cache of the run (inherited through
        # JAXCTBN_CACHE_DIR) then also stores and loads programs with host callbacks (almost
        # every program of the library; JAX alone would compile them again in each kernel).
        # It also turns on float64, which every notebook does in its first cell anyway.
        extra_arguments=[
            "--IPKernelApp.exec_lines=from jaxctbn._cli.jax_setup import _setup_jax; _setup_jax()"
        ],
    )
    try:
        client.execute()
    except CellExecutionError as err:  # its message has the failing cell's source and traceback
        return f"a cell raised\n{err}"
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    if not code:
        return "no code cells"
    not_run = [i for i, c in enumerate(code) if c.get("execution_count") is None]
    if not_run:
        return f"code cells {not_run} did not execute"
    counts = [c.execution_count for c in code]
    if counts != sorted(counts) or len(set(counts)) != len(counts):
        return f"execution counts out of order: {counts}"
    errors = [
        (i, o.get("ename"), o.get("evalue"))
        for i, c in enumerate(code)
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    if errors:
        return f"error outputs {errors}"
    return None


def test_notebooks_execute(monkeypatch, tmp_path):
    assert NOTEBOOKS, "no notebooks found"
    monkeypatch.setenv("JAXCTBN_NOTEBOOK_PATHS", "200")
    monkeypatch.setenv("JAXCTBN_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("JAX_PLATFORMS", os.environ.get("JAX_PLATFORMS", "cpu"))
    # The kernels compile about a fifth faster with XLA's CPU elemental emitters than with its
    # newer fusion emitters, and on one code-generation thread (the run's two workers already
    # share two cores); the results are the same to rounding. (The persistent cache's key
    # includes XLA_FLAGS, so the kernels then share programs with one another only; few of
    # theirs are those of the tests.)
    flags = os.environ.get("XLA_FLAGS", "").split()
    for flag in ("--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1"):
        if not any(f.startswith(flag.split("=")[0] + "=") for f in flags):
            flags.append(flag)
    monkeypatch.setenv("XLA_FLAGS", " ".join(flags))
    # the kernel runs in tmp_path: make it import this checkout's package
    pythonpath = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, pythonpath)))
    failures = {}
    for path in NOTEBOOKS:  # every notebook, even after a failure
        workdir = tmp_path / path.stem
        workdir.mkdir()
        start = time.perf_counter()
        failure = _execute(path, workdir)
        print(f"{path.name}: {time.perf_counter() - start:.1f} s, {failure or 'ran'}")
        if failure is not None:
            failures[path.name] = failure
    if failures:
        pytest.fail(
            "\n\n".join(f"{name}: {reason}" for name, reason in failures.items()), pytrace=False
        )
