"""The posteriors as pandas, networkx and ArviZ objects, each against an independent route: the
posterior's own means, standard deviations and quantiles, the Gamma's formulas (scipy), the
JSON that `jaxctbn fit --posterior` and `jaxctbn learn` write for the same paths, the draws of
the posterior's own `sample` and of the chains; and the one-line error of a missing package."""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
import scipy.stats
from helpers import sample_trajectories_jit

import jaxctbn as jc
from jaxctbn._cli.main import main
from jaxctbn._cli.rate_posterior import _posterior_rates, write_draws

#: A chain A -> B -> C of binary nodes; B's rates depend on A, C's on B.
TRUTH = jc.CTBN(
    cims=[
        jnp.array([[[-0.5, 0.5], [0.7, -0.7]]]),
        jnp.array([[[-2.0, 2.0], [0.2, -0.2]], [[-0.2, 0.2], [2.0, -2.0]]]),
        jnp.array([[[-1.0, 1.0], [0.5, -0.5]], [[-0.3, 0.3], [1.5, -1.5]]]),
    ],
    parents=((), (0,), (1,)),
    names=("A", "B", "C"),
)


def _states_text(states: dict) -> str:
    """The JSON's `{"parent": state}` as the frames' `parent=state` text."""
    return ",".join(f"{p}={v}" for p, v in states.items())


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """40 complete paths of `TRUTH` (as a CSV, read back) and the network JSON."""
    root = tmp_path_factory.mktemp("frames")
    starts = jax.random.bernoulli(jax.random.key(0), 0.5, (40, 3)).astype(jnp.int32)
    paths = sample_trajectories_jit(
        TRUTH, starts, 5.0, key=jax.random.key(1), num_trajectories=40, max_events=64
    )
    csv, network = root / "paths.csv", root / "net.json"
    paths.write_csv(csv, TRUTH)
    TRUTH.to_json(network)
    paths, _ = jc.Trajectories.read_csv(csv, TRUTH)
    return paths, csv, network


def test_rate_posterior_frame_is_the_gamma_and_the_fit_json(data, tmp_path):
    """`RatePosterior.to_frame`: the Gamma's mean, s.d. and quantiles (scipy) per free rate,
    the rows of `jaxctbn fit --posterior`'s JSON for the same paths; another level renames
    the interval's columns."""
    paths, csv, network = data
    out = tmp_path / "fit.json"
    assert main(["fit", "--data", str(csv), "--network", str(network), "--posterior",
                 "--out", str(out)]) == 0  # fmt: skip
    written = json.loads(out.read_text())["posterior"]["rates"]
    stats = jc.SufficientStatistics.from_trajectories(paths, TRUTH.cardinalities, TRUTH.parents)
    posterior = jc.RatePosterior.for_model(TRUTH).update_with(stats)
    frame = posterior.to_frame()
    columns = ["node", "parent_states", "from", "to", "mean", "sd", "ci95_lower", "ci95_upper"]
    assert list(frame.columns) == columns and len(frame) == 10
    # the command line's JSON, entry by entry
    assert frame["node"].tolist() == [r["node"] for r in written]
    assert frame["parent_states"].tolist() == [_states_text(r["parent_states"]) for r in written]
    assert frame[["from", "to"]].values.tolist() == [[r["from"], r["to"]] for r in written]
    for column, key in (("mean", "mean"), ("sd", "sd")):
        np.testing.assert_allclose(frame[column], [r[key] for r in written], rtol=1e-12)
    np.testing.assert_allclose(
        frame[["ci95_lower", "ci95_upper"]].values, [r["ci95"] for r in written], rtol=1e-12
    )
    # the Gamma's own formulas
    for row in frame.itertuples(index=False):
        n = TRUTH.names.index(row.node)
        u = 0 if not row.parent_states else int(row.parent_states[-1])
        a = float(posterior.alpha[n][u, row[2], row[3]])
        b = float(posterior.beta[n][u, row[2]])
        np.testing.assert_allclose([row.mean, row.sd], [a / b, np.sqrt(a) / b], rtol=1e-12)
        np.testing.assert_allclose(
            [row.ci95_lower, row.ci95_upper],
            scipy.stats.gamma.ppf([0.025, 0.975], a, scale=1 / b),
            rtol=1e-8,
        )
    narrow = posterior.to_frame(level=0.9)
    assert list(narrow.columns[-2:]) == ["ci90_lower", "ci90_upper"]
    assert (narrow["ci90_lower"] > frame["ci95_lower"]).all()
    with pytest.raises(ValueError, match=r"level: expected a number in \(0, 1\)"):
        posterior.to_frame(level=95)


