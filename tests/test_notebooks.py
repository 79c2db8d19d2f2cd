"""Execute the notebooks with small settings (as optax does when building its docs)."""

import os
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = pathlib.Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, monkeypatch, tmp_path):
    monkeypatch.setenv("JAXCTBN_NOTEBOOK_PATHS", "200")
    monkeypatch.setenv("JAXCTBN_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("JAX_PLATFORMS", os.environ.get("JAX_PLATFORMS", "cpu"))
    # the kernel runs in tmp_path: make it import this checkout's package
    pythonpath = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, pythonpath)))
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    try:
        client.execute()
    except CellExecutionError as err:  # its message has the failing cell's source and traceback
        pytest.fail(f"{path.name}: a cell raised\n{err}", pytrace=False)
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    assert code, f"{path.name} has no code cells"
    not_run = [i for i, c in enumerate(code) if c.get("execution_count") is None]
    assert not not_run, f"{path.name}: code cells {not_run} did not execute"
    counts = [c.execution_count for c in code]
    assert counts == sorted(counts) and len(set(counts)) == len(counts), counts
    errors = [
        (i, o.get("ename"), o.get("evalue"))
        for i, c in enumerate(code)
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors, f"{path.name}: error outputs {errors}"
