"""Mean-field inference under panel evidence (`panel_mean_field_statistics`)
against exact forward-backward: equal statistics and bound for a network without edges (with
interventions and missing cells), a lower bound that rises sweep by sweep and converges with
the step size on a coupled network, and the argument errors (structural EM with the
mean-field E-step is checked against the exact route in test_gibbs.py, beside the sampled
E-step, on the same data). Importance sampling with the mean-field proposal
(`sample_panel_paths_by_importance`) against exact forward-backward: every
weight the likelihood without edges; on the coupled network the likelihood and the
statistics within their Monte Carlo errors, closer than the mean field."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import jaxctbn as jc
from jaxctbn._panel.importance import sample_panel_paths_by_importance
from jaxctbn._panel.mean_field import panel_mean_field_statistics

jax.config.update("jax_enable_x64", True)

A = jnp.array([[[-0.8, 0.8], [0.6, -0.6]]])
B = jnp.array(
    [
        [[-1.0, 0.7, 0.3], [0.4, -0.9, 0.5], [0.2, 0.6, -0.8]],
        [[-0.3, 0.2, 0.1], [1.2, -1.5, 0.3], [0.9, 0.4, -1.3]],
    ]
)
C = jnp.array([[[-0.5, 0.5], [1.0, -1.0]], [[-1.5, 1.5], [0.2, -0.2]], [[-0.7, 0.7], [0.7, -0.7]]])
#: A -> B -> C (B ternary), and the same nodes without edges (each node's first CIM row), both
#: padded to one parent per node: the graph is data, so the two share compiled programs
COUPLED = jc.PaddedCTBN.from_ctbn(
    jc.CTBN(cims=[A, B, C], parents=((), (0,), (1,)), names=("A", "B", "C")), max_parents=1
)
EDGELESS = jc.PaddedCTBN.from_ctbn(
    jc.CTBN(cims=[A, B[:1], C[:1]], parents=((), (), ()), names=("A", "B", "C")), max_parents=1
)
VISITS = jnp.array([0.0, 0.7, 1.5, 2.6])
R = 3
#: per trajectory: none; A clamped to 1; C's rates scaled by 2.5 (imperfect)
INTERVENTION = jc.Intervention(
    targets=jnp.array([[False] * 3, [True, False, False], [False] * 3]),
    states=jnp.array([[0, 0, 0], [1, 0, 0], [0, 0, 0]]),
    rate_scales=(jnp.ones(R), jnp.ones(R), jnp.array([1.0, 1.0, 2.5])),
)
EXACT = jc.MatrixExponential()


def _observations(model, key):
    def one(key, intervention, start):
        paths = jc.sample_trajectories(
            model, start, 2.6, key=key, num_trajectories=1, intervention=intervention
        )
        return jax.tree_util.tree_map(lambda x: x[0], paths)

    starts = jnp.array([[0, 1, 0], [1, 1, 0], [0, 2, 1]])
    # (under `jit`: one compilation instead of op-by-op ones)
    paths = jax.jit(jax.vmap(one))(jr.split(key, R), INTERVENTION, starts)
    seen = jc.panel.PanelObservations.from_paths(paths, VISITS)
    states = np.asarray(seen.states).copy()
    states[0, 1, 2] = states[1, 2, 1] = states[2, 0, 0] = -1  # missing cells (one at t0)
    return jc.panel.PanelObservations(seen.times, jnp.asarray(states), intervention=INTERVENTION)


def test_without_edges_the_statistics_and_the_bound_are_exact():
    """No edges: the posterior factorises over the nodes, so the mean-field fixed point is the
    exact posterior: each node's statistics on its own (empty) parent set and the bound equal
    exact forward-backward's to rounding, whatever the step size; on another node's set the
    product law is integrated by steps, its error falling as the square of the step."""
    observations = _observations(EDGELESS, jr.key(4))
    exact = jc.panel.panel_expected_statistics(EDGELESS, observations, solver=EXACT)
    log_likelihood = jc.panel.panel_log_likelihood(EDGELESS, observations, solver=EXACT)

    @eqx.filter_jit  # (one compiled program per statistics type, not op-by-op ones)
    def compared(stats):
        """Each node's statistics on its own set; node 2's pooled on the set (0, 1)."""
        own = [(stats.node_dwell_times(n), stats.node_transitions(n)) for n in range(3)]
        return own, stats.sum().node_transitions(2, (0, 1))

    exact_own, exact_pooled = compared(exact)
    errors = []
    for steps in (8, 32):  # (the coupled network's test uses these step sizes too)
        mf = panel_mean_field_statistics(
            EDGELESS, observations, approximation=jc.panel.PanelMeanField(steps_per_gap=steps)
        )
        np.testing.assert_allclose(mf.evidence_lower_bound, log_likelihood, rtol=1e-11)
        own, pooled = compared(mf)
        for (dwell, transitions), (dwell_exact, transitions_exact) in zip(own, exact_own):
            np.testing.assert_allclose(dwell, dwell_exact, atol=1e-11)
            np.testing.assert_allclose(transitions, transitions_exact, atol=1e-11)
        errors.append(float(jnp.abs(pooled - exact_pooled).max()))
    assert errors[1] < errors[0] / 10 and errors[1] < 1e-3, errors


@eqx.filter_jit  # (one compiled program per statistics type, not op-by-op ones)
def _pooled_dwell_times(stats):
    """Each node's dwell times on its own parents, summed over the trajectories."""
    pooled = stats.sum()
    return [pooled.node_dwell_times(n) for n in range(3)]


