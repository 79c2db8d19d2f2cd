"""`jaxctbn fit`: the rates of a network's graph fitted to complete paths or panel data."""

from __future__ import annotations

import sys

from .._files import write_json
from .arguments import _assignment, _load_network


def _parent_states(model, n: int) -> list[dict]:
    """Node `n`'s parent configurations, in the CIMs' order, as the JSON's
    `{"parent": state, ...}` dicts (empty for a node without parents)."""
    from .._model.layout import parent_configurations

    names = [model.names[p] for p in model.parents[n]]
    return [
        dict(zip(names, map(int, config)))
        for config in parent_configurations(model.parents[n], model.cardinalities)
    ]


def _flagged_rates(model, flags) -> list[dict]:
    """The rates marked in per-node boolean arrays `(configs, k, k)`, by node, parent states
    and transition."""
    import numpy as np

    out = []
    for n, name in enumerate(model.names):
        configs = _parent_states(model, n)
        for u, x, y in zip(*np.nonzero(np.asarray(flags[n]))):
            out.append(
                {
                    "node": name,
                    "parent_states": configs[int(u)],
                    "from": int(x),
                    "to": int(y),
                }
            )
    return out


def _file_digest(path) -> str:
    """The SHA-256 of a file's bytes."""
    import hashlib

    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _observations_digest(df, names, exact_entry) -> str:
    """The SHA-256 of the observations a fit uses: the reserved columns and the nodes' columns
    (in that order, as parsed, written as CSV) and `--exact-entry`. `jaxctbn compare` refuses
    fits whose digests differ; fits of one file with and without covariate columns agree."""
    import hashlib

    from .._paths.csv import RESERVED_COLUMNS

    columns = [c for c in RESERVED_COLUMNS if c in df.columns] + list(names)
    text = df[columns].to_csv(index=False) + f"exact_entry={exact_entry or ''}"
    return hashlib.sha256(text.encode()).hexdigest()


def _rate_table(model, log_rate_se, level: float = 0.95) -> list[dict]:
    r"""One entry per free rate: the rate, its standard error (delta method,
    $\hat\lambda\,\mathrm{se}(\log\hat\lambda)$) and the interval
    $\hat\lambda e^{\mp z\,\mathrm{se}}$ at `level`; `se` and `ci95` are null for a rate
    that is not estimated (infinite standard error: at a bound, or no information)."""
    import itertools
    import math
    import statistics

    import numpy as np

    # (the standard library's quantile: importing scipy.stats costs a command ~0.9 s)
    z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
    out = []
    for n, name in enumerate(model.names):
        configs = _parent_states(model, n)
        cim = np.asarray(model.cims[n])
        se_log = np.asarray(log_rate_se[n])
        k = cim.shape[-1]
        for u, x, y in itertools.product(range(cim.shape[0]), range(k), range(k)):
            if x == y or se_log[u, x, y] == 0:
                continue  # the diagonal, a structural zero
            rate, s = float(cim[u, x, y]), float(se_log[u, x, y])
            finite = math.isfinite(s)
            out.append(
                {
                    "node": name,
                    "parent_states": configs[u],
                    "from": int(x),
                    "to": int(y),
                    "rate": rate,
                    "se": rate * s if finite else None,
                    "ci95": [rate * math.exp(-z * s), rate * math.exp(z * s)]
                    if finite
                    else [None, None],
                    "estimated": finite,
                }
            )
    return out


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


