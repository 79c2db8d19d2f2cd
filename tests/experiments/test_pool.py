"""The real-data pool experiment (`jaxctbn._pool`, `jaxctbn run pool`) on tiny panels."""

import json
import os

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

import jaxctbn
from jaxctbn._active_learning.metrics import edge_auroc
from jaxctbn._cli import main
from jaxctbn._experiments.pool import pool_design_from_name, run_pool_repetitions
from jaxctbn._experiments.pool_subjects import pool_membership
from jaxctbn._learning.candidates import candidate_parent_sets
from jaxctbn._panel.csv import panel_from_dataframe
from jaxctbn._panel.panel_families import panel_family_statistics
from jaxctbn._paths.csv import infer_cardinalities

jax.config.update("jax_enable_x64", True)

NAMES = ("R", "A", "B")


def _simulate(seed=0, subjects=24, visits=5):
    """A synthetic panel: root R constant per subject, A driven by R, B driven by A (numpy
    Gillespie), seen at integer times; a few root cells left empty."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(subjects):
        r = int(rng.integers(2))
        a, b = int(rng.integers(2)), int(rng.integers(2))
        t = 0.0
        for v in range(visits):
            while True:
                ra = 0.3 if a == r else 1.5
                rb = 1.2 if b != a else 0.2
                total = ra + rb
                dt = rng.exponential(1 / total)
                if t + dt > v:
                    t = float(v)
                    break
                t += dt
                if rng.random() < ra / total:
                    a = 1 - a
                else:
                    b = 1 - b
            root = "" if (s % 5 == 0 and v == 2) else str(r)
            rows.append({"trajectory_id": s, "time": float(v), "R": root, "A": a, "B": b})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def panel():
    df = _simulate()
    obs, ids = jaxctbn.panel.PanelObservations.from_dataframe(
        df.replace("", np.nan), {n: 2 for n in NAMES}
    )
    return df, obs, ids


@pytest.fixture(scope="module")
def prepared(panel):
    """The pool as `jaxctbn run pool` prepares it (the panel in buckets, the default settings),
    so that test_cli_run_pool reuses its compiled programs."""
    df = panel[0]
    buckets, ids = panel_from_dataframe(
        df.replace("", np.nan), dict.fromkeys(NAMES, 2), bucketed=True
    )
    return jaxctbn.experiments.prepare_pool(buckets, NAMES, (2, 2, 2), root="R", subject_ids=ids)


def test_membership_hand_made():
    # subject 0: root 1 throughout; 1: root 0 with a missing visit (still in do(R=0));
    # 2: root changes (full pool only); 3: root never observed (full pool only)
    df = pd.DataFrame(
        {
            "trajectory_id": [0, 0, 1, 1, 1, 2, 2, 3, 3],
            "time": [0, 1, 0, 1, 2, 0, 1, 0, 1],
            "R": [1, 1, 0, None, 0, 0, 1, None, None],
            "A": [0, 1, 0, 0, 1, 1, 1, 0, 1],
        }
    )
    obs, ids = jaxctbn.panel.PanelObservations.from_dataframe(df, {"R": 2, "A": 2})
    m = pool_membership(obs, 0, 2)
    assert ids == [0, 1, 2, 3]
    np.testing.assert_array_equal(
        m, [[True, True, True, True], [False, True, False, False], [True, False, False, False]]
    )


def test_pool_options(prepared, panel):
    pool, fit = prepared
    df = panel[0]
    assert pool.option_labels == ("none", "R=0", "R=1")
    # the root is constant by construction, so every subject is in exactly one sub-pool
    m = np.asarray(pool.membership)
    assert m[0].all() and np.all(m[1] ^ m[2])
    first = df[df.time == 0].set_index("trajectory_id")["R"].astype(int)
    np.testing.assert_array_equal(m[2], [first[i] == 1 for i in pool.subject_ids])
    assert fit.posterior.map_graph()[0] == ()  # the root has no parents
    np.testing.assert_array_equal(np.asarray(pool.initial_states)[1:, 0], [0, 1])


@pytest.fixture(scope="module")
def all_subjects_statistics(prepared, panel):
    """The independent route to a posterior from drawn subjects: every subject's smoothed
    statistics under the full-data model (the E-step, dense matrix exponentials), projected
    on each node's parent sets with the root's own statistics dropped where a subject came from
    a sub-pool that clamps it; and the posterior of those pooled statistics."""
    pool, fit = prepared
    _, obs, _ = panel
    stats = jaxctbn.panel.panel_expected_statistics(
        fit.model, obs, solver=jaxctbn.MatrixExponential()
    )
    sets = candidate_parent_sets(3, 2)

    @eqx.filter_jit
    def expected(clamped):
        pooled = panel_family_statistics(stats, sets, intervention_targets=clamped)
        return pooled, jaxctbn.StructurePosterior.from_statistics(pooled, NAMES).entropy()

    return expected


@pytest.mark.parametrize("name", ["passive", "random"])
def test_designs_draw_from_their_pools_without_repeats(prepared, all_subjects_statistics, name):
    """Each design draws every subject once (K = all subjects), from its option's pool; the
    posterior after all of them is that of all subjects' statistics computed at once."""
    pool, _ = prepared
    design = pool_design_from_name(name, num_samples=2)
    keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.key(1), r))(jnp.arange(2))
    K = pool.num_subjects  # (the criterion designs: in the CLI test)
    # the paper's update: each subject's expected statistics under the full-data network
    res = run_pool_repetitions(pool, design, keys, num_experiments=K, panel_posterior=None)
    m = np.asarray(pool.membership)
    for r in range(2):
        subjects, options = np.asarray(res.subject[r]), np.asarray(res.option[r])
        assert len(set(subjects.tolist())) == K
        assert np.all(m[options, subjects])
        if name == "passive":
            assert np.all(options == 0)
        # the root's own statistics only count for subjects drawn from the full pool
        clamped = np.zeros((pool.num_subjects, 3), bool)
        clamped[subjects, 0] = options > 0
        expected, entropy = all_subjects_statistics(jnp.asarray(clamped))
        statistics = jax.tree_util.tree_map(lambda x: x[r], res.statistics)
        for a, b in zip(jax.tree_util.tree_leaves(statistics), jax.tree_util.tree_leaves(expected)):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(res.entropy[r, -1], entropy, rtol=1e-9)
    if name == "random":
        assert np.any(np.asarray(res.option) > 0)
    assert res.entropy.shape == (2, K + 1) and np.all(np.isfinite(np.asarray(res.aupr)))


