r"""Standard errors and intervals for the rates fitted to panel data: the observed information.

At the fit $\hat\Lambda$ of [`jaxctbn.panel.fit_rates`][], the objective $\ell$ (the panel
log-likelihood, plus the Gamma log density with a prior) is differentiated twice in the
log-rates $\theta=\log\Lambda$ of the free rates, exactly, by automatic differentiation of the
forward filter (reverse over reverse: the VJP of `jax.grad`, applied to the basis vectors a
few at a time; no finite differences). The observed
information is $\mathcal I=-\nabla^2_\theta\ell(\hat\theta)$ and, when it is positive definite,
the covariance of $\hat\theta$ is $\mathcal I^{-1}$ (asymptotically; with a prior, the Laplace
approximation of the posterior of $\theta$). Per free rate:

$$\mathrm{se}(\log\hat\lambda)=\sqrt{(\mathcal I^{-1})_{\lambda\lambda}},\qquad
\mathrm{se}(\hat\lambda)=\hat\lambda\,\mathrm{se}(\log\hat\lambda)\ \text{(delta method)},$$

$$\text{interval at level }1-a:\quad\hat\lambda\exp\!\big(\mp z_{1-a/2}\,
\mathrm{se}(\log\hat\lambda)\big),$$

symmetric on the log scale, as R msm reports intensities (`qmatrix.msm`, `ci = "delta"`).

**Rates at a bound.** A rate flagged `at_lower_bound` or `at_upper_bound` by the fit is not an
estimate (the data bound it on one side only, and $\hat\theta$ is not a stationary point in its
direction): it is held fixed, left out of $\mathcal I$, and reported with a standard error of
$+\infty$ and the interval $[0,\infty)$. The others' intervals are then conditional on it.

**Not identified.** An eigenvalue of $\mathcal I$ (over the estimated parameters) of
magnitude at most $10^{-10}$ times the largest is a direction the data do not identify (an
effect driven towards $\pm\infty$ along a flat ridge, with the rate it acts on): the parameter
with the largest component in it is held fixed like a rate at a bound (standard error
$+\infty$, the others conditional on it), for up to three rounds.

**Not positive definite.** When $\mathcal I$ restricted to the estimated rates is not positive
definite (its smallest eigenvalue at most $10^{-10}$ times its largest: the fit is not at a
maximum, or some combination of rates is not identified by the data), `positive_definite` is
`False` and every standard error is $+\infty$, every interval $[0,\infty)$ (R msm: "Hessian is
not positive definite", no standard errors).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from .._errors import error_if
from .._learning.priors import GammaPrior
from .._master_equation import (
    AbstractMasterEquationSolver,
    gap_tables_twice_differentiated,
    solve_batched,
)
from .._model.ctbn import CTBN
from .._model.interventions import is_concrete
from .._programs import run_program
from .buckets import PanelBuckets
from .covariates import Covariates
from .fit_arguments import (
    DEFAULT_METHOD,
    DEFAULT_PANEL_SOLVER,
    check_fit_covariates,
    checked_fit_arguments,
)
from .fit_methods import GradientFit
from .fit_problem import fit_problem
from .gap_groups import covariate_classes
from .observations import Emissions, PanelObservations

# the smallest eigenvalue of a positive definite information, relative to the largest
_DEFINITE = 1e-10
# parameters whose row of the information is computed together (memory grows with it)
_HESSIAN_CHUNK = 8
# rounds of holding fixed the parameters of the information's near-null directions
_UNIDENTIFIED_ROUNDS = 3


class RateUncertainty(eqx.Module):
    r"""What [`RateFit.uncertainty`][jaxctbn.panel.RateFit.uncertainty] returns. Per node, arrays shaped like its CIMs
    `(configs, k, k)`:

    - `rates`: the fitted rates $\hat\lambda$ (0 on the diagonal and for structural zeros);
    - `log_rate_standard_errors`: $\mathrm{se}(\log\hat\lambda)$; $+\infty$ for a free rate
      that is not estimated (at a bound, or the information not positive definite), 0 for
      structural zeros and the diagonal;
    - `standard_errors`: $\hat\lambda\,\mathrm{se}(\log\hat\lambda)$ (delta method);
    - `lower`, `upper`: the interval at `level`, $\hat\lambda e^{\mp z\,\mathrm{se}}$;
    - `estimated`: free, not at a bound, and the information positive definite;
    - `at_lower_bound`, `at_upper_bound`: as in [`jaxctbn.panel.RateFit`][].

    And over the off-diagonal entries of every node's CIMs, flattened node by node in
    `(configs, from, to)` order (the diagonal left out; structural zeros included, with zero
    rows):

    - `information` `(P, P)`: $-\nabla^2_\theta\ell$ in the log-rates;
    - `covariance` `(P, P)`: $\mathcal I^{-1}$ over the estimated rates (0 elsewhere; $+\infty$
      on the diagonal of the estimated ones when `positive_definite` is `False`);
    - `positive_definite`: whether $\mathcal I$ over the estimated rates is positive definite;
    - `level` (static): the intervals' level.

    With covariates, per node `(C, configs, k, k)` (`None` without): `effects` (the log hazard
    ratios $\hat\beta$), `effect_standard_errors` ($\mathrm{se}(\hat\beta)$; $+\infty$ where
    not estimated: an effect on a rate at a bound is held fixed with it, and so is an effect
    the data drive to $\pm\infty$, [`jaxctbn.panel.RateFit`][]'s `effects_at_bound`),
    `hazard_ratio_lower`, `hazard_ratio_upper` ($e^{\hat\beta\mp z\,\mathrm{se}}$) and
    `effect_estimated`; `information` and `covariance` then continue, after the log-rates,
    with the effect parameters of [`jaxctbn.panel.Covariates.effect_groups`][] (one per entry
    of the effects, node by node, unless `shared` ties entries to one parameter)."""

    rates: tuple[Float[Array, "_configs _k _k"], ...]
    log_rate_standard_errors: tuple[Float[Array, "_configs _k _k"], ...]
    standard_errors: tuple[Float[Array, "_configs _k _k"], ...]
    lower: tuple[Float[Array, "_configs _k _k"], ...]
    upper: tuple[Float[Array, "_configs _k _k"], ...]
    estimated: tuple[Bool[Array, "_configs _k _k"], ...]
    at_lower_bound: tuple[Bool[Array, "_configs _k _k"], ...]
    at_upper_bound: tuple[Bool[Array, "_configs _k _k"], ...]
    information: Float[Array, "parameters parameters"]
    covariance: Float[Array, "parameters parameters"]
    positive_definite: Bool[Array, ""]
    level: float = eqx.field(static=True)
    effects: tuple[Float[Array, "covariates _configs _k _k"], ...] | None = None
    effect_standard_errors: tuple[Float[Array, "covariates _configs _k _k"], ...] | None = None
    hazard_ratio_lower: tuple[Float[Array, "covariates _configs _k _k"], ...] | None = None
    hazard_ratio_upper: tuple[Float[Array, "covariates _configs _k _k"], ...] | None = None
    effect_estimated: tuple[Bool[Array, "covariates _configs _k _k"], ...] | None = None


def _off_diagonal(shapes) -> list[np.ndarray]:
    """Per node, the flat indices (into the raveled `(configs, k, k)`) of the off-diagonal
    entries, in `(configs, from, to)` order."""
    out = []
    for configs, k, _ in shapes:
        off = ~np.eye(k, dtype=bool)
        out.append(np.flatnonzero(np.broadcast_to(off, (configs, k, k))))
    return out


def _information_rows(model: CTBN, covariates: Covariates | None) -> tuple[int, ...] | None:
    """The parameters whose rows of the information are computed (static): every free log-rate
    (a structural zero's row is set to 0 anyway) and every effect; None (every row) when the
    model's zeros are not concrete (a model traced by an outer `jit`)."""
    if not all(is_concrete(c) for c in model.cims):
        return None
    shapes = [c.shape for c in model.cims]
    free = np.concatenate(
        [np.asarray(c).reshape(-1)[w] != 0 for c, w in zip(model.cims, _off_diagonal(shapes))]
    )
    P = len(free)
    num_effects = 0 if covariates is None else covariates.effect_groups(shapes)[1]
    return tuple(int(i) for i in np.flatnonzero(free)) + tuple(range(P, P + num_effects))


def rate_uncertainty(
    model: CTBN,
    observations: PanelObservations | PanelBuckets,
    *,
    prior: GammaPrior | None = None,
    emissions: Emissions | None = None,
    initial_distribution: ArrayLike | None = None,
    solver: AbstractMasterEquationSolver = DEFAULT_PANEL_SOLVER,
    level: float = 0.95,
    covariates: Covariates | None = None,
    effects: Sequence[ArrayLike] | None = None,
) -> RateUncertainty:
    r"""Standard errors and `level` intervals at `model` (a fit's rates; `effects` the fit's
    covariate effects), from the exact observed information in the log-rates (module
    docstring): what [`RateFit.uncertainty`][jaxctbn.panel.RateFit.uncertainty] computes, and
    the command line with a fit read from its JSON. Bad arguments raise `ValueError` as for
    [`jaxctbn.panel.fit_rates`][]."""
    if isinstance(level, bool) or not isinstance(level, int | float | np.floating):
        raise ValueError(f"level: expected a number in (0, 1), got {level!r}.")
    if not (0 < float(level) < 1):
        raise ValueError(f"level: expected a number in (0, 1), got {level}.")
    parameters, groups, _ = checked_fit_arguments(
        model, observations, DEFAULT_METHOD, prior, emissions, solver, "rate_uncertainty"
    )
    if (covariates is None) != (effects is None):
        raise ValueError(
            "covariates, effects: give both (a fit with covariates: its `effects`) or neither."
        )
    if covariates is not None:
        check_fit_covariates(covariates, observations, GradientFit())
        # one generator per covariate class, or one per trajectory (`groups` None)
        groups = covariate_classes(groups, covariates, observations)
        effects = tuple(jnp.asarray(b) for b in cast(Sequence[ArrayLike], effects))
    return run_program(
        "rate_uncertainty",
        _uncertainty,
        model,
        observations,
        parameters,
        emissions,
        initial_distribution,
        solver,
        groups,
        level,
        covariates,
        effects,
        _information_rows(model, covariates),
    )


@eqx.filter_jit
def _uncertainty(
    model,
    observations,
    prior,
    emissions,
    initial_distribution,
    solver,
    groups,
    level: float,
    covariates,
    effects,
    rows: tuple[int, ...] | None = None,
) -> RateUncertainty:
    z = statistics.NormalDist().inv_cdf(0.5 + float(level) / 2)  # (level is static)
    problem = fit_problem(
        model, observations, prior, emissions, initial_distribution, solver, groups, covariates
    )
    rates = problem.start()  # the fit, its free rates clipped into the box
    lower_flag, upper_flag = problem.bound_flags(rates)
    shapes = [q.shape for q in rates]
    where = _off_diagonal(shapes)
    sizes = [len(w) for w in where]
    dtype = rates[0].dtype
    P = sum(sizes)

    def flat(arrays):
        return jnp.concatenate([a.reshape(-1)[w] for a, w in zip(arrays, where)])

    def unflat(vector, fill):
        out, start = [], 0
        for shape, w, size in zip(shapes, where, sizes):
            full = jnp.full((math.prod(shape),), fill, vector.dtype)
            out.append(full.at[w].set(vector[start : start + size]).reshape(shape))
            start += size
        return tuple(out)

    # the effect parameters (covariates) after the log-rates: one per effect of
    # `Covariates.effect_groups` (one per entry of each node's (C, configs, k, k) unless shared)
    masks = problem.effect_masks
    free = flat(problem.free)
    interior = free & ~flat(lower_flag) & ~flat(upper_flag)
    theta0 = jnp.log(jnp.where(free, flat(rates), 1))
    if masks is not None:
        assert effects is not None and problem.effect_bound is not None
        beta0 = problem.parameters_of(tuple(jnp.asarray(b, dtype) for b in effects))
        effect_free = problem.effect_parameters_free()
        # an effect on a rate at a bound is no more identified than the rate, and one at its own
        # bound (|effect| * max |centred covariate| = 30: the data drive it to +-infinity) is
        # not an estimate either: both held fixed
        rate_interior = unflat(interior, False)
        at_bound = problem.effects_at_bound(rates, problem.effects_from(beta0))
        on_bounded = problem._per_parameter(
            tuple(
                jnp.broadcast_to(~r[None], m.shape) | a
                for m, r, a in zip(masks, rate_interior, at_bound)
            ),
            "max",
            False,
        )
        effect_interior = effect_free & ~on_bounded
        theta0 = jnp.concatenate([theta0, beta0])
        free = jnp.concatenate([free, effect_free])
        interior = jnp.concatenate([interior, effect_interior])

    def objective(theta):
        rates = unflat(jnp.exp(theta[:P]), 1)
        rates = tuple(jnp.where(f, q, 0) for q, f in zip(rates, problem.free))
        return problem.objective(rates, None if masks is None else problem.effects_from(theta[P:]))

    # the rows of the free parameters only (`rows`, static): the others are set to 0 below
    num = theta0.shape[0]
    index = np.arange(num, dtype=np.int32) if rows is None else np.asarray(rows, np.int32)
    # reverse over reverse: the filter's custom VJPs (small products, exponentials) have no
    # forward-mode rule
    # (`jax.jacrev` would apply the gradient's VJP to all P basis vectors at once, holding P
    # copies of its per-interval intermediates: 27 GB for 120 parameters on the pbcseq
    # visits; the VJP is taken once and applied to _HESSIAN_CHUNK of them at a time)
    # (the gap tables' derivative by one route, `gap_tables_twice_differentiated`: the same
    # values, its own derivative traced once)
    with gap_tables_twice_differentiated():
        _, second = jax.vjp(jax.grad(objective), theta0)
        computed = -jax.lax.map(
            lambda v: second(v)[0],
            jnp.eye(num, dtype=dtype)[index],
            batch_size=max(1, min(_HESSIAN_CHUNK, len(index))),
        )
    information = jnp.zeros((num, num), dtype).at[index].set(computed)
    information = (information + information.T) / 2
    information = jnp.where(free[:, None] & free[None, :], information, 0)
    information = error_if(
        information,
        ~jnp.all(jnp.isfinite(information)),
        "model: the panel log-likelihood is not twice differentiable to a finite value at "
        "these rates (an observation impossible under them?); pass the fitted model.",
    )
    eye = jnp.eye(theta0.shape[0], dtype=dtype)
    # parameters the data do not identify (an effect driven towards +-infinity along a flat
    # ridge) are held fixed too, rather than leaving the whole information singular: the one
    # that dominates each near-null direction, for a few rounds (the rest conditional on them)
    for _ in range(_UNIDENTIFIED_ROUNDS):
        both = interior[:, None] & interior[None, :]
        restricted = jnp.where(both, information, eye)  # the held-fixed parameters decoupled
        eigenvalues, vectors = jnp.linalg.eigh(restricted)
        null = jnp.abs(eigenvalues) <= _DEFINITE * jnp.maximum(eigenvalues[-1], 0)
        dominant = jnp.argmax(jnp.abs(vectors) * interior[:, None], axis=0)
        unidentified = jnp.zeros_like(interior).at[dominant].max(null)
        interior = interior & ~unidentified
    both = interior[:, None] & interior[None, :]
    restricted = jnp.where(both, information, eye)
    eigenvalues = jnp.linalg.eigvalsh(restricted)
    definite = eigenvalues[0] > _DEFINITE * jnp.maximum(eigenvalues[-1], 0)
    definite = definite & jnp.all(jnp.isfinite(restricted))
    safe = jnp.where(definite, restricted, eye)
    inverse = solve_batched(safe[None], eye[None])[0]  # no batched LAPACK under a vmap
    inverse = (inverse + inverse.T) / 2
    estimated = interior & definite
    covariance = jnp.where(both & definite, inverse, 0)
    covariance = jnp.where(jnp.diag(interior & ~definite), jnp.inf, covariance)
    variance = jnp.where(estimated, jnp.diagonal(inverse), 0)
    se = jnp.where(estimated, jnp.sqrt(jnp.maximum(variance, 0)), jnp.where(free, jnp.inf, 0))
    spread = jnp.exp(z * jnp.where(estimated, se, 0))
    se_log = se[:P]
    rate = flat(rates)
    lower = jnp.where(estimated[:P], rate / spread[:P], 0)
    upper = jnp.where(estimated[:P], rate * spread[:P], jnp.where(free[:P], jnp.inf, 0))
    rate_se = jnp.where(estimated[:P], rate * se_log, jnp.where(free[:P], jnp.inf, 0))
    effect_fields = {}
    if masks is not None:
        ratio = jnp.exp(theta0[P:])
        per_entry = problem.effects_from
        effect_fields = dict(
            effects=per_entry(jnp.where(free[P:], theta0[P:], 0)),
            effect_standard_errors=per_entry(se[P:]),
            hazard_ratio_lower=per_entry(
                jnp.where(estimated[P:], ratio / spread[P:], jnp.where(free[P:], 0, 1)), 1
            ),
            hazard_ratio_upper=per_entry(
                jnp.where(estimated[P:], ratio * spread[P:], jnp.where(free[P:], jnp.inf, 1)),
                1,
            ),
            effect_estimated=tuple(
                m & (e > 0) for m, e in zip(masks, per_entry(estimated[P:].astype(dtype)))
            ),
        )
    return RateUncertainty(
        rates=tuple(jnp.where(f, q, 0) for q, f in zip(rates, problem.free)),
        log_rate_standard_errors=unflat(se_log, 0),
        standard_errors=unflat(rate_se, 0),
        lower=unflat(lower, 0),
        upper=unflat(upper, 0),
        estimated=unflat(estimated[:P], False),
        at_lower_bound=lower_flag,
        at_upper_bound=upper_flag,
        information=information,
        covariance=covariance,
        positive_definite=definite,
        level=float(level),
        **effect_fields,
    )
