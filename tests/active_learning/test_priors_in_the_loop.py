"""Priors as choices of the loop and the CLI, empirical Bayes, and the initial-state policy."""

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
import scipy.special
from helpers import network_dict, random_model, replay_experiments, sample_trajectories_jit

import jaxctbn as jc
from jaxctbn._cli import main


def _history(key, num_paths=12):
    k1, k2 = jax.random.split(key)
    truth = random_model(k1, (2, 2, 2), ((), (0,), (1,)))
    traj = sample_trajectories_jit(
        truth, jnp.zeros(3, jnp.int32), 3.0, key=k2, num_trajectories=num_paths
    )
    return truth, traj


def _gamma_evidence_numpy(post, log_alpha, log_beta):
    """ln p(H | alpha, beta) from the statistics with scipy only (maths §5): per node, log-sum
    over parent sets of the uniform set prior times the Gamma-Poisson marginal likelihood."""
    total = 0.0
    for n in range(len(post.names)):
        M = np.asarray(post.statistics.transitions[n])  # (sets, configs, k, k)
        T = np.asarray(post.statistics.dwell_times[n])  # (sets, configs, k)
        a, b = (
            np.exp(np.broadcast_to(log_alpha, (len(post.names),))[n]),
            np.exp(np.broadcast_to(log_beta, (len(post.names),))[n]),
        )
        k = M.shape[-1]
        off = ~np.eye(k, dtype=bool)
        Tb = np.broadcast_to(T[..., None], M.shape)
        terms = (
            scipy.special.gammaln(a + M)
            - scipy.special.gammaln(a)
            + a * np.log(b)
            - (a + M) * np.log(b + Tb)
        )
        scores = np.where(off, terms, 0.0).sum((1, 2, 3))
        total += scipy.special.logsumexp(scores) - np.log(len(scores))
    return total


@pytest.mark.parametrize("per_node", [False, True])
def test_empirical_bayes_is_the_maximum_of_the_evidence(per_node, getkey):
    truth, traj = _history(getkey())
    post = jc.learn_structure(traj, truth.names, truth.cardinalities, max_parents=2)
    fit = jax.jit(jc.EmpiricalBayes(per_node=per_node).fit)(post)
    # the library's evidence is the independent formula at any hyper-parameters
    np.testing.assert_allclose(
        float(post.log_evidence()), _gamma_evidence_numpy(post, 0.0, 0.0), rtol=1e-12
    )
    # and the optax fit is the optimum a generic optimiser finds on the scipy formula
    size = 3 if per_node else 1

    def negative(x):
        return -_gamma_evidence_numpy(post, x[:size], x[size:])

    low, high = np.log(1e-3), np.log(1e3)  # EmpiricalBayes' default bounds
    alpha, beta = np.asarray(fit.prior.alpha), np.asarray(fit.prior.beta)
    assert alpha.shape == ((3,) if per_node else ())
    ours = np.concatenate([np.log(alpha).ravel(), np.log(beta).ravel()])
    options = {"ftol": 1e-15, "gtol": 1e-10, "maxiter": 10000}
    refs = [  # from the origin, and polishing ours: neither finds a better point
        scipy.optimize.minimize(
            negative, x0, method="L-BFGS-B", bounds=[(low, high)] * (2 * size), options=options
        )
        for x0 in (np.zeros(2 * size), ours)
    ]
    ref = min(refs, key=lambda r: r.fun)
    assert float(fit.log_evidence()) >= -ref.fun - 1e-5
    # where the optimum is inside the bounds, the hyper-parameters agree (at a bound the
    # evidence is flat along alpha/beta = const, so only the evidence is compared)
    inside = (ref.x > low + 0.1) & (ref.x < high - 0.1)
    inside = inside & np.concatenate([inside[size:], inside[:size]])
    assert inside.any()
    np.testing.assert_allclose(ours[inside], ref.x[inside], atol=2e-3)
    assert float(fit.log_evidence()) >= float(post.log_evidence())
    # the refitted posterior is the posterior rescored under the fitted prior
    again = jc.learn_structure(
        traj, truth.names, truth.cardinalities, max_parents=2, prior=jc.GammaPrior(alpha, beta)
    )
    for a, b in zip(again.log_posterior(), fit.log_posterior()):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_empirical_bayes_nodelman_and_no_data(getkey):
    truth, traj = _history(getkey())
    post = jc.learn_structure(
        traj, truth.names, truth.cardinalities, max_parents=2, prior=jc.NodelmanPrior(1.0, 1.0)
    )
    eb = jc.EmpiricalBayes()
    fit = jax.jit(eb.fit)(post)  # one program (eagerly: one per operation)
    assert float(fit.log_evidence()) > float(post.log_evidence())
    # a generic optimiser on the library's objective does no better

    def negative(x):
        prior = jc.NodelmanPrior(float(np.exp(x[0])), float(np.exp(x[1])))
        return -float(post.with_prior(prior).log_evidence())

    start = np.log([float(fit.prior.alpha), float(fit.prior.tau)])
    ref = scipy.optimize.minimize(negative, start + 0.3, method="Nelder-Mead")
    assert -ref.fun <= float(fit.log_evidence()) + 1e-6
    # without data the evidence is flat (zero) and the hyper-parameters stay put
    empty = eqx.filter_jit(jc.StructurePosterior.from_prior)(
        truth.names, truth.cardinalities, max_parents=2, prior=jc.GammaPrior(2.0, 3.0)
    )
    assert float(empty.log_evidence()) == 0.0
    same = jax.jit(eb.fit)(empty)
    np.testing.assert_allclose([same.prior.alpha, same.prior.beta], [2.0, 3.0], rtol=1e-9)
    with pytest.raises(ValueError, match="bounds"):
        jc.EmpiricalBayes(bounds=(1.0, 0.5))
    with pytest.raises(ValueError, match="per_node"):
        jc.EmpiricalBayes().initial_prior(jc.GammaPrior(jnp.ones(3), 1.0), 3)


