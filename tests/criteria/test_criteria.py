"""The parameter design criteria (KL, VBHC, BHC, EIG) and the scoring verb for a RatePosterior.

Compilation is most of these tests' time, so each problem is built once per module (fixtures
`binary`, `ternary`, `binary_scores`, `binary_monte_carlo`): one posterior per graph, one
number of posterior draws, one initial state and horizon (arrays, so not static), and "no
intervention" as `Intervention.none` (the same pytree structure as a perfect one): every jitted
verb then compiles once per graph and is reused by the tests."""

import types

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
from helpers import random_model

import jaxctbn as jc
from jaxctbn._criteria.parameter import (
    design_statistics,
    kl_divergence,
    parameter_bhc,
    parameter_eig,
    parameter_eig_nested,
    parameter_vbhc,
    parameter_vbhc_minimise,
    parameter_vbhc_minimiser,
    parameter_vbhc_minimum,
    posterior_draws,
)

#: Posterior draws for the design statistics and the scores (one compiled program for all).
NUM_DRAWS = 8
HORIZON = jnp.asarray(2.0)
CASES = {
    # name: (cardinalities, parents, initial state, the perfect intervention tested)
    "binary": ((2, 2), ((), (0,)), jnp.array([1, 0]), {"X1": 1}),
    "ternary": ((3, 2), ((1,), ()), jnp.array([2, 1]), {"X1": 1}),
}


@eqx.filter_jit
def _history_posterior(key, cards, parents, num_paths=3, alpha=1.0, beta=1.0):
    """A random true model and the Gamma posterior of its rates after `num_paths` paths."""
    k1, k2 = jax.random.split(key)
    truth = random_model(k1, cards, parents)
    traj = jc.sample_trajectories(
        truth, jnp.zeros(len(cards), jnp.int32), 2.0, key=k2, num_trajectories=num_paths
    )
    post = jc.RatePosterior.for_model(truth, prior=jc.GammaPrior(alpha, beta))
    return truth, post.update_with(jc.SufficientStatistics.from_trajectories(traj, cards, parents))


_posterior_draws = eqx.filter_jit(posterior_draws)


def _case(name, seed):
    cards, parents, init, assignment = CASES[name]
    truth, post = _history_posterior(jax.random.key(seed), cards, parents)
    key = jax.random.key(seed + 1)  # the key of the posterior draws (and of the scores)
    draws = _posterior_draws(post, key, NUM_DRAWS)
    ivs = [jc.Intervention.none(len(cards)), jc.Intervention.perfect(truth, assignment)]
    # one compiled program for both
    stats = [design_statistics(post, draws, init, HORIZON, intervention=iv) for iv in ivs]
    return types.SimpleNamespace(
        cards=cards,
        parents=parents,
        init=init,
        truth=truth,
        post=post,
        key=key,
        draws=draws,
        ivs=ivs,
        stats=stats,
    )


@pytest.fixture(scope="module")
def binary():
    return _case("binary", 10)


@pytest.fixture(scope="module")
def ternary():
    return _case("ternary", 20)


@eqx.filter_jit
def _vbhc_routes(post, stats):
    """The VBHC minimum in closed form, by L-BFGS (optax), at the closed-form minimiser, and the
    BHC, for one candidate's statistics: one compiled program per graph."""
    closed = parameter_vbhc_minimum(post, stats)
    value, kappa = parameter_vbhc_minimise(post, stats, jc.LBFGS(steps=100))
    a_star, b_star = parameter_vbhc_minimiser(post, stats)
    at_minimiser = parameter_vbhc(post, stats, a_star, b_star)
    return closed, value, kappa, a_star, at_minimiser, parameter_bhc(post, stats)


