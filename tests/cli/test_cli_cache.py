"""The command line's caches: programs exported once and loaded afterwards (the same results and
messages as the usual route, a damaged file rebuilt), and a compilation cache that cannot be
used (the command compiles without it, gives the same results, and says so in one line)."""

import importlib
import json
import warnings

import pytest
from helpers import network_dict

from jaxctbn._cli.main import main

#: the module (`jaxctbn._cli.main` is also the name of its function `main`)
cli = importlib.import_module("jaxctbn._cli.main")


def _moments(tmp_path, out_name, network_json):
    out = tmp_path / out_name
    args = ["moments", "--network", str(network_json), "--duration", "1.5"]
    rc = main([*args, "--initial-state", "A=0,B=1", "--out", str(out)])
    return rc, json.loads(out.read_text())


def test_an_unusable_cache_directory_warns_once_and_changes_no_result(
    tmp_path, monkeypatch, capsys
):
    network = tmp_path / "net.json"
    network.write_text(json.dumps(network_dict()))
    rc, usual = _moments(tmp_path, "usual.json", network)
    assert rc == 0
    capsys.readouterr()
    # a directory below a regular file cannot be created (the tests run as root, where a
    # read-only directory would still be writable)
    monkeypatch.setenv("JAXCTBN_CACHE_DIR", str(network / "cache"))
    rc, without = _moments(tmp_path, "without.json", network)
    assert rc == 0
    assert without == usual
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"jaxctbn: warning: compilation cache {network / 'cache'}: Not a directory; compiling "
        "every program without it (JAXCTBN_CACHE_DIR names another directory, or off)."
    ], err


def test_the_caches_failures_while_running_are_one_line(monkeypatch, capsys):
    """JAX warns once per program when a cache entry cannot be written (a full disk): the
    command shows the first, as one line, and no other; other warnings are all shown."""
    monkeypatch.setattr(cli, "_CACHE_WARNED", [])
    with warnings.catch_warnings():
        warnings.showwarning = cli._show_warning
        warnings.simplefilter("always")
        for program in ("jit_a", "jit_b", "jit_c"):
            warnings.warn(
                f"Error writing persistent compilation cache entry for '{program}': "
                "OSError: [Errno 28] No space left on device\nTraceback ...",
                stacklevel=2,
            )
        warnings.warn("something else", stacklevel=2)
    assert capsys.readouterr().err.splitlines() == [
        "jaxctbn: warning: Error writing persistent compilation cache entry for 'jit_a': "
        "OSError: [Errno 28] No space left on device (the compilation cache's further errors "
        "are not shown; results are the same)",
        "jaxctbn: warning: something else",
    ]


def _panel_data(tmp_path):
    """A 3-state progressive panel (40 subjects, 2-5 visits) and its network JSON."""
    import numpy as np

    rng = np.random.default_rng(0)
    rows = ["trajectory_id,time,S"]
    for subject in range(40):
        times = np.sort(rng.uniform(0.0, 6.0, rng.integers(2, 6)))
        times[0] = 0.0
        jumps = np.cumsum(rng.exponential(2.0, 2))
        for t in times:
            rows.append(f"{subject},{t:.4f},{int(np.sum(jumps <= t))}")
    data = tmp_path / "panel.csv"
    data.write_text("\n".join(rows) + "\n")
    network = tmp_path / "progressive.json"
    network.write_text(
        json.dumps(
            {
                "nodes": [{"name": "S", "cardinality": 3, "parents": []}],
                "cims": {
                    "S": [
                        {
                            "parent_states": {},
                            "Q": [[-0.3, 0.3, 0.0], [0.0, -0.3, 0.3], [0.0, 0.0, 0.0]],
                        }
                    ]
                },
            }
        )
    )
    return data, network


