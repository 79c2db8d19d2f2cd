"""Covariates with log-linear effects on the rates of a panel fit (R msm's `covariates =`):
the joint fit of rates and effects against scipy's L-BFGS-B on an independent numpy likelihood
(one scipy.linalg.expm per subject), and the standard errors of rates and effects against
central second differences of that likelihood."""

import dataclasses
import functools
import itertools

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
import scipy.optimize
from helpers import finite_difference_hessian, illness_death_start

import jaxctbn as jc
from jaxctbn._panel.prevalence import prevalence
from jaxctbn._panel.uncertainty import rate_uncertainty

GRID = np.arange(0.0, 6.0, 1.0)
RATES = np.array([[0.0, 0.4, 0.1], [0.3, 0.0, 0.3], [0.0, 0.0, 0.0]])  # state 2 absorbing
FREE = [(0, 1), (0, 2), (1, 0), (1, 2)]
ACTS_ON = [(0, 1), (1, 2)]  # sex and age act on 0 -> 1 and 1 -> 2
TRUE_EFFECTS = {(0, 1): (0.7, 0.3), (1, 2): (-0.5, 0.4)}
R = 120


def _generator(rates, effects, z):
    Q = rates.copy()
    for (x, y), b in effects.items():
        Q[x, y] *= np.exp(np.dot(b, z))
    return Q - np.diag(Q.sum(1))


@functools.cache
def _data():
    """Exact simulation: the state at each yearly visit, by the transition matrices."""
    rng = np.random.default_rng(0)
    Z = np.stack([rng.integers(0, 2, R).astype(float), rng.normal(50, 10, R)], 1)
    centred = Z - Z.mean(0)
    paths = np.zeros((R, len(GRID)), int)
    for r in range(R):
        P = scipy.linalg.expm(_generator(RATES, TRUE_EFFECTS, centred[r] * [1, 0.1]))
        paths[r, 0] = rng.integers(2)
        for i in range(1, len(GRID)):
            paths[r, i] = rng.choice(3, p=P[paths[r, i - 1]])
    return Z, paths


def _negative_log_likelihood(parameters):
    """Of (log of the 4 free rates, the 2 x 2 effects), conditional on each first visit."""
    Z, paths = _data()
    centred = Z - Z.mean(0)
    Q = np.zeros((3, 3))
    for (x, y), v in zip(FREE, np.exp(parameters[:4])):
        Q[x, y] = v
    effects = {e: parameters[4 + 2 * i : 6 + 2 * i] for i, e in enumerate(ACTS_ON)}
    total = 0.0
    for r in range(R):
        P = scipy.linalg.expm(_generator(Q, effects, centred[r]))
        total += np.log(P[paths[r, :-1], paths[r, 1:]]).sum()
    return -total


def _covariates():
    """Sex and age acting on ACTS_ON, named as the command line names them (sex written as
    text there, dummy-coded against its first level F)."""
    Z, _ = _data()
    acts_on = np.zeros((2, 1, 3, 3), bool)
    for x, y in ACTS_ON:
        acts_on[:, 0, x, y] = True
    return jc.panel.Covariates(Z, names=("sex=M", "age"), acts_on=[acts_on])


def _visits(paths):
    """The long format of the command line's CSV: one row per visit, sex as text."""
    import pandas as pd

    Z, _ = _data()
    rows = [
        [r, t, int(paths[r, i]), "FM"[int(Z[r, 0])], float(Z[r, 1])]
        for r in range(R)
        for i, t in enumerate(GRID)
    ]
    return pd.DataFrame(rows, columns=["trajectory_id", "time", "h", "sex", "age"])


def _bucketed(paths):
    """The panel as `jaxctbn fit` reads it from that CSV (in buckets by length)."""
    df = _visits(paths).drop(columns=["sex", "age"])
    obs, ids = jc.panel.PanelBuckets.from_dataframe(df, illness_death_start())
    assert list(ids) == list(range(R))  # the rows of the covariates
    return obs


def _rounded(paths):
    """The panel and the covariates as `jaxctbn fit` fits them: the buckets' shapes rounded up
    (128 subjects, 8 visit slots), the added subjects' covariate rows copies of the first. The
    fits below then compile the programs that the command line's fit reuses, and the checks
    against scipy and finite differences (on the given data) hold for the padded fit."""
    obs = _bucketed(paths).with_rounded_shapes()
    return obs, _covariates().padded_for(obs)


