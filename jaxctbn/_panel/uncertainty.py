r"""Standard errors and intervals for the rates fitted to panel data: the observed information.

At the fit $\hat\Lambda$ of [`jaxctbn.panel.fit_rates`][], the objective $\ell$ (the panel
log-likelihood, plus the Gamma log density with a prior) is differentiated twice in the
log-rates $\theta=\log\Lambda$ of the free rates, exactly, by automatic differentiation of the
forward filter (reverse over reverse, `jax.jacrev` of `jax.grad`; no finite differences). The observed
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

**Not positive definite.** When $\mathcal I$ restricted to the estimated rates is not positive
definite (its smallest eigenvalue at most $10^{-10}$ times its largest: the fit is not at a
maximum, or some combination of rates is not identified by the data), `positive_definite` is
`False` and every standard error is $+\infty$, every interval $[0,\infty)$ (R msm: "Hessian is
not positive definite", no standard errors).
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats
from jaxtyping import Array, ArrayLike, Bool, Float

from .._learning.priors import GammaPrior
from .._master_equation.dense_linalg import solve_batched
from .._master_equation.solvers import AbstractMasterEquationSolver
from .._model.ctbn import CTBN
from .buckets import PanelBuckets
from .fit import DEFAULT_METHOD, DEFAULT_PANEL_SOLVER, _checked_arguments, _problem
from .observations import Emissions, PanelObservations

# the smallest eigenvalue of a positive definite information, relative to the largest
_DEFINITE = 1e-10


class RateUncertainty(eqx.Module):
    r"""What [`jaxctbn.panel.rate_uncertainty`][] returns. Per node, arrays shaped like its CIMs
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
    - `level` (static): the intervals' level."""

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


def _off_diagonal(shapes) -> list[np.ndarray]:
    """Per node, the flat indices (into the raveled `(configs, k, k)`) of the off-diagonal
    entries, in `(configs, from, to)` order."""
    out = []
    for configs, k, _ in shapes:
        off = ~np.eye(k, dtype=bool)
        out.append(np.flatnonzero(np.broadcast_to(off, (configs, k, k))))
    return out


def rate_uncertainty(
    model: CTBN,
    observations: PanelObservations | PanelBuckets,
    *,
    prior: GammaPrior | None = None,
    emissions: Emissions | None = None,
    initial_distribution: ArrayLike | None = None,
    solver: AbstractMasterEquationSolver = DEFAULT_PANEL_SOLVER,
    level: float = 0.95,
) -> RateUncertainty:
    r"""Standard errors and intervals of the rates fitted to panel data, from the exact observed
    information in the log-rates (see the module docstring).

    **Arguments:** `model`: the fitted [`jaxctbn.CTBN`][] (`fit.model` of
    [`jaxctbn.panel.fit_rates`][]; its rates that are exactly 0 are structural zeros); the
    other arguments as given to the fit (the same `observations`, `prior`, `emissions`,
    `initial_distribution` and `solver`); `level` in $(0, 1)$ (default 0.95).

    **Returns:** a [`jaxctbn.panel.RateUncertainty`][].

    The information costs one reverse-over-reverse pass through the filter per off-diagonal
    rate (a Hessian, not an optimisation). Pure and `jax.jit`-compatible; bad arguments raise
    `ValueError` as for [`jaxctbn.panel.fit_rates`][].

    **Example:**

    ```python
    fit = jaxctbn.panel.fit_rates(start, observations)
    uncertainty = jaxctbn.panel.rate_uncertainty(fit.model, observations)
    uncertainty.lower[0], uncertainty.upper[0], uncertainty.positive_definite
    ```
    """
    if isinstance(level, bool) or not isinstance(level, int | float | np.floating):
        raise ValueError(f"level: expected a number in (0, 1), got {level!r}.")
    if not (0 < float(level) < 1):
        raise ValueError(f"level: expected a number in (0, 1), got {level}.")
    parameters, groups, _ = _checked_arguments(
        model, observations, DEFAULT_METHOD, prior, emissions, solver, "rate_uncertainty"
    )
    return _uncertainty(
        model, observations, parameters, emissions, initial_distribution, solver, groups, level
    )


@eqx.filter_jit
def _uncertainty(
    model, observations, prior, emissions, initial_distribution, solver, groups, level: float
) -> RateUncertainty:
    z = float(scipy.stats.norm.ppf(0.5 + float(level) / 2))  # (level is static)
    problem = _problem(model, observations, prior, emissions, initial_distribution, solver, groups)
    rates = problem.start()  # the fit, its free rates clipped into the box
    lower_flag, upper_flag = problem.bound_flags(rates)
    shapes = [q.shape for q in rates]
    where = _off_diagonal(shapes)
    sizes = [len(w) for w in where]
    dtype = rates[0].dtype

    def flat(arrays):
        return jnp.concatenate([a.reshape(-1)[w] for a, w in zip(arrays, where)])

    def unflat(vector, fill):
        out, start = [], 0
        for shape, w, size in zip(shapes, where, sizes):
            full = jnp.full((math.prod(shape),), fill, vector.dtype)
            out.append(full.at[w].set(vector[start : start + size]).reshape(shape))
            start += size
        return tuple(out)

    free = flat(problem.free)
    theta0 = jnp.log(jnp.where(free, flat(rates), 1))

    def objective(theta):
        rates = unflat(jnp.exp(theta), 1)
        return problem.objective(tuple(jnp.where(f, q, 0) for q, f in zip(rates, problem.free)))

    # reverse over reverse: the filter's custom VJPs (small products, exponentials) have no
    # forward-mode rule
    information = -jax.jacrev(jax.grad(objective))(theta0)
    information = jnp.where(free[:, None] & free[None, :], information, 0)
    interior = free & ~flat(lower_flag) & ~flat(upper_flag)
    both = interior[:, None] & interior[None, :]
    P = theta0.shape[0]
    eye = jnp.eye(P, dtype=dtype)
    restricted = jnp.where(both, information, eye)  # the held-fixed rates decoupled
    restricted = (restricted + restricted.T) / 2
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
    se_log = jnp.where(estimated, jnp.sqrt(jnp.maximum(variance, 0)), jnp.where(free, jnp.inf, 0))
    rate = flat(rates)
    spread = jnp.exp(z * jnp.where(estimated, se_log, 0))
    lower = jnp.where(estimated, rate / spread, 0)
    upper = jnp.where(estimated, rate * spread, jnp.where(free, jnp.inf, 0))
    se = jnp.where(estimated, rate * se_log, jnp.where(free, jnp.inf, 0))
    return RateUncertainty(
        rates=tuple(jnp.where(f, q, 0) for q, f in zip(rates, problem.free)),
        log_rate_standard_errors=unflat(se_log, 0),
        standard_errors=unflat(se, 0),
        lower=unflat(lower, 0),
        upper=unflat(upper, 0),
        estimated=unflat(estimated, False),
        at_lower_bound=lower_flag,
        at_upper_bound=upper_flag,
        information=information,
        covariance=covariance,
        positive_definite=definite,
        level=float(level),
    )
