"""Sample estimates of design criteria (the paper's appendix figure "MI_design"): does the
intervention a criterion recommends depend on the history of observations?

For random 3-node binary CTBNs (`jaxctbn.experiments.random_graph`, max in-degree 2; rates by the paper's
recipe, `jaxctbn.random_ctbn` with Gamma(5,1) fast / Gamma(1/5,1) slow nodes, each node fast
with probability 1/2) we draw `--histories` histories per graph, each `--trajectories` (30)
passive trajectories of length tau = 3 with uniformly random initial states, and learn the exact
structure posterior of each (`jaxctbn.learn_structure`, max in-degree 2). For every criterion
(structure VBHC, BHC, EIG) and number of posterior samples N_S the recommended intervention is
the argmax of `jaxctbn.score_interventions` over the 27 interventions of
`jaxctbn.intervention_space`, for the next experiment's initial state s0 = (0, 0, 0) (the same
for every history, so the MI measures dependence on the history only). The recommendation is
random through the scorer's key: `--keys` keys per history estimate p(i | h), and

    I(i; H) = H(mean_h p(i | h)) - mean_h H(p(i | h))   (plug-in, bits),

with its small-sample bias shown by a permutation null and corrected by Miller-Madow (see the
written `.md` for the reasoning). Everything for one graph, criterion and N_S is one compiled
call, vmapped over histories and keys; one compilation per (criterion, N_S).

Run: `python benchmarks/criteria/bench_mi_design.py [--quick] [--graphs G] [--histories H] [--keys R]
[--samples 1 2 5 10 20] [--eig-paths P]`; writes `results/mi_design.{json,md,png}`
(`--quick`: `results/mi_design_quick.*`).
"""

from __future__ import annotations

import os
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import (
    RESULTS,
    argument_parser,
    compile_time,
    environment,
    fmt,
    stopwatch,
    write_results,
)

NAMES = ("X1", "X2", "X3")
CARDS = (2, 2, 2)
TAU = 3.0
MAX_PARENTS = 2
LN2 = float(np.log(2.0))


# ---------------------------------------------------------------- the MI estimator (numpy)


def recommendation_counts(recommendations, num_candidates: int) -> np.ndarray:
    """`(histories, repeats)` recommended indices -> `(histories, candidates)` counts."""
    recommendations = np.asarray(recommendations)
    counts = np.zeros((recommendations.shape[0], num_candidates), np.int64)
    np.add.at(counts, (np.arange(recommendations.shape[0])[:, None], recommendations), 1)
    return counts


def _entropy_bits(p: np.ndarray) -> np.ndarray:
    """Entropy (bits) along the last axis, $0\\log 0 = 0$."""
    safe = np.where(p > 0, p, 1.0)
    return -(p * np.log2(safe)).sum(-1)


def mutual_information(counts, *, miller_madow: bool = False) -> float:
    r"""Plug-in estimate of $I(i;h)=H(i)-\sum_h p(h)H(i\mid h)$ in bits from a
    `(histories, candidates)` table of counts, $p(h)$ the share of the samples of history $h$.

    With `miller_madow=True` each entropy gets the Miller-Madow term $(m-1)/(2n)$ nats
    ($m$ occupied bins, $n$ samples): the marginal with all $n=\sum_h n_h$ samples, each
    conditional with its own $n_h$. The plug-in entropies are biased low by about that much, the
    conditional ones (few samples each) most, so the plug-in MI is biased high; the correction
    removes the leading term of the bias."""
    counts = np.asarray(counts, np.float64)
    n_h = counts.sum(1)
    n = n_h.sum()
    if n <= 0 or np.any(n_h <= 0):
        raise ValueError("mutual_information: every history needs at least one sample.")
    marginal = counts.sum(0) / n
    conditional = counts / n_h[:, None]
    h_marginal = float(_entropy_bits(marginal))
    h_conditional = _entropy_bits(conditional)
    if miller_madow:
        h_marginal += (np.count_nonzero(marginal) - 1) / (2 * n * LN2)
        h_conditional = h_conditional + (np.count_nonzero(counts, axis=1) - 1) / (2 * n_h * LN2)
    return h_marginal - float((n_h / n) @ h_conditional)


