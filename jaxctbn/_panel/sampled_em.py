r"""Rate fits to panel data with a sampled E-step (Monte Carlo EM): for networks beyond exact
forward-backward, the expected statistics of each EM iteration are averages over complete
paths drawn by `sample_panel_paths` given the observations, and the M-step
is the exact one: $\hat q_n(x\to x'\mid u)=\bar M/\bar T$ (maximum likelihood), or
$(\bar M+\alpha)/(\bar T+\beta)$ under a Gamma prior (the complete-data posterior mean). The iterates fluctuate around the optimum by the
sampling error of the E-step; the fit is the average of the last half of them.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, Float, PRNGKeyArray

from .._learning.posterior import RatePosterior
from .._learning.priors import GammaPrior
from .._model.ctbn import CTBN
from .gibbs import DEFAULT_SAMPLER, GibbsSampler, sample_panel_paths, sampled_node_statistics
from .observations import PanelObservations


class SampledRateFit(eqx.Module):
    """A Monte Carlo EM fit: `model` (the average of the last half of the iterates' rates),
    `trace` (every iterate's rates, one array per node with a leading iteration axis) and
    `infeasible_updates` (per iteration, Gibbs updates that kept their path)."""

    model: CTBN
    trace: tuple[Float[Array, "iterations configs k k"], ...]
    infeasible_updates: Array


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


@eqx.filter_jit
def fit_rates_by_sampling(
    model: CTBN,
    observations: PanelObservations,
    *,
    key: PRNGKeyArray,
    iterations: int = 30,
    sampler: GibbsSampler = DEFAULT_SAMPLER,
    prior: GammaPrior | None = None,
) -> SampledRateFit:
    r"""The rates of `model`'s graph fitted to a batch of panel `observations` by Monte Carlo
    EM (module docstring): `iterations` (static) E-steps of `sampler`'s Gibbs sampling, each
    followed by the closed-form M-step; starts from `model`'s rates. `prior`: a
    [`jaxctbn.GammaPrior`][] (each M-step takes the complete-data posterior mean), `None` for
    maximum likelihood (a configuration never visited keeps its rates).

    **Returns:** a [`jaxctbn.panel.SampledRateFit`][]."""
    if not isinstance(model, CTBN):
        raise ValueError(f"model: expected a jaxctbn.CTBN, got {type(model).__name__}.")
    if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 2:
        raise ValueError(f"iterations: an integer >= 2, got {iterations!r}.")

    def step(cims, key):
        current = CTBN(cims=list(cims), parents=model.parents, names=model.names)
        paths = sample_panel_paths(current, observations, key=key, sampler=sampler)
        stats = sampled_node_statistics(paths.trajectories, model.parents, model.cardinalities)
        new = _m_step(stats, current, prior)
        return tuple(new.cims), (tuple(new.cims), paths.infeasible_updates.sum())

    start = tuple(jnp.asarray(c) for c in model.cims)
    _, (trace, infeasible) = jax.lax.scan(step, start, jr.split(key, iterations))
    half = iterations // 2
    averaged = [c[half:].mean(0) for c in trace]
    return SampledRateFit(
        model=CTBN(cims=averaged, parents=model.parents, names=model.names),
        trace=trace,
        infeasible_updates=infeasible,
    )
