"""Panel structure posteriors against the exact graph posterior: the sampled mixture
(`SampledStructure`, the default, with exact path draws and with node-by-node Gibbs path updates
`path_sampler=GibbsSampler()`, the route beyond exact forward-backward) and structural EM
(`StructuralEM`) beside the exact $p(G\\mid Y)$ by enumeration, side by side in one run.

Binary nodes, truth A -> B (A flips at rate 1; B follows A at rate 2 and leaves it at 0.2) and
a three-node chain A -> B -> C (C follows B the same way), at most one parent per node, Gamma(1,
1) rate priors, uniform structure prior over each node's candidate sets. Panels of `subjects`
subjects from the all-zero state, seen at 4 equal spacings of 0.1 to 1.0 time units (A's mixing
time is 0.5). The exact posterior: $p(G\\mid Y)\\propto p(G)\\,p(Y\\mid G)$ over all the
graphs (4, or 27), each $p(Y\\mid G)=\\mathsf E_{\\Lambda\\sim p(\\Lambda\\mid G)}[p(Y\\mid
G,\\Lambda)]$ by numpy Monte Carlo over prior draws of the rates (transition matrices by numpy's
batched eigendecomposition of the generator; no jaxctbn code), with the importance weights'
effective sample size reported. Per case: each method's edge marginals, the largest absolute
error against exact, the sampler's diagnostics and each method's wall time (with its
compilation).

    python benchmarks/panel/bench_panel_structure_posterior.py [--draws 400000] [--sweeps 1000]

**Scaling** (`--scaling`, to `results/panel_structure_posterior_scaling.*`): the Gibbs-path
sampler alone on chains of N = 8, 16, 32 binary nodes (each node's parent the one before it,
rates as above; candidate parents: the node's two neighbours, at most one), 20 subjects seen at
6 visits 0.5 apart (`--scaling-sweeps`, 300 per chain): wall time with compilation, edge
recall and false edges of the marginals at 0.5, and the chains' diagnostics. Exact path draws would need $2^N$ joint states.
"""

from __future__ import annotations

import itertools
import os
import sys

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import argument_parser, environment, stopwatch, write_results

import jaxctbn as jc

jax.config.update("jax_enable_x64", True)

NAMES = ("A", "B")
ALPHA, BETA = 1.0, 1.0
TRUTH = jc.CTBN(
    cims=[
        jnp.array([[[-1.0, 1.0], [1.0, -1.0]]]),
        jnp.array([[[-0.2, 0.2], [2.0, -2.0]], [[-2.0, 2.0], [0.2, -0.2]]]),
    ],
    parents=((), (0,)),
    names=NAMES,
)


def generators(graph, rng, num_draws):
    """`(num_draws, 2^N, 2^N)` generators of prior rate draws for `graph` (per node: its parent
    or None) of N binary nodes; global state s = sum_n x_n 2^(N-1-n)."""
    N = len(graph)
    S = 2**N
    W = np.zeros((num_draws, S, S))
    for n, parent in enumerate(graph):
        configs = 2 if parent is not None else 1
        up = rng.gamma(ALPHA, 1 / BETA, size=(num_draws, configs))
        down = rng.gamma(ALPHA, 1 / BETA, size=(num_draws, configs))
        for x in itertools.product(range(2), repeat=N):
            u = x[parent] if parent is not None else 0
            rate = (up if x[n] == 0 else down)[:, u]
            y = list(x)
            y[n] = 1 - x[n]
            s, t = _index(x), _index(y)
            W[:, s, t] += rate
            W[:, s, s] -= rate
    return W


def _index(x) -> int:
    return int(sum(v << (len(x) - 1 - i) for i, v in enumerate(x)))