def _fit_paths(model, df, alpha, beta, strength=None):
    r"""Closed-form rates from complete paths: ML $M/T$, or the Gamma MAP
    $(\alpha-1+M)/(\beta+T)$ clipped at 0; structural zeros stay 0, a configuration never
    visited keeps its starting rate. `strength`: `(node, scaled trajectory ids, s)`: that
    node's dwell times in those trajectories count as the exposure $sT$."""
    import equinox as eqx
    import jax.numpy as jnp
    import numpy as np

    from .._learning.posterior import path_log_likelihood
    from .._model.ctbn import CTBN
    from .._paths.csv import trajectories_from_dataframe
    from .._paths.sufficient_statistics import SufficientStatistics

    traj, ids = trajectories_from_dataframe(df, model)
    stats = SufficientStatistics.from_trajectories(traj, model.cardinalities, model.parents)
    pooled = list(stats.pooled())
    if strength is not None:
        node, marked, scale = strength
        order = list(dict.fromkeys(ids))
        scaled = jnp.asarray([tid in marked for tid in order])
        free = ~traj.intervention_targets[:, node]
        plain = stats.nodes[node].sum(free & ~scaled)
        under = stats.nodes[node].sum(free & scaled)
        pooled[node] = eqx.tree_at(
            lambda st: (st.transitions, st.dwell_times),
            plain,
            (plain.transitions + under.transitions, plain.dwell_times + scale * under.dwell_times),
        )
    cims, se_log = [], []
    for n, (q, st) in enumerate(zip(model.cims, pooled)):
        q = np.asarray(q)
        M, T = np.asarray(st.transitions), np.asarray(st.dwell_times)[..., None]
        a = 1.0 if alpha is None else float(np.broadcast_to(alpha, (model.num_nodes,))[n])
        b = 0.0 if beta is None else float(np.broadcast_to(beta, (model.num_nodes,))[n])
        free = (q > 0) & ~np.eye(q.shape[-1], dtype=bool)
        zero = ~free & ~np.eye(q.shape[-1], dtype=bool) & (M > 0)
        if zero.any():
            u, x, y = (int(i) for i in np.argwhere(zero)[0])
            raise ValueError(
                f"data: node {model.names[n]!r} jumps {x} -> {y} (parent configuration {u}), "
                "a rate that is 0 (a structural zero) in --network."
            )
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.maximum(a - 1.0 + M, 0.0) / (b + T)
        rate = np.where(free, np.where(b + T > 0, rate, q), 0.0)
        rate[..., np.arange(q.shape[-1]), np.arange(q.shape[-1])] = 0.0
        rate -= np.eye(q.shape[-1]) * rate.sum(-1, keepdims=True)
        cims.append(jnp.asarray(rate))
        # the observed information of log(rate) at the optimum: (alpha - 1 + M) (the second
        # derivative of (alpha - 1 + M) theta - (beta + T) e^theta at its maximum)
        information = np.broadcast_to(a - 1.0 + M, q.shape)
        estimated = free & (information > 0) & (b + T > 0)
        with np.errstate(divide="ignore"):
            se = np.where(estimated, 1 / np.sqrt(np.where(estimated, information, 1)), np.inf)
        se_log.append(np.where(free, se, 0.0))
    fitted = CTBN(cims=cims, parents=model.parents, names=model.names)
    if strength is None:
        ll = float(path_log_likelihood(fitted, stats))
    else:  # the scaled node's likelihood at its exposure s T (M ln s added: rates s Lambda)
        from .._learning.conjugate import poisson_path_log_likelihood

        ll = 0.0
        for n, st in enumerate(pooled):
            ll += float(poisson_path_log_likelihood(fitted.cims[n], st.transitions, st.dwell_times))
        ll += float(np.sum(np.asarray(under.transitions)) * np.log(scale))
    return fitted, ll, len(dict.fromkeys(ids)), se_log


def _learn_strength(model, df, alpha, beta, node_name):
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


def _learn_panel_strength(model, df, entry, prior, method, node_name):
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


def _covariate_columns(text: str, df, model) -> list[str]:
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


def _nodes_only(df, model, covariates, network_flag: str, covariates_hint: str):
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