@functools.cache
def _fit():
    _, paths = _data()
    obs, covariates = _rounded(paths)
    start = illness_death_start()
    fit = jc.panel.fit_rates(start, obs, covariates=covariates)
    uncertainty = fit.uncertainty(obs, covariates=covariates)
    return obs, fit, uncertainty


def _parameters(fit):
    q = np.asarray(fit.model.cims[0][0])
    b = np.asarray(fit.effects[0])[:, 0]
    return np.concatenate(
        [np.log([q[e] for e in FREE]), [b[c][e] for e in ACTS_ON for c in (0, 1)]]
    )


def test_rates_and_effects_reach_scipys_optimum():
    _, fit, _ = _fit()
    assert bool(fit.converged) and fit.method == "gradient"
    # from the simulation's truth (the age effect per unit: 0.1 of TRUE_EFFECTS'), nothing of
    # the fit: 25% fewer evaluations of the numpy likelihood than from zero
    truth = [TRUE_EFFECTS[e][c] * (1, 0.1)[c] for e in ACTS_ON for c in (0, 1)]
    result = scipy.optimize.minimize(
        _negative_log_likelihood,
        np.concatenate([np.log([RATES[e] for e in FREE]), truth]),
        method="L-BFGS-B",
        options=dict(ftol=1e-14, gtol=1e-9, maxiter=3000),
    )
    # (the direct rate 0 -> 2 is weakly identified, se(log rate) ~ 0.7: the objective is flat
    # along it, and two optimisers stop a little apart there)
    np.testing.assert_allclose(_parameters(fit), result.x, atol=1e-3)
    # within the default stopping tolerance (1e-8 relative)
    np.testing.assert_allclose(float(fit.log_likelihood), -result.fun, rtol=1e-8)
    # the reported log-likelihood is the independent one at the fitted parameters
    np.testing.assert_allclose(
        float(fit.log_likelihood), -_negative_log_likelihood(_parameters(fit)), rtol=1e-10
    )
    # rates at the covariates' means; effects only where they act
    np.testing.assert_allclose(fit.covariate_means, _data()[0].mean(0), rtol=1e-12)
    b = np.asarray(fit.effects[0])[:, 0]
    off = np.ones((3, 3), bool)
    for e in ACTS_ON:
        off[e] = False
    assert np.all(b[:, off] == 0)


def test_standard_errors_of_rates_and_effects_against_finite_differences():
    _, fit, uncertainty = _fit()
    H = finite_difference_hessian(_negative_log_likelihood, _parameters(fit))
    expected = np.sqrt(np.diag(np.linalg.inv(H)))
    se_rates = np.asarray(uncertainty.log_rate_standard_errors[0][0])
    se_effects = np.asarray(uncertainty.effect_standard_errors[0])[:, 0]
    got = np.concatenate(
        [[se_rates[e] for e in FREE], [se_effects[c][e] for e in ACTS_ON for c in (0, 1)]]
    )
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    assert bool(uncertainty.positive_definite)
    # hazard-ratio intervals: exp(beta -+ 1.96 se), around exp(beta)
    b = np.asarray(uncertainty.effects[0])[:, 0]
    lo = np.asarray(uncertainty.hazard_ratio_lower[0])[:, 0]
    hi = np.asarray(uncertainty.hazard_ratio_upper[0])[:, 0]
    for c, e in itertools.product((0, 1), ACTS_ON):
        np.testing.assert_allclose(lo[c][e] * hi[c][e], np.exp(2 * b[c][e]), rtol=1e-10)
        np.testing.assert_allclose(np.log(hi[c][e]) - b[c][e], 1.959964 * se_effects[c][e], 1e-6)


