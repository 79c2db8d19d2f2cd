r"""Parameter design criteria when the next experiment's outcome is a **panel** (maths §7): the
global state seen at $0<t_1<\dots<t_K\le\tau$, not the whole path.

With $N_S$ posterior draws $\Lambda_s$ and $N_J$ reparameterised draws $\Lambda'_j(\kappa)$ from
the variational family $q_\kappa$ (the same standard variates for every $\kappa$, every candidate
and every visit schedule: common random numbers),

$$\widehat{\mathrm{VBHC}}(i,\kappa)=\mathrm{KL}(q_\kappa\|p(\Lambda\mid\mathcal H))+\frac1{N_SN_J}
\sum_{s,j}\mathrm{KL}\big(p(Y\mid\Lambda_s,i)\,\|\,p(Y\mid\Lambda'_j(\kappa),i)\big),$$

the panel KL being exact (`panel_kl_divergence`). The BHC is its value at
$q_\kappa=p(\Lambda\mid\mathcal H)$; the VBHC its minimum over $\kappa$ by an optax optimiser
with autodiff gradients through the Gamma draws (implicit reparameterisation) and the matrix
exponentials, started at the posterior, so the reported minimum is never above the BHC
estimated with the same draws. Both bound the panel EIG from above, which is estimated by
nested Monte Carlo with the exact panel likelihood as the inner term.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._learning.conjugate import gamma_kl
from .._learning.conjugate import off_diagonal as _off
from .._learning.gamma_mixture import GammaMixturePosterior
from .._learning.optimisers import AbstractVBHCOptimiser, Adam
from .._learning.posterior import AbstractRatePosterior, RatePosterior
from .._model.ctbn import AbstractCTBN
from .._model.interventions import Intervention
from .._panel.outcome_law import (
    PanelLaw,
    law_log_likelihood,
    pairwise_panel_law_kl,
    panel_law,
    sample_law_outcome,
)
from .parameter import check_gamma_posterior

if TYPE_CHECKING:
    import pandas as pd

#: The optimiser of the panel VBHC when the criterion names none (it has no closed form).
PANEL_VBHC_OPTIMISER = Adam(learning_rate=0.1, steps=100)


def draw_laws(
    draws: AbstractCTBN,
    initial_state: ArrayLike,
    times: Array,
    intervention: Intervention | None,
) -> PanelLaw:
    """The panel laws of a batch of models (leading axis) under one experiment."""
    return jax.vmap(lambda m: panel_law(m, initial_state, times, intervention))(draws)


def _gamma_near(posterior: AbstractRatePosterior) -> RatePosterior:
    """The posterior itself, or for a mixture of Gammas the Gamma per rate with its means
    (`GammaMixturePosterior.moment_matched`): the start of the variational family."""
    if isinstance(posterior, GammaMixturePosterior):
        return posterior.moment_matched()
    return check_gamma_posterior(posterior, "the panel VBHC")


def _variational(posterior: AbstractRatePosterior, log_kappa) -> RatePosterior:
    log_alpha, log_beta = log_kappa
    return eqx.tree_at(
        lambda p: (p.alpha, p.beta),
        _gamma_near(posterior),
        (tuple(jnp.exp(a) for a in log_alpha), tuple(jnp.exp(b) for b in log_beta)),
    )


def posterior_log_kappa(posterior: AbstractRatePosterior):
    """The variational parameters (in log space) of $q_\\kappa$ = the posterior, the VBHC's
    start (for a mixture of Gammas: its moment-matched Gamma)."""
    posterior = _gamma_near(posterior)
    return (
        tuple(jnp.log(jnp.where(_off(a.shape[-1]), a, 1.0)) for a in posterior.alpha),
        tuple(jnp.log(b) for b in posterior.beta),
    )


def gamma_family_kl(q: RatePosterior, p: RatePosterior) -> Float[Array, ""]:
    r"""$\mathrm{KL}(q\|p)$ between two products of Gammas over the free rates."""
    total = jnp.zeros(())
    for a_q, b_q, a_p, b_p in zip(q.alpha, q.beta, p.alpha, p.beta):
        k = a_q.shape[-1]
        kl = gamma_kl(
            jnp.where(_off(k), a_q, 1.0),
            b_q[..., None],
            jnp.where(_off(k), a_p, 1.0),
            b_p[..., None],
        )
        total = total + jnp.where(_off(k), kl, 0.0).sum()
    return jnp.maximum(total, 0)  # >= 0 exactly; at q = p rounding can leave -1e-14


def panel_parameter_vbhc(
    posterior: AbstractRatePosterior,
    laws: PanelLaw,
    log_kappa,
    variational_keys: PRNGKeyArray,
    initial_state: ArrayLike,
    times: Array,
    intervention: Intervention | None,
) -> Float[Array, ""]:
    r"""$\widehat{\mathrm{VBHC}}(i,\kappa)$ of the module page: `laws` are the panel laws of the
    $N_S$ posterior draws (leading axis), `variational_keys` the $N_J$ keys of the
    reparameterised draws from $q_\kappa$, `log_kappa` = $(\ln\alpha^\kappa,\ln\beta^\kappa)$.
    Differentiable in `log_kappa` and `times`. With a [`jaxctbn.GammaMixturePosterior`][]
    $p$, $q_\kappa$ ranges over a Gamma per rate (started at the mixture's moment-matched
    Gamma) and $\mathrm{KL}(q_\kappa\|p)$ is estimated from the same $N_J$ draws,
    $\frac1{N_J}\sum_j[\ln q_\kappa(\Lambda'_j)-\ln p(\Lambda'_j)]$ (the mixture's density in
    closed form)."""
    q = _variational(posterior, log_kappa)
    q_draws = jax.vmap(q.sample)(variational_keys)
    return _vbhc_of_draws(posterior, q, laws, q_draws, initial_state, times, intervention)


def _vbhc_of_draws(posterior, q, laws, q_draws, initial_state, times, intervention):
    if isinstance(posterior, GammaMixturePosterior):
        free = posterior.free_rates()
        q_draws = eqx.tree_at(
            lambda m: m.cims,
            q_draws,
            [jnp.where(keep, c, 0.0) for c, keep in zip(q_draws.cims, free)],
        )
        kl = jax.vmap(lambda m: q.log_density(m) - posterior.log_density(m))(q_draws).mean()
    else:
        kl = gamma_family_kl(q, posterior)
    q_laws = draw_laws(q_draws, initial_state, times, intervention)
    return kl + pairwise_panel_law_kl(laws, q_laws).mean()


class Variational(eqx.Module):
    r"""The keys of the reparameterised draws from $q_\kappa$, and those draws at
    $q_\kappa$ = the posterior (shared by every candidate: the BHC's)."""

    keys: PRNGKeyArray
    at_posterior: AbstractCTBN


def posterior_variational_draws(
    posterior: AbstractRatePosterior, keys: PRNGKeyArray
) -> AbstractCTBN:
    r"""The reparameterised draws at $q_\kappa$ = the posterior (the same numbers as inside
    `panel_parameter_vbhc` at `posterior_log_kappa(posterior)`); for a mixture of Gammas, its
    own draws."""
    if not isinstance(posterior, RatePosterior):
        return jax.vmap(posterior.sample)(keys)
    q = _variational(posterior, posterior_log_kappa(posterior))
    return jax.vmap(q.sample)(keys)


def panel_parameter_bhc(
    posterior: AbstractRatePosterior,
    laws: PanelLaw,
    q_draws: AbstractCTBN,
    initial_state: ArrayLike,
    times: Array,
    intervention: Intervention | None,
) -> Float[Array, ""]:
    r"""`panel_parameter_vbhc` at $q_\kappa$ = the posterior, from its draws drawn once
    (`posterior_variational_draws`) rather than per candidate: the mean panel KL between
    pairs of independent posterior draws (the KL term vanishes at $q$ = the posterior, so a
    mixture of Gammas is scored the same way)."""
    if not isinstance(posterior, RatePosterior):
        q_laws = draw_laws(q_draws, initial_state, times, intervention)
        return pairwise_panel_law_kl(laws, q_laws).mean()
    q = _variational(posterior, posterior_log_kappa(posterior))
    return _vbhc_of_draws(posterior, q, laws, q_draws, initial_state, times, intervention)


def panel_parameter_vbhc_minimum(
    posterior: AbstractRatePosterior,
    laws: PanelLaw,
    variational_keys: PRNGKeyArray,
    initial_state: ArrayLike,
    times: Array,
    intervention: Intervention | None,
    optimiser: AbstractVBHCOptimiser,
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """`(min over kappa, BHC)`: the VBHC minimised by `optimiser` from the posterior (the
    smaller of its end point and its start, so never above the BHC of the same draws), and
    its value at the start."""

    # Differentiated in the posterior, the laws, the visit times and the intervention (its
    # strengths) by the envelope theorem, d/dθ min_κ V(κ, θ) = ∂_θ V(κ*, θ) at the
    # optimiser's end point κ* (and ∂_θ V(κ_0(θ), θ) for the start): not through the unrolled
    # optimiser, whose derivative would need second derivatives of the reparameterised Gamma
    # draws (reverse mode has none: `random_gamma_grad` is a while loop). Undifferentiated,
    # the program is the optimiser's loop alone.
    data = (posterior, laws, variational_keys, initial_state, times, intervention)

    def loss(log_kappa, data):
        return panel_parameter_vbhc(data[0], data[1], log_kappa, *data[2:])

    @jax.custom_jvp
    def minimum(data):
        value, bhc, end = optimiser.minimise_from_start(
            lambda k: loss(k, data), posterior_log_kappa(data[0])
        )
        return value, bhc, end

    @minimum.defjvp
    def _envelope(primals, tangents):
        (data,), (data_dot,) = primals, tangents
        value, bhc, end = minimum(data)
        # by gradients (the laws' matrix functions are reverse-mode only), dotted with the
        # tangents of the floating-point leaves
        free, fixed = eqx.partition(data, eqx.is_inexact_array)
        free_dot, _ = eqx.partition(data_dot, eqx.is_inexact_array)

        def at(point):
            def of(free):
                data = eqx.combine(free, fixed)
                return loss(point(data), data)

            gradient = jax.grad(of)(free)
            leaves = zip(jax.tree.leaves(gradient), jax.tree.leaves(free_dot))
            return sum((jnp.vdot(g, d) for g, d in leaves), jnp.zeros((), value.dtype))

        bhc_dot = at(lambda d: posterior_log_kappa(d[0]))
        value_dot = at(lambda d: jax.lax.stop_gradient(end))
        return (value, bhc, end), (value_dot, bhc_dot, jax.tree.map(jnp.zeros_like, end))

    value, bhc, _ = minimum(data)
    return jnp.where(jnp.isfinite(value), jnp.minimum(value, bhc), bhc), bhc


def warm_vbhc_steps(
    posterior: AbstractRatePosterior,
    laws: PanelLaw,
    log_kappa,
    variational_keys: PRNGKeyArray,
    initial_state: ArrayLike,
    times: Array,
    intervention: Intervention | None,
    *,
    steps: int = 5,
    learning_rate: float = 0.1,
):
    """A few Adam steps on the variational parameters at fixed times, from `log_kappa` (the
    inner minimisation of the visit-time search, warm-started from the previous step's)."""
    import optax

    def loss(p):
        return panel_parameter_vbhc(
            posterior, laws, p, variational_keys, initial_state, times, intervention
        )

    opt = optax.adam(learning_rate)
    grad = jax.grad(loss)

    def step(carry, _):
        p, state = carry
        g = jax.tree_util.tree_map(lambda x: jnp.where(jnp.isfinite(x), x, 0), grad(p))
        updates, state = opt.update(g, state, p)
        return (optax.apply_updates(p, updates), state), None

    (p, _), _ = jax.lax.scan(step, (log_kappa, opt.init(log_kappa)), None, length=steps)
    return p


class PanelDesign(eqx.Module):
    """Every candidate's score with a panel outcome: `scores` `(C,)`, the visit `times` `(C, K)`
    they were computed at (chosen per candidate with `PanelOutcome(num_visits=K)`, else the given
    times), and `equally_spaced_scores` `(C,)` at $t_k=\tau k/K$ (with given times: the
    scores themselves)."""

    scores: Float[Array, " candidates"]
    times: Float[Array, "candidates visits"]
    equally_spaced_scores: Float[Array, " candidates"]

    def to_frame(self, candidates: Intervention, names: Sequence[str]) -> pd.DataFrame:
        """Every candidate's score and visit times as a pandas table (the `scores` of
        `jaxctbn design --outcome panel --visits K`'s JSON).

        **Arguments:**

        - `candidates`: the candidates that were scored (a batch of interventions).
        - `names`: the network's node names.

        **Returns:** a `pandas.DataFrame`, one row per candidate: `intervention`
        ([`Intervention.to_frame`][jaxctbn.Intervention.to_frame]'s), `score`,
        `observation_times` (a tuple of the visit times) and `score_equally_spaced`. Eager,
        on the host."""
        frame = candidates.to_frame(names)
        if len(frame) != np.shape(self.scores)[0]:
            raise ValueError(
                f"candidates: {len(frame)} interventions for {np.shape(self.scores)[0]} scores."
            )
        times = np.asarray(self.times)
        return frame.assign(
            score=np.asarray(self.scores, float),
            observation_times=[tuple(float(t) for t in row) for row in times],
            score_equally_spaced=np.asarray(self.equally_spaced_scores, float),
        )


def panel_parameter_eig(
    posterior: AbstractRatePosterior,
    draws: AbstractCTBN,
    inner_draws: AbstractCTBN,
    initial_state: ArrayLike,
    times: Array,
    intervention: Intervention | None,
    *,
    key: PRNGKeyArray,
    num_paths: int,
    emission: Array | None = None,
) -> Float[Array, ""]:
    r"""The panel EIG by nested Monte Carlo:
    $\frac1{N_SR}\sum_{s,r}\big[\ln p(Y_{sr}\mid\Lambda_s)-\ln\frac1J\sum_j
    p(Y_{sr}\mid\Lambda_j)\big]$ with $R$ = `num_paths` outcomes $Y_{sr}$ of each outer draw
    $\Lambda_s$ (`draws`) and $J$ inner draws $\Lambda_j$ (`inner_draws`, independent of the
    outer ones, shared by all outcomes), every likelihood exact. Biased upwards for finite $J$
    (the bias falls as $1/J$); tends to the EIG. With an `emission` matrix `(S, M)`,
    $E(s,y)=\prod_nE_n(s_n,y_n)$ over the global states and symbols, the outcome is the symbols
    recorded at the visits (misclassified or unmeasured nodes), each likelihood by the forward
    filter (maths §7)."""
    del posterior
    laws = draw_laws(draws, initial_state, times, intervention)
    inner = draw_laws(inner_draws, initial_state, times, intervention)
    S = laws.transitions.shape[0]
    keys = jr.split(key, (S, num_paths))

    def gain(law, k):
        outcome = sample_law_outcome(law, k, emission)
        own = law_log_likelihood(law, outcome, emission)
        others = jax.vmap(lambda other: law_log_likelihood(other, outcome, emission))(inner)
        J = others.shape[0]
        return own - (jax.nn.logsumexp(others) - jnp.log(J))

    gains = jax.vmap(lambda law, ks: jax.vmap(lambda k: gain(law, k))(ks))(laws, keys)
    return gains.mean()


def visit_times_from_logits(logits: Array, horizon: Array) -> Array:
    r"""$K$ visit times in $(0,\tau]$ from $K+1$ unconstrained logits: $t_k=\tau\sum_{j\le k}
    \mathrm{softmax}(z)_j$, the last logit the slack after $t_K$ (ordered and in range by
    construction)."""
    return horizon * jnp.cumsum(jax.nn.softmax(logits))[:-1]


#: The search starts from equal spacing over $(0,f\tau]$ for each of these $f$, ascending from
#: the best: a fast process forgets its start long before $\tau$, where the criterion is flat.
SEARCH_STARTS = (1.0, 1 / 2, 1 / 4, 1 / 8, 1 / 16)


def equal_spacing_logits(num_visits: int, fraction: float, dtype) -> Array:
    """Logits of equally spaced visits over $(0,f\tau]$ ($f$ = `fraction`; with $f=1$ the
    slack after the last visit is $e^{-12}$ of a gap)."""
    gaps = jnp.full((num_visits,), fraction / num_visits, dtype)
    slack = jnp.full((1,), max(1 - fraction, float(np.exp(-12)) / num_visits), dtype)
    return jnp.log(jnp.concatenate([gaps, slack]))


def optimise_visit_times(
    value: Callable[[Array, Any], Array],
    refine: Callable[[Array, Any], Any],
    carry0,
    horizon: Array,
    num_visits: int,
    *,
    steps: int,
    learning_rate: float,
) -> Array:
    r"""Visit times after `steps` Adam ascent steps on `value(times, carry)` over the logits of
    `visit_times_from_logits`, from the best (by `value` at `carry0`) of the equally spaced
    schedules over $(0,f\tau]$, $f$ in `SEARCH_STARTS`. Before each step `carry =
    refine(times, carry)` (not differentiated: warm starts of an inner minimisation, which make
    values of different steps incomparable, so the last iterate is returned and the caller
    compares it with equal spacing on the exact criterion). A step whose gradient is not finite
    is skipped."""
    import optax

    dtype = horizon.dtype
    opt = optax.adam(learning_rate)
    starts = jnp.stack([equal_spacing_logits(num_visits, f, dtype) for f in SEARCH_STARTS])
    start_values = jax.vmap(lambda z: value(visit_times_from_logits(z, horizon), carry0))(starts)
    start_values = jnp.where(jnp.isfinite(start_values), start_values, -jnp.inf)
    z0 = starts[jnp.argmax(start_values)]
    grad = jax.grad(lambda z, carry: -value(visit_times_from_logits(z, horizon), carry))

    def step(state, _):
        z, opt_state, carry = state
        carry = refine(jax.lax.stop_gradient(visit_times_from_logits(z, horizon)), carry)
        g = grad(z, carry)
        ok = jnp.all(jnp.isfinite(g))
        updates, new_state = opt.update(jnp.where(ok, g, 0), opt_state, z)
        z = jnp.where(ok, cast(Array, optax.apply_updates(z, updates)), z)
        return (z, new_state, carry), None

    (z, _, _), _ = jax.lax.scan(step, (z0, opt.init(z0), carry0), None, length=steps)
    return visit_times_from_logits(z, horizon)
