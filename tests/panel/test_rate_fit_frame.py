"""A panel rate fit as a pandas table, and the sampled rate posterior of panels as a table and as
ArviZ draws, against independent routes: the fit's and the uncertainty's arrays, the command
line's JSON writers (`rate_table`, `flagged_rates`), and (slow) `jaxctbn fit --observation
panel --posterior --draws-out x.nc` on a small panel, refitted and resampled by the library."""

import json
import math
import statistics
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from helpers import sample_trajectories_jit, state_at

import jaxctbn as jc
from jaxctbn._cli.main import main
from jaxctbn._cli.rate_tables import flagged_rates, rate_table

TRUTH = jc.CTBN(
    cims=[
        jnp.array([[[-0.5, 0.5], [0.7, -0.7]]]),
        jnp.array([[[-2.0, 2.0], [0.2, -0.2]], [[-0.2, 0.2], [2.0, -2.0]]]),
    ],
    parents=((), (0,)),
    names=("A", "B"),
)


def _json_frame(entries, level_name="ci95"):
    """The `rates` entries of `jaxctbn fit`'s JSON as the frame's rows (null as NaN)."""
    rows = []
    for e in entries:
        lo, hi = e["ci95"]
        rows.append(
            {
                "node": e["node"],
                "parent_states": ",".join(f"{p}={v}" for p, v in e["parent_states"].items()),
                "from": e["from"],
                "to": e["to"],
                "rate": e["rate"],
                "se": np.nan if e["se"] is None else e["se"],
                f"{level_name}_lower": np.nan if lo is None else lo,
                f"{level_name}_upper": np.nan if hi is None else hi,
                "estimated": e["estimated"],
            }
        )
    return pd.DataFrame(rows)


def _fit_and_uncertainty(level=0.95):
    """A `RateFit` of `TRUTH`'s graph with B's rate 1 -> 0 under A = 1 at the lower bound and
    A's 0 -> 1 at the upper one, and its uncertainty: every free rate estimated but those two
    (standard error infinite), as `RateFit.uncertainty` reports them."""
    model = TRUTH
    lower = tuple(jnp.zeros(q.shape, bool) for q in model.cims)
    upper = tuple(jnp.zeros(q.shape, bool) for q in model.cims)
    lower = (lower[0], lower[1].at[1, 1, 0].set(True))
    upper = (upper[0].at[0, 0, 1].set(True), upper[1])
    fit = jc.panel.RateFit(
        model=model,
        log_likelihood=jnp.asarray(-10.0),
        log_posterior=jnp.asarray(-10.0),
        converged=jnp.asarray(True),
        iterations=jnp.asarray(3),
        trace=None,
        at_lower_bound=lower,
        at_upper_bound=upper,
        num_parameters=jnp.asarray(6),
        method="squarem",
    )
    z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
    rates = tuple(jnp.where(~jnp.eye(2, dtype=bool), q, 0.0) for q in model.cims)
    se_log = tuple(
        jnp.where(~jnp.eye(2, dtype=bool) & ~lo & ~hi, 0.1 * (n + 1) + 0.01 * r, jnp.inf)
        for n, (r, lo, hi) in enumerate(zip(rates, lower, upper))
    )
    se_log = tuple(jnp.where(jnp.eye(2, dtype=bool), 0.0, s) for s in se_log)
    estimated = tuple(jnp.isfinite(s) & (s > 0) for s in se_log)
    uncertainty = jc.panel.RateUncertainty(
        rates=rates,
        log_rate_standard_errors=se_log,
        standard_errors=tuple(r * s for r, s in zip(rates, se_log)),
        lower=tuple(
            jnp.where(e, r * jnp.exp(-z * s), 0.0) for r, s, e in zip(rates, se_log, estimated)
        ),
        upper=tuple(
            jnp.where(e, r * jnp.exp(z * s), jnp.inf) for r, s, e in zip(rates, se_log, estimated)
        ),
        estimated=estimated,
        at_lower_bound=lower,
        at_upper_bound=upper,
        information=jnp.eye(6),
        covariance=jnp.eye(6),
        positive_definite=jnp.asarray(True),
        level=level,
    )
    return fit, uncertainty


