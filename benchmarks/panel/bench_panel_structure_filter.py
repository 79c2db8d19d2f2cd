"""The structure loop's posterior with panel outcomes: how close to the exact graph posterior,
and what does it cost?

`StructureLearningTask(truth, outcome=Panel(times))` updates its graph posterior after every
experiment from that experiment's panel alone. Two families:

- `StructureParticleFilter(P)` (the default since issue 60): sequential Monte Carlo over the
  hidden paths with exact complete-data structure posteriors as particles, exact as P grows;
- `StructuralEM(10)` (the former default): each experiment's expected family statistics under
  the current MAP graph with posterior-mean rates, added to the history and kept.

**Accuracy against the exact graph posterior.** Two binary nodes, the truth A -> B (A flips at
rate 1; B follows A at rate 2 and leaves it at rate 0.2), Gamma(1, 1) rate prior, every graph
with in-degree <= 1 (four graphs), uniform structure prior. Each data set is E experiments
(no intervention, each starting in a uniformly drawn state) of tau = 2 seen at K equally spaced
visits (K = 4, 2, 1: gaps 0.5, 1, 2, about 1, 2 and 4 mixing times of B), fed to each family one
experiment at a time as the loop does. The exact p(G | Y) is proportional to
E[prod_r p(Y_r | G, rates) | G] under the prior, by numpy Monte Carlo with `--rate-draws` prior
draws of the rates per graph (every transition matrix by numpy's eigendecomposition). Reported
per K and family over `--datasets` data sets: the mean and largest absolute error of the two
edge marginals against the exact ones (target of issue 60: within 0.05), and the Monte Carlo
standard error of the exact reference.

**Cost.** The paper's structure network (4 binary nodes, every graph with in-degree <= 3),
one loop step (the panel-aware BHC design with N_S = 10 over the 81 candidates, then the
update) with K = 3 visits at 1, 2, 3, batched over `--cost-repetitions` repetitions (one
compiled call of 3 experiments, timed after compilation), per family, and the ratio to the
structural-EM step (issue 60's target for parameters: within 10x).

Run: `python benchmarks/panel/bench_panel_structure_filter.py [--datasets D] [--experiments E]
[--particles P] [--rate-draws M] [--cost-repetitions C] [--quick]`; writes
`results/panel_structure_filter.{json,md}` (`--quick`: 3 data sets, 8 repetitions, to
`results/panel_structure_filter_quick.*`; `--accuracy-only`: no cost part, to
`results/panel_structure_filter_P<particles>.*`).
"""

from __future__ import annotations

import itertools
import os
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc  # noqa: E402
from jaxctbn._paths.sampling import sample_trajectory  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import (  # noqa: E402
    argument_parser,
    environment,
    repeat_time,
    stopwatch,
    write_results,
)

NAMES, CARDS = ("A", "B"), (2, 2)
TRUTH = jc.CTBN(
    cims=[
        jnp.array([[[-1.0, 1.0], [1.0, -1.0]]]),
        jnp.array([[[-0.2, 0.2], [2.0, -2.0]], [[-2.0, 2.0], [0.2, -0.2]]]),
    ],
    parents=((), (0,)),
    names=NAMES,
)
TAU = 2.0
ALPHA, BETA = 1.0, 1.0
#: parent-set index per node -> parents (in-degree <= 1: the empty set, then the other node)
GRAPHS = list(itertools.product(range(2), range(2)))


