"""Systematic resampling of weighted components: the ancestors of a particle filter's
resampling step and the stratified component draws of a mixture's criteria."""

from __future__ import annotations

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