def test_empirical_bayes_in_the_loop_refits_after_every_experiment(getkey):
    """With empirical Bayes the loop's posterior is the batch posterior of its paths (replayed
    from the recorded choices, independently of the loop) rescored under the prior fitted to
    them."""
    truth = jc.random_ctbn(getkey(), ((), (0,), (1,)), fast=(False, True, False))
    eb = jc.EmpiricalBayes()
    task = jc.StructureLearningTask(truth, max_parents=2, empirical_bayes=eb)
    key = getkey()
    res = jc.run_active_learning(task, jc.PassiveDesign(), key=key, num_experiments=3)
    paths = replay_experiments(truth, res, 3.0, key)
    np.testing.assert_array_equal(paths.num_events, res.num_events)
    plain = jc.learn_structure(paths, truth.names, truth.cardinalities, max_parents=2)
    refit = jax.jit(eb.fit)(plain)
    np.testing.assert_allclose(res.posterior.prior.alpha, refit.prior.alpha, rtol=1e-4)
    np.testing.assert_allclose(res.posterior.prior.beta, refit.prior.beta, rtol=1e-4)
    np.testing.assert_allclose(res.metrics["entropy"][-1], refit.entropy(), rtol=1e-4)
    assert not np.allclose(res.metrics["entropy"][-1], plain.entropy())  # the fit changed it