def _covariates_of(
    model, df, ids, columns: str, rates: str | None, observations, shared: str | None = None
):
    """`--covariates` / `--covariate-rates`: the `Covariates` of
    [`jaxctbn.panel.covariates_from_dataframe`][] acting on the listed rates, and a summary for
    the JSON (names, columns, reference levels, the time-varying columns)."""
    import numpy as np

    from .._panel.covariates import Covariates
    from .._panel.csv import covariates_from_dataframe

    names = _covariate_columns(columns, df, model)
    try:
        covariates, summary = covariates_from_dataframe(df, names, observations, ids)
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


def _with_periods(observations, covariates, summary: dict | None, cuts):
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


def _effect_table(model, covariates, uncertainty) -> list[dict]:
    """One entry per covariate and rate it acts on: the hazard ratio and its interval (at the
    level of `uncertainty`)."""
    import math

    import numpy as np

    out = []
    for n, name in enumerate(model.names):
        configs = _parent_states(model, n)
        free = (np.asarray(model.cims[n]) != 0) & ~np.eye(model.cardinalities[n], dtype=bool)
        beta = np.asarray(uncertainty.effects[n])
        se = np.asarray(uncertainty.effect_standard_errors[n])
        lo = np.asarray(uncertainty.hazard_ratio_lower[n])
        hi = np.asarray(uncertainty.hazard_ratio_upper[n])
        for c, label in enumerate(covariates.names):
            acts = np.asarray(covariates.acts_on[n][c]) if covariates.acts_on else free
            for u, x, y in zip(*np.nonzero(acts & free)):
                finite = math.isfinite(float(se[c, u, x, y]))
                out.append(
                    {
                        "covariate": label,
                        "node": name,
                        "parent_states": configs[int(u)],
                        "from": int(x),
                        "to": int(y),
                        "hazard_ratio": math.exp(float(beta[c, u, x, y])),
                        "log_hazard_ratio": float(beta[c, u, x, y]),
                        "se": float(se[c, u, x, y]) if finite else None,
                        "ci95": [float(lo[c, u, x, y]), float(hi[c, u, x, y])]
                        if finite
                        else [None, None],
                    }
                )
    return out


def _check_posterior_arguments(args, prior_name: str) -> None:
    """One-line errors for the posterior flags, before anything is computed or written."""
    flags = [("--draws", args.draws), ("--chains", args.chains), ("--seed", args.seed)]
    flags.append(("--draws-out", args.draws_out))
    if not args.posterior:
        for flag, value in flags:
            if value is not None:
                raise ValueError(f"{flag}: only with --posterior.")
        return
    if prior_name != "gamma":
        raise ValueError(
            "--posterior: needs a proper prior; give --prior gamma [--alpha A --beta B] (the "
            "default with --posterior), not --prior none."
        )
    for flag, value in (
        ("--covariates", args.covariates),
        ("--pci", args.pci),
        ("--learn-strength", args.learn_strength),
    ):
        if value is not None:
            raise ValueError(f"--posterior: not yet with {flag} (rates of a model without it).")
    if args.draws_out is not None:
        if args.observation != "panel":
            raise ValueError(
                "--draws-out: for panel data (with complete paths the posterior is one Gamma "
                "per rate, with nothing to diagnose)."
            )
        if not str(args.draws_out).endswith((".csv", ".nc")):
            raise ValueError(f"--draws-out: expected a .csv or .nc path, got {args.draws_out!r}.")
        if str(args.draws_out).endswith(".nc"):
            import importlib.util

            if importlib.util.find_spec("arviz") is None:
                raise ValueError(
                    "--draws-out: writing .nc needs arviz (pip install arviz); or give a .csv path."
                )


