"""`jaxctbn learn`: exact Bayesian structure learning from a trajectory or panel CSV."""

from __future__ import annotations

import math
from typing import Any

from .._files import write_json
from .arguments import (
    DEFAULT_EDGE_PRIOR,
    _assignment,
    _edge_prior,
    _empirical_bayes,
    _prior,
    _prior_json,
    _prior_knowledge,
    _search,
)
from .jax_setup import _exported, _jit


def _structure_summary(post):
    """`parent_set_probabilities()`, `edge_marginals()`, `entropy()`, `map_graph()` and
    `map_model()` of a structure posterior or a mixture of them, the array parts compiled as
    two programs (exported and loaded on a warm call: the summary, and `map_model`'s)."""
    import jax

    def summary(p):
        return p.parent_set_probabilities(), p.edge_marginals(), p.entropy()

    probs, edges, entropy = jax.device_get(_exported("structure_summary", summary)(post))
    map_model = post.map_model()
    return probs, edges, entropy, map_model.parents, map_model


def _parse_cardinalities(text, df, *, missing: bool = False, known=None):
    """The node cardinalities: inferred from the data `df` (or `known`, those another tool's
    file defines), overridden by `--cardinalities` (never below the largest state seen). The
    warning of a suspicious inferred cardinality is shown only for nodes that `--cardinalities`
    does not give."""
    import warnings

    from .._model.layout import parse_assignment
    from .._paths.csv import infer_cardinalities

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        inferred = infer_cardinalities(df, missing=missing) if known is None else dict(known)
    out = dict(inferred)
    given = parse_assignment(",".join(text), list(out), "--cardinalities")
    for w in caught:
        if not any(f"node {name!r} " in str(w.message) for name in given):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    for name, k in given.items():
        if k < inferred[name]:
            raise ValueError(
                f"--cardinalities: {name!r} has "
                + (
                    f"states up to {inferred[name] - 1} in the data"
                    if known is None
                    else f"{inferred[name]} states in the data file"
                )
                + f", so K must be >= {inferred[name]}."
            )
        out[name] = k
    return out


def _edge_prior_json(edge_prior, names, text):
    """`{"default": P, "edges": {"A->B": Q, ...}, "given": TEXT}` for `--edge-prior` (the edges
    that differ from the most common probability; `given`: the flag as given, or `1/N (the
    default)`), or None (`uniform`)."""
    if edge_prior is None:
        return None
    import numpy as np

    off = ~np.eye(len(names), dtype=bool)
    values, counts = np.unique(edge_prior[off], return_counts=True)
    default = float(values[np.argmax(counts)])
    edges = {
        f"{names[a]}->{names[b]}": float(edge_prior[a, b])
        for a, b in zip(*np.nonzero(off & (edge_prior != default)))
    }
    given = f"{DEFAULT_EDGE_PRIOR} (the default)" if text is None else text
    return {"default": default, "edges": edges, "given": given}


#: the largest joint state space on which `--panel-posterior` defaults to `sampled` (each sweep
#: draws every trajectory's path by exact forward-backward over the joint states)
SAMPLED_DEFAULT_STATES = 256


def _panel_posterior_method(args, panel: bool, cards=()) -> str | None:
    """`--panel-posterior` resolved (`None` for complete paths), its flags checked: by default
    `sampled` with `--inference exact` on at most `SAMPLED_DEFAULT_STATES` joint states, else
    `moment` (said in the output and on stdout)."""
    if not panel:
        for flag, value in (
            ("--panel-posterior", args.panel_posterior),
            ("--sweeps", args.sweeps),
            ("--chains", args.chains),
        ):
            if value is not None:
                raise ValueError(f"{flag}: only for panel data (--observation panel).")
        return None
    gibbs = args.inference == "sampling" and args.sampler != "importance"
    if args.panel_posterior == "sampled" and args.inference != "exact" and not gibbs:
        what = "--sampler importance" if args.inference == "sampling" else "--inference mean-field"
        raise ValueError(
            f"--panel-posterior sampled: only with --inference exact (exact path draws) or "
            f"--inference sampling --sampler gibbs (Gibbs path updates); with {what} use "
            "--panel-posterior moment."
        )
    small = math.prod(cards) <= SAMPLED_DEFAULT_STATES
    method = args.panel_posterior or (
        "sampled" if (args.inference == "exact" and small) or gibbs else "moment"
    )
    if method == "moment":
        for flag, value in (("--sweeps", args.sweeps), ("--chains", args.chains)):
            if value is not None:
                raise ValueError(f"{flag}: only with --panel-posterior sampled.")
    if method == "sampled" and args.empirical_bayes:
        raise ValueError(
            "--empirical-bayes: not with --panel-posterior sampled (the hyper-parameters are "
            "fitted to one posterior's statistics); add --panel-posterior moment."
        )
    return method


