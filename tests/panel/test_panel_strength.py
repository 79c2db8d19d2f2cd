"""Learning an intervention strength from panel data by profile likelihood (maths §8),
through `jaxctbn fit --observation panel --learn-strength`: the estimate against a joint
maximisation over the rates and the strength with scipy's L-BFGS-B, the profile at the
interval's ends against scipy's maximum over the rates at that strength (Wilks' drop), and the
errors. One compiled profile for the module."""

import json

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pandas as pd
import pytest
import scipy.optimize
import scipy.stats
from helpers import network_dict

import jaxctbn as jc
from jaxctbn._cli.main import main
from jaxctbn._panel.strength import scaled_observations

TRUE_STRENGTH = 3.0
NUM_EACH = 12
VISITS = jnp.linspace(0.0, 4.0, 17)


@pytest.fixture(scope="module")
def panel_data(tmp_path_factory):
    """A -> B, NUM_EACH trajectories without and NUM_EACH with B's rates scaled by 3, seen at
    17 visits; the CSV (the scaled ones marked `B*`) and the observations in its order."""
    tmp = tmp_path_factory.mktemp("panel_strength")
    truth = jc.CTBN.from_dict(network_dict())
    init = jnp.zeros(2, jnp.int32)
    iv = jc.Intervention.none(2).with_rate_scales([1.0, TRUE_STRENGTH])
    plain = jc.sample_trajectories(truth, init, 4.0, key=jr.key(1), num_trajectories=NUM_EACH)
    under = jc.sample_trajectories(
        truth, init, 4.0, key=jr.key(2), num_trajectories=NUM_EACH, intervention=iv
    )
    rows = []
    for offset, paths, label in ((0, plain, ""), (100, under, "B*")):
        seen = jc.panel.PanelObservations.from_paths(paths, VISITS)
        for r in range(NUM_EACH):
            for t, (a, b) in zip(np.asarray(seen.times[r]), np.asarray(seen.states[r])):
                rows.append(
                    {"trajectory_id": offset + r, "time": t, "A": a, "B": b, "intervention": label}
                )
    data = tmp / "panel.csv"
    pd.DataFrame(rows).to_csv(data, index=False)
    network = tmp / "net.json"
    network.write_text(json.dumps(network_dict()))
    return truth, data, network


def _joint_objective(truth, observations, scaled):
    """-(panel log-likelihood) as a function of (log free rates, log s), with its gradient."""
    free = [np.asarray(q) > 0 for q in truth.cims]
    sizes = [int(f.sum()) for f in free]

    def model_of(theta):
        cims, start = [], 0
        for f, size in zip(free, sizes):
            rates = jnp.zeros(f.shape).at[np.nonzero(f)].set(jnp.exp(theta[start : start + size]))
            cims.append(rates - jnp.eye(f.shape[-1]) * rates.sum(-1, keepdims=True))
            start += size
        return jc.CTBN(cims=cims, parents=truth.parents, names=truth.names)

    def objective(theta, log_s):
        obs = scaled_observations(observations, 1, scaled, jnp.exp(log_s))
        return -jc.panel.panel_log_likelihood(model_of(theta), obs).sum()

    value_and_grad = jax.jit(jax.value_and_grad(objective, argnums=(0, 1)))
    start = np.log(np.concatenate([np.asarray(q)[f] for q, f in zip(truth.cims, free)]))
    return value_and_grad, start