def test_coupled_network_a_rising_lower_bound_that_converges_with_the_step():
    """A -> B -> C: the bound stays below the exact log-likelihood of every trajectory, never
    falls from one sweep to the next (coordinate ascent), and settles as the steps shrink; the
    statistics of each node on its true parents stay near the exact ones."""
    observations = _observations(COUPLED, jr.key(5))
    log_likelihood = np.asarray(jc.panel.panel_log_likelihood(COUPLED, observations, solver=EXACT))
    by_sweeps = [
        np.asarray(
            panel_mean_field_statistics(
                COUPLED, observations,
                approximation=jc.panel.PanelMeanField(max_sweeps=s, tolerance=0.0),
            ).evidence_lower_bound
        )
        for s in (1, 2, 3, 12)  # (one compiled program: the sweeps are data)
    ]  # fmt: skip
    assert np.all(np.diff(np.stack(by_sweeps), axis=0) >= -1e-10), by_sweeps
    by_steps = [
        np.asarray(
            panel_mean_field_statistics(
                COUPLED, observations, approximation=jc.panel.PanelMeanField(steps_per_gap=s)
            ).evidence_lower_bound
        )
        for s in (4, 8, 32)
    ]
    for bound in by_steps:
        assert np.all(bound < log_likelihood), (bound, log_likelihood)
        assert np.all(bound > log_likelihood - 1.0)
    assert np.all(np.abs(by_steps[2] - by_steps[1]) < np.abs(by_steps[1] - by_steps[0]))
    exact = jc.panel.panel_expected_statistics(COUPLED, observations, solver=EXACT)
    fitted = panel_mean_field_statistics(COUPLED, observations)
    # started from its own fixed point, a fit stops after the two sweeps it always takes
    again = panel_mean_field_statistics(COUPLED, observations, initial=fitted)
    assert np.all(np.asarray(again.sweeps) == 2) and np.all(np.asarray(fitted.sweeps) > 2)
    np.testing.assert_allclose(again.evidence_lower_bound, fitted.evidence_lower_bound, rtol=1e-8)
    np.testing.assert_allclose(again.dwell_times, fitted.dwell_times, atol=1e-5)
    with pytest.raises(ValueError, match="initial: statistics of shape"):
        panel_mean_field_statistics(
            COUPLED, observations, initial=fitted,
            approximation=jc.panel.PanelMeanField(steps_per_gap=4),
        )  # fmt: skip
    # within 10% of the total time (5.5% measured)
    for T, T_exact in zip(_pooled_dwell_times(fitted), _pooled_dwell_times(exact)):
        assert float(jnp.abs(T - T_exact).sum()) < 0.1 * float(T_exact.sum())