def _as_module(knowledge: dict, edge_prior):
    """The flags' prior knowledge (`_prior_knowledge`, `--edge-prior`) as a `PriorKnowledge`."""
    from .._learning.knowledge import PriorKnowledge

    return PriorKnowledge(
        required_edges=knowledge["required_edges"],
        forbidden_edges=knowledge["forbidden_edges"],
        tiers=knowledge["tiers"],
        edge_prior=edge_prior,
    )


def _sampled_structure(args, method, observations, names, cards, knowledge, edge_prior):
    """The JSON's `"panel_posterior"` and, for `sampled`, the sampled structure posterior
    (else `None`: the structural-EM posterior is reported)."""
    if method == "moment":
        if args.panel_posterior is None:
            print(
                "note: the graph posterior is structural EM's (overconfident where the visits "
                "are sparse); --panel-posterior sampled gives the exact-in-the-limit one "
                + (
                    "(with --inference exact, or --inference sampling --sampler gibbs)"
                    if args.inference != "exact"
                    else f"(not the default beyond {SAMPLED_DEFAULT_STATES} joint states; "
                    "--inference sampling makes it the default at any size)"
                )
            )
        return {
            "method": "structural-em",
            "description": "expected statistics under the structural-EM model scored as if "
            "observed: overconfident where the visits are sparse",
        }, None
    from .._learning.structure_posterior import StructurePosterior

    prior = StructurePosterior.from_prior(
        names, cards, max_parents=knowledge["max_parents"], prior=_prior(args, len(names)),
        knowledge=_as_module(knowledge, edge_prior),
    )  # fmt: skip
    path_sampler = None
    if args.inference == "sampling":
        from .._panel.gibbs import GibbsSampler

        path_sampler = GibbsSampler(
            max_events=args.max_events,
            max_virtual=args.max_virtual,
            max_node_events=args.max_node_events,
        )
    return sampled_structure_posterior(
        prior,
        observations,
        sweeps=args.sweeps or 1000,
        chains=args.chains or 4,
        burn_in=100 if args.burn_in is None else args.burn_in,
        seed=args.seed,
        setting="--sweeps (and --burn-in)",
        path_sampler=path_sampler,
    )


def sampled_structure_posterior(
    prior, observations, *, sweeps, chains, burn_in, seed, setting, path_sampler=None
):
    """The sampled structure posterior of panel `observations` from the structure `prior`
    (`SampledStructure`, key `seed`) and its JSON `"panel_posterior"` entry with the chains'
    diagnostics; a warning on stdout naming `setting` when they fail. Shared by `learn` and
    `design`."""
    import warnings

    import jax

    from .._learning.structure_mixture import MAX_ENUMERATED_GRAPHS, StructureMixturePosterior
    from .._panel.structure_posterior import SampledStructure, panel_structure_posterior

    family = SampledStructure(
        num_sweeps=sweeps, num_chains=chains, burn_in=burn_in, path_sampler=path_sampler
    )
    with warnings.catch_warnings():  # reported in the JSON and on stdout instead
        warnings.simplefilter("ignore", RuntimeWarning)
        mixture = panel_structure_posterior(
            prior, observations, family=family, key=jax.random.key(seed)
        )
    assert isinstance(mixture, StructureMixturePosterior)
    d = mixture.diagnostics
    assert d is not None
    r_hat, ess = float(d.max_split_r_hat()), float(d.min_effective_sample_size())
    converged = r_hat <= family.max_r_hat and ess >= family.min_ess
    if not converged:
        print(
            f"warning: the structure sampler's chains may not have converged (largest split "
            f"R-hat {r_hat:.3f}, smallest ESS {ess:.0f}); raise {setting}."
        )
    entropy = (
        "entropy: over whole graphs, by enumeration"
        if mixture.num_graphs() <= MAX_ENUMERATED_GRAPHS
        else f"entropy: the sum of the nodes' marginal entropies (an upper bound; more than "
        f"{MAX_ENUMERATED_GRAPHS} graphs)"
    )
    return {
        "method": "sampled-structure",
        "description": "Gibbs sampling of graph, rates and hidden paths ("
        + (
            "exact path draws"
            if path_sampler is None
            else "node-by-node Gibbs updates of the paths on each node's Markov blanket"
        )
        + f"), Rao-Blackwellised into a mixture of exact complete-data structure posteriors; "
        f"{entropy}",
        "paths": "exact" if path_sampler is None else "gibbs",
        "seed": seed,
        "diagnostics": {
            "max_split_r_hat": r_hat,
            "min_ess": ess,
            "chains": family.num_chains,
            "sweeps": family.num_sweeps,
            "burn_in": family.burn_in,
            "converged": converged,
        },
    }, mixture


