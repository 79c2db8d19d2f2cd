"""AUROC / AUPR with scores tied within a relative tolerance: scores equal in exact arithmetic
but a few ulp apart must count as tied (as scikit-learn counts exact ties), genuinely different
scores must not, and non-finite scores raise."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxctbn as jc
from jaxctbn._active_learning.metrics import adjacency_from_parents, aupr, auroc


# scikit-learn's metrics, imported at the first call, not at collection (0.8 s, paid by each
# worker that collects this file)
def roc_auc_score(*args, **kwargs):
    from sklearn.metrics import roc_auc_score as metric

    return metric(*args, **kwargs)


def average_precision_score(*args, **kwargs):
    from sklearn.metrics import average_precision_score as metric

    return metric(*args, **kwargs)


# compiled once per (shape, rtol): the eager route compiles every primitive, which is slower
AUROC, AUPR = eqx.filter_jit(auroc), eqx.filter_jit(aupr)
METRICS = ((AUROC, roc_auc_score), (AUPR, average_precision_score))


def _perturb(x, rng, max_ulps=3):
    """Each entry moved by 1..`max_ulps` ulp in a random direction (np.nextafter, repeatedly)."""
    x = np.array(x, dtype=np.float64)
    for i in range(x.size):
        towards = np.inf if rng.random() < 0.5 else -np.inf
        for _ in range(rng.integers(1, max_ulps + 1)):
            x.flat[i] = np.nextafter(x.flat[i], towards)
    return x


def _tied_problem(rng, n):
    """Scores with many exact ties (a few values, none zero) and labels of both classes."""
    values = np.array([1 / 3, 1 / 2, 2 / 3, 0.1, 0.7, 1.0, 1e-3])
    scores = rng.choice(values[: rng.integers(2, values.size + 1)], n)
    labels = rng.integers(0, 2, n)
    labels[:2] = (0, 1)
    return scores, labels


def test_ulp_noise_is_tied_like_sklearn_exact_ties():
    rng = np.random.default_rng(0)
    noisy = 0  # cases where the ulp noise changes scikit-learn's value: the test has teeth
    for trial in range(30):
        n = (8, 25)[trial % 2]  # two sizes: few compilations
        exact, labels = _tied_problem(rng, n)
        perturbed = _perturb(exact, rng)
        assert np.all(perturbed != exact)
        for ours, theirs in METRICS:
            reference = theirs(labels, exact)
            np.testing.assert_allclose(ours(exact, labels), reference, rtol=0, atol=1e-12)
            np.testing.assert_allclose(ours(perturbed, labels), reference, rtol=0, atol=1e-12)
            # rtol=0 is exact equality: it ranks by the noise, as scikit-learn does
            np.testing.assert_allclose(
                ours(perturbed, labels, rtol=0.0), theirs(labels, perturbed), rtol=0, atol=1e-12
            )
            noisy += abs(theirs(labels, perturbed) - reference) > 1e-3
    assert noisy >= 20


def test_genuinely_different_scores_stay_separate_and_ties_chain():
    rng = np.random.default_rng(1)
    labels = np.array([1, 0, 1, 0, 0, 1, 0, 1])
    # relative gaps of 1e-6: distinct at the default tolerance, one group at rtol=1e-5
    scores = 0.5 * (1 + 1e-6 * rng.permutation(8))
    for ours, theirs in METRICS:
        np.testing.assert_allclose(ours(scores, labels), theirs(labels, scores), atol=1e-12)
        tied = theirs(labels, np.full(8, 0.5))
        np.testing.assert_allclose(ours(scores, labels, rtol=1e-5), tied, atol=1e-12)
        assert abs(theirs(labels, scores) - tied) > 0.1
    # the rule a - b <= rtol * max(|a|, |b|), either side of the boundary
    pair = np.array([0, 1])
    np.testing.assert_allclose(AUROC(np.array([1.0, 1.0 - 0.9e-9]), pair), 0.5)
    np.testing.assert_allclose(AUROC(np.array([1.0, 1.0 - 1.1e-9]), pair), 0.0)
    # chaining: neighbours 0.6e-9 apart are linked; the ends, 1.2e-9 apart, are not, yet the
    # three form one group
    chain = 1.0 - np.array([0.0, 0.6e-9, 1.2e-9])
    np.testing.assert_allclose(AUROC(chain, np.array([0, 1, 1])), 0.5)
    np.testing.assert_allclose(AUPR(chain, np.array([0, 1, 1])), 2 / 3)
    np.testing.assert_allclose(AUROC(chain[[0, 2]], np.array([1, 0])), 1.0)


def test_zeros_tie_only_with_zeros():
    labels = np.array([1, 0, 1, 0])
    # the smallest normal number: XLA on CPU flushes subnormals to zero, so they act as zeros
    tiny = np.finfo(np.float64).tiny
    for scores, expect in (
        ([0.0, -0.0, 0.0, 0.0], 0.5),
        ([tiny, 0.0, tiny, 0.0], 1.0),
        ([0.0, tiny, 0.0, -tiny], 0.5),
    ):
        np.testing.assert_allclose(AUROC(np.array(scores), labels), expect)
        np.testing.assert_allclose(expect, roc_auc_score(labels, scores))


def test_float32_scores_tie_within_a_float32_tolerance():
    rng = np.random.default_rng(2)
    exact, labels = _tied_problem(rng, 25)
    exact = exact.astype(np.float32)
    perturbed = exact.copy()
    for i in range(perturbed.size):
        perturbed[i] = np.nextafter(perturbed[i], np.float32(np.inf if i % 2 else -np.inf))
    value = AUROC(jnp.asarray(perturbed), labels, rtol=1e-5)
    assert value.dtype == jnp.float32
    np.testing.assert_allclose(value, roc_auc_score(labels, exact), rtol=1e-6)


def test_eager_jit_vmap_and_scan_agree():
    rng = np.random.default_rng(3)
    problems = [_tied_problem(rng, 8) for _ in range(3)]
    scores = np.stack([_perturb(s, rng) for s, _ in problems])
    labels = np.stack([y for _, y in problems])
    for metric, theirs in (
        (auroc, roc_auc_score),
        (aupr, average_precision_score),
    ):
        expect = [theirs(y, s) for (s, y) in problems]
        for rtol in (1e-9, 0.0):
            eager = np.array([metric(s, y, rtol=rtol) for s, y in zip(scores, labels)])
            if rtol == 0.0:
                expect = [theirs(y, s) for s, y in zip(scores, labels)]
            np.testing.assert_allclose(eager, expect, rtol=0, atol=1e-12)
            batched = jax.jit(jax.vmap(functools.partial(metric, rtol=rtol)))(scores, labels)
            # the same ranks; only the summation order of the AUPR may differ
            np.testing.assert_allclose(batched, eager, rtol=1e-15, atol=0)
    # edge metrics inside lax.scan, as in the active-learning loop
    truth = np.array([[0, 1, 0, 0], [0, 0, 1, 0], [1, 0, 0, 1], [0, 0, 0, 0]])
    probs = np.stack([_perturb(np.where(np.eye(4), 0.0, 0.5), rng) for _ in range(3)])
    probs[:, 0, 2] = 0.9

    def step(carry, p):
        return carry, (jc.experiments.edge_auroc(p, truth), jc.experiments.edge_aupr(p, truth))

    _, (roc, pr) = jax.jit(lambda p: jax.lax.scan(step, 0, p))(probs)
    off = ~np.eye(4, dtype=bool)
    tied = np.where(off, 0.5, 0.0)
    tied[0, 2] = 0.9
    np.testing.assert_allclose(roc, roc_auc_score(truth[off], tied[off]), atol=1e-12)
    np.testing.assert_allclose(pr, average_precision_score(truth[off], tied[off]), atol=1e-12)


# eqx.error_if under jax.jit or vmap (not eqx.filter_jit) surfaces as a JAX runtime error
RAISED = (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError, ValueError)


def test_non_finite_scores_and_bad_rtol_raise():
    labels = jnp.array([1, 0, 1])
    truth = jnp.array([[0, 1], [0, 0]])
    for bad in (jnp.nan, jnp.inf, -jnp.inf):
        scores = jnp.array([0.2, bad, 0.5])
        probs = jnp.array([[0.0, bad], [0.3, 0.0]])
        for metric in (auroc, aupr):
            with pytest.raises(ValueError, match="scores: must be finite"):
                metric(scores, labels)
        for metric in (jc.experiments.edge_auroc, jc.experiments.edge_aupr):
            with pytest.raises(ValueError, match=r"edge_probabilities \(off the diagonal\)"):
                metric(probs, truth)
    # traced: an error on the result, for every kind of non-finite score
    scores = jnp.array([[0.2, jnp.nan, 0.5], [0.2, jnp.inf, 0.5], [-jnp.inf, 0.1, 0.5]])
    for metric in (AUROC, AUPR):
        with pytest.raises(RAISED, match="scores: must be finite"):
            jax.vmap(metric)(scores, jnp.stack([labels] * 3)).block_until_ready()
    edge = eqx.filter_jit(jc.experiments.edge_aupr)
    with pytest.raises(eqx.EquinoxRuntimeError, match="must be finite"):
        edge(jnp.array([[0.0, jnp.nan], [0.3, 0.0]]), truth).block_until_ready()
    # a non-finite diagonal is ignored, as the diagonal is
    np.testing.assert_allclose(edge(jnp.array([[jnp.nan, 0.6], [0.3, 0.0]]), truth), 1.0)
    for rtol in (-1e-9, np.nan, np.inf):
        for metric in (auroc, aupr):
            with pytest.raises(ValueError, match="rtol: must be a finite number >= 0"):
                metric(jnp.array([0.2, 0.5, 0.5]), labels, rtol=rtol)
        with pytest.raises(ValueError, match="rtol: must be a finite number >= 0"):
            jc.experiments.edge_aupr(jnp.eye(2), truth, rtol=rtol)


@pytest.mark.usefixtures("no_runtime_typecheck")
def test_traced_rtol_is_checked():
    # jax.jit traces keyword arguments too
    scores, labels = jnp.array([0.5, 0.5 + 1e-12, 0.2]), jnp.array([0, 1, 1])
    traced = jax.jit(auroc)
    np.testing.assert_allclose(traced(scores, labels, rtol=1e-9), 0.25)
    np.testing.assert_allclose(traced(scores, labels, rtol=0.0), 0.5)
    with pytest.raises(RAISED, match="rtol: must be a finite number >= 0"):
        traced(scores, labels, rtol=-1.0).block_until_ready()


def _paths_with_a_still_node(rng, num=8, jumps=12, horizon=5.0):
    """Trajectories of three binary nodes recorded under do(X0 = 1): X0 never moves, X1 and X2
    flip at random times."""
    initial = np.tile(np.array([1, 0, 1], np.int32), (num, 1))
    state, states = initial.copy(), np.empty((num, jumps, 3), np.int32)
    for i in range(jumps):
        state[np.arange(num), rng.integers(1, 3, num)] ^= 1
        states[:, i] = state
    return jc.Trajectories(
        initial_states=jnp.asarray(initial),
        jump_times=jnp.asarray(np.sort(rng.uniform(0.0, horizon, (num, jumps)), axis=1)),
        states=jnp.asarray(states),
        num_events=jnp.full(num, jumps, jnp.int32),
        durations=jnp.full(num, horizon),
        truncated=jnp.zeros(num, bool),
        intervention_targets=jnp.asarray(np.tile([True, False, False], (num, 1))),
        intervention_states=jnp.asarray(initial * [1, 0, 0]),
    )


def test_edge_marginals_of_a_node_that_never_moves():
    # X0 never moves: adding it to a parent set leaves the marginal likelihood unchanged, and
    # with max_parents = N - 1 every edge out of X0 has posterior probability 1/2 in exact
    # arithmetic (and every edge into it, its own statistics being empty under the clamp); in
    # floating point they come out a few ulp apart (with these paths, exact-equality ties give
    # an AUROC of 0.5 and an AUPR of 0.67 instead of 0.31 and 0.29)
    cards, parents = (2, 2, 2), ((), (0,), (1,))
    truth = jc.experiments.scaled_softmax_ctbn(parents, cards, gamma=3.0, rate_fast=2.0)
    paths = _paths_with_a_still_node(np.random.default_rng(1))
    posterior = jc.learn_structure(paths, truth.names, cards, max_parents=2)
    task = jc.StructureLearningTask(truth, max_parents=2)
    metrics = eqx.filter_jit(task.metrics)(posterior)  # as in the compiled loop
    edges = np.asarray(posterior.edge_marginals())
    adjacency = np.asarray(adjacency_from_parents(parents, 3))
    off = ~np.eye(3, dtype=bool)
    half = off & (np.abs(edges - 0.5) < 1e-12)
    assert half[0, 1:].all() and half[1:, 0].all()  # the 4 edges at X0, true and absent ones
    rounded = np.where(half, 0.5, edges)
    assert np.all(np.abs(rounded[off & ~half] - 0.5) > 1e-6)
    for name, theirs in (("auroc", roc_auc_score), ("aupr", average_precision_score)):
        expect = theirs(adjacency[off], rounded[off])
        np.testing.assert_allclose(metrics[name], expect, rtol=0, atol=1e-12)
