"""The README's example must run as written."""

import pathlib
import re

import numpy as np


def test_readme_example_runs():
    text = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    code = re.search(r"## Example\n\n```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["scores"].shape == (81,)
    assert namespace["dwell"].shape == (81, 16)
    ns = namespace
    tau = 3.0
    # every intervention's expected dwell times add up to the horizon
    np.testing.assert_allclose(np.asarray(ns["dwell"]).sum(1), tau, rtol=1e-9)
    # the vmapped row for do(X1 = 1) (product order: X1 -> 1, rest untouched = 2 * 27) is the
    # single solve
    np.testing.assert_allclose(ns["dwell"][54], ns["stats"].dwell_times, rtol=1e-9, atol=1e-12)
    # under do(X1 = 1) X2 never sees X1 = 0
    x2 = np.asarray(ns["stats"].node_dwell_times("X2"))
    np.testing.assert_allclose(x2[0], 0.0, atol=1e-12)
    np.testing.assert_allclose(x2.sum(), tau, rtol=1e-9)
    # a design that clamps every node shows no transitions: VBHC 0, the least informative;
    # the best design is the largest score and is informative
    scores = np.asarray(ns["scores"])
    clamped_all = np.asarray(ns["space"].targets).all(1)
    assert clamped_all.sum() == 16
    np.testing.assert_allclose(scores[clamped_all], 0.0, atol=1e-9)
    assert np.all(np.isfinite(scores)) and scores.min() > -1e-9
    assert ns["best"] == int(np.argmax(scores)) and scores[ns["best"]] > 1.0
    assert not clamped_all[ns["best"]]
    # edge marginals are probabilities with no self-loops
    edges = np.asarray(ns["graphs"].edge_marginals())
    assert edges.shape == (4, 4) and np.all((edges >= 0) & (edges <= 1))
    np.testing.assert_array_equal(np.diag(edges), 0.0)
    # X2's transitions depend on X1's and X2's rates only, not on X3's or X4's (to rounding)
    g = [np.asarray(c) for c in ns["grad"].cims]
    assert all(np.all(np.isfinite(c)) for c in g)
    assert np.abs(g[0]).max() > 0 and np.abs(g[1]).max() > 0
    np.testing.assert_allclose(g[2], 0.0, atol=1e-10)
    np.testing.assert_allclose(g[3], 0.0, atol=1e-10)