def _posterior_rates(model, mixture, diagnostics=None) -> list[dict]:
    """One entry per free rate of `mixture` (a GammaMixturePosterior): the keys of `"rates"`
    and the posterior mean, s.d. and central 95% interval (and, sampled, split R-hat and
    ESS)."""
    import jax.numpy as jnp
    import numpy as np

    means, sds = mixture.rate_means(), mixture.rate_sds()
    quantiles = mixture.rate_quantiles(jnp.array([0.025, 0.975]))
    out = []
    for n, name in enumerate(model.names):
        configs = _parent_states(model, n)
        free = np.asarray(mixture.free_rates()[n])
        for u, x, y in zip(*np.nonzero(free)):
            entry = {
                "node": name,
                "parent_states": configs[int(u)],
                "from": int(x),
                "to": int(y),
                "mean": float(means[n][u, x, y]),
                "sd": float(sds[n][u, x, y]),
                "ci95": [float(quantiles[n][0, u, x, y]), float(quantiles[n][1, u, x, y])],
            }
            if diagnostics is not None:
                entry["split_r_hat"] = float(diagnostics.split_r_hat[n][u, x, y])
                entry["ess"] = float(diagnostics.effective_sample_size[n][u, x, y])
            out.append(entry)
    return out


def _free_rates(model):
    """The network's free rates: its nonzero off-diagonal entries (zeros stay zero)."""
    import numpy as np

    return [(np.asarray(q) != 0) & ~np.eye(q.shape[-1], dtype=bool) for q in model.cims]


def sampled_rate_posterior(args, prior, observations, seed, *, free):
    """The sampled posterior of the rates after `observations` under the Gamma `prior`
    (`--draws`, `--chains`; structural zeros where `free` is false): the mixture and the
    JSON's summary (method, seed, chain diagnostics). Shared by `fit --posterior` and
    `design --observation panel`, which say on stdout when the chains did not converge."""
    import warnings

    import jax

    from .._learning.gamma_mixture import GammaMixturePosterior
    from .._panel.rate_posterior import SampledGammaMixture, panel_rate_posterior

    family = SampledGammaMixture(num_draws=args.draws or 1000, num_chains=args.chains or 4)
    start = GammaMixturePosterior.from_gamma(prior, free=free)
    with warnings.catch_warnings():  # reported in the JSON and on stdout instead
        warnings.simplefilter("ignore", RuntimeWarning)
        mixture = panel_rate_posterior(start, observations, family=family, key=jax.random.key(seed))
    d = mixture.diagnostics
    assert d is not None
    r_hat, ess = float(d.max_split_r_hat()), float(d.min_effective_sample_size())
    divergent = int(d.divergent_transitions)
    summary = {
        "method": "sampled-gamma-mixture",
        "description": "NUTS on the log-rates with the exact panel likelihood; each draw "
        "Rao-Blackwellised by an exact draw of the hidden paths into a mixture of Gammas",
        "seed": seed,
        "diagnostics": {
            "max_split_r_hat": r_hat,
            "min_ess": ess,
            "divergent_transitions": divergent,
            "chains": family.num_chains,
            "draws": family.num_draws,
            "burn_in": family.burn_in,
            "converged": r_hat <= family.max_r_hat and ess >= family.min_ess and divergent == 0,
        },
    }
    return mixture, summary


def _panel_posterior(args, model, observations, prior):
    """The sampled posterior of the rates under `prior` (structural zeros from the network):
    the JSON's `"posterior"` and the chains' rate draws."""
    from .._learning.posterior import RatePosterior

    seed = 0 if args.seed is None else args.seed
    mixture, summary = sampled_rate_posterior(
        args,
        RatePosterior.for_model(model, prior=prior),
        observations,
        seed,
        free=_free_rates(model),
    )
    d = mixture.diagnostics
    assert d is not None
    summary = {**summary, "rates": _posterior_rates(model, mixture, d)}
    summary = {k: summary[k] for k in ("method", "description", "seed", "rates", "diagnostics")}
    return summary, d.rate_draws


