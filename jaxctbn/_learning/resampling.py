"""Systematic resampling of weighted components: the ancestors of a particle filter's
resampling step and the stratified component draws of a mixture's criteria."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, Float, Int, PRNGKeyArray


def systematic_indices(
    key: PRNGKeyArray, log_weights: Float[Array, " components"], count: int
) -> Int[Array, " count"]:
    r"""`count` component indices by systematic resampling: one uniform offset $U$, the points
    $(U+i)/n$ located in the cumulative weights. Each index on its own is drawn with
    probability $w_c$ (unbiased), and component $c$ appears $\lfloor nw_c\rfloor$ or
    $\lceil nw_c\rceil$ times (less variance than multinomial draws). In increasing order."""
    cumulative = jnp.cumsum(jax.nn.softmax(log_weights))
    points = (jr.uniform(key, (), cumulative.dtype) + jnp.arange(count)) / count
    index = jnp.searchsorted(cumulative, points, side="right")
    return jnp.minimum(index, log_weights.shape[0] - 1).astype(jnp.int32)


def reweighted_ancestors(
    key: PRNGKeyArray,
    log_weights: Float[Array, " particles"],
    log_likelihood: Float[Array, " particles"],
    resample_below: float,
) -> tuple[Int[Array, " particles"], Float[Array, " particles"]]:
    r"""One particle filter's reweighting: the new normalised log-weights
    $\ln w_c+\ell_c-\ln\sum_{c'}w_{c'}e^{\ell_{c'}}$, and when their effective number
    $1/\sum_cw_c^2$ falls below `resample_below` times the particles, systematic ancestors with
    equal weights; else the identity. Returns `(ancestors, log_weights)`."""
    P = log_weights.shape[0]
    new = jax.nn.log_softmax(log_weights + log_likelihood)
    resample = 1.0 / jnp.sum(jnp.exp(new) ** 2) < resample_below * P
    index = jnp.where(resample, systematic_indices(key, new, P), jnp.arange(P))
    equal = jnp.full((P,), -math.log(P), new.dtype)
    return index, jnp.where(resample, equal, new)
