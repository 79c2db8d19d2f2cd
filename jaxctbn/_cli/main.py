"""The `jaxctbn` command line."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit code 2
        self.exit(2, f"jaxctbn: error: {message}\n")


def _cache_dir():
    """The persistent compilation cache directory, or None when disabled.

    `JAXCTBN_CACHE_DIR` overrides it (empty or `off` disables the cache); the default is
    `$XDG_CACHE_HOME/jaxctbn/jax-compilation-cache` (`~/.cache/...` without XDG_CACHE_HOME).
    """
    value = os.environ.get("JAXCTBN_CACHE_DIR")
    if value is not None:
        value = value.strip()
        if not value or value.lower() == "off":
            return None
        return os.path.expanduser(value)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jaxctbn", "jax-compilation-cache")


def _setup_jax():
    import logging

    import jax

    jax.config.update("jax_enable_x64", True)
    # A check inside compiled code (eqx.error_if) raises from a host callback, and JAX also logs
    # that callback's traceback to stderr; the CLI prints the library's own message instead.
    logging.getLogger("jax._src.callback").setLevel(logging.CRITICAL)
    # the same random bits, compiled in less time (a third less for `run structure`)
    from .threefry_lowering import use_unrolled_threefry_on_cpu

    use_unrolled_threefry_on_cpu()
    path = _cache_dir()
    if path is not None:
        # Compilation dominates a CLI call on small data; JAX's persistent cache keeps the
        # compiled programs between calls. By default JAX only stores programs that took >= 1 s
        # to compile, so lower the thresholds: small CPU programs are worth caching too.
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        _cache_programs_with_callbacks()


def _cache_programs_with_callbacks():
    """Let JAX's persistent cache store programs that contain host callbacks.

    Every `eqx.error_if` puts a host callback into its program, and JAX does not cache such
    programs, so without this the commands' main programs would be recompiled on every call.
    JAX refuses them because a deserialised executable needs the callbacks of the running
    process. The cache key hashes the lowered module, which refers to its callbacks by their
    index in the lowering's callback list, and every call lowers its program afresh, so a hit
    can be loaded with the current lowering's callbacks (the same functions, in the same order).

    This wraps three private JAX functions (checked against jax 0.10); where they are not
    as expected it does nothing, and such programs are simply compiled as before.
    """
    import inspect
    import threading

    try:
        from jax._src import compilation_cache, compiler
    except ImportError:
        return
    if getattr(compiler, "_jaxctbn_callbacks_cached", False):
        return
    compile_or_get_cached = getattr(compiler, "compile_or_get_cached", None)
    cache_write = getattr(compiler, "_cache_write", None)
    get_executable = getattr(compilation_cache, "get_executable_and_time", None)
    if compile_or_get_cached is None or cache_write is None or get_executable is None:
        return
    expected = [
        (compile_or_get_cached, ["backend", "computation", "devices", "compile_options"]),
        (cache_write, ["cache_key", "compile_time_secs", "module_name", "backend"]),
        (get_executable, ["cache_key", "compile_options", "backend", "executable_devices"]),
    ]
    try:
        for fn, names in expected:
            params = list(inspect.signature(fn).parameters)
            if params[: len(names)] != names:
                return
        if list(inspect.signature(compile_or_get_cached).parameters)[4] != "host_callbacks":
            return
        if list(inspect.signature(cache_write).parameters)[5:] != ["host_callbacks"]:
            return
    except (TypeError, ValueError, IndexError):
        return
    state = threading.local()

    class _WithCallbacks:  # the backend, deserialising with this lowering's callbacks
        def __init__(self, backend, callbacks):
            self._backend, self._callbacks = backend, list(callbacks)

        def __getattr__(self, name):
            return getattr(self._backend, name)

        def deserialize_executable(self, serialized, executable_devices, compile_options=None):
            return self._backend.deserialize_executable(
                serialized, executable_devices, compile_options, host_callbacks=self._callbacks
            )

    def compile_or_get_cached_(
        backend, computation, devices, compile_options, host_callbacks, *a, **k
    ):
        previous, state.callbacks = getattr(state, "callbacks", None), host_callbacks
        try:
            return compile_or_get_cached(
                backend, computation, devices, compile_options, host_callbacks, *a, **k
            )
        finally:
            state.callbacks = previous

    def cache_write_(
        cache_key, compile_time_secs, module_name, backend, executable, host_callbacks
    ):
        return cache_write(cache_key, compile_time_secs, module_name, backend, executable, ())

    def get_executable_(cache_key, compile_options, backend, executable_devices):
        callbacks = getattr(state, "callbacks", None)
        if callbacks:
            backend = _WithCallbacks(backend, callbacks)
        return get_executable(cache_key, compile_options, backend, executable_devices)

    compiler.compile_or_get_cached = compile_or_get_cached_
    compiler._cache_write = cache_write_
    compilation_cache.get_executable_and_time = get_executable_
    setattr(compiler, "_jaxctbn_callbacks_cached", True)  # noqa: B010 (a module of jax)


def _load_network(path):
    from .._model.ctbn import CTBN

    if not os.path.exists(path):
        raise ValueError(f"--network: file {path!r} does not exist.")
    return CTBN.from_json(path)


def _assignment(values, names, cardinalities, what):
    from .._model.layout import parse_assignment

    text = ",".join(values) if isinstance(values, list) else values
    return parse_assignment(text, names, what, cardinalities)


def _initial_state(values, names, cardinalities):
    """`--initial-state NODE=STATE,...` for every node: `({name: state}, int array (N,))`."""
    import jax.numpy as jnp

    init = _assignment(values, names, cardinalities, "--initial-state")
    missing = [n for n in names if n not in init]
    if missing:
        raise ValueError(f"--initial-state: missing node(s) {missing}; give NODE=STATE for all.")
    return init, jnp.asarray([init[n] for n in names], jnp.int32)


def _positive_number(text) -> float:
    """argparse type: a positive finite number (durations, horizons, prior parameters)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value > 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text!r}")
    return value


def _non_negative_number(text) -> float:
    """argparse type: a finite number >= 0 (tolerances)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not (value >= 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _hyperparameter(text) -> float | tuple[float, ...]:
    """argparse type: a prior hyper-parameter, one positive number or one per node in node
    order, comma-separated (`5,0.2,5,0.2`)."""
    parts = [t for t in str(text).split(",")]
    if len(parts) == 1:
        return _positive_number(parts[0])
    return tuple(_positive_number(t.strip()) for t in parts)


def _at_least(minimum: int):
    """argparse type: an integer >= `minimum` (counts: trajectories, samples, repetitions...)."""

    def parse(text) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value

    return parse


MAX_SEED = 2**63 - 1


def _seed(text) -> int:
    """argparse type: a seed for `jax.random.key`, 0 <= S <= 2**63 - 1.

    JAX takes a seed as a signed 64-bit integer and raises OverflowError beyond; negative seeds
    are refused too, so that each valid seed is one plain number (no sign convention to keep).
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be between 0 and 2**63 - 1, got {text!r}")
    return value


