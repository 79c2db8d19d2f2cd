"""Inference under panel evidence by Gibbs sampling (`sample_panel_paths`): the
sampled expected statistics against exact forward-backward (z-scores with batch-means errors),
the samples against the observations they are conditioned on, and the argument errors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import jaxctbn as jc
import jaxctbn._panel.gibbs as gibbs_module
from jaxctbn._learning.family_statistics import family_statistics
from jaxctbn._panel.gibbs import SampledPaths, sample_panel_paths, sampled_node_statistics
from jaxctbn._panel.panel_families import panel_family_statistics, sampled_family_statistics

jax.config.update("jax_enable_x64", True)

# A -> B -> C with B ternary; rates of order one over visits about one time unit apart
MODEL = jc.CTBN(
    cims=[
        jnp.array([[[-0.8, 0.8], [0.6, -0.6]]]),
        jnp.array(
            [
                [[-1.0, 0.7, 0.3], [0.4, -0.9, 0.5], [0.2, 0.6, -0.8]],
                [[-0.3, 0.2, 0.1], [1.2, -1.5, 0.3], [0.9, 0.4, -1.3]],
            ]
        ),
        jnp.array(
            [[[-0.5, 0.5], [1.0, -1.0]], [[-1.5, 1.5], [0.2, -0.2]], [[-0.7, 0.7], [0.7, -0.7]]]
        ),
    ],
    parents=((), (0,), (1,)),
    names=("A", "B", "C"),
)
VISITS = jnp.array([0.0, 0.7, 1.5, 2.6])
R = 3
#: independent chains per trajectory: their spread gives the Monte Carlo standard error
CHAINS = 16
SAMPLER = jc.panel.GibbsSampler(
    num_samples=100, burn_in=40, thin=2, max_events=48, max_node_events=16
)


#: per trajectory: none; A clamped to 1; C's rates scaled by 2.5 (imperfect)
INTERVENTION = jc.Intervention(
    targets=jnp.array([[False] * 3, [True, False, False], [False] * 3]),
    states=jnp.array([[0, 0, 0], [1, 0, 0], [0, 0, 0]]),
    rate_scales=(jnp.ones(R), jnp.ones(R), jnp.array([1.0, 1.0, 2.5])),
)


def _tiled(tree, copies):
    return jax.tree_util.tree_map(lambda x: jnp.tile(x, (copies,) + (1,) * (x.ndim - 1)), tree)


@pytest.fixture(scope="module")
def data():
    def one(key, intervention, start):
        paths = jc.sample_trajectories(
            MODEL, start, 2.6, key=key, num_trajectories=1, intervention=intervention
        )
        return jax.tree_util.tree_map(lambda x: x[0], paths)

    starts = jnp.array([[0, 1, 0], [1, 1, 0], [0, 2, 1]])
    # (under `jit`: one compilation instead of op-by-op ones)
    paths = jax.jit(jax.vmap(one))(jr.split(jr.key(4), R), INTERVENTION, starts)
    seen = jc.panel.PanelObservations.from_paths(paths, VISITS)
    states = np.asarray(seen.states).copy()
    # some cells missing (never the whole first row of a node in every trajectory)
    states[0, 1, 2] = states[1, 2, 1] = states[2, 0, 0] = states[2, 3, 1] = -1
    observations = jc.panel.PanelObservations(
        seen.times, jnp.asarray(states), intervention=INTERVENTION
    )
    # CHAINS copies of the R trajectories, each with its own chain (chain-major order)
    copies = jc.panel.PanelObservations(
        _tiled(seen.times, CHAINS),
        _tiled(jnp.asarray(states), CHAINS),
        intervention=_tiled(INTERVENTION, CHAINS),
    )
    samples = sample_panel_paths(MODEL, copies, key=jr.key(7), sampler=SAMPLER)
    return observations, samples


def _z_scores(per_chain, reference):
    """z-scores of the chains' mean against `reference` (entries no chain moves: equal)."""
    chains = np.stack([np.asarray(c) for c in per_chain])
    estimate, se = chains.mean(0), chains.std(0, ddof=1) / np.sqrt(len(per_chain))
    mask = se > 1e-9
    np.testing.assert_allclose(estimate[~mask], np.asarray(reference)[~mask], atol=1e-8)
    return ((estimate - np.asarray(reference)) / np.where(mask, se, 1))[mask]


