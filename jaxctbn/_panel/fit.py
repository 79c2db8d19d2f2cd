r"""Maximum-likelihood and MAP fitting of the rates of a fixed graph from panel data.

The objective is the panel log-likelihood of [`jaxctbn.panel.panel_log_likelihood`][] summed over
the trajectories, plus, with a [`jaxctbn.GammaPrior`][] $\mathrm{Gam}(\alpha_n,\beta_n)$ on every
free rate of node $n$, the log prior density **in rate space** (no Jacobian term),

$$\ell(\Lambda)=\sum_r\log p(Y_r\mid\Lambda)+\sum_n\sum_{(u,x,x')\ \mathrm{free}}
\big[(\alpha_n-1)\log\Lambda_n(x,x',u)-\beta_n\Lambda_n(x,x',u)
+\alpha_n\log\beta_n-\log\Gamma(\alpha_n)\big],$$

so that the two methods, [`jaxctbn.panel.EMFit`][] and [`jaxctbn.panel.GradientFit`][], share the optimum.
Off-diagonal rates that are exactly 0 in the starting model are **structural zeros** (R msm's
`qmatrix`) and stay exactly 0; every other off-diagonal rate is free.

**The box.** With $\tau$ the median positive gap between consecutive observations of a
trajectory, $\tau_{\min}$ the shortest and $\tau_{\max}$ the longest (all 1 when no trajectory
has two observations), the free rates are kept in
$[\lambda_{\mathrm{lo}},\lambda_{\mathrm{hi}}]=[10^{-12}/\tau,\ L/(\tau_{\max}\sum_n(k_n-1))]$
with $L=10^8$ ($L$ = `fb_max_terms`/2 with [`jaxctbn.Uniformisation`][], so that its
forward-backward never runs out of terms): the data cannot tell a rate below
$\lambda_{\mathrm{lo}}$ from 0, above $\lambda_{\mathrm{hi}}$ the process equilibrates within
every gap, and the largest exit rate times the longest gap stays below $L$, far inside the
range of [`jaxctbn.MatrixExponential`][]. The fit is the optimum of $\ell$ over that box, so the
log-likelihood stays finite (and no NaN appears) when the unconstrained maximum lies at a rate
of 0 or $\infty$ (a state never left in the data; data consistent with instantaneous
equilibration). Because an optimiser only creeps towards $\infty$ (the objective flattens
out), after it stops the rates with $\lambda\tau_{\min}\ge1$ are tried at the top of the box
(scaled together, ratios kept) and kept there when the objective does not decrease (by more
than the tolerance). Rates at a boundary are flagged in [`jaxctbn.panel.RateFit`][]:

- `at_lower_bound`: $\lambda\tau<10^{-6}$ (less than one expected jump in a million typical
  gaps): the data drive the rate to 0.
- `at_upper_bound`: $\lambda$ at $\lambda_{\mathrm{hi}}$, or $\lambda\tau_{\min}\ge20$: the
  process leaves the state (to within $e^{-20}\approx2\times10^{-9}$) within every gap, so the
  data bound the rate only from below: it is driven to $\infty$, or indistinguishable from it.
  The fitted value of such a rate is not an estimate (ratios between such rates may be).

These are thresholds, not tests: an optimiser approaches 0 slowly and stops when the objective
stops changing, and the push to the top of the box is rejected when a rate that is still
bounded is among those tried together.
"""

from __future__ import annotations

import dataclasses
from typing import cast

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, PRNGKeyArray

from .._learning.priors import GammaPrior
from .._master_equation import AbstractMasterEquationSolver
from .._model.ctbn import CTBN
from .._model.interventions import is_concrete
from .._programs import run_program
from .buckets import PanelBuckets
from .checks import check_possible
from .covariates import Covariates
from .fit_arguments import (
    DEFAULT_METHOD,
    DEFAULT_PANEL_SOLVER,
    check_fit_covariates,
    checked_fit_arguments,
    tolerance_as_data,
)
from .fit_methods import AbstractRateFitMethod, GradientFit, SquaremFit
from .fit_problem import PUSH, fit_problem
from .gap_groups import covariate_classes
from .observations import Emissions, PanelObservations
from .rate_fit import RateFit
from .sampled_em import MonteCarloEMFit, check_monte_carlo_em, monte_carlo_em_fit

