"""Learning an intervention strength from panel data by profile likelihood (maths §8),
through `jaxctbn fit --observation panel --learn-strength`: the estimate against a joint
maximisation over the rates and the strength with scipy's L-BFGS-B (on a likelihood in numpy
and `scipy.linalg.expm`, with its gradient by `expm_frechet`: nothing compiled), the profile at
the interval's ends against scipy's maximum over the rates at that strength (Wilks' drop), and
the errors. One compiled profile for the module."""

import itertools
import json

import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pandas as pd
import pytest
import scipy.linalg
import scipy.optimize
import scipy.stats
from helpers import network_dict

import jaxctbn as jc
from jaxctbn._cli.main import main

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

    def sample(key, scale):  # (both with rate scales, B's 1 or 3: one compiled sampler)
        iv = jc.Intervention.none(2).with_rate_scales([1.0, scale])
        return jc.sample_trajectories(
            truth, init, 4.0, key=key, num_trajectories=NUM_EACH, intervention=iv
        )

    plain, under = sample(jr.key(1), 1.0), sample(jr.key(2), TRUE_STRENGTH)
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


def _joint_objective(truth, data):
    """-(panel log-likelihood) of the CSV `data` and its gradient, as a function of (log free
    rates, log s), in numpy and scipy alone (nothing of the library's likelihood or of its
    scaling of the observations): every visit sees every node, so the likelihood conditional
    on the first visit (the library's convention) is the product over the gaps of
    `expm(Q dt)[y_prev, y_next]`, Q the joint generator of the nodes' rates (node B's times s in
    the trajectories marked `B*`); the gradient by scipy's Frechet derivative of `expm`."""
    cards = tuple(int(q.shape[-1]) for q in truth.cims)
    states = list(itertools.product(*(range(k) for k in cards)))
    index = {x: i for i, x in enumerate(states)}
    # one generator direction per free rate: d Q / d rate, in the order of `start`
    basis, node_of, start = [], [], []
    for n, (q, parents) in enumerate(zip(truth.cims, truth.parents)):
        q = np.asarray(q)
        for u, i, j in zip(*np.nonzero((q > 0) & ~np.eye(cards[n], dtype=bool))):
            b = np.zeros((len(states), len(states)))
            for x in states:
                config = np.ravel_multi_index([x[p] for p in parents], [cards[p] for p in parents])
                if x[n] == i and config == u:
                    b[index[x], index[(*x[:n], int(j), *x[n + 1 :])]] += 1.0
                    b[index[x], index[x]] -= 1.0
            basis.append(b)
            node_of.append(n)
            start.append(np.log(q[u, i, j]))
    on_b = np.asarray(node_of) == truth.names.index("B")
    # transition counts per (scaled, gap): from the CSV, trajectory by trajectory
    counts = {}
    for _, rows in pd.read_csv(data).sort_values("time").groupby("trajectory_id"):
        scaled = rows["intervention"].eq("B*").any()
        seen = [index[tuple(int(v) for v in row)] for row in rows[list(truth.names)].to_numpy()]
        for gap, a, b in zip(np.diff(rows["time"].to_numpy()), seen[:-1], seen[1:]):
            counts.setdefault((bool(scaled), float(gap)), np.zeros((len(states),) * 2))[a, b] += 1

    def value_and_grad(theta, log_s):
        rates = np.exp(theta)
        s = np.exp(log_s)
        value, g_theta, g_s = 0.0, np.zeros_like(theta), 0.0
        for (scaled, gap), n in counts.items():
            scale = np.where(on_b & scaled, s, 1.0)
            q = sum(r * c * b for r, c, b in zip(rates, scale, basis))
            p = scipy.linalg.expm(q * gap)
            value += np.sum(n * np.log(np.where(n > 0, p, 1.0)))
            weights = np.where(n > 0, n / p, 0.0)
            for k, b in enumerate(basis):
                e = gap * rates[k] * scale[k] * b
                g_theta[k] += np.sum(weights * scipy.linalg.expm_frechet(q * gap, e)[1])
            if scaled:
                e = gap * sum(r * s * b for r, b, on in zip(rates, basis, on_b) if on)
                g_s += np.sum(weights * scipy.linalg.expm_frechet(q * gap, e)[1])
        return -value, (-g_theta, -g_s)

    return value_and_grad, np.asarray(start)


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

    value_and_grad, start = _joint_objective(truth, data)

    def maximise(x0, log_s=None):  # over the rates (and log s when not given), from x0
        def f(x):
            theta, ls = (x, log_s) if log_s is not None else (x[:-1], x[-1])
            value, (g_theta, g_s) = value_and_grad(theta, ls)
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
    # the CSV's observations and the arguments as the command line passes them (its method
    # with the tolerance a Python float, a static leaf under `filter_jit`; `prior=None`): the
    # command line's compiled profile (test_panel_strength_against_a_joint_maximisation), not
    # one of its own (~2-7 s)
    obs, _ = jc.panel.PanelObservations.from_dataframe(
        pd.read_csv(data).assign(intervention=np.nan), truth
    )
    every = np.ones(obs.times.shape[0], bool)
    method = jc.panel.GradientFit(tolerance=1e-8)
    with pytest.raises(eqx.EquinoxRuntimeError, match="every trajectory is recorded under"):
        jc.panel.learn_strength_from_panels(
            truth, obs, node=1, scaled=every, prior=None, method=method
        )