def test_rate_posterior_draws_as_inference_data(data):
    """`RatePosterior.to_inference_data`: the posterior's own `sample` on the split keys, one
    variable per rate named as `--draws-out` names them; ArviZ's summary means are the
    draws' means and near the posterior means."""
    import arviz

    paths, _, _ = data
    stats = jc.SufficientStatistics.from_trajectories(paths, TRUTH.cardinalities, TRUTH.parents)
    posterior = jc.RatePosterior.for_model(TRUTH).update_with(stats)
    key = jax.random.key(5)
    idata = posterior.to_inference_data(key=key, num_draws=200, num_chains=3)
    names = list(idata.posterior.data_vars)
    assert names[:3] == ["A:0->1", "A:1->0", "B|A=0:0->1"] and len(names) == 10
    draws = jax.vmap(posterior.sample)(jax.random.split(key, 600))
    b = np.asarray(draws.cims[1])[:, 1, 1, 0].reshape(3, 200)  # B|A=1:1->0
    np.testing.assert_allclose(idata.posterior["B|A=1:1->0"].values, b, rtol=1e-12)
    assert idata.posterior.sizes["chain"] == 3 and idata.posterior.sizes["draw"] == 200
    summary = arviz.summary(idata, round_to="none")
    means = [float(idata.posterior[v].values.mean()) for v in names]
    np.testing.assert_allclose(summary.loc[names, "mean"], means, rtol=1e-12)
    exact = posterior.to_frame()["mean"].to_numpy()
    sds = posterior.to_frame()["sd"].to_numpy()
    assert np.all(np.abs(np.asarray(means) - exact) < 5 * sds / np.sqrt(600))
    with pytest.raises(ValueError, match="num_chains: expected a positive integer"):
        posterior.to_inference_data(key=key, num_chains=0)


def _mixture_with_chains():
    """A two-component Gamma mixture over `TRUTH`'s rates with C's rate 1 -> 0 under B = 0
    a structural zero, and chains' draws (2 chains of 50, lognormal) behind it."""
    prior = jc.RatePosterior.for_model(TRUTH, prior=jc.GammaPrior(2.0, 1.0))
    alpha = tuple(jnp.stack([a, a + 3.0]) for a in prior.alpha)
    beta = tuple(jnp.stack([b, 2.0 * b]) for b in prior.beta)
    free = [np.asarray(q) != 0 for q in TRUTH.cims]
    free = [f & ~np.eye(2, dtype=bool) for f in free]
    free[2][0, 1, 0] = False
    draws = tuple(
        jnp.exp(0.3 * jax.random.normal(jax.random.key(n), (2, 50) + a.shape))
        for n, a in enumerate(prior.alpha)
    )
    free = [jnp.asarray(f) for f in free]
    diagnostics = jc.internal.ChainDiagnostics.from_draws(draws, 0, free)
    return jc.GammaMixturePosterior(
        alpha=alpha,
        beta=beta,
        log_weights=jnp.log(jnp.array([0.3, 0.7])),
        names=TRUTH.names,
        cardinalities=TRUTH.cardinalities,
        parents=TRUTH.parents,
        free=tuple(free),
        diagnostics=diagnostics,
    )