# --------------------------------------------------------------------------- entry point


def fit_rates(
    model: CTBN,
    observations: PanelObservations | PanelBuckets,
    *,
    method: AbstractRateFitMethod | MonteCarloEMFit | None = None,
    prior: GammaPrior | None = None,
    emissions: Emissions | None = None,
    initial_distribution: ArrayLike | None = None,
    solver: AbstractMasterEquationSolver = DEFAULT_PANEL_SOLVER,
    covariates: Covariates | None = None,
    key: PRNGKeyArray | None = None,
) -> RateFit:
    r"""Maximum-likelihood (or, with `prior`, MAP) rates of a fixed graph from panel data.

    Maximises the panel log-likelihood summed over the trajectories (conditional on each
    trajectory's first observation, R msm's convention, unless `initial_distribution` is
    given) plus, with a prior, the Gamma log density of the free rates in rate space (no
    Jacobian term),

    $$\ell(\Lambda)=\sum_r\log p(Y_r\mid\Lambda)+\sum_n\sum_{(u,x,x')\ \mathrm{free}}
    \big[(\alpha_n-1)\log\Lambda_n(x,x',u)-\beta_n\Lambda_n(x,x',u)
    +\alpha_n\log\beta_n-\log\Gamma(\alpha_n)\big].$$
    The CIMs of `model` are the starting values; its off-diagonal rates that are exactly
    0 are **structural zeros** and stay 0. Free rates are kept in the box
    $[10^{-12}/\tau,\ 10^8/(\tau_{\max}\sum_n(k_n-1))]$ ($\tau$ the median and $\tau_{\max}$ the
    longest positive gap between consecutive observations; starting values are clipped into
    it), and the result flags rates driven to the boundary: `at_lower_bound` where
    $\lambda\tau<10^{-6}$, `at_upper_bound` at the top of the box or where
    $\lambda\tau_{\min}\ge20$ ($\tau_{\min}$ the shortest gap: the state is left within every
    gap). With [`jaxctbn.Uniformisation`][], $10^8$ is replaced by its `fb_max_terms`/2. An
    optimiser only creeps towards a rate of $\infty$, so after it stops the rates with
    $\lambda\tau_{\min}\ge1$ are tried together at the top of the box (ratios kept) and kept
    there when the objective does not decrease by more than the tolerance. The fitted value
    of a flagged rate is not an estimate: the data bound it on one side only.

    A node learns only from the trajectories in which it is not perfectly intervened on (the
    pooling rule of [`jaxctbn.RatePosterior`][]); imperfect interventions that scale its rates
    by $c$ are taken into account ($\lambda\leftarrow\sum M/\sum cT$ in the EM step), and a
    node whose CIMs an intervention replaces learns nothing from those observations.

    **Arguments:**

    - `model`: a [`jaxctbn.CTBN`][]: the graph, the structural zeros and the starting rates.
    - `observations`: [`jaxctbn.panel.PanelObservations`][] (one trajectory or a batch), or a
      [`jaxctbn.panel.PanelBuckets`][] (trajectories of very unequal lengths).
    - `method`: [`jaxctbn.panel.SquaremFit`][] (default: accelerated EM, which stops only at a
      small projected gradient), [`jaxctbn.panel.EMFit`][] or [`jaxctbn.panel.GradientFit`][],
      with their `tolerance` and `max_iterations`; or [`jaxctbn.panel.MonteCarloEMFit`][]
      (EM with a sampled E-step, for networks beyond exact forward-backward: exact states, no
      `emissions`, `initial_distribution` or `covariates`, no box; needs `key`).
    - `prior`: `None` (maximum likelihood) or a [`jaxctbn.GammaPrior`][]
      $\mathrm{Gam}(\alpha_n,\beta_n)$ on every free rate of node $n$ (scalars or one value per
      node): the MAP, whose M-step is the mode $(\alpha-1+\bar M)/(\beta+\bar T)$ clipped into
      the box. With $\alpha<1$ the density is unbounded at 0, and a rate with few transitions
      has its mode at the bottom of the box.
    - `emissions`, `initial_distribution`: as for [`jaxctbn.panel.panel_log_likelihood`][] (fixed,
      not fitted).
    - `covariates`: `None`, or [`jaxctbn.panel.Covariates`][]: covariates per trajectory
      (baseline) or per observation (time-varying; the periods of
      [`with_time_periods`][jaxctbn.panel.PanelObservations.with_time_periods] among them) with log-linear effects on chosen
      rates, fitted jointly with the rates by
      [`jaxctbn.panel.GradientFit`][] (the default then; the EM methods are refused: the
      effects have no closed-form update); the result's `effects` are the log hazard ratios
      and `model` the rates at the covariates' means. Baseline covariates with few distinct
      rows (categorical ones: each combination of levels a class) share one table of
      exponentials per class and interval length, as a fit without covariates does; a
      continuous or time-varying covariate gives each interval its own exponential (slower).
    - `solver`: the master-equation solver of the forward-backward pass. Default
      [`jaxctbn.MatrixExponential`][]: panel gaps are long compared with the rates' time
      scale, and the dense exponential has no limit on rate times gap (its cost grows with the
      number of global states $S$ as $S^3$). For larger networks pass
      [`jaxctbn.Uniformisation`][], whose smoothed statistics need the largest exit rate times
      the longest gap below about its `fb_max_terms` (it raises otherwise): the top of the
      box is lowered to keep it so, and a rate that the data put above it is flagged.
    - `key`: a PRNG key, for [`jaxctbn.panel.MonteCarloEMFit`][] only.

    **Returns:** a [`jaxctbn.panel.RateFit`][].

    **Speed.** Called eagerly on data without interventions and with the dense solver, the
    intervals are grouped by length: $e^{hW}$ is computed once per distinct gap $h$, and since
    each interval's integral $\int_0^he^{tW^\top}Be^{(h-t)W^\top}dt$ is linear in the rank-one
    $B=\hat\alpha b^\top/Z$, one Van Loan block per distinct gap serves all its intervals
    (regular visit schedules: a handful of exponentials per iteration, whatever the number of
    subjects). Under an outer `jit` the times are traced and the grouping cannot be computed:
    every interval then gets its own exponentials (same result, tested).

    Pure and `jax.jit`-compatible end to end (`eqx.filter_jit(fit_rates)`): both optimisers
    run in `jax.lax.while_loop`. Bad arguments raise `ValueError` naming the argument; an
    observation that is impossible under the starting model (a structural zero, a perfect
    intervention, an emission probability 0) raises as in
    [`jaxctbn.panel.panel_log_likelihood`][], naming the trajectory.

    **Example:**

    ```python
    fit = jaxctbn.panel.fit_rates(start, observations, method=jaxctbn.panel.GradientFit())
    fit.model.cims, fit.converged, fit.at_lower_bound
    ```
    """
    if isinstance(method, MonteCarloEMFit):  # no filter: none of the problem below applies
        check_monte_carlo_em(model, observations, key=key, emissions=emissions,
                             initial_distribution=initial_distribution, covariates=covariates)  # fmt: skip
        return monte_carlo_em_fit(model, cast(PanelObservations, observations), method, prior,
                                  cast(PRNGKeyArray, key))  # fmt: skip
    if method is None:
        method = DEFAULT_METHOD if covariates is None else GradientFit()
    parameters, groups, method = checked_fit_arguments(
        model, observations, method, prior, emissions, solver, "fit_rates"
    )
    if covariates is not None:
        check_fit_covariates(covariates, observations, method)
        # one generator per covariate class, or one per trajectory (`groups` None)
        groups = covariate_classes(groups, covariates, observations)
    fit, bad = run_program(
        _program_name(method),
        _fit,
        model,
        observations,
        method,
        parameters,
        emissions,
        initial_distribution,
        solver,
        groups,
        covariates,
    )
    fit = check_possible(fit, bad, observations)
    if isinstance(method, SquaremFit) and method.polish is not None:
        fit = _polished(fit, method.polish, observations, parameters, emissions,
                        initial_distribution, solver, groups, covariates)  # fmt: skip
    return fit


