"""The arguments the commands share: argparse types, option groups, the `--out` check, and
what the arguments become (a network, node assignments, the prior, empirical Bayes)."""

from __future__ import annotations

import argparse
import os
import tempfile

#: the command line being parsed (`main(argv)` sets it; `None`: `sys.argv`), for the hints of
#: `_Parser.error`
ARGV: list[str] | None = None


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit code 2
        import re
        import sys

        # argparse reads a value with a leading minus ("-1,0.5") as an option: say how to give it
        flag = re.match(
            r"argument (--[\w-]+)(?:/[^:]*)?: expected (?:one|at least one) argument", message
        )
        if flag is not None:
            argv = sys.argv[1:] if ARGV is None else ARGV
            name = flag.group(1)
            after = argv[argv.index(name) + 1] if name in argv[:-1] else ""
            if re.match(r"-[\d.]", after):
                message += f" (a value starting with '-': write {name}={after})"
        self.exit(2, f"jaxctbn: error: {message}\n")


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


def _probability_open(text) -> float:
    """argparse type: a probability strictly between 0 and 1 (test levels)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {text!r}")
    return value


def _hyperparameter(text) -> float | tuple[float, ...]:
    """argparse type: a prior hyper-parameter, one positive number or one per node in node
    order, comma-separated (`5,0.2,5,0.2`)."""
    parts = [t for t in str(text).split(",")]
    if len(parts) == 1:
        return _positive_number(parts[0])
    return tuple(_positive_number(t.strip()) for t in parts)


def _at_least(minimum: int, maximum: int | None = None, why: str = ""):
    """argparse type: an integer >= `minimum` (counts: trajectories, samples, repetitions...),
    and at most `maximum` when given (`why`: what the bound protects)."""

    def parse(text) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"at most {maximum:,}{why}, got {text!r}")
        return value

    return parse


#: the most visits a panel design places per experiment, and the most hill-climbing restarts
MAX_VISITS = 1000
MAX_RESTARTS = 100_000


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


# what each command writes to --out; checked before any work starts (convert: by the command,
# once it knows whether OUT is a file or, for causal-hub's trajectories, a directory)
_OUT_KINDS = {
    "convert": None,
    "sample": "file",
    "moments": "file",
    "learn": "file",
    "fit": "file",
    "compare": "file",
    "prevalence": "directory",
    "design": "file",
    "run": "directory",
    "demo": "directory",
}


#: the file formats of `--format`, `convert --from` and `convert --to` (`inputs.FORMATS`)
FORMAT_NAMES = ("jaxctbn", "pyagrum", "causal-hub", "pyctbn")


def _format_argument(p, what: str) -> None:
    """`--format auto|jaxctbn|pyagrum|causal-hub|pyctbn` of the commands that read data or
    networks (`what`: which of their files it applies to)."""
    p.add_argument(
        "--format",
        choices=("auto", *FORMAT_NAMES),
        default="auto",
        help=f"the format of {what}: auto (default: by the content, jaxctbn where no other "
        "fits), jaxctbn, pyagrum (trajectory CSV; no network file), causal-hub (CTBN JSON; "
        "trajectories: a directory of CSVs, one per trajectory, or one CSV), pyctbn (JSON)",
    )


def _convert_arguments(p) -> None:
    """`jaxctbn convert [--from F] --to F [--network NET] [--network-out FILE] IN OUT`."""
    p.add_argument("input", metavar="IN", help="a network or trajectory file (or directory)")
    p.add_argument(
        "out", metavar="OUT", help="the file to write (causal-hub's trajectories: a directory)"
    )
    p.add_argument(
        "--from",
        dest="from_format",
        choices=("auto", *FORMAT_NAMES),
        default="auto",
        help="IN's format (default auto: by its content, where exactly one format fits)",
    )
    p.add_argument("--to", choices=FORMAT_NAMES, required=True, help="OUT's format")
    p.add_argument(
        "--network",
        default=None,
        help="trajectories: a network file (any format) giving the nodes, their cardinalities "
        "and the labels of their states (default: from IN)",
    )
    p.add_argument(
        "--network-out",
        default=None,
        metavar="FILE",
        help="IN holding a network and trajectories (PyCTBN): also write the network, in the "
        "--to format, to FILE",
    )


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


def _max_parents(value, N):
    """`--max-parents` (default min(2, N - 1)), checked against the number of nodes."""
    max_parents = min(2, N - 1) if value is None else value
    if not 0 <= max_parents <= N - 1:
        raise ValueError(
            f"--max-parents: must be between 0 and {N - 1} (N - 1), got {max_parents}."
        )
    return max_parents


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

    from .._learning.priors import json_value as value

    out = {"convention": args.prior, "alpha": value(args.alpha), "beta": value(args.beta)}
    if args.empirical_bayes and posterior is not None:
        names = type(posterior.prior).hyperparameter_names
        fitted = [value(np.asarray(getattr(posterior.prior, n))) for n in names]
        out["empirical_bayes"] = {"alpha": fitted[0], "beta": fitted[1]}
    return out


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


def _increasing_times(text, *, zero_allowed: bool) -> tuple[float, ...]:
    """`T1,T2,...`: finite, > 0 (or >= 0 with `zero_allowed`) and strictly increasing."""
    try:
        values = tuple(float(t) for t in str(text).split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers T1,T2,..., got {text!r}"
        ) from None
    bound = ">= 0" if zero_allowed else "> 0"
    if not all((v >= 0 if zero_allowed else v > 0) and v < float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"every time must be finite and {bound}, got {text!r}")
    if any(b <= a for a, b in zip(values, values[1:])):
        raise argparse.ArgumentTypeError(
            f"times must be strictly increasing (sorted, none repeated), got {text!r}"
        )
    return values


def _grid_times(text) -> tuple[float, ...]:
    """argparse type: `T1,T2,...`, finite, >= 0 and strictly increasing times."""
    return _increasing_times(text, zero_allowed=True)


def _observation_times(text) -> tuple[float, ...]:
    """argparse type: `T1,T2,...`, finite, > 0 and strictly increasing visit times (at most
    `MAX_VISITS`)."""
    times = _increasing_times(text, zero_allowed=False)
    if len(times) > MAX_VISITS:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_VISITS:,} visit times (a panel has few visits), got {len(times):,}"
        )
    return times


def _outcome_arguments(p) -> None:
    """`--outcome path|panel` with `--observation-times T1,...` or `--visits K`."""
    p.add_argument(
        "--outcome",
        choices=["path", "panel"],
        default="path",
        help="what the next experiment reveals: path (every node's whole path, the paper's) "
        "or panel (the state seen at visit times)",
    )
    visits = p.add_mutually_exclusive_group()
    visits.add_argument(
        "--observation-times",
        type=_observation_times,
        default=None,
        help="panel: the visit times T1,T2,... in (0, the experiment's length]",
    )
    visits.add_argument(
        "--visits",
        type=_at_least(1, MAX_VISITS, " (a panel has few visits; watch a path whole instead)"),
        default=None,
        help="panel: K visits whose times each candidate chooses (bhc, vbhc; in run the "
        "other designs space them equally)",
    )


def _outcome(args):
    """The outcome Module of `--outcome` (`None` for complete paths), with one-line errors
    naming the flag."""
    if args.outcome == "path":
        if args.observation_times is not None or args.visits is not None:
            raise ValueError("--observation-times/--visits: only with --outcome panel.")
        return None
    from .._criteria.outcomes import PanelOutcome

    if args.observation_times is None and args.visits is None:
        raise ValueError("--outcome panel: give --observation-times T1,T2,... or --visits K.")
    if args.visits is not None:
        if args.criterion == "eig":
            raise ValueError(
                "--visits: the EIG cannot choose visit times; use --criterion bhc or vbhc, or "
                "give --observation-times."
            )
        return PanelOutcome(num_visits=args.visits)
    times = args.observation_times
    assert times is not None
    if times[-1] > args.duration:
        raise ValueError(
            f"--observation-times: every time must be in (0, --duration] = (0, {args.duration:g}],"
            f" got {times[-1]:g}."
        )
    import numpy as np

    return PanelOutcome(np.asarray(times))


def _cost(text) -> float:
    """argparse type: a price, a finite number >= 0."""
    return _non_negative_number(text)


def _costs_arguments(p) -> None:
    """`--costs NODE=C,NODE:STATE=C`, `--experiment-cost`, `--visit-cost`, `--budget` and
    `--rank-by`: what experiments cost and how the design trades score against cost."""
    p.add_argument(
        "--costs",
        nargs="+",
        default=None,
        help="cost of clamping a node, NODE=C (any state) or NODE:STATE=C (one state), or "
        "of scaling its rates (--strength), NODE*=C; comma-separated; unnamed nodes cost 0",
    )
    p.add_argument(
        "--experiment-cost", type=_cost, default=None, help="fixed cost of every experiment"
    )
    p.add_argument("--visit-cost", type=_cost, default=None, help="cost of each panel visit")
    p.add_argument(
        "--budget", type=_cost, default=None, help="the most the experiments may cost in all"
    )
    p.add_argument(
        "--rank-by",
        choices=["score", "score-per-cost"],
        default="score",
        help="score (costs only bound the budget) or score-per-cost (gain per unit cost)",
    )


def _costs(args, names, cardinalities):
    """The `jaxctbn.Costs` of the cost flags (`None` when none is given), one-line errors
    naming the flag."""
    import math

    given = (args.costs, args.experiment_cost, args.visit_cost)
    if all(v is None for v in given):
        if args.rank_by == "score-per-cost":
            raise ValueError(
                "--rank-by score-per-cost: give the prices (--costs, --experiment-cost, "
                "--visit-cost)."
            )
        return None
    from .._criteria.costs import Costs

    clamp, clamp_state, scale = {}, {}, {}
    seen: dict[str, str] = {}
    text = ",".join(args.costs or [])
    for item in filter(None, (t.strip() for t in text.split(","))):
        node, sep, value = item.rpartition("=")
        if not sep or not node:
            raise ValueError(f"--costs: expected NODE=C or NODE:STATE=C, got {item!r}.")
        try:
            price = float(value)
        except ValueError:
            raise ValueError(f"--costs: {item!r}: the cost must be a number.") from None
        if not (math.isfinite(price) and price >= 0):
            raise ValueError(f"--costs: {item!r}: the cost must be a finite number >= 0.")
        if node in seen:
            raise ValueError(f"--costs: {node!r} is priced twice ({seen[node]} and {value}).")
        seen[node] = value
        if node.endswith("*"):  # NODE*=C: an imperfect intervention (a rate scale) on NODE
            name = node[:-1]
            if name not in names:
                raise ValueError(f"--costs: unknown node {name!r}; the nodes are {list(names)}.")
            scale[name] = price
            continue
        name, colon, state = node.partition(":")
        if name not in names:
            raise ValueError(f"--costs: unknown node {name!r}; the nodes are {list(names)}.")
        if colon:
            k = cardinalities[list(names).index(name)]
            if not state.isdigit() or int(state) >= k:
                raise ValueError(f"--costs: {item!r}: the state of {name!r} must be in 0..{k - 1}.")
            clamp_state[(name, int(state))] = price
        else:
            clamp[name] = price
    # the dearest experiment (every price at once, each visit) must be a finite number
    visits = getattr(args, "visits", None) or len(getattr(args, "observation_times", None) or [1])
    dearest = (
        sum([*clamp.values(), *clamp_state.values(), *scale.values(), args.experiment_cost or 0.0])
        + (args.visit_cost or 0.0) * visits
    )
    if not math.isfinite(dearest):
        raise ValueError(
            "--costs, --experiment-cost, --visit-cost: an experiment's total cost overflows "
            "(above 1.8e308); state the prices in larger units."
        )
    return Costs.of_nodes(
        names,
        cardinalities,
        clamp=clamp,
        clamp_state=clamp_state,
        scale=scale,
        visit=args.visit_cost or 0.0,
        experiment=args.experiment_cost or 0.0,
    )


def _costs_json(args) -> dict | None:
    """The cost settings as given, for the output files."""
    if all(v is None for v in (args.costs, args.experiment_cost, args.visit_cost, args.budget)):
        return None
    return {
        "costs": ",".join(args.costs or []) or None,
        "experiment_cost": args.experiment_cost,
        "visit_cost": args.visit_cost,
        "budget": args.budget,
        "rank_by": args.rank_by,
    }


def _strength_argument(p) -> None:
    p.add_argument(
        "--strength",
        nargs="+",
        default=None,
        help="NODE=LOW:HIGH,...: candidates also scale NODE's rates by a strength in "
        "[LOW, HIGH] (0 < LOW <= HIGH <= 1000), chosen by gradient ascent of the criterion",
    )


#: `--strength`'s largest HIGH: a drug that speeds a node up a thousandfold is beyond what
#: the designs are for, and the master equation's cost grows linearly with the scaled rates.
STRENGTH_MAX = 1e3


def _strengths(args, names):
    """The `Strengths` of `--strength NODE=LOW:HIGH,...` (`None` without), one-line errors."""
    import math

    if args.strength is None:
        return None
    from .._criteria.strengths import Strengths

    nodes, lows, highs = [], [], []
    for item in filter(None, (t.strip() for t in ",".join(args.strength).split(","))):
        node, sep, span = item.partition("=")
        low, colon, high = span.partition(":")
        if not sep or not colon:
            raise ValueError(f"--strength: expected NODE=LOW:HIGH, got {item!r}.")
        if node not in names:
            raise ValueError(f"--strength: unknown node {node!r}; the nodes are {list(names)}.")
        try:
            a, b = float(low), float(high)
        except ValueError:
            raise ValueError(f"--strength: {item!r}: LOW and HIGH must be numbers.") from None
        if not (math.isfinite(a) and math.isfinite(b)) or a <= 0:
            raise ValueError(f"--strength: {item!r}: LOW must be > 0 and both finite.")
        if b < a:
            raise ValueError(f"--strength: {item!r}: empty range (HIGH < LOW).")
        if b > STRENGTH_MAX:
            raise ValueError(
                f"--strength: {item!r}: HIGH must be at most {STRENGTH_MAX:g} (a strength "
                "multiplies the node's rates, and the master equation's cost grows with it)."
            )
        if names.index(node) in nodes:
            raise ValueError(f"--strength: node {node!r} given twice.")
        nodes.append(list(names).index(node))
        lows.append(a)
        highs.append(b)
    if not nodes:
        raise ValueError("--strength: give NODE=LOW:HIGH for at least one node.")
    return Strengths(nodes, lows, highs)


#: `--search auto` scores every candidate set up to this many in all (N = 50 nodes with in-degree
#: 2 have 61,300; N = 100 have 495,100), and searches beyond
EXHAUSTIVE_SETS = 100_000


def _search(args, knowledge: dict, num_nodes: int):
    """The search Module of `--search` (`auto`: by the number of candidate sets, see
    `EXHAUSTIVE_SETS`), and its name."""
    import math

    import jax

    from .._learning.candidates import knowledge_arrays
    from .._learning.independence import CTPC
    from .._learning.search import Exhaustive, HillClimbing

    choice = args.search
    if choice == "auto":
        allowed, required, per_node = knowledge_arrays(num_nodes, **knowledge)
        count = 0
        for n, k in enumerate(per_node):
            free = int(allowed[:, n].sum() - required[:, n].sum())
            room = k - int(required[:, n].sum())
            count += sum(math.comb(free, j) for j in range(room + 1))
        choice = "exhaustive" if count <= EXHAUSTIVE_SETS else "hill-climbing"
    if args.restarts and choice != "hill-climbing":
        raise ValueError("--restarts: only with --search hill-climbing.")
    if args.candidates is not None and choice != "hill-climbing":
        raise ValueError("--candidates: only with --search hill-climbing.")
    if args.tabu and choice != "hill-climbing":
        raise ValueError("--tabu: only with --search hill-climbing.")
    if args.significance is not None and choice != "ctpc":
        raise ValueError("--significance: only with --search ctpc.")
    if choice == "exhaustive":
        return Exhaustive(), choice
    if choice == "ctpc":
        level = 0.1 if args.significance is None else args.significance
        return CTPC(alpha_f=level, alpha_chi2=level), choice
    key = jax.random.key(args.seed) if args.restarts else None
    search = HillClimbing(
        restarts=args.restarts, key=key, candidates=args.candidates, tabu=args.tabu
    )
    return search, choice


def _knowledge_arguments(p) -> None:
    """`--forbid`, `--require`, `--tiers` and the per-node `--max-parents` of structure
    learning."""
    p.add_argument(
        "--forbid", default=None, help="edges never in the graph: A->B,C->D (parent->child)"
    )
    p.add_argument("--require", default=None, help="edges always in the graph: A->B,...")
    p.add_argument(
        "--search",
        choices=("auto", "exhaustive", "hill-climbing", "ctpc"),
        default="auto",
        help="auto (default): exhaustive while every node has at most "
        f"{EXHAUSTIVE_SETS:,} candidate parent sets in all, hill-climbing beyond",
    )
    p.add_argument(
        "--restarts",
        type=_at_least(0, MAX_RESTARTS, " (each restart is a whole climb)"),
        default=0,
        help="hill-climbing: climbs from random starting sets besides the first (default 0)",
    )
    p.add_argument(
        "--candidates",
        type=_at_least(1),
        default=None,
        help="hill-climbing: climb among each node's P best single parents only (screened by "
        "one step of additions; for hundreds of nodes); default: every allowed parent",
    )
    p.add_argument(
        "--tabu",
        type=_at_least(0),
        default=0,
        help="hill-climbing: tabu search with tenure L (each node goes on past its local "
        "maximum without undoing its last L moves, keeping the best set seen); default 0",
    )
    p.add_argument(
        "--seed", type=_seed, default=0, help="hill-climbing restarts; panel sampling (default 0)"
    )
    p.add_argument(
        "--significance",
        type=_probability_open,
        default=None,
        help="ctpc: the level of its independence tests (default 0.1)",
    )
    p.add_argument(
        "--tiers",
        default=None,
        help="A,B;C;D: tiers separated by ';', every node once; a node's parents come from "
        "its own tier or earlier ones (a temporal order)",
    )
    p.add_argument(
        "--edge-prior",
        default=None,
        help="P or P,A->B=Q,...: the prior probability of every edge (a number, or 1/N), and "
        "of single edges; 'uniform': none (uniform over the candidate parent sets); default "
        "1/N (one expected parent per node: keeps false edges rare on large networks)",
    )


def _edges(text: str | None, names: list[str], flag: str) -> list[tuple[int, int]]:
    """`A->B,C->D` as `(parent, child)` index pairs, naming the flag in every error."""
    if text is None:
        return []
    out = []
    for item in text.split(","):
        item = item.strip()
        if "->" not in item:
            raise ValueError(
                f"{flag}: expected edges PARENT->CHILD separated by commas, got {item!r}."
            )
        a, b = (part.strip() for part in item.split("->", 1))
        for name in (a, b):
            if name not in names:
                raise ValueError(f"{flag}: unknown node {name!r} in {item!r}; nodes are {names}.")
        if a == b:
            raise ValueError(f"{flag}: {item!r} is a self-loop; a node is not its own parent.")
        out.append((names.index(a), names.index(b)))
    return out


def _tiers(text: str | None, names: list[str]) -> list[int] | None:
    """`A,B;C;D` as one tier index per node (every node in exactly one tier)."""
    if text is None:
        return None
    tier: dict[str, int] = {}
    for t, group in enumerate(text.split(";")):
        for name in (n.strip() for n in group.split(",")):
            if name not in names:
                raise ValueError(f"--tiers: unknown node {name!r}; nodes are {names}.")
            if name in tier:
                raise ValueError(f"--tiers: node {name!r} is in more than one tier.")
            tier[name] = t
    missing = [n for n in names if n not in tier]
    if missing:
        raise ValueError(
            f"--tiers: node(s) {missing} in no tier; list every node once (tiers separated by ';')."
        )
    return [tier[n] for n in names]


def _max_parents_per_node(text: str | None, names: list[str]) -> int | list[int]:
    """`--max-parents K` or `K,NODE=K2,...` (a default and per-node in-degrees; default
    min(2, N - 1)), each in 0..N-1."""
    N = len(names)
    if text is None:
        return min(2, N - 1)
    default, per_node = None, {}
    for item in text.split(","):
        item = item.strip()
        name, _, value = item.rpartition("=")
        try:
            k = int(value)
        except ValueError:
            raise ValueError(
                f"--max-parents: expected K or K,NODE=K,... with integers, got {item!r}."
            ) from None
        if not 0 <= k <= N - 1:
            raise ValueError(f"--max-parents: must be between 0 and {N - 1} (N - 1), got {item!r}.")
        if not name:
            default = k
        elif name not in names:
            raise ValueError(f"--max-parents: unknown node {name!r}; nodes are {names}.")
        else:
            per_node[name] = k
    base = min(2, N - 1) if default is None else default
    if not per_node:
        return base
    return [per_node.get(n, base) for n in names]


#: `learn`'s edge prior without `--edge-prior`: every edge has prior probability 1/N (one
#: expected parent per node; at N = 2 it is the uniform prior over the parent sets). Measured
#: against the uniform prior on random networks of 10-500 nodes and on the paper's network
#: (`benchmarks/learning/bench_structure_prior.py`, `results/structure_prior.md`).
DEFAULT_EDGE_PRIOR = "1/N"


def _edge_prior(text: str | None, names: list[str]):
    """`P` or `P,A->B=Q,...` (`P` a number or `1/N`) as the (N, N) edge probabilities of
    `structure_log_prior` (the diagonal unused), `uniform` as None; every probability in (0, 1).
    Without the flag: `DEFAULT_EDGE_PRIOR` (None for a single node, which has no edges)."""
    import numpy as np

    if text is None:
        text = DEFAULT_EDGE_PRIOR if len(names) > 1 else "uniform"
    if text.strip() == "uniform":
        return None

    def probability(value: str, what: str) -> float:
        if value.replace(" ", "") == "1/N" and what == "P":
            return 1.0 / len(names)
        try:
            p = float(value)
        except ValueError:
            p = float("nan")
        if not 0.0 < p < 1.0:
            raise ValueError(
                f"--edge-prior: {what} must be a probability in (0, 1), got {value!r} (P may be "
                "1/N; 'uniform': no edge prior)."
            )
        return p

    first, *rest = text.split(",")
    if first.strip() == "uniform":
        raise ValueError(
            f"--edge-prior: 'uniform' (no edge prior) takes no edges; give P,PARENT->CHILD=Q,... "
            f"(P a probability or 1/N), got {text!r}."
        )
    if "=" in first or "->" in first:
        raise ValueError(
            f"--edge-prior: expected P or P,PARENT->CHILD=Q,... (P first), got {text!r}."
        )
    pi = np.full((len(names), len(names)), probability(first.strip(), "P"))
    given = set()
    for item in rest:
        edge, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--edge-prior: expected PARENT->CHILD=Q, got {item.strip()!r}.")
        ((a, b),) = _edges(edge, names, "--edge-prior")
        if (a, b) in given:
            raise ValueError(
                f"--edge-prior: {names[a]}->{names[b]} is given twice; give each edge once."
            )
        given.add((a, b))
        pi[a, b] = probability(value.strip(), edge.strip())
    np.fill_diagonal(pi, 0.5)
    return pi


def _prior_knowledge(args, names: list[str]) -> dict:
    """The keyword arguments of the structure learners for `--max-parents`, `--forbid`,
    `--require` and `--tiers`, checked against each other with messages that name the nodes."""
    max_parents = _max_parents_per_node(args.max_parents, names)
    forbidden = _edges(args.forbid, names, "--forbid")
    required = _edges(args.require, names, "--require")
    tiers = _tiers(args.tiers, names)
    for a, b in required:
        edge = f"{names[a]}->{names[b]}"
        if (a, b) in forbidden:
            raise ValueError(f"--require: {edge} is also in --forbid.")
        if tiers is not None and tiers[a] > tiers[b]:
            raise ValueError(
                f"--require: {edge} goes from a later tier into an earlier one, which --tiers "
                "forbids."
            )
    per_node = [max_parents] * len(names) if isinstance(max_parents, int) else max_parents
    for b, name in enumerate(names):
        count = len({a for a, c in required if c == b})
        if count > per_node[b]:
            raise ValueError(
                f"--require: node {name!r} has {count} required parents, more than its "
                f"--max-parents {per_node[b]}."
            )
    return dict(
        max_parents=max_parents, required_edges=required, forbidden_edges=forbidden, tiers=tiers
    )
