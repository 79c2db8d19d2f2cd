"""Learning an unknown intervention strength from complete paths (maths §8): the posterior
against quadrature of the rates' integrals with scipy, the frequentist coverage of its 95%
interval over simulated repetitions, and `jaxctbn fit --learn-strength` end to end."""

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pandas as pd
import pytest
import scipy.integrate
import scipy.special
from helpers import network_dict

import jaxctbn as jc
from jaxctbn._cli.main import main
from jaxctbn._learning.strength import learn_strength


def test_strength_posterior_against_quadrature():
    M0 = np.array([[[0.0, 3.0], [5.0, 0.0]]])
    T0 = np.array([[2.0, 1.5]])
    M1 = np.array([[[0.0, 7.0], [9.0, 0.0]]])
    T1 = np.array([[1.0, 0.8]])
    alpha, beta = 2.0, 1.0
    posterior = learn_strength(M0, T0, M1, T1, alpha=alpha, beta=beta, low=0.05, high=50.0)

    def log_marginal(s):  # each rate's integral over the Gamma prior, by quadrature
        total = 0.0
        for x, y in [(0, 1), (1, 0)]:
            m0, m1, t0, t1 = M0[0, x, y], M1[0, x, y], T0[0, x], T1[0, x]

            def f(lam):
                log_prior = alpha * np.log(beta) - scipy.special.gammaln(alpha)
                log_prior += (alpha - 1) * np.log(lam) - beta * lam
                return np.exp(log_prior + (m0 + m1) * np.log(lam) + m1 * np.log(s)
                              - lam * (t0 + s * t1))  # fmt: skip

            total += np.log(scipy.integrate.quad(f, 0, np.inf, epsabs=0, epsrel=1e-12)[0])
        return total

    grid = np.asarray(posterior.log_strengths)[::50]
    values = np.array([log_marginal(np.exp(g)) for g in grid])
    density = np.asarray(posterior.log_density)[::50]
    bulk = values > values.max() - 12
    np.testing.assert_allclose(
        (values - values.max())[bulk], (density - density.max())[bulk], atol=1e-7
    )


def _sample_scaled(key, num, alpha, beta, low, high):
    """A truth drawn from the prior (every rate Gam(alpha, beta), log s uniform on [low,
    high]), and `num` unscaled and `num` scaled (node 1 by s) trajectories' statistics of
    node 1."""
    k_rates, k_scale, k0, k1 = jr.split(key, 4)
    cims = []
    for i, shape in enumerate([(1, 2, 2), (2, 2, 2)]):
        rates = jr.gamma(jr.fold_in(k_rates, i), alpha, shape) / beta
        rates = rates * (1 - jnp.eye(2))
        cims.append(rates - jnp.eye(2) * rates.sum(-1, keepdims=True))
    truth = jc.CTBN(cims=cims, parents=((), (0,)), names=("A", "B"))
    scale = jnp.exp(jr.uniform(k_scale, (), minval=jnp.log(low), maxval=jnp.log(high)))
    init = jnp.zeros(2, jnp.int32)
    iv = jc.Intervention.none(2).with_rate_scales([jnp.ones(()), scale])
    plain = jc.sample_trajectories(truth, init, 2.0, key=k0, num_trajectories=num)
    under = jc.sample_trajectories(truth, init, 2.0, key=k1, num_trajectories=num, intervention=iv)
    out = []
    for traj in (plain, under):
        st = jc.SufficientStatistics.from_trajectories(traj, (2, 2), ((), (0,))).nodes[1].sum()
        out += [st.transitions, st.dwell_times]
    return scale, out


