"""`jaxctbn design`'s ranking file: every candidate's score (and cost, strengths, visit times),
the best, and a batch's members, as JSON."""

from __future__ import annotations

from .._files import write_json
from .arguments import _costs_json, _prior_json


def best_index(args, scores, costs):
    """The best candidate by `--rank-by` among those `--budget` affords."""
    import numpy as np

    if costs is None:
        return int(np.argmax(scores))
    rank = scores / costs if args.rank_by == "score-per-cost" else scores.copy()
    if args.budget is not None:
        rank = np.where(costs <= args.budget * (1 + 1e-12), rank, -np.inf)
    return int(np.argmax(rank))


def write_ranking(
    args,
    scores,
    space,
    names,
    init,
    duration,
    panel=None,
    costs=None,
    batch=None,
    rows=None,
    rate_scales=None,
):
    """The ranking JSON. `rows[e]`: the candidate of entry `e` (default: entry e is candidate
    e); `rate_scales[e]`: its strengths `{node: s}` (`None`: a perfect intervention)."""
    import numpy as np

    targets, states = np.asarray(space.targets), np.asarray(space.states)
    rows = np.arange(len(scores)) if rows is None else rows

    def label(i):
        return {names[n]: int(states[i, n]) for n in range(len(names)) if targets[i, n]}

    entries = [{"intervention": label(rows[e]), "score": float(v)} for e, v in enumerate(scores)]
    if rate_scales is not None:
        for entry, scale in zip(entries, rate_scales):
            if scale is not None:
                entry["rate_scales"] = scale
    if costs is not None:
        for entry, c in zip(entries, costs):
            entry["cost"] = float(c)
            if args.rank_by == "score-per-cost":
                entry["score_per_cost"] = entry["score"] / float(c)
    best = best_index(args, np.asarray(scores), costs) if batch is None else int(batch.members[0])
    best_entry = entries[best]
    outcome: dict = {"type": args.outcome}
    if args.outcome == "panel":
        if args.visits is not None and panel is not None:
            for i, entry in enumerate(entries):
                entry["observation_times"] = [float(t) for t in panel.times[i]]
                entry["score_equally_spaced"] = float(panel.equally_spaced_scores[i])
            outcome.update(visits=args.visits, observation_times=best_entry["observation_times"])
        else:
            outcome["observation_times"] = [float(t) for t in args.observation_times]
    out = {
        "criterion": args.criterion,
        "target": args.target,
        "outcome": outcome,
        "scores": entries,
        "best": best_entry["intervention"],
        "samples": args.samples,
        "duration": duration,
        "initial_state": init,
        "seed": args.seed,
        "prior": getattr(args, "fitted_prior", None) or _prior_json(args),
    }
    if rate_scales is not None:
        out["rate_scales"] = best_entry.get("rate_scales", {})
        out["strengths"] = ",".join(args.strength)
    pricing = _costs_json(args)
    if pricing is not None or args.rank_by != "score":
        out["costs"] = pricing
        out["rank_by"] = args.rank_by
    if batch is not None:
        members = [int(m) for m in batch.members if m >= 0]
        out["batch"] = [
            {
                "intervention": label(rows[m]),
                "score": float(batch.scores[j]),
                "gain": float(batch.gains[j]),
                "cost": float(batch.costs[j]),
            }
            for j, m in enumerate(members)
        ]
        if rate_scales is not None:
            for entry, m in zip(out["batch"], members):
                if rate_scales[m] is not None:
                    entry["rate_scales"] = rate_scales[m]
        out["batch_score"] = float(batch.batch_score)
        out["batch_cost"] = float(batch.total_cost)
        out["batch_size"] = args.batch
    history = getattr(args, "history_posterior", None)
    if history is not None:
        out["history_posterior"] = history
    if args.target == "structure" and args.criterion != "eig":
        from .._experiments.config import default_graph_draws

        draws, max_sets = default_graph_draws(len(names), args.graph_draws, args.max_sets)
        out.update(graph_draws=draws, max_sets=max_sets)
    input_format = getattr(args, "input_format", None)
    if input_format:  # the formats of --data and --network, those given
        out["input_format"] = input_format
    write_json(args.out, out)
    chosen = out["best"] or "no intervention"
    what = f"best: {chosen}"
    if out.get("rate_scales"):
        what += " with rates scaled by " + ", ".join(
            f"{node}: {s:.4g}" for node, s in out["rate_scales"].items()
        )
    if batch is not None:
        what = (
            f"batch of {len(out['batch'])}: {[e['intervention'] or 'none' for e in out['batch']]}"
        )
    print(f"scored {len(scores)} interventions; {what}; wrote {args.out}")