def exact_edges(states, grid, rate_draws, rng):
    """The exact edge marginals p(A -> B), p(B -> A) of the panels `states` (R, O, 2) seen at
    `grid`, by numpy Monte Carlo over prior rate draws per graph; and the Monte Carlo standard
    error of each (the delta method over the four evidences)."""
    gaps = np.diff(grid)
    ys = states[..., 0] * 2 + states[..., 1]  # global states (R, O)
    evidence, errors = [], []
    for graph in GRAPHS:
        # per node: (draws, configurations of its parents, 2 rates (0->1, 1->0))
        rates = [rng.gamma(ALPHA, 1 / BETA, size=(rate_draws, 2 if g else 1, 2)) for g in graph]
        W = np.zeros((rate_draws, 4, 4))
        for a, b in itertools.product(range(2), range(2)):
            s = a * 2 + b
            for n in range(2):
                u = (b if n == 0 else a) if graph[n] else 0
                own = (a, b)[n]
                rate = rates[n][:, u, own]
                t = (1 - a) * 2 + b if n == 0 else a * 2 + (1 - b)
                W[:, s, t] += rate
                W[:, s, s] -= rate
        lam, V = np.linalg.eig(W)
        Vinv = np.linalg.inv(V)
        like = np.ones(rate_draws)
        for h in np.unique(gaps):
            P = np.real(np.einsum("rij,rj,rjk->rik", V, np.exp(h * lam), Vinv))
            for k in np.nonzero(gaps == h)[0]:
                like = like * np.prod(P[:, ys[:, k], ys[:, k + 1]], axis=1)
        evidence.append(like.mean())
        errors.append(like.std() / np.sqrt(rate_draws))
    evidence, errors = np.array(evidence), np.array(errors)
    post = evidence / evidence.sum()
    a_to_b = post[[g[1] == 1 for g in GRAPHS]].sum()
    b_to_a = post[[g[0] == 1 for g in GRAPHS]].sum()
    # delta method: d p_set / d e_g = (1[g in set] - p_set) / sum(e)
    se = []
    for member in ([g[1] == 1 for g in GRAPHS], [g[0] == 1 for g in GRAPHS]):
        p = post[member].sum()
        grad = (np.asarray(member, float) - p) / evidence.sum()
        se.append(float(np.sqrt(np.sum((grad * errors) ** 2))))
    return np.array([a_to_b, b_to_a]), np.array(se)


def accuracy(args, families):
    prior = jc.StructurePosterior.from_prior(
        NAMES, CARDS, max_parents=1, prior=jc.GammaPrior(ALPHA, BETA)
    )
    rng = np.random.default_rng(args.seed)
    rows = {}
    for K in (4, 2, 1):
        grid = np.linspace(0.0, TAU, K + 1)
        updates = {
            name: eqx.filter_jit(
                lambda p, o, k, family=family: jc.panel.panel_structure_posterior(
                    p, o, family=family, key=k
                )
            )
            for name, family in families.items()
        }
        errors = {name: [] for name in families}
        exact_se = []
        for d in range(args.datasets):
            key = jax.random.fold_in(jax.random.key(args.seed), 1000 * K + d)
            k_start, k_paths, k_filter = jax.random.split(key, 3)
            starts = jax.random.randint(k_start, (args.experiments, 2), 0, 2)
            paths = jax.vmap(lambda s, k: sample_trajectory(TRUTH, s, TAU, key=k, max_events=256))(
                starts, jax.random.split(k_paths, args.experiments)
            )
            observations = jc.panel.PanelObservations.from_paths(paths, jnp.asarray(grid))
            exact, se = exact_edges(np.asarray(observations.states), grid, args.rate_draws, rng)
            exact_se.append(se.max())
            for name, family in families.items():
                posterior = family.initial(prior)
                for e, k in enumerate(jax.random.split(k_filter, args.experiments)):
                    one = jax.tree_util.tree_map(lambda x: x[e : e + 1], observations)
                    posterior = updates[name](posterior, one, k)
                edges = np.asarray(posterior.edge_marginals())
                got = np.array([edges[0, 1], edges[1, 0]])
                errors[name].append(np.abs(got - exact))
        rows[K] = {
            "gap": TAU / K,
            "exact_standard_error_max": float(np.max(exact_se)),
            **{
                name: {
                    "mean_abs_error": float(np.mean(errors[name])),
                    "max_abs_error": float(np.max(errors[name])),
                    "within_0.05": float(np.mean(np.max(errors[name], axis=1) <= 0.05)),
                }
                for name in families
            },
        }
        print(K, rows[K], flush=True)
    return rows


def cost(args, families):
    truth = jc.paper_network(jax.random.key(0), rates="gamma")
    space = jc.intervention_space(truth.cardinalities)
    panel = jc.PanelOutcome(jnp.array([1.0, 2.0, 3.0]))
    design = jc.CriterionDesign(jc.BHC(), num_samples=10, outcome=panel)
    base = jax.random.key(args.seed + 1)
    keys = jax.vmap(lambda r: jax.random.fold_in(base, r))(jnp.arange(args.cost_repetitions))
    steps = 3
    timing = {}
    for name, family in families.items():
        task = jc.StructureLearningTask(truth, max_parents=3, outcome=panel, panel_posterior=family)
        call = jax.jit(
            lambda ks, task=task: jc.run_repetitions(
                task, design, ks, num_experiments=steps, horizon=3.0, candidates=space,
                max_events=512,
            ).metrics["auroc"]
        )  # fmt: skip
        # the first call (with compilation), then the best of two
        _, calls = repeat_time(call, keys, repeats=1 + 2)
        first, best = calls.times[0], min(calls.times[1:])
        timing[name] = {
            "step_seconds": best / steps,
            "first_call_seconds": first,
            "repetitions": args.cost_repetitions,
        }
        print(name, timing[name], flush=True)
    return timing


