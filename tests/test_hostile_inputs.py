"""Issue 35: inputs of a hostile new user that gave silent wrong answers, raw exceptions or
unclear messages now give one line that names the argument and what is valid (or a right
answer). Each case failed before its fix. The command-line cases live beside their commands'
other checks (`test_cli.py`, `test_pool.py`)."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import jaxctbn as jc
from jaxctbn._errors import error_message
from jaxctbn._experiments.pool import run_pool_repetitions
from jaxctbn._learning.priors import MAX_HYPERPARAMETER
from jaxctbn._master_equation.automatic_solver import resolve_solver

jax.config.update("jax_enable_x64", True)

NAMES, CARDS = ("A", "B"), (2, 2)


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda v: jc.GammaPrior(v, 1.0), "alpha"),
        (lambda v: jc.GammaPrior(1.0, v), "beta"),
        (lambda v: jc.NodelmanPrior(v, 1.0), "alpha"),
        (lambda v: jc.NodelmanPrior(1.0, v), "tau"),
    ],
)
@pytest.mark.parametrize(
    "value", [math.inf, 1e308, math.nan, 0.0, -1.0, np.float64(math.inf), np.array([1.0, math.inf])]
)
def test_priors_refuse_non_finite_and_overflowing_hyperparameters(make, name, value):
    """`GammaPrior(inf, 1)`, `GammaPrior(1e308, 1)` and `NodelmanPrior(1, inf)` gave NaN edge
    marginals with no error."""
    with pytest.raises(ValueError, match=f"^{name}: prior parameters must be > 0 and finite"):
        make(value)


@pytest.mark.usefixtures("no_runtime_typecheck")
def test_prior_arguments_of_the_wrong_kind_are_named():
    with pytest.raises(ValueError, match="^alpha: expected a positive number or one per node"):
        jc.GammaPrior("a", 1.0)  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="^tau: expected a positive number or one per node"):
        jc.NodelmanPrior(1.0, "x")  # pyright: ignore[reportArgumentType]
    truth = jc.CTBN.from_dict(
        {
            "nodes": [
                {"name": "A", "cardinality": 2, "parents": []},
                {"name": "B", "cardinality": 2, "parents": ["A"]},
            ],
            "cims": {
                "A": [{"parent_states": {}, "Q": [[-1.0, 1.0], [2.0, -2.0]]}],
                "B": [
                    {"parent_states": {"A": 0}, "Q": [[-1.0, 1.0], [2.0, -2.0]]},
                    {"parent_states": {"A": 1}, "Q": [[-3.0, 3.0], [0.5, -0.5]]},
                ],
            },
        }
    )
    message = "^prior: expected a prior Module such as GammaPrior"
    with pytest.raises(ValueError, match=message):
        jc.StructureLearningTask(truth, max_parents=1, prior="foo")  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="^prior: parameter learning takes a GammaPrior"):
        jc.ParameterLearningTask(truth, prior="foo")  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="^prior: parameter learning takes a GammaPrior"):
        jc.ParameterLearningTask(truth, prior=jc.NodelmanPrior())  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match=message):
        jc.StructurePosterior.from_prior(NAMES, CARDS, max_parents=1, prior="foo")  # pyright: ignore[reportArgumentType]
    task = jc.ParameterLearningTask(truth)
    with pytest.raises(ValueError, match=r"^keys: need one key per repetition .* shape \(0,\)"):
        jc.run_repetitions(task, jc.PassiveDesign(), jax.random.split(jax.random.key(0), 0),
                           num_experiments=1)  # fmt: skip


def test_the_largest_hyperparameters_still_give_finite_posteriors():
    """At the bound the scores stay finite and the edge marginals are probabilities; just
    above it the prior is refused (not NaN)."""
    M = jnp.array([[[0.0, 3.0], [2.0, 0.0]]])
    T = jnp.array([[1.5, 0.7]])
    for prior in (
        jc.GammaPrior(MAX_HYPERPARAMETER, 1.0),
        jc.GammaPrior(1.0, MAX_HYPERPARAMETER),
        jc.NodelmanPrior(MAX_HYPERPARAMETER, MAX_HYPERPARAMETER),
    ):
        score = prior.log_marginal_likelihood(0, M, T, 1)
        assert np.isfinite(float(score)), prior
        posterior = jc.StructurePosterior.from_prior(NAMES, CARDS, max_parents=1, prior=prior)
        edges = np.asarray(posterior.edge_marginals())
        assert np.all(np.isfinite(edges)) and np.all((edges >= 0) & (edges <= 1))
    with pytest.raises(ValueError, match="at most 1e\\+08"):
        jc.GammaPrior(MAX_HYPERPARAMETER * 1.01, 1.0)


def test_traced_hyperparameters_are_checked_where_used():
    """A prior built inside jit (traced values) is checked by `eqx.error_if` on its use: an
    infinite one is an error, not NaN."""
    M = jnp.array([[[0.0, 3.0], [2.0, 0.0]]])
    T = jnp.array([[1.5, 0.7]])

    @jax.jit
    def score(alpha):
        return jc.GammaPrior(alpha, 1.0).log_marginal_likelihood(0, M, T, 1)

    assert np.isfinite(float(score(2.0)))
    with pytest.raises(Exception, match="alpha: prior parameters must be > 0 and finite"):
        score(jnp.inf).block_until_ready()
    # docs/faq.md: under a plain jax.jit XLA wraps the check's error ("INTERNAL: CpuCallback
    # error"), under eqx.filter_jit it is an EquinoxRuntimeError after JAX's stack summary;
    # error_message gives the one line either way (what the CLI prints)
    message = "alpha: prior parameters must be > 0 and finite."
    with pytest.raises(Exception) as plain:
        score(jnp.inf).block_until_ready()
    assert not isinstance(plain.value, eqx.EquinoxRuntimeError)
    assert error_message(plain.value) == message
    with pytest.raises(eqx.EquinoxRuntimeError) as filtered:
        eqx.filter_jit(score.__wrapped__)(jnp.asarray(jnp.inf))
    assert error_message(filtered.value) == message


#: Sets the file-size limit, then becomes `python -m jaxctbn._cli ARGV` (set in the child
#: itself: a `preexec_fn` would fork this multithreaded process).
_LIMITED = """
import os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failing write, not a killed process
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
os.execv(sys.executable, [sys.executable, "-m", "jaxctbn._cli", *sys.argv[2:]])
"""


def _limited_run(argv, cwd, max_file_bytes):
    """`jaxctbn ARGV` in a subprocess whose files may not grow past `max_file_bytes` (a write
    beyond fails with EFBIG, as a full disk fails with ENOSPC)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, JAXCTBN_CACHE_DIR="off")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # (the tests' shared cache: no files written)
    return subprocess.run(
        [sys.executable, "-c", _LIMITED, str(max_file_bytes), *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )


def test_a_full_file_system_names_the_file_and_leaves_nothing(tmp_path):
    """`jaxctbn sample` onto a real, tiny, full file system (a 32 KiB tmpfs mounted in a
    private mount namespace): `No space left on device` naming the file, nothing left on it.
    Needs `unshare -m` and `mount` (root); where they are not allowed, the file-size limit of
    the next test stands in for it."""
    import os
    import shlex
    import shutil
    import subprocess
    import sys

    if (
        shutil.which("unshare") is None
        or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode
    ):
        pytest.skip("no private mount namespace here (unshare -m); see the next test")
    _independent_binary_nodes(1).to_json(tmp_path / "net.json")
    full = tmp_path / "full"
    full.mkdir()
    cli = [sys.executable, "-m", "jaxctbn._cli", "sample", "--network", str(tmp_path / "net.json")]
    cli += ["--trajectories", "2000", "--duration", "3", "--seed", "0", "--out", "paths.csv"]
    script = (
        f"mount -t tmpfs -o size=32k tmpfs {shlex.quote(str(full))} || exit 97\n"
        f"cd {shlex.quote(str(full))} && {shlex.join(cli)}\n"
        'echo "rc=$?"; ls -A .\n'
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, JAXCTBN_CACHE_DIR="off")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], env=env, capture_output=True, text=True
    )
    if proc.returncode == 97:
        pytest.skip("mount -t tmpfs is not allowed here; see the next test")
    assert proc.stdout.strip().splitlines() == ["rc=2"], (proc.stdout, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write 'paths.csv': No space left on device" in lines[0]


def test_a_failed_write_names_the_file_and_leaves_nothing(tmp_path):
    """A full disk gave a bare `[Errno 28]`, a truncated CSV from `sample` and empty JSON files
    from `learn` and `moments`. Every output is now written to a temporary file and renamed:
    a failing write leaves no file (and no temporary one) and its one error line names it."""
    truth = jc.CTBN.from_dict(
        {
            "nodes": [{"name": "A", "cardinality": 2, "parents": []}],
            "cims": {"A": [{"parent_states": {}, "Q": [[-1.0, 1.0], [2.0, -2.0]]}]},
        }
    )
    truth.to_json(tmp_path / "net.json")
    sample = ["sample", "--network", "net.json", "--trajectories", "2000", "--duration", "3"]
    sample += ["--seed", "0", "--out", "paths.csv"]
    moments = ["moments", "--network", "net.json", "--duration", "1", "--initial-state", "A=0"]
    moments += ["--out", "moments.json"]
    for argv, out, limit in ((sample, "paths.csv", 64 * 1024), (moments, "moments.json", 64)):
        proc = _limited_run(argv, tmp_path, limit)
        assert proc.returncode == 2, proc.stderr[-2000:]
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and f"cannot write '{out}': File too large" in lines[0], lines
        assert sorted(p.name for p in tmp_path.iterdir()) == ["net.json"]


def _independent_binary_nodes(n):
    q = [[-1.0, 1.0], [2.0, -2.0]]
    return jc.CTBN.from_dict(
        {
            "nodes": [{"name": f"X{i}", "cardinality": 2, "parents": []} for i in range(n)],
            "cims": {f"X{i}": [{"parent_states": {}, "Q": q}] for i in range(n)},
        }
    )


def test_exact_solvers_refuse_state_spaces_they_cannot_hold(tmp_path, capsys):
    """`moments --solver exact` on 40 nodes raised an int32 `OverflowError`, the Python API
    XLA's `RESOURCE_EXHAUSTED` (8.8 TB); now one line before anything is allocated, naming the
    approximate solvers. The automatic solver still switches to mean-field without a word."""
    from jaxctbn._cli import main

    big = _independent_binary_nodes(40)
    init = jnp.zeros(40, jnp.int32)
    message = r"^solver: 40 nodes have 1,099,511,627,776 global states, more than the exact"
    with pytest.raises(ValueError, match=message + r" Uniformisation .*MeanField\(\) or Gillespie"):
        jc.expected_statistics(big, init, 1.0, solver=jc.Uniformisation())
    # the automatic solver switches to MeanField instead (tests/master_equation/test_mean_field.py solves)
    assert resolve_solver(jc.AutomaticSolver(), big) == jc.MeanField()
    # the dense exponential of panel inference stops far earlier (4S x 4S matrices)
    thirteen = _independent_binary_nodes(13)
    panel = jc.panel.PanelObservations([[0.0, 1.0]], [[[0] * 13, [1] * 13]])
    with pytest.raises(ValueError, match=r"^solver: 13 nodes have 8,192 global states"):
        jc.panel.panel_log_likelihood(thirteen, panel, solver=jc.MatrixExponential())
    big.to_json(tmp_path / "big.json")
    argv = ["moments", "--network", str(tmp_path / "big.json"), "--duration", "1"]
    argv += ["--initial-state", ",".join(f"X{i}=0" for i in range(40)), "--solver", "exact"]
    assert main([*argv, "--out", str(tmp_path / "m.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--solver mean-field" in err[0], err
    assert not (tmp_path / "m.json").exists()


def _two_node_chain(a, b, c, d, dtype):
    """A -> B, binary: A flips at rates a (0->1) and b; B follows A at rate c, leaves at d."""
    model = jc.CTBN.from_dict(
        {
            "nodes": [
                {"name": "A", "cardinality": 2, "parents": []},
                {"name": "B", "cardinality": 2, "parents": ["A"]},
            ],
            "cims": {
                "A": [{"parent_states": {}, "Q": [[-a, a], [b, -b]]}],
                "B": [
                    {"parent_states": {"A": 0}, "Q": [[-d, d], [c, -c]]},
                    {"parent_states": {"A": 1}, "Q": [[-c, c], [d, -d]]},
                ],
            },
        }
    )
    return jax.tree_util.tree_map(lambda x: x.astype(dtype), model)


_log_rate = st.floats(-3.0, 3.0)
_log_gap = st.floats(-3.0, 7.0)


@settings(max_examples=30, deadline=None)
@given(
    rates=st.tuples(_log_rate, _log_rate, _log_rate, _log_rate),
    gaps=st.tuples(_log_gap, _log_gap, _log_gap),
    seen=st.lists(st.integers(0, 3), min_size=4, max_size=4),
)
# found by this test: the filter's block exponential (with the integral it did not need)
# overflowed in float32 at ||tau W|| = 2e9; the filter now propagates with the transition
# matrix alone
@example(rates=(0.0, 0.0, 2.0, 2.0), gaps=(0.0, 0.0, 7.0), seen=[0, 0, 0, 0])
def test_float32_panel_likelihood_holds_against_float64_over_all_gaps(rates, gaps, seen):
    """float32 with the dense exponential gave +0.108 (a positive log-probability) for one
    node with rates 30 and 5 across a gap of 1e6, and random panels with one 1e6 gap were off
    by up to 1.17 nats: the squarings of a long gap let the rows of e^{hW} drift from summing
    to one. Over gaps 1e-3..1e7 and rates 1e-3..1e3 float32 now agrees with float64."""
    a, b, c, d = (10.0**r for r in rates)
    # times as float32 holds them, the same for both (what is compared is the exponential,
    # not the rounding of the data's times); gaps lost to that rounding are not a panel
    times = np.concatenate([[0.0], np.cumsum([10.0**g for g in gaps])]).astype(np.float32)
    assume(np.all(np.diff(times) > 0))
    states = [[s // 2, s % 2] for s in seen]
    results = {}
    for dtype in (jnp.float32, jnp.float64):
        obs = jc.panel.PanelObservations(jnp.asarray([times], dtype), [states])
        model = _two_node_chain(a, b, c, d, dtype)
        results[dtype] = float(
            jc.panel.panel_log_likelihood(model, obs, solver=jc.MatrixExponential()).sum()
        )
    exact = results[jnp.float64]
    assert results[jnp.float32] <= 1e-6  # a log-probability
    assert abs(results[jnp.float32] - exact) <= 2e-3 * max(1.0, abs(exact)), results


def test_the_issue_example_and_rate_fits_at_long_gaps():
    """The issue's case exactly (rates 30 and 5, a gap of 1e6: exact ln(30/35) = -0.154), and
    the rate fit's own (pooled-by-gap) likelihood in float32 against float64's."""
    one = jc.CTBN.from_dict(
        {
            "nodes": [{"name": "A", "cardinality": 2, "parents": []}],
            "cims": {"A": [{"parent_states": {}, "Q": [[-30.0, 30.0], [5.0, -5.0]]}]},
        }
    )
    one = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), one)
    for gap in (1e4, 1e6, 1e7):
        obs = jc.panel.PanelObservations(jnp.asarray([[0.0, gap]], jnp.float32), [[[0], [1]]])
        ll = jc.panel.panel_log_likelihood(one, obs, solver=jc.MatrixExponential())
        np.testing.assert_allclose(float(ll.sum()), math.log(30 / 35), rtol=1e-5)
    rng = np.random.default_rng(0)
    gaps = np.where(rng.random((20, 3)) < 0.3, 1e6, rng.uniform(0.1, 2.0, (20, 3)))
    times = np.concatenate([np.zeros((20, 1)), np.cumsum(gaps, 1)], 1).astype(np.float32)
    states = rng.integers(0, 2, (20, 4, 2))
    fits = {}
    for dtype in (jnp.float32, jnp.float64):
        obs = jc.panel.PanelObservations(jnp.asarray(times, dtype), states)
        start = _two_node_chain(1.0, 2.0, 0.5, 1.5, dtype)
        fit = jc.panel.fit_rates(start, obs, method=jc.panel.EMFit(max_iterations=2))
        fits[dtype] = fit
        at_fit = jc.panel.panel_log_likelihood(
            jc.CTBN(
                cims=[c.astype(jnp.float64) for c in fit.model.cims],
                parents=fit.model.parents,
                names=fit.model.names,
            ),
            jc.panel.PanelObservations(jnp.asarray(times, jnp.float64), states),
            solver=jc.MatrixExponential(),
        ).sum()
        np.testing.assert_allclose(float(fit.log_likelihood), float(at_fit), rtol=1e-4)
    np.testing.assert_allclose(
        float(fits[jnp.float32].log_likelihood), float(fits[jnp.float64].log_likelihood), rtol=1e-3
    )


def test_rate_fits_need_an_interval(tmp_path, capsys):
    """`fit --observation panel` where every subject has one visit raised a raw `IndexError`
    (the median of no gaps)."""
    from jaxctbn._cli import main

    model = _two_node_chain(1.0, 2.0, 0.5, 1.5, jnp.float64)
    single = jc.panel.PanelObservations([[0.0], [0.5]], [[[0, 1]], [[1, 1]]])
    with pytest.raises(ValueError, match="^observations: every trajectory has a single"):
        jc.panel.fit_rates(model, single)
    model.to_json(tmp_path / "net.json")
    (tmp_path / "one.csv").write_text("trajectory_id,time,A,B\n0,0,0,1\n1,0,1,1\n2,0.5,0,0\n")
    argv = ["fit", "--network", str(tmp_path / "net.json"), "--data", str(tmp_path / "one.csv")]
    assert main([*argv, "--observation", "panel", "--out", str(tmp_path / "fit.json")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and "each subject needs at least two visits" in err[0], err
    assert not (tmp_path / "fit.json").exists()


def test_moments_names_its_own_flags_when_the_duration_is_too_long(tmp_path, capsys):
    """`moments`' max-terms message advised options that exist only in Python and did not name
    `--duration`; mean-field with `--duration 1e6` surfaced diffrax's "increase `max_steps`"."""
    from jaxctbn._cli import main

    _two_node_chain(1.0, 2.0, 0.5, 1.5, jnp.float64).to_json(tmp_path / "net.json")
    argv = ["moments", "--network", str(tmp_path / "net.json"), "--initial-state", "A=0,B=0"]
    argv += ["--out", str(tmp_path / "m.json")]
    for extra, message in (
        (["--duration", "1e9"], "--duration: 1e+09 is too long for the exact solver"),
        (
            ["--duration", "1e7", "--solver", "mean-field"],
            "--duration: 1e+07 is too long for the mean-field equations",
        ),
    ):
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
        assert "max_terms" not in err[0] and "max_steps" not in err[0]
    assert not (tmp_path / "m.json").exists()


def _brute_force_panel_log_likelihood(model, times, states):
    """The conditional panel log-likelihood by hand: the global generator from the CIMs
    (numpy), scipy's `expm` per gap, a uniform start over the states the first observation
    allows, then predict-and-restrict at every later observation (-1 = missing)."""
    import itertools

    import scipy.linalg

    cards = model.cardinalities
    space = list(itertools.product(*(range(k) for k in cards)))
    index = {s: i for i, s in enumerate(space)}
    Q = np.zeros((len(space), len(space)))
    for s in space:
        for n, k in enumerate(cards):
            config = 0
            for p in model.parents[n]:
                config = config * cards[p] + s[p]
            cim = np.asarray(model.cims[n])[config]
            for x in range(k):
                if x != s[n]:
                    t = list(s)
                    t[n] = x
                    Q[index[s], index[tuple(t)]] += cim[s[n], x]
    Q -= np.diag(Q.sum(1))

    def allowed(y):
        return np.array([all(v < 0 or v == x for v, x in zip(y, s)) for s in space], float)

    p = allowed(states[0])
    p /= p.sum()
    total = 0.0
    for i in range(1, len(times)):
        p = (p @ scipy.linalg.expm((times[i] - times[i - 1]) * Q)) * allowed(states[i])
        total += np.log(p.sum())
        p /= p.sum()
    return total


@settings(max_examples=25, deadline=None)
@given(
    rates=st.tuples(_log_rate, _log_rate, _log_rate, _log_rate),
    gaps=st.tuples(_log_gap, _log_gap, _log_gap),
    seen=st.lists(st.lists(st.integers(-1, 1), min_size=2, max_size=2), min_size=4, max_size=4),
)
def test_panel_likelihood_with_missing_values_and_extreme_gaps_equals_brute_force(
    rates, gaps, seen
):
    """Missing values anywhere (whole rows too), gaps 1e-3..1e7, rates 1e-3..1e3: the dense
    filter equals the hand-written forward algorithm with scipy's exponential (float64)."""
    a, b, c, d = (10.0**r for r in rates)
    times = np.concatenate([[0.0], np.cumsum([10.0**g for g in gaps])])
    model = _two_node_chain(a, b, c, d, jnp.float64)
    obs = jc.panel.PanelObservations([times], [seen])
    got = float(jc.panel.panel_log_likelihood(model, obs, solver=jc.MatrixExponential())[0])
    expected = _brute_force_panel_log_likelihood(model, times, seen)
    assert got <= 1e-9
    assert abs(got - expected) <= 1e-6 * max(1.0, abs(expected)), (got, expected)


@pytest.mark.filterwarnings("ignore:data.*single observation time:UserWarning")
@settings(max_examples=6, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    missing=st.floats(0.0, 0.4),
    one_visit=st.integers(0, 8),
    log_scale=st.floats(-2.0, 3.0),
)
def test_pool_on_ragged_panels_with_missing_values(seed, missing, one_visit, log_scale):
    """The pool experiment on panels with missing values anywhere (the root too), one-visit
    subjects and time scales 1e-2..1e3 (tests/experiments/test_pool.py's simulated subjects, R -> A -> B):
    the sub-pools are those of a hand-written rule, every subject is drawn once and from its
    option, and every metric is finite; or a clear error when the data allow no pool."""
    from test_pool import NAMES, _simulate

    rng = np.random.default_rng(seed)
    df = _simulate(seed=seed % 7).replace("", np.nan)
    df[list(NAMES)] = df[list(NAMES)].astype(float).mask(rng.random((len(df), 3)) < missing)
    short = rng.choice(np.arange(1, 24), one_visit, replace=False)  # subject 0 keeps 5 visits
    df = df[~(df.trajectory_id.isin(short) & (df.time > 0))]
    df["time"] = df["time"] * 10.0**log_scale
    obs, ids = jc.panel.PanelObservations.from_dataframe(df, {n: 2 for n in NAMES})
    expected = np.zeros((3, len(ids)), bool)
    expected[0] = True
    for s, subject in enumerate(ids):
        roots = set(df[df.trajectory_id == subject]["R"].dropna().astype(int))
        if len(roots) == 1:
            expected[1 + roots.pop(), s] = True
    try:
        pool, _ = jc.experiments.prepare_pool(
            obs, NAMES, (2, 2, 2), root="R", subject_ids=ids, max_iterations=3
        )
    except ValueError as error:  # no subject keeps R constant, or no edge learned
        message = str(error)
        assert "no subject has 'R' observed in one state" in message or (
            "has no edge (or every edge)" in message
        ), message
        return
    np.testing.assert_array_equal(np.asarray(pool.membership), expected)
    keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.key(0), r))(jnp.arange(2))
    K = len(ids)
    res = run_pool_repetitions(
        pool, jc.RandomDesign(), keys, num_experiments=K, panel_posterior=None
    )
    for r in range(2):
        subjects, options = np.asarray(res.subject[r]), np.asarray(res.option[r])
        assert sorted(subjects.tolist()) == list(range(K))
        assert np.all(expected[options, subjects])
    for metric in (res.entropy, res.auroc, res.aupr):
        assert np.all(np.isfinite(np.asarray(metric)))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        # issue 61: raw numpy, type or JAX errors before
        (
            lambda: jc.panel.PanelObservations.from_sequences(
                [np.array([0.0, 1.0, 2.0])], [np.zeros((2, 1), int)]
            ),
            r"states\[0\]: expected shape \(3, N\)",
        ),
        (
            lambda: jc.StructurePosterior.from_prior(
                NAMES,
                CARDS,
                max_parents=1,
                knowledge=jc.PriorKnowledge(required_edges=[("A", "C")]),
            ),
            "required_edges: unknown node 'C'",
        ),
        (
            lambda: jc.StructurePosterior.from_prior(
                NAMES,
                CARDS,
                max_parents=1,
                knowledge=jc.PriorKnowledge(forbidden_edges=[("A", 1)]),
            ),
            r"forbidden_edges: each edge is a \(parent, child\) pair",
        ),
        (
            lambda: jc.panel.Emissions([np.array([["a", "b"], ["c", "d"]])]),
            r"matrices\[0\]: expected probabilities \(numbers\)",
        ),
        (  # a symbol beyond the emission matrix's columns: named as a symbol, not a state
            lambda: jc.panel.panel_log_likelihood(
                jc.CTBN(
                    cims=[jnp.array([[[-1.0, 1.0, 0.0], [1.0, -2.0, 1.0], [0.0, 1.0, -1.0]]])],
                    parents=((),),
                    names=("B",),
                ),
                jc.panel.PanelObservations(np.array([[0.0, 1.0]]), np.array([[[2], [1]]])),
                emissions=jc.panel.Emissions([np.array([[0.9, 0.1], [0.1, 0.9], [0.5, 0.5]])]),
            ),
            r"has symbol 2 for node 'B', whose emission matrix has symbols 0..1",
        ),
        (
            lambda: jc.score_interventions(
                jc.RatePosterior.for_model(
                    jc.CTBN(cims=[jnp.array([[[-1.0, 1.0], [1.0, -1.0]]])], parents=((),))
                ),
                jc.Intervention(targets=jnp.zeros((0, 1), bool), states=jnp.zeros((0, 1), int)),
                jnp.array([0]),
                1.0,
                key=jax.random.key(0),
                batch=jc.criteria.GivenBatch(),
            ),
            "members: a batch needs at least one experiment",
        ),
    ],
)
def test_structure_and_panel_inputs_are_one_line(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_required_edges_by_name_are_those_by_index():
    by_name = jc.StructurePosterior.from_prior(
        NAMES, CARDS, max_parents=1, knowledge=jc.PriorKnowledge(required_edges=[("A", "B")])
    )
    by_index = jc.StructurePosterior.from_prior(
        NAMES, CARDS, max_parents=1, knowledge=jc.PriorKnowledge(required_edges=[(0, 1)])
    )
    for a, b in zip(by_name.parent_sets, by_index.parent_sets):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(by_name.parent_sets[1]), [[0]])


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["prevalence", "--times", "-1,1"], "write --times=-1,1"),
        (["design", "--observation-times", "-1,0.5"], "write --observation-times=-1,0.5"),
    ],
)
def test_a_value_with_a_leading_minus_is_explained(argv, hint, capsys):
    from jaxctbn._cli import main

    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and hint in lines[0], lines