def test_vbhc_and_negative_choose_opposite_extremes(prepared):
    """The VBHC pool design picks the option of the largest `option_scores`, its negative the
    smallest (one compiled program: `worst` is traced), never a closed option."""
    pool, _ = prepared
    key = jax.random.key(5)
    post = pool.prior_posterior.update(pool.subject_statistics(jnp.asarray(0), jnp.asarray(0)))

    @eqx.filter_jit
    def choices(post, pool, open_, worst):
        scores = jaxctbn.CriterionDesign(
            jaxctbn.VBHC(), num_samples=2, assume_complete_path=True
        ).option_scores(post, pool.candidates, pool.initial_states, pool.horizons, key)
        design = jaxctbn.CriterionDesign(jaxctbn.VBHC(), num_samples=2, worst=worst)
        return scores, design.choose_option(
            post, pool.candidates, pool.initial_states, pool.horizons, open_, key
        )

    everything = jnp.ones(3, bool)
    scores, best = choices(post, pool, everything, jnp.asarray(False))
    _, worst = choices(post, pool, everything, jnp.asarray(True))
    scores = np.asarray(scores)
    assert np.ptp(scores) > 0
    assert int(best) == int(np.argmax(scores)) and int(worst) == int(np.argmin(scores))
    # a closed option is never chosen
    closed = everything.at[int(best)].set(False)
    _, best2 = choices(post, pool, closed, jnp.asarray(False))
    _, worst2 = choices(post, pool, closed, jnp.asarray(True))
    assert int(best2) != int(best) and int(worst2) != int(best)
    assert int(best2) == int(np.argsort(scores)[-2])


def test_same_key_same_result(prepared):
    pool, _ = prepared
    design = pool_design_from_name("random")
    run = eqx.filter_jit(jaxctbn.experiments.run_pool)  # one program (eagerly: one per operation)
    a = run(pool, design, jax.random.key(7), num_experiments=6, panel_posterior=None)
    b = run(pool, design, jax.random.key(7), num_experiments=6, panel_posterior=None)
    c = run(pool, design, jax.random.key(8), num_experiments=6, panel_posterior=None)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.subject, c.subject)