def main():
    ap = argument_parser(__doc__)
    ap.add_argument("--datasets", type=int, default=20)
    ap.add_common(experiments=5)
    ap.add_argument("--particles", type=int, default=256)
    ap.add_argument("--rate-draws", type=int, default=200_000)
    ap.add_argument("--cost-repetitions", type=int, default=100)
    ap.add_common(seed=0, quick=True)
    ap.add_argument(
        "--accuracy-only",
        action="store_true",
        help="skip the cost part (results to panel_structure_filter_P<particles>.*)",
    )
    args = ap.parse_args()
    if args.quick:
        args.datasets, args.cost_repetitions, args.rate_draws = 3, 8, 20_000
    families = {
        "particle-filter": jc.panel.StructureParticleFilter(num_particles=args.particles),
        "structural-em": jc.panel.StructuralEM(10),
    }
    total = stopwatch()
    rows = accuracy(args, families)
    timing = {} if args.accuracy_only else cost(args, families)
    ratio = (
        timing["particle-filter"]["step_seconds"] / timing["structural-em"]["step_seconds"]
        if timing
        else None
    )
    wall = total.elapsed
    command = "python benchmarks/panel/bench_panel_structure_filter.py" + "".join(
        " " + a for a in sys.argv[1:]
    )
    settings = {
        "truth": "A -> B (A flips at 1; B follows A at 2, leaves it at 0.2)",
        "prior": f"GammaPrior({ALPHA}, {BETA}), uniform over the four graphs",
        "tau": TAU,
        "datasets": args.datasets,
        "experiments": args.experiments,
        "particles": args.particles,
        "rate_draws": args.rate_draws,
        "cost_repetitions": args.cost_repetitions,
        "seed": args.seed,
        "command": command,
    }
    table = [
        "# The structure loop's posterior with panel outcomes: the particle filter against the "
        "exact graph posterior",
        "",
        f"Two binary nodes, truth A -> B, Gamma(1, 1) rate prior, four graphs; {args.datasets} "
        f"data sets of {args.experiments} experiments (tau = 2, uniform random start, no "
        "intervention) seen at K equally spaced visits, fed one experiment at a time as the loop "
        f"does. Exact p(G | Y) by numpy Monte Carlo ({args.rate_draws} prior rate draws per "
        "graph). Absolute error of the two edge marginals p(A -> B), p(B -> A); `within 0.05`: "
        "the fraction of data sets whose largest error is at most 0.05 (issue 60's target).",
        "",
        f"Command: `{command}`. Wall time {wall / 60:.1f} min.",
        "",
        "| K (gap) | family | mean abs error | largest abs error | within 0.05 | exact MC s.e. "
        "(largest) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    labels = {
        "particle-filter": f"particle filter ({args.particles})",
        "structural-em": "structural EM (10)",
    }
    for K, row in rows.items():
        for name in families:
            r = row[name]
            table.append(
                f"| {K} ({row['gap']:g}) | {labels[name]} | {r['mean_abs_error']:.3f} | "
                f"{r['max_abs_error']:.3f} | {r['within_0.05']:.2f} | "
                f"{row['exact_standard_error_max']:.4f} |"
            )
    if timing:
        table += cost_table(args, families, timing, labels, ratio)
    name = "panel_structure_filter" + ("_quick" if args.quick else "")
    if args.accuracy_only:
        name += f"_P{args.particles}"
    payload = {
        "environment": environment(),
        "settings": settings,
        "wall_s": wall,
        "accuracy": {str(K): v for K, v in rows.items()},
        "timing": timing,
        "step_ratio": ratio,
    }
    write_results(name, payload, table)


def cost_table(args, families, timing, labels, ratio):
    table = [
        "",
        "## Cost of a loop step",
        "",
        f"The paper's structure network (4 binary nodes, in-degree <= 3), the panel-aware BHC "
        f"(N_S = 10, 81 candidates) at visits 1, 2, 3, then the update; "
        f"{args.cost_repetitions} repetitions batched in one compiled call of 3 experiments, "
        "best of 2 after compilation.",
        "",
        "| family | step (s) | first call incl. compilation (s) |",
        "|---|---:|---:|",
    ]
    for name in families:
        t = timing[name]
        table.append(
            f"| {labels[name]} | {t['step_seconds']:.2f} | {t['first_call_seconds']:.1f} |"
        )
    table += ["", f"Particle filter / structural EM per step: {ratio:.1f}x."]
    return table


if __name__ == "__main__":
    main()
