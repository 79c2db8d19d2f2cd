"""Imperfect interventions in the criteria, and intervention strengths as a design variable
(maths §8). Independent routes: the path KL under a rate scale against the KL of the scaled
models; the parameter VBHC under a scale against the VBHC of an equivalent experiment written
with the scaled exposure by hand; the gradient in the strength against finite differences;
the optimised strength against a fine grid; EIG <= VBHC <= BHC with scales."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from helpers import random_model

import jaxctbn as jc
from jaxctbn._criteria.parameter import design_statistics, kl_divergence, posterior_draws
from jaxctbn.criteria import Strengths, UncertainStrength

CARDS = (2, 2)
PARENTS = ((), (0,))
INIT = jnp.array([0, 1])
HORIZON = jnp.asarray(2.0)


@pytest.fixture(scope="module")
def problem():
    truth = eqx.filter_jit(random_model)(jr.key(31), CARDS, PARENTS)
    traj = jc.sample_trajectories(truth, INIT, 2.0, key=jr.key(32), num_trajectories=2)

    @eqx.filter_jit  # one program (eagerly: one per operation, ~2 s)
    def posterior(truth, traj):
        stats = jc.SufficientStatistics.from_trajectories(traj, CARDS, PARENTS)
        return jc.RatePosterior.for_model(truth).update_with(stats)

    return truth, posterior(truth, traj), jc.intervention_space(CARDS)


def _one(iv):
    return jax.tree_util.tree_map(lambda a: a[None], iv)


def _row(space, i):
    return jax.tree_util.tree_map(lambda a: a[i], space)


def test_kl_under_a_rate_scale_is_the_kl_of_the_scaled_models(problem):
    truth, _, _ = problem
    other = eqx.filter_jit(random_model)(jr.key(33), CARDS, PARENTS)

    @eqx.filter_jit  # one program (eagerly: one per operation)
    def both(truth, other, scales):
        iv = jc.Intervention.none(2).with_rate_scales(list(scales))
        scaled = kl_divergence(truth, other, INIT, HORIZON, intervention=iv)
        return scaled, kl_divergence(iv.apply(truth), iv.apply(other), INIT, HORIZON)

    for scales in ([1.0, 2.5], [0.3, 1.0], [4.0, 0.5]):
        scaled, direct = both(truth, other, jnp.asarray(scales))
        np.testing.assert_allclose(scaled, direct, rtol=1e-12)


def test_design_statistics_use_the_scaled_exposure(problem):
    """Under a scale s of node 1 the criterion's statistics of node 1 are (E M, s E T) of the
    scaled model: written here from the expected statistics of the scaled model itself."""
    truth, posterior, _ = problem
    draws = eqx.filter_jit(posterior_draws)(posterior, jr.key(2), 5)
    s = 2.7
    iv = jc.Intervention.none(2).with_rate_scales([1.0, s])

    @eqx.filter_jit  # one program (eagerly: one per operation)
    def both(posterior, draws, iv):
        stats = design_statistics(posterior, draws, INIT, HORIZON, intervention=iv)
        # each draw's scaled model solved on its own
        T = jax.vmap(
            lambda model: jc.expected_statistics(iv.apply(model), INIT, HORIZON).node_dwell_times(1)
        )(draws)
        return stats, T

    stats, T = both(posterior, draws, iv)
    np.testing.assert_allclose(stats.dwell_times[1], s * np.mean(T, 0), rtol=1e-10)
    # and the criteria order EIG <= VBHC <= BHC under the scale
    batch = _one(iv)
    key = jr.key(3)
    vbhc = jc.score_interventions(posterior, batch, INIT, HORIZON, key=key, num_samples=20)[0]
    bhc = jc.score_interventions(
        posterior, batch, INIT, HORIZON, criterion=jc.BHC(), key=key, num_samples=20
    )[0]
    eig = jc.score_interventions(
        posterior, batch, INIT, HORIZON, criterion=jc.EIG(num_paths=10), key=key, num_samples=20
    )[0]
    assert eig <= vbhc <= bhc, (eig, vbhc, bhc)
    # a scale per rate has no conjugate exposure: refused with its node named
    table = jnp.ones((2, 2, 2))
    per_rate = jc.Intervention.none(2).with_rate_scales([jnp.ones(()), table])
    with pytest.raises(ValueError, match=r"rate_scales\[1\]: the design criteria"):
        design_statistics(posterior, draws, INIT, HORIZON, intervention=per_rate)


def _score_at(posterior, candidate, strengths, s, key):
    iv = strengths.apply(candidate, jnp.atleast_1d(jnp.asarray(s, float)))
    return jc.score_interventions(posterior, _one(iv), INIT, HORIZON, key=key, num_samples=4)[0]


@pytest.fixture(scope="module")
def optimised(problem):
    _, posterior, space = problem
    strengths = Strengths((1,), [0.2], [5.0], steps=20)
    design = jc.score_interventions(
        posterior, space, INIT, HORIZON, strengths=strengths, key=jr.key(1), num_samples=4
    )
    return strengths, design


def test_strength_gradient_and_the_optimised_strength(problem, optimised):
    """One test (the search is compiled once): the gradient against finite differences, then
    the optimised strengths against a fine grid."""
    _check_gradient(problem, optimised)
    _check_against_a_grid(problem, optimised)


def _check_gradient(problem, optimised):
    _, posterior, space = problem
    strengths, _ = optimised
    candidate = _row(space, 1)  # node 0 clamped to 0, node 1 free

    def score(s):  # one program for the values and the gradient
        return _value_and_grad(posterior, strengths, jnp.asarray(s), candidate)

    for s in (0.4, 1.3, 3.0):
        _, grad = score(s)
        h = 1e-5 * s
        fd = (score(s + h)[0] - score(s - h)[0]) / (2 * h)
        np.testing.assert_allclose(grad, fd, rtol=1e-5)


@eqx.filter_jit
def _value_and_grad(posterior, strengths, s, iv):
    """The score of one candidate at strength s and its derivative in s, compiled once."""
    return jax.value_and_grad(lambda s: _score_at(posterior, iv, strengths, s, jr.key(1)))(s)


def _check_against_a_grid(problem, optimised):
    """Within 1e-3 (relative) of the best of 61 log-spaced strengths, for every candidate that
    leaves node 1 free; candidates clamping it are unchanged by the strength."""
    _, posterior, space = problem
    strengths, design = optimised
    grid = np.exp(np.linspace(np.log(0.2), np.log(5.0), 61))
    score = jax.jit(
        jax.vmap(lambda iv, s: _score_at(posterior, iv, strengths, s, jr.key(1)), in_axes=(None, 0))
    )
    targets = np.asarray(space.targets)
    for i in range(targets.shape[0]):
        values = np.asarray(score(_row(space, i), jnp.asarray(grid)))
        if targets[i, 1]:
            assert not bool(design.free[i])
            np.testing.assert_allclose(values, values[0], rtol=1e-10)
            continue
        assert float(design.scores[i]) >= values.max() - 1e-3 * abs(values.max()), i
        s = float(design.rate_scales[i, 0])
        assert 0.2 - 1e-9 <= s <= 5.0 + 1e-9
        np.testing.assert_allclose(
            _value_and_grad(posterior, strengths, jnp.asarray(s), _row(space, i))[0],
            design.scores[i],
            rtol=1e-10,
        )


def test_strength_errors():
    for low, high, message in [(0.0, 1.0, "low > 0"), (2.0, 1.0, "empty range"),
                               (float("nan"), 1.0, "finite")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            Strengths((0,), [low], [high])
    with pytest.raises(ValueError, match="distinct"):
        Strengths((0, 0), [1.0, 1.0], [2.0, 2.0])


@pytest.mark.parametrize(
    "criterion",
    [
        jc.VBHC(graph_draws=jc.criteria.JointGraphDraws()),
        # the same general route (per-problem exposures) under a second criterion
        pytest.param(jc.EIG(num_paths=3), marks=pytest.mark.slow),
    ],
    ids=["joint", "eig"],
)
def test_structure_scores_with_unit_scales_are_the_perfect_ones(problem, criterion):
    """Scales of 1 take the structure criteria's general route (per problem exposures, no
    clamp-pattern sharing): the same scores as the perfect candidates; a scale changes them."""
    truth, _, space = problem
    traj = jc.sample_trajectories(truth, INIT, 2.0, key=jr.key(34), num_trajectories=2)
    posterior = jc.learn_structure(traj, truth.names, CARDS, max_parents=1)
    C = space.targets.shape[0]
    ones = space.with_rate_scales([jnp.ones(C), jnp.ones(C)])
    key = jr.key(5)

    def score(candidates):
        return jc.score_interventions(
            posterior, candidates, INIT, HORIZON, criterion=criterion, key=key, num_samples=3
        )

    np.testing.assert_allclose(score(ones), score(space), rtol=1e-9, atol=1e-12)
    scaled = space.with_rate_scales([jnp.ones(C), jnp.full(C, 3.0)])
    free = ~np.asarray(space.targets[:, 1])
    assert np.all(np.abs(np.asarray(score(scaled) - score(space)))[free] > 1e-8)


def test_uncertain_strength_scores_average_the_scores_at_the_quantiles(problem):
    """A drug of uncertain effect: the criterion at each posterior quantile of the strength
    equals `score_interventions` at that scale written by hand, the score is their mean, and a
    candidate that clamps the node scores the same at every strength."""
    _, posterior, space = problem
    M0 = jnp.array([[[0.0, 3.0], [5.0, 0.0]], [[0.0, 2.0], [4.0, 0.0]]])
    M1 = 3.0 * M0
    T = jnp.array([[2.0, 1.5], [1.0, 1.2]])
    strength = jc.learn_strength(M0, T, M1, T, alpha=2.0, beta=1.0, low=0.1, high=10.0)
    kwargs = {"key": jr.key(0), "num_samples": 4}
    out = jc.score_interventions(
        posterior,
        space,
        INIT,
        HORIZON,
        strengths=UncertainStrength(1, strength, num_points=3),
        **kwargs,
    )
    s = eqx.filter_jit(lambda strength: strength.quantile(jnp.array([1 / 6, 1 / 2, 5 / 6])))(
        strength
    )
    np.testing.assert_allclose(out.strengths, s, rtol=1e-12)
    assert float(s[0]) < 3.0 < float(s[2])  # the data say s is about 3
    C = space.targets.shape[0]
    for j in range(3):
        by_hand = jc.score_interventions(
            posterior,
            space.with_rate_scales([jnp.ones(C), jnp.full(C, s[j])]),
            INIT,
            HORIZON,
            **kwargs,
        )
        np.testing.assert_allclose(out.scores_at_strengths[:, j], by_hand, rtol=1e-10)
    np.testing.assert_allclose(out.scores, out.scores_at_strengths.mean(1), rtol=1e-12)
    spread = np.ptp(np.asarray(out.scores_at_strengths), axis=1)
    clamps = np.asarray(space.targets[:, 1])
    assert np.all(spread[clamps] < 1e-10) and np.all(spread[~clamps] > 1e-6)
    with pytest.raises(ValueError, match="node: a node index"):
        jc.score_interventions(
            posterior, space, INIT, HORIZON, strengths=UncertainStrength(5, strength), **kwargs
        )


def test_strength_gradient_under_a_panel_outcome(problem):
    """The panel VBHC is a numerical minimum over the variational Gammas (or the BHC where that
    is lower); its derivative in the strength is taken by the envelope theorem (the unrolled
    optimiser would need second derivatives of the Gamma draws, which reverse mode lacks):
    against finite differences of the re-minimised score. Where the BHC is the minimum the two
    agree to rounding; where the minimiser's end point is (no intervention here), to what the
    minimiser's stopping short leaves (a few per cent)."""
    _, posterior, space = problem
    strengths = Strengths((1,), [0.2], [5.0])
    targets = np.asarray(space.targets)
    rows = [0, int(np.flatnonzero(targets[:, 0] & ~targets[:, 1])[0])]
    candidates = jax.tree_util.tree_map(lambda a: a[jnp.asarray(rows)], space)
    outcome = jc.PanelOutcome(jnp.array([0.7, 2.0]))

    def scores(s, criterion):
        batch = jax.vmap(lambda iv: strengths.apply(iv, jnp.atleast_1d(s)))(candidates)
        return jc.score_interventions(
            posterior,
            batch,
            INIT,
            HORIZON,
            criterion=criterion,
            key=jr.key(4),
            num_samples=4,
            outcome=outcome,
        )

    # one compiled program for the VBHC: its Jacobian in s with its value (the finite
    # differences use the values; a forward-only program would be a second compilation)
    vbhc = jax.jit(jax.jacrev(lambda s: (scores(s, jc.VBHC()),) * 2, has_aux=True))
    s = jnp.asarray(2.0)
    bhc = jax.jit(lambda s: scores(s, jc.BHC()))(s)
    grad, value = vbhc(s)
    assert value[0] < bhc[0] - 1e-3, (value, bhc)  # the two branches of the minimum
    np.testing.assert_allclose(value[1], bhc[1], rtol=1e-12)
    h = 1e-4 * s
    fd = (vbhc(s + h)[1] - vbhc(s - h)[1]) / (2 * h)
    assert np.all(np.abs(grad) > 1e-3), grad
    np.testing.assert_allclose(grad[1], fd[1], rtol=1e-6)
    np.testing.assert_allclose(grad[0], fd[0], rtol=3e-2)