# what each command writes to --out; checked before any work starts
_OUT_KINDS = {
    "sample": "file",
    "moments": "file",
    "learn": "file",
    "fit": "file",
    "design": "file",
    "run": "directory",
    "demo": "directory",
}


def _check_out(path: str, kind: str) -> None:
    """Raise a `ValueError` naming `--out` when `path` cannot be written as a `kind`
    (`"file"` or `"directory"`), so that a long run does not fail only when it saves.

    Writability is tested by creating (and at once removing) an unnamed temporary file where
    the output will go: permission bits alone do not tell (root ignores them, a read-only
    mount does not). Nothing is left behind; a missing output directory is not created here."""
    if kind == "file":
        if os.path.isdir(path):
            raise ValueError(f"--out: {path!r} is a directory; give a file path.")
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            why = "is not a directory" if os.path.exists(folder) else "does not exist"
            raise ValueError(f"--out: cannot write {path!r}: {folder!r} {why}.")
        if os.path.exists(path):
            try:
                open(path, "a").close()  # opened for appending, not written: the file is unchanged
            except OSError as e:
                raise ValueError(f"--out: cannot write {path!r}: {e.strerror or e}.") from None
            return
    else:
        if os.path.exists(path) and not os.path.isdir(path):
            raise ValueError(f"--out: {path!r} exists and is not a directory; give a directory.")
        folder = os.path.abspath(path)
        while not os.path.exists(folder):  # the nearest existing ancestor gets the new folders
            folder = os.path.dirname(folder)
        if not os.path.isdir(folder):
            raise ValueError(f"--out: cannot create directory {path!r}: {folder!r} is a file.")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise ValueError(
            f"--out: cannot write {path!r}: directory {folder!r} is not writable "
            f"({e.strerror or e})."
        ) from None


def _cmd_sample(args):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from .._model.interventions import Intervention
    from .._paths.csv import write_trajectories_csv
    from .._paths.sampling import sample_within_cap

    model = _load_network(args.network)
    duration = args.duration  # checked by argparse (_positive_number)
    intervention = Intervention.perfect(
        model, _assignment(args.intervention, model.names, model.cardinalities, "--intervention")
    )
    key = jax.random.key(args.seed)
    key_init, key_paths = jax.random.split(key)
    if args.initial_state:
        _, initial = _initial_state(args.initial_state, model.names, model.cardinalities)
    else:  # uniformly random initial state per trajectory
        initial = jnp.stack(
            [
                jax.random.randint(k, (args.trajectories,), 0, c)
                for k, c in zip(jax.random.split(key_init, model.num_nodes), model.cardinalities)
            ],
            axis=1,
        ).astype(jnp.int32)
    traj = sample_within_cap(
        model,
        initial,
        duration,
        key=key_paths,
        num_trajectories=args.trajectories,
        intervention=intervention,
        max_events=args.max_events,
        name="--max-events",
    )
    write_trajectories_csv(traj, model, args.out)
    n_events = int(np.asarray(traj.num_events).sum())
    print(f"wrote {args.trajectories} trajectories ({n_events} jumps) to {args.out}")


def _cmd_moments(args):
    import jax.numpy as jnp
    import numpy as np

    from .._model.interventions import Intervention

    model = _load_network(args.network)
    duration = args.duration
    init, initial = _initial_state(args.initial_state, model.names, model.cardinalities)
    assignment = _assignment(args.intervention, model.names, model.cardinalities, "--intervention")
    from .._master_equation.master_equation import ExpectedStatistics, resolve_solver
    from .._master_equation.mean_field import MeanField
    from .._master_equation.solvers import AutomaticSolver, Uniformisation

    intervention = Intervention.perfect(model, assignment)
    solver = {"auto": AutomaticSolver(), "exact": Uniformisation(), "mean-field": MeanField()}[
        args.solver
    ]
    used = resolve_solver(solver, model)
    states = math.prod(model.cardinalities)
    exact = not isinstance(used, MeanField)
    stats, per_node, effective = _jit(_moments)(
        model, initial, jnp.asarray(duration), intervention, used
    )
    out = {
        "duration": duration,
        "initial_state": {n: int(effective[i]) for i, n in enumerate(model.names)},
        "intervention": assignment,
        "solver": {
            "name": "uniformisation" if exact else "mean-field",
            "exact": exact,
            "global_states": states,
            "chosen": "automatically" if args.solver == "auto" else "by --solver",
            "max_global_states": solver.max_global_states
            if isinstance(solver, AutomaticSolver)
            else None,
        },
        "nodes": {},
    }
    if isinstance(stats, ExpectedStatistics):
        out["global"] = {
            "nodes": list(model.names),
            "expected_dwell": np.asarray(stats.dwell_times).tolist(),
            "final_marginal": np.asarray(stats.final_marginal).tolist(),
        }
    for i, name in enumerate(model.names):
        out["nodes"][name] = {
            "parents": [model.names[p] for p in model.parents[i]],
            "expected_dwell": np.asarray(per_node[i][0]).tolist(),
            "expected_transitions": np.asarray(per_node[i][1]).tolist(),
        }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    how = (
        f"exact, uniformisation over {states} global states"
        if exact
        else f"approximate: mean-field, the {states} global states exceed "
        f"{out['solver']['max_global_states']}"
        if args.solver == "auto"
        else "approximate: mean-field, by --solver"
    )
    print(
        f"wrote expected statistics of {model.num_nodes} nodes over [0, {duration}] to "
        f"{args.out} ({how})"
    )


def _jit(fn):
    """`fn` compiled as one program: a sequence of small eager operations costs one compilation
    (or persistent-cache lookup) per operation, a noticeable part of a short CLI call."""
    import equinox as eqx

    return eqx.filter_jit(fn)


def _moments(model, initial, duration, intervention, solver):
    """What `moments` writes: the statistics, each node's (dwell, transitions), the initial state."""
    from .._master_equation.master_equation import expected_statistics

    stats = expected_statistics(model, initial, duration, intervention=intervention, solver=solver)
    per_node = [
        (stats.node_dwell_times(i), stats.node_transitions(i)) for i in range(model.num_nodes)
    ]
    return stats, per_node, intervention.initial_states(initial)


