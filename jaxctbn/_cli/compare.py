"""`jaxctbn compare`: a likelihood-ratio test and AIC between two nested fits of the same data."""

from __future__ import annotations

from .._files import write_json


def _read_fit(path: str, flag: str) -> dict:
    import json

    try:
        with open(path) as f:
            fit = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag}: {path} is not JSON ({e.msg}).") from None
    keys = ("minus2loglik", "num_parameters", "aic", "network", "observation", "data")
    missing = [k for k in keys if not isinstance(fit, dict) or k not in fit]
    if missing:
        raise ValueError(
            f"{flag}: {path} is not the JSON of `jaxctbn fit` (missing {', '.join(missing)})."
        )
    return fit


def _nodes(fit: dict, flag: str) -> list[tuple[str, int, frozenset]]:
    """Per node of the fit's network: name, number of states, parent names."""
    try:
        return [
            (str(n["name"]), int(n["cardinality"]), frozenset(n["parents"]))
            for n in fit["network"]["nodes"]
        ]
    except (KeyError, TypeError) as e:
        raise ValueError(f"{flag}: its network has no valid nodes list ({e}).") from None


def _number(fit: dict, key: str, flag: str) -> float:
    """`fit[key]` as a finite number, else one line naming the file's key."""
    import math

    value = fit[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{flag}: {key} must be a finite number, got {value!r}.")
    return float(value)


def _effects(fit: dict) -> set[tuple[str, str, int, int]]:
    """The covariate effects a fit estimates: `(covariate, node, from, to)` (over the parent
    configurations of the node)."""
    return {
        (str(e["covariate"]), str(e["node"]), int(e["from"]), int(e["to"]))
        for e in fit.get("covariate_effects", [])
    }


def _shared_groups(fit: dict) -> list[set[tuple[str, int, int]]]:
    """The groups of rates whose effects one parameter holds (`--covariate-shared`)."""
    groups = []
    for group in fit.get("covariates", {}).get("shared", []) or []:
        members = set()
        for item in str(group).split("+"):
            node, transition = item.strip().split(":")
            x, y = (int(v) for v in transition.split("-"))
            members.add((node, x, y))
        groups.append(members)
    return groups


def _check_nested_effects(small: dict, big: dict, i: int, j: int) -> None:
    """The smaller fit's covariate effects are a special case of the larger's: every effect it
    estimates the larger estimates too (on the same rate), and every group of rates that share
    one effect in the larger shares one in the smaller too, whole (or has none of that
    covariate's effects there: all zero)."""
    try:
        effects = [_effects(small), _effects(big)]
        groups = [_shared_groups(small), _shared_groups(big)]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"FIT1, FIT2: unreadable covariate effects ({e}).") from None
    missing = sorted(effects[0] - effects[1])
    if missing:
        c, n, x, y = missing[0]
        raise ValueError(
            f"FIT1, FIT2: not nested: FIT{i} (fewer parameters) has the effect of {c} on "
            f"{n} {x}->{y}, which FIT{j} does not estimate."
        )
    for group in groups[1]:
        covariates = {c for c, *_ in effects[0]}
        for c in covariates:
            acted = {(n, x, y) for cc, n, x, y in effects[0] if cc == c and (n, x, y) in group}
            if acted and not (acted == group and any(group <= g for g in groups[0])):
                raise ValueError(
                    f"FIT1, FIT2: not nested: FIT{j} shares one effect of {c} over "
                    f"{sorted(group)}, which FIT{i} estimates separately."
                )