def permutation_null(
    recommendations, num_candidates: int, rng: np.random.Generator, num_permutations: int
) -> np.ndarray:
    """Plug-in MI after shuffling which history each recommendation belongs to (keeping the
    number per history): `num_permutations` draws of the estimator when $i$ and $h$ are
    independent with the observed marginal of $i$, i.e. the estimator's bias floor."""
    recommendations = np.asarray(recommendations)
    flat = np.broadcast_to(recommendations.reshape(-1), (num_permutations, recommendations.size))
    shuffled = rng.permuted(flat, axis=1).reshape(num_permutations, *recommendations.shape)
    return np.array(
        [mutual_information(recommendation_counts(s, num_candidates)) for s in shuffled]
    )


# ---------------------------------------------------------------- problems and recommendations


def random_problem(key, *, histories: int, trajectories: int):
    """A random 3-node CTBN and `histories` structure posteriors, each learned from
    `trajectories` passive paths of length tau with uniformly random initial states."""
    k_graph, k_fast, k_rates, k_init, k_paths = jr.split(key, 5)
    parents = jc.experiments.random_graph(k_graph, len(NAMES), max_parents=MAX_PARENTS)
    fast = np.asarray(jr.bernoulli(k_fast, 0.5, (len(NAMES),))).tolist()
    truth = jc.random_ctbn(k_rates, parents, CARDS, fast=fast, names=NAMES)
    n = histories * trajectories
    initial = jr.randint(k_init, (n, len(NAMES)), 0, 2)
    paths = jc.sample_trajectories(truth, initial, TAU, key=k_paths, num_trajectories=n)
    if bool(paths.truncated.any()):
        raise RuntimeError("a history path hit max_events; raise it in sample_trajectories.")
    per_history = jax.tree_util.tree_map(
        lambda a: a.reshape(histories, trajectories, *a.shape[1:]), paths
    )
    posteriors = jax.vmap(lambda t: jc.learn_structure(t, NAMES, CARDS, max_parents=MAX_PARENTS))(
        per_history
    )
    return {"parents": parents, "fast": fast}, posteriors


def _data(posterior):
    """The leaves of a structure posterior that depend on the history."""
    return (
        posterior.log_marginal_likelihoods,
        posterior.statistics.transitions,
        posterior.statistics.dwell_times,
    )


def recommender(criterion, num_samples: int, batching):
    """`(template, data (H, ...), keys (H, R)) -> (H, R)` argmax interventions, jitted: the
    posterior of history h is `template` with its history-dependent leaves set to `data[h]`
    (the candidate parent sets and the prior are the same for every graph of this size, so one
    compilation serves every graph)."""
    space = jc.intervention_space(CARDS)
    s0 = jnp.zeros(len(NAMES), jnp.int32)

    def one(template, data, key):
        posterior = eqx.tree_at(_data, template, data)
        scores = jc.score_interventions(
            posterior,
            space,
            s0,
            TAU,
            criterion=criterion,
            key=key,
            num_samples=num_samples,
            batching=batching,
        )
        return jnp.argmax(scores)

    def recommend(template, data, keys):
        per_key = jax.vmap(one, in_axes=(None, None, 0))
        return jax.vmap(per_key, in_axes=(None, 0, 0))(template, data, keys)

    return jax.jit(recommend)


# ---------------------------------------------------------------- driver


def quantiles(x):
    q = np.quantile(np.asarray(x, float), [0.25, 0.5, 0.75])
    return {"q25": float(q[0]), "median": float(q[1]), "q75": float(q[2])}