def _path_posterior(model, df, alpha, beta) -> dict:
    """The exact conjugate posterior from complete paths (one Gamma per rate)."""
    from .._learning.gamma_mixture import GammaMixturePosterior
    from .._learning.posterior import RatePosterior
    from .._learning.priors import GammaPrior
    from .._paths.csv import trajectories_from_dataframe
    from .._paths.sufficient_statistics import SufficientStatistics

    traj, _ = trajectories_from_dataframe(df, model)
    stats = SufficientStatistics.from_trajectories(traj, model.cardinalities, model.parents)
    posterior = RatePosterior.for_model(model, prior=GammaPrior(alpha, beta)).update_with(stats)
    mixture = GammaMixturePosterior.from_gamma(posterior, free=_free_rates(model))
    return {
        "method": "conjugate",
        "description": "complete paths: Gam(alpha + M, beta + T) per rate, exact",
        "rates": _posterior_rates(model, mixture),
        "diagnostics": None,
    }


def _draw_columns(model) -> list[tuple[int, int, int, int, str]]:
    """`(node, configuration, from, to, column name)` of every free rate: `NODE:X->Y`, with
    `|PARENT=STATE,...` before the colon for a node with parents."""
    import numpy as np

    out = []
    for n, name in enumerate(model.names):
        configs = _parent_states(model, n)
        for u, x, y in zip(*np.nonzero(_free_rates(model)[n])):
            given = ",".join(f"{p}={v}" for p, v in configs[int(u)].items())
            label = f"{name}|{given}" if given else name
            out.append((n, int(u), int(x), int(y), f"{label}:{x}->{y}"))
    return out


def _write_draws(path, model, draws) -> None:
    """The chains' rate draws (per node `(chains, draws, configs, k, k)`) as a CSV (columns
    `chain`, `draw`, one per free rate) or, for `.nc`, an ArviZ InferenceData's posterior
    group (one variable per free rate, dimensions chain and draw)."""
    import numpy as np

    columns = _draw_columns(model)
    values = {name: np.asarray(draws[n])[:, :, u, x, y] for n, u, x, y, name in columns}
    chains, num = next(iter(values.values())).shape
    if str(path).endswith(".nc"):
        import arviz  # pyright: ignore[reportMissingImports]  (optional: jaxctbn[arviz])

        arviz.from_dict(posterior=values).to_netcdf(str(path))
        return
    import pandas as pd

    frame = pd.DataFrame(
        {
            "chain": np.repeat(np.arange(chains), num),
            "draw": np.tile(np.arange(num), chains),
            **{name: v.reshape(-1) for name, v in values.items()},
        }
    )
    frame.to_csv(path, index=False)


