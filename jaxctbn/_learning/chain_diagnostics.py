r"""Convergence diagnostics of Markov chains run in parallel: split-$\hat R$ and the
effective sample size over several chains (Gelman et al., *Bayesian Data Analysis*, 3rd ed.,
§11.4-11.5; the form Stan reports).

Both take draws `(chains, draws, ...)` (any trailing axes: one diagnostic per scalar) and are
pure and jittable. Each chain is cut into two halves, so a chain that drifts shows as two
sequences that disagree.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float


def autocovariance(x: Float[Array, "sequences draws ..."]) -> Float[Array, "sequences draws ..."]:
    r"""Per sequence, the biased autocovariance $\hat\gamma_t=\frac1n\sum_{i}(x_i-\bar x)
    (x_{i+t}-\bar x)$ at every lag $t=0..n-1$ (by FFT, zero-padded to $2n$)."""
    n = x.shape[1]
    centred = x - x.mean(1, keepdims=True)
    spectrum = jnp.fft.rfft(centred, n=2 * n, axis=1)
    return jnp.fft.irfft(jnp.abs(spectrum) ** 2, n=2 * n, axis=1)[:, :n] / n


def _split(draws: Array) -> Array:
    """`(chains, draws, ...)` -> `(2 chains, draws // 2, ...)`: each chain's two halves (an odd
    draw count drops the middle draw)."""
    n = draws.shape[1] // 2
    if n < 2:
        raise ValueError(
            f"draws: the diagnostics need at least 4 draws per chain, got {draws.shape[1]}."
        )
    return jnp.concatenate([draws[:, :n], draws[:, draws.shape[1] - n :]], axis=0)


def _variances(halves: Array) -> tuple[Array, Array, Array]:
    """`(W, var+, B/n)` of split sequences: the mean within-sequence variance, the pooled
    estimate $\\frac{n-1}{n}W+B/n$ and the variance of the sequence means."""
    n = halves.shape[1]
    within = halves.var(1, ddof=1).mean(0)
    between_n = halves.mean(1).var(0, ddof=1)
    return within, (n - 1) / n * within + between_n, between_n


def split_r_hat(draws: Float[Array, "chains draws ..."]) -> Float[Array, "..."]:
    r"""Split-$\hat R=\sqrt{\widehat{\mathrm{var}}^+/W}$ over the $2\times$chains half-chains:
    near 1 when they agree, above ~1.01 when the chains have not mixed. 1 for a constant trace,
    $+\infty$ for constant half-chains that differ."""
    within, pooled, between_n = _variances(_split(draws))
    safe = jnp.where(within > 0, within, 1.0)
    ratio = jnp.where(within > 0, pooled / safe, jnp.where(between_n > 0, jnp.inf, 1.0))
    return jnp.sqrt(ratio)


def effective_sample_size(draws: Float[Array, "chains draws ..."]) -> Float[Array, "..."]:
    r"""The effective sample size over all chains, $mn/\hat\tau$ with
    $\hat\tau=-1+2\sum_t\hat\rho_t$, $\hat\rho_t=1-(W-\overline{\hat\gamma_t})/
    \widehat{\mathrm{var}}^+$ (the half-chains' mean autocovariance), summed over Geyer's
    initial positive sequence of pairs $\hat\rho_{2k}+\hat\rho_{2k+1}$. The total number of
    draws for a constant trace; at least 1 otherwise."""
    halves = _split(draws)
    m, n = halves.shape[:2]
    within, pooled, _ = _variances(halves)
    mean_autocovariance = autocovariance(halves).mean(0)  # (n, ...)
    safe = jnp.where(pooled > 0, pooled, 1.0)
    rho = 1 - (within - mean_autocovariance) / safe
    pairs = rho[: n // 2 * 2].reshape(n // 2, 2, *rho.shape[1:]).sum(1)
    positive = jnp.cumprod(pairs > 0, axis=0).astype(rho.dtype)
    tau = -1 + 2 * (positive * pairs).sum(0)
    total = float(m * n)
    return jnp.where(pooled > 0, jnp.clip(total / jnp.maximum(tau, 1e-12), 1.0, None), total)