def _cmd_compare(args) -> None:
    from .._panel.comparison import lr_test

    fits = [_read_fit(args.fit1, "FIT1"), _read_fit(args.fit2, "FIT2")]
    data = [f["data"] if isinstance(f["data"], dict) else {} for f in fits]
    # the observations the fits used (fits written before that digest: the files' bytes)
    key = "observations_sha256" if all("observations_sha256" in d for d in data) else "sha256"
    if data[0].get(key) is None or data[0].get(key) != data[1].get(key):
        what = "observations" if key == "observations_sha256" else "data files"
        raise ValueError(
            f"FIT1, FIT2: fitted to different data (the SHA-256 of their {what} differ); a "
            "likelihood-ratio test and AIC compare fits of the same observations."
        )
    if fits[0]["observation"] != fits[1]["observation"]:
        raise ValueError(
            f"FIT1, FIT2: one fit reads the data as {fits[0]['observation']}, the other as "
            f"{fits[1]['observation']}."
        )
    for fit, flag in zip(fits, ("FIT1", "FIT2")):
        if fit.get("prior", {}).get("convention", "none") != "none":
            raise ValueError(
                f"{flag}: a MAP fit (--prior gamma); the likelihood-ratio test and AIC need "
                "maximum-likelihood fits (--prior none)."
            )
    nodes = [_nodes(f, flag) for f, flag in zip(fits, ("FIT1", "FIT2"))]
    if [(n, k) for n, k, _ in nodes[0]] != [(n, k) for n, k, _ in nodes[1]]:
        raise ValueError("FIT1, FIT2: the networks have different nodes or state counts.")
    m2ll = [_number(f, "minus2loglik", flag) for f, flag in zip(fits, ("FIT1", "FIT2"))]
    counts = [_number(f, "num_parameters", flag) for f, flag in zip(fits, ("FIT1", "FIT2"))]
    if any(c != int(c) or c < 0 for c in counts):
        raise ValueError(f"FIT1, FIT2: num_parameters must be integers >= 0, got {counts}.")
    p = [int(c) for c in counts]
    if p[0] == p[1]:
        raise ValueError(
            f"FIT1, FIT2: both have {p[0]} parameters, so neither is nested in the other; "
            "compare their aic instead."
        )
    small, big = (0, 1) if p[0] < p[1] else (1, 0)
    nested = all(a[2] <= b[2] for a, b in zip(nodes[small], nodes[big]))
    if not nested:
        raise ValueError(
            f"FIT1, FIT2: not nested: some parent of a node in FIT{small + 1} (fewer "
            f"parameters) is not its parent in FIT{big + 1}."
        )
    covariates = [set(f.get("covariates", {}).get("names", [])) for f in fits]
    if not covariates[small] <= covariates[big]:
        raise ValueError(
            f"FIT1, FIT2: not nested: FIT{small + 1} (fewer parameters) has covariates that "
            f"FIT{big + 1} lacks ({sorted(covariates[small] - covariates[big])})."
        )
    _check_nested_effects(fits[small], fits[big], small + 1, big + 1)
    statistic = m2ll[small] - m2ll[big]
    df = p[big] - p[small]
    tolerance = 1e-6 * (1 + abs(m2ll[big]))
    if statistic < -tolerance:
        print(
            f"warning: the larger model (FIT{big + 1}) fits worse than the smaller by "
            f"{-statistic:.4g} in -2LL: its fit stopped short of the optimum (refit it)"
        )
    p_value = float(lr_test((m2ll[small], m2ll[big]), (p[small], p[big])).p_value)
    aic = [float(f["aic"]) for f in fits]
    out = {
        "lr_statistic": statistic,
        "df": df,
        "p_value": p_value,
        "aic": aic,
        "minus2loglik": m2ll,
        "num_parameters": p,
        "nested": f"FIT{small + 1} in FIT{big + 1}",
        "preferred_by_aic": f"FIT{1 + int(aic[1] < aic[0])}",
        "fits": [args.fit1, args.fit2],
    }
    if not all(f.get("converged", True) for f in fits):
        print("warning: a fit did not converge; the test is only as good as the fits")
    write_json(args.out, out)
    print(
        f"likelihood ratio {statistic:.4f} on {df} df, p = {p_value:.4g}; AIC {aic[0]:.2f} "
        f"(FIT1) vs {aic[1]:.2f} (FIT2); wrote {args.out}"
    )
