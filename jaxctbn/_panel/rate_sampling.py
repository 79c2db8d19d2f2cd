r"""The log-rate target of the sampled panel rate posterior and the path statistics of its
draws: the support bounds, the exact panel log-likelihood ($-\infty$ outside), the log-rates
and their moments under a Gamma, the model at given log-rates, the mixture prior's log density,
and the statistics of one exact draw of the hidden paths."""

from __future__ import annotations

import math
from typing import cast

import jax.numpy as jnp
import jax.random as jr
from jax.scipy.special import digamma, gammaln, polygamma
from jaxtyping import Array

from .._learning.conjugate import off_diagonal_entries, with_zero_diagonal
from .._learning.gamma_mixture import GammaMixturePosterior
from .._learning.posterior import RatePosterior
from .._master_equation import MatrixExponential, amalgamate, gap_transition_matrices
from .._model.ctbn import CTBN
from .buckets import PanelBuckets, as_flat_buckets
from .expected_statistics import PanelExpectedStatistics
from .gap_groups import pooled_by_gaps
from .inference import panel_inference as _compute
from .observations import PanelObservations
from .path_statistics import sample_path_statistics

#: log-rates beyond this bound are outside the sampler's support (rates e^{+-30})
LOG_RATE_BOUND = 30.0
#: and so are rates whose product with the data's time span exceeds 1e9 (the chain equilibrates
#: in a billionth of the span: no posterior mass under any proper prior the data leave alone)
LOG_RATE_TIMES_SPAN_BOUND = math.log(1e9)


def time_span(observations: PanelObservations | PanelBuckets) -> Array:
    """An upper bound on every gap between two observations: the largest observation time
    minus the smallest (padding slots repeat a trajectory's times or are 0; at least 1e-300)."""
    buckets = as_flat_buckets(observations)
    times = [jnp.where(jnp.isfinite(b.times), b.times, 0.0) for b in buckets]
    top = jnp.max(jnp.stack([t.max() for t in times]))
    bottom = jnp.min(jnp.stack([jnp.minimum(t.min(), 0.0) for t in times]))
    return jnp.maximum(top - bottom, 1e-300)


def log_likelihood_or_minus_infinity(model, observations, emissions, solver, gaps) -> Array:
    """The panel log-likelihood of all trajectories (as `panel_log_likelihood`; with `gaps`,
    one transition matrix per distinct gap), $-\\infty$ where an observation is impossible or
    the filter not finite: a proposal the sampler rejects, not an error (the data were checked
    possible at the start)."""
    if gaps is not None:
        bads, log_likelihood = pooled_by_gaps(
            model, observations, emissions, None, gaps, "likelihood"
        )
        total = cast(Array, log_likelihood).sum()
        impossible = jnp.any(jnp.stack([jnp.any(b) for b in bads]))
    else:
        total, impossible = jnp.asarray(0.0), jnp.asarray(False)
        for bucket in as_flat_buckets(observations):
            bad, log_likelihood = _compute(
                model, bucket, emissions, None, solver, "likelihood", None
            )
            total = total + cast(Array, log_likelihood).sum()
            impossible = impossible | jnp.any(bad)
    impossible = impossible | ~jnp.isfinite(total)
    return jnp.where(impossible, -jnp.inf, total)


def log_rates(model, free: tuple[Array, ...]) -> tuple[Array, ...]:
    """The off-diagonal log-rates of `model`, per node `(configs, k - 1, k)` (0 at the
    coordinates of structural zeros, which carry a standard normal and no rate)."""
    return tuple(
        jnp.where(f, jnp.log(jnp.where(f, off_diagonal_entries(c), 1.0)), 0.0)
        for c, f in zip(model.cims, free)
    )


