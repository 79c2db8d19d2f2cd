r"""Design criteria for active **parameter** learning: KL divergence between CTBN path measures,
the Box-Hill criterion (BHC), the variational Box-Hill criterion (VBHC) and the EIG.

Implements the checked forms of maths §2, §3 and §6, which correct the printed paper:

- KL (§2): $\mathrm{KL}=\sum_{n\in\aleph,u,x,x'}\mathsf E[\hat T](\Lambda\ln\frac{\Lambda}{\Lambda'}
  -\Lambda+\Lambda')\ge0$ (the appendix has the wrong sign on the log term).
- VBHC (§3): the paper's eq. (12) has a minus where a plus belongs; its gradients have a flipped
  sign, a missing $\bar\alpha$ and a missing sum over $x'$ (we use autodiff, and test it against
  the corrected analytic gradient). Posterior draws are averaged with plain $1/N_S$ weights,
  not by their posterior density as Algorithm 1 prints (biased).
- EIG (§6, Algorithm 3): by conjugacy no inner loop is needed.

Only nodes that are not perfectly intervened on ($n\in\aleph$) contribute.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jax.scipy.special import digamma
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._learning.conjugate import (
    gamma_kl,
    poisson_path_log_likelihood,
)
from .._learning.conjugate import off_diagonal as _off
from .._learning.optimisers import AbstractVBHCOptimiser
from .._learning.posterior import AbstractRatePosterior, RatePosterior
from .._master_equation import (
    AUTOMATIC_SOLVER,
    StatisticsSolver,
    expected_statistics,
    expected_statistics_batch,
)
from .._model.ctbn import AbstractCTBN
from .._model.interventions import Intervention, exposure_scale
from .._paths.sampling import sample_trajectory
from .._paths.sufficient_statistics import NodeStatistics, node_statistics


def check_gamma_posterior(posterior, what: str) -> RatePosterior:
    """`posterior`, or a one-line `ValueError` when `what` (a computation over a Gamma
    variational family around the posterior) is asked of a posterior that is not one Gamma per
    rate."""
    if not isinstance(posterior, RatePosterior):
        raise ValueError(
            f"posterior: {what} varies a Gamma per rate around a RatePosterior, got a "
            f"{type(posterior).__name__}; use the closed-form VBHC (optimiser=None), the BHC "
            "or the EIG."
        )
    return posterior


def _not_intervened(intervention: Intervention | None, n: int, dtype) -> Array:
    if intervention is None:
        return jnp.ones((), dtype)
    return (~intervention.targets[n]).astype(dtype)


def kl_divergence(
    model: AbstractCTBN,
    other: AbstractCTBN,
    initial_state: ArrayLike,
    horizon: ArrayLike,
    *,
    intervention: Intervention | None = None,
    solver: StatisticsSolver = AUTOMATIC_SOLVER,
) -> Float[Array, ""]:
    r"""$\mathrm{KL}(p(S\mid\Lambda,i)\,\|\,p(S\mid\Lambda',i))$ between the path measures of two
    CTBNs with the same graph over $[0,\tau]$ under intervention $i$ (maths §2):
    $\sum_{n\in\aleph}\sum_{u,x,x'}\mathsf E[\hat T_n(x,u)\mid\Lambda]\,
    (\Lambda\ln\frac{\Lambda}{\Lambda'}-\Lambda+\Lambda')$. Non-negative, zero iff the rates of
    the visited configurations agree."""
    stats = expected_statistics(
        model, initial_state, horizon, intervention=intervention, solver=solver
    )
    total = jnp.asarray(0.0)
    for n, (q, q2) in enumerate(zip(model.cims, other.cims)):
        k = q.shape[-1]
        T = stats.node_dwell_times(n) * exposure_scale(intervention, n, q.dtype)
        lam = jnp.where(_off(k), q, 1.0)
        lam2 = jnp.where(_off(k), q2, 1.0)
        terms = jnp.where(_off(k), lam * jnp.log(lam / lam2) - lam + lam2, 0.0)
        # zero rates: 0 ln 0 = 0
        terms = jnp.where(_off(k) & (q == 0), q2, terms)
        total = total + _not_intervened(intervention, n, T.dtype) * (T[..., None] * terms).sum()
    return total


class ParameterDesignStatistics(eqx.Module):
    r"""Posterior averages (over $N_S$ draws $\Lambda_s\sim p(\Lambda\mid H)$, plain $1/N_S$
    weights) of the expected statistics of a future path under one intervention:

    - `transitions[n]` = $\bar m_n=\frac1{N_S}\sum_s\mathsf E[\hat M_n\mid\Lambda_s,i]$,
    - `dwell_times[n]` = $\bar t_n=\frac1{N_S}\sum_s\mathsf E[\hat T_n\mid\Lambda_s,i]$,
    - `energy` = $\frac1{N_S}\sum_s\sum_{n\in\aleph}(\mathsf E[\hat M]\ln\Lambda_s
      -\mathsf E[\hat T]\Lambda_s)$,

    all zero for perfectly intervened nodes. A node whose rates an imperfect intervention
    scales by $s_n$ counts its dwell times as the exposure $s_n\mathsf E[\hat T_n]$
    (`exposure_scale`). These are all the (V)BHC needs.
    """

    transitions: tuple[Array, ...]
    dwell_times: tuple[Array, ...]
    energy: Float[Array, ""]


def posterior_draws(posterior: AbstractRatePosterior, key: PRNGKeyArray, num_samples: int):
    """`num_samples` posterior draws of whole models (the same key gives the same draws: common
    random numbers across interventions)."""
    return jax.vmap(posterior.sample)(jr.split(key, num_samples))


@eqx.filter_jit
def design_statistics(
    posterior: AbstractRatePosterior,
    draws: AbstractCTBN,
    initial_state: ArrayLike,
    horizon: ArrayLike,
    *,
    intervention: Intervention | None = None,
    solver: StatisticsSolver = AUTOMATIC_SOLVER,
) -> ParameterDesignStatistics:
    """[`jaxctbn.criteria.ParameterDesignStatistics`][] for one intervention from a batch of posterior
    `draws` (leading axis), with one batched master-equation solve."""
    S = jax.tree_util.tree_leaves(draws)[0].shape[0]
    init = jnp.broadcast_to(jnp.asarray(initial_state), (S, *jnp.shape(initial_state)))
    ivs = (
        None
        if intervention is None
        else jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (S, *jnp.shape(a))), intervention)
    )
    stats = expected_statistics_batch(draws, init, horizon, interventions=ivs, solver=solver)
    Ms, Ts, energy = [], [], jnp.asarray(0.0)
    for n in range(len(posterior.alpha)):
        k = posterior.cardinalities[n]
        M = jax.vmap(lambda st, n=n: st.node_transitions(n))(stats)
        T = jax.vmap(lambda st, n=n: st.node_dwell_times(n))(stats)
        T = T * exposure_scale(intervention, n, T.dtype)  # a scaled node's exposure s T
        keep = _not_intervened(intervention, n, T.dtype)
        e = jax.vmap(poisson_path_log_likelihood)(draws.cims[n], M, T)
        energy = energy + keep * e.sum() / S
        Ms.append(keep * jnp.where(_off(k), M, 0.0).mean(0))
        Ts.append(keep * T.mean(0))
    return ParameterDesignStatistics(transitions=tuple(Ms), dwell_times=tuple(Ts), energy=energy)


def parameter_vbhc(
    posterior: RatePosterior,
    stats: ParameterDesignStatistics,
    kappa_alpha: tuple[Array, ...],
    kappa_beta: tuple[Array, ...],
) -> Float[Array, ""]:
    r"""$\mathrm{VBHC}(i,\kappa)=\mathrm{KL}(q_\kappa\|p(\Lambda\mid H))+\mathsf E_p\sum_{n\in\aleph}
    \{\mathsf E[\hat M](\ln\Lambda-\psi(\alpha^\kappa)+\ln\beta^\kappa)
    -\mathsf E[\hat T](\Lambda-\alpha^\kappa/\beta^\kappa)\}$ (maths §3; the paper prints a minus
    before the expectation). Differentiable in the variational parameters
    $\kappa=(\alpha^\kappa(x,x',u),\beta^\kappa(x,u))$ around a Gamma posterior (with a
    [`jaxctbn.GammaMixturePosterior`][] use the closed-form minimum,
    `parameter_vbhc_minimum`)."""
    check_gamma_posterior(posterior, "the VBHC with a numerical optimiser")
    total = stats.energy
    for a_bar, b_bar, a_k, b_k, m, t in zip(
        posterior.alpha,
        posterior.beta,
        kappa_alpha,
        kappa_beta,
        stats.transitions,
        stats.dwell_times,
    ):
        k = a_bar.shape[-1]
        kl = gamma_kl(
            jnp.where(_off(k), a_k, 1.0),
            b_k[..., None],
            jnp.where(_off(k), a_bar, 1.0),
            b_bar[..., None],
        )
        cross = m * (-digamma(jnp.where(_off(k), a_k, 1.0)) + jnp.log(b_k)[..., None])
        cross = cross + t[..., None] * a_k / b_k[..., None]
        total = total + jnp.where(_off(k), kl + cross, 0.0).sum()
    return total


def parameter_bhc(
    posterior: AbstractRatePosterior, stats: ParameterDesignStatistics
) -> Float[Array, ""]:
    r"""The Box-Hill criterion: the VBHC at $q_\kappa=p(\Lambda\mid H)$, where its KL term
    vanishes: $\mathsf E_p[\sum(\mathsf E[\hat M]\ln\Lambda-\mathsf E[\hat T]\Lambda)]
    -\sum[\bar m\,\mathsf E_p\ln\Lambda-\bar t\,\mathsf E_p\Lambda]$ (for a Gamma posterior
    $\mathsf E\ln\Lambda=\psi(\bar\alpha)-\ln\bar\beta$; for a mixture the weighted sum)."""
    total = stats.energy
    for log_rate, rate, m, t in zip(
        posterior.expected_log_rates(),
        posterior.rate_means(),
        stats.transitions,
        stats.dwell_times,
    ):
        k = rate.shape[-1]
        total = total + jnp.where(_off(k), t[..., None] * rate - m * log_rate, 0.0).sum()
    return total


def parameter_vbhc_minimum(
    posterior: AbstractRatePosterior, stats: ParameterDesignStatistics
) -> Float[Array, ""]:
    r"""$\min_q\mathrm{VBHC}$ in closed form (maths §3):
    $\mathsf E_p[\sum(\mathsf E[\hat M]\ln\Lambda-\mathsf E[\hat T]\Lambda)]
    -\ln\int p(\Lambda\mid H)\prod\Lambda^{\bar m}e^{-\Lambda\bar t}d\Lambda$ (the Gibbs
    variational principle; the minimiser is the posterior updated with $(\bar m,\bar t)$). For
    a Gamma posterior the minimiser is the Gamma $(\bar\alpha+\bar m,\bar\beta+\bar t)$ and
    the integral $\sum[\ln\Gamma(\bar\alpha+\bar m)-\ln\Gamma(\bar\alpha)+\bar\alpha\ln\bar\beta
    -(\bar\alpha+\bar m)\ln(\bar\beta+\bar t)]$; for a mixture of Gammas the minimiser is the
    mixture of the updated components reweighted by their marginal likelihoods (the variational
    family is the mixtures of as many Gammas) and the integral
    $\ln\sum_cw_cZ_c(\bar m,\bar t)$."""
    pooled = [
        NodeStatistics(transitions=m, dwell_times=t)
        for m, t in zip(stats.transitions, stats.dwell_times)
    ]
    return stats.energy - posterior.log_marginal_likelihood(pooled)


def parameter_vbhc_minimiser(posterior, stats):
    """The closed-form minimiser $(\\bar\\alpha+\\bar m, \\bar\\beta+\\bar t)$."""
    return (
        tuple(a + m for a, m in zip(posterior.alpha, stats.transitions)),
        tuple(b + t for b, t in zip(posterior.beta, stats.dwell_times)),
    )


def parameter_vbhc_minimise(
    posterior: RatePosterior, stats: ParameterDesignStatistics, optimiser: AbstractVBHCOptimiser
):
    r"""$\min_\kappa$VBHC by a numerical `optimiser` with autodiff gradients, over
    $\kappa$ in log space ($\alpha^\kappa=e^{a}$, $\beta^\kappa=e^{b}$), starting at the posterior
    $(\bar\alpha,\bar\beta)$ as Algorithm 1 does. Returns `(min VBHC, (alpha_kappa,
    beta_kappa))`; agrees with `parameter_vbhc_minimum` at convergence."""
    params = (
        tuple(jnp.log(jnp.where(_off(a.shape[-1]), a, 1.0)) for a in posterior.alpha),
        tuple(jnp.log(b) for b in posterior.beta),
    )

    def loss(p):
        return parameter_vbhc(
            posterior, stats, tuple(jnp.exp(x) for x in p[0]), tuple(jnp.exp(x) for x in p[1])
        )

    value, p = optimiser.minimise(loss, params)
    return value, (tuple(jnp.exp(x) for x in p[0]), tuple(jnp.exp(x) for x in p[1]))


def _sampled_statistics(posterior, model, key, initial_state, horizon, intervention, max_events):
    """Sample one path of `model` and return every node's statistics for the posterior's graph
    (dwell times as exposures: scaled by an imperfect intervention's rate scale)."""
    path = sample_trajectory(
        model,
        jnp.asarray(initial_state),
        horizon,
        key=key,
        intervention=intervention,
        max_events=max_events,
    )
    out = []
    for n in range(len(posterior.alpha)):
        st = node_statistics(path, n, posterior.parents[n], posterior.cardinalities)
        scale = exposure_scale(intervention, n, st.dwell_times.dtype)
        out.append(eqx.tree_at(lambda s: s.dwell_times, st, scale * st.dwell_times))
    return out


def information_gain(
    posterior: AbstractRatePosterior, model: AbstractCTBN, pooled: list[NodeStatistics]
) -> Float[Array, ""]:
    r"""$\ln p(\Lambda\mid\mathcal H,S)-\ln p(\Lambda\mid\mathcal H)=\ln p(S\mid\Lambda)-
    \ln p(S\mid\mathcal H)$ at the rates of `model` for complete-path statistics `pooled`
    (one per node; a node left out of the experiment has zero statistics): Bayes' rule with
    the posterior's marginal likelihood in closed form (a Gamma's or a mixture's)."""
    log_likelihood = sum(
        poisson_path_log_likelihood(q, st.transitions, st.dwell_times)
        for q, st in zip(model.cims, pooled)
    )
    return log_likelihood - posterior.log_marginal_likelihood(pooled)


@eqx.filter_jit
def parameter_eig(
    posterior: AbstractRatePosterior,
    initial_state: ArrayLike,
    horizon: ArrayLike,
    *,
    key: PRNGKeyArray,
    num_samples: int,
    num_paths: int = 1,
    intervention: Intervention | None = None,
    max_events: int = 512,
) -> Float[Array, ""]:
    r"""The parameter EIG by Monte Carlo (maths §6, Algorithm 3; conjugacy removes the inner loop):
    $\mathsf E_{\Lambda\sim p(\Lambda\mid H)}\mathsf E_{S\sim p(S\mid\Lambda,i)}\sum_{n\in\aleph}
    [\ln\mathrm{Gam}(\Lambda\mid\bar\alpha+\hat M,\bar\beta+\hat T)-\ln\mathrm{Gam}(\Lambda\mid
    \bar\alpha,\bar\beta)]$ with `num_samples` rate draws and `num_paths` paths each, computed
    as $\ln p(S\mid\Lambda)-\ln p(S\mid H)$ (Bayes' rule; the marginal likelihood in closed
    form, so a [`jaxctbn.GammaMixturePosterior`][] is scored exactly as well)."""
    k_draw, k_path = jr.split(key)
    draws = posterior_draws(posterior, k_draw, num_samples)
    keys = jr.split(k_path, (num_samples, num_paths))

    def one(model, key):
        stats = _sampled_statistics(
            posterior, model, key, initial_state, horizon, intervention, max_events
        )
        # a perfectly intervened node's path is the experimenter's: no statistics, no gain
        kept = [
            NodeStatistics(
                transitions=_not_intervened(intervention, n, st.dwell_times.dtype)
                * jnp.where(_off(st.transitions.shape[-1]), st.transitions, 0.0),
                dwell_times=_not_intervened(intervention, n, st.dwell_times.dtype) * st.dwell_times,
            )
            for n, st in enumerate(stats)
        ]
        return information_gain(posterior, model, kept)

    gains = jax.vmap(lambda m, ks: jax.vmap(lambda kk: one(m, kk))(ks))(draws, keys)
    return gains.mean()


@eqx.filter_jit
def parameter_eig_nested(
    posterior: AbstractRatePosterior,
    initial_state: ArrayLike,
    horizon: ArrayLike,
    *,
    key: PRNGKeyArray,
    num_samples: int,
    num_inner: int,
    num_paths: int = 1,
    intervention: Intervention | None = None,
    max_events: int = 512,
) -> Float[Array, ""]:
    r"""A truly nested Monte Carlo EIG with `num_inner` = $K$ inner draws:
    $\mathsf E_{\Lambda,S}[\ln p(S\mid\Lambda)-\ln\frac1K\sum_k p(S\mid\Lambda_k)]$ with fresh
    $\Lambda_k\sim p(\Lambda\mid H)$ per path. It is biased upwards and tends to
    `parameter_eig` as $K\to\infty$; $K=1$ estimates the BHC (maths §6). Only the
    path-likelihood terms of non-intervened nodes enter (the others cancel)."""
    k_draw, k_path, k_inner = jr.split(key, 3)
    draws = posterior_draws(posterior, k_draw, num_samples)
    keys = jr.split(k_path, (num_samples, num_paths))
    inner_keys = jr.split(k_inner, (num_samples, num_paths))

    def log_lik(model, stats):
        total = 0.0
        for n, (st, q) in enumerate(zip(stats, model.cims)):
            ll = poisson_path_log_likelihood(q, st.transitions, st.dwell_times)
            total = total + _not_intervened(intervention, n, ll.dtype) * ll
        return total

    def one(model, key, inner_key):
        stats = _sampled_statistics(
            posterior, model, key, initial_state, horizon, intervention, max_events
        )
        inner = posterior_draws(posterior, inner_key, num_inner)
        inner_ll = jax.vmap(lambda m: log_lik(m, stats))(inner)
        return log_lik(model, stats) - (jax.nn.logsumexp(inner_ll) - jnp.log(num_inner))

    gains = jax.vmap(lambda m, ks, iks: jax.vmap(lambda k, ik: one(m, k, ik))(ks, iks))(
        draws, keys, inner_keys
    )
    return gains.mean()
