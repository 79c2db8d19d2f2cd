"""The structure EIG as a design: in the active-learning loop, and its batched scorer against the
per-path computation it replaces."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import jaxctbn as jc
from jaxctbn._active_learning.initial_states import _random_state
from jaxctbn._criteria.node_divergences import rescorer
from jaxctbn._criteria.structure import structure_draws, structure_eig
from jaxctbn._paths.sampling import sample_trajectory
from jaxctbn._paths.sufficient_statistics import node_statistics


def reference_eig(posterior, draws, initial_state, horizon, *, path_key, num_paths, intervention):
    """The structure EIG (maths §6, Algorithm 4 with the stratum weights) path by path, as it was
    first written: every path a `sample_trajectory`, node n's statistics under each candidate
    set cut from it by `node_statistics`, the sets rescored by the prior's marginal
    likelihood. Same draws and path keys as the batched scorer (`fold_in(path_key, n)`, then one
    key per draw and path), so the two must agree to rounding."""
    cards = posterior.cardinalities
    total = 0.0
    for n, models in enumerate(draws.models):
        sets = posterior.parent_sets[n]
        n_sets, n_samples = models.parent_index[0].shape[:2]
        flat = jax.tree_util.tree_map(lambda a: a.reshape(n_sets * n_samples, *a.shape[2:]), models)
        keys = jr.split(jr.fold_in(path_key, n), (n_sets * n_samples, num_paths))
        M_bar = posterior.statistics.transitions[n]
        T_bar = posterior.statistics.dwell_times[n]
        configs = M_bar.shape[1]
        U = jnp.prod(jnp.where(sets >= 0, jnp.asarray(cards)[jnp.maximum(sets, 0)], 1), axis=-1)
        old = posterior.log_posterior()[n]

        def gain(model, ks, P, n=n, sets=sets, M_bar=M_bar, T_bar=T_bar, configs=configs, U=U):
            def one_path(k):
                path = sample_trajectory(
                    model, initial_state, horizon, key=k, intervention=intervention
                )
                st = jax.vmap(lambda S: node_statistics(path, n, S, cards, num_configs=configs))(
                    sets
                )
                scores = jax.vmap(
                    lambda M, T, Mb, Tb, u: posterior.prior.log_marginal_likelihood(
                        n, Mb + M, Tb + T, u
                    )
                )(st.transitions, st.dwell_times, M_bar, T_bar, U)
                new = jax.nn.log_softmax(posterior.log_prior[n] + scores)
                return new[P] - old[P]

            return jax.vmap(one_path)(ks).mean()

        true_set = jnp.repeat(jnp.arange(n_sets), n_samples)
        gains = jax.vmap(gain)(flat, keys, true_set).reshape(n_sets, n_samples).mean(1)
        keep = (~intervention.targets[n]).astype(gains.dtype)
        total = total + keep * (jnp.exp(old) * gains).sum()
    return total


TRUTH = jc.CTBN(
    cims=[
        jnp.array([[[-1.0, 1.0], [2.0, -2.0]]]),
        jnp.array([[[-0.5, 0.5], [1.0, -1.0]], [[-3.0, 3.0], [0.5, -0.5]]]),
    ],
    parents=((), (0,)),
)


@functools.cache  # one posterior for the module's tests
def _posterior(prior):
    traj = eqx.filter_jit(jc.sample_trajectories)(
        TRUTH, jnp.zeros(2, jnp.int32), 2.0, key=jr.key(3), num_trajectories=2
    )
    return jc.learn_structure(traj, TRUTH.names, TRUTH.cardinalities, max_parents=1, prior=prior)


INIT = jnp.array([0, 1], jnp.int32)
#: one compiled scorer serves the reference test and the loop test (same shapes and settings)
CRITERION, NUM_SAMPLES, BATCHING = jc.EIG(num_paths=2), 3, jc.Chunked(3)


def test_batched_eig_equals_path_by_path_reference():
    # the scorer batches candidates x draws x paths into one sampling loop per chunk, keeps only
    # the paths' statistics, skips the chunks of candidates that clamp a node and looks the
    # lgamma terms up in a table: none of that may change a number
    post = _posterior(jc.GammaPrior())
    space = jc.intervention_space(post.cardinalities)  # 9 candidates; per node 3 leave it free
    horizon, key = jnp.asarray(2.0), jr.key(11)
    scores = jc.score_interventions(
        post,
        space,
        INIT,
        horizon,
        key=key,
        num_samples=NUM_SAMPLES,
        criterion=CRITERION,
        batching=BATCHING,  # per node: one chunk of 3 computed, two skipped
    )
    k_draws, k_paths = jr.split(key)
    draws = structure_draws(post, k_draws, NUM_SAMPLES)
    expected = eqx.filter_jit(
        jax.vmap(
            lambda post, draws, iv, k_paths: reference_eig(
                post, draws, INIT, horizon, path_key=k_paths, num_paths=2, intervention=iv
            ),
            in_axes=(None, None, 0, None),
        )
    )(post, draws, space, k_paths)
    np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-12)
    clamps_all = np.asarray(space.targets).all(1)
    assert np.all(np.asarray(scores)[clamps_all] == 0.0)  # nothing left to learn
    assert float(jnp.abs(expected[~clamps_all]).min()) > 1e-6  # real numbers were compared

    # `structure_eig`, one candidate per call, gives the same numbers (one compiled program)
    def single(i, horizon=horizon):
        iv = jax.tree_util.tree_map(lambda a: a[i], space)
        return structure_eig(
            post, draws, INIT, horizon, path_key=k_paths, num_paths=2, intervention=iv
        )

    for i in range(space.targets.shape[0]):
        np.testing.assert_allclose(single(i), scores[i], rtol=1e-10, atol=1e-12)
    # only the paths' statistics are kept, but a path longer than max_events (default 256) is
    # still an error: here in a long experiment (the horizon is traced: the same program)
    with pytest.raises(eqx.EquinoxRuntimeError, match="more than 256 jumps"):
        single(0, horizon=jnp.asarray(1000.0))


class _UntabulatedGamma(jc.GammaPrior):
    """The Gamma prior, but not recognised as such: the rescoring takes the generic route."""


def test_tabulated_rescoring_equals_the_priors_marginal_likelihood():
    post = _posterior(jc.GammaPrior())
    generic = eqx.tree_at(lambda p: p.prior, post, _UntabulatedGamma(1.0, 1.0))
    max_events = 16
    M = jr.randint(jr.key(0), (50, 2, 2, 2, 2), 0, max_events + 1) * (1 - jnp.eye(2, dtype=int))
    T = jr.uniform(jr.key(1), (50, 2, 2, 2), maxval=3.0)
    M = M.astype(T.dtype)

    @eqx.filter_jit
    def both_routes(post, generic, M, T):  # every node, the tabulated and the generic rescoring
        return [
            [jax.vmap(rescorer(p, n, max_events))(M, T) for p in (post, generic)] for n in range(2)
        ]

    for fast, slow in both_routes(post, generic, M, T):
        np.testing.assert_allclose(fast, slow, rtol=0, atol=1e-12)


def test_eig_design_in_the_loop_picks_the_argmax_of_its_scores():
    task = jc.StructureLearningTask(TRUTH, max_parents=1)
    key, horizon = jr.key(5), jnp.asarray(3.0)
    design = jc.CriterionDesign(CRITERION, num_samples=NUM_SAMPLES, batching=BATCHING)
    result = jc.run_active_learning(task, design, key=key, num_experiments=2, horizon=horizon)

    # the loop's first step by hand: the same keys, initial state and posterior
    @eqx.filter_jit
    def first_step(task, key):
        k_init, k_design, _ = jr.split(jr.split(key, 2)[0], 3)
        return _random_state(k_init, TRUTH.cardinalities), k_design, task.initial_posterior()

    initial_state, k_design, posterior = first_step(task, key)
    np.testing.assert_array_equal(result.initial_states[0], initial_state)
    scores = jc.score_interventions(
        posterior,
        jc.intervention_space(TRUTH.cardinalities),
        initial_state,
        horizon,
        key=k_design,
        num_samples=NUM_SAMPLES,
        criterion=CRITERION,
        batching=BATCHING,
    )
    best = int(jnp.argmax(scores))
    assert np.sort(np.asarray(scores))[-2] < scores[best] - 1e-6  # a clear winner, not a tie
    assert int(result.intervention_index[0]) == best
    assert 0 <= int(result.intervention_index[1]) < 9
