"""Rate posteriors from panel data (`panel_rate_posterior`, maths §7): the Gamma of smoothed
expected statistics against importance sampling of the exact posterior (prior draws weighted by
the exact panel likelihood, numpy), against the exact complete-path posterior as the visits
become dense, and the active-learning loop with panel outcomes against a replay."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import sample_trajectories_jit, state_at

import jaxctbn as jc
from jaxctbn._active_learning.designs import design_from_name
from jaxctbn._panel.rate_families import MomentMatchedGamma
from jaxctbn._panel.rate_posterior import panel_rate_posterior

jax.config.update("jax_enable_x64", True)

TRUTH = jc.CTBN(cims=[jnp.array([[[-0.8, 0.8], [1.5, -1.5]]])], parents=((),), names=("A",))


def _panel(paths, grid):
    """The state of each path at every grid time, as a flat batch of panel observations."""
    states = np.stack([np.asarray(state_at(paths, t)) for t in grid], axis=1)  # (R, O, 1)
    R = states.shape[0]
    return jc.panel.PanelObservations(np.broadcast_to(grid, (R, len(grid))), states)


def _importance_sampling(observations, grid, num_draws=400_000):
    """Mean and standard deviation of the exact posterior of the two rates of TRUTH's node
    under the Gam(2, 1) prior: prior draws weighted by the exact panel likelihood of the
    2-state chain (numpy); and the effective sample size."""
    rng = np.random.default_rng(1)
    lam = rng.gamma(2.0, 1.0, size=(num_draws, 2))  # rates 0->1, 1->0
    s = lam.sum(1)
    y = np.asarray(observations.states)[..., 0]
    log_w = np.zeros(len(lam))
    for row in y:
        for h, x0, x1 in zip(np.diff(grid), row[:-1], row[1:]):
            leave = lam[:, x0] / s * (1 - np.exp(-s * h))
            log_w += np.log(leave if x1 != x0 else 1 - leave)
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    mean = w @ lam
    return mean, np.sqrt(w @ (lam - mean) ** 2), 1 / np.sum(w**2)


@pytest.mark.parametrize("subjects, visits", [(20, 13), (6, 5)])
def test_panel_posterior_against_importance_sampling(subjects, visits):
    # the approximation's error, measured (maths §7): with visits every third of a time unit
    # (rates 0.8 and 1.5: well inside the mixing time) the means agree to 3% and the spreads to
    # within 35%; with visits every time unit (longer than the mixing time, where a panel says
    # little about each rate) it is markedly too confident (spread below half the exact) and
    # its means are off by up to 30%
    horizon = 4.0
    paths = sample_trajectories_jit(
        TRUTH,
        jnp.zeros((subjects, 1), jnp.int32),
        horizon,
        key=jax.random.key(0),
        num_trajectories=subjects,
    )
    grid = np.linspace(0.0, horizon, visits)
    observations = _panel(paths, grid)
    prior = jc.RatePosterior.for_model(TRUTH, prior=jc.GammaPrior(2.0, 1.0))
    approx = panel_rate_posterior(prior, observations, family=MomentMatchedGamma())
    a = np.asarray(approx.alpha[0])[0, [0, 1], [1, 0]]
    b = np.asarray(approx.beta[0])[0]
    mean, sd = a / b, np.sqrt(a) / b
    exact_mean, exact_sd, ess = _importance_sampling(observations, grid)
    assert ess > 10_000
    if visits == 13:
        np.testing.assert_allclose(mean, exact_mean, rtol=0.03)
        assert np.all((sd > 0.65 * exact_sd) & (sd <= exact_sd))
    else:
        np.testing.assert_allclose(mean, exact_mean, rtol=0.3)
        assert np.all(sd < 0.5 * exact_sd)


def test_particle_filter_one_subject_at_a_time_against_importance_sampling():
    # the sequential loop's posterior family: the sparse case above (6 subjects, visits every
    # time unit, where the moment-matched Gamma has less than half the exact spread) fed to
    # the particle filter one subject at a time, as the loop feeds experiments: its mixture
    # of Gammas has the exact means and spreads (importance sampling of the whole batch),
    # within its Monte Carlo error
    subjects, horizon = 6, 4.0
    paths = sample_trajectories_jit(
        TRUTH,
        jnp.zeros((subjects, 1), jnp.int32),
        horizon,
        key=jax.random.key(0),
        num_trajectories=subjects,
    )
    grid = np.linspace(0.0, horizon, 5)
    observations = _panel(paths, grid)
    exact_mean, exact_sd, _ = _importance_sampling(observations, grid)
    prior = jc.RatePosterior.for_model(TRUTH, prior=jc.GammaPrior(2.0, 1.0))
    family = jc.panel.ParticleFilter(num_particles=1000)
    step = jax.jit(lambda p, o, k: panel_rate_posterior(p, o, family=family, key=k))
    posterior = family.initial(prior)
    for r in range(subjects):
        one = jax.tree_util.tree_map(lambda a: a[r : r + 1], observations)
        posterior = step(posterior, one, jax.random.key(r))
    assert isinstance(posterior, jc.GammaMixturePosterior) and posterior.num_components == 1000
    # (one program for the mixture's moments; eagerly: one per operation)
    mean, sd = eqx.filter_jit(lambda p: (p.rate_means()[0], p.rate_sds()[0]))(posterior)
    mean = np.asarray(mean)[0, [0, 1], [1, 0]]
    sd = np.asarray(sd)[0, [0, 1], [1, 0]]
    # Monte Carlo error of 1,000 particles: ~0.05 exact s.d. in the means (8,000 agree to 1%)
    np.testing.assert_allclose(mean, exact_mean, atol=0.15 * exact_sd.min())
    np.testing.assert_allclose(sd, exact_sd, rtol=0.1)
    with pytest.raises(ValueError, match="key: ParticleFilter draws"):
        panel_rate_posterior(prior, observations, family=family)
    with pytest.raises(ValueError, match="resample_below"):
        jc.panel.ParticleFilter(resample_below=2.0)


def test_path_draws_grow_their_candidate_bound_outside_jit(monkeypatch):
    # a bridge over a gap needs more uniformisation times than a bound of 1 (here 2): the eager verb
    # doubles the bound and redoes the update, giving exactly the update of the first bound
    # that suffices (the same keys; that bound's program, run again, gives the same numbers,
    # and the bound of 1 raises an error naming max_candidates), for the rate and the
    # structure filters alike
    from jaxctbn._panel import path_statistics, rate_posterior, structure_posterior

    paths = sample_trajectories_jit(
        TRUTH, jnp.zeros((3, 1), jnp.int32), 0.25, key=jax.random.key(0), num_trajectories=3
    )
    observations = _panel(paths, np.array([0.0, 0.25]))
    rate_prior = jc.RatePosterior.for_model(TRUTH, prior=jc.GammaPrior(2.0, 1.0))
    structure_prior = eqx.filter_jit(  # one program (eagerly: one per operation)
        lambda: jc.StructurePosterior.from_prior(
            ("A",), (2,), max_parents=0, prior=jc.GammaPrior(2.0, 1.0)
        )
    )()
    ran = []

    def recorded(run, family, *, inputs=None):
        out, grown = path_statistics.with_candidate_growth(run, family, inputs=inputs)
        with pytest.raises(Exception, match="max_candidates: a sampled path needed more than 1 "):
            jax.block_until_ready(run(family))
        ran.append((grown, run(grown)))
        return out, grown

    monkeypatch.setattr(rate_posterior, "with_candidate_growth", recorded)
    monkeypatch.setattr(structure_posterior, "with_candidate_growth", recorded)
    cases = [
        (rate_prior, jc.panel.ParticleFilter, panel_rate_posterior),
        (structure_prior, jc.panel.StructureParticleFilter, jc.panel.panel_structure_posterior),
    ]
    for prior, filter_, verb in cases:
        start = filter_(num_particles=8, max_candidates=1)
        out = verb(prior, observations, family=start, key=jax.random.key(3))
        grown, again = ran.pop()
        assert type(grown) is filter_ and grown.max_candidates > 1
        assert isinstance(out, jc.GammaMixturePosterior | jc.StructureMixturePosterior)
        for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(again)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_dense_visits_give_the_complete_path_posterior():
    R, horizon = 4, 3.0
    paths = sample_trajectories_jit(
        TRUTH, jnp.zeros((R, 1), jnp.int32), horizon, key=jax.random.key(3), num_trajectories=R
    )
    grid = np.linspace(0.0, horizon, 301)
    prior = jc.RatePosterior.for_model(TRUTH, prior=jc.GammaPrior(2.0, 1.0))
    approx = panel_rate_posterior(prior, _panel(paths, grid), family=MomentMatchedGamma())
    exact = eqx.filter_jit(  # one program (eagerly: one per operation, ~2 s)
        lambda prior, paths: prior.update_with(
            jc.SufficientStatistics.from_trajectories(paths, TRUTH.cardinalities, TRUTH.parents)
        )
    )(prior, paths)
    np.testing.assert_allclose(approx.beta[0], exact.beta[0], rtol=0.01)
    off = ~np.eye(2, dtype=bool)
    np.testing.assert_allclose(
        np.asarray(approx.alpha[0])[0][off], np.asarray(exact.alpha[0])[0][off], rtol=0.03
    )


def _panel_of_experiment(paths, e, grid):
    """Experiment `e` of replayed paths as a panel seen at `grid`, read off in numpy."""
    path = jax.tree_util.tree_map(lambda x: x[e : e + 1], paths)
    states = np.stack([np.asarray(state_at(path, t)) for t in grid], axis=1)
    return jc.panel.PanelObservations(
        grid[None],
        states,
        intervention=jc.Intervention(
            targets=path.intervention_targets, states=path.intervention_states
        ),
    )


@eqx.filter_jit  # (one program; eagerly: one per operation)
def _mse(posterior, truth):
    return posterior.mse(truth)


def test_loop_with_panel_outcomes_equals_a_replay():
    # the compiled loop observes each experiment at 0, 1 and 3 and updates by the panel
    # posterior; replayed from its recorded choices, with the panels read off the paths in
    # numpy, the same posterior results. The moment-matched loop designs with a design that
    # says it assumes complete paths (it runs in the panel loop and scores as the complete-path
    # criterion does); the particle filter's loop with the panel BHC
    from helpers import network_dict, replay_experiments

    truth = jc.CTBN.from_dict(network_dict())
    outcome = jc.PanelOutcome(jnp.array([1.0, 3.0]))
    task = jc.ParameterLearningTask(truth, outcome=outcome, panel_iterations=4)
    design = jc.CriterionDesign(jc.BHC(), num_samples=3, outcome=outcome)
    path_design = design_from_name("bhc-path", num_samples=3, outcome=outcome)
    assert path_design == jc.CriterionDesign(
        jc.BHC(), num_samples=3, outcome=outcome, assume_complete_path=True
    )
    key = jax.random.key(0)
    result = jax.jit(
        lambda k: jc.run_active_learning(task, path_design, key=k, num_experiments=2, max_events=64)
    )(key)
    paths = replay_experiments(truth, result, 3.0, key)
    np.testing.assert_array_equal(paths.num_events, result.num_events)
    posterior = task.initial_posterior()
    grid = np.array([0.0, 1.0, 3.0])
    for e in range(2):
        observations = _panel_of_experiment(paths, e, grid)
        posterior = panel_rate_posterior(posterior, observations, family=MomentMatchedGamma(4))
    for a, b in zip(result.posterior.alpha, posterior.alpha):
        np.testing.assert_allclose(a, b, rtol=1e-10)
    np.testing.assert_allclose(result.metrics["mse"][-1], _mse(posterior, truth), rtol=1e-10)
    # the path-assuming design scores as the complete-path criterion does (one program)
    space = jc.intervention_space(truth.cardinalities)
    init = jnp.array([0, 0])
    by_path, by_criterion = eqx.filter_jit(
        lambda posterior: (
            path_design.scores(posterior, space, init, 3.0, key),
            jc.CriterionDesign(jc.BHC(), num_samples=3).scores(posterior, space, init, 3.0, key),
        )
    )(task.initial_posterior())
    np.testing.assert_array_equal(by_path, by_criterion)
    # the default family, the particle filter, in the loop with the panel BHC: the same
    # replay, each update with the key the loop folds from the experiment's path key
    filtered = jc.ParameterLearningTask(
        truth, outcome=outcome, panel_posterior=jc.panel.ParticleFilter(num_particles=16)
    )
    result = jax.jit(
        lambda k: jc.run_active_learning(filtered, design, key=k, num_experiments=2, max_events=64)
    )(key)
    paths = replay_experiments(truth, result, 3.0, key)
    posterior = filtered.initial_posterior()
    for e in range(2):
        path_key = jax.random.split(jax.random.split(key, 2)[e], 3)[2]
        posterior = panel_rate_posterior(
            posterior,
            _panel_of_experiment(paths, e, grid),
            family=filtered.panel_family(),
            key=jax.random.fold_in(path_key, 0x7570),
        )
    assert isinstance(result.posterior, jc.GammaMixturePosterior)
    for a, b in zip(result.posterior.alpha, posterior.alpha):
        np.testing.assert_allclose(a, b, rtol=1e-10)
    np.testing.assert_allclose(result.posterior.log_weights, posterior.log_weights, rtol=1e-10)
    np.testing.assert_allclose(result.metrics["mse"][-1], _mse(posterior, truth), rtol=1e-10)
    with pytest.raises(ValueError, match="give both the same outcome"):
        jc.run_active_learning(
            jc.ParameterLearningTask(truth), design, key=key, num_experiments=1, max_events=64
        )


@pytest.mark.slow
def test_loop_with_chosen_visit_times_equals_a_replay():
    # PanelOutcome(num_visits=2): the design chooses each experiment's visit times with its
    # candidate; the loop records them and learns from the panel at those times. The first
    # choice equals score_interventions' for the same key; replayed at the recorded times, the
    # same posterior results; a design that does not choose times observes at equal spacing
    from helpers import network_dict, replay_experiments

    truth = jc.CTBN.from_dict(network_dict())
    outcome = jc.PanelOutcome(num_visits=2, steps=5)
    task = jc.ParameterLearningTask(truth, outcome=outcome, panel_iterations=4)
    design = jc.CriterionDesign(jc.BHC(), num_samples=3, outcome=outcome)
    key = jax.random.key(2)
    start = jc.FixedInitialState([0, 0])  # what the design sees (a clamp changes the path's)
    result = jax.jit(
        lambda k: jc.run_active_learning(
            task, design, key=k, num_experiments=2, max_events=64, initial_state_policy=start
        )
    )(key)
    times = np.asarray(result.observation_times)
    assert times.shape == (2, 2) and np.all(times > 0) and np.all(times <= 3.0)
    k_design = jax.random.split(jax.random.split(key, 2)[0], 3)[1]
    first = jc.score_interventions(
        task.initial_posterior(),
        jc.intervention_space(truth.cardinalities),
        jnp.array([0, 0]),
        3.0,
        outcome=outcome,
        criterion=jc.BHC(),
        key=k_design,
        num_samples=3,
    )
    index = int(np.argmax(first.scores))
    assert index == int(result.intervention_index[0])
    np.testing.assert_allclose(times[0], first.times[index], rtol=1e-12)
    paths = replay_experiments(truth, result, 3.0, key)
    posterior = task.initial_posterior()
    for e in range(2):
        observations = _panel_of_experiment(paths, e, np.concatenate([[0.0], times[e]]))
        posterior = panel_rate_posterior(posterior, observations, family=MomentMatchedGamma(4))
    for a, b in zip(result.posterior.alpha, posterior.alpha):
        np.testing.assert_allclose(a, b, rtol=1e-10)
    space = jc.intervention_space(truth.cardinalities)
    _, passive_times = jc.PassiveDesign().choose_with_times(
        posterior, space, jnp.array([0, 0]), jnp.asarray(3.0), key, outcome=outcome
    )
    np.testing.assert_allclose(passive_times, [1.5, 3.0], rtol=1e-15)
    with pytest.raises(ValueError, match="give both the same outcome"):
        jc.run_active_learning(
            task,
            jc.CriterionDesign(jc.BHC(), outcome=jc.PanelOutcome(num_visits=3)),
            key=key,
            num_experiments=1,
            max_events=64,
        )
    with pytest.raises(ValueError, match="observation_times: the task observes"):
        task.update(task.initial_posterior(), jax.tree_util.tree_map(lambda a: a[0], paths))


@pytest.mark.slow  # the loop with panel outcomes: test_loop_with_panel_outcomes_equals_a_replay
def test_structure_loop_with_panel_outcomes_equals_a_replay():
    # structure learning: the compiled loop observes each experiment at 0, 1 and 3, designs
    # with the panel structure BHC and updates by structural EM from the history; replayed
    # from its recorded choices with the panels read off the paths in numpy: the same posterior
    from helpers import network_dict, replay_experiments

    truth = jc.CTBN.from_dict(network_dict())
    outcome = jc.PanelOutcome(jnp.array([1.0, 3.0]))
    task = jc.StructureLearningTask(truth, max_parents=1, outcome=outcome, panel_iterations=3)
    design = jc.CriterionDesign(jc.BHC(), num_samples=3, outcome=outcome)
    key = jax.random.key(1)
    result = jax.jit(
        lambda k: jc.run_active_learning(task, design, key=k, num_experiments=2, max_events=64)
    )(key)
    paths = replay_experiments(truth, result, 3.0, key)
    posterior = task.initial_posterior()
    grid = np.array([0.0, 1.0, 3.0])
    for e in range(2):
        observations = _panel_of_experiment(paths, e, grid)
        posterior = jc.panel.panel_structure_posterior(
            posterior, observations, family=jc.panel.StructuralEM(3)
        )
    for a, b in zip(result.posterior.log_posterior(), posterior.log_posterior()):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    # each node learns from the experiments that leave it free: 3 time units of each
    free = (~np.asarray(result.targets)).sum(0)
    for n in range(2):
        np.testing.assert_allclose(np.sum(posterior.statistics.dwell_times[n][0]), 3.0 * free[n])
    np.testing.assert_allclose(result.metrics["entropy"][-1], posterior.entropy(), rtol=1e-9)


def test_structure_loop_with_the_particle_filter_equals_a_replay():
    # the structure loop's default panel family, the particle filter: the compiled loop
    # designs with the panel structure BHC on the filter's mixture and updates it with the key
    # the loop folds from each experiment's path key; replayed from its recorded choices with
    # the panels read off the paths in numpy: the same particles, weights and metrics. The
    # path-assuming design scores the mixture's moment-matched posterior.
    from helpers import network_dict, replay_experiments

    truth = jc.CTBN.from_dict(network_dict())
    outcome = jc.PanelOutcome(jnp.array([1.0, 3.0]))
    family = jc.panel.StructureParticleFilter(num_particles=8)
    task = jc.StructureLearningTask(truth, max_parents=1, outcome=outcome, panel_posterior=family)
    assert jc.StructureLearningTask(truth, max_parents=1, outcome=outcome).panel_family() == (
        jc.panel.StructureParticleFilter()
    )
    design = jc.CriterionDesign(jc.BHC(), num_samples=3, outcome=outcome)
    key = jax.random.key(1)
    result = jax.jit(
        lambda k: jc.run_active_learning(task, design, key=k, num_experiments=2, max_events=64)
    )(key)
    assert isinstance(result.posterior, jc.StructureMixturePosterior)
    paths = replay_experiments(truth, result, 3.0, key)
    # (under `jit`: one program each instead of op-by-op ones)
    posterior = eqx.filter_jit(lambda t: t.initial_posterior())(task)
    grid = np.array([0.0, 1.0, 3.0])
    for e in range(2):
        path_key = jax.random.split(jax.random.split(key, 2)[e], 3)[2]
        posterior = jc.panel.panel_structure_posterior(
            posterior,
            _panel_of_experiment(paths, e, grid),
            family=family,
            key=jax.random.fold_in(path_key, 0x7570),
        )
    np.testing.assert_allclose(result.posterior.log_weights, posterior.log_weights, rtol=1e-10)
    for a, b in zip(
        result.posterior.components.statistics.dwell_times,
        posterior.components.statistics.dwell_times,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-10)
    entropy, edges, log_post, moment_matched = eqx.filter_jit(
        lambda p: (
            p.entropy(),
            p.edge_marginals(),
            jax.vmap(lambda c: c.log_posterior())(p.components),
            p.moment_matched(),
        )
    )(posterior)
    np.testing.assert_allclose(result.metrics["entropy"][-1], entropy, rtol=1e-9)
    edges = np.asarray(edges)
    assert np.all((edges >= 0) & (edges <= 1))
    # each particle's node learns from the experiments that leave it free: 3 time units each
    free = (~np.asarray(result.targets)).sum(0)
    for n in range(2):
        totals = np.asarray(posterior.components.statistics.dwell_times[n][:, 0]).sum((1, 2))
        np.testing.assert_allclose(totals, 3.0 * free[n])
    # the entropy over whole graphs by enumeration against a brute-force numpy sum
    log_post = [np.asarray(lp) for lp in log_post]
    w = np.exp(np.asarray(posterior.log_weights))
    p_graph = np.array(
        [
            [w @ (np.exp(log_post[0][:, i]) * np.exp(log_post[1][:, j])) for j in range(2)]
            for i in range(2)
        ]
    )
    np.testing.assert_allclose(entropy, -np.sum(p_graph * np.log(p_graph)), rtol=1e-10)
    # the path-assuming design runs in the panel loop, scoring the moment-matched posterior
    path_design = design_from_name("bhc-path", num_samples=3, outcome=outcome)
    space = jc.intervention_space(truth.cardinalities)
    init = jnp.array([0, 0])
    np.testing.assert_array_equal(
        path_design.scores(posterior, space, init, 3.0, key),
        jc.CriterionDesign(jc.BHC(), num_samples=3).scores(moment_matched, space, init, 3.0, key),
    )
    with pytest.raises(ValueError, match="moment_matched"):
        jc.CriterionDesign(jc.BHC(), num_samples=3).scores(posterior, space, init, 3.0, key)
    with pytest.raises(ValueError, match="panel_iterations: give either"):
        jc.StructureLearningTask(
            truth, max_parents=1, outcome=outcome, panel_posterior=family, panel_iterations=3
        )
    with pytest.raises(ValueError, match="empirical_bayes"):
        jc.StructureLearningTask(
            truth, max_parents=1, outcome=outcome, empirical_bayes=jc.EmpiricalBayes()
        )


def test_sampled_structure_path_sampler_is_checked():
    with pytest.raises(ValueError, match="path_sampler: expected None"):
        jc.panel.SampledStructure(path_sampler="gibbs")  # pyright: ignore[reportArgumentType]
    prior = jc.StructurePosterior.from_prior(("A",), (2,), max_parents=0)
    observations = jc.panel.PanelObservations.from_sequences(
        [np.array([0.0, 1.0])], [np.zeros((2, 1), int)]
    )
    emissions = jc.panel.Emissions([np.array([[0.9, 0.1], [0.1, 0.9]])])
    family = jc.panel.SampledStructure(path_sampler=jc.panel.GibbsSampler())
    pair = jc.StructurePosterior.from_prior(("A", "B"), (2, 2), max_parents=1)
    two = jc.panel.PanelObservations.from_sequences([np.array([0.0, 1.0])], [np.zeros((2, 2), int)])
    small = jc.panel.SampledStructure(path_sampler=jc.panel.GibbsSampler(), blanket_bounds=(0, 0))
    with pytest.raises(ValueError, match=r"blanket_bounds: \(0, 0\) is below"):
        jc.panel.panel_structure_posterior(pair, two, family=small, key=jax.random.key(0))
    with pytest.raises(ValueError, match="emissions: not supported with path_sampler"):
        jc.panel.panel_structure_posterior(
            prior, observations, family=family, key=jax.random.key(0), emissions=emissions
        )