def test_mixture_frame_and_chain_draws(tmp_path):
    """`GammaMixturePosterior.to_frame`: its means, s.d.s, quantiles and chain diagnostics per
    free rate (a structural zero left out), the entries the command line's JSON writer gives
    from the posterior's methods;
    `to_inference_data()` holds the chains' draws, the same file `--draws-out x.nc` writes,
    and ArviZ's means are the draws' means; with a key, the mixture's own draws."""
    import arviz

    mixture = _mixture_with_chains()
    frame = mixture.to_frame()
    assert list(frame.columns[-2:]) == ["split_r_hat", "ess"] and len(frame) == 9
    assert "B=0" not in frame[(frame.node == "C") & (frame["from"] == 1)]["parent_states"].values
    # the command line's JSON writer (`rate_means`, `rate_sds`, `rate_quantiles` and the
    # diagnostics, eagerly), for a model with the same structural zero
    cims = [np.array(q) for q in TRUTH.cims]
    cims[2][0] = [[-1.0, 1.0], [0.0, 0.0]]
    zeroed = jc.CTBN(cims=cims, parents=TRUTH.parents, names=TRUTH.names)
    written = _posterior_rates(zeroed, mixture, mixture.diagnostics)
    expected = pd.DataFrame(
        [
            {
                **{k: r[k] for k in ("node", "from", "to", "mean", "sd", "split_r_hat", "ess")},
                "parent_states": _states_text(r["parent_states"]),
                "ci95_lower": r["ci95"][0],
                "ci95_upper": r["ci95"][1],
            }
            for r in written
        ]
    )[frame.columns]
    pd.testing.assert_frame_equal(frame, expected, rtol=1e-12)
    # the chains' draws: the draws file of the command line, and ArviZ's summary
    idata = mixture.to_inference_data()
    path = tmp_path / "draws.nc"
    write_draws(path, zeroed, mixture.diagnostics.rate_draws)
    on_disk = arviz.from_netcdf(str(path))
    assert list(on_disk.posterior.data_vars) == list(idata.posterior.data_vars)
    for name in idata.posterior.data_vars:
        np.testing.assert_array_equal(on_disk.posterior[name].values, idata.posterior[name].values)
    np.testing.assert_array_equal(
        idata.posterior["C|B=1:1->0"].values,
        np.asarray(mixture.diagnostics.rate_draws[2])[:, :, 1, 1, 0],
    )
    summary = arviz.summary(idata, round_to="none")
    np.testing.assert_allclose(
        summary["mean"], [float(v.values.mean()) for v in idata.posterior.data_vars.values()]
    )
    assert "C|B=0:1->0" not in idata.posterior.data_vars
    # with a key: the mixture's own draws, structural zero left out
    sampled = mixture.to_inference_data(key=jax.random.key(2), num_draws=20, num_chains=2)
    assert list(sampled.posterior.data_vars) == list(idata.posterior.data_vars)
    direct = jax.vmap(mixture.sample)(jax.random.split(jax.random.key(2), 40))
    np.testing.assert_allclose(  # (compiled and eager: the same draws, to rounding)
        sampled.posterior["A:0->1"].values,
        np.asarray(direct.cims[0])[:, 0, 0, 1].reshape(2, 20),
        rtol=1e-12,
    )
    # without chains, a key is needed
    plain = jc.GammaMixturePosterior.from_gamma(jc.RatePosterior.for_model(TRUTH))
    with pytest.raises(ValueError, match="no chains"):
        plain.to_inference_data()
    assert "split_r_hat" not in plain.to_frame().columns


