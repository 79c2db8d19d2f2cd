"""`jaxctbn fit`: the rates of a network's graph fitted to complete paths or panel data."""

from __future__ import annotations

from .._files import write_json
from .arguments import _assignment, _load_network


def _flagged_rates(model, flags) -> list[dict]:
    """The rates marked in per-node boolean arrays `(configs, k, k)`, by node, parent states
    and transition."""
    import itertools

    import numpy as np

    out = []
    for n, name in enumerate(model.names):
        parents = list(model.parents[n])
        configs = list(itertools.product(*(range(model.cardinalities[p]) for p in parents)))
        for u, x, y in zip(*np.nonzero(np.asarray(flags[n]))):
            out.append(
                {
                    "node": name,
                    "parent_states": {
                        model.names[p]: int(v) for p, v in zip(parents, configs[int(u)])
                    },
                    "from": int(x),
                    "to": int(y),
                }
            )
    return out


def _fit_paths(model, df, alpha, beta):
    """Closed-form rates from complete paths: ML $M/T$, or the Gamma MAP
    $(\alpha-1+M)/(\beta+T)$ clipped at 0; structural zeros stay 0, a configuration never
    visited keeps its starting rate."""
    import jax.numpy as jnp
    import numpy as np

    from .._learning.posterior import path_log_likelihood
    from .._model.ctbn import CTBN
    from .._paths.csv import trajectories_from_dataframe
    from .._paths.sufficient_statistics import SufficientStatistics

    traj, ids = trajectories_from_dataframe(df, model)
    stats = SufficientStatistics.from_trajectories(traj, model.cardinalities, model.parents)
    cims = []
    for n, (q, st) in enumerate(zip(model.cims, stats.pooled())):
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
    fitted = CTBN(cims=cims, parents=model.parents, names=model.names)
    ll = float(path_log_likelihood(fitted, stats))
    return fitted, ll, len(dict.fromkeys(ids))


def _cmd_fit(args):
    import numpy as np

    from .._learning.priors import GammaPrior
    from .._panel.csv import panel_from_dataframe
    from .._panel.fit import EMFit, GradientFit, fit_rates
    from .._paths.csv import read_csv

    model = _load_network(args.network)
    N = model.num_nodes
    for flag, value in (("--alpha", args.alpha), ("--beta", args.beta)):
        if isinstance(value, tuple) and len(value) != N:
            raise ValueError(f"{flag}: give one value or one per node ({N}), got {len(value)}.")
    if args.prior == "none" and (args.alpha is not None or args.beta is not None):
        raise ValueError("--alpha/--beta: only with --prior gamma.")
    alpha = None if args.prior == "none" else np.asarray(args.alpha or 1.0, float)
    beta = None if args.prior == "none" else np.asarray(args.beta or 1.0, float)
    panel = args.observation == "panel"
    if not panel and args.exact_entry:
        raise ValueError("--exact-entry: only for panel data (--observation panel).")
    df = read_csv(args.data)
    out: dict = {"method": args.method, "observation": args.observation}
    if panel:
        entry = _assignment(args.exact_entry, model.names, model.cardinalities, "--exact-entry")
        observations, ids = panel_from_dataframe(df, model, exact_entry=entry, bucketed=True)
        options = {"tolerance": args.tolerance}
        if args.max_iterations is not None:
            options["max_iterations"] = args.max_iterations
        method = EMFit(**options) if args.method == "em" else GradientFit(**options)
        prior = None if alpha is None or beta is None else GammaPrior(alpha, beta)
        fit = fit_rates(model, observations, method=method, prior=prior)
        fitted = fit.model
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
        fitted, ll, num_trajectories = _fit_paths(model, df, alpha, beta)
        out.update(
            log_likelihood=ll, converged=True, iterations=1, at_lower_bound=[], at_upper_bound=[]
        )
    out["trajectories"] = num_trajectories
    out["prior"] = (
        {"convention": "none"}
        if alpha is None
        else {"convention": "gamma", "alpha": args.alpha or 1.0, "beta": args.beta or 1.0}
    )
    out["network"] = fitted.to_dict()
    write_json(args.out, out)
    state = "converged" if out["converged"] else "did NOT converge"
    print(
        f"fitted {args.method} on {num_trajectories} {args.observation} trajectories: "
        f"log-likelihood {out['log_likelihood']:.6f} ({state}, {out['iterations']} iterations); "
        f"wrote {args.out}"
    )