@pytest.fixture
def shardy():
    """JAX's default partitioner, Shardy, which the command line runs under (the suite runs
    under the older GSPMD, `conftest.py`, which does not call exported programs)."""
    import jax

    flag = "jax_use_shardy_partitioner"
    previous = getattr(jax.config, flag)
    jax.config.update(flag, True)
    yield
    jax.config.update(flag, previous)


def test_fit_through_exported_programs_equals_the_usual_route(tmp_path, monkeypatch, shardy):
    """`jaxctbn fit` on panel data with the exported programs: the first call exports the fit's
    and the intervals' programs (the fit's compiled on a second thread, on one code-generating
    thread, while the intervals' is traced), the second loads them (no new file; both ahead,
    on second threads) and rebuilds a damaged one. Compiled with less optimisation (the default
    `JAXCTBN_COMPILE_EFFORT`: the options of `exported._OPTIONS_BY_NAME`), both write the same
    bytes, whose numbers are the usual route's to rounding; with `JAXCTBN_COMPILE_EFFORT=full`
    (XLA's defaults) a call writes the usual route's bytes."""
    data, network = _panel_data(tmp_path)
    base = ["fit", "--network", str(network), "--data", str(data), "--observation", "panel"]
    usual = tmp_path / "usual.json"
    assert main([*base, "--out", str(usual)]) == 0
    cache = tmp_path / "cache"
    monkeypatch.setenv("JAXCTBN_CACHE_DIR", str(cache))
    monkeypatch.setenv("JAXCTBN_EXPORTED_PROGRAMS", "on")
    # both programs are compiled ahead (on second threads) in both calls: exported ahead in
    # the first, loaded in the second
    from jaxctbn._cli import exported

    used_ahead = []
    loaded_ahead = exported._loaded_ahead
    monkeypatch.setattr(
        exported,
        "_loaded_ahead",
        lambda *a: used_ahead.append(loaded_ahead(*a)) or used_ahead[-1],
    )
    options = {}
    compiler_options = exported.compiler_options
    monkeypatch.setattr(
        exported,
        "compiler_options",
        lambda name, leaves, **kw: options.setdefault(name, compiler_options(name, leaves, **kw)),
    )
    outputs = []
    for call in range(2):
        used_ahead.clear()
        out = tmp_path / f"exported{call}.json"
        assert main([*base, "--out", str(out)]) == 0
        outputs.append(out.read_bytes())
        assert [x is not None for x in used_ahead] == [True, True], (call, used_ahead)
        files = sorted((cache / "exported").iterdir())
        assert [f.name.split("-")[0] for f in files] == ["fit_rates", "rate_uncertainty"]
        if call == 0:
            written = {f: f.stat().st_mtime_ns for f in files}
            damaged = files[0]
            damaged.write_bytes(damaged.read_bytes()[:-10])  # cut: fails its checksum
    assert damaged.stat().st_mtime_ns != written[damaged]  # rebuilt
    assert files[1].stat().st_mtime_ns == written[files[1]]  # loaded as it was
    assert options == {
        "fit_rates": exported._ITERATES | exported._ONE_CODEGEN_THREAD,
        "rate_uncertainty": exported._RUNS_ONCE,
    }
    assert outputs[0] == outputs[1]
    _assert_numbers_close(json.loads(outputs[0]), json.loads(usual.read_bytes()), 1e-10)
    monkeypatch.setenv("JAXCTBN_COMPILE_EFFORT", "full")
    options.clear()
    full = tmp_path / "full.json"
    assert main([*base, "--out", str(full)]) == 0
    assert options == {"fit_rates": {}, "rate_uncertainty": {}}
    assert full.read_bytes() == usual.read_bytes()