def test_panel_strength_against_a_joint_maximisation(panel_data, tmp_path, capsys):
    truth, data, network = panel_data
    out = tmp_path / "fit.json"
    args = ["fit", "--data", str(data), "--network", str(network), "--observation", "panel"]
    assert main([*args, "--learn-strength", "B", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    strength = res["strength"]
    assert strength["node"] == "B" and strength["trajectories_scaled"] == NUM_EACH
    assert strength["converged"] and strength["interval_open"] == [False, False]
    lo, hi = strength["interval"]
    assert lo < strength["estimate"] < hi
    assert "strength of B" in capsys.readouterr().out

    # the same observations, in the CSV's order
    observations, ids = jc.panel.PanelObservations.from_dataframe(
        pd.read_csv(data).assign(intervention=np.nan), truth
    )
    scaled = jnp.asarray([tid >= 100 for tid in ids])
    value_and_grad, start = _joint_objective(truth, observations, scaled)

    def maximise(x0, log_s=None):  # over the rates (and log s when not given), from x0
        def f(x):
            theta, ls = (x, log_s) if log_s is not None else (x[:-1], x[-1])
            value, (g_theta, g_s) = value_and_grad(jnp.asarray(theta), jnp.asarray(ls))
            grad = g_theta if log_s is not None else np.append(g_theta, g_s)
            return float(value), np.asarray(grad, float)

        res = scipy.optimize.minimize(f, x0, jac=True, method="L-BFGS-B",
                                      options={"ftol": 1e-15, "gtol": 1e-10, "maxiter": 2000})  # fmt: skip
        return res.x, -res.fun

    # the joint maximum from the true rates and s = 1 (nothing of the command line's answer)
    x, best = maximise(np.append(start, 0.0))
    with capsys.disabled():
        print(f"strength: profile {strength['estimate']:.5f} {strength['interval']}, "
              f"joint L-BFGS-B {np.exp(x[-1]):.5f}")  # fmt: skip
    assert abs(np.log(strength["estimate"]) - x[-1]) < 5e-3
    # the rates fitted at the estimate reach the joint maximum
    assert abs(res["log_likelihood"] - best) < 1e-3
    # Wilks: the profile at each end of the interval is the maximum minus chi2_1(0.95) / 2
    drop = 0.5 * scipy.stats.chi2.ppf(0.95, 1)
    for end in (lo, hi):
        _, at_end = maximise(x[:-1], np.log(end))  # from the joint maximum's rates
        with capsys.disabled():
            print(f"drop at {end:.4f}: {best - at_end:.5f} (Wilks {drop:.5f})")
        assert abs((best - at_end) - drop) < 0.02, (end, best - at_end)

    # errors: one line, exit 2, nothing written
    for flags, message in [
        (["--learn-strength", "Z"], "--learn-strength: unknown node 'Z'"),
        (["--learn-strength", "A"], "no trajectory is marked 'A*'"),
    ]:
        bad = tmp_path / "bad.json"
        assert main([*args, *flags, "--out", str(bad)]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], lines
        assert not bad.exists()


def test_panel_strength_bad_arguments(panel_data):
    truth, _, _ = panel_data
    obs = jc.panel.PanelObservations(jnp.zeros((2, 3)) + jnp.arange(3.0), jnp.zeros((2, 3, 2), int))
    for kwargs, message in [
        ({"low": 0.0}, "0 < low < high"),
        ({"low": 5.0, "high": 2.0}, "0 < low < high"),
        ({"num_points": 3}, "num_points: an integer >= 5"),
        ({"level": 1.0}, "level: a probability"),
        ({"scaled": jnp.ones(3, bool)}, r"scaled: one boolean per trajectory \(2,\)"),
    ]:
        kwargs = {"node": "B", "scaled": jnp.array([True, False]), **kwargs}
        with pytest.raises(ValueError, match=message):
            jc.panel.learn_strength_from_panels(truth, obs, **kwargs)


def test_panel_strength_with_every_trajectory_scaled_is_not_identifiable(panel_data):
    # issue 61: the strength then multiplies every rate of the node the data see, and the
    # profile was flat but for the rates' box (an estimate and a closed interval were reported)
    import equinox as eqx

    truth, data, _ = panel_data
    # the CSV's observations, as the command line reads them: the command line's compiled
    # profile (test_panel_strength_against_a_joint_maximisation), not one of its own (~7 s)
    obs, _ = jc.panel.PanelObservations.from_dataframe(
        pd.read_csv(data).assign(intervention=np.nan), truth
    )
    every = np.ones(obs.times.shape[0], bool)
    with pytest.raises(eqx.EquinoxRuntimeError, match="every trajectory is recorded under"):
        jc.panel.learn_strength_from_panels(truth, obs, node=1, scaled=every)