def _pool_repetition_keys(num):
    """The keys of repetitions 0..num-1 of `jaxctbn run pool --seed 4` (test_cli_run_pool)."""
    return jax.vmap(lambda r: jax.random.fold_in(jax.random.key(4), r))(jnp.arange(num))


def test_particle_filter_pool_equals_a_replay(prepared):
    """The structure particle filter over each drawn subject's own panel
    (under do(root=r) when drawn from a sub-pool): replayed subject by subject with
    `panel_structure_posterior` and the keys the loop folds, the same particles and weights;
    a subject drawn from a sub-pool adds nothing to the root's own statistics. (One repetition
    of every subject, as `jaxctbn run pool --chunk 1` runs the random design in
    test_cli_run_pool: the same compiled program.)"""
    pool, _ = prepared
    family = jaxctbn.panel.StructureParticleFilter(num_particles=8)
    design = pool_design_from_name("random")
    K = pool.num_subjects
    keys = _pool_repetition_keys(1)
    batch = run_pool_repetitions(pool, design, keys, num_experiments=K, panel_posterior=family)
    res = jax.tree_util.tree_map(lambda x: x[0], batch)
    posterior = family.initial(pool.prior_posterior)
    update = eqx.filter_jit(
        lambda p, o, k: jaxctbn.panel.panel_structure_posterior(p, o, family=family, key=k)
    )
    summary = eqx.filter_jit(lambda p: (p.edge_marginals(), p.entropy()))
    for step, k in enumerate(jax.random.split(keys[0], K)):
        subject, option = int(res.subject[step]), int(res.option[step])
        observations = pool.subject_observations(jnp.asarray(subject), jnp.asarray(option))
        assert bool(observations.intervention.targets[0, 0]) == (option > 0)
        posterior = update(posterior, observations, jax.random.fold_in(k, 0x7570))
        edges, entropy = summary(posterior)
        np.testing.assert_allclose(res.auroc[step + 1], edge_auroc(edges, pool.reference))
        np.testing.assert_allclose(res.entropy[step + 1], entropy, rtol=1e-9)
    assert np.any(np.asarray(res.option) > 0)  # some subjects drawn from a sub-pool
    final = eqx.filter_jit(lambda p: p.moment_matched())(posterior)
    for a, b in zip(
        jax.tree_util.tree_leaves(res.statistics), jax.tree_util.tree_leaves(final.statistics)
    ):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    # the root (node 0) learns only from the subjects drawn from the full pool: its dwell time
    # under the empty parent set is that of their panels, in every particle
    spans = np.asarray(pool.observations.times)
    counts = np.asarray(pool.observations.num_observations)
    full = [int(s) for s, o in zip(np.asarray(res.subject), np.asarray(res.option)) if o == 0]
    expected = sum(spans[s, counts[s] - 1] - spans[s, 0] for s in full)
    totals = np.asarray(posterior.components.statistics.dwell_times[0][:, 0]).sum((1, 2))
    np.testing.assert_allclose(totals, expected, rtol=1e-9)
    with pytest.raises(ValueError, match="panel_posterior: expected StructureParticleFilter"):
        jaxctbn.experiments.run_pool(
            pool, design, keys[0], num_experiments=K, panel_posterior=jaxctbn.panel.StructuralEM()
        )


def test_filter_bound_carries_across_chunks_and_resumes(prepared, tmp_path, monkeypatch):
    """`run_pool_experiment` starts each chunk's particle filter from the bound on a bridge's
    uniformisation times that the chunks before it grew to, records it per repetition, and a
    resumed run starts from the recorded bounds: the same bounds and results (the growth
    itself, a stand-in here that doubles every chunk, is checked in test_panel_posterior)."""
    import dataclasses

    from jaxctbn._experiments import pool_run as pool_module

    pool, fit = prepared
    tried = []

    def doubling(run, family, *, inputs=None):
        tried.append(family.max_candidates)
        out = run(dataclasses.replace(family, max_candidates=64))  # one program
        return out, dataclasses.replace(family, max_candidates=2 * family.max_candidates)

    monkeypatch.setattr(pool_module, "with_candidate_growth", doubling)
    family = jaxctbn.panel.StructureParticleFilter(num_particles=8, max_candidates=1)
    out = tmp_path / "run"
    # every subject, as test_cli_run_pool's passive design runs (the same compiled program)
    settings = dict(designs=["passive"], repetitions=3, experiments=24, chunk=1, out=str(out))
    first = pool_module.run_pool_experiment(
        pool, fit, **settings, progress=False, panel_posterior=family
    )
    assert tried == [1, 2, 4]
    assert first["results"]["passive"]["max_candidates"].tolist() == [2, 4, 8]
    os.remove(out / "chunks" / "passive" / "2-2.npz")
    tried.clear()
    again = pool_module.run_pool_experiment(
        pool, fit, **settings, progress=False, panel_posterior=family
    )
    assert tried == [4]
    for key, value in first["results"]["passive"].items():
        np.testing.assert_array_equal(again["results"]["passive"][key], value)


