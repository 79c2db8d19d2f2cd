"""Time-varying covariates and piecewise-constant rates (R msm's time-dependent covariates and
`pci`): the fitted log-likelihood against an independent numpy likelihood (a product of
scipy.linalg.expm over each interval's pieces), the fit at a stationary point of it, the
standard errors against central second differences of it, and the prevalence forecast
against numpy products of exponentials."""

import functools
import itertools

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
import scipy.stats
from helpers import finite_difference_hessian, illness_death_start

import jaxctbn as jc
from jaxctbn._panel.prevalence import prevalence

GRID = np.arange(0.0, 5.0, 1.0)
CUT = 2.5  # between two visits: every interval across it is split there
RATES = np.array([[0.0, 0.5, 0.3], [0.4, 0.0, 0.3], [0.0, 0.0, 0.0]])  # state 2 absorbing
FREE = [(0, 1), (0, 2), (1, 0), (1, 2)]
Z_ACTS_ON = [(0, 1), (1, 2)]  # the time-varying z; the period acts on every free rate
R = 60


def _generator(Q, b_z, z, b_p, d):
    """Rates Q scaled by exp(b_z[e] z) on Z_ACTS_ON and exp(b_p[e] d) on each free rate e."""
    q = np.array(Q, float)
    for e in FREE:
        q[e] *= np.exp(b_p[e] * d + (b_z[e] * z if e in Z_ACTS_ON else 0.0))
    return q - np.diag(q.sum(1))


def _pieces(t0, t1):
    """An interval's pieces (start, end, period dummy): split at the cut."""
    if t0 < CUT < t1:
        return [(t0, CUT, 0.0), (CUT, t1, 1.0)]
    return [(t0, t1, float(t0 >= CUT))]


@functools.cache
def _data():
    """Exact simulation at the visits; z switches on at a random visit (stays on)."""
    rng = np.random.default_rng(3)
    switch = rng.integers(1, len(GRID) + 1, R)
    Z = (np.arange(len(GRID))[None] >= switch[:, None]).astype(float)
    b_z = {(0, 1): 0.8, (1, 2): 0.8}
    b_p = dict.fromkeys(FREE, -0.6)
    paths = np.zeros((R, len(GRID)), int)
    paths[:, 0] = rng.integers(2, size=R)
    for r in range(R):
        for i in range(1, len(GRID)):
            P = np.eye(3)
            for a, b, d in _pieces(GRID[i - 1], GRID[i]):
                P = P @ scipy.linalg.expm((b - a) * _generator(RATES, b_z, Z[r, i - 1], b_p, d))
            paths[r, i] = rng.choice(3, p=P[paths[r, i - 1]])
    return Z, paths


def _unpack(x, means):
    Q = np.zeros((3, 3))
    for e, v in zip(FREE, np.exp(x[:4])):
        Q[e] = v
    b_z = dict(zip(Z_ACTS_ON, x[4:6]))
    b_p = dict(zip(FREE, x[6:10]))
    return Q, b_z, b_p


def _negative_log_likelihood(x, means):
    """Of (log rates, z effects, period effects), covariates centred at `means`, conditional on
    each first visit."""
    Z, paths = _data()
    Q, b_z, b_p = _unpack(x, means)
    total = 0.0
    for r, i in itertools.product(range(R), range(1, len(GRID))):
        P = np.eye(3)
        for a, b, d in _pieces(GRID[i - 1], GRID[i]):
            zc, dc = Z[r, i - 1] - means[0], d - means[1]
            P = P @ scipy.linalg.expm((b - a) * _generator(Q, b_z, zc, b_p, dc))
        total += np.log(P[paths[r, i - 1], paths[r, i]])
    return -total


@functools.cache
def _fit():
    Z, paths = _data()
    obs = jc.panel.PanelObservations(np.broadcast_to(GRID, paths.shape), paths[..., None])
    acts_on = np.zeros((1, 1, 3, 3), bool)
    for e in Z_ACTS_ON:
        acts_on[0, 0][e] = True
    z = jc.panel.Covariates(Z[..., None], names=("z",), acts_on=[acts_on], per_observation=True)
    periods, covariates = obs.with_time_periods([CUT], covariates=z)
    start = illness_death_start()
    # a tight tolerance: the gradient at the fit is then below 1e-6 (1 + |l|) by the stopping rule
    method = jc.panel.GradientFit(tolerance=1e-12)
    fit = jc.panel.fit_rates(start, periods, covariates=covariates, method=method)
    uncertainty = fit.uncertainty(periods, covariates=covariates)
    return periods, covariates, fit, uncertainty