def main():
    ap = argument_parser(
        "MI between history and recommended intervention.", quick="a smoke run (tiny sizes)"
    )
    ap.add_argument("--graphs", type=int, default=16, help="random ground truths (bands)")
    ap.add_argument("--histories", type=int, default=8, help="histories per graph")
    ap.add_argument("--keys", type=int, default=5, help="scorer keys per history")
    ap.add_argument("--trajectories", type=int, default=30, help="trajectories per history")
    ap.add_argument("--samples", type=int, nargs="+", default=[1, 2, 5, 10, 20], help="N_S")
    ap.add_argument("--eig-paths", type=int, default=1, help="EIG paths per posterior draw")
    ap.add_argument(
        "--eig-max-events",
        type=int,
        default=128,
        help="EIG jump buffer per path (a graph whose paths overflow it is rerun with 256)",
    )
    ap.add_argument("--permutations", type=int, default=200, help="permutation-null draws")
    ap.add_argument("--criteria", nargs="+", default=["vbhc", "bhc", "eig"])
    ap.add_common(seed=0, name="mi_design")
    args = ap.parse_args()
    if args.quick:
        args.graphs, args.histories, args.keys, args.samples = 2, 3, 3, [1, 5]
        args.permutations = 50
        args.name += "_quick"
    command = " ".join(["python benchmarks/criteria/bench_mi_design.py", *sys.argv[1:]])
    criteria = {
        "vbhc": (jc.VBHC(), None),  # default estimator PlugIn, default batching Chunked(9)
        "bhc": (jc.BHC(), None),
        # EIG: chunks of 9 candidates (its default, Vmap, holds every path of all 27 at once)
        "eig": (jc.EIG(num_paths=args.eig_paths, max_events=args.eig_max_events), jc.Chunked(9)),
    }
    criteria = {c: criteria[c] for c in args.criteria}
    num_candidates = int(jc.intervention_space(CARDS).targets.shape[0])
    total = stopwatch()

    # -- ground truths and histories (shared by every criterion and N_S: paired comparisons)
    root = jr.key(args.seed)
    k_problems, k_design = jr.split(root)
    graphs, data = [], []
    template = None
    sw_histories = stopwatch()
    for g in range(args.graphs):
        info, posteriors = random_problem(
            jr.fold_in(k_problems, g), histories=args.histories, trajectories=args.trajectories
        )
        graphs.append(info)
        data.append(_data(posteriors))
        if template is None:
            template = jax.tree_util.tree_map(lambda a: a[0], posteriors)
        print(f"graph {g}: parents {info['parents']}, fast {info['fast']}", flush=True)
    t_histories = sw_histories.elapsed
    keys = [
        jr.split(jr.fold_in(k_design, g), (args.histories, args.keys)) for g in range(args.graphs)
    ]

    # -- recommendations: one compilation per (criterion, N_S), one call per graph
    rng = np.random.default_rng(args.seed)
    records, timings = [], []
    for name, (criterion, batching) in criteria.items():
        for ns in args.samples:
            jitted = recommender(criterion, ns, batching)
            ctime, compiled = compile_time(jitted, template, data[0], keys[0])
            sw_run = stopwatch()
            recs, fallback, reruns = [], None, []
            for g in range(args.graphs):
                try:
                    recs.append(np.asarray(compiled(template, data[g], keys[g])))
                except RuntimeError as err:
                    # the EIG's path buffer overflowed (checked inside jit): the same keys give
                    # the same paths with a longer buffer, so rerun this graph with 256
                    if name != "eig" or args.eig_max_events >= 256:
                        raise
                    if "max_events" not in str(err):
                        raise
                    print(f"graph {g}: an EIG path overflowed max_events; rerun with 256")
                    if fallback is None:
                        fallback = recommender(
                            jc.EIG(num_paths=args.eig_paths, max_events=256), ns, batching
                        )
                    recs.append(np.asarray(fallback(template, data[g], keys[g])))
                    reruns.append(g)
            run = sw_run.elapsed
            per_scoring = run / (args.graphs * args.histories * args.keys)
            timings.append(
                {
                    "criterion": name,
                    "N_S": ns,
                    "compile_s": ctime,
                    "run_s": run,
                    "per_scoring_s": per_scoring,
                    "reruns_256": reruns,
                }
            )
            for g, r in enumerate(recs):
                counts = recommendation_counts(r, num_candidates)
                null = permutation_null(r, num_candidates, rng, args.permutations)
                records.append(
                    {
                        "criterion": name,
                        "N_S": ns,
                        "graph": g,
                        "mi_plugin": mutual_information(counts),
                        "mi_miller_madow": mutual_information(counts, miller_madow=True),
                        "null_mean": float(null.mean()),
                        "null_q95": float(np.quantile(null, 0.95)),
                        "marginal_entropy": float(_entropy_bits(counts.sum(0) / counts.sum())),
                        "modal_share": float((counts.max(1) / args.keys).mean()),
                        "recommendations": r.tolist(),
                    }
                )
            print(
                f"{name} N_S={ns}: compile {fmt(ctime)}, run {fmt(run)} "
                f"({fmt(per_scoring)} per scoring of {num_candidates} candidates)",
                flush=True,
            )
    wall = total.elapsed

    # -- summaries over graphs
    summary = []
    for name in criteria:
        for ns in args.samples:
            rows = [r for r in records if r["criterion"] == name and r["N_S"] == ns]
            entry = {"criterion": name, "N_S": ns}
            for field in (
                "mi_plugin",
                "mi_miller_madow",
                "null_mean",
                "null_q95",
                "marginal_entropy",
                "modal_share",
            ):
                entry[field] = quantiles([r[field] for r in rows])
            entry["excess"] = quantiles([r["mi_plugin"] - r["null_mean"] for r in rows])
            entry["above_null_q95"] = int(sum(r["mi_plugin"] > r["null_q95"] for r in rows))
            summary.append(entry)
    figure = f"{args.name}.png"
    payload = {
        "command": command,
        "environment": environment(),
        "config": {k: v for k, v in vars(args).items()},
        "graphs": graphs,
        "wall_s": wall,
        "histories_s": t_histories,
        "timings": timings,
        "summary": summary,
        "records": records,
    }
    write_results(
        args.name,
        payload,
        report(summary, timings, graphs, args, command, wall, t_histories, figure),
    )
    plot(summary, criteria, args, os.path.join(RESULTS, figure))


