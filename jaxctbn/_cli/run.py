"""`jaxctbn run`: the sequential active-learning experiments (structure, parameters) and the
real-data pool experiment, on one or several devices or processes."""

from __future__ import annotations

import os
import sys

from .arguments import (
    _costs,
    _costs_json,
    _empirical_bayes,
    _initial_state,
    _max_parents,
    _prior,
)


def _split_cpu(args) -> None:
    """`run --cpu-devices D`: the CPU as D devices (JAX's `jax_num_cpu_devices`, as
    `XLA_FLAGS=--xla_force_host_platform_device_count=D` does), so that `--shard` splits each
    chunk's repetitions across the cores; set before JAX starts its backends."""
    if args.cpu_devices is None:
        return
    if not args.shard:
        raise ValueError("--cpu-devices: only with --shard (it makes the devices --shard uses).")
    limit = _max_cpu_devices()
    if args.cpu_devices > limit:
        raise ValueError(
            f"--cpu-devices: at most {limit} (8 per core of this machine, at least 64), got "
            f"{args.cpu_devices}; one device per core is usually fastest."
        )
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


def _max_cpu_devices() -> int:
    """The most CPU devices `--cpu-devices` accepts: each one costs memory and threads, and
    100,000 of them took 6 GB and two minutes before failing."""
    return max(64, 8 * (os.cpu_count() or 1))