def _assert_numbers_close(got, expected, rtol: float, where: str = "") -> None:
    """`got` and `expected` (parsed JSON) have the same structure, strings and flags, and their
    numbers agree to `rtol` relative."""
    assert type(got) is type(expected) or {type(got), type(expected)} == {int, float}, where
    if isinstance(expected, dict):
        assert got.keys() == expected.keys(), where
        for key in expected:
            _assert_numbers_close(got[key], expected[key], rtol, f"{where}/{key}")
    elif isinstance(expected, list):
        assert len(got) == len(expected), where
        for i, (g, e) in enumerate(zip(got, expected)):
            _assert_numbers_close(g, e, rtol, f"{where}[{i}]")
    elif isinstance(expected, float):
        assert got == pytest.approx(expected, rel=rtol, abs=0), where
    else:
        assert got == expected, where


def test_compile_effort_chooses_xla_options_and_falls_back_to_its_defaults(
    tmp_path, monkeypatch, shardy
):
    """The panel fit's programs take less optimisation on the CPU (the intervals' only while
    the data are small), other programs and `JAXCTBN_COMPILE_EFFORT=full` XLA's defaults, a
    misspelt setting a one-line error (exit 2, nothing written); an XLA that refuses an option
    compiles with its defaults, with the results of the usual route."""
    import equinox as eqx
    import jax.numpy as jnp
    import numpy as np

    from jaxctbn._cli import exported

    small = [np.zeros((10, 4)), np.zeros(3)]
    large = [np.zeros((exported._RUNS_ONCE_MAX_ELEMENTS + 1,))]
    assert exported.compiler_options("rate_uncertainty", small) == exported._RUNS_ONCE
    assert exported.compiler_options("rate_uncertainty", large) == {}
    assert exported.compiler_options("fit_rates", large) == exported._ITERATES
    beside = exported.compiler_options("fit_rates", small, beside_tracing=True)
    assert beside == exported._ITERATES | exported._ONE_CODEGEN_THREAD
    assert exported.compiler_options("fit_rates_gradient", small, beside_tracing=True) == {}
    assert exported.compiler_options("fit_rates_gradient", small) == {}  # (L-BFGS: its bits)
    assert exported.compiler_options("learn_structure", small) == {}
    monkeypatch.setenv("JAXCTBN_COMPILE_EFFORT", "full")
    assert exported.compiler_options("fit_rates", small) == {}
    monkeypatch.setenv("JAXCTBN_COMPILE_EFFORT", "fastest")
    out = tmp_path / "out.json"
    network = tmp_path / "net.json"
    network.write_text(json.dumps(network_dict()))
    args = ["moments", "--network", str(network), "--duration", "1.5", "--out", str(out)]
    assert main(args) == 2
    assert not out.exists()
    monkeypatch.setenv("JAXCTBN_COMPILE_EFFORT", "low")

    # an option this XLA does not know: its defaults, from then on
    monkeypatch.setenv("JAXCTBN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("JAXCTBN_EXPORTED_PROGRAMS", "on")
    monkeypatch.setitem(exported._OPTIONS_BY_NAME, "scaled", {"xla_no_such_option": True})
    monkeypatch.setattr(exported, "_OPTIONS_REFUSED", type(exported._OPTIONS_REFUSED)())
    fn = eqx.filter_jit(lambda x: jnp.cumsum(x) * 2.0)
    x = jnp.arange(5.0)
    assert bool(jnp.all(exported.call_exported("scaled", fn, x) == fn(x)))
    assert len(list((tmp_path / "cache" / "exported").iterdir())) == 1  # not the usual route
    assert exported._OPTIONS_REFUSED.is_set()
    assert exported.compiler_options("fit_rates", small) == {}


def test_exporting_reuses_no_trace_of_the_usual_route_and_empties_no_cache(
    tmp_path, monkeypatch, shardy
):
    """A function traced the usual way (its check a host callback) and then exported is traced
    again with its check as a value (the checks' mode is part of JAX's trace context), so it
    exports, without emptying the jit caches; and the usual route traced after it still raises
    the library's message."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    from jaxctbn import _errors
    from jaxctbn._cli import exported

    monkeypatch.setenv("JAXCTBN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("JAXCTBN_EXPORTED_PROGRAMS", "on")
    cleared = []
    monkeypatch.setattr(jax, "clear_caches", lambda: cleared.append(True))

    @eqx.filter_jit
    def checked(x):
        return _errors.error_if(x * 3.0, x < 0, "x: must be >= 0.")

    x = jnp.array([1.0, 2.0])
    usual = checked(x)  # traced with the callback
    assert _errors.mode_in_trace_context()
    got = exported.call_exported("checked", checked, x)
    assert bool(jnp.all(got == usual))
    assert len(list(tmp_path.joinpath("exported").iterdir())) == 1  # exported, not the usual route
    assert cleared == []
    with pytest.raises(Exception, match="x: must be >= 0."):
        checked(jnp.array([1.0, -1.0]))


def test_an_exported_program_fails_as_the_usual_route_does(tmp_path, monkeypatch, shardy):
    """A check that fails inside an exported program raises the library's message of the usual
    route (the failure is a value of the program, which is then called the usual way); a
    program with a batched loop exports; and results equal the usual route's bit for bit."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    from jaxctbn import _errors
    from jaxctbn._cli.exported import call_exported

    monkeypatch.setenv("JAXCTBN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("JAXCTBN_EXPORTED_PROGRAMS", "on")

    @eqx.filter_jit
    def halvings(x):
        def count(v):  # a while loop, batched by the vmap
            return jax.lax.while_loop(lambda c: c[0] > 1, lambda c: (c[0] / 2, c[1] + 1), (v, 0))[1]

        x = _errors.error_if(x, x < 0, "x: must be >= 0.")
        return jax.vmap(count)(x), jnp.sqrt(x)

    x = jnp.array([1.0, 7.5, 1000.0])
    expected = halvings(x)
    got = call_exported("halvings", halvings, x)
    assert all(bool(jnp.all(a == b)) for a, b in zip(got, expected))
    assert len(list((tmp_path / "exported").iterdir())) == 1
    # inside another trace (a verb called under jit or lax.map) the program is part of that one
    traced = jax.jit(lambda v: call_exported("halvings", halvings, v))(x + 1)
    assert all(bool(jnp.all(a == b)) for a, b in zip(traced, halvings(x + 1)))
    assert len(list((tmp_path / "exported").iterdir())) == 1
    with pytest.raises(Exception, match="x: must be >= 0.") as usual:
        halvings(jnp.array([1.0, -2.0, 3.0]))
    with pytest.raises(type(usual.value), match="x: must be >= 0."):
        call_exported("halvings", halvings, jnp.array([1.0, -2.0, 3.0]))


def test_checks_are_carried_out_of_the_operations_that_hold_them_only(
    tmp_path, monkeypatch, shardy
):
    """Exporting traces an operation with no check inside it (an inner `jit`, a loop) once,
    passed through as it was traced; a check inside a loop is still carried out of it: the
    exported program fails with the usual route's message and otherwise equals it."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    from jax.experimental import checkify

    from jaxctbn import _errors
    from jaxctbn._cli import exported
    from jaxctbn._cli.exported import call_exported

    monkeypatch.setenv("JAXCTBN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("JAXCTBN_EXPORTED_PROGRAMS", "on")

    @jax.jit
    def free(x):  # no check inside
        return jax.lax.fori_loop(0, 3, lambda i, y: jnp.sin(y) * 2, x)

    def step(total, v):  # a check inside the loop
        return _errors.error_if(total + v, v < 0, "x: must be >= 0."), None

    @eqx.filter_jit
    def program(x):
        total = jax.lax.scan(step, jnp.zeros((), x.dtype), x)[0]
        return free(x), total  # (traced after the check: checkify would thread its error)

    def jit_outputs(x):
        with _errors.checks_as_values(), exported._checks_carried_only_where_they_are():
            jaxpr = jax.make_jaxpr(checkify.checkify(program, errors=checkify.user_checks))(x)
        inner = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "jit"][0].params["jaxpr"]
        counts = {e.primitive.name: len(e.outvars) for e in inner.jaxpr.eqns}
        return counts["jit"], counts["scan"]

    x = jnp.array([1.0, 7.5, 1000.0])
    # the check-free `jit` keeps its one output (checkify's own rule threads the loop's error
    # through it: 3); the loop with a check carries the error's two values out
    assert jit_outputs(x) == (1, 1 + 2)
    expected = program(x)
    got = call_exported("program", program, x)
    assert all(bool(jnp.all(a == b)) for a, b in zip(got, expected))
    with pytest.raises(Exception, match="x: must be >= 0.") as usual:
        program(jnp.array([1.0, -2.0, 3.0]))
    with pytest.raises(type(usual.value), match="x: must be >= 0."):
        call_exported("program", program, jnp.array([1.0, -2.0, 3.0]))


def test_lapack_is_prepared_only_for_programs_that_call_it(tmp_path, monkeypatch, shardy):
    """JAX prepares its CPU LAPACK kernels (importing scipy.linalg) before running any exported
    program: the file says whether the program calls LAPACK, a program that does not is run
    without that step and one that does (a linear solve) with it, both with the results of the
    usual route, loaded or just exported."""
    import equinox as eqx
    import jax.numpy as jnp
    from jax._src.export import _export as export_internals

    from jaxctbn._cli import exported
    from jaxctbn._cli.exported import call_exported

    monkeypatch.setenv("JAXCTBN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("JAXCTBN_EXPORTED_PROGRAMS", "on")
    prepared = []
    usual = export_internals._ensure_backends_initialized
    monkeypatch.setattr(
        export_internals,
        "_ensure_backends_initialized",
        lambda platforms: (prepared.append(platforms), usual(platforms)),
    )
    a = jnp.array([[4.0, 1.0], [1.0, 3.0]])
    b = jnp.array([1.0, 2.0])
    for fn, lapack in [
        (eqx.filter_jit(lambda a, b: a @ b + 1.0), False),
        (eqx.filter_jit(jnp.linalg.solve), True),
    ]:
        for call in range(2):  # exported, then loaded
            prepared.clear()
            got = call_exported(f"lapack-{lapack}", fn, a, b)
            assert bool(jnp.all(got == fn(a, b)))
            assert len(prepared) == int(lapack), (lapack, call, prepared)
        (path,) = [p for p in (tmp_path / "exported").iterdir() if f"lapack-{lapack}" in p.name]
        assert exported._load(str(path))[2] is lapack
    assert export_internals._ensure_backends_initialized is not usual  # the spy, restored


def test_learn_through_an_exported_program_equals_the_usual_route(tmp_path, monkeypatch, shardy):
    """`jaxctbn learn` with the exported programs: the structure posterior's program and those of
    its summary and MAP model are exported by the first call and loaded by the second, and both
    write the usual route's bytes."""
    import jax
    import jax.numpy as jnp

    import jaxctbn as jc

    model = jc.CTBN.from_dict(network_dict())
    paths = jc.sample_trajectories(
        model, jnp.array([0, 0]), 3.0, key=jax.random.key(0), num_trajectories=20
    )
    data = tmp_path / "paths.csv"
    paths.write_csv(data, model)
    usual = tmp_path / "usual.json"
    assert main(["learn", "--data", str(data), "--out", str(usual)]) == 0
    monkeypatch.setenv("JAXCTBN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("JAXCTBN_EXPORTED_PROGRAMS", "on")
    for call in range(2):
        out = tmp_path / f"exported{call}.json"
        assert main(["learn", "--data", str(data), "--out", str(out)]) == 0
        assert out.read_bytes() == usual.read_bytes()
        files = sorted(f.name.split("-")[0] for f in (tmp_path / "cache" / "exported").iterdir())
        assert files == ["learn_structure", "map_model", "structure_summary"]


def test_design_and_moments_through_exported_programs_equal_the_usual_route(
    tmp_path, monkeypatch, capsys, shardy
):
    """`jaxctbn design` on a path history and `jaxctbn moments` with the exported programs:
    the prior, the history's update, the scoring and the moments are exported by the first call
    and loaded by the second, and each call writes the usual route's bytes; a scoring program
    over the memory budget leaves the exported route for the usual route's chunks."""
    import jax
    import jax.numpy as jnp

    import jaxctbn as jc

    model = jc.CTBN.from_dict(network_dict())
    network = tmp_path / "net.json"
    network.write_text(json.dumps(network_dict()))
    paths = jc.sample_trajectories(
        model, jnp.array([0, 0]), 2.0, key=jax.random.key(0), num_trajectories=6
    )
    data = tmp_path / "paths.csv"
    paths.write_csv(data, model)
    design = ["design", "--target", "parameters", "--network", str(network), "--data", str(data)]
    design += ["--initial-state", "A=0,B=0", "--duration", "2", "--samples", "3", "--seed", "0"]
    moments = ["moments", "--network", str(network), "--duration", "1.5"]
    moments += ["--initial-state", "A=0,B=1"]
    usual = {}
    for name, argv in (("design", design), ("moments", moments)):
        usual[name] = tmp_path / f"usual-{name}.json"
        assert main([*argv, "--out", str(usual[name])]) == 0
    cache = tmp_path / "cache"
    monkeypatch.setenv("JAXCTBN_CACHE_DIR", str(cache))
    monkeypatch.setenv("JAXCTBN_EXPORTED_PROGRAMS", "on")
    for call in range(2):
        for name, argv in (("design", design), ("moments", moments)):
            out = tmp_path / f"exported-{name}{call}.json"
            assert main([*argv, "--out", str(out)]) == 0
            assert out.read_bytes() == usual[name].read_bytes(), (name, call)
        files = sorted(f.name.rsplit("-", 1)[0] for f in (cache / "exported").iterdir())
        assert files == ["design", "moments", "path-history", "rate-prior"]
    # a budget between one candidate's program (~37 KiB) and the whole one's: the chunks of
    # the usual route, with or without exported programs
    monkeypatch.setenv("JAXCTBN_MEMORY_BUDGET", "60K")
    chunked = []
    for route in ("on", "off"):
        monkeypatch.setenv("JAXCTBN_EXPORTED_PROGRAMS", route)
        out = tmp_path / f"chunked-{route}.json"
        capsys.readouterr()
        assert main([*design, "--out", str(out)]) == 0
        assert "at a time" in capsys.readouterr().err
        chunked.append(out.read_bytes())
    assert chunked[0] == chunked[1]


def test_a_program_compiles_to_one_cache_entry_wherever_its_arguments_live(shardy):
    """Every route compiles an exported program for its arguments' types alone: arguments made
    from host data (a model given to a fit, which `load_ahead` uses as the fitted model's
    stand-in) and arrays a program computed (the fitted model) find the same compilation-cache
    entry, so that the call after a first one compiles nothing."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxctbn._cli import exported

    leaves = [np.full((3, 3), 0.5), np.arange(3.0)]
    program, _, lapack = exported._export(
        jax.jit(lambda a, b: a @ b + 1.0),
        leaves,
        jax.tree_util.tree_structure((0, 0)),
        (None, None),
    )
    # arrays a program computed, placed on a device (committed, as a fit's outputs are)
    computed = jax.device_put(jax.jit(lambda a, b: (a * 1.0, b * 1.0))(*leaves), jax.devices()[0])
    events = []
    jax.monitoring.register_event_listener(lambda event, **kw: events.append(event))
    counts, results = [], []
    for args in (leaves, list(computed), leaves):
        before = len(events)
        results.append(exported._compiled("sum", program, lapack, args)(*args))
        counts.append(events[before:].count("/jax/compilation_cache/cache_hits"))
    assert counts == [0, 1, 1], counts  # compiled once, then found in the cache
    assert all(bool(jnp.all(r[1][0] == results[0][1][0])) for r in results)