# ----------------------------------------------------------------------------- KL
@eqx.filter_jit
def _kl_and_path_statistics(a, b, init, intervention, key):
    """KL(a || a) and KL(a || b) by the library, and the statistics of 20000 paths of `a` for
    the Monte Carlo estimate (one program for every intervention: "none" is an `Intervention`
    too)."""
    kl_self, kl = (kl_divergence(a, m, init, 2.0, intervention=intervention) for m in (a, b))
    traj = jc.sample_trajectories(
        a, init, 2.0, key=key, num_trajectories=20000, intervention=intervention
    )
    stats = jc.SufficientStatistics.from_trajectories(traj, a.cardinalities, a.parents)
    return kl_self, kl, stats


def test_kl_zero_nonnegative_and_monte_carlo(getkey):
    cards, parents = (2, 3), ((1,), (0,))
    a = random_model(getkey(), cards, parents)
    b = random_model(getkey(), cards, parents)
    init = jnp.array([0, 1])
    for iv in [jc.Intervention.none(2), jc.Intervention.perfect(a, {"X0": 1})]:
        kl_self, kl, stats = _kl_and_path_statistics(a, b, init, iv, getkey())
        assert abs(float(kl_self)) < 1e-12
        kl = float(kl)
        assert kl > 0
        # Monte Carlo in numpy: E_{S ~ a}[ln p(S|a) - ln p(S|b)] from sampled path statistics
        llr = 0.0
        for n in range(2):
            if bool(iv.targets[n]):
                continue
            off = ~np.eye(cards[n], dtype=bool)
            la, lb = np.asarray(a.cims[n]), np.asarray(b.cims[n])
            M = np.asarray(stats.nodes[n].transitions)
            T = np.asarray(stats.nodes[n].dwell_times)
            log_ratio = np.where(off, np.log(np.where(off, la / lb, 1.0)), 0.0)
            llr = (
                llr
                + (M * log_ratio).sum((1, 2, 3))
                - (T[..., None] * np.where(off, la - lb, 0.0)).sum((1, 2, 3))
            )
        z = (llr.mean() - kl) / (llr.std() / np.sqrt(len(llr)))
        assert abs(z) < 4, (llr.mean(), kl)


# ----------------------------------------------------------------------------- VBHC
@pytest.mark.parametrize("case", list(CASES))
def test_optax_minimum_equals_closed_form(case, binary, ternary):
    # two graphs (the ternary one: a parent with more configurations than states), each without
    # and with a perfect intervention
    c = {"binary": binary, "ternary": ternary}[case]
    for iv, stats in zip(c.ivs, c.stats):
        closed, value, kappa, a_star, at_minimiser, bhc = _vbhc_routes(c.post, stats)
        assert abs(float(value - closed)) < 1e-6 * abs(float(closed))
        np.testing.assert_allclose(at_minimiser, closed, rtol=1e-12)
        for n, k in enumerate(c.cards):
            off = ~np.eye(k, dtype=bool)
            np.testing.assert_allclose(
                np.asarray(kappa[0][n])[:, off], np.asarray(a_star[n])[:, off], rtol=1e-5
            )
        # BHC is the VBHC at the posterior, never below the minimum
        assert float(bhc) >= float(closed) - 1e-12
        if bool(iv.targets.any()):  # the clamped node (X1) contributes nothing
            assert (
                float(jnp.abs(stats.transitions[1]).sum() + jnp.abs(stats.dwell_times[1]).sum())
                == 0
            )


def test_adam_with_new_learning_rate_does_not_recompile(binary):
    stats = binary.stats[0]

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def run(opt, p, s):
        return parameter_vbhc_minimise(p, s, opt)[0]

    closed = float(_vbhc_routes(binary.post, stats)[0])
    for lr in (0.05, 0.02):
        value = run(jc.Adam(steps=3000, learning_rate=jnp.asarray(lr)), binary.post, stats)
        assert abs(float(value) - closed) < 1e-4 * abs(closed)