def test_bad_root(panel):
    _, obs, _ = panel
    with pytest.raises(ValueError, match="unknown node 'X'"):
        jaxctbn.experiments.prepare_pool(obs, NAMES, (2, 2, 2), root="X")
    flipping = jaxctbn.panel.PanelObservations(
        [[0.0, 1.0]] * 2, [[[0, 0], [1, 0]], [[1, 1], [0, 1]]]
    )
    with pytest.raises(ValueError, match="no subject has 'R' observed in one state"):
        jaxctbn.experiments.prepare_pool(flipping, ("R", "A"), (2, 2), root="R")
    with pytest.raises(ValueError, match="observational data"):
        jaxctbn.experiments.prepare_pool(
            eqx.tree_at(
                lambda o: o.intervention,
                obs,
                jaxctbn.Intervention(
                    targets=jnp.ones(obs.batch_shape + (3,), bool),
                    states=jnp.zeros(obs.batch_shape + (3,), jnp.int32),
                ),
                is_leaf=lambda x: x is None,
            ),
            NAMES,
            (2, 2, 2),
            root="R",
        )


def test_cli_run_pool(tmp_path, capsys):
    """`jaxctbn run pool` on the panel of the tests above: the documented files and columns,
    every subject drawn once per repetition (24 experiments: the loops of the passive and
    random designs are those of `test_filter_bound_carries_across_chunks_and_resumes` and
    `test_particle_filter_pool_equals_a_replay`; the VBHC and its negative share one), each
    from its option's pool; a rerun loads the chunks."""
    data = tmp_path / "panel.csv"
    df = _simulate()
    df.to_csv(data, index=False)
    out = tmp_path / "run"
    argv = ["run", "pool", "--data", str(data), "--observation", "panel", "--root", "R"]
    argv += ["--designs", "passive,random,vbhc,negative-vbhc", "--repetitions", "2"]
    argv += ["--experiments", "24", "--samples", "2", "--seed", "4", "--out", str(out)]
    argv += ["--particles", "8"]  # the particle filter: run pool's default
    # one repetition per compiled batch: the passive and random designs' programs are those of
    # test_filter_bound_carries_across_chunks_and_resumes and
    # test_particle_filter_pool_equals_a_replay
    argv += ["--chunk", "1"]
    code = main([*argv, "--no-progress"])
    assert code == 0, capsys.readouterr().err
    for name in ("config.json", "truth.json", "metrics.csv", "results.json", "summary.md"):
        assert (out / name).exists(), name
    assert json.loads((out / "results.json").read_text())["input_format"] == {"data": "jaxctbn"}
    assert (out / "figure.png").exists() and (out / "interventions.png").exists()
    assert (out / "chunks" / "negative-vbhc" / "1-1.npz").exists()
    metrics = pd.read_csv(out / "metrics.csv")
    assert set(metrics.design) == {"passive", "random", "vbhc", "negative-vbhc"}
    assert {"entropy", "auroc", "aupr", "subject", "intervention"} <= set(metrics.columns)
    assert len(metrics) == 4 * 2 * 25
    assert set(metrics.intervention.dropna()) <= {"none", "R=0", "R=1"}
    # every design draws from its option's pool, never the same subject twice in a repetition
    root = df.groupby("trajectory_id")["R"].first().astype(int)
    drawn = metrics[metrics.experiment > 0]
    for (design, _), group in drawn.groupby(["design", "repetition"]):
        assert group.subject.is_unique and len(group) == 24  # every subject, once
        for subject, label in zip(group.subject, group.intervention):
            assert label == "none" or label == f"R={root[subject]}"
            assert design != "passive" or label == "none"
    settings = json.loads((out / "config.json").read_text())
    assert settings["root"] == "R" and settings["full_data_graph"]["R"] == []
    assert settings["samples"] == 2 and settings["options"]["none"] == 24
    assert settings["posterior"] == {
        "method": "particle-filter",
        "particles": 8,
        "max_candidates": 64,
    }
    bounds = json.loads((out / "results.json").read_text())["designs"]["vbhc"]["max_candidates"]
    assert len(bounds) == 2 and min(bounds) >= 64
    assert "| vbhc | AUROC" in (out / "summary.md").read_text()
    # a rerun loads the finished chunks: same results
    before = (out / "results.json").read_text()
    assert main([*argv, "--no-progress"]) == 0
    after = json.loads((out / "results.json").read_text())
    assert after["designs"] == json.loads(before)["designs"]
    capsys.readouterr()