def _cmd_learn(args):
    import jax
    import numpy as np

    from .._learning.search import Exhaustive
    from .._learning.structure_posterior import learn_structure
    from .._paths.csv import trajectories_from_dataframe
    from .inputs import read_data

    panel = args.observation == "panel"
    if not panel and args.exact_entry:
        raise ValueError("--exact-entry: only for panel data (--observation panel).")
    if not panel and args.inference != "exact":
        raise ValueError(
            f"--inference {args.inference}: only for panel data (--observation panel); complete "
            "paths need no inference."
        )
    if args.steps_per_gap is not None and args.inference != "mean-field":
        raise ValueError("--steps-per-gap: only with --inference mean-field.")
    steps_per_gap = 8 if args.steps_per_gap is None else args.steps_per_gap
    if args.sampler is not None and args.inference != "sampling":
        raise ValueError("--sampler: only with --inference sampling.")
    importance = args.sampler == "importance"
    if args.max_candidates is not None and not importance:
        raise ValueError("--max-candidates: only with --inference sampling --sampler importance.")
    if args.inference != "exact" and args.exact_entry:
        raise ValueError(f"--exact-entry: not supported with --inference {args.inference}.")
    df, data_format, known = read_data(args.data, args.format, panel=panel)
    nodes = _parse_cardinalities(args.cardinalities, df, missing=panel, known=known)
    names, cards = list(nodes), tuple(nodes.values())
    N = len(names)
    method = _panel_posterior_method(args, panel, cards)
    knowledge = _prior_knowledge(args, names)
    max_parents = knowledge["max_parents"]
    edge_prior = _edge_prior(args.edge_prior, names)
    extra: dict[str, Any] = {}
    mixture = None
    if panel and args.search in ("hill-climbing", "ctpc"):
        raise ValueError(f"--search {args.search}: only for complete paths (--observation paths).")
    search, search_name = _search(args, knowledge, N) if not panel else (Exhaustive(), "exhaustive")
    if panel:
        from .._panel.csv import panel_from_dataframe
        from .._panel.structure import learn_structure_from_panels

        entry = _assignment(args.exact_entry, names, cards, "--exact-entry")
        observations, ids = panel_from_dataframe(df, nodes, exact_entry=entry, bucketed=True)
        num_trajectories = len(ids)
        sampling: dict[str, Any] = {}
        if args.inference == "sampling":
            from .._panel.gibbs import GibbsSampler
            from .._panel.importance import PanelImportanceSampler

            sampler = (
                PanelImportanceSampler(
                    num_samples=args.samples,
                    max_events=args.max_events,
                    max_node_events=args.max_node_events,
                    max_candidates=8 if args.max_candidates is None else args.max_candidates,
                )
                if importance
                else GibbsSampler(
                    num_samples=args.samples,
                    burn_in=50 if args.burn_in is None else args.burn_in,
                    max_events=args.max_events,
                    max_virtual=args.max_virtual,
                    max_node_events=args.max_node_events,
                )
            )
            sampling = {"e_step": sampler, "key": jax.random.key(args.seed)}
            sampling["patience"] = args.patience
        elif args.inference == "mean-field":
            from .._panel.mean_field import PanelMeanField

            sampling = {"e_step": PanelMeanField(steps_per_gap=steps_per_gap)}
        fit = learn_structure_from_panels(
            observations,
            names,
            cards,
            max_parents=max_parents,
            prior=_prior(args, N),
            knowledge=_as_module(knowledge, edge_prior),
            tolerance=args.tolerance,
            max_iterations=args.max_iterations,
            **sampling,
        )
        post = fit.posterior
        extra = {
            "inference": args.inference,
            "log_likelihood": None if fit.log_likelihood is None else float(fit.log_likelihood),
            "em": {"iterations": fit.iterations, "converged": fit.converged},
        }
        if fit.evidence_lower_bound is not None:
            extra["mean_field"] = {
                "steps_per_gap": steps_per_gap,
                "evidence_lower_bound": float(fit.evidence_lower_bound),
            }
        if fit.effective_sample_size is not None:
            buffers = ("max_events", "max_node_events")
            buffers += ("max_candidates",) if importance else ("max_virtual",)
            extra["sampling"] = {
                "sampler": "importance" if importance else "gibbs",
                "samples": args.samples,
                "burn_in": None if importance else (50 if args.burn_in is None else args.burn_in),
                "seed": args.seed,
                "patience": args.patience,
                "min_effective_sample_size": dict(
                    zip(names, (float(v) for v in np.asarray(fit.effective_sample_size)))
                ),
                "median_effective_sample_size": dict(
                    zip(names, (float(v) for v in np.asarray(fit.median_effective_sample_size)))
                ),
                # null: the largest split-R-hat is infinite (a chain's halves were constant
                # and differed), or fewer than 4 samples
                "max_split_r_hat": dict.fromkeys(names)
                if fit.split_r_hat is None
                else {
                    name: float(v) if np.isfinite(v) else None
                    for name, v in zip(names, np.asarray(fit.split_r_hat))
                },
                "infeasible_updates": fit.infeasible_updates,
                "buffers": {name: getattr(fit.sampler, name) for name in buffers},
                # importance: the last E-step's estimate of the log-likelihood
                "log_likelihood_estimate": None
                if fit.log_likelihood_estimate is None
                else float(fit.log_likelihood_estimate),
            }
        extra["panel_posterior"], mixture = _sampled_structure(
            args, method, observations, names, cards, knowledge, edge_prior
        )
    else:
        # long trajectories come back cut into pieces: ids has one entry per row
        traj, ids = trajectories_from_dataframe(df, nodes)
        num_trajectories = len(dict.fromkeys(ids))
        traj = traj.with_rounded_shapes()  # a new file of similar size finds the programs
        post = learn_structure(
            traj, names, cards, max_parents=max_parents, prior=_prior(args, N),
            knowledge=_as_module(knowledge, edge_prior), search=search,
        )  # fmt: skip
    eb = _empirical_bayes(args)
    if eb is not None:
        post = _jit(eb.fit)(post)
    post = jax.tree_util.tree_map(np.asarray, post)
    probs, edges, entropy, graph, map_model = _structure_summary(
        post if mixture is None else mixture
    )
    out = {
        "prior": {
            **_prior_json(args, post),
            "max_parents": max_parents
            if isinstance(max_parents, int)
            else dict(zip(names, max_parents)),
            "forbidden": [[names[a], names[b]] for a, b in knowledge["forbidden_edges"]],
            "required": [[names[a], names[b]] for a, b in knowledge["required_edges"]],
            "tiers": None if knowledge["tiers"] is None else dict(zip(names, knowledge["tiers"])),
            "edge_prior": _edge_prior_json(edge_prior, names, args.edge_prior),
        },
        "search": search_name,
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
    out["input_format"] = {"data": data_format}
    write_json(args.out, out)
    structure_prior = out["prior"]["edge_prior"]
    print(
        f"learned from {num_trajectories} {'panel ' if panel else ''}trajectories; structure "
        "prior: "
        + (
            "uniform over the candidate parent sets"
            if structure_prior is None
            else f"edge probability {structure_prior['given']} = {structure_prior['default']:.3g}"
            + (
                f" (and {len(structure_prior['edges'])} edges of their own)"
                if structure_prior["edges"]
                else ""
            )
        )
        + "; MAP graph: "
        + ", ".join(f"{k} <- {v}" for k, v in out["map_graph"].items())
        + f"; wrote {args.out}"
    )
