"""`fit --posterior` (and `design --observation panel`): the posterior of the rates, sampled
from panel data or conjugate from complete paths, its JSON summary and the draws file."""

from __future__ import annotations

from .._model.frames import free_rate_masks
from .rate_tables import parent_states


def check_posterior_arguments(args, prior_name: str) -> None:
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
        configs = parent_states(model, n)
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


def sampled_rate_posterior(args, prior, observations, seed, *, free):
    """The sampled posterior of the rates after `observations` under the Gamma `prior`
    (`--draws`, `--chains`; structural zeros where `free` is false): the mixture and the
    JSON's summary (method, seed, chain diagnostics). Shared by `fit --posterior` and
    `design --observation panel`, which say on stdout when the chains did not converge."""
    import warnings

    import jax

    from .._learning.gamma_mixture import GammaMixturePosterior
    from .._panel.rate_families import SampledGammaMixture
    from .._panel.rate_posterior import panel_rate_posterior

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


def panel_posterior(args, model, observations, prior):
    """The sampled posterior of the rates under `prior` (structural zeros from the network):
    the JSON's `"posterior"` and the chains' rate draws."""
    from .._learning.posterior import RatePosterior

    seed = 0 if args.seed is None else args.seed
    mixture, summary = sampled_rate_posterior(
        args,
        RatePosterior.for_model(model, prior=prior),
        observations,
        seed,
        free=free_rate_masks(model),
    )
    d = mixture.diagnostics
    assert d is not None
    summary = {**summary, "rates": _posterior_rates(model, mixture, d)}
    summary = {k: summary[k] for k in ("method", "description", "seed", "rates", "diagnostics")}
    return summary, d.rate_draws


def path_posterior(model, df, alpha, beta) -> dict:
    """The exact conjugate posterior from complete paths (one Gamma per rate)."""
    from .._learning.gamma_mixture import GammaMixturePosterior
    from .._learning.posterior import RatePosterior
    from .._learning.priors import GammaPrior
    from .._paths.csv import trajectories_from_dataframe
    from .._paths.sufficient_statistics import SufficientStatistics

    traj, _ = trajectories_from_dataframe(df, model)
    stats = SufficientStatistics.from_trajectories(traj, model.cardinalities, model.parents)
    posterior = RatePosterior.for_model(model, prior=GammaPrior(alpha, beta)).update_with(stats)
    mixture = GammaMixturePosterior.from_gamma(posterior, free=free_rate_masks(model))
    return {
        "method": "conjugate",
        "description": "complete paths: Gam(alpha + M, beta + T) per rate, exact",
        "rates": _posterior_rates(model, mixture),
        "diagnostics": None,
    }


def write_draws(path, model, draws) -> None:
    """The chains' rate draws (per node `(chains, draws, configs, k, k)`) as a CSV (columns
    `chain`, `draw`, one per free rate) or, for `.nc`, an ArviZ InferenceData's posterior
    group (one variable per free rate, dimensions chain and draw): the library's naming and
    conversion (`GammaMixturePosterior.to_inference_data`)."""
    import numpy as np

    from .._model.frames import named_rate_draws, rate_draws_inference_data

    if str(path).endswith(".nc"):
        data = rate_draws_inference_data(model, free_rate_masks(model), draws, "--draws-out .nc")
        data.to_netcdf(str(path))
        return
    import pandas as pd

    values = named_rate_draws(model, free_rate_masks(model), draws)
    chains, num = next(iter(values.values())).shape
    frame = pd.DataFrame(
        {
            "chain": np.repeat(np.arange(chains), num),
            "draw": np.tile(np.arange(num), chains),
            **{name: v.reshape(-1) for name, v in values.items()},
        }
    )
    frame.to_csv(path, index=False)
