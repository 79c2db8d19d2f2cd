r"""The likelihood-ratio test and AIC between nested maximum-likelihood fits of the same panel
data (R msm's `lrtest.msm` and `AIC`).

For a smaller model nested in a larger one, with maximised log-likelihoods $\ell_0\le\ell_1$
and $p_0<p_1$ parameters, the statistic $D=2(\ell_1-\ell_0)$ is asymptotically
$\chi^2_{p_1-p_0}$ under the smaller model, and the p-value is its upper tail. Each fit's
$\mathrm{AIC}=-2\ell+2p$ (smaller is better). Nesting itself (the smaller model's parents and
covariates a subset of the larger's, the same data) is the caller's to ensure: the command
line's `jaxctbn compare` checks it on the fits' JSON.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import jax.scipy.stats
from jaxtyping import Array, ArrayLike, Float

from .._errors import error_if


class LikelihoodRatioTest(eqx.Module):
    """What [`jaxctbn.panel.RateFit.likelihood_ratio_test`][] returns: `lr_statistic` $D$, `df`
    $p_1-p_0$, `p_value`, and `aic` `(2,)` of the smaller and the larger fit."""

    lr_statistic: Float[Array, ""]
    df: Float[Array, ""]
    p_value: Float[Array, ""]
    aic: Float[Array, " 2"]


def lr_test(
    minus2loglik: tuple[ArrayLike, ArrayLike], num_parameters: tuple[ArrayLike, ArrayLike]
) -> LikelihoodRatioTest:
    """The test from the smaller fit's and the larger fit's −2LL and parameter counts (in that
    order)."""
    m2ll = jnp.asarray(minus2loglik, float)
    p = jnp.asarray(num_parameters).astype(m2ll.dtype)
    statistic = m2ll[0] - m2ll[1]
    df = p[1] - p[0]
    p_value = jax.scipy.stats.chi2.sf(jnp.maximum(statistic, 0.0), jnp.maximum(df, 1.0))
    return LikelihoodRatioTest(lr_statistic=statistic, df=df, p_value=p_value, aic=m2ll + 2 * p)


def likelihood_ratio_test(smaller, larger) -> LikelihoodRatioTest:
    r"""The likelihood-ratio test of `smaller` nested in `larger`, two
    [`jaxctbn.panel.RateFit`][]s (`RateFit.likelihood_ratio_test`, which checks their type).

    Refused with a `ValueError`: networks with different nodes. Inside `jit`, an error when
    `larger` does not have more parameters or a fit is a MAP fit (its log-posterior differs
    from its log-likelihood). A negative statistic (the larger fit stopped short of its
    optimum) gives the p-value 1; refit it.
    """
    if smaller.model.names != larger.model.names or (
        smaller.model.cardinalities != larger.model.cardinalities
    ):
        raise ValueError("smaller, larger: the networks have different nodes or state counts.")
    test = lr_test(
        (-2 * smaller.log_likelihood, -2 * larger.log_likelihood),
        (smaller.num_parameters, larger.num_parameters),
    )
    test = error_if(
        test,
        larger.num_parameters <= smaller.num_parameters,
        "larger: must have more parameters than smaller (nested models).",
    )
    return error_if(
        test,
        (smaller.log_posterior != smaller.log_likelihood)
        | (larger.log_posterior != larger.log_likelihood),
        "smaller, larger: a MAP fit (with a prior); the test needs maximum-likelihood fits.",
    )