def test_adam_start_and_end_losses_from_one_loop_equal_a_plain_optax_loop():
    # Adam evaluates the start's and the end's loss inside its loop (the loss traced once);
    # the numbers are those of a plain optax loop and separate evaluations, to the bit
    import optax

    def loss(p):
        return jnp.sum((p["a"] - 3.0) ** 4) + jnp.log1p(jnp.exp(p["b"]).sum())

    init = {"a": jnp.arange(3.0), "b": jnp.ones(2)}
    steps, lr = 37, 0.05

    def plain(init):
        opt = optax.adam(lr)

        def step(carry, _):
            p, state = carry
            updates, state = opt.update(jax.grad(loss)(p), state, p)
            return (optax.apply_updates(p, updates), state), None

        (p, _), _ = jax.lax.scan(step, (init, opt.init(init)), None, length=steps)
        return loss(p), loss(init), p

    adam = jc.Adam(learning_rate=lr, steps=steps)
    routes = {
        "plain": jax.jit(plain)(init),
        "adam": jax.jit(lambda i: adam.minimise_from_start(loss, i))(init),
        # the generic route of the base class (the loss at the start, then `minimise`)
        "generic": jax.jit(lambda i: jc.AbstractVBHCOptimiser.minimise_from_start(adam, loss, i))(
            init
        ),
    }
    end, start, p = routes["plain"]
    assert float(end) < float(start)
    for name in ("adam", "generic"):
        assert float(routes[name][0]) == float(end) and float(routes[name][1]) == float(start)
        for k in init:
            np.testing.assert_array_equal(routes[name][2][k], p[k])


def test_autodiff_gradient_equals_corrected_analytic_gradient(ternary):
    post, stats = ternary.post, ternary.stats[0]
    # an arbitrary point kappa
    rng = np.random.default_rng(4)
    ka = tuple(jnp.asarray(a * rng.uniform(0.5, 2.0, a.shape)) for a in post.alpha)
    kb = tuple(jnp.asarray(b * rng.uniform(0.5, 2.0, b.shape)) for b in post.beta)
    ga, gb = eqx.filter_jit(
        jax.grad(lambda a, b, p, s: parameter_vbhc(p, s, a, b), argnums=(0, 1))
    )(ka, kb, post, stats)
    # the analytic gradient (maths §3, with the corrections), in numpy and scipy
    for n, k in enumerate(ternary.cards):
        off = ~np.eye(k, dtype=bool)
        a_bar, b_bar = np.asarray(post.alpha[n]), np.asarray(post.beta[n])[..., None]
        m, t = np.asarray(stats.transitions[n]), np.asarray(stats.dwell_times[n])[..., None]
        a_k, b_k = np.asarray(ka[n]), np.asarray(kb[n])[..., None]
        d_alpha = (a_k - a_bar - m) * scipy.special.polygamma(1, a_k) + (b_bar + t - b_k) / b_k
        d_beta = np.where(off, (a_bar + m) / b_k - a_k * (b_bar + t) / b_k**2, 0.0).sum(-1)
        np.testing.assert_allclose(
            np.asarray(ga[n])[:, off], d_alpha[:, off], rtol=1e-8, atol=1e-10
        )
        np.testing.assert_allclose(np.asarray(gb[n]), d_beta, rtol=1e-8, atol=1e-10)


# ------------------------------------------------------------------ EIG (Monte Carlo)
MC_INIT, MC_HORIZON = jnp.array([0, 1]), jnp.asarray(3.0)