def _structure_summary(post):
    """`parent_set_probabilities()`, `edge_marginals()`, `entropy()`, `map_graph()` and
    `map_model()` of a structure posterior, the array parts compiled as one program."""
    probs, edges, entropy = _jit(
        lambda p: (p.parent_set_probabilities(), p.edge_marginals(), p.entropy())
    )(post)
    return probs, edges, entropy, post.map_graph(), post.map_model()


def _max_parents(value, N):
    """`--max-parents` (default min(2, N - 1)), checked against the number of nodes."""
    max_parents = min(2, N - 1) if value is None else value
    if not 0 <= max_parents <= N - 1:
        raise ValueError(
            f"--max-parents: must be between 0 and {N - 1} (N - 1), got {max_parents}."
        )
    return max_parents


def _parse_cardinalities(text, df, *, missing: bool = False):
    """The node cardinalities: inferred from the data `df`, overridden by `--cardinalities`
    (never below the largest state seen). The warning of a suspicious inferred cardinality is
    shown only for nodes that `--cardinalities` does not give."""
    import warnings

    from .._model.layout import parse_assignment
    from .._paths.csv import infer_cardinalities

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        inferred = infer_cardinalities(df, missing=missing)
    out = dict(inferred)
    given = parse_assignment(",".join(text), list(out), "--cardinalities")
    for w in caught:
        if not any(f"node {name!r} " in str(w.message) for name in given):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    for name, k in given.items():
        if k < inferred[name]:
            raise ValueError(
                f"--cardinalities: {name!r} has states up to {inferred[name] - 1} in the data, "
                f"so K must be >= {inferred[name]}."
            )
        out[name] = k
    return out


def _prior(args, num_nodes: int):
    """The rate prior named by `--prior` (alias `--prior-convention`; the CLI's only string for
    it) with `--alpha`, `--beta` (for `nodelman`, `--beta` is the imaginary time tau); per-node
    values need one per node."""
    from .._learning.priors import GammaPrior, NodelmanPrior

    for flag, value in (("--alpha", args.alpha), ("--beta", args.beta)):
        if isinstance(value, tuple) and len(value) != num_nodes:
            raise ValueError(
                f"{flag}: give one value or one per node ({num_nodes}), got {len(value)}."
            )
    import numpy as np

    cls = GammaPrior if args.prior == "gamma" else NodelmanPrior
    return cls(
        *(np.asarray(v, float) if isinstance(v, tuple) else v for v in (args.alpha, args.beta))
    )


def _empirical_bayes(args):
    """`--empirical-bayes`: an `EmpiricalBayes` Module (per node when `--alpha`/`--beta` have
    one value per node), or `None`."""
    if not args.empirical_bayes:
        return None
    from .._learning.empirical_bayes import EmpiricalBayes

    per_node = isinstance(args.alpha, tuple) or isinstance(args.beta, tuple)
    return EmpiricalBayes(per_node=per_node)


def _prior_json(args, posterior=None) -> dict:
    """The prior as written to output files: given values, and fitted ones under
    `--empirical-bayes`."""
    import numpy as np

    from .._experiments.run import _json_value as value

    out = {"convention": args.prior, "alpha": value(args.alpha), "beta": value(args.beta)}
    if args.empirical_bayes and posterior is not None:
        names = type(posterior.prior).hyperparameter_names
        fitted = [value(np.asarray(getattr(posterior.prior, n))) for n in names]
        out["empirical_bayes"] = {"alpha": fitted[0], "beta": fitted[1]}
    return out


def _criterion(name: str, paths: int, box_hill: dict):
    """The criterion Module named by `--criterion` (`--paths` >= 1 is checked by the parser);
    `box_hill`: the (V)BHC's structure keywords."""
    from .._criteria.criteria import BHC, EIG, VBHC

    if name == "eig":
        return EIG(num_paths=paths)
    return {"vbhc": VBHC, "bhc": BHC}[name](**box_hill)


def _cmd_learn(args):
    import jax
    import numpy as np

    from .._learning.structure import learn_structure
    from .._paths.csv import read_csv, trajectories_from_dataframe

    panel = args.observation == "panel"
    if not panel and args.exact_entry:
        raise ValueError("--exact-entry: only for panel data (--observation panel).")
    df = read_csv(args.data)
    nodes = _parse_cardinalities(args.cardinalities, df, missing=panel)
    names, cards = list(nodes), tuple(nodes.values())
    N = len(names)
    max_parents = _max_parents(args.max_parents, N)
    extra = {}
    if panel:
        from .._panel.csv import panel_from_dataframe
        from .._panel.structure import learn_structure_from_panels

        entry = _assignment(args.exact_entry, names, cards, "--exact-entry")
        observations, ids = panel_from_dataframe(df, nodes, exact_entry=entry)
        num_trajectories = len(ids)
        fit = learn_structure_from_panels(
            observations,
            names,
            cards,
            max_parents=max_parents,
            prior=_prior(args, N),
            tolerance=args.tolerance,
            max_iterations=args.max_iterations,
        )
        post = fit.posterior
        extra = {
            "log_likelihood": float(fit.log_likelihood),
            "em": {"iterations": fit.iterations, "converged": fit.converged},
        }
    else:
        # long trajectories come back cut into pieces: ids has one entry per row
        traj, ids = trajectories_from_dataframe(df, nodes)
        num_trajectories = len(dict.fromkeys(ids))
        post = learn_structure(traj, names, cards, max_parents=max_parents, prior=_prior(args, N))
    eb = _empirical_bayes(args)
    if eb is not None:
        post = _jit(eb.fit)(post)
    post = jax.tree_util.tree_map(np.asarray, post)
    probs, edges, entropy, graph, map_model = _structure_summary(post)
    out = {
        "prior": {**_prior_json(args, post), "max_parents": max_parents},
        "trajectories": num_trajectories,
        "nodes": {},
        "map_graph": {},
        "entropy": float(entropy),
    }
    for n, name in enumerate(names):
        sets = []
        for i, P in enumerate(np.asarray(post.parent_sets[n])):
            sets.append(
                {
                    "parents": [names[p] for p in P if p >= 0],
                    "log_marginal_likelihood": float(post.log_marginal_likelihoods[n][i]),
                    "posterior": float(probs[n][i]),
                }
            )
        out["nodes"][name] = {
            "cardinality": cards[n],
            "parent_sets": sets,
            "edge_marginals": {names[m]: float(edges[m, n]) for m in range(N) if m != n},
        }
        out["map_graph"][name] = [names[p] for p in graph[n]]
    out["rates"] = map_model.to_dict()
    out.update(extra)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(
        f"learned from {num_trajectories} {'panel ' if panel else ''}trajectories; MAP graph: "
        + ", ".join(f"{k} <- {v}" for k, v in out["map_graph"].items())
        + f"; wrote {args.out}"
    )