def _parameters(fit):
    q = np.asarray(fit.model.cims[0][0])
    b = np.asarray(fit.effects[0])[:, 0]
    return np.concatenate(
        [np.log([q[e] for e in FREE]), [b[0][e] for e in Z_ACTS_ON], [b[1][e] for e in FREE]]
    )


def test_fit_is_a_stationary_point_of_the_independent_likelihood():
    periods, covariates, fit, _ = _fit()
    assert bool(fit.converged) and fit.method == "gradient"
    assert covariates.names == ("z", "period[2.5,Inf)") and covariates.per_observation
    means = np.asarray(fit.covariate_means)
    # means over the observations that start an interval (msm's; the censored rows at the
    # cut included)
    starts = np.arange(periods.times.shape[1]) < np.asarray(periods.num_observations)[:, None] - 1
    np.testing.assert_allclose(means, np.asarray(covariates.values)[starts].mean(0), rtol=1e-12)
    x = _parameters(fit)
    np.testing.assert_allclose(
        float(fit.log_likelihood), -_negative_log_likelihood(x, means), rtol=1e-10
    )
    h = 1e-5
    gradient = [
        (_negative_log_likelihood(x + h * e, means) - _negative_log_likelihood(x - h * e, means))
        / (2 * h)
        for e in np.eye(len(x))
    ]
    assert np.max(np.abs(gradient)) < 1e-3, gradient


def test_standard_errors_against_finite_differences():
    _, _, fit, uncertainty = _fit()
    means = np.asarray(fit.covariate_means)
    f = functools.partial(_negative_log_likelihood, means=means)
    H = finite_difference_hessian(f, _parameters(fit))
    expected = np.sqrt(np.diag(np.linalg.inv(H)))
    se_rates = np.asarray(uncertainty.log_rate_standard_errors[0][0])
    se_effects = np.asarray(uncertainty.effect_standard_errors[0])[:, 0]
    got = np.concatenate(
        [
            [se_rates[e] for e in FREE],
            [se_effects[0][e] for e in Z_ACTS_ON],
            [se_effects[1][e] for e in FREE],
        ]
    )
    assert bool(uncertainty.positive_definite)
    np.testing.assert_allclose(got, expected, rtol=1e-3)


def test_prevalence_forecast_follows_the_covariates_and_periods():
    periods, covariates, fit, _ = _fit()
    grid = np.array([0.5, 2.0, 3.0, 4.0])
    result = fit.prevalence(periods, grid, covariates=covariates)
    Z, paths = _data()
    means = np.asarray(fit.covariate_means)
    Q, b_z, b_p = _unpack(_parameters(fit), means)
    expected = np.zeros((len(grid), 3))
    for r in range(R):
        for g, t in enumerate(grid):
            p = np.eye(3)[paths[r, 0]]
            for i in range(1, len(GRID)):  # the visits' intervals up to t
                for a, b, d in _pieces(GRID[i - 1], min(GRID[i], t)):
                    if b > a:
                        W = _generator(Q, b_z, Z[r, i - 1] - means[0], b_p, d - means[1])
                        p = p @ scipy.linalg.expm((b - a) * W)
            expected[g] += p
    np.testing.assert_allclose(np.asarray(result.expected)[:, 0], expected, rtol=1e-9)
    assert np.all(np.asarray(result.at_risk)[:, 0] == R)