def test_initial_state_policies(getkey):
    """Each policy in the loop (one compiled loop per policy type: the arrays of a distribution
    are traced, so a point mass and the uniform distribution share one), what the design sees
    (the state, or the distribution when hidden), and the (V)BHC with a hidden state."""
    truth = jc.random_ctbn(getkey(), ((), (0,)), fast=(False, True))
    task = jc.StructureLearningTask(truth, max_parents=1)
    seen = []

    def spy(posterior, candidates, initial_state, horizon, key):
        seen.append(initial_state.shape)
        return jnp.zeros(candidates.targets.shape[0])

    design = jc.CallableDesign(spy)
    key = getkey()
    fixed = jc.run_active_learning(
        task,
        design,
        key=key,
        num_experiments=4,
        initial_state_policy=jc.FixedInitialState([1, 0]),
    )
    assert (np.asarray(fixed.initial_states) == [1, 0]).all() and seen[-1] == (2,)
    point = np.zeros(4)
    point[2] = 1.0  # the global state (1, 0) in product order
    # hidden: the design sees the distribution; 400 experiments for the frequencies below
    hidden = jc.run_active_learning(
        task,
        design,
        key=key,
        num_experiments=400,
        initial_state_policy=jc.InitialStateDistribution(point),
    )
    assert (np.asarray(hidden.initial_states) == [1, 0]).all() and seen[-1] == (4,)
    # the uniform distribution: frequencies of the drawn states (the same compiled loop)
    many = jc.run_active_learning(
        task,
        design,
        key=key,
        num_experiments=400,
        initial_state_policy=jc.InitialStateDistribution(np.full(4, 0.25)),
    )
    counts = np.bincount(np.asarray(many.initial_states) @ [2, 1], minlength=4)
    assert counts.min() > 60, counts
    # the default (uniform) distribution, and what a revealed or hidden draw shows the design
    uniform = jc.InitialStateDistribution(revealed=True)
    np.testing.assert_allclose(uniform._probabilities((2, 2)), np.full(4, 0.25))
    state = jnp.array([1, 0], jnp.int32)
    np.testing.assert_array_equal(uniform.revealed(state, (2, 2)), state)
    np.testing.assert_allclose(jc.InitialStateDistribution().revealed(state, (2, 2)), 0.25)
    default = jc.run_active_learning(task, design, key=key, num_experiments=4)
    explicit = jc.run_active_learning(
        task, design, key=key, num_experiments=4, initial_state_policy=jc.RandomInitialState()
    )
    np.testing.assert_array_equal(default.initial_states, explicit.initial_states)
    assert len(set(map(tuple, np.asarray(default.initial_states).tolist()))) > 1
    # hidden s0 with the (V)BHC: the design scores the expected statistics of the mixture
    vbhc = jc.run_active_learning(
        task,
        jc.CriterionDesign(jc.VBHC(), num_samples=2),
        key=key,
        num_experiments=2,
        initial_state_policy=jc.InitialStateDistribution(),
    )
    assert np.isfinite(np.asarray(vbhc.metrics["entropy"])).all()
    for policy, message in [
        (jc.FixedInitialState([0, 2]), "node 'X1' has states 0..1"),
        (jc.FixedInitialState([0]), "need 2 node states"),
        (jc.InitialStateDistribution(np.ones(3) / 3), "one per global state"),
    ]:
        with pytest.raises(ValueError, match=message):
            jc.run_active_learning(
                task, design, key=key, num_experiments=1, initial_state_policy=policy
            )
    with pytest.raises(ValueError, match="sum to 1"):
        jc.InitialStateDistribution([0.5, 0.2])


def test_experiment_config_priors():
    base = {"repetitions": 1, "experiments": 1, "designs": ("passive",)}
    with pytest.raises(ValueError, match="parameters learning takes GammaPrior"):
        jc.experiments.ExperimentConfig(target="parameters", prior=jc.NodelmanPrior(), **base)
    with pytest.raises(ValueError, match="empirical_bayes: supported for structure"):
        jc.experiments.ExperimentConfig(
            target="parameters", empirical_bayes=jc.EmpiricalBayes(), **base
        )
    with pytest.raises(ValueError, match="need a scalar or one value per node"):
        jc.experiments.ExperimentConfig(prior=jc.GammaPrior(jnp.ones(3)), **base)
    with pytest.raises(ValueError, match="node 'X2' has states 0..1"):
        jc.experiments.ExperimentConfig(
            initial_state_policy=jc.FixedInitialState([0, 3, 0, 0]), **base
        )