def test_structure_frames_and_graph_are_the_learn_json(data, tmp_path):
    """`StructurePosterior.to_frame` (edge marginals), `parent_sets_frame` and `to_networkx`:
    the `nodes` of `jaxctbn learn`'s JSON for the same paths and the posterior's
    `edge_marginals`; a forbidden edge (probability 0) is no edge of the graph."""
    paths, csv, network = data
    out = tmp_path / "learn.json"
    args = ["learn", "--data", str(csv), "--max-parents", "1", "--prior-convention", "gamma"]
    args += ["--alpha", "1", "--beta", "1", "--forbid", "C->A", "--edge-prior", "uniform"]
    args += ["--out", str(out)]
    assert main(args) == 0
    written = json.loads(out.read_text())["nodes"]
    knowledge = jc.PriorKnowledge(forbidden_edges=[("C", "A")])
    posterior = jc.learn_structure(
        paths, TRUTH.names, (2, 2, 2), max_parents=1, prior=jc.GammaPrior(1.0, 1.0),
        knowledge=knowledge,
    )  # fmt: skip
    edges = posterior.to_frame()
    assert list(edges.columns) == ["parent", "child", "probability"] and len(edges) == 6
    expected = [
        (parent, child, p)
        for child, entry in written.items()
        for parent, p in entry["edge_marginals"].items()
    ]
    assert edges[["parent", "child"]].values.tolist() == [[a, b] for a, b, _ in expected]
    np.testing.assert_allclose(edges["probability"], [p for *_, p in expected], rtol=1e-10)
    marginals = np.asarray(posterior.edge_marginals())
    for row in edges.itertuples(index=False):
        m, n = TRUTH.names.index(row.parent), TRUTH.names.index(row.child)
        assert row.probability == float(marginals[m, n])
    sets = posterior.parent_sets_frame()
    assert list(sets.columns) == ["node", "parents", "log_marginal_likelihood", "posterior"]
    rows = [(name, ",".join(s["parents"]), s["log_marginal_likelihood"], s["posterior"])
            for name, entry in written.items() for s in entry["parent_sets"]]  # fmt: skip
    assert sets[["node", "parents"]].values.tolist() == [[a, b] for a, b, *_ in rows]
    np.testing.assert_allclose(sets["log_marginal_likelihood"], [r[2] for r in rows], rtol=1e-10)
    np.testing.assert_allclose(sets["posterior"], [r[3] for r in rows], rtol=1e-10, atol=1e-14)
    assert (sets[sets.node == "A"]["parents"] != "C").all()  # forbidden: no candidate
    graph = posterior.to_networkx()
    assert list(graph.nodes(data="cardinality")) == [("A", 2), ("B", 2), ("C", 2)]
    positive = edges[edges.probability > 0]
    assert len(positive) == 5 and not graph.has_edge("C", "A")
    assert {(a, b): w for a, b, w in graph.edges(data="weight")} == {
        (r.parent, r.child): r.probability for r in positive.itertuples()
    }
    strong = posterior.to_networkx(threshold=0.5)
    assert set(strong.edges) == {
        (r.parent, r.child) for r in positive.itertuples() if r.probability > 0.5
    }
    assert len(strong.nodes) == 3
    with pytest.raises(ValueError, match=r"threshold: expected a number in \[0, 1\)"):
        posterior.to_networkx(threshold=1.0)
    # a mixture of two copies: the same edges
    mixture = jc.StructureMixturePosterior.copies(posterior, 2)
    pd.testing.assert_frame_equal(mixture.to_frame(), edges, rtol=1e-12)
    assert set(mixture.to_networkx().edges) == set(graph.edges)


@pytest.mark.parametrize(
    "package, call",
    [
        ("pandas", lambda p, s, m: p.to_frame()),
        ("pandas", lambda p, s, m: m.to_frame()),
        ("pandas", lambda p, s, m: s.to_frame()),
        ("pandas", lambda p, s, m: s.parent_sets_frame()),
        ("networkx", lambda p, s, m: s.to_networkx()),
        ("arviz", lambda p, s, m: p.to_inference_data(key=jax.random.key(0), num_draws=4)),
        ("arviz", lambda p, s, m: m.to_inference_data()),
    ],
)
def test_a_missing_package_is_one_line(package, call, monkeypatch):
    posterior = jc.RatePosterior.for_model(TRUTH)
    structure = jc.StructurePosterior.from_prior(TRUTH.names, (2, 2, 2), max_parents=1)
    mixture = _mixture_with_chains()
    monkeypatch.setitem(sys.modules, package, None)
    with pytest.raises(ImportError) as error:
        call(posterior, structure, mixture)
    message = str(error.value)
    assert message.endswith(f"needs {package}: pip install {package}") and "\n" not in message
