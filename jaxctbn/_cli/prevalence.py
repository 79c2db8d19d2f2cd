"""`jaxctbn prevalence`: observed against expected prevalence of each node's states over time,
for a fit of panel data (R msm's `prevalence.msm` and its plot)."""

from __future__ import annotations

import os
import sys


def _effects_from_fit(fit: dict, model, covariates) -> tuple:
    """Per node `(C, configs, k, k)`: the log hazard ratios listed in the fit JSON."""
    import numpy as np

    from .rate_tables import parent_states as _parent_states

    effects = [np.zeros((covariates.num_covariates,) + np.shape(q)) for q in model.cims]
    for e in fit["covariate_effects"]:
        n = model.names.index(e["node"])
        u = _parent_states(model, n).index({k: int(v) for k, v in e["parent_states"].items()})
        c = covariates.names.index(e["covariate"])
        effects[n][c, u, e["from"], e["to"]] = e["log_hazard_ratio"]
    return tuple(effects)


def _cmd_prevalence(args) -> None:
    import json

    import numpy as np
    import pandas as pd

    from .._model.ctbn import CTBN
    from .._panel.csv import panel_from_dataframe
    from .._panel.observations import PanelObservations
    from .._panel.prevalence import prevalence
    from .._paths.csv import read_csv
    from .covariates import covariates_of as _covariates_of
    from .covariates import nodes_only as _nodes_only
    from .covariates import with_periods as _with_periods

    if args.observation != "panel":
        raise ValueError("--observation: prevalence compares panel data (--observation panel).")
    try:
        with open(args.fit) as f:
            fit = json.load(f)
        model = CTBN.from_dict(fit["network"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"--fit: {args.fit} is not the JSON of `jaxctbn fit` ({e}).") from None
    df = read_csv(args.data)
    covariates = effects = None
    columns = []
    if "covariates" in fit:
        columns = list(fit["covariates"]["columns"])
        missing = [c for c in columns if c not in df.columns]
        if missing:
            raise ValueError(f"--data: the fit's covariate column {missing[0]!r} is missing.")
    nodes_df, note = _nodes_only(
        df, model, columns, "the fit's network", "--covariates when fitting"
    )
    observations, ids = panel_from_dataframe(nodes_df, model, bucketed=False)
    assert isinstance(observations, PanelObservations)  # (bucketed=False)
    if columns:
        acts = {
            (e["node"], e["from"], e["to"])
            for e in fit["covariate_effects"]
            if not e["covariate"].startswith("period[")
        }
        rates = ",".join(f"{n}:{x}-{y}" for n, x, y in sorted(acts))
        covariates, _ = _covariates_of(model, df, ids, ",".join(columns), rates, observations)
    cuts = fit.get("covariates", {}).get("pci")
    if cuts:
        periods, covariates, _ = _with_periods(observations, covariates, None, cuts)
        assert isinstance(periods, PanelObservations)  # (flat in, flat out)
        observations = periods
    if covariates is not None:
        effects = _effects_from_fit(fit, model, covariates)
    if note is not None:
        print(note, file=sys.stderr)
    times = np.asarray(args.times, float)
    result = prevalence(model, observations, times, covariates=covariates, effects=effects)
    at_risk = np.asarray(result.at_risk)
    observed = np.asarray(result.observed)
    expected = np.asarray(result.expected)
    rows = []
    for g, t in enumerate(times):
        for n, name in enumerate(model.names):
            for x in range(model.cardinalities[n]):
                risk = int(at_risk[g, n])
                rows.append(
                    {
                        "time": float(t),
                        "node": name,
                        "state": x,
                        "at_risk": risk,
                        "observed": int(observed[g, n, x]),
                        "observed_percent": 100 * observed[g, n, x] / risk if risk else np.nan,
                        "expected": float(expected[g, n, x]),
                        "expected_percent": 100 * expected[g, n, x] / risk if risk else np.nan,
                    }
                )
    os.makedirs(args.out, exist_ok=True)
    table = pd.DataFrame(rows)
    table.to_csv(os.path.join(args.out, "prevalence.csv"), index=False)
    _plot(table, model, os.path.join(args.out, "prevalence.png"))
    worst = (table.observed_percent - table.expected_percent).abs().max()
    print(
        f"prevalence of {len(model.names)} nodes at {len(times)} times; largest gap between "
        f"observed and expected {worst:.1f} percentage points; wrote {args.out}"
    )


def _plot(table, model, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    N = len(model.names)
    fig, axes = plt.subplots(1, N, figsize=(4.0 * N, 3.2), squeeze=False)
    for ax, name, k in zip(axes[0], model.names, model.cardinalities):
        node = table[table.node == name]
        for x in range(k):
            part = node[node.state == x]
            line = ax.plot(part.time, part.observed_percent, "o-", label=f"{x} observed")[0]
            ax.plot(
                part.time,
                part.expected_percent,
                "--",
                color=line.get_color(),
                label=f"{x} expected",
            )
        ax.set_title(name)
        ax.set_xlabel("time")
        ax.set_ylabel("% of those at risk")
        ax.set_ylim(0, 100)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