def test_strength_interval_is_calibrated():
    """Truths drawn from the prior (rates Gam(2, 1), log s uniform on [0.1, 10]), 4 + 4 paths
    each: the exact posterior's 95% interval covers the true strength in 95% of 400
    repetitions on average (checked within 0.92-0.98), and the posterior mean of ln s is
    unbiased over the prior (the errors average 0 within their Monte Carlo error)."""
    keys = jr.split(jr.key(7), 400)
    sample = eqx.filter_jit(jax.vmap(lambda k: _sample_scaled(k, 4, 2.0, 1.0, 0.1, 10.0)))
    scales, (M0, T0, M1, T1) = sample(keys)
    posterior = eqx.filter_jit(
        jax.vmap(
            lambda a, b, c, d: learn_strength(
                a, b, c, d, alpha=2.0, beta=1.0, low=0.1, high=10.0, num_points=1001
            )
        )
    )(M0, T0, M1, T1)
    intervals = np.asarray(jax.vmap(lambda p: p.interval(0.95))(posterior))
    scales = np.asarray(scales)
    covered = (intervals[:, 0] <= scales) & (scales <= intervals[:, 1])
    print(f"coverage of the 95% interval: {covered.mean():.3f}")
    assert 0.92 <= covered.mean() <= 0.98
    errors = np.asarray(jax.vmap(lambda p: p.mean_log())(posterior)) - np.log(scales)
    assert abs(errors.mean()) < 3 * errors.std() / np.sqrt(400)


def test_fit_learn_strength_end_to_end(tmp_path, capsys):
    truth = jc.CTBN.from_dict(network_dict())
    network = tmp_path / "net.json"
    network.write_text(json.dumps(network_dict()))
    init = jnp.zeros(2, jnp.int32)
    iv = jc.Intervention.none(2).with_rate_scales([1.0, 3.0])
    plain = jc.sample_trajectories(truth, init, 3.0, key=jr.key(1), num_trajectories=40)
    under = jc.sample_trajectories(
        truth, init, 3.0, key=jr.key(2), num_trajectories=40, intervention=iv
    )
    frames = []
    for offset, traj, label in ((0, plain, ""), (1000, under, "B*")):
        path = tmp_path / "part.csv"
        traj.write_csv(path, truth)
        df = pd.read_csv(path)
        df["trajectory_id"] += offset
        df["intervention"] = label if label else np.nan
        frames.append(df)
    data = tmp_path / "data.csv"
    pd.concat(frames).to_csv(data, index=False)
    out = tmp_path / "fit.json"
    args = ["fit", "--data", str(data), "--network", str(network), "--prior", "gamma"]
    assert main([*args, "--learn-strength", "B", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    strength = res["strength"]
    assert strength["node"] == "B" and strength["trajectories_scaled"] == 40
    lo, hi = strength["interval"]
    assert lo < 3.0 < hi and lo < strength["estimate"] < hi
    assert "strength of B" in capsys.readouterr().out
    # the rates of B at the estimate: (alpha - 1 + M) / (beta + T0 + s T1), alpha = beta = 1
    stats = [
        jc.SufficientStatistics.from_trajectories(t, (2, 2), ((), (0,))).nodes[1].sum()
        for t in (plain, under)
    ]
    M = np.asarray(stats[0].transitions + stats[1].transitions)
    T = np.asarray(stats[0].dwell_times + strength["estimate"] * stats[1].dwell_times)
    fitted = jc.CTBN.from_dict(res["network"])
    np.testing.assert_allclose(np.asarray(fitted.cims[1])[0, 0, 1], M[0, 0, 1] / (1 + T[0, 0]))
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


@pytest.mark.parametrize("low, high", [(0.0, 1.0), (2.0, 1.0)])
def test_learn_strength_bad_range(low, high):
    z = jnp.zeros((1, 2, 2))
    with pytest.raises(ValueError, match="0 < low < high"):
        learn_strength(z, jnp.ones((1, 2)), z, jnp.ones((1, 2)), low=low, high=high)


@pytest.mark.parametrize("which", ["negative dwell", "nan dwell", "negative count"])
def test_learn_strength_refuses_impossible_statistics(which):
    import equinox as eqx

    M, T = jnp.ones((1, 2, 2)), jnp.ones((1, 2))
    bad = {
        "negative dwell": (M, T, M, -T),
        "nan dwell": (M, T.at[0, 0].set(jnp.nan), M, T),
        "negative count": (M, T, -M, T),
    }[which]
    with pytest.raises(eqx.EquinoxRuntimeError, match="must be finite and >= 0"):
        learn_strength(*bad)