@pytest.mark.parametrize(
    "argv, message",
    [
        (["design", "--visits", "1000000"], "argument --visits: at most 1,000"),
        (["run", "parameters", "--outcome", "panel", "--visits", "100000"], "at most 1,000"),
        (["learn", "--restarts", "1000000000"], "argument --restarts: at most 100,000"),
    ],
)
def test_sizes_beyond_what_the_machine_holds_are_one_line(argv, message, capsys):
    # issue 61: these were killed at a memory cap or hung for minutes
    from jaxctbn._cli import main

    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(num_experiments=1.5), "num_experiments must be an integer"),
        (dict(num_experiments=1, horizon=-1.0), r"horizon: must be positive and finite, got -1"),
        (dict(num_experiments=1, horizon=math.nan), "horizon: must be positive and finite"),
        (dict(num_experiments=1, horizon=math.inf), "horizon: must be positive and finite"),
        (dict(num_experiments=1, max_events=10**12), r"max_events must be at most 2\*\*31 - 1"),
        (dict(num_experiments=1, batching="vmap"), "batching: expected Vmap"),
    ],
)
def test_repetition_settings_are_one_line_before_anything_compiles(settings, message):
    # issue 61's own sweep of run_repetitions: a fractional count was blamed on batch_size, a
    # bad horizon surfaced from inside the compiled loop, a huge buffer as an OverflowError
    truth = jc.CTBN(cims=[jnp.array([[[-1.0, 1.0], [1.0, -1.0]]])], parents=((),))
    task = jc.ParameterLearningTask(truth, prior=jc.GammaPrior(1.0, 1.0))
    design = jc.CriterionDesign(jc.BHC(), num_samples=2)
    with pytest.raises(ValueError, match=message):
        jc.run_repetitions(task, design, jax.random.split(jax.random.key(0), 2), **settings)


def test_a_duration_too_long_for_the_solver_or_the_buffer_names_its_flag(tmp_path, capsys):
    # issue 61's own sweep: design advised the solver's Python-only `max_terms`; run with a
    # horizon of 1e308 sized no buffer and blamed --max-events, which was not given
    from jaxctbn._cli import main

    model = jc.CTBN(cims=[jnp.array([[[-1.0, 1.0], [2.0, -2.0]]])], parents=((),), names=("A",))
    model.to_json(tmp_path / "net.json")
    network = ["--network", str(tmp_path / "net.json")]
    design = ["design", *network, "--target", "parameters", "--initial-state", "A=0"]
    design += ["--duration", "1e308", "--seed", "0", "--samples", "2"]
    run = ["run", "parameters", *network, "--horizon", "1e308", "--repetitions", "1"]
    run += ["--experiments", "1", "--designs", "passive", "--no-progress"]
    for argv, message in (
        (design, "--duration: 1e+308 is too long for the exact solver"),
        (run, "horizon: 1e+308 is too long for a path's event buffer"),
    ):
        out = tmp_path / "out"
        assert main([*argv, "--out", str(out)]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], lines
        assert "max_terms" not in lines[0] and "--max-events" not in lines[0]
        assert not out.exists()