def test_bad_covariates_are_refused():
    Z, paths = _data()
    obs = jc.panel.PanelObservations(np.broadcast_to(GRID, paths.shape), paths[..., None])
    start = jc.CTBN(cims=[jnp.ones((1, 3, 3))], parents=[()])
    with pytest.raises(ValueError, match="values: covariate 'c' is constant"):
        jc.panel.Covariates(np.stack([Z[:, 0], np.ones(R)], 1), names=("s", "c"))
    with pytest.raises(ValueError, match="values: must be finite"):
        jc.panel.Covariates(np.where(np.arange(R)[:, None] == 3, np.nan, Z))
    with pytest.raises(ValueError, match="names: need one per covariate"):
        jc.panel.Covariates(Z, names=("a",))
    with pytest.raises(ValueError, match="covariates: expected one row per trajectory"):
        jc.panel.fit_rates(start, obs, covariates=jc.panel.Covariates(Z[:10]))
    with pytest.raises(ValueError, match="method: covariate effects have no closed-form EM"):
        jc.panel.fit_rates(start, obs, covariates=_covariates(), method=jc.panel.EMFit())
    with pytest.raises(ValueError, match="covariates, effects: give both"):
        rate_uncertainty(start, obs, covariates=_covariates())
    # a fit's methods take its effects: the covariates must be the fit's, given exactly when
    # it has effects (the compiled fit of `_fit`, no new program)
    obs_fit, fit, _ = _fit()
    with pytest.raises(ValueError, match="covariates: this fit was made with covariates"):
        fit.uncertainty(obs_fit)
    with pytest.raises(ValueError, match="covariates: this fit was made with covariates"):
        fit.prevalence(obs, [0.0, 1.0])  # (the same data, flat)
    plain = dataclasses.replace(fit, effects=None, covariate_means=None, effects_at_bound=None)
    with pytest.raises(ValueError, match="covariates: this fit was made without covariates"):
        plain.uncertainty(obs_fit, covariates=_covariates().padded_for(obs_fit))
    with pytest.raises(ValueError, match="larger: expected a RateFit"):
        plain.likelihood_ratio_test(fit.model)  # pyright: ignore
    # exactly collinear (age2 = 2 age + 1) where they act together: not identifiable, named;
    # acting on different rates they are identifiable and pass the check
    collinear = np.stack([Z[:, 1], 2 * Z[:, 1] + 1, Z[:, 0]], 1)
    names = ("age", "age2", "sex")
    with pytest.raises(ValueError, match=r"covariates: \['age', 'age2'\] are collinear"):
        jc.panel.fit_rates(start, obs, covariates=jc.panel.Covariates(collinear, names=names))
    apart = np.zeros((3, 1, 3, 3), bool)
    apart[0, 0, 0, 1] = apart[1, 0, 1, 2] = apart[2, 0, 0, 1] = True
    from jaxctbn._panel.fit_arguments import check_identifiable as _check_identifiable

    _check_identifiable(jc.panel.Covariates(collinear, names=names, acts_on=[apart]))


