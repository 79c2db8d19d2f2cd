"""The plug-in MI estimator of benchmarks/criteria/bench_mi_design.py against hand-computed cases."""

import importlib.util
import math
import os

import numpy as np
import pytest

# the benchmarks are scripts, not a package: load this one by its path
_PATH = os.path.join(
    os.path.dirname(__file__), os.pardir, "benchmarks", "criteria", "bench_mi_design.py"
)
_spec = importlib.util.spec_from_file_location("bench_mi_design", _PATH)
assert _spec is not None and _spec.loader is not None
mi = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mi)


def test_hand_computed_table():
    # p(i) = (3/4, 1/4); H(i | h=0) = 0, H(i | h=1) = 1 bit
    counts = mi.recommendation_counts(np.array([[0, 0], [0, 1]]), 2)
    np.testing.assert_array_equal(counts, [[2, 0], [1, 1]])
    expected = -(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25)) - 0.5
    assert mi.mutual_information(counts) == pytest.approx(expected, abs=1e-12)


def test_deterministic_recommendation_gives_marginal_entropy():
    # i = f(h) with f hitting 4 interventions equally often: I = H(i) = 2 bits
    recs = np.repeat((np.arange(8) % 4)[:, None], 5, axis=1)
    counts = mi.recommendation_counts(recs, 27)
    assert mi.mutual_information(counts) == pytest.approx(2.0, abs=1e-12)
    # the conditionals have one bin each: only the marginal gets its (small) correction
    assert mi.mutual_information(counts, miller_madow=True) == pytest.approx(
        2.0 + 3 / (2 * 40 * math.log(2)), abs=1e-12
    )
    null = mi.permutation_null(recs, 27, np.random.default_rng(0), 100)
    assert null.mean() < 1.5


def test_independent_recommendation_is_zero_after_correction():
    rng = np.random.default_rng(0)
    recs = rng.integers(0, 4, (10, 400))
    counts = mi.recommendation_counts(recs, 27)
    plugin = mi.mutual_information(counts)
    corrected = mi.mutual_information(counts, miller_madow=True)
    null = mi.permutation_null(recs, 27, rng, 50)
    assert plugin > 0  # the plug-in is biased high
    assert abs(corrected) < 5e-3
    assert abs(plugin - null.mean()) < 5e-3  # the null is the bias floor