def _coordinator_address(text: str) -> tuple[str, int]:
    """`HOST:PORT` (an IPv6 host in brackets) checked, else a one-line `ValueError`."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(
            f"--coordinator: expected HOST:PORT with a port in 1..65535 (e.g. node0:12345), got "
            f"{text!r}."
        )
    return host.strip("[]"), int(port)


def _wait_for_coordinator(host: str, port: int, timeout: float) -> None:
    """Before JAX's own connection (which waits silently, then aborts the process): resolve the
    host and connect to the coordinator's port until it answers or `timeout` seconds pass."""
    import socket
    import time

    try:
        socket.getaddrinfo(host, port)
    except OSError:
        raise ValueError(f"--coordinator: cannot resolve the host {host!r}.") from None
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(5.0, timeout)):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise ValueError(
                    f"--coordinator: nothing answered at {host}:{port} within {timeout:g} s "
                    "(--distributed-timeout); start process 0 there first, or check the address."
                ) from None
            time.sleep(0.5)


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
    timeout = args.distributed_timeout
    coordinator = args.coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if coordinator is not None:
        host, port = _coordinator_address(coordinator)
        if args.process_id not in (None, 0):  # process 0 is the coordinator: it listens
            _wait_for_coordinator(host, port, float(timeout))
    # JAX waits for every process and, past its timeout, ends this one with a C++ abort: say
    # first what is being waited for and which flag bounds it
    print(
        f"--distributed: connecting to the coordinator{f' at {coordinator}' if coordinator else ''}"
        f"; waiting at most {timeout} s for every process (--distributed-timeout)",
        file=sys.stderr,
        flush=True,
    )
    import jax

    try:
        jax.distributed.initialize(
            coordinator_address=args.coordinator,
            num_processes=args.num_processes,
            process_id=args.process_id,
            initialization_timeout=timeout,
        )
    except (RuntimeError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ValueError(f"--distributed: jax.distributed.initialize failed: {first}") from None


def _design_names(text: str, valid, *, kind: str = "design") -> list[str]:
    """The comma-separated `--designs`: every entry a known name (an empty list or an empty
    entry, such as `--designs ''`, is refused rather than read as the default)."""
    designs = [d.strip() for d in text.split(",")]
    if not text.strip() or "" in designs:
        raise ValueError(
            f"--designs: give one or more comma-separated {kind} names without empty entries, "
            f"got {text!r}; valid: " + ",".join(valid)
        )
    unknown = [d for d in designs if d not in valid]
    if unknown:
        raise ValueError(f"--designs: unknown {kind}(s) {unknown}; valid: " + ",".join(valid))
    return designs


def _cmd_run(args):
    import jax

    from .._active_learning.designs import DESIGN_NAMES
    from .._batching import Sharded
    from .._experiments.config import ExperimentConfig
    from .._experiments.report import summary_table, verdicts
    from .._experiments.run import run_experiment

    if args.outcome == "path" and (args.observation_times is not None or args.visits):
        raise ValueError("--observation-times/--visits: only with --outcome panel.")
    panel = args.outcome == "panel" or args.target == "pool"
    if not panel and args.panel_posterior is not None:
        raise ValueError("--panel-posterior: only with --outcome panel (or run pool).")
    sampled = args.panel_posterior != "moment"
    if args.particles != 256 and (not panel or not sampled):
        raise ValueError(
            "--particles: only with --outcome panel and --panel-posterior sampled (or run pool)."
        )
    if args.target == "structure" and args.empirical_bayes and args.panel_posterior == "sampled":
        raise ValueError(
            "--panel-posterior sampled: --empirical-bayes refits one posterior's prior; with "
            "panels it updates by structural EM (--panel-posterior moment)."
        )
    if args.target == "pool":
        if args.shard or args.distributed or args.cpu_devices is not None:
            raise ValueError(
                "--shard, --distributed, --cpu-devices: only for run structure or run parameters."
            )
        if args.outcome != "path":
            raise ValueError("--outcome: run pool replays the recorded visits (no --outcome).")
        if args.batch != 1 or _costs_json(args) is not None or args.rank_by != "score":
            raise ValueError(
                "--batch/--costs/--budget/--rank-by: only for run structure or run parameters."
            )
        return _cmd_run_pool(args)
    if args.outcome == "panel":
        if (args.observation_times is None) == (args.visits is None):
            raise ValueError("--outcome panel: give --observation-times T1,T2,... or --visits K.")
        if args.visits is not None and "eig" in (args.designs or "").replace(" ", "").split(","):
            raise ValueError(
                "--designs: the eig design cannot choose visit times (--visits); use bhc or vbhc, "
                "or give --observation-times."
            )
        if args.observation_times is not None and args.observation_times[-1] > args.horizon:
            raise ValueError(
                f"--observation-times: every time must be in (0, --horizon] = (0, "
                f"{args.horizon:g}], got {args.observation_times[-1]:g}."
            )
    _split_cpu(args)
    _start_distributed(args)
    given = [o for o, v in (("--data", args.data), ("--observation", args.observation),
                            ("--root", args.root)) if v is not None]  # fmt: skip
    if given:
        raise ValueError(f"{', '.join(given)}: only with 'run pool'.")
    if args.designs is None:
        args.designs = "passive,random,bhc,vbhc"
    args.samples = args.samples or 10
    designs = _design_names(args.designs, DESIGN_NAMES)
    truth, input_format = None, None
    if args.network is not None:
        from .inputs import read_network

        # a peer's network is noted on stderr; config.json holds it as jaxctbn's network
        network = read_network(args.network, args.format)
        truth, input_format = network.model, {"network": network.format}
    elif args.format != "auto":
        raise ValueError(f"--format {args.format}: the format of --network, which is not given.")
    out = args.out or f"run_{args.target}"
    costs = _run_costs(args, truth)
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
        observation_times=args.observation_times,
        visits=args.visits,
        batch=args.batch,
        costs=costs,
        budget=args.budget,
        rank_by=args.rank_by,
        panel_posterior=args.panel_posterior,
        particles=args.particles,
    )
    if args.visits is not None and {"vbhc", "vbhc-optax", "negative-vbhc"} & set(designs):
        print(
            "--visits: the vbhc designs search every candidate's visit times with an inner "
            "minimisation per step (about 1 min per experiment for the paper's 81 candidates "
            "on one CPU core, bhc about 3 s; docs/panel-outcomes.md)",
            file=sys.stderr,
            flush=True,
        )
    report = run_experiment(
        config,
        out=out,
        progress=not args.no_progress,
        overwrite=args.overwrite,
        batching=Sharded() if args.shard else None,
        distributed=args.distributed,
        input_format=input_format,
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
    trajectories, interventions = sub-pools with the root held constant;
    `jaxctbn._experiments.pool`)."""
    from .._experiments.pool import POOL_DESIGN_NAMES
    from .._experiments.pool_run import data_digest, run_pool_experiment
    from .._experiments.pool_subjects import prepare_pool
    from .._experiments.report import summary_table, verdicts
    from .._panel.csv import panel_from_dataframe
    from .._panel.structure_posterior import StructureParticleFilter
    from .._paths.csv import infer_cardinalities
    from .inputs import read_data

    if args.data is None or args.root is None or args.observation is None:
        raise ValueError("run pool: needs --data DATA.csv --observation panel --root NODE.")
    if args.observation != "panel":
        raise ValueError("--observation: run pool needs --observation panel (panel visits).")
    designs = _design_names(
        ",".join(POOL_DESIGN_NAMES) if args.designs is None else args.designs,
        POOL_DESIGN_NAMES,
        kind="pool design",
    )
    df, data_format, _ = read_data(args.data, args.format, panel=True)  # jaxctbn's panel CSV
    cards = infer_cardinalities(df, missing=True)
    names = list(cards)
    if args.root not in names:
        raise ValueError(f"--root: unknown node {args.root!r}; the nodes are {names}.")
    observations, ids = panel_from_dataframe(df, cards, bucketed=True)
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
        panel_posterior=StructureParticleFilter(num_particles=args.particles)
        if args.panel_posterior != "moment"
        else None,
        input_format={"data": data_format},
    )
    print("\n".join(summary_table("pool", report["summary"], report["settings"])))
    print("\nVerdict (area under the learning curve, paired, 95% interval):")
    print("\n".join(verdicts("pool", report["summary"])))
    print(f"wrote {args.out}/summary.md, metrics.csv, results.json, figure.png, interventions.png")


def _run_costs(args, truth):
    """The `Costs` of run's cost flags for the truth's nodes (one-line errors naming the flag:
    a batch that does not divide the experiments, a budget below the cheapest experiment)."""
    import numpy as np

    from .._experiments.config import DEFAULTS
    from .._model.interventions import design_space, intervention_space, single_node_interventions
    from .._model.random_networks import PAPER_NAMES

    experiments = args.experiments or DEFAULTS[args.target]["experiments"]
    if experiments % args.batch:
        raise ValueError(
            f"--batch: {args.batch} must divide --experiments ({experiments}); the experiments "
            "run in whole rounds."
        )
    names = PAPER_NAMES if truth is None else truth.names
    cards = (2,) * len(names) if truth is None else truth.cardinalities
    costs = _costs(args, names, cards)
    if costs is None:
        if args.budget is not None:
            raise ValueError(
                "--budget: give the prices (--costs, --experiment-cost, --visit-cost)."
            )
        return None
    space = {"auto": design_space, "all": intervention_space,
             "single": single_node_interventions}[args.interventions](cards)  # fmt: skip
    visits = 0
    if args.outcome == "panel":
        visits = args.visits or len(args.observation_times)
    prices = np.asarray(costs.of(space, num_visits=visits))
    if args.budget is not None and args.budget < prices.min():
        raise ValueError(
            f"--budget: {args.budget:g} is below the cheapest experiment ({prices.min():g})."
        )
    if args.rank_by == "score-per-cost" and np.any(prices <= 0):
        raise ValueError(
            "--rank-by score-per-cost: every experiment must cost > 0; give --experiment-cost."
        )
    return costs


def _policy(args, truth):
    """`--initial-state-policy` (and `--initial-state` for `fixed`) as a policy Module."""
    from .._active_learning.initial_states import (
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