def log_rate_moments(
    posterior: RatePosterior, free: tuple[Array, ...]
) -> tuple[tuple[Array, ...], tuple[Array, ...]]:
    r"""Per node `(configs, k - 1, k)`: the mean $\psi(\alpha)-\ln\beta$ and twice the s.d.
    $\sqrt{\psi_1(\alpha)}$ of the log-rates under the Gammas of `posterior` (0 and 1 at
    structural zeros)."""
    centres, scales = [], []
    for a, b, f in zip(posterior.alpha, posterior.beta, free):
        k = a.shape[-1]
        a = jnp.where(f, off_diagonal_entries(a), 1.0)
        b = jnp.where(f, off_diagonal_entries(jnp.broadcast_to(b[..., None], b.shape + (k,))), 1.0)
        centres.append(jnp.where(f, digamma(a) - jnp.log(b), 0.0))
        scales.append(jnp.where(f, 2.0 * jnp.sqrt(polygamma(1, a)), 1.0))
    return tuple(centres), tuple(scales)


def log_rate_model(mixture: GammaMixturePosterior, theta: tuple[Array, ...]) -> CTBN:
    """The CTBN whose free off-diagonal rates are $e^\\theta$ (structural zeros 0)."""
    cims = [
        with_zero_diagonal(jnp.where(off_diagonal_entries(f), jnp.exp(t), 0.0))
        for t, f in zip(theta, mixture.free_rates())
    ]
    return CTBN(cims=cims, parents=mixture.parents, names=mixture.names)


def log_prior(mixture: GammaMixturePosterior, theta: tuple[Array, ...]) -> Array:
    r"""Per component $j$, $\ln w_j+\sum\ln\mathrm{Gam}(e^\theta\mid\alpha_j,\beta_j)+\sum\theta$
    over the free rates: the log density of the log-rates under the component (logsumexp for
    the mixture's). The coordinates of structural zeros get a standard normal (a proper
    density that moves nothing: their rates are 0)."""
    total = mixture.log_weights
    for a, b, t, f in zip(mixture.alpha, mixture.beta, theta, mixture.free_rates()):
        k = a.shape[-1]
        keep = off_diagonal_entries(f)
        a = jnp.where(keep, off_diagonal_entries(a), 1.0)
        b = jnp.where(
            keep, off_diagonal_entries(jnp.broadcast_to(b[..., None], b.shape + (k,))), 1.0
        )
        terms = a * jnp.log(b) - gammaln(a) + a * t[None] - b * jnp.exp(t)[None]
        terms = jnp.where(keep, terms, -0.5 * t[None] ** 2)
        total = total + terms.reshape(terms.shape[0], -1).sum(1)
    return total


def sampled_statistics(model, observations, emissions, key, solver, max_candidates, gaps):
    """`sample_path_statistics` of a flat batch or of every bucket (gathered in the given
    order); with `gaps`, each interval's transition matrix from its gap's."""
    propagators: list[tuple[Array, Array] | None] = [None] * len(as_flat_buckets(observations))
    if gaps is not None:
        W = amalgamate(model.checked()).dense()
        table = MatrixExponential._checked(
            (gap_transition_matrices(W, jnp.asarray(gaps.gaps, W.dtype)),)
        )[0]
        propagators = [(table, jnp.asarray(index)) for index in gaps.index]
    buckets = as_flat_buckets(observations)
    parts = [
        sample_path_statistics(
            model,
            bucket,
            key=k,
            solver=solver,
            emissions=emissions,
            max_candidates=max_candidates,
            propagators=p,
        )
        for bucket, k, p in zip(buckets, jr.split(key, len(buckets)), propagators)
    ]
    if isinstance(observations, PanelObservations):
        return parts[0]
    dwell, transitions, log_likelihood = observations.gather(
        [(p.dwell_times, p.transitions, p.log_likelihood) for p in parts]
    )
    return PanelExpectedStatistics(
        dwell_times=dwell,
        transitions=transitions,
        log_likelihood=log_likelihood,
        model=parts[0].model,
    )
