"""The public verbs are compiled once per structure (issue 34): a second call with new values of
the same shapes (a new horizon as a Python float, a new initial state, new rates, new data, a new
key) compiles nothing, and the best and the worst VBHC design share one compiled loop.

Compilations are counted from JAX's own log (`jax_log_compiles`: one "Finished XLA compilation"
record per program handed to XLA, persistent-cache hits included), and every test checks that
its first call does compile, so a counter that sees nothing cannot pass a test.
"""

import contextlib
import logging

import jax
import jax.numpy as jnp
import numpy as np
from helpers import random_model

import jaxctbn as jc

CARDS, PARENTS = (2, 2, 2), ((), (0,), (1,))


class _Compiles(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.names: list[str] = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Finished XLA compilation of "):
            self.names.append(message.removeprefix("Finished XLA compilation of ").split(" in ")[0])


@contextlib.contextmanager
def _count_compiles():
    """Yields the list of the programs compiled inside the block (block until the results are
    ready inside it)."""
    handler = _Compiles()
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles(True):
            yield handler.names
    finally:
        logger.removeHandler(handler)


def _compiles(fn) -> list[str]:
    with _count_compiles() as names:
        jax.block_until_ready(fn())
    return names


def _first_then_nothing(first, second):
    """`first()` compiles (so the counter works); `second()` afterwards compiles nothing."""
    compiled = _compiles(first)
    assert compiled, "the first call compiled nothing: the counter sees no compilation"
    assert _compiles(second) == []


def _models(getkey, cards=CARDS, parents=PARENTS):
    return random_model(getkey(), cards, parents), random_model(getkey(), cards, parents)


def test_expected_statistics_compiles_once(getkey, no_runtime_typecheck):
    """Python lists are not `ArrayLike` to the type checker, but users pass them."""
    model, other = _models(getkey)
    iv = jc.Intervention(targets=jnp.array([False, True, False]), states=jnp.array([0, 1, 0]))
    iv2 = jc.Intervention(targets=jnp.array([False, True, False]), states=jnp.array([0, 0, 0]))
    _first_then_nothing(
        lambda: jc.expected_statistics(model, [0, 1, 0], 1.0, intervention=iv).dwell_times,
        lambda: jc.expected_statistics(other, [1, 1, 0], 2.5, intervention=iv2).dwell_times,
    )
    # an integer horizon, a distribution as a Python list: still traced
    p0 = np.full(8, 1 / 8)
    p1 = np.arange(1.0, 9.0) / 36
    _first_then_nothing(
        lambda: jc.expected_statistics(model, p0.tolist(), 2).final_marginal,
        lambda: jc.expected_statistics(other, p1.tolist(), 3).final_marginal,
    )


def test_expected_statistics_batch_compiles_once(getkey, no_runtime_typecheck):
    model, other = _models(getkey)

    def stack(*trees):
        return jax.tree_util.tree_map(lambda *a: jnp.stack(a), *trees)

    def solve(models, initial_states, horizon):
        return jc.expected_statistics_batch(models, initial_states, horizon).dwell_times

    _first_then_nothing(
        lambda: solve(stack(model, other), [[0, 0, 0], [1, 0, 1]], 1.0),
        lambda: solve(stack(other, model), [[1, 1, 0], [0, 0, 1]], 0.25),
    )


def test_marginals_compiles_once(getkey, no_runtime_typecheck):
    model, other = _models(getkey)
    _first_then_nothing(
        lambda: jc.marginals(model, [0, 1, 0], [0.0, 0.5, 2.0]),
        lambda: jc.marginals(other, [1, 1, 1], [0.1, 0.1, 1.0]),
    )


def test_panel_log_likelihood_compiles_once(getkey, no_runtime_typecheck):
    model, other = _models(getkey)
    obs = jc.panel.PanelObservations.from_sequences(
        [[0.0, 0.4, 0.9], [0.0, 0.5]],
        [[[0, 1, 1], [-1, 0, -1], [1, -1, 0]], [[1, 0, 0], [-1, 1, 1]]],
    )
    new = jc.panel.PanelObservations.from_sequences(
        [[0.1, 0.3, 1.9], [0.0, 0.7]],
        [[[1, 1, 1], [-1, 1, -1], [0, -1, 0]], [[1, 0, 1], [0, 1, 1]]],
    )
    jax.block_until_ready((obs, new))
    _first_then_nothing(
        lambda: jc.panel.panel_log_likelihood(model, obs),
        lambda: jc.panel.panel_log_likelihood(other, new),
    )
    # the initial distribution as a Python list: traced, not baked into the program
    _first_then_nothing(
        lambda: jc.panel.panel_log_likelihood(model, obs, initial_distribution=[1 / 8] * 8),
        lambda: jc.panel.panel_log_likelihood(
            other, new, initial_distribution=(np.arange(1.0, 9.0) / 36).tolist()
        ),
    )


def test_run_active_learning_compiles_once(getkey):
    truth, other = _models(getkey)
    task = jc.StructureLearningTask(truth, max_parents=1)
    new_task = jc.StructureLearningTask(other, max_parents=1)

    def run(task, key, horizon):
        return jc.run_active_learning(
            task, jc.RandomDesign(), key=key, num_experiments=2, horizon=horizon, max_events=64
        ).metrics

    _first_then_nothing(lambda: run(task, getkey(), 1.0), lambda: run(new_task, getkey(), 1.5))


def test_best_and_worst_vbhc_share_one_loop(getkey):
    truth = random_model(getkey(), (2, 2), ((), (0,)))
    task = jc.ParameterLearningTask(truth)
    key = getkey()

    def run(worst):
        design = jc.CriterionDesign(jc.VBHC(), num_samples=2, worst=worst)
        return jc.run_active_learning(task, design, key=key, num_experiments=1, max_events=64)

    results = {}

    def first():
        results[False] = run(False)
        return results[False]

    def second():
        results[True] = run(True)
        return results[True]

    _first_then_nothing(first, second)
    # the same key, so the same revealed initial state: the worst design picks another candidate
    # (that it is the argmin of the VBHC: tests/active_learning/test_active_learning.py)
    np.testing.assert_array_equal(results[True].initial_states, results[False].initial_states)
    assert int(results[True].intervention_index[0]) != int(results[False].intervention_index[0])
    # the flag is a value (a NumPy boolean: traced, hashable), read on the host as before
    assert isinstance(jc.CriterionDesign(jc.VBHC(), worst=True).worst, np.bool_)
    assert bool(jc.CriterionDesign(jc.VBHC(), worst=True).worst) is True
    assert bool(jc.CriterionDesign(jc.VBHC()).worst) is False
