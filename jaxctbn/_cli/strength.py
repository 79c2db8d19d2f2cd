"""`fit --learn-strength NODE`: the strength of an intervention from the trajectories marked
`NODE*`, on complete paths (conjugate, on a grid) or panel data (profile likelihood)."""

from __future__ import annotations


def _strength_groups(model, df, node: str):
    """`--learn-strength NODE`: the node's index, the data with the `NODE*` tokens
    (trajectories recorded under the unknown strength) removed from the `intervention` column,
    and the ids of those trajectories."""
    import numpy as np

    if node not in model.names:
        raise ValueError(
            f"--learn-strength: unknown node {node!r}; the nodes are {list(model.names)}."
        )
    if "intervention" not in df.columns:
        raise ValueError(
            f"--learn-strength: the data need an intervention column marking the trajectories "
            f"recorded under the strength ({node}*)."
        )
    token = f"{node}*"
    labels = df["intervention"].to_numpy(dtype=object)
    marked, cleaned = set(), []
    for tid, label in zip(df["trajectory_id"].to_numpy(), labels):
        if label is None or (isinstance(label, float) and np.isnan(label)):
            cleaned.append(label)
            continue
        parts = [t.strip() for t in str(label).split(";") if t.strip()]
        if token in parts:
            marked.add(tid)
            parts = [t for t in parts if t != token]
        cleaned.append(";".join(parts) if parts else np.nan)
    if not marked:
        raise ValueError(
            f"--learn-strength: no trajectory is marked {token!r} in the intervention column."
        )
    out = df.copy()
    out["intervention"] = cleaned
    return model.names.index(node), out, marked


def learn_path_strength(model, df, alpha, beta, node_name):
    """The posterior of the strength of `--learn-strength NODE` and the data without the marks:
    `(summary dict, cleaned data, (node, marked ids, estimate))`."""
    import jax.numpy as jnp
    import numpy as np

    from .._learning.strength import learn_strength
    from .._paths.csv import trajectories_from_dataframe
    from .._paths.sufficient_statistics import SufficientStatistics

    node, clean, marked = _strength_groups(model, df, node_name)
    traj, ids = trajectories_from_dataframe(clean, model)
    stats = SufficientStatistics.from_trajectories(traj, model.cardinalities, model.parents)
    order = list(dict.fromkeys(ids))
    scaled = jnp.asarray([tid in marked for tid in order])
    free = ~traj.intervention_targets[:, node]
    plain = stats.nodes[node].sum(free & ~scaled)
    under = stats.nodes[node].sum(free & scaled)
    a = 1.0 if alpha is None else float(np.broadcast_to(alpha, (model.num_nodes,))[node])
    b = 0.0 if beta is None else float(np.broadcast_to(beta, (model.num_nodes,))[node])
    posterior = learn_strength(
        plain.transitions,
        plain.dwell_times,
        under.transitions,
        under.dwell_times,
        alpha=a,
        beta=b,
        free=jnp.asarray(model.cims[node]) > 0,
    )
    lo, hi = (float(v) for v in posterior.interval(0.95))
    estimate = float(posterior.median())
    summary = {
        "node": node_name,
        "estimate": estimate,
        "mode": float(posterior.mode()),
        "interval": [lo, hi],
        "level": 0.95,
        "prior": "log-uniform on [0.001, 1000]; rates integrated out under the Gamma prior",
        "method": "posterior on a grid in log s (rates integrated out); equal-tailed interval",
        "trajectories_scaled": int(np.asarray(scaled).sum()),
        "trajectories_unscaled": int((~np.asarray(scaled)).sum()),
    }
    return summary, clean, (node, marked, estimate)


def learn_panel_strength(model, df, entry, prior, method, node_name):
    """`--learn-strength NODE` on panel data: the strength by profile likelihood
    (`learn_strength_from_panels`), and the observations with the scaled trajectories at the
    estimate (for the rate fit): `(summary dict, observations, trajectory ids)`."""
    import jax.numpy as jnp
    import numpy as np

    from .._panel.csv import panel_from_dataframe
    from .._panel.observations import PanelObservations
    from .._panel.strength import HIGH, LOW, learn_strength_from_panels, scaled_observations

    node, clean, marked = _strength_groups(model, df, node_name)
    observations, ids = panel_from_dataframe(clean, model, exact_entry=entry, bucketed=False)
    assert isinstance(observations, PanelObservations)  # one padded batch (bucketed=False)
    scaled = np.asarray([tid in marked for tid in ids])
    profile = learn_strength_from_panels(
        model, observations, node=node, scaled=scaled, prior=prior, method=method
    )
    estimate = float(profile.estimate)
    summary = {
        "node": node_name,
        "estimate": estimate,
        "mode": estimate,
        "interval": [float(v) for v in profile.interval],
        "level": profile.level,
        "interval_open": [bool(profile.open_below), bool(profile.open_above)],
        "method": "profile likelihood: the rates fitted at every strength of a grid in log s "
        "(penalised by the Gamma prior with --prior gamma); Wilks interval",
        "range": [LOW, HIGH],
        "converged": bool(np.all(np.asarray(profile.converged))),
        "trajectories_scaled": int(scaled.sum()),
        "trajectories_unscaled": int((~scaled).sum()),
    }
    at_estimate = scaled_observations(observations, node, jnp.asarray(scaled), profile.estimate)
    return summary, at_estimate, ids