def _program_name(method) -> str:
    """The name of the fit's program (`run_program`'s): a gradient fit's is a program of
    another kind, which the command line compiles with XLA's defaults where it compiles an EM
    fit's with less optimisation."""
    return "fit_rates_gradient" if isinstance(method, GradientFit) else "fit_rates"


def _polished(fit: RateFit, polish, observations, *arguments) -> RateFit:
    """`fit` continued by `polish` when it stopped unconverged (concrete values only): the
    better objective of the two, labelled with both methods."""
    if not is_concrete(fit.converged) or bool(fit.converged):
        return fit
    polish = tolerance_as_data(polish, jnp.result_type(*fit.model.cims))
    name = _program_name(polish)
    second, bad = run_program(name, _fit, fit.model, observations, polish, *arguments)
    second = check_possible(second, bad, observations)
    # (a likelihood fit: its objective and trace are arrays, never None)
    objective, objective_before = cast(Array, second.log_posterior), cast(Array, fit.log_posterior)
    if not float(objective) >= float(objective_before):
        return fit
    trace, trace_before = cast(Array, second.trace), cast(Array, fit.trace)
    return dataclasses.replace(
        second,
        method=f"{fit.method}+{second.method}",
        iterations=fit.iterations + second.iterations,
        trace=jnp.concatenate([trace_before[: int(fit.iterations) + 1], trace]),
    )