def test_rate_fit_frame_is_the_fit_json():
    """`RateFit.to_frame`: the fitted rates; with the uncertainty the standard errors and
    intervals of `jaxctbn fit`'s `rates` (null, NaN here, where a rate is not estimated); the
    bound flags are its `at_lower_bound` / `at_upper_bound` lists."""
    fit, uncertainty = _fit_and_uncertainty()
    plain = fit.to_frame()
    columns = ["node", "parent_states", "from", "to", "rate", "at_lower_bound", "at_upper_bound"]
    assert list(plain.columns) == columns and len(plain) == 6
    for row in plain.itertuples(index=False):
        n = TRUTH.names.index(row.node)
        u = 0 if not row.parent_states else int(row.parent_states[-1])
        assert row.rate == float(TRUTH.cims[n][u, row[2], row[3]])
    frame = fit.to_frame(uncertainty)
    written = rate_table(fit.model, uncertainty.log_rate_standard_errors)
    expected = _json_frame(written)
    pd.testing.assert_frame_equal(frame[expected.columns], expected, rtol=1e-12)
    assert list(frame.columns[-2:]) == ["at_lower_bound", "at_upper_bound"]
    assert frame["estimated"].sum() == 4 and frame["se"].isna().sum() == 2
    for flag in ("at_lower_bound", "at_upper_bound"):
        listed = flagged_rates(fit.model, getattr(fit, flag))
        marked = frame[frame[flag]]
        assert [
            {
                "node": r.node,
                "parent_states": {} if not r.parent_states else {"A": int(r.parent_states[-1])},
                "from": r[2],
                "to": r[3],
            }
            for r in marked.itertuples(index=False)
        ] == listed
        assert len(listed) == 1
    # another level: the interval's columns named after it; Monte Carlo EM: no flags
    fit90, uncertainty90 = _fit_and_uncertainty(level=0.9)
    assert {"ci90_lower", "ci90_upper"} <= set(fit90.to_frame(uncertainty90).columns)
    unflagged = eqx.tree_at(
        lambda f: (f.at_lower_bound, f.at_upper_bound),
        fit,
        (None, None),
        is_leaf=lambda x: x is None,
    )
    assert list(unflagged.to_frame().columns) == columns[:5]
    wrong = jc.CTBN(cims=[TRUTH.cims[0], TRUTH.cims[0]], parents=((), ()), names=("A", "B"))
    other = eqx.tree_at(lambda f: f.model, fit, wrong)
    with pytest.raises(ValueError, match="uncertainty: rates of shapes"):
        other.to_frame(uncertainty)


def test_effects_frame_is_the_uncertainty_arrays():
    """`RateFit.effects_frame`: one row per covariate and free rate it acts on (`acts_on`
    leaves `age` off node B's rates under A = 1; a structural zero of A is never a row), each
    the uncertainty's log hazard ratio, standard error and interval read from its arrays by an
    independent loop here; an effect that is not estimated has NaN there."""
    fit, uncertainty = _fit_and_uncertainty()
    model = eqx.tree_at(lambda m: m.cims[0], TRUTH, jnp.array([[[-0.5, 0.5], [0.0, 0.0]]]))
    C = 2
    acts_on = [jnp.ones((C, 1, 2, 2), bool), jnp.ones((C, 2, 2, 2), bool).at[0, 1].set(False)]
    covariates = jc.panel.Covariates(
        jnp.array([[0.0, 1.0], [1.0, 0.0], [2.0, 1.0]]), names=("age", "sex"), acts_on=acts_on
    )
    shapes = [(C,) + q.shape for q in model.cims]
    beta = tuple(0.1 * jnp.arange(np.prod(s)).reshape(s) - 0.3 for s in shapes)
    se = tuple(jnp.full(s, 0.2).at[1, 0, 0, 1].set(jnp.inf) for s in shapes)
    z = statistics.NormalDist().inv_cdf(0.975)
    fitted = eqx.tree_at(
        lambda f: (f.model, f.effects),
        fit,
        (model, beta),
        is_leaf=lambda x: x is None,
    )
    with_effects = eqx.tree_at(
        lambda u: (
            u.effects,
            u.effect_standard_errors,
            u.hazard_ratio_lower,
            u.hazard_ratio_upper,
        ),
        uncertainty,
        (
            beta,
            se,
            tuple(jnp.exp(b - z * s) for b, s in zip(beta, se)),
            tuple(jnp.exp(b + z * s) for b, s in zip(beta, se)),
        ),
        is_leaf=lambda x: x is None,
    )
    frame = fitted.effects_frame(covariates, with_effects)
    expected = []
    for n, name in enumerate(model.names):
        q = np.asarray(model.cims[n])
        for c, label in enumerate(("age", "sex")):
            for u in range(q.shape[0]):
                for x in range(2):
                    for y in range(2):
                        if x == y or q[u, x, y] == 0 or not acts_on[n][c, u, x, y]:
                            continue
                        b, s = float(beta[n][c, u, x, y]), float(se[n][c, u, x, y])
                        known = math.isfinite(s)
                        nan = float("nan")
                        expected.append({
                            "covariate": label, "node": name,
                            "parent_states": "" if n == 0 else f"A={u}", "from": x, "to": y,
                            "hazard_ratio": math.exp(b), "log_hazard_ratio": b,
                            "se": s if known else nan,
                            "ci95_lower": math.exp(b - z * s) if known else nan,
                            "ci95_upper": math.exp(b + z * s) if known else nan,
                            "estimated": known,
                        })  # fmt: skip
    pd.testing.assert_frame_equal(frame, pd.DataFrame(expected), rtol=1e-12)
    assert len(frame) == 2 + 4 + 2 and (~frame["estimated"]).sum() == 2
    with pytest.raises(ValueError, match="covariates: this fit was made without covariates"):
        fit.effects_frame(covariates, with_effects)
    with pytest.raises(ValueError, match="uncertainty: it has no covariate effects"):
        fitted.effects_frame(covariates, uncertainty)