@pytest.fixture(scope="module")
def binary_monte_carlo(binary):
    """Without and with a perfect intervention on X0: the VBHC and BHC from 400 posterior draws
    and the EIG as 10 independent estimates of 200 draws each (mean and standard error)."""
    post = binary.post
    ivs = [jc.Intervention.none(2), jc.Intervention.perfect(binary.truth, {"X0": 1})]

    @eqx.filter_jit
    def eig(post, iv, key):
        return jax.vmap(
            lambda k: parameter_eig(
                post, MC_INIT, MC_HORIZON, key=k, num_samples=200, intervention=iv
            )
        )(jax.random.split(key, 10))

    out = []
    for i, iv in enumerate(ivs):
        # the design statistics of 400 draws as the mean over 50 batches of NUM_DRAWS (they are
        # means over the draws): the programs compiled for `binary`, no new shape
        batches = [
            design_statistics(
                post, _posterior_draws(post, key, NUM_DRAWS), MC_INIT, MC_HORIZON, intervention=iv
            )
            for key in jax.random.split(jax.random.key(31), 400 // NUM_DRAWS)
        ]
        stats = jax.tree_util.tree_map(lambda *x: jnp.mean(jnp.stack(x), 0), *batches)
        vbhc, _, _, _, _, bhc = _vbhc_routes(post, stats)
        gains = eig(post, iv, jax.random.key(32 + i))
        se = float(gains.std() / np.sqrt(gains.shape[0]))
        out.append(dict(vbhc=float(vbhc), bhc=float(bhc), eig=float(gains.mean()), se=se))
    return out


def test_eig_below_vbhc_below_bhc(binary_monte_carlo):
    for r in binary_monte_carlo:  # without and with an intervention
        vbhc, bhc, eig, se = r["vbhc"], r["bhc"], r["eig"], r["se"]
        assert vbhc <= bhc + 1e-9
        assert eig <= vbhc + 4 * se + 0.02 * vbhc, (eig, vbhc, bhc)
        assert eig > 0


@pytest.mark.slow
def test_nested_eig_tends_to_eig_from_above(binary, binary_monte_carlo):
    post = binary.post
    bhc, eig = binary_monte_carlo[0]["bhc"], binary_monte_carlo[0]["eig"]

    @eqx.filter_jit
    def nested(post, key):  # K = 1 and K = 30 inner draws, 5 estimates of 200 draws each
        keys = jax.random.split(key, 5)
        return [
            jax.vmap(
                lambda k, K=K: parameter_eig_nested(
                    post, MC_INIT, MC_HORIZON, key=k, num_samples=200, num_inner=K
                )
            )(keys).mean()
            for K in (1, 30)
        ]

    nested = dict(zip((1, 30), (float(x) for x in nested(post, jax.random.key(33)))))
    # K = 1 estimates the BHC; more inner draws come down towards the EIG
    assert abs(nested[1] - bhc) < 0.1 * bhc, (nested, bhc)
    assert eig - 0.05 * eig <= nested[30] < nested[1], (nested, eig)


# ------------------------------------------------------------------ scoring verb
SPACE = jc.intervention_space((2, 2))  # 9 candidates; the last clamps every node


@jax.jit
@eqx.debug.assert_max_traces(max_traces=1)
def _binary_scores(post, key, space, init, horizon):
    """The verb's scores of every candidate by three routes: the closed-form VBHC (default, one
    vmap), the VBHC by L-BFGS, and the BHC in chunks of 4 (which do not divide the 9
    candidates)."""

    def score(**options):
        return jc.score_interventions(
            post, space, init, horizon, key=key, num_samples=NUM_DRAWS, **options
        )

    return dict(
        vbhc=score(),
        optax=score(criterion=jc.VBHC(optimiser=jc.LBFGS(steps=100))),
        bhc_chunked=score(criterion=jc.BHC(), batching=jc.Chunked(4)),
    )


@pytest.fixture(scope="module")
def binary_scores(binary):
    return _binary_scores(binary.post, binary.key, SPACE, binary.init, HORIZON)


def test_scoring_all_interventions(binary, binary_scores):
    scores = binary_scores["vbhc"]
    assert scores.shape == (9,)
    # same key: the same draws (common random numbers) -> identical scores one by one, from
    # design_statistics and the closed-form minimum (VBHC) and the BHC: the chunked BHC equals
    # the candidates one by one as well
    for i in range(9):
        iv = jax.tree_util.tree_map(lambda a: a[i], SPACE)
        st = design_statistics(binary.post, binary.draws, binary.init, HORIZON, intervention=iv)
        closed, *_, bhc = _vbhc_routes(binary.post, st)
        np.testing.assert_allclose(scores[i], closed, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(binary_scores["bhc_chunked"][i], bhc, rtol=1e-12, atol=1e-14)
    # clamping every node leaves nothing to learn
    assert abs(float(scores[-1])) < 1e-12
    # a new history (same shapes) does not recompile (assert_max_traces)
    _, post2 = _history_posterior(jax.random.key(11), binary.cards, binary.parents)
    _binary_scores(post2, binary.key, SPACE, binary.init, HORIZON)
    # the optax route through the same verb gives the same scores
    np.testing.assert_allclose(binary_scores["optax"], scores, rtol=1e-6, atol=1e-9)
    assert bool(jnp.all(binary_scores["bhc_chunked"] >= scores - 1e-9))


def test_scores_invariant_to_relabelling_nodes(ternary):
    # the ternary graph with its node order swapped: (2, 3), X0 -> X1
    post = ternary.post
    post_sw = jc.RatePosterior(
        alpha=post.alpha[::-1],
        beta=post.beta[::-1],
        names=post.names[::-1],
        cardinalities=post.cardinalities[::-1],
        parents=((), (0,)),
    )
    draws_sw = eqx.filter_jit(
        jax.vmap(lambda c0, c1: jc.CTBN(cims=[c1, c0], parents=((), (0,)), names=post_sw.names))
    )(*ternary.draws.cims)
    minimum = eqx.filter_jit(parameter_vbhc_minimum)
    for assignment in [{}, {"X0": 2}, {"X1": 1}]:
        iv = jc.Intervention.perfect(ternary.truth, assignment)
        iv_sw = jc.Intervention(targets=iv.targets[::-1], states=iv.states[::-1])
        a = design_statistics(post, ternary.draws, ternary.init, HORIZON, intervention=iv)
        b = design_statistics(post_sw, draws_sw, ternary.init[::-1], HORIZON, intervention=iv_sw)
        for x, y in zip(a.dwell_times, b.dwell_times[::-1]):
            np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(minimum(post, a), minimum(post_sw, b), rtol=1e-10)


@pytest.mark.usefixtures("no_runtime_typecheck")
def test_criteria_bad_input(getkey, binary):
    truth, post = binary.truth, binary.post
    space = SPACE
    with pytest.raises(TypeError, match="criterion: expected a jaxctbn criterion Module"):
        jc.score_interventions(post, space, jnp.array([0, 0]), 1.0, key=getkey(), criterion="mi")
    with pytest.raises(ValueError, match="num_samples must be a positive integer"):
        jc.score_interventions(post, space, jnp.array([0, 0]), 1.0, key=getkey(), num_samples=0)
    with pytest.raises(ValueError, match="the parameter criteria are linear"):
        jc.score_interventions(
            post,
            space,
            jnp.array([0, 0]),
            1.0,
            key=getkey(),
            criterion=jc.VBHC(estimator=jc.MonteCarlo()),
        )
    with pytest.raises(TypeError, match="posterior: expected"):
        jc.score_interventions(truth, space, jnp.array([0, 0]), 1.0, key=getkey())
    with pytest.raises(ValueError, match="steps must be >= 1"):
        jc.LBFGS(steps=0)
    with pytest.raises(ValueError, match="size must be a positive integer"):
        jc.Chunked(0)


def test_initial_state_distribution(binary):
    # an initial state and the point mass on it give the same design statistics (so the same
    # scores); a mixture is the average of the design statistics of its states (linearity)
    none = binary.ivs[0]
    point = [0.0, 0.0, 1.0, 0.0]  # the state (1, 0) = binary.init
    st = [
        design_statistics(binary.post, binary.draws, p0, HORIZON, intervention=none)
        for p0 in jnp.array([point, [0.25, 0.25, 0.5, 0.0], *np.eye(4)[:3]])
    ]
    for a, b in zip(jax.tree_util.tree_leaves(binary.stats[0]), jax.tree_util.tree_leaves(st[0])):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    for n in range(2):
        for field in ("dwell_times", "transitions"):
            parts = [getattr(s, field)[n] for s in st[1:]]
            ref = 0.25 * parts[1] + 0.25 * parts[2] + 0.5 * parts[3]
            np.testing.assert_allclose(parts[0], ref, rtol=1e-10)