def test_with_time_periods_inserts_censored_rows_and_refuses_bad_cuts():
    times = [np.array([0.0, 1.0, 3.0]), np.array([0.5, 2.0]), np.array([1.0, 4.0, 6.0])]
    states = [np.array([[0], [1], [1]]), np.array([[1], [0]]), np.array([[0], [0], [1]])]
    obs = jc.panel.PanelObservations.from_sequences(times, states)
    age = jc.panel.Covariates([[50.0], [60.0], [70.0]], names=("age",))
    out, cov = obs.with_time_periods([2.0, 5.0], covariates=age)
    assert cov.names == ("age", "period[2,5)", "period[5,Inf)") and cov.per_observation
    np.testing.assert_array_equal(out.num_observations, [4, 2, 5])
    # trajectory 0: a censored row at 2 (between 1 and 3); 5 is after its last visit
    np.testing.assert_array_equal(out.times[0, :4], [0, 1, 2, 3])
    np.testing.assert_array_equal(out.states[0, :4, 0], [0, 1, -1, 1])
    # trajectory 1: 2 is its last visit already, nothing inserted
    np.testing.assert_array_equal(out.times[1, :2], [0.5, 2])
    # trajectory 2: censored rows at 2 and 5
    np.testing.assert_array_equal(out.times[2], [1, 2, 4, 5, 6])
    np.testing.assert_array_equal(out.states[2, :, 0], [0, -1, 0, -1, 1])
    values = np.asarray(cov.values)
    np.testing.assert_array_equal(values[2, :, 0], 70.0)  # baseline covariates repeated
    np.testing.assert_array_equal(values[0, :4, 1], [0, 0, 1, 1])  # in [2, 5)
    np.testing.assert_array_equal(values[2, :, 1], [0, 1, 1, 0, 0])
    np.testing.assert_array_equal(values[2, :, 2], [0, 0, 0, 1, 1])  # from 5 on
    # a per-observation covariate carries its value into the censored rows
    dose = jc.panel.Covariates(
        [[[1.0], [2.0], [3.0]], [[1.0], [1.0], [0.0]], [[0.0], [5.0], [7.0]]],
        names=("dose",),
        per_observation=True,
    )
    _, cov = obs.with_time_periods([2.0], covariates=dose)
    np.testing.assert_array_equal(np.asarray(cov.values)[0, :4, 0], [1, 2, 2, 3])
    # buckets in, buckets out, in the same given order
    buckets = jc.panel.PanelBuckets.from_observations(obs)
    out_b, _ = buckets.with_time_periods([2.0, 5.0], covariates=age)
    assert isinstance(out_b, jc.panel.PanelBuckets)
    np.testing.assert_array_equal(out_b.padded().times, out.times)
    with pytest.raises(ValueError, match="cut_times: 7 is outside the data's follow-up"):
        obs.with_time_periods([2.0, 7.0])
    with pytest.raises(ValueError, match="cut_times: must be strictly increasing"):
        obs.with_time_periods([3.0, 2.0])
    with pytest.raises(ValueError, match="cut_times: expected one or more finite times"):
        obs.with_time_periods([2.0, np.nan])
    with pytest.raises(ValueError, match="covariates: per_observation values need"):
        jc.panel.fit_rates(
            jc.CTBN(cims=[jnp.ones((1, 2, 2))], parents=[()]),
            obs,
            covariates=jc.panel.Covariates(np.ones((3, 2, 1)) * [[[1]], [[2]], [[3]]],
                                           per_observation=True),
        )  # fmt: skip