def _flagged_rates(model, flags) -> list[dict]:
    """The rates marked in per-node boolean arrays `(configs, k, k)`, by node, parent states
    and transition."""
    import itertools

    import numpy as np

    out = []
    for n, name in enumerate(model.names):
        parents = list(model.parents[n])
        configs = list(itertools.product(*(range(model.cardinalities[p]) for p in parents)))
        for u, x, y in zip(*np.nonzero(np.asarray(flags[n]))):
            out.append(
                {
                    "node": name,
                    "parent_states": {
                        model.names[p]: int(v) for p, v in zip(parents, configs[int(u)])
                    },
                    "from": int(x),
                    "to": int(y),
                }
            )
    return out


def _fit_paths(model, df, alpha, beta):
    """Closed-form rates from complete paths: ML $M/T$, or the Gamma MAP
    $(\alpha-1+M)/(\beta+T)$ clipped at 0; structural zeros stay 0, a configuration never
    visited keeps its starting rate."""
    import jax.numpy as jnp
    import numpy as np

    from .._learning.posterior import path_log_likelihood
    from .._model.ctbn import CTBN
    from .._paths.csv import trajectories_from_dataframe
    from .._paths.sufficient_statistics import SufficientStatistics

    traj, ids = trajectories_from_dataframe(df, model)
    stats = SufficientStatistics.from_trajectories(traj, model.cardinalities, model.parents)
    cims = []
    for n, (q, st) in enumerate(zip(model.cims, stats.pooled())):
        q = np.asarray(q)
        M, T = np.asarray(st.transitions), np.asarray(st.dwell_times)[..., None]
        a = 1.0 if alpha is None else float(np.broadcast_to(alpha, (model.num_nodes,))[n])
        b = 0.0 if beta is None else float(np.broadcast_to(beta, (model.num_nodes,))[n])
        free = (q > 0) & ~np.eye(q.shape[-1], dtype=bool)
        zero = ~free & ~np.eye(q.shape[-1], dtype=bool) & (M > 0)
        if zero.any():
            u, x, y = (int(i) for i in np.argwhere(zero)[0])
            raise ValueError(
                f"data: node {model.names[n]!r} jumps {x} -> {y} (parent configuration {u}), "
                "a rate that is 0 (a structural zero) in --network."
            )
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.maximum(a - 1.0 + M, 0.0) / (b + T)
        rate = np.where(free, np.where(b + T > 0, rate, q), 0.0)
        rate[..., np.arange(q.shape[-1]), np.arange(q.shape[-1])] = 0.0
        rate -= np.eye(q.shape[-1]) * rate.sum(-1, keepdims=True)
        cims.append(jnp.asarray(rate))
    fitted = CTBN(cims=cims, parents=model.parents, names=model.names)
    ll = float(path_log_likelihood(fitted, stats))
    return fitted, ll, len(dict.fromkeys(ids))


def _cmd_fit(args):
    import numpy as np

    from .._learning.priors import GammaPrior
    from .._panel.csv import panel_from_dataframe
    from .._panel.fit import EMFit, GradientFit, fit_rates
    from .._paths.csv import read_csv

    model = _load_network(args.network)
    N = model.num_nodes
    for flag, value in (("--alpha", args.alpha), ("--beta", args.beta)):
        if isinstance(value, tuple) and len(value) != N:
            raise ValueError(f"{flag}: give one value or one per node ({N}), got {len(value)}.")
    if args.prior == "none" and (args.alpha is not None or args.beta is not None):
        raise ValueError("--alpha/--beta: only with --prior gamma.")
    alpha = None if args.prior == "none" else np.asarray(args.alpha or 1.0, float)
    beta = None if args.prior == "none" else np.asarray(args.beta or 1.0, float)
    panel = args.observation == "panel"
    if not panel and args.exact_entry:
        raise ValueError("--exact-entry: only for panel data (--observation panel).")
    df = read_csv(args.data)
    out: dict = {"method": args.method, "observation": args.observation}
    if panel:
        entry = _assignment(args.exact_entry, model.names, model.cardinalities, "--exact-entry")
        observations, ids = panel_from_dataframe(df, model, exact_entry=entry)
        options = {"tolerance": args.tolerance}
        if args.max_iterations is not None:
            options["max_iterations"] = args.max_iterations
        method = EMFit(**options) if args.method == "em" else GradientFit(**options)
        prior = None if alpha is None or beta is None else GammaPrior(alpha, beta)
        fit = fit_rates(model, observations, method=method, prior=prior)
        fitted = fit.model
        out.update(
            log_likelihood=float(fit.log_likelihood),
            log_posterior=float(fit.log_posterior),
            converged=bool(fit.converged),
            iterations=int(fit.iterations),
            at_lower_bound=_flagged_rates(fitted, fit.at_lower_bound),
            at_upper_bound=_flagged_rates(fitted, fit.at_upper_bound),
        )
        num_trajectories = len(ids)
    else:
        # complete paths: the conjugate update is the optimum, in one step
        fitted, ll, num_trajectories = _fit_paths(model, df, alpha, beta)
        out.update(
            log_likelihood=ll, converged=True, iterations=1, at_lower_bound=[], at_upper_bound=[]
        )
    out["trajectories"] = num_trajectories
    out["prior"] = (
        {"convention": "none"}
        if alpha is None
        else {"convention": "gamma", "alpha": args.alpha or 1.0, "beta": args.beta or 1.0}
    )
    out["network"] = fitted.to_dict()
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    state = "converged" if out["converged"] else "did NOT converge"
    print(
        f"fitted {args.method} on {num_trajectories} {args.observation} trajectories: "
        f"log-likelihood {out['log_likelihood']:.6f} ({state}, {out['iterations']} iterations); "
        f"wrote {args.out}"
    )