@eqx.filter_jit
def _fit(
    model, observations, method, prior, emissions, initial_distribution, solver, groups, covariates
):
    problem = fit_problem(
        model, observations, prior, emissions, initial_distribution, solver, groups, covariates
    )
    outcome = method.fit(problem)
    effects = outcome.effects
    rates = problem.clip(outcome.rates)  # (the optimisers stay inside; rounding)
    # a rate driven to infinity creeps up (the objective flattens out); try the fast rates at
    # the top of the box, ratios kept, and keep that when the objective does not decrease
    candidates = tuple(f & (q * problem.shortest >= PUSH) for q, f in zip(rates, problem.free))
    fastest = jnp.max(jnp.stack([jnp.max(jnp.where(c, q, 0)) for q, c in zip(rates, candidates)]))
    factor = jnp.where(fastest > 0, problem.upper / jnp.where(fastest > 0, fastest, 1), 1)
    pushed = tuple(
        jnp.where(c, jnp.minimum(q * factor, problem.upper), q) for q, c in zip(rates, candidates)
    )
    # the optimiser's last objective is at `rates`; without a prior its log density is 0
    log_posterior = outcome.objective
    log_likelihood = log_posterior - problem.log_prior(rates)

    def pushed_evaluation(pushed):
        likelihood = problem.log_likelihood(pushed, effects)[0]
        return likelihood, likelihood + problem.log_prior(pushed)

    def no_candidates(pushed):
        minus_infinity = jnp.full((), -jnp.inf, log_posterior.dtype)
        return minus_infinity, minus_infinity

    # one more filter pass only when some rate is a candidate
    pushed_likelihood, pushed_posterior = jax.lax.cond(
        fastest > 0, pushed_evaluation, no_candidates, pushed
    )
    tol = jnp.asarray(method.tolerance, log_posterior.dtype)
    accept = (
        (fastest > 0)
        & jnp.isfinite(pushed_posterior)
        & (pushed_posterior >= log_posterior - tol * (1 + jnp.abs(log_posterior)))
    )
    rates = tuple(jnp.where(accept, p, q) for p, q in zip(pushed, rates))
    log_likelihood = jnp.where(accept, pushed_likelihood, log_likelihood)
    log_posterior = jnp.where(accept, pushed_posterior, log_posterior)
    lower, upper = problem.bound_flags(rates)
    effects_at_bound = None if effects is None else problem.effects_at_bound(rates, effects)
    fit = RateFit(
        model=problem.with_rates(rates),
        log_likelihood=log_likelihood,
        log_posterior=log_posterior,
        converged=outcome.converged,
        iterations=outcome.iterations,
        trace=outcome.trace,
        at_lower_bound=lower,
        at_upper_bound=upper,
        method=method.name,
        effects=effects,
        covariate_means=problem.covariate_means,
        effects_at_bound=effects_at_bound,
        num_parameters=jnp.sum(jnp.stack([jnp.sum(f) for f in problem.free]))
        + (0 if problem.effect_masks is None else jnp.sum(problem.effect_parameters_free())),
    )
    return fit, outcome.bad