def test_arguments_and_impossible_observations_are_reported():
    for bad in (dict(steps_per_gap=0), dict(max_sweeps=1.5), dict(tolerance=-1.0)):
        with pytest.raises(ValueError, match="PanelMeanField: "):
            jc.panel.PanelMeanField(**bad)
    observations = _observations(EDGELESS, jr.key(4))
    with pytest.raises(ValueError, match="approximation: expected a jaxctbn.panel.PanelMeanField"):
        panel_mean_field_statistics(EDGELESS, observations, approximation="exact")
    with pytest.raises(ValueError, match="observations: a batch of trajectories"):
        panel_mean_field_statistics(EDGELESS, jax.tree_util.tree_map(lambda x: x[0], observations))
    # node A observed in state 0 while clamped to 1: impossible
    states = np.asarray(observations.states).copy()
    states[1, 2, 0] = 0
    clash = jc.panel.PanelObservations(
        observations.times, jnp.asarray(states), intervention=INTERVENTION
    )
    with pytest.raises(Exception, match="impossible under the model"):
        panel_mean_field_statistics(EDGELESS, clash).evidence_lower_bound.block_until_ready()
    entry = np.zeros(observations.times.shape, bool)
    entry[0, 2] = True
    timed = jc.panel.PanelObservations(
        observations.times, observations.states, exact_entry=entry, intervention=INTERVENTION
    )
    with pytest.raises(Exception, match="exact entry times are not supported by mean-field"):
        panel_mean_field_statistics(EDGELESS, timed).evidence_lower_bound.block_until_ready()


# --------------------------------------------------------------------------- importance sampling
#: one sampler for the tests (one compiled program)
SAMPLER = jc.panel.PanelImportanceSampler(num_samples=1000)


@eqx.filter_jit  # (one compiled program per statistics type, not op-by-op ones)
def _on_parents(stats, graph):
    """Per node, `(dwell times, transitions)` per trajectory on its parents in `graph`."""
    return [
        (stats.node_dwell_times(n, p), stats.node_transitions(n, p)) for n, p in enumerate(graph)
    ]


@eqx.filter_jit
def _weighted_statistics(paths, parents, cards):
    """The self-normalised estimates of every node's statistics per trajectory and their
    standard errors: per node, `[(estimate, error)]` for the dwell times and the
    transitions (one compiled program, not op-by-op ones)."""
    R, S = paths.log_weights.shape
    flat = jax.tree_util.tree_map(lambda x: x.reshape((R * S,) + x.shape[2:]), paths.trajectories)
    stats = jc.SufficientStatistics.from_trajectories(flat, cards, parents)
    w = paths.normalised_weights()
    out = []
    for node in stats.nodes:
        out.append([])
        for f in (node.dwell_times, node.transitions):
            f = f.reshape((R, S) + f.shape[1:])
            wb = w.reshape(w.shape + (1,) * (f.ndim - 2))
            estimate = (wb * f).sum(1)
            error = jnp.sqrt((wb**2 * (f - estimate[:, None]) ** 2).sum(1))
            out[-1].append((estimate, error))
    return out


def test_importance_sampling_without_edges_weighs_every_path_by_the_likelihood():
    """No edges: the mean-field proposal is the posterior, so every weight is exactly the
    likelihood p(Y) (interventions and missing cells as above), the effective sample size is
    the number of samples, and systematic resampling keeps every path once."""
    observations = _observations(EDGELESS, jr.key(4))
    log_likelihood = jc.panel.panel_log_likelihood(EDGELESS, observations, solver=EXACT)
    paths = sample_panel_paths_by_importance(EDGELESS, observations, key=jr.key(0), sampler=SAMPLER)
    np.testing.assert_allclose(
        paths.log_weights, jnp.broadcast_to(log_likelihood[:, None], (R, 1000)), rtol=1e-10
    )
    np.testing.assert_allclose(paths.log_likelihood(), log_likelihood, rtol=1e-10)
    np.testing.assert_allclose(paths.effective_sample_size(), 1000.0, rtol=1e-10)
    # the sampled paths meet the observations, and A stays at its clamp in trajectory 1
    seen = jc.panel.PanelObservations.from_paths(
        jax.tree_util.tree_map(lambda x: x.reshape((-1,) + x.shape[2:]), paths.trajectories),
        VISITS,
    )
    observed = np.repeat(np.asarray(observations.states), 1000, axis=0)
    states = np.asarray(seen.states)
    assert np.all((observed < 0) | (states == observed))
    assert np.all(states.reshape(R, 1000, 4, 3)[1, :, :, 0] == 1)
    resampled = paths.resampled(jr.key(1))
    order = np.sort(np.asarray(resampled.jump_times), axis=1)
    np.testing.assert_array_equal(order, np.sort(np.asarray(paths.trajectories.jump_times), 1))