def _cmd_design(args):
    import jax
    import numpy as np

    from .._learning.posterior import RatePosterior
    from .._paths.csv import read_csv, trajectories_from_dataframe
    from .._paths.sufficient_statistics import SufficientStatistics

    if args.target == "structure":
        return _design_structure(args)
    if args.network is None:
        raise ValueError(
            "--network: required with --target parameters (the known graph, a network JSON)."
        )
    model = _load_network(args.network)
    init, initial = _initial_state(args.initial_state, model.names, model.cardinalities)
    if args.prior != "gamma" or args.empirical_bayes:
        raise ValueError(
            "--prior/--empirical-bayes: parameter learning takes the Gamma prior with given "
            "--alpha/--beta (the Nodelman prior and empirical Bayes are for structure learning)."
        )
    posterior = _jit(RatePosterior.for_model)(model, prior=_prior(args, model.num_nodes))
    if args.data is not None:
        df = read_csv(args.data)
        traj, _ = trajectories_from_dataframe(df, model)
        stats = _jit(SufficientStatistics.from_trajectories)(
            traj, model.cardinalities, model.parents
        )
        posterior = _jit(RatePosterior.update_with)(posterior, stats)
    space = _candidates(args.interventions, model.cardinalities)
    key = jax.random.key(args.seed)
    scores = _score_space(posterior, space, initial, args.duration, key, args)
    _write_ranking(args, np.asarray(scores), space, list(model.names), init, args.duration)


def _design_structure(args):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from .._learning.structure import learn_structure
    from .._paths.csv import (
        RESERVED_COLUMNS,
        infer_cardinalities,
        read_csv,
        trajectories_from_dataframe,
    )

    if args.data is None and args.network is None:
        raise ValueError("--data or --network: give the history (or a network for the node list).")
    df = None if args.data is None else read_csv(args.data)
    if args.network is not None:
        model = _load_network(args.network)
        nodes = dict(zip(model.names, model.cardinalities))
    else:
        # df is read here (the check above raises when --data and --network are both absent)
        nodes = infer_cardinalities(df)  # pyright: ignore[reportArgumentType]
    names, cards = list(nodes), tuple(nodes.values())
    N = len(names)
    max_parents = _max_parents(args.max_parents, N)
    if df is not None:
        extra = [c for c in df.columns if c not in RESERVED_COLUMNS and c not in nodes]
        if extra:
            raise ValueError(f"data: unknown node column(s) {extra}; the nodes are {names}.")
        traj, _ = trajectories_from_dataframe(df, nodes)
    else:  # no history: one empty trajectory contributes nothing
        from .._paths.sampling import Trajectories

        traj = Trajectories(
            initial_states=jnp.zeros((1, N), jnp.int32),
            jump_times=jnp.zeros((1, 1)),
            states=jnp.zeros((1, 1, N), jnp.int32),
            num_events=jnp.zeros((1,), jnp.int32),
            durations=jnp.ones((1,)),
            truncated=jnp.zeros((1,), bool),
            intervention_targets=jnp.ones((1, N), bool),
            intervention_states=jnp.zeros((1, N), jnp.int32),
        )
    posterior = learn_structure(traj, names, cards, max_parents=max_parents, prior=_prior(args, N))
    eb = _empirical_bayes(args)
    if eb is not None:
        posterior = _jit(eb.fit)(posterior)
    args.fitted_prior = _prior_json(args, posterior)

    init, initial = _initial_state(args.initial_state, names, cards)
    space = _candidates(args.interventions, cards)
    key = jax.random.key(args.seed)
    scores = _score_space(posterior, space, initial, args.duration, key, args)
    _write_ranking(args, np.asarray(scores), space, names, init, args.duration)


def _interventions_argument(p) -> None:
    """`--interventions` of `design` and `run`: which candidates are scored."""
    p.add_argument(
        "--interventions",
        choices=["auto", "all", "single"],
        default="auto",
        help="candidates: all (every perfect intervention), single (none or one node clamped), "
        "auto (default: all up to 4096 candidates, else single)",
    )


def _graph_draws_arguments(p) -> None:
    """`--graph-draws` and `--max-sets` of `design` and `run`: how the structure (V)BHC draws
    graphs, over how many parent sets per node."""
    p.add_argument(
        "--graph-draws",
        choices=["auto", "stratified", "joint"],
        default="auto",
        help="structure (V)BHC: stratified (the paper's, per node and parent set), joint (whole "
        "graphs shared by all nodes), auto (default: stratified up to 8 nodes, joint beyond)",
    )
    p.add_argument(
        "--max-sets",
        type=_at_least(1),
        default=None,
        help="structure (V)BHC: score each node's most probable parent sets only (default: all "
        "up to 8 nodes, 32 beyond)",
    )


def _box_hill_options(args, num_nodes: int) -> dict:
    """The structure (V)BHC keywords of `--graph-draws` and `--max-sets` for `num_nodes`."""
    from .._criteria.structure import JointGraphDraws, StratifiedGraphDraws
    from .._experiments.run import default_graph_draws

    draws, max_sets = default_graph_draws(num_nodes, args.graph_draws, args.max_sets)
    return {
        "graph_draws": JointGraphDraws() if draws == "joint" else StratifiedGraphDraws(),
        "max_sets": max_sets,
    }


def _candidates(which, cards):
    """The candidate interventions of `--interventions` (auto: all up to 4096, else single)."""
    from .._model.interventions import design_space, intervention_space, single_node_interventions

    choose = {"auto": design_space, "all": intervention_space, "single": single_node_interventions}
    return choose[which](cards)


def _score_space(posterior, space, initial_state, horizon, key, args):
    from .._criteria.criteria import score_interventions

    return score_interventions(
        posterior,
        space,
        initial_state,
        horizon,
        criterion=_criterion(
            args.criterion, args.paths, _box_hill_options(args, len(posterior.cardinalities))
        ),
        key=key,
        num_samples=args.samples,
    )


def _write_ranking(args, scores, space, names, init, duration):
    import numpy as np

    targets, states = np.asarray(space.targets), np.asarray(space.states)

    def label(i):
        return {names[n]: int(states[i, n]) for n in range(len(names)) if targets[i, n]}

    out = {
        "criterion": args.criterion,
        "target": args.target,
        "scores": [{"intervention": label(i), "score": float(v)} for i, v in enumerate(scores)],
        "best": label(int(np.argmax(scores))),
        "samples": args.samples,
        "duration": duration,
        "initial_state": init,
        "seed": args.seed,
        "prior": getattr(args, "fitted_prior", None) or _prior_json(args),
    }
    if args.target == "structure" and args.criterion != "eig":
        from .._experiments.run import default_graph_draws

        draws, max_sets = default_graph_draws(len(names), args.graph_draws, args.max_sets)
        out.update(graph_draws=draws, max_sets=max_sets)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(
        f"scored {len(scores)} interventions; best: {out['best'] or 'no intervention'}; "
        f"wrote {args.out}"
    )


