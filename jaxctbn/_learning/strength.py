r"""Learning an unknown intervention strength from complete paths (maths §8).

A drug scales node $n$'s rates by an unknown $s$. From paths recorded without it (statistics
$M_0,T_0$ of node $n$) and with it ($M_1,T_1$), with independent $\mathrm{Gam}(\alpha,\beta)$ rates
integrated out (conjugacy: under the drug a rate $\Lambda$ acts over the exposure $sT_1$),

$$p(\text{data}\mid s)\propto\prod_{u,x\ne x'}s^{M_1}\,
\frac{\Gamma(\alpha+M_0+M_1)}{(\beta+T_0+sT_1)^{\alpha+M_0+M_1}},$$

a function of one variable. With a log-uniform prior on $s$ over $[a,b]$ the posterior is
computed on a fine grid in $\ln s$ (quadrature, no approximation beyond the grid): its median,
mode and equal-tailed interval. $\beta=0$, $\alpha=1$ is the flat prior on the rates.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from .._errors import error_if
from .conjugate import off_diagonal


class StrengthPosterior(eqx.Module):
    r"""The posterior of an intervention strength $s$ on a grid: `log_strengths` `(G,)`
    (evenly spaced $\ln s$) and `log_density` `(G,)` (normalised w.r.t. $\ln s$)."""

    log_strengths: Float[Array, " grid"]
    log_density: Float[Array, " grid"]

    def _cdf(self) -> Array:
        density = jnp.exp(self.log_density)
        steps = jnp.diff(self.log_strengths)
        cumulative = jnp.concatenate(
            [jnp.zeros(1, density.dtype), jnp.cumsum(0.5 * (density[1:] + density[:-1]) * steps)]
        )
        return cumulative / cumulative[-1]

    def quantile(self, q: ArrayLike) -> Array:
        """The strength at posterior probability `q` (linear interpolation of the CDF)."""
        return jnp.exp(jnp.interp(jnp.asarray(q), self._cdf(), self.log_strengths))

    def mean_log(self) -> Array:
        r"""The posterior mean of $\ln s$."""
        weights = jnp.exp(self.log_density) * self.log_strengths
        return jnp.sum(0.5 * (weights[1:] + weights[:-1]) * jnp.diff(self.log_strengths))

    def median(self) -> Array:
        return self.quantile(0.5)

    def mode(self) -> Array:
        """The grid point of highest density in $\\ln s$ (the MAP of $\\ln s$)."""
        return jnp.exp(self.log_strengths[jnp.argmax(self.log_density)])

    def interval(self, level: float = 0.95) -> Array:
        """The equal-tailed credible interval `(2,)` of probability `level`."""
        tail = (1.0 - level) / 2.0
        return self.quantile(jnp.asarray([tail, 1.0 - tail]))


@eqx.filter_jit
def learn_strength(
    unscaled_transitions: Float[Array, "configs k k"],
    unscaled_dwell_times: Float[Array, "configs k"],
    scaled_transitions: Float[Array, "configs k k"],
    scaled_dwell_times: Float[Array, "configs k"],
    *,
    alpha: ArrayLike = 1.0,
    beta: ArrayLike = 1.0,
    free: Bool[Array, "configs k k"] | None = None,
    low: float = 1e-3,
    high: float = 1e3,
    num_points: int = 4001,
) -> StrengthPosterior:
    r"""The posterior of the strength $s$ by which an intervention scaled one node's rates
    (module docstring): the node's statistics without (`unscaled_*`) and with the intervention
    (`scaled_*`), its rates' Gamma prior (`alpha`, `beta`; $\alpha=1,\beta=0$ flat), the
    rates that exist (`free`, default every off-diagonal), a log-uniform prior on
    $[$`low`, `high`$]$ evaluated at `num_points` points."""
    if not (0 < low < high) or num_points < 3:
        raise ValueError(
            f"low, high, num_points: need 0 < low < high and num_points >= 3, got {low}, "
            f"{high}, {num_points}."
        )
    M0, T0 = jnp.asarray(unscaled_transitions), jnp.asarray(unscaled_dwell_times)
    M1, T1 = jnp.asarray(scaled_transitions), jnp.asarray(scaled_dwell_times)
    k = M0.shape[-1]
    statistics = (M0, T0, M1, T1)
    bad = jnp.zeros((), bool)
    for x in statistics:
        bad = bad | ~jnp.all(jnp.isfinite(x) & (x >= 0))
    M0, T0, M1, T1 = error_if(
        statistics,
        bad,
        "learn_strength: the statistics (transitions and dwell times, with and without the "
        "intervention) must be finite and >= 0.",
    )
    rates = off_diagonal(k) if free is None else (jnp.asarray(free) & off_diagonal(k))
    a = jnp.asarray(alpha, T0.dtype) + M0 + M1
    log_s = jnp.linspace(jnp.log(low), jnp.log(high), num_points, dtype=T0.dtype)

    def log_likelihood(ls):
        exposure = jnp.asarray(beta, T0.dtype) + T0 + jnp.exp(ls) * T1  # (configs, k)
        terms = M1 * ls - a * jnp.log(exposure)[..., None]
        # a state never visited adds a term constant in s (possibly log 0 with beta = 0)
        seen = (T0 + T1 > 0)[..., None]
        return jnp.where(rates & seen, terms, 0.0).sum()

    values = jax.vmap(log_likelihood)(log_s)
    values = error_if(
        values,
        ~jnp.all(jnp.isfinite(values)),
        "learn_strength: the likelihood is not finite (a rate with no exposure and no prior: "
        "give beta > 0).",
    )
    steps = jnp.diff(log_s)
    density = jnp.exp(values - values.max())
    norm = jnp.sum(0.5 * (density[1:] + density[:-1]) * steps)
    return StrengthPosterior(log_strengths=log_s, log_density=values - values.max() - jnp.log(norm))
