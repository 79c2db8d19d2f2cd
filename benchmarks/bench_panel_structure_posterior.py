"""Panel structure posteriors against the exact graph posterior: the sampled mixture
(`SampledStructure`, the default) and structural EM (`StructuralEM`) beside the exact
$p(G\\mid Y)$ by enumeration, side by side in one run.

Two binary nodes, truth A -> B (A flips at rate 1; B follows A at rate 2 and leaves it at 0.2),
Gamma(1, 1) rate priors, uniform structure prior over each node's two candidate sets. Panels of
`subjects` subjects from (0, 0), seen at `visits` equal spacings of 0.1 to 1.0 time units (A's
mixing time is 0.5). The exact posterior: $p(G\\mid Y)\\propto p(G)\\,p(Y\\mid G)$ over the four
graphs, each $p(Y\\mid G)=\\mathsf E_{\\Lambda\\sim p(\\Lambda\\mid G)}[p(Y\\mid G,\\Lambda)]$ by
numpy Monte Carlo over prior draws of the rates (transition matrices by numpy's batched
eigendecomposition of the 4-state generator; no jaxctbn code), with the importance weights'
effective sample size reported. Per case: each method's edge marginals p(A->B), p(B->A), the
largest absolute error against exact, the sampler's diagnostics and each method's wall time
(with its compilation).

    python benchmarks/bench_panel_structure_posterior.py [--draws 400000] [--sweeps 500]
"""

from __future__ import annotations

import argparse
import itertools
import time

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from _common import environment, write_results

import jaxctbn as jc

jax.config.update("jax_enable_x64", True)

NAMES, CARDS = ("A", "B"), (2, 2)
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
    """`(num_draws, 4, 4)` generators of prior rate draws for `graph` (per node: parent or
    none); global state s = 2 a + b."""
    W = np.zeros((num_draws, 4, 4))
    for n, parent in enumerate(graph):
        configs = 2 if parent is not None else 1
        up = rng.gamma(ALPHA, 1 / BETA, size=(num_draws, configs))
        down = rng.gamma(ALPHA, 1 / BETA, size=(num_draws, configs))
        for a, b in itertools.product(range(2), range(2)):
            x = (a, b)
            u = x[parent] if parent is not None else 0
            rate = (up if x[n] == 0 else down)[:, u]
            y = list(x)
            y[n] = 1 - x[n]
            s, t = 2 * a + b, 2 * y[0] + y[1]
            W[:, s, t] += rate
            W[:, s, s] -= rate
    return W


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


def exact_edges(states, gap, num_draws, seed):
    """Exact p(A->B), p(B->A) (and the smallest ESS over the graphs)."""
    rng = np.random.default_rng(seed)
    graphs = list(itertools.product((None, 1), (None, 0)))  # (A's parent, B's parent)
    evidence, sizes = [], []
    for graph in graphs:
        value, ess = log_evidence(graph, states, gap, rng, num_draws)
        evidence.append(value)
        sizes.append(ess)
    post = np.exp(np.array(evidence) - max(evidence))
    post /= post.sum()
    a_to_b = sum(p for g, p in zip(graphs, post) if g[1] == 0)
    b_to_a = sum(p for g, p in zip(graphs, post) if g[0] == 1)
    return np.array([a_to_b, b_to_a]), min(sizes)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--draws", type=int, default=400_000, help="prior draws per graph (exact)")
    ap.add_argument("--sweeps", type=int, default=500, help="SampledStructure sweeps per chain")
    ap.add_argument("--name", default="panel_structure_posterior")
    args = ap.parse_args()
    prior = jc.StructurePosterior.from_prior(
        NAMES, CARDS, max_parents=1, prior=jc.GammaPrior(ALPHA, BETA)
    )
    family = jc.panel.SampledStructure(num_sweeps=args.sweeps)
    records = []
    for subjects, visits, gap in itertools.product((8, 16), (4,), (0.1, 0.25, 0.5, 1.0)):
        key = jr.key(int(1000 * gap) + subjects)
        grid = jnp.arange(visits + 1) * gap
        start = jnp.zeros(2, jnp.int32)
        paths = jc.sample_trajectories(
            TRUTH, start, float(grid[-1]), key=key, num_trajectories=subjects
        )
        observations = jc.panel.observe_paths(paths, grid)
        states = np.asarray(observations.states) @ np.array([2, 1])
        t = time.perf_counter()
        exact, ess = exact_edges(states, gap, args.draws, seed=subjects)
        t_exact = time.perf_counter() - t
        t = time.perf_counter()
        em = jc.panel.panel_structure_posterior(
            prior, observations, family=jc.panel.StructuralEM()
        ).edge_marginals()
        em = np.asarray(em)[[0, 1], [1, 0]]
        t_em = time.perf_counter() - t
        t = time.perf_counter()
        mixture = jc.panel.panel_structure_posterior(
            prior, observations, family=family, key=jr.fold_in(key, 1)
        )
        sampled = np.asarray(mixture.edge_marginals())[[0, 1], [1, 0]]
        t_sampled = time.perf_counter() - t
        d = mixture.diagnostics
        assert d is not None
        rec = {
            "subjects": subjects,
            "visits": visits,
            "gap": gap,
            "exact": exact.tolist(),
            "exact_min_importance_ess": ess,
            "sampled": sampled.tolist(),
            "structural_em": em.tolist(),
            "sampled_max_error": float(np.abs(sampled - exact).max()),
            "structural_em_max_error": float(np.abs(em - exact).max()),
            "max_split_r_hat": float(d.max_split_r_hat()),
            "min_ess": float(d.min_effective_sample_size()),
            "seconds": {"exact": t_exact, "structural_em": t_em, "sampled": t_sampled},
        }
        print(rec, flush=True)
        records.append(rec)
    lines = [
        "# Panel structure posteriors against the exact graph posterior",
        "",
        "Two binary nodes, truth A -> B; Gamma(1, 1) rate priors; each case's exact p(G | Y) by "
        f"enumeration of the 4 graphs with numpy Monte Carlo evidences ({args.draws:,} prior "
        "draws per graph; `ESS` the smallest importance ESS). `SampledStructure`: 4 chains, "
        f"100 burn-in + {args.sweeps} sweeps. Edge marginals as p(A->B) / p(B->A); `error` the "
        "largest absolute error against exact (target 0.05). Times include compilation.",
        "",
        "| subjects | gap | exact | ESS | sampled | error | R-hat | ESS (chains) "
        "| structural EM | error | time sampled | time EM |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['subjects']} | {r['gap']} | {r['exact'][0]:.3f} / {r['exact'][1]:.3f} "
            f"| {r['exact_min_importance_ess']:.0f} "
            f"| {r['sampled'][0]:.3f} / {r['sampled'][1]:.3f} | {r['sampled_max_error']:.3f} "
            f"| {r['max_split_r_hat']:.3f} | {r['min_ess']:.0f} "
            f"| {r['structural_em'][0]:.3f} / {r['structural_em'][1]:.3f} "
            f"| {r['structural_em_max_error']:.3f} | {r['seconds']['sampled']:.1f} s "
            f"| {r['seconds']['structural_em']:.1f} s |"
        )
    worst_sampled = max(r["sampled_max_error"] for r in records)
    worst_em = max(r["structural_em_max_error"] for r in records)
    lines += [
        "",
        f"Largest error over the cases: sampled {worst_sampled:.3f}, structural EM {worst_em:.3f}.",
    ]
    write_results(
        args.name, {"environment": environment(), "records": records, "args": vars(args)}, lines
    )


if __name__ == "__main__":
    main()