def _split_cpu(args) -> None:
    """`run --cpu-devices D`: the CPU as D devices (JAX's `jax_num_cpu_devices`, as
    `XLA_FLAGS=--xla_force_host_platform_device_count=D` does), so that `--shard` splits each
    chunk's repetitions across the cores; set before JAX starts its backends."""
    if args.cpu_devices is None:
        return
    if not args.shard:
        raise ValueError("--cpu-devices: only with --shard (it makes the devices --shard uses).")
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    except RuntimeError:  # JAX has started its backends in this process already
        have = len(jax.devices("cpu"))
        if have != args.cpu_devices:
            raise ValueError(
                f"--cpu-devices: JAX has already started in this process with {have} CPU "
                "device(s); use a fresh process."
            ) from None


def _start_distributed(args) -> None:
    """`jax.distributed.initialize` for `run --distributed` (before any computation): from
    `--coordinator`, `--num-processes` and `--process-id`, or where those are not given from
    the environment (SLURM, Open MPI, ... as detected by JAX)."""
    given = [
        flag
        for flag, value in (
            ("--coordinator", args.coordinator),
            ("--num-processes", args.num_processes),
            ("--process-id", args.process_id),
        )
        if value is not None
    ]
    if not args.distributed:
        if given:
            raise ValueError(f"{', '.join(given)}: only with --distributed.")
        return
    if args.num_processes is not None and args.process_id is not None:
        if args.process_id >= args.num_processes:
            raise ValueError(
                f"--process-id: must be below --num-processes ({args.num_processes}), got "
                f"{args.process_id}."
            )
    import jax

    try:
        jax.distributed.initialize(
            coordinator_address=args.coordinator,
            num_processes=args.num_processes,
            process_id=args.process_id,
        )
    except (RuntimeError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ValueError(f"--distributed: jax.distributed.initialize failed: {first}") from None


def _cmd_run(args):
    import jax

    from .._active_learning.loop import DESIGN_NAMES
    from .._criteria.batching import Sharded
    from .._experiments.run import ExperimentConfig, run_experiment, summary_table, verdicts

    if args.target == "pool":
        if args.shard or args.distributed or args.cpu_devices is not None:
            raise ValueError(
                "--shard, --distributed, --cpu-devices: only for run structure or run parameters."
            )
        return _cmd_run_pool(args)
    _split_cpu(args)
    _start_distributed(args)
    given = [o for o, v in (("--data", args.data), ("--observation", args.observation),
                            ("--root", args.root)) if v is not None]  # fmt: skip
    if given:
        raise ValueError(f"{', '.join(given)}: only with 'run pool'.")
    args.designs = args.designs or "passive,random,bhc,vbhc"
    args.samples = args.samples or 10
    designs = [d.strip() for d in args.designs.split(",") if d.strip()]
    unknown = [d for d in designs if d not in DESIGN_NAMES]
    if unknown or not designs:
        raise ValueError(
            f"--designs: unknown design(s) {unknown or args.designs!r}; valid: "
            + ",".join(DESIGN_NAMES)
        )
    truth = _load_network(args.network) if args.network is not None else None
    out = args.out or f"run_{args.target}"
    config = ExperimentConfig(
        target=args.target,
        designs=tuple(designs),
        repetitions=args.repetitions,
        experiments=args.experiments,
        samples=args.samples,
        horizon=args.horizon,
        seed=args.seed,
        truth=truth,
        truth_seed=args.truth_seed,
        max_parents=args.max_parents,
        prior=_prior(args, 4 if truth is None else truth.num_nodes),
        empirical_bayes=_empirical_bayes(args),
        initial_state_policy=_policy(args, truth),
        paths=args.paths,
        chunk=args.chunk,
        max_events=args.max_events,
        interventions=args.interventions,
        graph_draws=args.graph_draws,
        max_sets=args.max_sets,
    )
    report = run_experiment(
        config,
        out=out,
        progress=not args.no_progress,
        overwrite=args.overwrite,
        batching=Sharded() if args.shard else None,
        distributed=args.distributed,
    )
    if args.distributed and jax.process_index() != 0:
        print(f"process {jax.process_index()}: wrote its chunks to {out}/chunks")
        return
    summary = summary_table(
        args.target, report["summary"], report["settings"], report["failed_repetitions"]
    )
    print("\n".join(summary))
    print("\nVerdict (area under the learning curve, paired, 95% interval):")
    print("\n".join(verdicts(args.target, report["summary"])))
    print(f"wrote {out}/summary.md, metrics.csv, results.json, figure.png, interventions.png")


def _cmd_run_pool(args):
    """`jaxctbn run pool`: the paper's real-data experiment (subjects drawn from a pool of panel
    trajectories, interventions = sub-pools with the root held constant; `jaxctbn._experiments.pool`)."""
    from .._experiments.pool import (
        POOL_DESIGN_NAMES,
        data_digest,
        prepare_pool,
        run_pool_experiment,
    )
    from .._experiments.run import summary_table, verdicts
    from .._panel.csv import panel_from_dataframe
    from .._paths.csv import infer_cardinalities, read_csv

    if args.data is None or args.root is None or args.observation is None:
        raise ValueError("run pool: needs --data DATA.csv --observation panel --root NODE.")
    if args.observation != "panel":
        raise ValueError("--observation: run pool needs --observation panel (panel visits).")
    designs = [d.strip() for d in (args.designs or ",".join(POOL_DESIGN_NAMES)).split(",")]
    unknown = [d for d in designs if d not in POOL_DESIGN_NAMES]
    if unknown or not [d for d in designs if d]:
        raise ValueError(
            f"--designs: unknown pool design(s) {unknown}; valid: " + ",".join(POOL_DESIGN_NAMES)
        )
    df = read_csv(args.data)
    cards = infer_cardinalities(df, missing=True)
    names = list(cards)
    if args.root not in names:
        raise ValueError(f"--root: unknown node {args.root!r}; the nodes are {names}.")
    observations, ids = panel_from_dataframe(df, cards)
    N = len(names)
    print(f"learning the network from all {len(ids)} subjects ({N} nodes) ...", flush=True)
    pool, fit = prepare_pool(
        observations,
        names,
        [cards[n] for n in names],
        root=args.root,
        max_parents=_max_parents(args.max_parents, N) if args.max_parents is not None else N - 1,
        prior=_prior(args, N),
        subject_ids=ids,
    )
    graph = fit.posterior.map_graph()
    print("full-data network: " + "; ".join(
        f"{names[n]} <- {','.join(names[p] for p in ps) or '(none)'}" for n, ps in enumerate(graph)
    ))  # fmt: skip
    report = run_pool_experiment(
        pool,
        fit,
        designs=designs,
        repetitions=args.repetitions or 100,
        experiments=args.experiments or 20,
        samples=args.samples or 40,
        seed=args.seed,
        chunk=args.chunk,
        data=f"{os.path.basename(args.data)} sha256:{data_digest(args.data)}",
        out=args.out,
        progress=not args.no_progress,
        overwrite=args.overwrite,
    )
    print("\n".join(summary_table("pool", report["summary"], report["settings"])))
    print("\nVerdict (area under the learning curve, paired, 95% interval):")
    print("\n".join(verdicts("pool", report["summary"])))
    print(f"wrote {args.out}/summary.md, metrics.csv, results.json, figure.png, interventions.png")


def _policy(args, truth):
    """`--initial-state-policy` (and `--initial-state` for `fixed`) as a policy Module."""
    from .._active_learning.loop import (
        FixedInitialState,
        InitialStateDistribution,
        RandomInitialState,
    )
    from .._model.random_networks import PAPER_NAMES

    names = PAPER_NAMES if truth is None else truth.names
    cards = (2,) * len(names) if truth is None else truth.cardinalities
    if args.initial_state and args.initial_state_policy != "fixed":
        raise ValueError("--initial-state: only with --initial-state-policy fixed.")
    if args.initial_state_policy == "random-revealed":
        return RandomInitialState()
    if args.initial_state_policy == "hidden-uniform":
        return InitialStateDistribution()
    if not args.initial_state:
        return FixedInitialState([0] * len(names))
    _, state = _initial_state(args.initial_state, list(names), cards)
    return FixedInitialState(state)


def _cmd_demo(args):
    from .demo import run_demo

    run_demo(out_dir=args.out, seed=args.seed, trajectories=args.trajectories)


def _prior_arguments(p) -> None:
    """`--prior gamma|nodelman` (alias `--prior-convention`), `--alpha A`, `--beta B` and
    `--empirical-bayes`: the same options wherever a prior is chosen."""
    p.add_argument(
        "--prior",
        "--prior-convention",
        dest="prior",
        choices=["gamma", "nodelman"],
        default="gamma",
        help="rate prior: gamma (the paper's, Gam(alpha, beta) per rate) or nodelman (CTBN-RLE's "
        "family score: alpha imaginary transitions, beta imaginary time)",
    )
    p.add_argument(
        "--alpha",
        type=_hyperparameter,
        default="1.0",
        help="prior alpha: one value, or one per node comma-separated",
    )
    p.add_argument(
        "--beta",
        type=_hyperparameter,
        default="1.0",
        help="prior beta (nodelman: tau): one value, or one per node comma-separated",
    )
    p.add_argument(
        "--empirical-bayes",
        action="store_true",
        help="fit alpha and beta to the data by type-II maximum likelihood (structure; starts "
        "from --alpha/--beta; per node when they have one value per node)",
    )


def _observation_arguments(p) -> None:
    """`--observation paths|panel` and `--exact-entry NODE=STATE ...`."""
    p.add_argument(
        "--observation",
        choices=["paths", "panel"],
        default="paths",
        help="how the CSV was observed: paths (complete trajectories, each row the state from "
        "that time on) or panel (states seen at the row times, hidden between; empty cell = "
        "not observed)",
    )
    p.add_argument(
        "--exact-entry",
        nargs="*",
        default=[],
        help="panel: NODE=STATE ... observed at the exact time it is entered (msm's deathexact)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="jaxctbn", description="Conditional CTBNs in JAX.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    p = sub.add_parser("sample", help="sample trajectories to a long-format CSV")
    p.add_argument("--network", required=True, help="network JSON file")
    p.add_argument("--trajectories", type=_at_least(1), required=True)
    p.add_argument(
        "--duration", type=_positive_number, required=True, help="observation time per trajectory"
    )
    p.add_argument("--intervention", nargs="*", default=[], help="NODE=STATE ... (perfect)")
    p.add_argument(
        "--initial-state", nargs="*", default=[], help="NODE=STATE ... (default: uniform random)"
    )
    p.add_argument("--seed", type=_seed, required=True, help="0 <= S <= 2**63 - 1")
    p.add_argument(
        "--max-events",
        type=_at_least(1),
        default=1_000_000,
        help="cap on the jumps of one path (default 1000000); checked before sampling",
    )
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_sample)

    p = sub.add_parser("moments", help="expected statistics from the master equation")
    p.add_argument("--network", required=True)
    p.add_argument("--duration", type=_positive_number, required=True)
    p.add_argument("--initial-state", nargs="+", required=True, help="NODE=STATE,...")
    p.add_argument("--intervention", nargs="*", default=[], help="NODE=STATE,...")
    p.add_argument(
        "--solver",
        choices=("auto", "exact", "mean-field"),
        default="auto",
        help="auto (default): exact up to 16384 global states, mean-field beyond",
    )
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_moments)

    p = sub.add_parser("learn", help="exact Bayesian structure learning from a trajectory CSV")
    p.add_argument("--data", required=True, help="long-format trajectory CSV")
    p.add_argument("--max-parents", type=_at_least(0), default=None, help="default min(2, N-1)")
    _prior_arguments(p)
    p.add_argument(
        "--cardinalities",
        nargs="*",
        default=[],
        help="NODE=K,... (default: largest state in the data + 1, at least 2)",
    )
    _observation_arguments(p)
    p.add_argument(
        "--tolerance",
        type=_non_negative_number,
        default="1e-6",
        help="panel: structural EM stops when the graph is unchanged and the log-likelihood "
        "changed by at most T x (1 + |L|) (default 1e-6)",
    )
    p.add_argument(
        "--max-iterations",
        type=_at_least(1),
        default=100,
        help="panel: at most N structural EM iterations (default 100)",
    )
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_learn)

    p = sub.add_parser("fit", help="fit the rates of a network's graph (paths or panel data)")
    p.add_argument("--data", required=True, help="long-format CSV")
    p.add_argument(
        "--network",
        required=True,
        help="network JSON: the graph, and its CIMs as starting values (zeros stay zero)",
    )
    _observation_arguments(p)
    p.add_argument(
        "--method",
        choices=["em", "gradient"],
        default="em",
        help="panel: EM (expected statistics -> conjugate update) or L-BFGS on log-rates",
    )
    p.add_argument(
        "--prior",
        choices=["none", "gamma"],
        default="none",
        help="none: maximum likelihood; gamma: MAP under Gam(alpha, beta) on every free rate",
    )
    p.add_argument("--alpha", type=_hyperparameter, default=None, help="gamma: one or one per node")
    p.add_argument("--beta", type=_hyperparameter, default=None, help="gamma: one or one per node")
    p.add_argument(
        "--tolerance",
        type=_non_negative_number,
        default="1e-8",
        help="relative change of the objective at convergence (default 1e-8)",
    )
    p.add_argument(
        "--max-iterations",
        type=_at_least(1),
        default=None,
        help="default 1000 (em) or 500 (gradient)",
    )
    p.add_argument("--out", required=True, help="output JSON")
    p.set_defaults(func=_cmd_fit)

    p = sub.add_parser("design", help="rank all interventions for the next experiment")
    p.add_argument("--data", default=None, help="history CSV (omit for no history)")
    p.add_argument("--target", choices=["structure", "parameters"], required=True)
    p.add_argument("--criterion", choices=["vbhc", "bhc", "eig"], default="vbhc")
    p.add_argument("--network", default=None, help="known graph (parameter learning)")
    p.add_argument("--initial-state", nargs="+", required=True, help="NODE=STATE,...")
    p.add_argument("--duration", type=_positive_number, required=True)
    p.add_argument("--samples", type=_at_least(1), default=10, help="posterior draws N_S")
    p.add_argument("--paths", type=_at_least(1), default=10, help="paths per draw (eig)")
    _prior_arguments(p)
    p.add_argument("--max-parents", type=_at_least(0), default=None)
    _interventions_argument(p)
    _graph_draws_arguments(p)
    p.add_argument("--seed", type=_seed, required=True, help="0 <= S <= 2**63 - 1")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_design)

    p = sub.add_parser("run", help="sequential active-learning experiment (paper section 6)")
    p.add_argument("target", choices=["structure", "parameters", "pool"])
    p.add_argument(
        "--designs",
        default=None,
        help="comma-separated: passive,random,vbhc,bhc,vbhc-optax,eig,negative-vbhc (default "
        "passive,random,bhc,vbhc; pool: passive,random,vbhc,negative-vbhc)",
    )
    p.add_argument("--data", default=None, help="pool: panel CSV of the subjects")
    p.add_argument("--observation", choices=["paths", "panel"], default=None, help="pool: panel")
    p.add_argument("--root", default=None, help="pool: the root node held constant per subject")
    p.add_argument(
        "--repetitions", type=_at_least(1), default=None, help="independent runs (default 20)"
    )
    p.add_argument(
        "--experiments", type=_at_least(1), default=None, help="experiments per run (10)"
    )
    p.add_argument(
        "--samples", type=_at_least(1), default=None, help="posterior draws N_S (10; pool 40)"
    )
    p.add_argument("--horizon", type=_positive_number, default="3.0", help="trajectory length tau")
    p.add_argument("--seed", type=_seed, default=0, help="0 <= S <= 2**63 - 1")
    p.add_argument("--out", default=None, help="output directory (default run_<target>)")
    p.add_argument("--network", default=None, help="ground-truth network JSON (default: built in)")
    p.add_argument("--truth-seed", type=_seed, default=0, help="seed of the built-in ground truth")
    p.add_argument(
        "--max-parents", type=_at_least(0), default=None, help="structure: max in-degree"
    )
    _prior_arguments(p)
    p.add_argument(
        "--initial-state-policy",
        choices=["random-revealed", "fixed", "hidden-uniform"],
        default="random-revealed",
        help="s0 of each experiment: uniform and revealed (the paper's), fixed (--initial-state, "
        "default all 0), or uniform and hidden from the design",
    )
    p.add_argument(
        "--initial-state", nargs="*", default=[], help="NODE=STATE,... (with the fixed policy)"
    )
    _interventions_argument(p)
    _graph_draws_arguments(p)
    p.add_argument("--paths", type=_at_least(1), default=10, help="paths per draw (eig)")
    p.add_argument("--chunk", type=_at_least(1), default=10, help="repetitions per compiled batch")
    p.add_argument(
        "--max-events",
        type=_at_least(1),
        default=None,
        help="jump buffer per path (default: from rates)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="discard results of other settings in --out"
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--shard",
        action="store_true",
        help="split each chunk's repetitions across every local device (same results)",
    )
    p.add_argument(
        "--cpu-devices",
        type=_at_least(1),
        default=None,
        help="with --shard on a CPU: make it D devices (e.g. one per core; default: JAX's, one)",
    )
    p.add_argument(
        "--distributed",
        action="store_true",
        help="one of several processes (jax.distributed) sharing the chunks; needs --out",
    )
    p.add_argument(
        "--coordinator", default=None, help="distributed: HOST:PORT of process 0 (or from env)"
    )
    p.add_argument(
        "--num-processes", type=_at_least(1), default=None, help="distributed: P (or from env)"
    )
    p.add_argument(
        "--process-id", type=_at_least(0), default=None, help="distributed: 0..P-1 (or from env)"
    )
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("demo", help="the paper's 4-node network: sample, solve, compare, plot")
    p.add_argument("--out", default="demo_output")
    p.add_argument("--seed", type=_seed, default=0, help="0 <= S <= 2**63 - 1")
    p.add_argument(
        "--trajectories", type=_at_least(2), default=2000, help="paths per intervention (>= 2)"
    )
    p.set_defaults(func=_cmd_demo)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings of the library, as one line each on stderr."""
    print(f"jaxctbn: warning: {message}", file=sys.stderr if file is None else file)


def main(argv=None) -> int:
    """The `jaxctbn` command: returns the exit status (0, or 2 with one error line)."""
    import warnings

    with warnings.catch_warnings():  # restores the caller's warning display afterwards
        warnings.showwarning = _show_warning
        return _main(argv)


def _main(argv) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a parse error (exit 2, its line printed) or --help (0)
        return e.code if isinstance(e.code, int) else 2
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "run" and args.out is None:
        if args.distributed:
            print(
                "jaxctbn: error: --distributed: needs --out, a directory every process reaches.",
                file=sys.stderr,
            )
            return 2
        args.out = f"run_{args.target}"
    try:
        _check_out(args.out, _OUT_KINDS[args.command])
    except ValueError as e:
        print(f"jaxctbn: error: {e}", file=sys.stderr)
        return 2
    _setup_jax()
    try:
        args.func(args)
    except (ValueError, OSError) as e:
        print(f"jaxctbn: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # eqx.error_if inside jit: the library's own message
        from .._errors import error_message

        print(f"jaxctbn: error: {error_message(e)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