def log_evidence(graph, states, gap, rng, num_draws, chunk=50_000):
    """ln p(Y | graph) by Monte Carlo over the prior, and the weights' effective sample size."""
    logs = []
    for start in range(0, num_draws, chunk):
        W = generators(graph, rng, min(chunk, num_draws - start))
        lam, V = np.linalg.eig(W)
        P = np.real(np.einsum("rij,rj,rjk->rik", V, np.exp(gap * lam), np.linalg.inv(V)))
        log_like = np.zeros(W.shape[0])
        for row in states:
            for x0, x1 in zip(row[:-1], row[1:]):
                log_like += np.log(np.clip(P[:, x0, x1], 1e-300, None))
        logs.append(log_like)
    log_like = np.concatenate(logs)
    top = log_like.max()
    w = np.exp(log_like - top)
    return top + np.log(w.mean()), float(w.sum() ** 2 / (w**2).sum())


def exact_edges(N, states, gap, num_draws, seed):
    """Exact edge marginals `(N, N)` over every graph of at most one parent per node (and the
    smallest importance ESS over the graphs)."""
    rng = np.random.default_rng(seed)
    options = [[None] + [m for m in range(N) if m != n] for n in range(N)]
    graphs = list(itertools.product(*options))
    evidence, sizes = [], []
    for graph in graphs:
        value, ess = log_evidence(graph, states, gap, rng, num_draws)
        evidence.append(value)
        sizes.append(ess)
    post = np.exp(np.array(evidence) - max(evidence))
    post /= post.sum()
    edges = np.zeros((N, N))
    for graph, p in zip(graphs, post):
        for n, parent in enumerate(graph):
            if parent is not None:
                edges[parent, n] += p
    return edges, min(sizes)


TRUTH3 = jc.CTBN(
    cims=[
        jnp.array([[[-1.0, 1.0], [1.0, -1.0]]]),
        jnp.array([[[-0.2, 0.2], [2.0, -2.0]], [[-2.0, 2.0], [0.2, -0.2]]]),
        jnp.array([[[-0.2, 0.2], [2.0, -2.0]], [[-2.0, 2.0], [0.2, -0.2]]]),
    ],
    parents=((), (0,), (1,)),
    names=("A", "B", "C"),
)