def _cmd_fit(args):
    import numpy as np

    from .._learning.priors import GammaPrior
    from .._panel.buckets import PanelBuckets
    from .._panel.csv import panel_from_dataframe
    from .._panel.fit import fit_rates
    from .._panel.fit_methods import EMFit, GradientFit, SquaremFit
    from .._panel.uncertainty import rate_uncertainty
    from .._paths.csv import read_csv

    model = _load_network(args.network)
    N = model.num_nodes
    for flag, value in (("--alpha", args.alpha), ("--beta", args.beta)):
        if isinstance(value, tuple) and len(value) != N:
            raise ValueError(f"{flag}: give one value or one per node ({N}), got {len(value)}.")
    prior_name = args.prior or ("gamma" if args.posterior else "none")
    if prior_name == "none" and (args.alpha is not None or args.beta is not None):
        raise ValueError("--alpha/--beta: only with --prior gamma.")
    _check_posterior_arguments(args, prior_name)
    alpha = None if prior_name == "none" else np.asarray(args.alpha or 1.0, float)
    beta = None if prior_name == "none" else np.asarray(args.beta or 1.0, float)
    panel = args.observation == "panel"
    if not panel and args.exact_entry:
        raise ValueError("--exact-entry: only for panel data (--observation panel).")
    if not panel and (args.covariates is not None or args.covariate_rates is not None):
        raise ValueError("--covariates: only for panel data (--observation panel) here.")
    if args.covariate_rates is not None and args.covariates is None:
        raise ValueError("--covariate-rates: only with --covariates.")
    if args.covariate_shared is not None and args.covariates is None:
        raise ValueError("--covariate-shared: only with --covariates.")
    if not panel and args.pci is not None:
        raise ValueError("--pci: only for panel data (--observation panel).")
    effects = args.covariates is not None or args.pci is not None
    df = read_csv(args.data)
    default = "gradient" if effects else "squarem"
    out: dict = {"method": args.method or default, "observation": args.observation}
    num_effects = 0  # covariate effect parameters
    draws = None  # the posterior chains' rate draws (panel data)
    if panel:
        entry = _assignment(args.exact_entry, model.names, model.cardinalities, "--exact-entry")
        options = {"tolerance": args.tolerance}
        if args.max_iterations is not None:
            options["max_iterations"] = args.max_iterations
        methods = {"squarem": SquaremFit, "em": EMFit, "gradient": GradientFit}
        if effects:
            flag = "--covariates" if args.covariates is not None else "--pci"
            if args.method not in (None, "gradient"):
                raise ValueError(
                    f"--method {args.method}: covariate effects have no closed-form EM "
                    f"update; with {flag} the fit is --method gradient (the default then)."
                )
            if args.learn_strength is not None:
                raise ValueError(f"{flag}: not together with --learn-strength.")
        method = methods[out["method"]](**options)
        prior = None if alpha is None or beta is None else GammaPrior(alpha, beta)
        # the covariate columns are not nodes: the panel reader sees the rest
        columns = [] if args.covariates is None else _covariate_columns(args.covariates, df, model)
        nodes_df, note = _nodes_only(df, model, columns, "--network", "--covariates COL,...")
        if args.learn_strength is None:
            observations, ids = panel_from_dataframe(
                nodes_df, model, exact_entry=entry, bucketed=True
            )
        else:
            out["strength"], observations, ids = _learn_panel_strength(
                model, nodes_df, entry, prior, GradientFit(**options), args.learn_strength
            )
        covariates = None
        if args.covariates is not None:
            covariates, out["covariates"] = _covariates_of(
                model, df, ids, args.covariates, args.covariate_rates, observations,
                args.covariate_shared,
            )  # fmt: skip
        if args.pci is not None:
            observations, covariates, out["covariates"] = _with_periods(
                observations, covariates, out.get("covariates"), args.pci
            )
        if covariates is None and isinstance(observations, PanelBuckets):
            # shapes rounded up (padding without observations adds nothing), so that a new
            # data set of similar size finds its programs in the persistent compilation cache
            observations = observations.with_rounded_shapes()
        if note is not None:
            print(note, file=sys.stderr)
        fit = fit_rates(model, observations, method=method, prior=prior, covariates=covariates)
        if args.posterior:
            assert prior is not None
            out["posterior"], draws = _panel_posterior(args, model, observations, prior)
        fitted = fit.model
        uncertainty = rate_uncertainty(
            fitted, observations, prior=prior, covariates=covariates, effects=fit.effects
        )
        log_rate_se = uncertainty.log_rate_standard_errors
        definite = bool(uncertainty.positive_definite)
        if covariates is not None:
            free_rates = sum(
                int(np.sum((np.asarray(q) != 0) & ~np.eye(q.shape[-1], dtype=bool)))
                for q in model.cims
            )
            num_effects = int(fit.num_parameters) - free_rates  # (shared effects once)
            out["covariates"]["means"] = [float(v) for v in np.asarray(fit.covariate_means)]
            assert fit.effects_at_bound is not None
            out["effects_at_bound"] = int(sum(int(np.sum(b)) for b in fit.effects_at_bound))
            out["covariate_effects"] = _effect_table(fitted, covariates, uncertainty)
        if fit.method != out["method"]:  # SQUAREM stopped short, L-BFGS went on from there
            print(
                f"note: {out['method']} stopped short of the optimum; L-BFGS (--method gradient) "
                f"continued from where it stopped (method {fit.method!r})"
            )
            out["method"] = fit.method
        out.update(
            log_likelihood=float(fit.log_likelihood),
            log_posterior=float(fit.log_posterior),
            converged=bool(fit.converged),
            iterations=int(fit.iterations),
            at_lower_bound=_flagged_rates(fitted, fit.at_lower_bound),
            at_upper_bound=_flagged_rates(fitted, fit.at_upper_bound),
        )
        num_trajectories = len(ids)
    else:
        # complete paths: the conjugate update is the optimum, in one step
        strength = None
        if args.learn_strength is not None:
            out["strength"], df, strength = _learn_strength(
                model, df, alpha, beta, args.learn_strength
            )
        fitted, ll, num_trajectories, log_rate_se = _fit_paths(model, df, alpha, beta, strength)
        if args.posterior:
            out["posterior"] = _path_posterior(model, df, alpha, beta)
        definite = True  # diagonal: (alpha - 1 + M) > 0 for every estimated rate
        out.update(
            log_likelihood=ll, converged=True, iterations=1, at_lower_bound=[], at_upper_bound=[]
        )
    out["trajectories"] = num_trajectories
    out["rates"] = _rate_table(fitted, log_rate_se)
    # AIC counts every free rate (those at a bound too), and a learned strength
    num_parameters = (
        sum(
            int(np.sum((np.asarray(q) != 0) & ~np.eye(q.shape[-1], dtype=bool)))
            for q in fitted.cims
        )
        + int("strength" in out)
        + num_effects
    )
    out["minus2loglik"] = -2 * out["log_likelihood"]
    out["num_parameters"] = num_parameters
    out["aic"] = out["minus2loglik"] + 2 * num_parameters
    out["hessian_positive_definite"] = definite
    out["data"] = {
        "path": str(args.data),
        "sha256": _file_digest(args.data),
        "observations_sha256": _observations_digest(df, model.names, args.exact_entry),
    }
    if args.draws_out is not None and draws is not None:
        _write_draws(args.draws_out, model, draws)
    out["prior"] = (
        {"convention": "none"}
        if alpha is None
        else {"convention": "gamma", "alpha": args.alpha or 1.0, "beta": args.beta or 1.0}
    )
    out["network"] = fitted.to_dict()
    write_json(args.out, out)
    if "strength" in out:
        st = out["strength"]
        print(
            f"strength of {st['node']}: {st['estimate']:.4g} (95% interval "
            f"{st['interval'][0]:.4g} to {st['interval'][1]:.4g}; {st['trajectories_scaled']} "
            "trajectories under it)"
        )
    if not definite:
        print(
            "warning: the observed information is not positive definite (the fit is not at a "
            "maximum, or some rates are not identified by the data): no standard errors"
        )
    if out.get("effects_at_bound"):
        print(
            f"warning: {out['effects_at_bound']} covariate effect(s) at their bound (the data "
            "drive the hazard ratio to 0 or infinity): no interval (see covariate_effects)"
        )
    bounded = [r for r in out["rates"] if not r["estimated"]]
    if bounded and definite:
        print(
            f"warning: {len(bounded)} rate(s) at a bound (0 or infinity) or without "
            "information: no standard error (see at_lower_bound / at_upper_bound)"
        )
    if "posterior" in out and out["posterior"]["diagnostics"] is not None:
        d = out["posterior"]["diagnostics"]
        print(
            f"posterior: {d['chains']} chains x {d['draws']} draws, largest split R-hat "
            f"{d['max_split_r_hat']:.3f}, smallest ESS {d['min_ess']:.0f}, "
            f"{d['divergent_transitions']} divergent transitions"
        )
        if not d["converged"]:
            print(
                "warning: the posterior's chains may not have converged (split R-hat > 1.01, "
                "ESS < 100 or divergences): raise --draws"
            )
    state = "converged" if out["converged"] else "did NOT converge"
    print(
        f"fitted {out['method']} on {num_trajectories} {args.observation} trajectories: "
        f"log-likelihood {out['log_likelihood']:.6f} ({state}, {out['iterations']} iterations); "
        f"wrote {args.out}"
    )
