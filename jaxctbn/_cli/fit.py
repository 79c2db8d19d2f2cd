"""`jaxctbn fit`: the rates of a network's graph fitted to complete paths or panel data."""

from __future__ import annotations

import sys

from .._files import write_json
from .._model.frames import free_rate_masks
from .arguments import _assignment
from .covariates import covariate_columns, covariates_of, nodes_only, with_periods
from .inputs import data_digest
from .rate_posterior import check_posterior_arguments, panel_posterior, path_posterior, write_draws
from .rate_tables import effect_table, flagged_rates, rate_table
from .strength import learn_panel_strength, learn_path_strength


def _observations_digest(df, names, exact_entry) -> str:
    """The SHA-256 of the observations a fit uses: the reserved columns and the nodes' columns
    (in that order, as parsed, written as CSV) and `--exact-entry`. `jaxctbn compare` refuses
    fits whose digests differ; fits of one file with and without covariate columns agree."""
    import hashlib

    from .._paths.csv import RESERVED_COLUMNS

    columns = [c for c in RESERVED_COLUMNS if c in df.columns] + list(names)
    text = df[columns].to_csv(index=False) + f"exact_entry={exact_entry or ''}"
    return hashlib.sha256(text.encode()).hexdigest()


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


def _cmd_fit(args):
    import numpy as np

    from .._learning.priors import GammaPrior
    from .._panel.buckets import PanelBuckets
    from .._panel.csv import panel_from_dataframe
    from .._panel.fit import fit_rates
    from .._panel.fit_methods import EMFit, GradientFit, SquaremFit
    from .inputs import network_flag_format, read_data, read_network

    network = read_network(args.network, network_flag_format(args.format))
    model = network.model
    N = model.num_nodes
    for flag, value in (("--alpha", args.alpha), ("--beta", args.beta)):
        if isinstance(value, tuple) and len(value) != N:
            raise ValueError(f"{flag}: give one value or one per node ({N}), got {len(value)}.")
    prior_name = args.prior or ("gamma" if args.posterior else "none")
    if prior_name == "none" and (args.alpha is not None or args.beta is not None):
        raise ValueError("--alpha/--beta: only with --prior gamma.")
    check_posterior_arguments(args, prior_name)
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
    df, data_format, _ = read_data(args.data, args.format, model=network.nodes(), panel=panel)
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
        columns = [] if args.covariates is None else covariate_columns(args.covariates, df, model)
        nodes_df, note = nodes_only(df, model, columns, "--network", "--covariates COL,...")
        if args.learn_strength is None:
            observations, ids = panel_from_dataframe(
                nodes_df, model, exact_entry=entry, bucketed=True
            )
        else:
            out["strength"], observations, ids = learn_panel_strength(
                model, nodes_df, entry, prior, GradientFit(**options), args.learn_strength
            )
        covariates = None
        if args.covariates is not None:
            covariates, out["covariates"] = covariates_of(
                model, df, ids, args.covariates, args.covariate_rates, observations,
                args.covariate_shared,
            )  # fmt: skip
        if args.pci is not None:
            observations, covariates, out["covariates"] = with_periods(
                observations, covariates, out.get("covariates"), args.pci
            )
        if isinstance(observations, PanelBuckets):
            # shapes rounded up (padding without observations adds nothing), so that a new
            # data set of similar size finds its programs in the persistent compilation cache
            observations = observations.with_rounded_shapes()
            if covariates is not None:  # the added trajectories' rows (they enter no interval)
                covariates = covariates.padded_for(observations)
        if note is not None:
            print(note, file=sys.stderr)
        # the fit's program loads (or compiles, while the intervals' is traced), then the
        # intervals' while the fit's loads and runs (the start's rates and zero effects stand
        # in for the fit's: the same structure, shapes and dtypes)
        from .._panel.uncertainty import rate_uncertainty
        from .exported import load_ahead

        stand_in = None
        if covariates is not None:
            stand_in = [np.zeros((covariates.num_covariates, *np.shape(q))) for q in model.cims]
        load_ahead(
            lambda: fit_rates(
                model, observations, method=method, prior=prior, covariates=covariates
            ),
            beside_tracing=True,
        )
        load_ahead(
            lambda: rate_uncertainty(
                model, observations, prior=prior, covariates=covariates, effects=stand_in
            )
        )
        fit = fit_rates(model, observations, method=method, prior=prior, covariates=covariates)
        if args.posterior:
            assert prior is not None
            out["posterior"], draws = panel_posterior(args, model, observations, prior)
        fitted = fit.model
        uncertainty = fit.uncertainty(observations, prior=prior, covariates=covariates)
        log_rate_se = uncertainty.log_rate_standard_errors
        definite = bool(uncertainty.positive_definite)
        if covariates is not None:
            free_rates = sum(int(f.sum()) for f in free_rate_masks(model))
            num_effects = int(fit.num_parameters) - free_rates  # (shared effects once)
            out["covariates"]["means"] = [float(v) for v in np.asarray(fit.covariate_means)]
            assert fit.effects_at_bound is not None
            out["effects_at_bound"] = int(sum(int(np.sum(b)) for b in fit.effects_at_bound))
            out["covariate_effects"] = effect_table(fitted, covariates, uncertainty)
        if fit.method != out["method"]:  # SQUAREM stopped short, L-BFGS went on from there
            print(
                f"note: {out['method']} stopped short of the optimum; L-BFGS (--method gradient) "
                f"continued from where it stopped (method {fit.method!r})"
            )
            out["method"] = fit.method
        assert fit.log_likelihood is not None and fit.log_posterior is not None  # a filter fit
        out.update(
            log_likelihood=float(fit.log_likelihood),
            log_posterior=float(fit.log_posterior),
            converged=bool(fit.converged),
            iterations=int(fit.iterations),
            at_lower_bound=flagged_rates(fitted, fit.at_lower_bound),
            at_upper_bound=flagged_rates(fitted, fit.at_upper_bound),
        )
        num_trajectories = len(ids)
    else:
        # complete paths: the conjugate update is the optimum, in one step
        strength = None
        if args.learn_strength is not None:
            out["strength"], df, strength = learn_path_strength(
                model, df, alpha, beta, args.learn_strength
            )
        fitted, ll, num_trajectories, log_rate_se = _fit_paths(model, df, alpha, beta, strength)
        if args.posterior:
            out["posterior"] = path_posterior(model, df, alpha, beta)
        definite = True  # diagonal: (alpha - 1 + M) > 0 for every estimated rate
        out.update(
            log_likelihood=ll, converged=True, iterations=1, at_lower_bound=[], at_upper_bound=[]
        )
    out["trajectories"] = num_trajectories
    out["rates"] = rate_table(fitted, log_rate_se)
    # AIC counts every free rate (those at a bound too), and a learned strength
    num_parameters = (
        sum(int(f.sum()) for f in free_rate_masks(fitted)) + int("strength" in out) + num_effects
    )
    out["minus2loglik"] = -2 * out["log_likelihood"]
    out["num_parameters"] = num_parameters
    out["aic"] = out["minus2loglik"] + 2 * num_parameters
    out["hessian_positive_definite"] = definite
    out["data"] = {
        "path": str(args.data),
        "sha256": data_digest(args.data),
        "observations_sha256": _observations_digest(df, model.names, args.exact_entry),
    }
    if args.draws_out is not None and draws is not None:
        write_draws(args.draws_out, model, draws)
    out["prior"] = (
        {"convention": "none"}
        if alpha is None
        else {"convention": "gamma", "alpha": args.alpha or 1.0, "beta": args.beta or 1.0}
    )
    out["network"] = fitted.to_dict()
    out["input_format"] = {"data": data_format, "network": network.format}
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