def test_importance_sampling_corrects_the_mean_field_on_a_coupled_network():
    """A -> B -> C with interventions and missing cells: the likelihood estimate lies within
    four standard errors of exact forward-backward's, nearer than the mean-field bound; each
    node's statistics on its true parents are unbiased (z-scores against the exact expected
    statistics: mean square near 1, none beyond 5) and nearer the exact ones than the mean
    field's; the same key gives the same paths."""
    observations = _observations(COUPLED, jr.key(5))
    log_likelihood = np.asarray(jc.panel.panel_log_likelihood(COUPLED, observations, solver=EXACT))
    paths = sample_panel_paths_by_importance(COUPLED, observations, key=jr.key(0), sampler=SAMPLER)
    w = np.exp(np.asarray(paths.log_weights) - log_likelihood[:, None])  # w / p(Y)
    error = w.std(1) / np.sqrt(w.shape[1]) / w.mean(1)  # of ln mean w
    estimate = np.asarray(paths.log_likelihood())
    bound = np.asarray(paths.evidence_lower_bound)
    assert np.all(np.abs(estimate - log_likelihood) < 4 * error), (estimate, log_likelihood)
    # (summed over the trajectories: the bound's gap there is ~6 standard errors of the sum)
    assert abs((estimate - log_likelihood).sum()) < 0.3 * (log_likelihood - bound).sum()
    ess = np.asarray(paths.effective_sample_size())
    assert np.all((ess > 50) & (ess < 1000)), ess
    exact = jc.panel.panel_expected_statistics(COUPLED, observations, solver=EXACT)
    mean_field = panel_mean_field_statistics(COUPLED, observations)
    z, sampled_error, mean_field_error = [], 0.0, 0.0
    graph = ((), (0,), (1,))
    sampled = _weighted_statistics(paths, graph, (2, 3, 2))
    truths, approxs = _on_parents(exact, graph), _on_parents(mean_field, graph)
    for n, (truth, approx) in enumerate(zip(truths, approxs)):
        for (est, se), t, m in zip(sampled[n], truth, approx):
            varies = se > 1e-9  # (a clamped node's dwell time is the same in every path)
            z.append(np.asarray((est - t)[varies] / se[varies]))
            np.testing.assert_allclose(est[~varies], t[~varies], atol=1e-9)
            if n > 0:
                sampled_error += float(jnp.abs(est - t).sum())
                mean_field_error += float(jnp.abs(m - t).sum())
    z = np.concatenate(z)
    assert z.size > 50 and np.mean(z**2) < 2.5 and np.abs(z).max() < 5, (np.mean(z**2), z)
    assert sampled_error < 0.6 * mean_field_error, (sampled_error, mean_field_error)
    again = sample_panel_paths_by_importance(COUPLED, observations, key=jr.key(0), sampler=SAMPLER)
    np.testing.assert_array_equal(again.log_weights, paths.log_weights)


def test_importance_sampling_arguments_and_small_buffers_are_reported():
    for bad in (dict(num_samples=0), dict(max_candidates=1.5), dict(proposal="mean-field")):
        with pytest.raises(ValueError, match="PanelImportanceSampler: "):
            jc.panel.PanelImportanceSampler(**bad)
    observations = _observations(COUPLED, jr.key(5))
    with pytest.raises(
        ValueError, match="sampler: expected a jaxctbn.panel.PanelImportanceSampler"
    ):
        sample_panel_paths_by_importance(
            COUPLED, observations, key=jr.key(0), sampler=jc.panel.GibbsSampler()
        )
    # rates 60 times faster (the same shapes, so the same program): the bridges of a step
    # need more than its 16 candidate times, the paths more than 64 jumps
    fast = jc.PaddedCTBN.from_ctbn(
        jc.CTBN(cims=[60 * A, 60 * B, 60 * C], parents=((), (0,), (1,)), names=("A", "B", "C")),
        max_parents=1,
    )
    with pytest.raises(Exception, match="needed more than max_(events|candidates)"):
        sample_panel_paths_by_importance(
            fast, observations, key=jr.key(0), sampler=SAMPLER
        ).log_weights.block_until_ready()