def plot(summary, criteria, args, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"vbhc": "C0", "bhc": "C1", "eig": "C2"}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for c in criteria:
        rows = [s for s in summary if s["criterion"] == c]
        x = [s["N_S"] for s in rows]
        for ax, field in zip(axes, ("mi_plugin", "excess", "mi_miller_madow")):
            med = [s[field]["median"] for s in rows]
            ax.plot(x, med, "o-", color=colours[c], label=c.upper())
            ax.fill_between(
                x,
                [s[field]["q25"] for s in rows],
                [s[field]["q75"] for s in rows],
                color=colours[c],
                alpha=0.2,
            )
        axes[0].plot(
            x,
            [s["null_mean"]["median"] for s in rows],
            "--",
            color=colours[c],
            alpha=0.8,
            label=f"{c.upper()} permutation null",
        )
    axes[0].set_title("plug-in MI (dashed: permutation null)")
    axes[1].set_title("excess over the permutation null")
    axes[1].axhline(0.0, color="k", lw=0.8)
    axes[2].set_title("Miller-Madow corrected MI")
    for ax in axes:
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(args.samples, [str(s) for s in args.samples])
        ax.set_xlabel("$N_S$ (posterior samples)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("$I(i;\\mathcal{H})$ [bits]")
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"{args.graphs} random 3-node CTBNs x {args.histories} histories of "
        f"{args.trajectories} paths x {args.keys} keys; median and 25-75% over graphs",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _band(q, digits=2):
    return f"{q['median']:.{digits}f} [{q['q25']:.{digits}f}, {q['q75']:.{digits}f}]"


def verdict(summary, args) -> str:
    """One paragraph from the numbers: (V)BHC against the EIG, N_S by N_S, on the bias-corrected
    measure (excess over the permutation null) and on the raw plug-in MI."""
    by = {(s["criterion"], s["N_S"]): s for s in summary}
    bh = [c for c in ("vbhc", "bhc") if (c, args.samples[0]) in by]
    if ("eig", args.samples[0]) not in by or not bh:
        return "VBHC or BHC and the EIG were not all run; no comparison."
    ns_all = args.samples

    def med(c, field):
        return [by[(c, ns)][field]["median"] for ns in ns_all]

    def listed(values):
        return ", ".join(f"{v:.2f}" for v in values)

    eig_excess = med("eig", "excess")
    ahead = {c: sum(x > e for x, e in zip(med(c, "excess"), eig_excess)) for c in bh}
    ahead_raw = {
        c: sum(x > e for x, e in zip(med(c, "mi_plugin"), med("eig", "mi_plugin"))) for c in bh
    }
    everywhere = all(k == len(ns_all) for k in ahead.values())
    raw_everywhere = all(k == len(ns_all) for k in ahead_raw.values())
    answer = (
        "Yes after correcting the estimator's bias"
        if everywhere
        else "Not at every sample size even after correcting the estimator's bias"
    ) + (
        ", and also in the raw plug-in MI."
        if raw_everywhere
        else ", but not in the raw plug-in MI."
    )
    sentences = [
        "Do (V)BHC's recommendations share much more information with the history than those "
        f"of the EIG sample estimate? {answer}",
        "Excess of the plug-in MI over its permutation null (median over graphs, bits, for "
        f"N_S = {', '.join(map(str, ns_all))}): "
        + "; ".join(f"{c.upper()} {listed(med(c, 'excess'))}" for c in [*bh, "eig"])
        + " ("
        + ", ".join(f"{c.upper()} above the EIG at {ahead[c]} of {len(ns_all)}" for c in bh)
        + ").",
        "Graphs whose plug-in MI exceeds the null's 95% quantile, summed over N_S: "
        + ", ".join(
            f"{c.upper()} {sum(by[(c, ns)]['above_null_q95'] for ns in ns_all)}"
            f"/{args.graphs * len(ns_all)}"
            for c in [*bh, "eig"]
        )
        + ".",
        "Raw plug-in MI: "
        + "; ".join(f"{c.upper()} {listed(med(c, 'mi_plugin'))}" for c in [*bh, "eig"])
        + f"; the EIG's null floor is {listed(med('eig', 'null_mean'))}"
        + (
            ", so most of the EIG's raw MI is the estimator's bias"
            if all(n > 0.5 * m for n, m in zip(med("eig", "null_mean"), med("eig", "mi_plugin")))
            else ""
        )
        + ". Median modal share (how often a history's most frequent recommendation recurs over "
        "its keys): "
        + "; ".join(f"{c.upper()} {listed(med(c, 'modal_share'))}" for c in [*bh, "eig"])
        + "; the noisier a criterion's recommendation for a fixed history, the smaller its "
        "plug-in conditional entropy is relative to the truth with few keys, and the larger the "
        "bias.",
        "The paper does not say how its MI was estimated"
        + (
            "; with this estimator its ordering appears only after the bias correction."
            if everywhere and not raw_everywhere
            else "."
        )
        + " The MI says nothing about whether the recommended interventions are good.",
    ]
    return " ".join(sentences)


def report(summary, timings, graphs, args, command, wall, t_histories, figure):
    bound = np.log2(min(args.histories, 27))
    lines = [
        "# Sample estimates of design criteria: MI between history and recommendation",
        "",
        f"Command: `{command}` ({environment()['device']}, float64, "
        f"{os.cpu_count()} shared cores; total wall time {wall / 60:.1f} min).",
        "",
        f"![MI vs N_S]({figure})",
        "",
        "## Design",
        "",
        f"- **Ground truths**: {args.graphs} random 3-node binary CTBNs "
        "(`jc.experiments.random_graph(key, 3, max_parents=2)`, each edge with probability 1/2; rates "
        "`jc.random_ctbn` with Gamma(5,1) for fast and Gamma(1/5,1) for slow nodes, each node "
        "fast with probability 1/2, the paper's structure-learning recipe). The graphs drawn are "
        "listed at the end.",
        f"- **Histories**: per graph {args.histories} histories H, each {args.trajectories} "
        f"passive trajectories of length tau = {TAU:g} from the truth with uniformly random "
        "initial states; the structure posterior of each is exact "
        "(`jc.learn_structure(..., max_parents=2)`, 4 candidate parent sets per node).",
        f"- **Recommendation**: i = argmax over the 27 interventions of "
        "`jc.intervention_space` of `jc.score_interventions(posterior, space, s0, 3.0, "
        "criterion=c, key=k, num_samples=N_S)` with c = `jc.VBHC()`, `jc.BHC()` (both the "
        "default plug-in KL estimator) or "
        f"`jc.EIG(num_paths={args.eig_paths}, max_events={args.eig_max_events})` (batched "
        "`jc.Chunked(9)`; the EIG's default `Vmap` would hold the paths of all 27 candidates "
        "at once). `max_events` is only a speed knob (the loop's cost grows with the buffer; "
        "the same key gives the same path with any buffer that holds it); a graph whose EIG "
        "paths overflow it is rerun with 256 "
        f"({sum(len(t.get('reruns_256', [])) for t in timings)} reruns here). The next "
        "experiment's initial state is fixed to s0 = (0, 0, 0) for every history: if it were "
        "drawn per history, the MI would also count the dependence of i on s0. The EIG uses "
        f"{args.eig_paths} path(s) per posterior draw, so that N_S counts its samples as it does "
        "for (V)BHC (N_S draws of graph and rates per candidate parent set), and because "
        "the EIG is by far the most expensive scorer (see timings).",
        f"- **p(i | h)**: {args.keys} independent scorer keys per history (the recommendation "
        "is random only through the key: posterior draws and, for the EIG, paths). The same "
        "histories and keys serve every criterion and N_S.",
        "- **Estimator**: plug-in I(i; H) = H(mean_h p(i|h)) - mean_h H(p(i|h)) in **bits**, "
        "histories equally weighted, computed per graph; bands are the 25-75% quantiles over "
        f"graphs. It is at most log2({args.histories}) = {bound:.2f} bits (i determined by h "
        "and different for every history) and is 0 both when i ignores h and when a criterion "
        "always recommends the same intervention (then H(i) = 0 too; the column H(i) tells "
        "the two apart).",
        f"- **Bias**: with {args.keys} recommendations per history the plug-in conditional "
        "entropies are biased low (by about (m-1)/(2R) nats for m distinct recommendations out "
        "of R), so the plug-in MI is biased **high**, most for a noisy criterion whose "
        "recommendations are spread over many interventions. Two answers: the **permutation "
        f"null** (recommendations shuffled across the histories of a graph, {args.permutations} "
        "shuffles; its mean is the value the estimator gives when i and H are independent "
        "with the same marginal of i: the bias floor) and the **Miller-Madow** correction "
        "(each entropy plus (m-1)/(2n) nats). Miller-Madow is only the leading term of the "
        "bias and is poor when the number of distinct recommendations is comparable to the "
        "number of samples (as for a noisy criterion with few keys per history: it corrects "
        "the pooled marginal upwards too), so the **excess over the null** is the measure the "
        "verdict uses. 'Excess' = plug-in minus null mean; 'above null' = graphs whose "
        "plug-in MI exceeds the null's 95% quantile (a per-graph test at level 5%).",
        "",
        "## Results (median [25%, 75%] over graphs, bits)",
        "",
        "| criterion | N_S | plug-in MI | Miller-Madow MI | null floor | excess over null | "
        "above null | H(i) | modal share |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        lines.append(
            f"| {s['criterion'].upper()} | {s['N_S']} | {_band(s['mi_plugin'])} | "
            f"{_band(s['mi_miller_madow'])} | {_band(s['null_mean'])} | {_band(s['excess'])} | "
            f"{s['above_null_q95']}/{args.graphs} | {_band(s['marginal_entropy'])} | "
            f"{_band(s['modal_share'])} |"
        )
    lines += [
        "",
        "H(i): entropy of the recommendations pooled over histories and keys; modal share: "
        "mean over histories of the frequency of the most frequent recommendation (1 = the "
        "same intervention for every key).",
        "",
        "## Verdict",
        "",
        verdict(summary, args),
        "",
        "## Timing",
        "",
        f"Histories and posteriors: {fmt(t_histories)}. Per (criterion, N_S): one compilation, "
        f"then {args.graphs} calls of {args.histories} x {args.keys} scorings (each scoring = "
        "27 candidates).",
        "",
        "| criterion | N_S | compile | run | per scoring |",
        "|---|---|---|---|---|",
    ]
    for t in timings:
        lines.append(
            f"| {t['criterion'].upper()} | {t['N_S']} | {fmt(t['compile_s'])} | "
            f"{fmt(t['run_s'])} | {fmt(t['per_scoring_s'])} |"
        )
    lines += ["", "## Ground truths", ""]
    for g, info in enumerate(graphs):
        lines.append(f"- graph {g}: parents {info['parents']}, fast {info['fast']}")
    return lines


if __name__ == "__main__":
    main()