def test_cli_run_pool_bad_input(tmp_path, capsys):
    df = _simulate(subjects=4)
    df.loc[df.trajectory_id == 1, "A"] = 1  # A constant in subject 1: a valid but odd root
    data = tmp_path / "panel.csv"
    df.to_csv(data, index=False)
    bad = ["--out", str(tmp_path / "bad"), "--no-progress"]
    argv = ["run", "pool", "--data", str(data), "--observation", "panel"]
    assert main(argv + ["--root", "X"] + bad) == 2
    assert "unknown node 'X'" in capsys.readouterr().err
    flipping = tmp_path / "flip.csv"
    pd.DataFrame(
        {"trajectory_id": [0, 0, 1, 1], "time": [0, 1, 0, 1], "R": [0, 1, 1, 0], "A": [0, 0, 1, 1]}
    ).to_csv(flipping, index=False)
    flip = ["run", "pool", "--data", str(flipping), "--observation", "panel", "--root", "R"]
    assert main(flip + bad) == 2
    assert "no subject has 'R' observed in one state" in capsys.readouterr().err
    paths = ["run", "pool", "--data", str(data), "--observation", "paths", "--root", "R"]
    assert main(paths + bad) == 2
    assert "--observation panel" in capsys.readouterr().err
    assert main(["run", "pool", "--observation", "panel", "--root", "R"] + bad) == 2
    assert "--data" in capsys.readouterr().err
    assert main(["run", "structure", "--root", "R"] + bad) == 2
    assert "--root: only with 'run pool'" in capsys.readouterr().err
    assert main(["run", "parameters", "--data", str(data)] + bad) == 2
    assert "--data: only with 'run pool'" in capsys.readouterr().err
    root = argv + ["--root", "R"]
    assert main(root + ["--designs", ""] + bad) == 2  # not the four default designs
    assert "--designs: give one or more comma-separated pool design names" in (
        capsys.readouterr().err
    )
    assert main(root + ["--designs", "vbhc,eig"] + bad) == 2
    assert "--designs: unknown pool design(s) ['eig']" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "bad" / "summary.md")


def test_shipped_pbcseq_panel_matches_its_readme():
    # the packaged data set: the counts its README states (312 patients, 1945 visits, the two
    # trial arms 154 / 158, trt constant per patient), read through the public panel reader
    path = jaxctbn.panel.dataset_path("pbcseq_panel")
    df = pd.read_csv(path)
    assert list(df.columns) == ["trajectory_id", "time", "trt", "ascites", "hepato", "spiders",
                                "edema"]  # fmt: skip
    assert df.trajectory_id.nunique() == 312 and len(df) == 1945
    arms = df.groupby("trajectory_id").trt.agg(["min", "max"])
    assert (arms["min"] == arms["max"]).all()
    assert np.bincount(arms["min"].to_numpy()).tolist() == [154, 158]
    cards = infer_cardinalities(df, missing=True)
    assert cards == dict.fromkeys(["trt", "ascites", "hepato", "spiders", "edema"], 2)
    with pytest.warns(UserWarning, match="single observation"):
        observations, ids = jaxctbn.panel.PanelObservations.read_csv(path, cards)
    assert observations.batch_shape == (312,) and len(ids) == 312
    assert int(np.asarray(observations.num_observations).sum()) == 1945
    readme = os.path.join(os.path.dirname(path), "README.md")
    assert "Mayo Clinic" in open(readme).read()  # the attribution ships next to the data
    with pytest.raises(ValueError, match="name: unknown data set"):
        jaxctbn.panel.dataset_path("pbc")