def test_fit_with_covariates_from_the_command_line(tmp_path, capsys):
    # the CSV of the same data, sex written as text (F = 0, M = 1): dummy-coded against its
    # first level F, it is the numeric covariate of the library's fit, whose effects and
    # errors the command line must report
    from jaxctbn._cli import main

    Z, paths = _data()
    import pandas as pd

    data = tmp_path / "visits.csv"
    _visits(paths).to_csv(data, index=False)
    network = tmp_path / "start.json"
    illness_death_start().to_json(network)
    out = tmp_path / "fit.json"
    args = ["fit", "--data", str(data), "--network", str(network), "--observation", "panel"]
    covariates = ["--covariates", "sex,age", "--covariate-rates", "h:0-1,h:1-2"]
    assert main([*args, *covariates, "--out", str(out)]) == 0
    d = __import__("json").loads(out.read_text())
    _, fit, uncertainty = _fit()
    assert d["method"] == "gradient" and d["num_parameters"] == 8
    assert d["covariates"]["names"] == ["sex=M", "age"]
    assert d["covariates"]["reference_levels"] == {"sex": "F"}
    np.testing.assert_allclose(d["covariates"]["means"], Z.mean(0), rtol=1e-12)
    np.testing.assert_allclose(d["log_likelihood"], float(fit.log_likelihood), rtol=1e-12)
    assert len(d["covariate_effects"]) == 4
    for e in d["covariate_effects"]:
        c = ["sex=M", "age"].index(e["covariate"])
        b = float(np.asarray(fit.effects[0])[c, 0, e["from"], e["to"]])
        se = float(np.asarray(uncertainty.effect_standard_errors[0])[c, 0, e["from"], e["to"]])
        np.testing.assert_allclose(e["log_hazard_ratio"], b, atol=1e-4)
        np.testing.assert_allclose(e["hazard_ratio"], np.exp(e["log_hazard_ratio"]), rtol=1e-12)
        np.testing.assert_allclose(e["se"], se, rtol=1e-3)
        lo, hi = e["ci95"]
        assert lo < e["hazard_ratio"] < hi
    # one line, exit 2
    for extra, message in [
        (["--covariates", "sex,age", "--method", "em"], "--method em: covariate effects"),
        (["--covariates", "h"], "'h' is a node or a reserved column"),
        (["--covariates", "weight"], "no column 'weight'"),
        (["--covariates", "sex,age", "--covariate-rates", "h:2-0"], "not a free rate"),
        (["--covariate-rates", "h:0-1"], "only with --covariates"),
        (["--covariates", "age", "--covariate-rates", "h:0-1,h:0-1"], "'h:0-1' is given twice"),
    ]:
        capsys.readouterr()
        bad = tmp_path / "bad.json"
        assert main([*args, *extra, "--out", str(bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    # msm's workflow from one file: the fit without the covariates (their columns ignored, said
    # in one note on stderr) against the fit with them, by compare's likelihood-ratio test on
    # the same observations (the files' bytes are the same here; the digest of the observations
    # is what compare checks)
    plain = tmp_path / "plain.json"
    capsys.readouterr()
    assert main([*args, "--out", str(plain)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "column(s) ['sex', 'age'] are neither nodes" in err[0], err
    assert "ignored" in err[0]
    p = __import__("json").loads(plain.read_text())
    assert p["data"]["observations_sha256"] == d["data"]["observations_sha256"]
    compared = tmp_path / "compare.json"
    assert main(["compare", str(plain), str(out), "--out", str(compared)]) == 0
    c = __import__("json").loads(compared.read_text())
    assert c["df"] == 4 and c["nested"] == "FIT1 in FIT2"
    np.testing.assert_allclose(c["lr_statistic"], p["minus2loglik"] - d["minus2loglik"])
    # a file with only the nodes' columns holds the same observations
    nodes_only = tmp_path / "nodes.csv"
    pd.read_csv(data)[["trajectory_id", "time", "h"]].to_csv(nodes_only, index=False)
    again = tmp_path / "again.json"
    assert main([*args[:2], str(nodes_only), *args[3:], "--out", str(again)]) == 0
    a = __import__("json").loads(again.read_text())
    assert a["data"]["observations_sha256"] == d["data"]["observations_sha256"]
    assert a["data"]["sha256"] != d["data"]["sha256"]
    # the prevalence check of that fit: the forecast with each subject's covariate scales, the
    # library's with the fit's covariates and effects
    prevalence_dir = tmp_path / "prevalence"
    checks = ["prevalence", "--data", str(data), "--fit", str(out), "--observation", "panel"]
    assert main([*checks, "--times", "0,2,5", "--out", str(prevalence_dir)]) == 0
    table = __import__("pandas").read_csv(prevalence_dir / "prevalence.csv")
    # (the observations as `jaxctbn prevalence` reads them: its compiled forecasts reused)
    nodes = _visits(paths).drop(columns=["sex", "age"])
    obs = jc.panel.PanelObservations.from_dataframe(nodes, illness_death_start())[0]
    sex = jc.panel.Covariates(Z, names=("sex=M", "age"), acts_on=_covariates().acts_on)
    effects = [np.zeros((2, 1, 3, 3))]
    for e in d["covariate_effects"]:
        effects[0][["sex=M", "age"].index(e["covariate"]), 0, e["from"], e["to"]] = e[
            "log_hazard_ratio"
        ]
    library = prevalence(
        jc.CTBN.from_dict(d["network"]), obs, [0.0, 2.0, 5.0], covariates=sex, effects=effects
    )
    np.testing.assert_allclose(
        table.expected.to_numpy().reshape(3, 3), np.asarray(library.expected)[:, 0], rtol=1e-10
    )
    # with covariates the forecast differs from the one at the covariates' means
    plain = prevalence(jc.CTBN.from_dict(d["network"]), obs, [0.0, 2.0, 5.0])
    assert np.abs(np.asarray(plain.expected) - np.asarray(library.expected)).max() > 0.1
    # the fit without covariates checked on the same file: its covariate columns ignored with
    # one note (as fit does), the forecast the library's without covariates
    capsys.readouterr()
    plain_checks = [*checks[:4], str(tmp_path / "plain.json"), *checks[5:]]
    assert main([*plain_checks, "--times", "0,2,5", "--out", str(tmp_path / "plain_prev")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "column(s) ['sex', 'age'] are neither nodes" in err[0], err
    p = __import__("json").loads((tmp_path / "plain.json").read_text())
    reference = prevalence(jc.CTBN.from_dict(p["network"]), obs, [0.0, 2.0, 5.0])
    table = __import__("pandas").read_csv(tmp_path / "plain_prev" / "prevalence.csv")
    np.testing.assert_allclose(
        table.expected.to_numpy().reshape(3, 3), np.asarray(reference.expected)[:, 0], rtol=1e-10
    )


def test_covariates_padded_for_rounded_buckets():
    """`Covariates.padded_for`: a row per added trajectory (a copy of the first), per
    observation each row widened by its last value; the given rows unchanged."""
    _, paths = _data()
    obs = _bucketed(paths)
    rounded = obs.with_rounded_shapes()
    assert rounded.num_trajectories == 128 > R
    padded = _covariates().padded_for(rounded)
    Z = np.asarray(_covariates().values)
    np.testing.assert_array_equal(np.asarray(padded.values), np.concatenate([Z, [Z[0]] * 8]))
    assert padded.names == _covariates().names and padded.per_observation is False
    np.testing.assert_array_equal(padded.acts_on[0], _covariates().acts_on[0])
    varying = jc.panel.Covariates(np.arange(R * 6.0).reshape(R, 6, 1), per_observation=True)
    wide = np.asarray(varying.padded_for(rounded).values)
    assert wide.shape == (128, 8, 1)
    np.testing.assert_array_equal(wide[:R, :6], np.asarray(varying.values))
    np.testing.assert_array_equal(wide[:R, 6:], np.repeat(wide[:R, 5:6], 2, 1))
    np.testing.assert_array_equal(wide[R:], np.broadcast_to(wide[0], (8, 8, 1)))
    with pytest.raises(ValueError, match="observations: 120 trajectories, fewer than"):
        jc.panel.Covariates(np.arange(2.0 * R).reshape(2 * R, 1)).padded_for(obs)


def test_shared_effects_reach_scipys_optimum_of_the_tied_likelihood():
    # each covariate has one effect shared by 0 -> 1 and 1 -> 2 (msm's `constraint`): 4 log
    # rates and 2 effects, against scipy on the same numpy likelihood with tied parameters
    Z, paths = _data()
    obs = jc.panel.PanelObservations(np.broadcast_to(GRID, paths.shape), paths[..., None])
    shared = np.full((2, 1, 3, 3), -1)
    for x, y in ACTS_ON:
        shared[:, 0, x, y] = 0
    base = _covariates()
    covariates = jc.panel.Covariates(Z, names=base.names, acts_on=base.acts_on, shared=[shared])
    start = illness_death_start()
    fit = jc.panel.fit_rates(start, obs, covariates=covariates)
    uncertainty = fit.uncertainty(obs, covariates=covariates)
    assert int(fit.num_parameters) == 6 and bool(fit.converged)

    def tied(x):
        return _negative_log_likelihood(np.concatenate([x[:4], x[4:], x[4:]]))

    # (bounds keep the age effect's trial steps from overflowing the exponential)
    result = scipy.optimize.minimize(
        tied,
        np.zeros(6),
        method="L-BFGS-B",
        bounds=[(-10, 3)] * 4 + [(-5, 5), (-0.5, 0.5)],
        options=dict(ftol=1e-14, gtol=1e-9, maxiter=3000),
    )
    got = _parameters(fit)
    np.testing.assert_allclose(got[4:6], got[6:8], rtol=1e-12)  # tied in the fit
    np.testing.assert_allclose(got[:6], result.x, atol=1e-3)
    np.testing.assert_allclose(float(fit.log_likelihood), -result.fun, rtol=1e-8)
    # the shared effects' standard errors: central second differences of the tied likelihood
    H = finite_difference_hessian(tied, got[:6])
    expected = np.sqrt(np.diag(np.linalg.inv(H)))
    se = np.asarray(uncertainty.effect_standard_errors[0])[:, 0]
    for c in (0, 1):
        for e in ACTS_ON:
            np.testing.assert_allclose(se[c][e], expected[4 + c], rtol=1e-3)


def test_shared_effects_from_the_command_line_flag(tmp_path):
    import pandas as pd

    from jaxctbn._cli.covariates import covariates_of as _covariates_of

    Z, paths = _data()
    rows = [[r, t, int(paths[r, i]), Z[r, 1]] for r in range(R) for i, t in enumerate(GRID)]
    df = pd.DataFrame(rows, columns=["trajectory_id", "time", "h", "age"])
    model = illness_death_start()
    obs, ids = jc.panel.PanelObservations.from_dataframe(df.drop(columns=["age"]), model)
    covariates, summary = _covariates_of(model, df, ids, "age", None, obs, "h:0-1+h:1-2,h:1-0")
    labels = np.asarray(covariates.shared[0])[0, 0]
    assert labels[0, 1] == labels[1, 2] == 0 and labels[1, 0] == 1 and labels[0, 2] == -1
    assert summary["shared"] == ["h:0-1+h:1-2", "h:1-0"]
    for text, message in [
        ("h:0-1+h:0-1", "'h:0-1' is in two groups"),
        ("h:2-0", "not a free rate"),
        ("x:0-1", "unknown node 'x'"),
    ]:
        with pytest.raises(ValueError, match=message):
            _covariates_of(model, df, ids, "age", None, obs, text)


def test_an_effect_the_data_drive_to_infinity_is_flagged_not_estimated():
    # the men (sex = 1) stay in state 0 at every visit: their 0 -> 1 rate is driven to 0, so
    # sex's effect on 0 -> 1 reaches its bound (the same shapes as `_fit`: no new program)
    Z, paths = _data()
    still = np.where(Z[:, :1] == 1, 0, paths)
    obs, covariates = _rounded(still)
    start = illness_death_start()
    fit = jc.panel.fit_rates(start, obs, covariates=covariates)
    flagged = np.asarray(fit.effects_at_bound[0])[:, 0]
    assert flagged[0, 0, 1] and np.asarray(fit.effects[0])[0, 0, 0, 1] < 0
    assert flagged.sum() == 1  # age, and the other transitions, are not at a bound
    errors = fit.uncertainty(obs, covariates=covariates)
    assert not np.asarray(errors.effect_estimated[0])[0, 0, 0, 1]
    assert np.isinf(np.asarray(errors.effect_standard_errors[0])[0, 0, 0, 1])


def _sex_with_exact_deaths():
    """The panel cut at each subject's first visit in the absorbing state 2, recorded as an
    exact entry time (R msm's `deathexact`), and sex alone as the covariate (two classes)."""
    Z, paths = _data()
    dead = paths == 2
    first = np.where(dead.any(1), dead.argmax(1), len(GRID) - 1)
    counts = first + 1
    exact = np.zeros(paths.shape, bool)
    exact[np.arange(R), first] = dead[np.arange(R), first]
    assert 10 < exact.sum() < R - 10
    times = np.broadcast_to(GRID, paths.shape)
    obs = jc.panel.PanelObservations(
        times, paths[..., None], num_observations=counts, exact_entry=exact
    )
    acts_on = np.zeros((1, 1, 3, 3), bool)
    for x, y in ACTS_ON:
        acts_on[0, 0, x, y] = True
    covariates = jc.panel.Covariates(Z[:, :1], names=("sex=M",), acts_on=[acts_on])
    return obs, covariates, paths, counts, exact


def _sex_log_likelihood(parameters, paths, counts, exact):
    """The numpy log-likelihood of (log of the 4 free rates, the sex effect on 0 -> 1 and on
    1 -> 2), conditional on each first visit; an exact entry into 2 at a visit contributes
    sum_{j != 2} P(x, j) Q(j, 2) (msm's `deathexact`)."""
    Z, _ = _data()
    sex = Z[:, 0] - np.mean(np.repeat(Z[:, 0], counts - 1))  # msm's centring over intervals
    Q = np.zeros((3, 3))
    for (x, y), v in zip(FREE, np.exp(parameters[:4])):
        Q[x, y] = v
    effects = {e: parameters[4 + i : 5 + i] for i, e in enumerate(ACTS_ON)}
    total = 0.0
    for r in range(R):
        W = _generator(Q, effects, sex[r : r + 1])
        P = scipy.linalg.expm(W)  # the visits are a year apart
        for i in range(1, counts[r]):
            x, y = paths[r, i - 1], paths[r, i]
            total += np.log(P[x, :2] @ W[:2, 2] if exact[r, i] else P[x, y])
    return total


def test_a_categorical_covariate_shares_one_gap_table_per_class():
    # sex (two classes) with exact entry times: the grouped route (one gap table per class,
    # `covariate_classes`) against the numpy likelihood, its gradient against the per-interval
    # route's, and the observed information (the command line's intervals) against central
    # second differences of the numpy likelihood
    import equinox as eqx
    import jax

    from jaxctbn._panel.fit_arguments import DEFAULT_METHOD, checked_fit_arguments
    from jaxctbn._panel.fit_problem import fit_problem
    from jaxctbn._panel.gap_groups import covariate_classes
    from jaxctbn._panel.uncertainty import _information_rows, _uncertainty

    obs, covariates, paths, counts, exact = _sex_with_exact_deaths()
    start = illness_death_start()
    solver = jc.MatrixExponential()
    prior, groups, _ = checked_fit_arguments(start, obs, DEFAULT_METHOD, None, None, solver, "t")
    classed = covariate_classes(groups, covariates, obs)
    assert classed is not None and classed.exact_entries
    np.testing.assert_array_equal(np.asarray(classed.class_values), [[0.0], [1.0]])
    np.testing.assert_array_equal(np.asarray(classed.classes[0]), _data()[0][:, 0])
    # a continuous covariate (one class per subject) keeps the per-interval route
    assert covariate_classes(groups, _covariates(), obs) is None
    parameters = np.array([-1.0, -2.2, -1.3, -1.1, 0.6, -0.4])

    @eqx.filter_jit
    def value_and_gradient(groups, theta):
        problem = fit_problem(start, obs, prior, None, None, solver, groups, covariates)

        def objective(theta):
            rates = (start.cims[0].at[0, [0, 0, 1, 1], [1, 2, 0, 2]].set(jnp.exp(theta[:4])),)
            effects = jnp.zeros((1, 1, 3, 3)).at[0, 0, [0, 1], [1, 2]].set(theta[4:])
            return problem.objective(rates, (effects,))

        return jax.value_and_grad(objective)(theta)

    value, gradient = value_and_gradient(classed, jnp.asarray(parameters))
    reference, reference_gradient = value_and_gradient(None, jnp.asarray(parameters))
    expected = _sex_log_likelihood(parameters, paths, counts, exact)
    np.testing.assert_allclose(float(value), expected, rtol=1e-11)
    np.testing.assert_allclose(float(reference), expected, rtol=1e-11)
    np.testing.assert_allclose(gradient, reference_gradient, rtol=1e-9, atol=1e-9)
    # the information at those rates and effects, both routes
    model = eqx.tree_at(
        lambda m: m.cims,
        start,
        (start.cims[0].at[0, [0, 0, 1, 1], [1, 2, 0, 2]].set(np.exp(parameters[:4])),),
    )
    effects = (np.zeros((1, 1, 3, 3)),)
    effects[0][0, 0, [0, 1], [1, 2]] = parameters[4:]
    computed = _information_rows(model, covariates)
    information = _uncertainty(
        model, obs, prior, None, None, solver, classed, 0.95, covariates, effects, computed
    ).information
    # the free log-rates among the off-diagonal entries (0,1) (0,2) (1,0) (1,2) (2,0) (2,1),
    # then the effects on (0,1) and (1,2) among those of every entry (C=1, 1, 3, 3)
    rows = [0, 1, 2, 3, 6 + 1, 6 + 5]
    H = finite_difference_hessian(
        lambda p: -_sex_log_likelihood(p, paths, counts, exact), parameters
    )
    got = np.asarray(information)[np.ix_(rows, rows)]
    np.testing.assert_allclose(got, H, rtol=1e-4, atol=1e-4)
