r"""Rate fits to panel data with a sampled E-step (Monte Carlo EM): for networks beyond exact
forward-backward, the expected statistics of each EM iteration are averages over complete
paths drawn by `sample_panel_paths` given the observations, and the M-step
is the exact one: $\hat q_n(x\to x'\mid u)=\bar M/\bar T$ (maximum likelihood), or
$(\bar M+\alpha)/(\bar T+\beta)$ under a Gamma prior (the complete-data posterior mean). The iterates fluctuate around the optimum by the
sampling error of the E-step; the fit is the average of the last half of them.
"""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import PRNGKeyArray

from .._learning.posterior import RatePosterior
from .._learning.priors import GammaPrior
from .._model.ctbn import CTBN
from .gibbs import DEFAULT_SAMPLER, GibbsSampler, sample_panel_paths, sampled_node_statistics
from .observations import PanelObservations
from .rate_fit import RateFit


class MonteCarloEMFit(eqx.Module):
    r"""Monte Carlo EM for [`jaxctbn.panel.fit_rates`][] (module docstring), for networks beyond
    exact forward-backward: `iterations` E-steps of `sampler`'s Gibbs sampling (complete paths
    given the observations, [`jaxctbn.panel.GibbsSampler`][]), each followed by the closed-form
    M-step, $\hat q=\bar M/\bar T$ (maximum likelihood; a configuration never visited keeps
    its rates) or $(\bar M+\alpha)/(\bar T+\beta)$ under a [`jaxctbn.GammaPrior`][] (the
    complete-data posterior mean). The fit's `model` is the average of the last half of the
    iterates; `rate_trace` holds them all. `fit_rates` then needs a `key`.

    The iterates fluctuate around the optimum by the E-step's sampling error, and there is no
    likelihood to monitor: the [`jaxctbn.panel.RateFit`][] has no `log_likelihood`,
    `converged`, `trace` or bound flags (`None`); `iterations` is the number run.

    **Arguments** (keyword-only): `iterations` (static, an integer >= 2; default 30), `sampler`
    (default `GibbsSampler()`).
    """

    iterations: int = eqx.field(static=True)
    sampler: GibbsSampler
    name: ClassVar[str] = "monte-carlo-em"

    def __init__(self, *, iterations: int = 30, sampler: GibbsSampler = DEFAULT_SAMPLER):
        if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 2:
            raise ValueError(f"iterations: an integer >= 2, got {iterations!r}.")
        if not isinstance(sampler, GibbsSampler):
            raise ValueError(f"sampler: expected a jaxctbn.panel.GibbsSampler, got {sampler!r}.")
        self.iterations = iterations
        self.sampler = sampler


def _m_step(statistics, model: CTBN, prior: GammaPrior | None) -> CTBN:
    """The closed-form M-step: maximum likelihood, or the conjugate update's posterior mean."""
    if prior is not None:
        return RatePosterior.for_model(model, prior=prior).update(statistics).mean()
    cims = []
    for stats, cim in zip(statistics, model.cims):
        k = cim.shape[-1]
        off = ~jnp.eye(k, dtype=bool)
        M, T = stats.transitions, stats.dwell_times
        rates = M / jnp.where(T > 0, T, 1)[..., None]
        rates = jnp.where((T > 0)[..., None], rates, jnp.where(off, cim, 0))  # unvisited: kept
        rates = jnp.where(off, rates, 0)
        cims.append(rates - jnp.eye(k, dtype=rates.dtype) * rates.sum(-1, keepdims=True))
    return CTBN(cims=cims, parents=model.parents, names=model.names)


def check_monte_carlo_em(model, observations, *, key, emissions, initial_distribution,
                         covariates) -> None:  # fmt: skip
    """The arguments of `fit_rates` that Monte Carlo EM cannot take, refused by name."""
    if not isinstance(model, CTBN):
        raise ValueError(f"model: expected a jaxctbn.CTBN, got {type(model).__name__}.")
    if not isinstance(observations, PanelObservations):
        raise ValueError(
            "observations: MonteCarloEMFit needs PanelObservations (a batch), not "
            f"{type(observations).__name__}."
        )
    if key is None:
        raise ValueError("key: MonteCarloEMFit samples paths; give fit_rates a PRNG key.")
    for name, value in (
        ("emissions", emissions),
        ("initial_distribution", initial_distribution),
        ("covariates", covariates),
    ):
        if value is not None:
            raise ValueError(f"{name}: not supported with method=MonteCarloEMFit (exact states).")


@eqx.filter_jit
def monte_carlo_em_fit(
    model: CTBN,
    observations: PanelObservations,
    method: MonteCarloEMFit,
    prior: GammaPrior | None,
    key: PRNGKeyArray,
) -> RateFit:
    """[`jaxctbn.panel.fit_rates`][] with `method=MonteCarloEMFit(...)` (checked by
    `check_monte_carlo_em`): the scan of E- and M-steps from `model`'s rates."""

    def step(cims, key):
        current = CTBN(cims=list(cims), parents=model.parents, names=model.names)
        paths = sample_panel_paths(current, observations, key=key, sampler=method.sampler)
        stats = sampled_node_statistics(paths.trajectories, model.parents, model.cardinalities)
        new = _m_step(stats, current, prior)
        return tuple(new.cims), (tuple(new.cims), paths.infeasible_updates.sum())

    start = tuple(jnp.asarray(c) for c in model.cims)
    _, (trace, infeasible) = jax.lax.scan(step, start, jr.split(key, method.iterations))
    half = method.iterations // 2
    averaged = [c[half:].mean(0) for c in trace]
    off = [~jnp.eye(k, dtype=bool) for k in model.cardinalities]
    free = sum(jnp.sum((jnp.asarray(c) != 0) & o) for c, o in zip(model.cims, off))
    return RateFit(
        model=CTBN(cims=averaged, parents=model.parents, names=model.names),
        log_likelihood=None,
        log_posterior=None,
        converged=None,
        iterations=jnp.asarray(method.iterations),
        trace=None,
        at_lower_bound=None,
        at_upper_bound=None,
        num_parameters=jnp.asarray(free),
        method=method.name,
        rate_trace=trace,
        infeasible_updates=infeasible,
    )