def test_cli_priors_policy_and_old_directories(tmp_path, capsys):
    """`run structure` with the Nodelman prior, per-node values, empirical Bayes and a fixed
    initial state (on the 2-node network of `helpers.network_dict`: the loop with empirical
    Bayes compiles in half the time of the built-in 4-node truth's) writes them to config.json
    and summary.md; a directory of the built-in truth written before these settings existed
    resumes under the defaults (the loop of `run_experiment`'s test in
    tests/active_learning/test_active_learning.py: one repetition of one experiment)."""
    net = tmp_path / "net.json"
    net.write_text(json.dumps(network_dict()))
    out = tmp_path / "run"
    args = ["run", "structure", "--designs", "passive", "--repetitions", "1"]
    args += ["--experiments", "1", "--no-progress", "--out", str(out)]
    extra = ["--prior", "nodelman", "--alpha", "2", "--beta", "0.5,2", "--empirical-bayes"]
    extra += ["--initial-state-policy", "fixed", "--initial-state", "A=1,B=0"]
    assert main([*args, *extra, "--network", str(net)]) == 0
    settings = json.loads((out / "config.json").read_text())
    assert settings["prior"] == "nodelman" and settings["alpha"] == 2.0
    assert settings["beta"] == [0.5, 2.0]
    assert settings["empirical_bayes"]["per_node"] is True
    assert settings["initial_state_policy"] == {"fixed": [1, 0]}
    res = json.loads((out / "results.json").read_text())
    assert (
        "Nodelman(2.0, [0.5, 2.0]) with empirical Bayes (per node)"
        in (out / "summary.md").read_text()
    )
    assert res["settings"]["initial_state_policy"] == {"fixed": [1, 0]}
    assert np.isfinite(res["designs"]["passive"]["metrics"]["entropy"]).all()
    # a directory written before these settings existed resumes under the defaults
    old = tmp_path / "old"
    assert main([*args[:-1], str(old)]) == 0
    cfg = json.loads((old / "config.json").read_text())
    for key in ("prior", "empirical_bayes", "initial_state_policy"):
        cfg.pop(key)
    (old / "config.json").write_text(json.dumps(cfg))
    assert main([*args[:-1], str(old)]) == 0
    timing = json.loads((old / "results.json").read_text())["timing"]
    assert timing["passive"]["repetitions_computed"] == 0  # its chunk reused
    capsys.readouterr()
    for bad, message in [
        (["--alpha", "1,2"], "--alpha: give one value or one per node (4), got 2"),
        (["--initial-state", "X1=1"], "--initial-state: only with --initial-state-policy fixed"),
        (["--beta", "0"], "argument --beta: must be a positive finite number"),
    ]:
        assert main([*args[:-1], str(tmp_path / "bad"), *bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    bad = ["run", "parameters", "--prior", "nodelman", "--out", str(tmp_path / "p")]
    assert main([*bad, "--no-progress"]) == 2
    assert "parameters learning takes GammaPrior" in capsys.readouterr().err


def test_verdicts_from_paired_differences():
    from jaxctbn._experiments.report import summarise, verdicts

    rng = np.random.default_rng(0)
    base = rng.uniform(0.4, 0.6, (30, 4))
    results = {
        "passive": {"auroc": base, "aupr": base, "shd": 3 + base, "entropy": 5 + base},
        "random": {"auroc": base - 0.2, "aupr": base, "shd": 3 + base, "entropy": 5 + base},
        "vbhc": {
            "auroc": base + 0.05 + rng.normal(0, 0.01, base.shape),
            "aupr": base + rng.normal(0, 0.01, base.shape),
            "shd": 3 + base,
            "entropy": 5 + base + 0.3,
        },
    }
    lines = verdicts("structure", summarise("structure", results))
    assert len(lines) == 3 and lines[0].startswith("passive: vs random: AUROC +0.200")
    vbhc = lines[2]
    assert vbhc.startswith("vbhc: vs passive: AUROC +0.05") and "(better)" in vbhc
    assert "AUPR " in vbhc and "(no clear difference)" in vbhc
    # more entropy is worse, more AUROC is better
    assert "structure posterior entropy +0.300 ± 0.000 (worse)" in vbhc
