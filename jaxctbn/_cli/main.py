"""The `jaxctbn` command line."""

from __future__ import annotations

import argparse
import sys

from .arguments import (
    _OUT_KINDS,
    _at_least,
    _check_out,
    _convert_arguments,
    _costs_arguments,
    _format_argument,
    _graph_draws_arguments,
    _grid_times,
    _hyperparameter,
    _interventions_argument,
    _knowledge_arguments,
    _non_negative_number,
    _observation_arguments,
    _outcome_arguments,
    _Parser,
    _positive_number,
    _prior_arguments,
    _seed,
    _strength_argument,
)
from .jax_setup import _setup_jax


def _handler(module: str, name: str):
    """The command `name` of `jaxctbn._cli.<module>`, imported when the command runs: building
    the parser, `--help` and argument errors import no JAX."""

    def run(args) -> None:
        import importlib

        getattr(importlib.import_module(f".{module}", __package__), name)(args)

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="jaxctbn", description="Conditional CTBNs in JAX.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    p = sub.add_parser("sample", help="sample trajectories to a long-format CSV")
    p.add_argument("--network", required=True, help="network JSON file")
    _format_argument(p, "--network")
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
    p.set_defaults(func=_handler("sample", "_cmd_sample"))

    p = sub.add_parser("moments", help="expected statistics from the master equation")
    p.add_argument("--network", required=True)
    _format_argument(p, "--network")
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
    p.set_defaults(func=_handler("moments", "_cmd_moments"))

    p = sub.add_parser("learn", help="exact Bayesian structure learning from a trajectory CSV")
    p.add_argument("--data", required=True, help="long-format trajectory CSV")
    _format_argument(p, "--data")
    p.add_argument(
        "--max-parents",
        default=None,
        help="K or K,NODE=K,...: the largest in-degree, and per node (default min(2, N-1))",
    )
    _knowledge_arguments(p)
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
    p.add_argument(
        "--inference",
        choices=["exact", "mean-field", "sampling"],
        default="exact",
        help="panel: the E-step's inference under the observations: exact forward-backward "
        "(default; exponential in the number of nodes), mean-field (a product of node "
        "processes fitted to the observations; deterministic; exact observations only) or "
        "sampling (Gibbs or importance sampling of paths, see --sampler; exact observations "
        "only)",
    )
    p.add_argument(
        "--steps-per-gap",
        type=_at_least(1),
        default=None,
        help="mean-field: steps each gap between observations is cut into (8)",
    )
    p.add_argument(
        "--sampler",
        choices=["gibbs", "importance"],
        default=None,
        help="sampling: gibbs (auxiliary-variable Gibbs sampling; the default) or importance "
        "(paths drawn from the mean-field posterior, weighted towards the exact one and "
        "resampled; its effective sample size falls as the network grows)",
    )
    p.add_argument(
        "--panel-posterior",
        choices=["sampled", "moment"],
        default=None,
        help="panel: what the edge marginals, parent-set posteriors and entropy are computed "
        "from: sampled (the default with --inference exact on at most 256 joint states and "
        "with --inference sampling --sampler gibbs at any size: a Gibbs sampler over graph, "
        "rates and hidden paths, Rao-Blackwellised; exact as --sweeps grow) or moment "
        "(structural EM's expected statistics scored as if observed: fast, overconfident where "
        "visits are sparse; the only choice with --inference mean-field or --sampler "
        "importance)",
    )
    p.add_argument(
        "--sweeps",
        type=_at_least(4),
        default=None,
        help="--panel-posterior sampled: retained sweeps per chain (1000)",
    )
    p.add_argument(
        "--chains",
        type=_at_least(1),
        default=None,
        help="--panel-posterior sampled: chains (4)",
    )
    p.add_argument(
        "--samples", type=_at_least(1), default=200, help="sampling: paths per trajectory (200)"
    )
    p.add_argument(
        "--burn-in",
        type=_at_least(0),
        default=None,
        help="sampling: sweeps discarded first (50); --panel-posterior sampled: per chain (100)",
    )
    p.add_argument(
        "--max-events",
        type=_at_least(1),
        default=64,
        help="sampling: jumps a sampled path holds at first (64; doubled when paths need more)",
    )
    p.add_argument(
        "--max-virtual",
        type=_at_least(1),
        default=64,
        help="sampling: virtual times of a node update at first (64; doubled when one needs more)",
    )
    p.add_argument(
        "--max-node-events",
        type=_at_least(1),
        default=32,
        help="sampling: jumps one node's path holds at first (32; doubled when one needs more)",
    )
    p.add_argument(
        "--max-candidates",
        type=_at_least(1),
        default=None,
        help="importance: uniformisation times of a node's bridge on one step at first (8; "
        "doubled when one needs more)",
    )
    p.add_argument(
        "--patience",
        type=_at_least(1),
        default=3,
        help="sampling: structural EM stops at the P-th E-step, with the MAP graph unchanged, "
        "whose evidence did not rise (3)",
    )
    p.add_argument("--out", required=True)
    p.set_defaults(func=_handler("learn", "_cmd_learn"))

    p = sub.add_parser("fit", help="fit the rates of a network's graph (paths or panel data)")
    p.add_argument("--data", required=True, help="long-format CSV")
    p.add_argument(
        "--network",
        required=True,
        help="network JSON: the graph, and its CIMs as starting values (zeros stay zero)",
    )
    _format_argument(p, "--data and --network (pyagrum: --network by its content)")
    _observation_arguments(p)
    p.add_argument(
        "--method",
        choices=["squarem", "em", "gradient"],
        default=None,
        help="panel: squarem (EM accelerated by SQUAREM, stops at a small gradient; the default, "
        "gradient with --covariates), "
        "em (expected statistics -> conjugate update) or gradient (L-BFGS on log-rates)",
    )
    p.add_argument(
        "--prior",
        choices=["none", "gamma"],
        default=None,
        help="none: maximum likelihood (the default); gamma: MAP under Gam(alpha, beta) on every "
        "free rate (the default with --posterior)",
    )
    p.add_argument("--alpha", type=_hyperparameter, default=None, help="gamma: one or one per node")
    p.add_argument("--beta", type=_hyperparameter, default=None, help="gamma: one or one per node")
    p.add_argument(
        "--posterior",
        action="store_true",
        help="also the Bayesian posterior of the rates under the Gamma prior: panel data by "
        "NUTS on the exact likelihood, Rao-Blackwellised over exact path draws (a mixture of "
        "Gammas, exact as the draws grow); complete paths: the conjugate Gamma",
    )
    p.add_argument(
        "--draws",
        type=_at_least(4),
        default=None,
        help="--posterior: retained draws per chain (default 1000)",
    )
    p.add_argument(
        "--chains", type=_at_least(1), default=None, help="--posterior: chains (default 4)"
    )
    p.add_argument("--seed", type=_seed, default=None, help="--posterior: random seed (default 0)")
    p.add_argument(
        "--draws-out",
        default=None,
        metavar="PATH",
        help="--posterior: the chains' rate draws for ArviZ, as .csv (columns chain, draw, one "
        "per free rate) or .nc (netCDF through arviz)",
    )
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
        help="default 500 (squarem, gradient) or 1000 (em)",
    )
    p.add_argument(
        "--learn-strength",
        default=None,
        metavar="NODE",
        help="also learn the unknown factor by which a drug scaled NODE's rates: the "
        "trajectories recorded under it carry NODE* in their intervention column (paths: "
        "posterior with the rates integrated out; panel: profile likelihood)",
    )
    p.add_argument(
        "--covariates",
        default=None,
        metavar="COL,COL,...",
        help="panel: covariates (data columns; text columns are categorical, dummy-coded "
        "against their first level), log-linear on the rates, centred at their means; a column "
        "that changes within a trajectory is time-varying, its value at each visit holding "
        "until the next",
    )
    p.add_argument(
        "--covariate-rates",
        default=None,
        metavar="NODE:FROM-TO,...",
        help="the transitions the covariates act on (every parent configuration of NODE; "
        "states 0-based); default: every free rate",
    )
    p.add_argument(
        "--covariate-shared",
        default=None,
        metavar="NODE:FROM-TO+NODE:FROM-TO,...",
        help="groups of transitions (joined by +, groups separated by commas) over which each "
        "covariate has one shared effect, in every parent configuration of the nodes (msm's "
        "constraint); a group of one transition shares it across that node's parent "
        "configurations; default: one effect per rate",
    )
    p.add_argument(
        "--pci",
        type=_grid_times,
        default=None,
        metavar="T1,T2,...",
        help="panel: piecewise-constant rates, changing at these times (msm's pci): one "
        "hazard ratio per later period, on every free rate, reported as covariates "
        "period[T1,T2), ...",
    )
    p.add_argument("--out", required=True, help="output JSON")
    p.set_defaults(func=_handler("fit", "_cmd_fit"))

    p = sub.add_parser(
        "compare", help="likelihood-ratio test and AIC between two nested fits of the same data"
    )
    p.add_argument("fit1", metavar="FIT1", help="fit JSON (jaxctbn fit --out)")
    p.add_argument("fit2", metavar="FIT2", help="fit JSON of the same data")
    p.add_argument("--out", required=True, help="output JSON")
    p.set_defaults(func=_handler("compare", "_cmd_compare"))

    p = sub.add_parser(
        "prevalence", help="observed vs expected prevalence of each node's states over time"
    )
    p.add_argument("--data", required=True, help="the panel CSV the fit was made from")
    p.add_argument("--fit", required=True, help="fit JSON (jaxctbn fit --out)")
    _observation_arguments(p)
    p.add_argument("--times", type=_grid_times, required=True, help="T1,T2,...: increasing, >= 0")
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(func=_handler("prevalence", "_cmd_prevalence"))

    p = sub.add_parser("design", help="rank all interventions for the next experiment")
    p.add_argument("--data", default=None, help="history CSV (omit for no history)")
    p.add_argument("--target", choices=["structure", "parameters"], required=True)
    p.add_argument("--criterion", choices=["vbhc", "bhc", "eig"], default="vbhc")
    p.add_argument("--network", default=None, help="known graph (parameter learning)")
    _format_argument(p, "--data and --network (pyagrum: --network by its content)")
    p.add_argument("--initial-state", nargs="+", required=True, help="NODE=STATE,...")
    p.add_argument("--duration", type=_positive_number, required=True)
    p.add_argument("--samples", type=_at_least(1), default=10, help="posterior draws N_S")
    p.add_argument("--paths", type=_at_least(1), default=10, help="paths per draw (eig)")
    _prior_arguments(p)
    p.add_argument("--max-parents", type=_at_least(0), default=None)
    _interventions_argument(p)
    _graph_draws_arguments(p)
    p.add_argument(
        "--observation",
        choices=["paths", "panel"],
        default="paths",
        help="how the history CSV was observed (as for learn/fit): paths, or panel (see "
        "--panel-posterior)",
    )
    p.add_argument(
        "--panel-posterior",
        choices=["sampled", "moment"],
        default=None,
        help="--observation panel: the history's posterior the criteria score: sampled "
        "(default; parameters: NUTS + exact path draws, a mixture of Gammas, as fit "
        "--posterior; structure: Gibbs over graph, rates and paths, a mixture of exact "
        "structure posteriors, as learn; --outcome path then scores its moment-matched "
        "posterior, said in the JSON) or moment (parameters: the moment-matched Gamma; "
        "structure: structural EM; fast, overconfident where visits are sparse)",
    )
    p.add_argument(
        "--draws",
        type=_at_least(4),
        default=None,
        help="--panel-posterior sampled: retained draws (structure: sweeps) per chain "
        "(default 1000)",
    )
    p.add_argument(
        "--chains", type=_at_least(1), default=None, help="--panel-posterior sampled: chains (4)"
    )
    _outcome_arguments(p)
    p.add_argument(
        "--batch",
        type=_at_least(1),
        default=None,
        help="choose B experiments to run in parallel (greedy bhc/vbhc; the JSON's batch)",
    )
    _costs_arguments(p)
    _strength_argument(p)
    p.add_argument("--seed", type=_seed, required=True, help="0 <= S <= 2**63 - 1")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_handler("design", "_cmd_design"))

    p = sub.add_parser("run", help="sequential active-learning experiment (paper section 6)")
    p.add_argument("target", choices=["structure", "parameters", "pool"])
    p.add_argument(
        "--designs",
        default=None,
        help="comma-separated: passive,random,vbhc,bhc,vbhc-optax,eig,negative-vbhc,vbhc-path,"
        "bhc-path,vbhc-copies (-path: scored as if the whole path were seen; -copies: with "
        "--batch, B copies of the best; default passive,random,bhc,vbhc; pool: "
        "passive,random,vbhc,negative-vbhc)",
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
    _format_argument(p, "--network (pool: --data, jaxctbn's panel CSV only)")
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
    p.add_argument(
        "--distributed-timeout",
        type=_at_least(1),
        default=60,
        help="distributed: seconds to wait for the coordinator and every process (default 60)",
    )
    _outcome_arguments(p)
    p.add_argument(
        "--panel-posterior",
        choices=["sampled", "moment"],
        default=None,
        help="--outcome panel: how each experiment's panel updates the posterior: sampled "
        "(default: a particle filter over the hidden paths; parameters: a mixture of Gammas, "
        "structure: a mixture of exact complete-data structure posteriors; exact as "
        "--particles grow) or moment (parameters: the moment-matched Gamma; structure: "
        "structural EM; fast, overconfident where visits are sparse; structure with "
        "--empirical-bayes: always moment); run pool: sampled (default) learns from each drawn "
        "subject's panel by the particle filter, moment adds its expected statistics under the "
        "network learned from all the data (the paper's; much faster)",
    )
    p.add_argument(
        "--particles",
        type=_at_least(1),
        default=256,
        help="--panel-posterior sampled: particles (256)",
    )
    p.add_argument(
        "--batch",
        type=_at_least(1),
        default=1,
        help="experiments per round, chosen together (bhc/vbhc: greedy; eig: B myopic picks; "
        "random: B draws); must divide --experiments (default 1)",
    )
    _costs_arguments(p)
    p.set_defaults(func=_handler("run", "_cmd_run"))

    p = sub.add_parser(
        "convert", help="networks and trajectories to and from pyAgrum, causal-hub and PyCTBN"
    )
    _convert_arguments(p)
    p.set_defaults(func=_handler("convert", "_cmd_convert"))

    p = sub.add_parser("demo", help="the paper's 4-node network: sample, solve, compare, plot")
    p.add_argument("--out", default="demo_output")
    p.add_argument("--seed", type=_seed, default=0, help="0 <= S <= 2**63 - 1")
    p.add_argument(
        "--trajectories", type=_at_least(2), default=2000, help="paths per intervention (>= 2)"
    )
    p.set_defaults(func=_handler("demo", "_cmd_demo"))
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings of the library, as one line each on stderr; of the compilation cache's failures
    (JAX warns once per program, e.g. on a full disk) only the first, as one line."""
    text = str(message).splitlines()[0] if str(message) else ""
    if "persistent compilation cache" in text:
        if _CACHE_WARNED:
            return
        _CACHE_WARNED.append(text)
        text += " (the compilation cache's further errors are not shown; results are the same)"
    print(f"jaxctbn: warning: {text}", file=sys.stderr if file is None else file)


#: the compilation cache's first failure, once shown (one line per process)
_CACHE_WARNED: list[str] = []


def main(argv=None) -> int:
    """The `jaxctbn` command: returns the exit status (0, or 2 with one error line)."""
    import warnings

    with warnings.catch_warnings():  # restores the caller's warning display afterwards
        warnings.showwarning = _show_warning
        return _main(argv)


def _main(argv) -> int:
    from . import arguments

    arguments.ARGV = None if argv is None else [str(a) for a in argv]
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
    kind = _OUT_KINDS[args.command]
    try:
        if kind is not None:
            _check_out(args.out, kind)
        from .exported import compile_effort

        compile_effort()  # (the environment's setting checked before any work)
    except ValueError as e:
        print(f"jaxctbn: error: {e}", file=sys.stderr)
        return 2
    _setup_jax()
    from .._programs import programs_run_by
    from .exported import call_exported
    from .inputs import take_notes

    try:
        with programs_run_by(call_exported):
            args.func(args)
        for note in take_notes():  # the formats detected, after the command's own lines
            print(note, file=sys.stderr)
    except (ValueError, OSError) as e:
        print(f"jaxctbn: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # eqx.error_if inside jit: the library's own message
        from .._errors import error_message

        print(f"jaxctbn: error: {error_message(e)}", file=sys.stderr)
        return 2
    finally:
        take_notes()  # none left for the next call in this process
    return 0
