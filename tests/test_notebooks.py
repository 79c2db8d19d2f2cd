"""Execute the notebooks with small settings (as optax does when building its docs).

Each notebook runs end to end in its own working directory, one after the other in one kernel
(its namespace cleared before each), so that every notebook finds the programs that the
notebooks before it compiled (the structure-learning loops of active_structure_learning, for
instance, are those of gpu_batch); as separate tests, pytest-xdist would run them at the same
time on different workers, each compiling them again."""

import os
import pathlib
import time

import nbformat
import pytest
from jupyter_client import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = pathlib.Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


#: The first cell of each notebook: every name the notebooks before it defined (their imports
#: included) removed from the kernel's namespace, as `%reset -f` removes them, but the values
#: kept alive on the shell until the kernel ends. `%reset` also collects garbage, which freed
#: the compiled programs the last notebook's objects held: 0.7-1.3 s per notebook, measured;
#: the kernel is killed at the end anyway.
_CLEAR = (
    "def _clear(shell):\n"
    "    shell.jaxctbn_kept = [*getattr(shell, 'jaxctbn_kept', []), dict(shell.user_ns)]\n"
    "    for name in [n for n in shell.user_ns if n not in shell.user_ns_hidden]:\n"
    "        del shell.user_ns[name]\n"
    "_clear(get_ipython())\n"
)


def _prepared(path: pathlib.Path, workdir: pathlib.Path):
    """The notebook at `path` with a first cell that clears the shared kernel's namespace
    (`_CLEAR`: nothing a notebook before it defined is visible) and moves it to `workdir`."""
    nb = nbformat.read(path, as_version=4)
    reset = nbformat.v4.new_code_cell(_CLEAR + f"import os\nos.chdir({str(workdir)!r})")
    nb.cells.insert(0, reset)
    return nb


def _failure(nb) -> str | None:
    """Why the executed notebook `nb` (its reset cell first) failed, or None."""
    code = [c for c in nb.cells[1:] if c.cell_type == "code" and c.source.strip()]
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
    # One kernel for every notebook: its start and the imports of jax and jaxctbn (~4 s per
    # notebook) are paid once, and a program a notebook traced is reused by the next in memory.
    # Each notebook first clears the namespace (`_prepared`), so it sees nothing the ones
    # before it defined.
    km = KernelManager(kernel_name="python3")
    km.start_kernel(
        cwd=str(tmp_path),
        # The kernel first runs the command line's JAX set-up, as conftest.py does in every
        # worker: the persistent compilation cache of the run (inherited through
        # JAXCTBN_CACHE_DIR) then also stores and loads programs with host callbacks (almost
        # every program of the library; JAX alone would compile them again in the kernel).
        # It also turns on float64, which every notebook does in its first cell anyway, and
        # the command's (and the workers') garbage-collection thresholds: tracing allocates
        # hundreds of thousands of objects that CPython's defaults walk every 700 allocations.
        extra_arguments=[
            "--IPKernelApp.exec_lines=from jaxctbn._cli.jax_setup import _setup_jax, "
            "fewer_garbage_collections; _setup_jax(); fewer_garbage_collections()"
        ],
    )
    failures = {}
    try:
        for path in NOTEBOOKS:  # every notebook, even after a failure
            workdir = tmp_path / path.stem
            workdir.mkdir()
            start = time.perf_counter()
            nb = _prepared(path, workdir)
            try:
                NotebookClient(nb, km=km, timeout=300, kernel_name="python3").execute()
                failure = _failure(nb)
            except CellExecutionError as err:  # its message has the failing cell and traceback
                failure = f"a cell raised\n{err}"
            print(f"{path.name}: {time.perf_counter() - start:.1f} s, {failure or 'ran'}")
            if failure is not None:
                failures[path.name] = failure
    finally:
        km.shutdown_kernel(now=True)
    if failures:
        pytest.fail(
            "\n\n".join(f"{name}: {reason}" for name, reason in failures.items()), pytrace=False
        )