@eqx.filter_jit  # (one compiled program, not op-by-op ones)
def _pooled_on_parents(stats):
    """Per node, `(transitions, dwell times)` on its parents, summed over the trajectories."""
    pooled = stats.sum()
    return [
        (pooled.node_transitions(n, p), pooled.node_dwell_times(n, p))
        for n, p in enumerate(MODEL.parents)
    ]


def test_sampled_statistics_match_exact_forward_backward(data):
    observations, samples = data
    exact = _pooled_on_parents(jc.panel.panel_expected_statistics(MODEL, observations))
    assert int(samples.infeasible_updates.sum()) == 0
    by_chain = jax.tree_util.tree_map(
        lambda x: x.reshape((CHAINS, R) + x.shape[1:]), samples.trajectories
    )
    stats = jax.jit(
        jax.vmap(lambda t: sampled_node_statistics(t, MODEL.parents, MODEL.cardinalities))
    )(by_chain)
    stats = jax.tree_util.tree_map(np.asarray, stats)  # (sliced in numpy, not op by op)
    per_chain = [jax.tree_util.tree_map(lambda x, c=c: x[c], stats) for c in range(CHAINS)]
    z = []
    for n in range(len(MODEL.parents)):
        for field, reference in zip(("transitions", "dwell_times"), exact[n]):
            z.append(_z_scores([getattr(p[n], field) for p in per_chain], reference))
    z = np.concatenate(z)
    # 34 z-scores (Student t, 15 df: P(|t| > 5) = 1.6e-4 each; standard deviation 1.07): bias
    # within Monte Carlo error (150 samples, keys 1-10 in a script: largest |z| 2.3-4.1, spread
    # 0.6-1.3; 100 samples, keys 7-12: largest |z| 1.6-2.9, spread 0.77-1.41, smallest
    # effective sample size 13.5-34)
    assert np.max(np.abs(z)) < 5.0, np.round(z, 2)
    assert 0.4 < np.std(z) < 1.8, np.std(z)
    ess = np.asarray(eqx.filter_jit(lambda s: s.effective_sample_size())(samples))
    assert ess.shape == (CHAINS * R, 3)
    assert np.all(ess > 10) and np.all(ess <= 2 * SAMPLER.num_samples)


def test_sampled_family_statistics_pool_like_the_exact_ones(data):
    """The structural E-step's statistics (every candidate parent set of every node, node n
    pooled over the trajectories where it is not clamped) against exact forward-backward."""
    observations, samples = data
    sets = tuple(
        jnp.asarray(s, jnp.int32)
        for s in (
            [[-1, -1], [1, -1], [2, -1], [1, 2]],
            [[-1, -1], [0, -1], [2, -1], [0, 2]],
            [[-1, -1], [0, -1], [1, -1], [0, 1]],
        )
    )
    # (the projections and the by-parts routes below under one `jit` each: one compilation
    # instead of ~200 op-by-op ones)
    exact = eqx.filter_jit(
        lambda s: panel_family_statistics(s, sets, intervention_targets=INTERVENTION.targets)
    )(jc.panel.panel_expected_statistics(MODEL, observations))
    by_chain = jax.tree_util.tree_map(
        lambda x: x.reshape((CHAINS, R) + x.shape[1:]), samples.trajectories
    )
    stats = jax.jit(jax.vmap(lambda t: sampled_family_statistics(t, MODEL.cardinalities, sets)))(
        by_chain
    )
    stats = jax.tree_util.tree_map(np.asarray, stats)  # (sliced in numpy, not op by op)
    per_chain = [jax.tree_util.tree_map(lambda x, c=c: x[c], stats) for c in range(CHAINS)]
    # the clamped trajectory adds nothing to A's statistics: A's exposure is two trajectories'
    assert float(exact.dwell_times[0][0].sum()) == pytest.approx(2 * 2.6)
    z = np.concatenate(
        [
            _z_scores([getattr(f, field)[n] for f in per_chain], getattr(exact, field)[n])
            for n in range(3)
            for field in ("transitions", "dwell_times")
        ]
    )
    assert z.size > 100
    assert np.max(np.abs(z)) < 5.0, np.round(z, 2)
    assert 0.4 < np.std(z) < 1.8, np.std(z)
    # one sample at a time, by parts over the jumps, equals one flat batch by segment sums
    few = jax.tree_util.tree_map(lambda x: x[:, :6], samples.trajectories)
    flat = jax.tree_util.tree_map(lambda x: x.reshape((-1,) + x.shape[2:]), few)
    cards = MODEL.cardinalities
    by_sample = jax.jit(lambda t: sampled_family_statistics(t, cards, sets))(few)
    direct = jax.jit(lambda t: family_statistics(t, cards, sets, method="scatter"))(flat)
    for a, b in zip(by_sample.transitions + by_sample.dwell_times,
                    direct.transitions + direct.dwell_times):  # fmt: skip
        np.testing.assert_allclose(6 * np.asarray(a), b, rtol=1e-10, atol=1e-12)


