"""The covariate flags of `fit` and `prevalence` (`--covariates`, `--covariate-rates`,
`--covariate-shared`, `--pci`): the columns checked against the data, the `Covariates` and the
JSON's summary of them."""

from __future__ import annotations


def covariate_columns(text: str, df, model) -> list[str]:
    """The column names of `--covariates COL,COL,...`, checked against the data."""
    names = [c.strip() for c in str(text).split(",") if c.strip()]
    if not names:
        raise ValueError("--covariates: give data columns COL,COL,...")
    reserved = {"trajectory_id", "time", "intervention", *model.names}
    for name in names:
        if name in reserved:
            raise ValueError(f"--covariates: {name!r} is a node or a reserved column.")
        if name not in df.columns:
            raise ValueError(f"--covariates: no column {name!r} in the data.")
    if len(set(names)) != len(names):
        raise ValueError(f"--covariates: a column is named twice in {text!r}.")
    return names


def nodes_only(df, model, covariates, network_flag: str, covariates_hint: str):
    """`df` without its covariate columns and without the columns that are neither nodes nor
    covariates nor reserved (ignored): what the panel reader takes; and the note naming the
    ignored columns (None if none), for stderr once the request has passed its checks (so that
    an error stays one line)."""
    from .._paths.csv import RESERVED_COLUMNS

    extra = [
        c
        for c in df.columns
        if c not in RESERVED_COLUMNS and c not in model.names and c not in covariates
    ]
    note = None
    if extra:
        note = (
            f"note: data: column(s) {extra} are neither nodes of {network_flag} "
            f"{list(model.names)} nor covariates: ignored (name covariates with "
            f"{covariates_hint})."
        )
    return df.drop(columns=list(covariates) + extra), note


def covariates_of(
    model, df, ids, columns: str, rates: str | None, observations, shared: str | None = None
):
    """`--covariates` / `--covariate-rates`: the `Covariates` of
    [`Covariates.from_dataframe`][jaxctbn.panel.Covariates.from_dataframe] acting on the listed rates, and a summary for
    the JSON (names, columns, reference levels, the time-varying columns)."""
    import numpy as np

    from .._panel.covariates import Covariates

    names = covariate_columns(columns, df, model)
    try:
        covariates, summary = Covariates.from_dataframe(df, names, observations, ids)
    except ValueError as e:
        raise ValueError("--covariates: " + str(e).removeprefix("columns: ")) from None
    labels = covariates.names
    acts_on = None
    if rates is not None:
        acts_on = [np.zeros((len(labels),) + tuple(np.shape(q)), bool) for q in model.cims]
        seen = set()
        for item in str(rates).split(","):
            n, x, y = _transition(model, item, "--covariate-rates")
            if (n, x, y) in seen:
                raise ValueError(
                    f"--covariate-rates: {item.strip()!r} is given twice; give each rate once."
                )
            seen.add((n, x, y))
            acts_on[n][:, :, x, y] = True
    shared_labels = None
    if shared is not None:
        shared_labels = [np.full((len(labels),) + tuple(np.shape(q)), -1) for q in model.cims]
        for label, group in enumerate(str(shared).split(",")):
            for item in group.split("+"):
                n, x, y = _transition(model, item, "--covariate-shared")
                if np.any(shared_labels[n][:, :, x, y] >= 0):
                    raise ValueError(f"--covariate-shared: {item.strip()!r} is in two groups.")
                shared_labels[n][:, :, x, y] = label
    if acts_on is not None or shared_labels is not None:
        covariates = Covariates(
            covariates.values,
            names=labels,
            acts_on=acts_on,
            shared=shared_labels,
            per_observation=covariates.per_observation,
        )
    if shared is not None:
        summary["shared"] = [g.strip() for g in str(shared).split(",")]
    return covariates, summary


def _transition(model, item: str, flag: str) -> tuple[int, int, int]:
    """`NODE:FROM-TO` of a command-line flag: the node's index and the free rate's states."""
    import numpy as np

    item = item.strip()
    try:
        node, transition = item.split(":")
        x, y = (int(v) for v in transition.split("-"))
    except ValueError:
        raise ValueError(f"{flag}: expected NODE:FROM-TO,..., got {item!r}.") from None
    if node not in model.names:
        raise ValueError(f"{flag}: unknown node {node!r}; the nodes are {list(model.names)}.")
    n = model.names.index(node)
    q = np.asarray(model.cims[n])
    k = q.shape[-1]
    if not (0 <= x < k and 0 <= y < k) or x == y or not np.any(q[:, x, y] > 0):
        raise ValueError(
            f"{flag}: {item!r} is not a free rate of {node!r} (states 0..{k - 1}, not a "
            "structural zero)."
        )
    return n, x, y


def with_periods(observations, covariates, summary: dict | None, cuts):
    """`--pci`: the observations with censored rows at the cut times, the covariates with the
    period dummies, and the JSON's covariate summary with them (and `pci`)."""
    from .._panel.periods import with_time_periods

    try:
        observations, covariates = with_time_periods(observations, cuts, covariates=covariates)
    except ValueError as e:
        raise ValueError("--pci: " + str(e).removeprefix("cut_times: ")) from None
    if summary is None:
        summary = {"names": [], "columns": [], "reference_levels": {}, "time_varying": []}
    summary = dict(summary, names=list(covariates.names), pci=[float(c) for c in cuts])
    return observations, covariates, summary