def main():
    ap = argument_parser(__doc__)
    ap.add_argument("--draws", type=int, default=400_000, help="prior draws per graph (exact)")
    ap.add_argument("--sweeps", type=int, default=1000, help="SampledStructure sweeps per chain")
    ap.add_common(name="panel_structure_posterior")
    ap.add_argument("--scaling", action="store_true", help="the Gibbs-path sampler's scaling")
    ap.add_argument("--scaling-sweeps", type=int, default=300, help="--scaling: sweeps per chain")
    args = ap.parse_args()
    if args.scaling:
        return scaling(args)
    family = jc.panel.SampledStructure(num_sweeps=args.sweeps)
    gibbs = jc.panel.SampledStructure(num_sweeps=args.sweeps, path_sampler=jc.panel.GibbsSampler())
    cases = [(TRUTH, subjects, gap) for subjects in (8, 16) for gap in (0.1, 0.25, 0.5, 1.0)]
    cases += [(TRUTH3, 12, gap) for gap in (0.25, 0.5, 1.0)]
    records = []
    visits = 4
    for truth, subjects, gap in cases:
        N = truth.num_nodes
        prior = jc.StructurePosterior.from_prior(
            truth.names, truth.cardinalities, max_parents=1, prior=jc.GammaPrior(ALPHA, BETA)
        )
        key = jr.key(int(1000 * gap) + subjects)
        grid = jnp.arange(visits + 1) * gap
        paths = jc.sample_trajectories(
            truth, jnp.zeros(N, jnp.int32), float(grid[-1]), key=key, num_trajectories=subjects
        )
        observations = jc.panel.PanelObservations.from_paths(paths, grid)
        states = np.asarray(observations.states) @ (2 ** np.arange(N - 1, -1, -1))
        off = ~np.eye(N, dtype=bool)
        with stopwatch() as sw:
            exact, ess = exact_edges(N, states, gap, args.draws, seed=subjects)
        t_exact = sw.seconds
        with stopwatch() as sw:
            em = jc.panel.panel_structure_posterior(
                prior, observations, family=jc.panel.StructuralEM()
            ).edge_marginals()
            em = np.asarray(em)
        t_em = sw.seconds
        with stopwatch() as sw:
            mixture = jc.panel.panel_structure_posterior(
                prior, observations, family=family, key=jr.fold_in(key, 1)
            )
            sampled = np.asarray(mixture.edge_marginals())
        t_sampled = sw.seconds
        d = mixture.diagnostics
        assert d is not None
        with stopwatch() as sw:
            by_gibbs = jc.panel.panel_structure_posterior(
                prior, observations, family=gibbs, key=jr.fold_in(key, 1)
            )
            gibbs_edges = np.asarray(by_gibbs.edge_marginals())
        t_gibbs = sw.seconds
        dg = by_gibbs.diagnostics
        assert dg is not None
        edges = [f"{truth.names[m]}->{truth.names[n]}" for m, n in zip(*np.nonzero(off))]
        rec = {
            "nodes": N,
            "subjects": subjects,
            "visits": visits,
            "gap": gap,
            "edges": edges,
            "exact": exact[off].tolist(),
            "exact_min_importance_ess": ess,
            "sampled": sampled[off].tolist(),
            "structural_em": em[off].tolist(),
            "sampled_gibbs_paths": gibbs_edges[off].tolist(),
            "sampled_max_error": float(np.abs(sampled - exact)[off].max()),
            "gibbs_paths_max_error": float(np.abs(gibbs_edges - exact)[off].max()),
            "gibbs_paths_max_split_r_hat": float(dg.max_split_r_hat()),
            "gibbs_paths_min_ess": float(dg.min_effective_sample_size()),
            "structural_em_max_error": float(np.abs(em - exact)[off].max()),
            "max_split_r_hat": float(d.max_split_r_hat()),
            "min_ess": float(d.min_effective_sample_size()),
            "seconds": {
                "exact": t_exact,
                "structural_em": t_em,
                "sampled": t_sampled,
                "gibbs_paths": t_gibbs,
            },
        }
        print(rec, flush=True)
        records.append(rec)
    lines = [
        "# Panel structure posteriors against the exact graph posterior",
        "",
        "Binary nodes, truth A -> B (and A -> B -> C), at most one parent per node, Gamma(1, 1) "
        "rate priors, uniform structure prior; `subjects` panels from the all-zero state seen "
        f"at {visits} equal gaps. Each case's exact p(G | Y) by enumeration of the graphs (4, "
        f"or 27) with numpy Monte Carlo evidences ({args.draws:,} prior draws per graph, "
        "transition matrices by numpy's eigendecomposition; `ESS` the smallest importance ESS "
        f"over the graphs). `SampledStructure`: 4 chains, 100 burn-in + {args.sweeps} sweeps, "
        "exact path draws (`sampled`) or Gibbs path updates (`Gibbs paths`, one node sweep per "
        "sweep). Edge marginals in the order of the `edges` column; `error` the largest "
        "absolute error "
        "over the edges against exact (target 0.05). Times include compilation (the first "
        "case of each network compiles).",
        "",
        "| nodes | subjects | gap | edges | exact | ESS | sampled | error | R-hat | ESS (chains) "
        "| Gibbs paths | error | R-hat | ESS (chains) | structural EM | error | time sampled "
        "| time Gibbs paths | time EM |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def row(values):
        return " ".join(f"{v:.3f}" for v in values)

    for r in records:
        lines.append(
            f"| {r['nodes']} | {r['subjects']} | {r['gap']} | {' '.join(r['edges'])} "
            f"| {row(r['exact'])} | {r['exact_min_importance_ess']:.0f} "
            f"| {row(r['sampled'])} | {r['sampled_max_error']:.3f} "
            f"| {r['max_split_r_hat']:.3f} | {r['min_ess']:.0f} "
            f"| {row(r['sampled_gibbs_paths'])} | {r['gibbs_paths_max_error']:.3f} "
            f"| {r['gibbs_paths_max_split_r_hat']:.3f} | {r['gibbs_paths_min_ess']:.0f} "
            f"| {row(r['structural_em'])} | {r['structural_em_max_error']:.3f} "
            f"| {r['seconds']['sampled']:.1f} s | {r['seconds']['gibbs_paths']:.1f} s "
            f"| {r['seconds']['structural_em']:.1f} s |"
        )
    worst_sampled = max(r["sampled_max_error"] for r in records)
    worst_em = max(r["structural_em_max_error"] for r in records)
    worst_gibbs = max(r["gibbs_paths_max_error"] for r in records)
    lines += [
        "",
        f"Largest error over the cases: sampled {worst_sampled:.3f}, Gibbs paths "
        f"{worst_gibbs:.3f}, structural EM {worst_em:.3f}.",
    ]
    write_results(
        args.name, {"environment": environment(), "records": records, "args": vars(args)}, lines
    )


def chain_network(N: int) -> jc.CTBN:
    """N binary nodes, each (but the first) following the one before it (rates as TRUTH's B)."""
    follow = jnp.array([[[-0.2, 0.2], [2.0, -2.0]], [[-2.0, 2.0], [0.2, -0.2]]])
    cims = [jnp.array([[[-1.0, 1.0], [1.0, -1.0]]])] + [follow] * (N - 1)
    parents = ((),) + tuple((n - 1,) for n in range(1, N))
    return jc.CTBN(cims=cims, parents=parents, names=tuple(f"X{n}" for n in range(N)))


def scaling(args):
    records = []
    for N in (8, 16, 32):
        truth = chain_network(N)
        neighbours = [[m for m in (n - 1, n + 1) if 0 <= m < N] for n in range(N)]
        prior = jc.StructurePosterior.from_prior(
            truth.names,
            truth.cardinalities,
            max_parents=1,
            prior=jc.GammaPrior(ALPHA, BETA),
            knowledge=jc.PriorKnowledge(
                forbidden_edges=[
                    (m, n) for n in range(N) for m in range(N) if m != n and m not in neighbours[n]
                ]
            ),
        )
        grid = jnp.arange(6) * 0.5
        key = jr.key(N)
        paths = jc.sample_trajectories(
            truth, jnp.zeros(N, jnp.int32), float(grid[-1]), key=key, num_trajectories=20
        )
        observations = jc.panel.PanelObservations.from_paths(paths, grid)
        family = jc.panel.SampledStructure(
            num_sweeps=args.scaling_sweeps, path_sampler=jc.panel.GibbsSampler()
        )
        with stopwatch() as sw:
            mixture = jc.panel.panel_structure_posterior(
                prior, observations, family=family, key=jr.fold_in(key, 1)
            )
            edges = np.asarray(mixture.edge_marginals())
        seconds = sw.seconds
        true = np.zeros((N, N), bool)
        for n in range(1, N):
            true[n - 1, n] = True
        found = edges > 0.5
        d = mixture.diagnostics
        assert d is not None
        rec = {
            "nodes": N,
            "subjects": 20,
            "seconds": seconds,
            "recall": float((found & true).sum() / true.sum()),
            "false_edges": int((found & ~true).sum()),
            "true_edge_marginal_mean": float(edges[true].mean()),
            "max_split_r_hat": float(d.max_split_r_hat()),
            "min_ess": float(d.min_effective_sample_size()),
        }
        print(rec, flush=True)
        records.append(rec)
    lines = [
        "# The sampled structure posterior with Gibbs path updates: scaling",
        "",
        "Chains X0 -> X1 -> ... of N binary nodes, 20 subjects from the all-zero state seen at 6 "
        "visits 0.5 apart; candidates: each node's two neighbours, at most one parent; Gamma(1, "
        f"1) rates. `SampledStructure(path_sampler=GibbsSampler())`, 4 chains, 100 burn-in + "
        f"{args.scaling_sweeps} sweeps; time with compilation. Exact path draws would need 2^N "
        "joint states.",
        "",
        "| nodes | time | recall at 0.5 | false edges | mean marginal of the true edges | R-hat "
        "| ESS |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['nodes']} | {r['seconds']:.1f} s | {r['recall']:.2f} | {r['false_edges']} "
            f"| {r['true_edge_marginal_mean']:.3f} | {r['max_split_r_hat']:.3f} "
            f"| {r['min_ess']:.0f} |"
        )
    write_results(
        "panel_structure_posterior_scaling",
        {"environment": environment(), "records": records, "args": vars(args)},
        lines,
    )


if __name__ == "__main__":
    main()