def test_effective_sample_size_of_autoregressive_traces():
    # AR(1) traces x_t = phi x_{t-1} + e_t have ESS = S (1 - phi) / (1 + phi)
    rng = np.random.default_rng(0)
    S, traces = 3000, 8
    for phi in (0.0, 0.5, 0.9):
        x = np.zeros((traces, S, 1))
        for t in range(1, S):
            x[:, t] = phi * x[:, t - 1] + rng.normal(size=(traces, 1))
        paths = SampledPaths(
            trajectories=jc.Trajectories(
                initial_states=jnp.zeros((traces, S, 1), int),
                jump_times=jnp.zeros((traces, S, 1)),
                states=jnp.zeros((traces, S, 1, 1), int),
                num_events=jnp.zeros((traces, S), int),
                durations=jnp.ones((traces, S)),
                truncated=jnp.zeros((traces, S), bool),
                intervention_targets=jnp.zeros((traces, S, 1), bool),
                intervention_states=jnp.zeros((traces, S, 1), int),
            ),
            infeasible_updates=jnp.zeros(traces, int),
            jumps=jnp.asarray(np.round(x * 100).astype(np.int64)),
        )
        ess = np.asarray(paths.effective_sample_size())
        theory = S * (1 - phi) / (1 + phi)
        assert ess.shape == (traces, 1)
        assert abs(ess.mean() / theory - 1) < 0.15, (phi, ess.ravel(), theory)
        # split-R-hat: stationary traces agree with themselves (near 1); a trace whose second
        # half is shifted by 3 stationary deviations does not; both equal the formula by hand
        shifted = x.copy()
        shifted[:, S // 2 :] += 3 * np.sqrt(1 / (1 - phi**2))
        for trace, stationary in ((x, True), (shifted, False)):
            jumps = np.round(trace * 100).astype(np.int64)
            r_hat = np.asarray(
                eqx.tree_at(lambda p: p.jumps, paths, jnp.asarray(jumps)).split_r_hat()
            )
            half = jumps.astype(float).reshape(traces, 2, S // 2)
            w = half.var(2, ddof=1).mean(1)
            b_n = half.mean(2).var(1, ddof=1)
            by_hand = np.sqrt(((S // 2 - 1) / (S // 2) * w + b_n) / w)
            np.testing.assert_allclose(r_hat[:, 0], by_hand, rtol=1e-10)
            assert np.all(r_hat < 1.01) if stationary else np.all(r_hat > 1.1), (phi, r_hat)
    # constant traces: 1; two constant halves that differ: infinite (never NaN)
    flat = eqx.tree_at(lambda p: p.jumps, paths, jnp.full((traces, S, 1), 3))
    assert np.all(np.asarray(flat.split_r_hat()) == 1.0)
    step = np.concatenate([np.zeros((traces, S // 2, 1)), np.ones((traces, S - S // 2, 1))], 1)
    stuck = eqx.tree_at(lambda p: p.jumps, paths, jnp.asarray(step.astype(np.int64)))
    assert np.all(np.isposinf(np.asarray(stuck.split_r_hat())))


def test_samples_agree_with_their_observations(data):
    observations, samples = data
    traj = samples.trajectories  # the first chain of each trajectory: rows 0..R-1
    times = np.asarray(observations.times) - np.asarray(observations.times[:, :1])
    states = np.asarray(observations.states)
    for r in range(R):
        for s in range(0, SAMPLER.num_samples, 41):
            jt = np.asarray(traj.jump_times[r, s])
            n_ev = int(traj.num_events[r, s])
            assert np.all(np.diff(jt[:n_ev]) > 0) and np.all(jt[:n_ev] < times[r, -1])
            for i, t in enumerate(times[r]):
                j = np.searchsorted(jt[:n_ev], t, side="right") - 1
                at = np.asarray(traj.initial_states[r, s] if j < 0 else traj.states[r, s, j])
                seen = states[r, i] >= 0
                np.testing.assert_array_equal(at[seen], states[r, i][seen])
            # one node per jump
            before = np.concatenate(
                [np.asarray(traj.initial_states[r, s])[None], np.asarray(traj.states[r, s])]
            )
            moved = (before[1 : n_ev + 1] != before[:n_ev]).sum(1)
            assert np.all(moved == 1)


def test_sampler_arguments_are_checked(data):
    observations, _ = data
    with pytest.raises(ValueError, match="num_samples must be an integer >= 1"):
        jc.panel.GibbsSampler(num_samples=0)
    with pytest.raises(ValueError, match="burn_in must be an integer >= 0"):
        jc.panel.GibbsSampler(burn_in=-1)
    with pytest.raises(ValueError, match="a batch of trajectories"):
        sample_panel_paths(
            MODEL,
            jc.panel.PanelObservations(VISITS, jnp.zeros((4, 3), int)),
            key=jr.key(0),
        )
    # a whole path, then one node's path, longer than its buffer
    for tiny in (
        jc.panel.GibbsSampler(num_samples=2, burn_in=1, max_events=1),
        jc.panel.GibbsSampler(num_samples=2, burn_in=1, max_node_events=1),
    ):
        with pytest.raises(Exception, match="max_events jumps .or a node more than max_node_"):
            jax.block_until_ready(
                sample_panel_paths(MODEL, observations, key=jr.key(0), sampler=tiny)
            )
    # trajectory 1 clamps A to 1: an observation of A = 0 contradicts it (the last tiny
    # sampler's program, no new one: the clamp's check comes before the buffers')
    states = np.asarray(observations.states).copy()
    states[1, 2, 0] = 0
    with pytest.raises(Exception, match="another state than its intervention's clamp"):
        jax.block_until_ready(
            sample_panel_paths(
                MODEL,
                jc.panel.PanelObservations(
                    observations.times, jnp.asarray(states), intervention=INTERVENTION
                ),
                key=jr.key(0),
                sampler=tiny,
            )
        )


@pytest.mark.slow  # (the sampled structural EM test runs the same sampler and E-step in a loop)
def test_monte_carlo_em_reaches_the_exact_em_optimum():
    # A -> B binary, 40 trajectories seen at 6 visits (some cells missing): EM with the sampled
    # E-step against EM with exact forward-backward, by the panel log-likelihood of the fits
    truth = jc.CTBN(
        cims=[
            jnp.array([[[-0.8, 0.8], [0.6, -0.6]]]),
            jnp.array([[[-0.5, 0.5], [1.0, -1.0]], [[-1.5, 1.5], [0.2, -0.2]]]),
        ],
        parents=((), (0,)),
        names=("A", "B"),
    )
    paths = jc.sample_trajectories(truth, jnp.array([0, 0]), 5.0, key=jr.key(2),
                                   num_trajectories=40)  # fmt: skip
    seen = jc.panel.PanelObservations.from_paths(paths, jnp.linspace(0.0, 5.0, 6))
    states = np.asarray(seen.states).copy()
    states[::4, 2, 0] = states[1::5, 3, 1] = -1
    observations = jc.panel.PanelObservations(seen.times, jnp.asarray(states))
    start = jc.CTBN(
        cims=[jnp.array([[[-1.0, 1.0], [1.0, -1.0]]]), jnp.tile(jnp.array([[-1.0, 1.0], [1.0, -1.0]]), (2, 1, 1))],
        parents=truth.parents,
        names=truth.names,
    )  # fmt: skip
    exact = jc.panel.fit_rates(start, observations, method=jc.panel.EMFit(tolerance=1e-10))
    sampler = jc.panel.GibbsSampler(
        num_samples=20, burn_in=5, max_events=32, max_virtual=40, max_node_events=16
    )
    method = jc.panel.MonteCarloEMFit(iterations=40, sampler=sampler)
    fit = jc.panel.fit_rates(start, observations, method=method, key=jr.key(3))
    assert fit.infeasible_updates is not None and int(fit.infeasible_updates.sum()) == 0
    assert fit.rate_trace is not None and fit.rate_trace[0].shape == (40, 1, 2, 2)
    assert fit.method == "monte-carlo-em" and int(fit.iterations) == 40
    assert fit.log_likelihood is None and fit.converged is None and fit.at_lower_bound is None
    assert int(fit.num_parameters) == int(exact.num_parameters) == 6

    def log_likelihood(model):
        return float(jc.panel.panel_log_likelihood(model, observations).sum())

    best = log_likelihood(exact.model)
    got = log_likelihood(fit.model)
    first = log_likelihood(start)
    # from 10+ nats below to within 0.15 nats of the optimum of EM's exact route
    assert best - first > 10
    assert -1e-6 < best - got < 0.15, (best, got, first)
    # the rates: their Monte Carlo error well inside the exact fit's own standard errors
    se = exact.uncertainty(observations).standard_errors
    for q, r, e in zip(fit.model.cims, exact.model.cims, se):
        off = ~np.eye(2, dtype=bool)
        ratio = np.abs(np.asarray(q) - np.asarray(r))[:, off] / np.asarray(e)[:, off]
        assert np.all(ratio < 0.5), ratio
    with pytest.raises(ValueError, match="iterations: an integer >= 2"):
        jc.panel.MonteCarloEMFit(iterations=1)
    with pytest.raises(ValueError, match="key: MonteCarloEMFit samples paths"):
        jc.panel.fit_rates(start, observations, method=method)
    with pytest.raises(ValueError, match="covariates: not supported with method=MonteCarloEMFit"):
        covariates = jc.panel.Covariates(jnp.arange(40.0)[:, None])
        jc.panel.fit_rates(start, observations, method=method, key=jr.key(0), covariates=covariates)
    with pytest.raises(ValueError, match="this fit: a Monte Carlo EM fit has no likelihood"):
        fit.likelihood_ratio_test(exact)


def test_m_step_is_the_ratio_or_the_conjugate_posterior_mean():
    from jaxctbn._panel.sampled_em import _m_step

    rng = np.random.default_rng(1)
    stats = [
        jc.internal.NodeStatistics(
            transitions=jnp.asarray(rng.poisson(3.0, size=(u, k, k)) * (1 - np.eye(k)), float),
            dwell_times=jnp.asarray(rng.uniform(0.5, 2.0, size=(u, k))),
        )
        for u, k in ((1, 2), (2, 3), (3, 2))
    ]
    for prior in (None, jc.GammaPrior(2.0, 0.5)):
        got = eqx.filter_jit(_m_step)(stats, MODEL, prior)  # (one program, not op by op)
        for st, q in zip(stats, got.cims):
            M, T = np.asarray(st.transitions), np.asarray(st.dwell_times)
            k = M.shape[-1]
            a, b = (0.0, 0.0) if prior is None else (2.0, 0.5)
            rates = (M + a) / (T + b)[..., None] * (1 - np.eye(k))
            expected = rates - np.eye(k) * rates.sum(-1, keepdims=True)
            np.testing.assert_allclose(np.asarray(q), expected, rtol=1e-12)


@eqx.filter_jit  # (one program for every route's posterior; eagerly: one per operation)
def _edges(posterior):
    return posterior.edge_marginals()


def test_structural_em_with_sampled_paths_and_mean_field_reaches_the_exact_routes_graph(
    monkeypatch,
):
    """Structural EM with the Gibbs E-step, the mean-field E-step and the importance-sampling
    E-step against structural EM with exact forward-backward on a chain A -> B -> C seen at 9
    visits: the same MAP graph (the truth), edge probabilities within 0.1, a forbidden edge
    never present, the samplers' diagnostics, a mean-field bound below the exact
    log-likelihood of its model and the importance estimate between the two."""
    truth = jc.experiments.scaled_softmax_ctbn(
        ((), (0,), (1,)), (2, 2, 2), rate_fast=2.0, names=("A", "B", "C")
    )
    # 40 trajectories (60 before: the routes' sampling and EM are most of this test's time, and
    # 40 still give every route the true graph, measured: edges within 0.026 (mean field),
    # 0.006 (importance) and 0.005 (Gibbs) of the exact route's)
    R = 40
    paths = jc.sample_trajectories(
        truth, jr.randint(jr.key(1), (R, 3), 0, 2), 4.0, key=jr.key(2), num_trajectories=R
    )
    observations = jc.panel.PanelObservations.from_paths(paths, jnp.linspace(0.0, 4.0, 9))
    common = dict(max_parents=2, knowledge=jc.PriorKnowledge(forbidden_edges=[(2, 0)]))
    exact = jc.panel.learn_structure_from_panels(observations, truth.names, (2, 2, 2), **common)
    mf = jc.panel.learn_structure_from_panels(
        observations, truth.names, (2, 2, 2), **common, e_step=jc.panel.PanelMeanField()
    )
    assert mf.posterior.map_graph() == exact.posterior.map_graph() == truth.parents
    edges_mf = np.asarray(_edges(mf.posterior))
    assert np.max(np.abs(np.asarray(_edges(exact.posterior)) - edges_mf)) < 0.1
    assert edges_mf[2, 0] == 0.0
    assert mf.converged and mf.log_likelihood is None and exact.evidence_lower_bound is None
    assert mf.evidence_lower_bound is not None and exact.log_likelihood is not None
    assert float(mf.evidence_lower_bound) == float(mf.trace[-1])
    # a lower bound of its own model's log-likelihood, below the exact route's optimum
    assert float(mf.evidence_lower_bound) < float(exact.log_likelihood)
    # importance sampling with the mean-field proposal: the same graph, its likelihood
    # estimate between the bound and (up to Monte Carlo error) the exact optimum. (8 paths
    # per trajectory: the sampling is most of this EM's time. On 60 trajectories, keys 4-6:
    # estimates -720.0, -716.7, -722.0 with 8 paths, -716.7, -716.5, -715.2 with 16, against
    # a bound of -734.6 and an exact optimum of -710.4; edges within 0.004 and 0.011)
    weighted = jc.panel.learn_structure_from_panels(
        observations, truth.names, (2, 2, 2), **common, key=jr.key(4),
        e_step=jc.panel.PanelImportanceSampler(num_samples=8, max_candidates=8),
    )  # fmt: skip
    assert weighted.posterior.map_graph() == truth.parents
    edges_weighted = np.asarray(_edges(weighted.posterior))
    assert np.max(np.abs(np.asarray(_edges(exact.posterior)) - edges_weighted)) < 0.1
    assert edges_weighted[2, 0] == 0.0 and weighted.log_likelihood is None
    # measured (40 trajectories): estimate -463.4, bound -475.5, exact -462.1
    estimate = float(weighted.log_likelihood_estimate)
    assert float(mf.evidence_lower_bound) < estimate < float(exact.log_likelihood) + 1.0
    ess = np.asarray(weighted.effective_sample_size)
    assert ess.shape == (3,) and np.all(ess >= 1) and np.all(ess <= 8)
    assert np.all(np.asarray(weighted.median_effective_sample_size) >= ess)
    assert weighted.split_r_hat is None and weighted.infeasible_updates is None
    with pytest.raises(ValueError, match="e_step: expected ForwardBackward"):
        jc.panel.learn_structure_from_panels(
            observations, truth.names, (2, 2, 2), max_parents=1, e_step="fast"
        )
    emissions = jc.panel.Emissions([jnp.array([[0.9, 0.1], [0.1, 0.9]])] * 3)
    with pytest.raises(ValueError, match=r"emissions: not supported with e_step=PanelMeanField"):
        jc.panel.learn_structure_from_panels(
            observations, truth.names, (2, 2, 2), max_parents=1, e_step=jc.panel.PanelMeanField(),
            emissions=emissions,
        )  # fmt: skip
    # a path buffer and virtual times of 32 are too small for these paths (measured): the
    # E-step doubles those two (not the node buffer) and redoes the step. (The first try is
    # answered here without sampling, to save a compilation.)
    real_e_step, tried = gibbs_module._structure_e_step, []

    def e_step(model, bucket, sampler, *args):
        tried.append(sampler.max_events)
        if sampler.max_events < 64:
            return None, None, 0, jnp.array([True, False, True])
        return real_e_step(model, bucket, sampler, *args)

    monkeypatch.setattr(gibbs_module, "_structure_e_step", e_step)
    sampled = jc.panel.learn_structure_from_panels(
        observations,
        truth.names,
        (2, 2, 2),
        **common,
        # buffers too small for these paths: the E-step grows them. (10 samples per chain:
        # sampling is most of this EM's time; keys 3 and 4 measured: edges within 0.004 and
        # 0.007 of the exact route's, 0.002 and 0.015 with 20 samples)
        e_step=jc.panel.GibbsSampler(
            num_samples=10, burn_in=5, max_events=32, max_virtual=32, max_node_events=16
        ),
        key=jr.key(3),
    )
    assert exact.posterior.map_graph() == sampled.posterior.map_graph() == truth.parents
    edges_exact = np.asarray(_edges(exact.posterior))
    edges_sampled = np.asarray(_edges(sampled.posterior))
    assert np.max(np.abs(edges_exact - edges_sampled)) < 0.1, (edges_exact, edges_sampled)
    assert edges_sampled[2, 0] == 0.0
    assert sampled.converged and sampled.log_likelihood is None
    assert sampled.infeasible_updates == 0
    assert tried[:2] == [32, 64] and set(tried[1:]) == {64}
    assert sampled.sampler is not None and sampled.sampler.max_events == 64
    assert sampled.sampler.max_virtual == 64 and sampled.sampler.max_node_events == 16
    # paths that would need more than the largest buffer: one clear error
    monkeypatch.setattr(
        gibbs_module, "_structure_e_step", lambda *a: (None, None, 0, jnp.ones(3, bool))
    )
    with pytest.raises(ValueError, match="the paths need more than 16384 jumps"):
        jc.panel.learn_structure_from_panels(
            observations, truth.names, (2, 2, 2), max_parents=1, e_step=jc.panel.GibbsSampler(),
            key=jr.key(0),
        )  # fmt: skip
    ess = np.asarray(sampled.effective_sample_size)
    assert ess.shape == (3,) and np.all(ess > 1)
    assert np.all(np.asarray(sampled.median_effective_sample_size) >= ess)
    # (halves of 5 samples: a half whose jump counts never change gives an infinite R-hat)
    r_hat = np.asarray(sampled.split_r_hat)
    assert r_hat.shape == (3,) and np.all(r_hat >= 1.0 - 1e-12)
    with pytest.raises(ValueError, match="key: a PRNG key is needed"):
        jc.panel.learn_structure_from_panels(
            observations, truth.names, (2, 2, 2), max_parents=1, e_step=jc.panel.GibbsSampler()
        )