def test_time_varying_covariates_and_pci_from_the_command_line(tmp_path, capsys):
    # the CSV of the same data: z changes within subjects, so it is time-varying; --pci 2.5
    # adds the period; the command line must report the library's fit
    import json

    import pandas as pd

    from jaxctbn._cli import main

    Z, paths = _data()
    rows = [[r, t, int(paths[r, i]), Z[r, i]] for r in range(R) for i, t in enumerate(GRID)]
    data = tmp_path / "visits.csv"
    pd.DataFrame(rows, columns=["trajectory_id", "time", "h", "z"]).to_csv(data, index=False)
    network = tmp_path / "start.json"
    illness_death_start().to_json(network)
    out = tmp_path / "fit.json"
    args = ["fit", "--data", str(data), "--network", str(network), "--observation", "panel"]
    covariates = ["--covariates", "z", "--covariate-rates", "h:0-1,h:1-2", "--pci", "2.5"]
    assert main([*args, *covariates, "--tolerance", "1e-12", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    _, _, fit, uncertainty = _fit()
    assert d["method"] == "gradient" and d["num_parameters"] == 4 + 2 + 4
    assert d["covariates"]["names"] == ["z", "period[2.5,Inf)"]
    assert d["covariates"]["time_varying"] == ["z"] and d["covariates"]["pci"] == [2.5]
    assert d["effects_at_bound"] == 0
    np.testing.assert_allclose(d["log_likelihood"], float(fit.log_likelihood), rtol=1e-10)
    np.testing.assert_allclose(d["covariates"]["means"], fit.covariate_means, rtol=1e-12)
    assert len(d["covariate_effects"]) == 6
    for e in d["covariate_effects"]:
        c = d["covariates"]["names"].index(e["covariate"])
        b = float(np.asarray(fit.effects[0])[c, 0, e["from"], e["to"]])
        se = float(np.asarray(uncertainty.effect_standard_errors[0])[c, 0, e["from"], e["to"]])
        np.testing.assert_allclose(e["log_hazard_ratio"], b, atol=1e-4)
        np.testing.assert_allclose(e["se"], se, rtol=1e-3)
    # the prevalence check of that fit follows z and the period as the library does
    prevalence_dir = tmp_path / "prevalence"
    checks = ["prevalence", "--data", str(data), "--fit", str(out), "--observation", "panel"]
    assert main([*checks, "--times", "0.5,2,3,4", "--out", str(prevalence_dir)]) == 0
    table = pd.read_csv(prevalence_dir / "prevalence.csv")
    periods, covariates_, _, _ = _fit()
    effects = [np.zeros((2, 1, 3, 3))]
    for e in d["covariate_effects"]:
        c = d["covariates"]["names"].index(e["covariate"])
        effects[0][c, 0, e["from"], e["to"]] = e["log_hazard_ratio"]
    library = prevalence(
        jc.CTBN.from_dict(d["network"]), periods, [0.5, 2, 3, 4],
        covariates=covariates_, effects=effects,
    )  # fmt: skip
    np.testing.assert_allclose(
        table.expected.to_numpy().reshape(4, 3), np.asarray(library.expected)[:, 0], rtol=1e-10
    )
    # one line, exit 2
    for extra, message in [
        (["--pci", "9"], "--pci: 9 is outside the data's follow-up"),
        (["--pci", "2.5", "--method", "squarem"], "--method squarem: covariate effects"),
        (["--pci", "3,2"], "--pci"),
    ]:
        extra = ["--covariates", "z", *extra]
        capsys.readouterr()
        bad = tmp_path / "bad.json"
        assert main([*args, *extra, "--out", str(bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_likelihood_ratio_test_of_the_covariates_and_periods():
    periods, _, fit, _ = _fit()
    start = illness_death_start()
    plain = jc.panel.fit_rates(start, periods)  # (the censored rows change nothing here)
    assert int(plain.num_parameters) == 4 and int(fit.num_parameters) == 4 + 2 + 4
    test = plain.likelihood_ratio_test(fit)
    statistic = 2 * (float(fit.log_likelihood) - float(plain.log_likelihood))
    np.testing.assert_allclose(float(test.lr_statistic), statistic, rtol=1e-12)
    assert float(test.df) == 6
    np.testing.assert_allclose(
        float(test.p_value), scipy.stats.chi2.sf(statistic, 6), rtol=1e-9, atol=1e-300
    )
    np.testing.assert_allclose(
        np.asarray(test.aic),
        [-2 * float(plain.log_likelihood) + 8, -2 * float(fit.log_likelihood) + 20],
        rtol=1e-12,
    )
    with pytest.raises(Exception, match="larger: must have more parameters"):
        fit.likelihood_ratio_test(plain)


def test_covariates_from_a_dataframe_align_with_the_observations():
    import pandas as pd

    # two subjects; subject 7's dose changes; a row without any observed node is dropped by
    # the reader (and its covariate value is not used); rows out of time order
    df = pd.DataFrame(
        {
            "trajectory_id": [7, 7, 7, 7, 3, 3],
            "time": [2.0, 0.0, 1.0, 1.5, 0.0, 4.0],
            "h": [1, 0, 0, None, 1, 1],
            "dose": [3.0, 1.0, 2.0, 9.0, 5.0, 5.0],
            "sex": ["m", "m", "m", "m", "f", "f"],
        }
    )
    obs, ids = jc.panel.PanelObservations.from_dataframe(
        df[["trajectory_id", "time", "h"]], {"h": 2}
    )
    covariates, summary = jc.panel.Covariates.from_dataframe(df, ["dose", "sex"], obs, ids)
    assert ids == [7, 3] and covariates.per_observation
    assert summary["names"] == ["dose", "sex=m"] and summary["time_varying"] == ["dose"]
    assert summary["reference_levels"] == {"sex": "f"}
    values = np.asarray(covariates.values)
    np.testing.assert_array_equal(values[0, :, 0], [1, 2, 3])  # times 0, 1, 2
    np.testing.assert_array_equal(values[1, :2, 0], [5, 5])
    np.testing.assert_array_equal(values[:, 0, 1], [1, 0])
    # constant within subjects: baseline, one row per subject
    baseline, summary = jc.panel.Covariates.from_dataframe(df, ["sex"], obs, ids)
    assert not baseline.per_observation and summary["time_varying"] == []
    np.testing.assert_array_equal(np.asarray(baseline.values)[:, 0], [1, 0])
    for bad, message in [
        (df.assign(dose=[1.0, None, 2, 3, 4, 5]), "column 'dose' has missing values"),
        (df.assign(dose=1.0), "column 'dose' has a single value"),
        (pd.concat([df, df.iloc[[1]].assign(dose=8.0)]), "two values at time 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            jc.panel.Covariates.from_dataframe(bad, ["dose"], obs, ids)
    with pytest.raises(ValueError, match="columns: no column 'age'"):
        jc.panel.Covariates.from_dataframe(df, ["age"], obs, ids)