def test_a_missing_package_is_one_line(monkeypatch):
    fit, _ = _fit_and_uncertainty()
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match=r"^RateFit.to_frame needs pandas: pip install pandas$"):
        fit.to_frame()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:panel rate posterior")
def test_the_command_line_fit_and_posterior_as_frames_and_draws(tmp_path):
    """`jaxctbn fit --observation panel --posterior --draws-out x.nc` on 20 subjects: the
    library's fit of the same panel (MAP under the same prior) as a frame is the JSON's
    `rates`; the library's sampled posterior (same seed) as a frame is the JSON's
    `posterior.rates`, and its chains' draws are the netCDF file's; ArviZ's means are the
    draws' means."""
    import arviz

    k1, k2 = jax.random.split(jax.random.key(3))
    R = 20
    starts = jax.random.bernoulli(k1, 0.5, (R, 2)).astype(jnp.int32)
    paths = sample_trajectories_jit(TRUTH, starts, 5.0, key=k2, num_trajectories=R, max_events=64)
    rows = []
    for t in np.linspace(0.0, 5.0, 6):
        for r, s in enumerate(state_at(paths, t)):
            rows.append([r, t, *map(int, s)])
    panel, network = tmp_path / "panel.csv", tmp_path / "net.json"
    pd.DataFrame(rows, columns=["trajectory_id", "time", "A", "B"]).to_csv(panel, index=False)
    TRUTH.to_json(network)
    out, draws = tmp_path / "fit.json", tmp_path / "draws.nc"
    args = ["fit", "--data", str(panel), "--network", str(network), "--observation", "panel"]
    args += ["--posterior", "--alpha", "2", "--beta", "1", "--draws", "6", "--chains", "2"]
    args += ["--seed", "3", "--tolerance", "1e-10", "--draws-out", str(draws), "--out", str(out)]
    assert main(args) == 0
    written = json.loads(out.read_text())
    observations, _ = jc.panel.PanelBuckets.read_csv(panel, TRUTH)
    observations = observations.with_rounded_shapes()
    prior = jc.GammaPrior(2.0, 1.0)
    fit = jc.panel.fit_rates(
        TRUTH, observations, method=jc.panel.SquaremFit(tolerance=1e-10), prior=prior
    )
    frame = fit.to_frame(fit.uncertainty(observations, prior=prior))
    expected = _json_frame(written["rates"])
    pd.testing.assert_frame_equal(frame[expected.columns], expected, rtol=1e-8)
    assert not frame["at_lower_bound"].any() and not written["at_lower_bound"]
    mixture = jc.panel.panel_rate_posterior(
        jc.GammaMixturePosterior.from_gamma(
            jc.RatePosterior.for_model(TRUTH, prior=prior),
            free=[(np.asarray(q) != 0) & ~np.eye(2, dtype=bool) for q in TRUTH.cims],
        ),
        observations,
        family=jc.panel.SampledGammaMixture(num_draws=6, num_chains=2),
        key=jax.random.key(3),
    )
    posterior = mixture.to_frame()
    for column in ("mean", "sd", "split_r_hat", "ess"):
        np.testing.assert_allclose(
            posterior[column], [e[column] for e in written["posterior"]["rates"]], rtol=1e-9
        )
    np.testing.assert_allclose(
        posterior[["ci95_lower", "ci95_upper"]].values,
        [e["ci95"] for e in written["posterior"]["rates"]],
        rtol=1e-9,
    )
    idata = mixture.to_inference_data()
    on_disk = arviz.from_netcdf(str(draws))
    assert list(on_disk.posterior.data_vars) == list(idata.posterior.data_vars)
    assert list(idata.posterior.data_vars) == ["A:0->1", "A:1->0", "B|A=0:0->1", "B|A=0:1->0",
                                               "B|A=1:0->1", "B|A=1:1->0"]  # fmt: skip
    for name in idata.posterior.data_vars:
        np.testing.assert_allclose(
            on_disk.posterior[name].values, idata.posterior[name].values, rtol=1e-12
        )
    summary = arviz.summary(idata, round_to="none")
    means = [float(v.values.mean()) for v in idata.posterior.data_vars.values()]
    np.testing.assert_allclose(summary["mean"], means, rtol=1e-12)
    assert math.isfinite(float(summary["r_hat"].iloc[0]))
