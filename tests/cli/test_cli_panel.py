"""`jaxctbn fit` and `jaxctbn learn --observation panel` (issue 12's CLI contracts), in process:
output keys, EM and gradient agreeing, the written network re-evaluated by the library, the
closed-form fit of complete paths at an optimum, and one-line errors."""

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
import scipy.stats
from helpers import sample_trajectories_jit, state_at

import jaxctbn as jc
from jaxctbn._cli import main
from jaxctbn._cli.main import build_parser
from jaxctbn._panel.uncertainty import rate_uncertainty

TRUTH = jc.CTBN(
    cims=[
        jnp.array([[[-0.5, 0.5], [0.7, -0.7]]]),
        jnp.array([[[-2.0, 2.0], [0.2, -0.2]], [[-0.2, 0.2], [2.0, -2.0]]]),
    ],
    parents=((), (0,)),
    names=("A", "B"),
)
# the initial state A=0,B=0 as the command line passes it (int32): a library reference with the
# same dtype reuses the command line's compiled program (int64 would compile it again)
START = jnp.array([0, 0], jnp.int32)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A panel CSV (24 subjects x 8 visits, some cells missing), the paths CSV it was observed
    from, and the true network as JSON. 24 x 8 is a shape `PanelBuckets.with_rounded_shapes`
    leaves as it is: `fit` (which rounds) and `design`/`learn` (which do not) then read one
    shape, and their sampled rate posteriors share one compiled program."""
    root = tmp_path_factory.mktemp("panel")
    k1, k2 = jax.random.split(jax.random.key(3))
    R = 24
    starts = jax.random.bernoulli(k1, 0.5, (R, 2)).astype(jnp.int32)
    paths = sample_trajectories_jit(TRUTH, starts, 5.0, key=k2, num_trajectories=R, max_events=64)
    grid = np.arange(8) * 0.625  # (gaps all exactly 0.625)
    rng = np.random.default_rng(0)
    rows = []
    for t in grid:
        s = state_at(paths, t)
        for r in range(R):
            cells = ["" if rng.random() < 0.1 and t > 0 else int(v) for v in s[r]]
            rows.append([r, t, *cells])
    panel = root / "panel.csv"
    pd.DataFrame(rows, columns=["trajectory_id", "time", "A", "B"]).to_csv(panel, index=False)
    complete = root / "paths.csv"
    paths.write_csv(complete, TRUTH)
    network = root / "net.json"
    TRUTH.to_json(network)
    return panel, complete, network


def test_fit_panel_default_and_gradient_agree_and_write_the_contract(files, tmp_path, capsys):
    panel, _, network = files
    outs = {}
    for method in ("squarem", "gradient"):
        out = tmp_path / f"{method}.json"
        args = ["fit", "--data", str(panel), "--network", str(network), "--observation", "panel"]
        if method != "squarem":  # the default
            args += ["--method", method]
        assert main([*args, "--tolerance", "1e-10", "--out", str(out)]) == 0
        outs[method] = json.loads(out.read_text())
    for method, d in outs.items():
        assert {"log_likelihood", "converged", "iterations", "method", "network"} <= set(d)
        assert d["method"] == method and d["converged"] is True
        # the written network, re-read and re-evaluated by the library, gives the reported L
        fitted = jc.CTBN.from_dict(d["network"])
        observations, _ = jc.panel.PanelObservations.read_csv(panel, fitted)
        again = float(jc.panel.panel_log_likelihood(fitted, observations).sum())
        np.testing.assert_allclose(d["log_likelihood"], again, rtol=1e-10)
        # the model-check contract: -2LL, AIC, one entry per free rate with its interval
        assert d["minus2loglik"] == -2 * d["log_likelihood"] and d["num_parameters"] == 6
        assert d["aic"] == d["minus2loglik"] + 12 and d["hessian_positive_definite"] is True
        assert len(d["rates"]) == 6
        for entry in d["rates"]:
            assert set(entry) >= {"node", "parent_states", "from", "to", "rate", "se", "ci95"}
            q = fitted.cims[fitted.names.index(entry["node"])]
            u = 0 if not entry["parent_states"] else entry["parent_states"]["A"]
            assert entry["rate"] == float(q[u, entry["from"], entry["to"]])
            lo, hi = entry["ci95"]
            assert 0 < lo < entry["rate"] < hi and entry["se"] > 0
            np.testing.assert_allclose(lo * hi, entry["rate"] ** 2, rtol=1e-10)
    np.testing.assert_allclose(
        outs["squarem"]["log_likelihood"], outs["gradient"]["log_likelihood"], atol=1e-5
    )
    # the standard errors are the library's, at the fitted rates (the observations bucketed and
    # their shapes rounded up as the command line reads them: its compiled program)
    fitted = jc.CTBN.from_dict(outs["squarem"]["network"])
    observations, _ = jc.panel.PanelBuckets.read_csv(panel, fitted)
    uncertainty = rate_uncertainty(fitted, observations.with_rounded_shapes())
    entry = outs["squarem"]["rates"][0]
    n = fitted.names.index(entry["node"])
    u = 0 if not entry["parent_states"] else entry["parent_states"]["A"]
    se = float(uncertainty.standard_errors[n][u, entry["from"], entry["to"]])
    np.testing.assert_allclose(entry["se"], se, rtol=1e-8)

    # compare: the LR test between nested fits (here the same data, a smaller model made by
    # hand from the JSON: the arithmetic and the refusals)
    big = outs["squarem"]
    small = json.loads(json.dumps(big))
    small["network"]["nodes"][1]["parents"] = []
    small["num_parameters"] = 4
    small["minus2loglik"] = big["minus2loglik"] + 7.5
    small["aic"] = small["minus2loglik"] + 8
    paths = []
    for name, d in (("big", big), ("small", small)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(d))
    out = tmp_path / "cmp.json"
    assert main(["compare", str(paths[0]), str(paths[1]), "--out", str(out)]) == 0
    cmp = json.loads(out.read_text())
    np.testing.assert_allclose(cmp["lr_statistic"], 7.5, rtol=1e-10)
    assert cmp["df"] == 2 and cmp["aic"] == [big["aic"], small["aic"]]
    np.testing.assert_allclose(cmp["p_value"], scipy.stats.chi2.sf(7.5, 2), rtol=1e-12)
    np.testing.assert_allclose(cmp["p_value"], np.exp(-7.5 / 2), rtol=1e-12)  # chi2 on 2 df
    other = json.loads(json.dumps(small))
    other["data"]["observations_sha256"] = "0" * 64
    paths.append(tmp_path / "other.json")
    paths[-1].write_text(json.dumps(other))
    unnested = json.loads(json.dumps(small))
    unnested["covariates"] = {"names": ["age"]}
    paths.append(tmp_path / "unnested.json")
    paths[-1].write_text(json.dumps(unnested))
    # hand-edited or damaged fits: a NaN -2LL, a string parameter count; covariate effects on
    # different rates (the same covariate's name, but not nested: compared by the rates it
    # acts on); an effect shared over two rates in the larger fit, separate in the smaller
    edited = {
        "nan": {"minus2loglik": float("nan")},
        "text": {"num_parameters": "four"},
        "age_a": {
            "covariates": {"names": ["age"]},
            "covariate_effects": [{"covariate": "age", "node": "A", "from": 0, "to": 1}],
        },
        "age_b": {
            "covariates": {"names": ["age"]},
            "covariate_effects": [{"covariate": "age", "node": "B", "from": 0, "to": 1}],
        },
        "age_ab": {
            "covariates": {"names": ["age"]},
            "covariate_effects": [
                {"covariate": "age", "node": "A", "from": 0, "to": 1},
                {"covariate": "age", "node": "B", "from": 0, "to": 1},
            ],
        },
        "age_shared": {
            "covariates": {"names": ["age"], "shared": ["A:0-1+B:0-1"]},
            "covariate_effects": [
                {"covariate": "age", "node": "A", "from": 0, "to": 1},
                {"covariate": "age", "node": "B", "from": 0, "to": 1},
            ],
        },
    }
    named = {}
    for name, change in edited.items():
        d = json.loads(json.dumps(big if name in ("age_a", "age_shared") else small))
        d.update(change)
        named[name] = tmp_path / f"{name}.json"
        named[name].write_text(json.dumps(d))
    # nested the right way round: an effect on A 0->1 (small) inside effects on A and B
    big_ab = json.loads(json.dumps(big))
    big_ab.update(edited["age_ab"])
    small_a = json.loads(json.dumps(small))
    small_a.update(edited["age_a"])
    for name, d in (("big_ab", big_ab), ("small_a", small_a)):
        named[name] = tmp_path / f"{name}.json"
        named[name].write_text(json.dumps(d))
    assert main(["compare", str(named["big_ab"]), str(named["small_a"]), "--out", str(out)]) == 0
    for a, b, message in (
        (paths[0], paths[2], "different data"),
        (paths[0], paths[0], "neither is nested"),
        (paths[0], paths[3], "has covariates that FIT1 lacks"),
        (paths[0], named["nan"], "FIT2: minus2loglik must be a finite number, got nan"),
        (named["text"], paths[0], "FIT1: num_parameters must be a finite number, got 'four'"),
        (named["age_a"], named["age_b"], "has the effect of age on B 0->1, which FIT1 does not"),
        (named["age_shared"], named["age_ab"], "FIT1 shares one effect of age over"),
    ):
        capsys.readouterr()
        assert main(["compare", str(a), str(b), "--out", str(tmp_path / "x.json")]) == 2
        assert message in capsys.readouterr().err


def test_fit_paths_closed_form_is_an_optimum(files, tmp_path):
    _, complete, network = files
    out = tmp_path / "paths.json"
    assert main(["fit", "--data", str(complete), "--network", str(network), "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    fitted = jc.CTBN.from_dict(d["network"])
    traj, _ = jc.Trajectories.read_csv(complete, fitted)

    @eqx.filter_jit  # one program for every evaluation below (eagerly: one per operation)
    def log_likelihood(cims):
        stats = jc.SufficientStatistics.from_trajectories(
            traj, fitted.cardinalities, fitted.parents
        )
        return jc.path_log_likelihood(eqx.tree_at(lambda m: m.cims, fitted, cims), stats)

    best = float(log_likelihood(fitted.cims))
    np.testing.assert_allclose(d["log_likelihood"], best, rtol=1e-12)
    # moving any free rate by 1% either way lowers the log-likelihood, and the second
    # difference in log(rate) over those steps is minus the information of the reported
    # standard error, 1 / se(log rate)^2 (the JSON's se is rate * se(log rate))
    entries = {
        (e["node"], e["from"], e["to"], tuple(e["parent_states"].values())): e for e in d["rates"]
    }
    for n, cim in enumerate(fitted.cims):
        for u, x, y in np.argwhere(~np.eye(2, dtype=bool)[None].repeat(cim.shape[0], 0)):
            values = []
            for step in (-0.01, 0.01):
                q = np.array(cim)
                q[u, x, y] *= np.exp(step)
                q[u, x, x] = -q[u, x, 1 - x]
                cims = list(fitted.cims)
                cims[n] = jnp.asarray(q)
                values.append(float(log_likelihood(cims)))
                assert values[-1] < best
            parents = tuple(int(v) for v in ([u] if fitted.parents[n] else []))
            entry = entries[(fitted.names[n], int(x), int(y), parents)]
            curvature = (values[0] + values[1] - 2 * best) / 0.01**2
            np.testing.assert_allclose(-curvature, (entry["rate"] / entry["se"]) ** 2, rtol=1e-3)
    assert d["num_parameters"] == len(d["rates"]) and d["hessian_positive_definite"] is True


def test_learn_panel_adds_log_likelihood_and_em(files, tmp_path, capsys):
    panel, _, _ = files
    out = tmp_path / "learn.json"
    args = ["learn", "--data", str(panel), "--observation", "panel", "--max-parents", "1"]
    # the sampled structure posterior (the default here), with short chains to keep it quick:
    # the settings of `design --draws 20 --chains 2` in test_design_from_a_panel_history (its
    # burn-in, 100, is the default here), so that the two share one compiled sampler
    short = ["--sweeps", "20", "--chains", "2"]
    assert main([*args, *short, "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert {"nodes", "map_graph", "entropy", "rates", "log_likelihood", "em"} <= set(d)
    assert set(d["em"]) == {"iterations", "converged"} and d["em"]["iterations"] >= 1
    assert np.isfinite(d["log_likelihood"]) and d["trajectories"] == 24
    assert d["inference"] == "exact" and "sampling" not in d
    # by default the graph summary is the sampled structure posterior's (exact in the limit),
    # with its chains' diagnostics; --panel-posterior moment reports structural EM's
    pp = d["panel_posterior"]
    assert pp["method"] == "sampled-structure" and pp["seed"] == 0
    assert set(pp["diagnostics"]) == {
        "max_split_r_hat", "min_ess", "chains", "sweeps", "burn_in", "converged"
    }  # fmt: skip
    assert (pp["diagnostics"]["chains"], pp["diagnostics"]["sweeps"]) == (2, 20)
    assert pp["diagnostics"]["burn_in"] == 100
    assert (jc.panel.SampledStructure().num_chains, jc.panel.SampledStructure().num_sweeps) == (
        4,
        1000,
    )
    moment = tmp_path / "moment.json"
    assert main([*args, "--panel-posterior", "moment", "--out", str(moment)]) == 0
    mo = json.loads(moment.read_text())
    assert mo["panel_posterior"]["method"] == "structural-em"
    assert mo["log_likelihood"] == d["log_likelihood"] and mo["em"] == d["em"]
    for name in ("A", "B"):
        total = sum(p["posterior"] for p in d["nodes"][name]["parent_sets"])
        np.testing.assert_allclose(total, 1.0, rtol=1e-9)
        (other,) = set(d["nodes"][name]["edge_marginals"])
        # the edge marginal is the mass of the parent sets holding the edge
        held = sum(p["posterior"] for p in d["nodes"][name]["parent_sets"] if other in p["parents"])
        np.testing.assert_allclose(d["nodes"][name]["edge_marginals"][other], held, rtol=1e-9)
    # the Gibbs E-step: the exact route's MAP graph, its diagnostics, no log-likelihood
    sampled = tmp_path / "sampled.json"
    flags = ["--inference", "sampling", "--samples", "30", "--burn-in", "10", "--seed", "1"]
    # buffers as large as the structure sampler's Gibbs paths need with this seed (with the
    # defaults it overflows and runs again with them doubled: a second compiled sampler); the
    # defaults themselves are checked below (the parser's and the importance sampler's)
    flags += ["--max-events", "128", "--max-node-events", "64", "--max-virtual", "128"]
    assert main([*args, *flags, "--sweeps", "40", "--chains", "2", "--out", str(sampled)]) == 0
    s = json.loads(sampled.read_text())
    assert s["panel_posterior"]["diagnostics"]["burn_in"] == 10  # --burn-in: both samplers
    assert s["map_graph"] == mo["map_graph"] and s["inference"] == "sampling"
    # its graph summary by default: the sampled structure posterior with Gibbs path updates,
    # near the exact path draws' (both short chains)
    assert s["panel_posterior"]["method"] == "sampled-structure"
    assert (s["panel_posterior"]["paths"], pp["paths"]) == ("gibbs", "exact")
    for name in ("A", "B"):
        for other, p in d["nodes"][name]["edge_marginals"].items():
            got = s["nodes"][name]["edge_marginals"][other]
            assert abs(got - p) < 0.1, (name, other, got, p)
    assert s["log_likelihood"] is None and s["em"]["converged"]
    assert s["sampling"]["samples"] == 30 and s["sampling"]["seed"] == 1
    assert s["sampling"]["infeasible_updates"] == 0
    assert s["sampling"]["buffers"] == {
        "max_events": 128,
        "max_node_events": 64,
        "max_virtual": 128,
    }
    defaults = build_parser().parse_args(["learn", "--data", str(panel), "--out", "o.json"])
    assert (defaults.max_events, defaults.max_node_events, defaults.max_virtual) == (64, 32, 64)
    assert set(s["sampling"]["min_effective_sample_size"]) == {"A", "B"}
    assert all(v > 0 for v in s["sampling"]["min_effective_sample_size"].values())
    for name in ("A", "B"):
        assert (
            s["sampling"]["median_effective_sample_size"][name]
            >= (s["sampling"]["min_effective_sample_size"][name])
        )
        r_hat = s["sampling"]["max_split_r_hat"][name]
        assert r_hat is None or r_hat >= 1.0 - 1e-12
    mean_field = tmp_path / "mean_field.json"
    assert main([*args, "--inference", "mean-field", "--out", str(mean_field)]) == 0
    m = json.loads(mean_field.read_text())
    assert m["map_graph"] == mo["map_graph"] and m["inference"] == "mean-field"
    assert m["log_likelihood"] is None and m["em"]["converged"]
    assert m["mean_field"]["steps_per_gap"] == 8
    assert m["mean_field"]["evidence_lower_bound"] < d["log_likelihood"]
    # importance sampling with the mean-field proposal: the same graph, its estimate
    weighted = tmp_path / "importance.json"
    flags = ["--inference", "sampling", "--sampler", "importance", "--samples", "32"]
    assert main([*args, *flags, "--out", str(weighted)]) == 0
    w = json.loads(weighted.read_text())
    assert w["map_graph"] == mo["map_graph"] and w["sampling"]["sampler"] == "importance"
    assert w["sampling"]["buffers"] == {
        "max_events": 64,
        "max_node_events": 32,
        "max_candidates": 8,
    }
    assert w["sampling"]["burn_in"] is None and w["sampling"]["infeasible_updates"] is None
    assert all(1 <= v <= 32 for v in w["sampling"]["min_effective_sample_size"].values())
    estimate = w["sampling"]["log_likelihood_estimate"]
    # (another model's, from 32 weighted paths per subject: within Monte Carlo error)
    assert m["mean_field"]["evidence_lower_bound"] < estimate
    assert abs(estimate - d["log_likelihood"]) < 3.0, (estimate, d["log_likelihood"])
    assert s["sampling"]["sampler"] == "gibbs" and s["sampling"]["log_likelihood_estimate"] is None
    for extra, message in [
        (["--sampler", "importance"], "--sampler: only with --inference sampling"),
        (["--inference", "sampling", "--max-candidates", "4"], "--max-candidates: only with"),
        (["--inference", "mean-field", "--exact-entry", "A=1"], "--exact-entry: not supported"),
        (["--inference", "sampling", "--exact-entry", "A=1"], "--exact-entry: not supported"),
        (["--steps-per-gap", "4"], "--steps-per-gap: only with --inference mean-field"),
        (
            ["--inference", "mean-field", "--panel-posterior", "sampled"],
            "--panel-posterior sampled: only with --inference exact",
        ),
        (["--panel-posterior", "moment", "--sweeps", "10"], "--sweeps: only with --panel-po"),
        (["--empirical-bayes"], "--empirical-bayes: not with --panel-posterior sampled"),
    ]:
        capsys.readouterr()
        assert main([*args, *extra, "--out", str(tmp_path / "bad.json")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
        assert not (tmp_path / "bad.json").exists()
    complete = ["learn", "--data", str(files[1]), "--inference", "sampling"]
    assert main([*complete, "--out", str(tmp_path / "bad.json")]) == 2
    assert "--inference sampling: only for panel data" in capsys.readouterr().err
    complete = ["learn", "--data", str(files[1]), "--chains", "2"]
    assert main([*complete, "--out", str(tmp_path / "bad.json")]) == 2
    assert "--chains: only for panel data" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--exact-entry", "B=1"], "--exact-entry: only for panel data"),
        (["--alpha", "2"], "--alpha/--beta: only with --prior gamma"),
        (["--observation", "panel", "--exact-entry", "C=1"], "--exact-entry: unknown node 'C'"),
    ],
)
def test_fit_errors_are_one_line(files, tmp_path, capsys, extra, message):
    panel, _, network = files
    args = ["fit", "--data", str(panel), "--network", str(network), "--out", str(tmp_path / "o")]
    assert main([*args, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_missing_cells_need_panel_and_structural_zeros_are_reported(files, tmp_path, capsys):
    panel, complete, network = files
    assert main(["learn", "--data", str(panel), "--out", str(tmp_path / "l.json")]) == 2
    assert "allowed only for panel data" in capsys.readouterr().err
    zero = TRUTH.to_dict()
    zero["cims"]["A"][0]["Q"] = [[0.0, 0.0], [0.7, -0.7]]
    path = tmp_path / "zero.json"
    path.write_text(json.dumps(zero))
    out = str(tmp_path / "o.json")
    assert main(["fit", "--data", str(complete), "--network", str(path), "--out", out]) == 2
    assert "structural zero" in capsys.readouterr().err


def _design_base(tmp_path):
    net = tmp_path / "net.json"
    net.write_text(json.dumps(TRUTH.to_dict()))
    base = ["design", "--target", "parameters", "--network", str(net)]
    base += ["--initial-state", "A=0,B=0", "--duration", "3", "--samples", "3", "--seed", "0"]
    return base + ["--criterion", "bhc"]


def test_design_with_panel_outcomes_writes_the_contract(tmp_path):
    """`design --outcome panel` (issue 36's contract): the outcome block, the library's numbers
    with the same key, and with --visits each candidate's times and equally spaced score. (The
    outcome block of a design without --outcome, `{"type": "path"}`: in
    test_design_from_a_panel_history.)"""
    base = _design_base(tmp_path)
    out = tmp_path / "rank.json"
    times = ["--outcome", "panel", "--observation-times", "1,3"]
    assert main([*base, *times, "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["outcome"] == {"type": "panel", "observation_times": [1.0, 3.0]}
    post = jc.RatePosterior.for_model(TRUTH)
    space = jc.intervention_space(TRUTH.cardinalities)
    ref = jc.score_interventions(
        post,
        space,
        START,
        3.0,
        criterion=jc.BHC(),
        key=jax.random.key(0),
        num_samples=3,
        outcome=jc.PanelOutcome(jnp.array([1.0, 3.0])),
    )
    np.testing.assert_allclose([r["score"] for r in res["scores"]], ref, rtol=1e-9, atol=1e-12)
    assert "observation_times" not in res["scores"][0]
    out = tmp_path / "visits.json"
    assert main([*base, "--outcome", "panel", "--visits", "2", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["outcome"]["type"] == "panel" and res["outcome"]["visits"] == 2
    for entry in res["scores"]:
        t = entry["observation_times"]
        assert len(t) == 2 and 0 < t[0] < t[1] <= 3.0 + 1e-9
        assert entry["score"] >= entry["score_equally_spaced"]
    best = [e for e in res["scores"] if e["intervention"] == res["best"]][0]
    assert res["outcome"]["observation_times"] == best["observation_times"]
    # (without --outcome: {"type": "path"}, checked in test_design_from_a_panel_history)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--outcome", "panel", "--observation-times", "1,4"], "--observation-times: every time"),
        (["--outcome", "panel", "--observation-times", "2,1"], "strictly increasing"),
        (["--outcome", "panel", "--observation-times", "1,1"], "strictly increasing"),
        (["--outcome", "panel", "--observation-times", "0,1"], "finite and > 0"),
        (["--outcome", "panel", "--visits", "0"], "--visits: must be an integer >= 1"),
        (["--visits", "2"], "--observation-times/--visits: only with --outcome panel"),
        (["--outcome", "panel"], "give --observation-times T1,T2,... or --visits K"),
        (["--outcome", "panel", "--visits", "2", "--observation-times", "1"], "not allowed with"),
        (["--outcome", "panel", "--visits", "2", "--criterion", "eig"], "EIG cannot choose"),
        (["--observation", "panel"], "--observation panel: give the panel history with --data"),
    ],
)
def test_design_panel_outcome_errors_are_one_line(extra, message, tmp_path, capsys):
    out = tmp_path / "o.json"
    assert main([*_design_base(tmp_path), *extra, "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not out.exists()


def test_run_parameters_with_panel_outcomes(tmp_path, capsys):
    """`run parameters --outcome panel --observation-times` (issue 36's contract): config.json
    records the outcome, the designs score it and the posterior learns from the visits only;
    a rerun resumes from the chunks; bad input is one line."""
    net = tmp_path / "net.json"
    net.write_text(json.dumps(TRUTH.to_dict()))
    out = tmp_path / "run"
    args = ["run", "parameters", "--network", str(net), "--designs", "passive,bhc"]
    args += ["--repetitions", "2", "--experiments", "2", "--samples", "3", "--chunk", "2"]
    panel = ["--outcome", "panel", "--observation-times", "1,3", "--particles", "16"]
    assert main([*args, *panel, "--out", str(out), "--no-progress"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["outcome"] == {
        "type": "panel",
        "observation_times": [1.0, 3.0],
        "posterior": {"method": "particle-filter", "particles": 16},
    }
    df = pd.read_csv(out / "metrics.csv", keep_default_na=False)
    assert np.isfinite(df.mse).all() and (df.mse > 0).all() and len(df) == 2 * 2 * 3
    assert set(df.observation_times[df.experiment > 0]) == {"1;3"}
    chunks = sorted((out / "chunks").rglob("*.npz"))
    stamps = [c.stat().st_mtime_ns for c in chunks]
    assert main([*args, *panel, "--out", str(out), "--no-progress"]) == 0  # resumed
    assert [c.stat().st_mtime_ns for c in chunks] == stamps
    capsys.readouterr()
    # the same directory with complete paths, or with the moment-matched posterior, is
    # another run
    assert main([*args, "--out", str(out), "--no-progress"]) == 2
    assert "outcome" in capsys.readouterr().err
    moment = [*panel[:-2], "--panel-posterior", "moment"]
    assert main([*args, *moment, "--out", str(out), "--no-progress"]) == 2
    assert "outcome" in capsys.readouterr().err
    capsys.readouterr()
    for extra, message in [
        (["--outcome", "panel"], "give --observation-times"),
        (["--panel-posterior", "moment"], "--panel-posterior: only with --outcome panel"),
        ([*moment, "--particles", "8"], "--particles: only with --outcome panel and"),
        (["--outcome", "panel", "--observation-times", "1,4"], "(0, --horizon] = (0, 3]"),
        (["--outcome", "panel", "--visits", "2", "--designs", "bhc,eig"], "eig design cannot"),
        (["--observation-times", "1"], "only with --outcome panel"),
    ]:
        bad = tmp_path / "bad"
        assert main([*args, *extra, "--out", str(bad), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
        assert not bad.exists()


@pytest.mark.slow
def test_run_parameters_with_chosen_visit_times(tmp_path):
    """`run parameters --outcome panel --visits 2`: the bhc chooses each experiment's two times
    with its candidate (recorded in the chunks and metrics.csv), the passive design spaces them
    equally; resume works. (The library's loop with chosen times is checked against a replay
    in test_panel_posterior; the visit-time optimiser against a grid in test_panel_design.)"""
    net = tmp_path / "net.json"
    net.write_text(json.dumps(TRUTH.to_dict()))
    visits = tmp_path / "visits"
    chosen = ["run", "parameters", "--network", str(net), "--designs", "passive,bhc"]
    chosen += ["--repetitions", "1", "--experiments", "2", "--samples", "3", "--chunk", "1"]
    chosen += ["--outcome", "panel", "--visits", "2", "--out", str(visits), "--no-progress"]
    assert main(chosen) == 0
    assert json.loads((visits / "config.json").read_text())["outcome"] == {
        "type": "panel",
        "visits": 2,
        "posterior": {"method": "particle-filter", "particles": 256},
    }
    df = pd.read_csv(visits / "metrics.csv", keep_default_na=False)
    seen = df[df.experiment > 0]
    assert set(seen.observation_times[seen.design == "passive"]) == {"1.5;3"}
    for text in seen.observation_times[seen.design == "bhc"]:
        times = [float(t) for t in text.split(";")]
        assert len(times) == 2 and 0 < times[0] < times[1] <= 3 + 1e-9
    chunk = np.load(visits / "chunks" / "bhc" / "0-0.npz")
    assert chunk["observation_times"].shape == (1, 2, 2)
    stamps = [c.stat().st_mtime_ns for c in sorted((visits / "chunks").rglob("*.npz"))]
    assert main(chosen) == 0  # resumed
    assert [c.stat().st_mtime_ns for c in sorted((visits / "chunks").rglob("*.npz"))] == stamps


@pytest.mark.slow
def test_structure_design_and_run_with_panel_outcomes(tmp_path, capsys):
    """Structure learning with panel outcomes on the command line: `design --target structure
    --outcome panel` gives the library's scores with the same key (and with --visits each
    candidate's times, never below equal spacing); `run structure --outcome panel` records the
    outcome and learns from the visits (by default the structure particle filter; structural
    EM with --panel-posterior moment)."""
    net = tmp_path / "net.json"
    net.write_text(json.dumps(TRUTH.to_dict()))
    base = ["design", "--target", "structure", "--network", str(net), "--criterion", "bhc"]
    base += ["--initial-state", "A=0,B=0", "--duration", "3", "--samples", "3", "--seed", "0"]
    out = tmp_path / "rank.json"
    assert main([*base, "--outcome", "panel", "--observation-times", "1,3", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["outcome"] == {"type": "panel", "observation_times": [1.0, 3.0]}
    prior = jc.StructurePosterior.from_prior(TRUTH.names, TRUTH.cardinalities, max_parents=1)
    ref = jc.score_interventions(
        prior,
        jc.intervention_space(TRUTH.cardinalities),
        START,
        3.0,
        criterion=jc.BHC(),
        key=jax.random.key(0),
        num_samples=3,
        outcome=jc.PanelOutcome(jnp.array([1.0, 3.0])),
    )
    np.testing.assert_allclose([r["score"] for r in res["scores"]], ref, rtol=1e-9, atol=1e-12)
    out = tmp_path / "visits.json"
    assert main([*base, "--outcome", "panel", "--visits", "2", "--out", str(out)]) == 0
    for entry in json.loads(out.read_text())["scores"]:
        assert len(entry["observation_times"]) == 2
        assert entry["score"] >= entry["score_equally_spaced"]
    run = ["run", "structure", "--network", str(net), "--designs", "passive,bhc"]
    run += ["--repetitions", "1", "--experiments", "2", "--samples", "2", "--chunk", "1"]
    run += ["--outcome", "panel", "--observation-times", "1,3", "--no-progress"]
    for extra, posterior in [
        (["--particles", "8"], {"method": "particle-filter", "particles": 8}),
        (["--panel-posterior", "moment"], {"method": "structural-em", "iterations": 10}),
    ]:
        # one directory per posterior: a directory of one is not resumed under the other
        folder = tmp_path / posterior["method"]
        assert main([*run, *extra, "--out", str(folder)]) == 0
        config = json.loads((folder / "config.json").read_text())
        assert config["outcome"] == {
            "type": "panel",
            "observation_times": [1.0, 3.0],
            "posterior": posterior,
        }
        df = pd.read_csv(folder / "metrics.csv", keep_default_na=False)
        assert len(df) == 2 * 3 and np.isfinite(df.entropy).all()


def test_design_from_a_panel_history(files, tmp_path, capsys):
    """`design --observation panel`: parameters from the panel posterior (the library's
    panel_rate_posterior and scores with the same key), structure from the sampled structure
    posterior (the library's mixture with the same seed; with a path outcome its
    moment-matched posterior, said in the JSON); a history without one of the network's node
    columns is one line."""
    panel, _, network = files
    base = ["design", "--data", str(panel), "--observation", "panel", "--network", str(network)]
    base += ["--initial-state", "A=0,B=0", "--duration", "3", "--samples", "3", "--seed", "0"]
    observations, _ = jc.panel.PanelBuckets.read_csv(panel, TRUTH)
    space = jc.intervention_space(TRUTH.cardinalities)
    # by default the history's sampled posterior, the library's mixture with the same seed,
    # scored for complete paths (the default outcome); short chains here, the settings of
    # `fit --posterior --draws 6 --chains 2` on the same shape (one compiled sampler for both
    # tests). --panel-posterior moment: the moment-matched Gamma, scored for visits at 1 and 3
    # (a ranking of the types and shapes of test_design_with_panel_outcomes_writes_the_contract:
    # one compiled ranking for both). Each said in the output.
    out = tmp_path / "p.json"
    mixture = jc.panel.panel_rate_posterior(
        jc.GammaMixturePosterior.from_gamma(
            jc.RatePosterior.for_model(TRUTH), free=[q != 0 for q in TRUTH.cims]
        ),
        observations,
        family=jc.panel.SampledGammaMixture(num_draws=6, num_chains=2),
        key=jax.random.key(0),
    )
    visits = ["--outcome", "panel", "--observation-times", "1,3"]
    for posterior, method, extra, outcome in [
        # (the outcome as the command line passes it: one trace)
        (mixture, "sampled-gamma-mixture", ["--draws", "6", "--chains", "2"], jc.CompletePath()),
        (
            jc.panel.panel_rate_posterior(
                jc.RatePosterior.for_model(TRUTH),
                observations,
                family=jc.panel.MomentMatchedGamma(),
            ),
            "moment-matched-gamma",
            ["--panel-posterior", "moment", *visits],
            jc.PanelOutcome(jnp.array([1.0, 3.0])),
        ),
    ]:
        argv = [*base, "--target", "parameters", "--criterion", "bhc", *extra, "--out", str(out)]
        assert main(argv) == 0
        ref = jc.score_interventions(
            posterior,
            space,
            START,
            3.0,
            criterion=jc.BHC(),
            key=jax.random.key(0),
            num_samples=3,
            outcome=outcome,
        )
        written = json.loads(out.read_text())
        got = [r["score"] for r in written["scores"]]
        np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12)
        assert written["history_posterior"]["method"] == method
        if isinstance(outcome, jc.CompletePath):  # without --outcome
            assert written["outcome"] == {"type": "path"}
        else:
            assert written["outcome"] == {"type": "panel", "observation_times": [1.0, 3.0]}
    # the structure's sampled history: `learn --sweeps 20 --chains 2`'s sampler (in
    # test_learn_panel_adds_log_likelihood_and_em)
    sampled = ["--draws", "20", "--chains", "2"]
    out = tmp_path / "s.json"
    structure = [*base, "--target", "structure", "--criterion", "bhc", "--out", str(out)]
    history = jc.panel.panel_structure_posterior(
        jc.StructurePosterior.from_prior(TRUTH.names, TRUTH.cardinalities, max_parents=1),
        observations,
        family=jc.panel.SampledStructure(num_sweeps=20, num_chains=2),
        key=jax.random.key(0),
    )
    times = jc.PanelOutcome(jnp.array([1.0, 3.0]))
    for extra, posterior, outcome, method in [
        (sampled, history.moment_matched(), jc.CompletePath(), "sampled-structure"),
        (
            [*sampled, *visits],
            history,
            times,
            "sampled-structure",
        ),
    ]:
        assert main([*structure, *extra]) == 0
        res = json.loads(out.read_text())
        assert len(res["scores"]) == 9 and all(np.isfinite(r["score"]) for r in res["scores"])
        assert res["history_posterior"]["method"] == method
        assert ("scored" in res["history_posterior"]) == (extra == sampled)
        ref = jc.score_interventions(
            posterior,
            space,
            START,
            3.0,
            criterion=jc.BHC(),
            key=jax.random.key(0),
            num_samples=3,
            outcome=outcome,
        )
        got = [r["score"] for r in res["scores"]]
        np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12)
    missing = tmp_path / "missing.csv"
    pd.read_csv(panel).drop(columns=["B"]).to_csv(missing, index=False)
    bad = [*base, "--target", "parameters", "--out", str(tmp_path / "o.json")]
    bad[2] = str(missing)
    capsys.readouterr()
    assert main(bad) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "'B'" in lines[0], lines
    assert not (tmp_path / "o.json").exists()


def test_fit_posterior_writes_the_contract_and_the_library_numbers(files, tmp_path, capsys):
    """`fit --observation panel --posterior`: the sampled posterior's rate table (the keys of
    `"rates"` with mean, sd, ci95) and diagnostics, equal to the library's
    `panel_rate_posterior` with the same seed; the chains' draws as CSV; bad input one line,
    exit 2, nothing written. With complete paths the conjugate Gamma, against its formulas."""
    panel, complete, network = files
    base = ["fit", "--data", str(panel), "--network", str(network), "--observation", "panel"]
    out, draws = tmp_path / "post.json", tmp_path / "draws.csv"
    posterior = ["--posterior", "--alpha", "2", "--beta", "1", "--draws", "6", "--chains", "2"]
    args = [*base, *posterior, "--seed", "3", "--draws-out", str(draws), "--out", str(out)]
    assert main(args) == 0
    written = json.loads(out.read_text())
    assert "rates" in written and written["prior"] == {
        "convention": "gamma",
        "alpha": 2.0,
        "beta": 1.0,
    }
    result = written["posterior"]
    assert result["method"] == "sampled-gamma-mixture"
    assert set(result["diagnostics"]) >= {"max_split_r_hat", "min_ess", "divergent_transitions"}
    assert [(r["node"], r["parent_states"], r["from"], r["to"]) for r in result["rates"]] == [
        (r["node"], r["parent_states"], r["from"], r["to"]) for r in written["rates"]
    ]
    observations, _ = jc.panel.PanelBuckets.read_csv(panel, TRUTH)
    observations = observations.with_rounded_shapes()
    mixture = jc.panel.panel_rate_posterior(
        jc.GammaMixturePosterior.from_gamma(
            jc.RatePosterior.for_model(TRUTH, prior=jc.GammaPrior(2.0, 1.0)),
            free=[np.ones(q.shape, bool) for q in TRUTH.cims],
        ),
        observations,
        family=jc.panel.SampledGammaMixture(num_draws=6, num_chains=2),
        key=jax.random.key(3),
    )
    means = np.concatenate(
        [np.asarray(m)[:, ~np.eye(2, dtype=bool)].reshape(-1) for m in mixture.rate_means()]
    )
    np.testing.assert_allclose([r["mean"] for r in result["rates"]], means, rtol=1e-10)
    for r in result["rates"]:
        assert r["ci95"][0] < r["mean"] < r["ci95"][1] and r["sd"] > 0
    frame = pd.read_csv(draws)
    assert list(frame.columns[:3]) == ["chain", "draw", "A:0->1"] and len(frame) == 12
    assert "B|A=1:1->0" in frame.columns
    # complete paths: Gam(alpha + M, beta + T), exact
    out_paths = tmp_path / "paths.json"
    assert main(["fit", "--data", str(complete), "--network", str(network), "--posterior",
                 "--out", str(out_paths)]) == 0  # fmt: skip
    exact = json.loads(out_paths.read_text())["posterior"]
    assert exact["method"] == "conjugate" and exact["diagnostics"] is None
    paths, _ = jc.Trajectories.read_csv(complete, TRUTH)
    stats = jc.SufficientStatistics.from_trajectories(paths, TRUTH.cardinalities, TRUTH.parents)
    gamma = jc.RatePosterior.for_model(TRUTH).update_with(stats)
    a, b = np.asarray(gamma.alpha[0])[0, 0, 1], np.asarray(gamma.beta[0])[0, 0]
    first = exact["rates"][0]
    np.testing.assert_allclose(first["mean"], a / b, rtol=1e-12)
    np.testing.assert_allclose(first["sd"], np.sqrt(a) / b, rtol=1e-10)
    np.testing.assert_allclose(
        first["ci95"], scipy.stats.gamma.ppf([0.025, 0.975], a, scale=1 / b), rtol=1e-8
    )
    capsys.readouterr()
    # bad input: one line naming the flag, exit 2, nothing written
    bad = tmp_path / "bad.json"
    for extra, flag in (
        (["--posterior", "--prior", "none"], "--posterior"),
        (["--posterior", "--draws", "0"], "--draws"),
        (["--posterior", "--chains", "0"], "--chains"),
        (["--posterior", "--alpha", "-1"], "--alpha"),
        (["--draws", "10"], "--draws"),
        (["--posterior", "--covariates", "A"], "--covariates"),
        (["--posterior", "--draws-out", str(tmp_path / "d.txt")], "--draws-out"),
    ):
        assert main([*base, *extra, "--out", str(bad)]) == 2, extra
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and flag in err[0], (extra, err)
        assert not bad.exists()
