"""The result of [`jaxctbn.panel.fit_rates`][]: the fitted model, how the fit went, and what
can be asked of it (intervals, prevalence, likelihood-ratio tests)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple, cast

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from .._learning.frames import interval_columns
from .._learning.priors import GammaPrior
from .._master_equation import AbstractMasterEquationSolver
from .._model.ctbn import CTBN
from .._model.frames import (
    assignment_label,
    free_rate_masks,
    free_rates,
    optional_import,
    parent_states,
)
from .buckets import PanelBuckets
from .comparison import LikelihoodRatioTest, likelihood_ratio_test
from .covariates import Covariates
from .fit_arguments import DEFAULT_PANEL_SOLVER
from .observations import Emissions, PanelObservations
from .prevalence import Prevalence, prevalence
from .uncertainty import RateUncertainty, rate_uncertainty

if TYPE_CHECKING:
    import pandas as pd


class RateFit(eqx.Module):
    r"""The result of [`jaxctbn.panel.fit_rates`][].

    - `model`: the fitted [`jaxctbn.CTBN`][] (same graph, names and structural zeros as the
      start).
    - `log_likelihood`: $\sum_r\log p(Y_r\mid\hat\Lambda)$ at the fit, as
      [`jaxctbn.panel.panel_log_likelihood`][] with the same arguments (conditional on each
      trajectory's first observation unless an `initial_distribution` was given).
    - `log_posterior`: the objective maximised, `log_likelihood` plus the Gamma log density of
      the free rates (equal to `log_likelihood` without a prior); unnormalised.
    - `converged`: whether the stopping criterion was met before `max_iterations`.
    - `iterations`: the number of iterations run.
    - `trace`: `(max_iterations + 1,)`, the objective at the start and after each iteration,
      padded with the final value.
    - `at_lower_bound`, `at_upper_bound`: per node, booleans `(configs, k, k)`: free rates
      driven to about 0, or to about $\infty$ (see [`jaxctbn.panel.fit_rates`][]; `False` for
      structural zeros and the diagonal).
    - `method`: `"squarem"`, `"em"`, `"gradient"` (`"squarem+gradient"` when polished) or
      `"monte-carlo-em"` (static).
    - `effects`: with covariates, per node `(C, configs, k, k)`: the log hazard ratio
      $\beta_c$ of one unit of covariate $c$ on each rate (0 where it does not act); `model`
      then holds the rates at the covariates' means `covariate_means` `(C,)`. `None` without.
    - `num_parameters`: the free rates (those at a bound included) plus the covariate effects
      fitted: the parameter count of AIC and of
      [`RateFit.likelihood_ratio_test`][jaxctbn.panel.RateFit.likelihood_ratio_test].
    - `effects_at_bound`: with covariates, per node `(C, configs, k, k)`: the effects the data
      drive to $\pm\infty$ (a hazard ratio of 0 or $\infty$: not an estimate, like a rate at
      a bound): those whose rate, for the subjects at the covariate's lowest or highest value,
      meets the rate flags above ($\lambda e^{\beta\tilde z}\tau<10^{-6}$ or
      $\lambda e^{\beta\tilde z}\tau_{\min}\ge20$), or at their own bound
      $|\beta|\max_r|\tilde z_{rc}|=30$. `None` without.
    - `rate_trace`, `infeasible_updates`: for [`jaxctbn.panel.MonteCarloEMFit`][], every
      iterate's rates (per node, a leading iteration axis) and, per iteration, the Gibbs
      updates that kept their path (`None` for the other methods).

    **A Monte Carlo EM fit** ([`jaxctbn.panel.MonteCarloEMFit`][], for networks beyond exact
    forward-backward) has no likelihood: `log_likelihood`, `log_posterior`, `converged`,
    `trace` and the bound flags are `None` (compute [`jaxctbn.panel.panel_log_likelihood`][]
    of its `model` where the network is small enough), and its `model` is the average of the
    last half of the iterates.
    """

    model: CTBN
    log_likelihood: Float[Array, ""] | None
    log_posterior: Float[Array, ""] | None
    converged: Bool[Array, ""] | None
    iterations: Int[Array, ""]
    trace: Float[Array, " iterations_plus_one"] | None
    at_lower_bound: tuple[Bool[Array, "_configs _k _k"], ...] | None
    at_upper_bound: tuple[Bool[Array, "_configs _k _k"], ...] | None
    num_parameters: Int[Array, ""]
    method: str = eqx.field(static=True)
    effects: tuple[Float[Array, "covariates _configs _k _k"], ...] | None = None
    covariate_means: Float[Array, " covariates"] | None = None
    effects_at_bound: tuple[Bool[Array, "covariates _configs _k _k"], ...] | None = None
    rate_trace: tuple[Float[Array, "iterations _configs _k _k"], ...] | None = None
    infeasible_updates: Int[Array, " iterations"] | None = None

    def uncertainty(
        self,
        observations: PanelObservations | PanelBuckets,
        *,
        prior: GammaPrior | None = None,
        emissions: Emissions | None = None,
        initial_distribution: ArrayLike | None = None,
        solver: AbstractMasterEquationSolver = DEFAULT_PANEL_SOLVER,
        level: float = 0.95,
        covariates: Covariates | None = None,
    ) -> RateUncertainty:
        r"""Standard errors and `level` intervals of this fit's rates (and covariate effects),
        from the exact observed information in the log-rates at the fit (R msm's
        `qmatrix.msm(ci="delta")`): the delta method's standard errors and intervals symmetric
        on the log scale ([`jaxctbn.panel.RateUncertainty`][]).

        **Arguments:** as given to the fit: the same `observations`, `prior`, `emissions`,
        `initial_distribution`, `solver` and `covariates` (the fit's `effects` are taken from
        it); `level` in $(0, 1)$ (default 0.95).

        **Returns:** a [`jaxctbn.panel.RateUncertainty`][].

        The information costs one reverse-over-reverse pass through the filter per parameter
        (free rate, and effect; a structural zero's row is not computed), a few at a time (a
        Hessian, not an optimisation).
        Without covariates the exponentials are shared by intervals of equal length (cav:
        0.1 s); with covariates every interval has its own (the 16-state pbcseq network of
        `notebooks/clinician_pbcseq.ipynb`, 312 patients, 56 parameters with a time-varying
        covariate: 740 s for the fit and its intervals on one CPU core). Pure and
        `jax.jit`-compatible; bad arguments raise `ValueError` as for
        [`jaxctbn.panel.fit_rates`][].

        **Example:**

        ```python
        fit = jaxctbn.panel.fit_rates(start, observations)
        uncertainty = fit.uncertainty(observations)
        uncertainty.lower[0], uncertainty.upper[0], uncertainty.positive_definite
        ```
        """
        self._check_covariates(covariates)
        return rate_uncertainty(
            self.model,
            observations,
            prior=prior,
            emissions=emissions,
            initial_distribution=initial_distribution,
            solver=solver,
            level=level,
            covariates=covariates,
            effects=self.effects,
        )

    def prevalence(
        self,
        observations: PanelObservations,
        times: ArrayLike,
        *,
        covariates: Covariates | None = None,
    ) -> Prevalence:
        r"""Observed and expected counts of each node's states over `times` under this fit (R
        msm's `prevalence.msm`; see [`jaxctbn.panel.Prevalence`][]): a check of the fit's
        calibration.

        **Arguments:** `observations`: the [`jaxctbn.panel.PanelObservations`][] it was fitted
        to, one batch axis (read with `PanelObservations.read_csv`, not buckets); `times`: finite, increasing;
        `covariates`: those of the fit, when it has covariates (the forecast then uses each
        trajectory's scaled rates).

        **Returns:** a [`jaxctbn.panel.Prevalence`][]. Percentages are `observed / at_risk` and
        `expected / at_risk` (the same denominator).
        """
        self._check_covariates(covariates)
        return prevalence(
            self.model, observations, times, covariates=covariates, effects=self.effects
        )

    def likelihood_ratio_test(self, larger: RateFit) -> LikelihoodRatioTest:
        r"""The likelihood-ratio test of this fit nested in `larger` (a
        [`jaxctbn.panel.RateFit`][] of the same data, maximum likelihood), and both fits' AIC
        (R msm's `lrtest.msm` and `AIC`; see [`jaxctbn.panel.LikelihoodRatioTest`][]).

        For this (smaller) model nested in the larger one, with maximised log-likelihoods
        $\ell_0\le\ell_1$ and $p_0<p_1$ parameters, the statistic $D=2(\ell_1-\ell_0)$ is
        asymptotically $\chi^2_{p_1-p_0}$ under the smaller model; each fit's
        $\mathrm{AIC}=-2\ell+2p$. Nesting (the smaller model's parents and covariates a subset
        of the larger's, the same data) is the caller's to ensure.

        Refused with a `ValueError`: `larger` not a `RateFit`, networks with different nodes.
        Inside `jit`, an error when `larger` does not have more parameters or a fit is a MAP
        fit. A negative statistic (the larger fit stopped short of its optimum) gives the
        p-value 1; refit it.
        """
        if not isinstance(larger, RateFit):
            raise ValueError("larger: expected a RateFit of jaxctbn.panel.fit_rates.")
        for fit, which in ((self, "this fit"), (larger, "larger")):
            if fit.log_likelihood is None:
                raise ValueError(
                    f"{which}: a Monte Carlo EM fit has no likelihood to test; fit both models "
                    "with a likelihood method (SquaremFit, EMFit or GradientFit)."
                )
        return likelihood_ratio_test(self, larger)

    def to_frame(self, uncertainty: RateUncertainty | None = None) -> pd.DataFrame:
        r"""The fitted rates as a pandas table, one row per free rate (R msm's
        `qmatrix.msm` as rows; the `rates` of `jaxctbn fit`'s JSON, and its `at_lower_bound`
        and `at_upper_bound` lists as flags; [Files](../formats.md#python-results)).

        **Arguments:**

        - `uncertainty`: `None`, or this fit's
          [`RateFit.uncertainty`][jaxctbn.panel.RateFit.uncertainty] for the standard errors
          and intervals.

        **Returns:** a `pandas.DataFrame` with columns `node`, `parent_states` (`A=0,B=1`;
        `""` without parents), `from`, `to`, `rate` (at the covariates' means with
        covariates); with `uncertainty`, `se`, `ci95_lower`, `ci95_upper` (at its `level`:
        `ci90_...` at 0.9; missing, NaN, where the rate is not estimated) and `estimated`;
        and, unless the fit has no flags (Monte Carlo EM), `at_lower_bound` and
        `at_upper_bound`. Eager, on the host."""
        import numpy as np

        pd = optional_import("pandas", "RateFit.to_frame")
        cims = [np.asarray(q) for q in self.model.cims]
        free = free_rate_masks(self.model)
        if uncertainty is not None:
            shapes = [np.shape(r) for r in uncertainty.rates]
            if shapes != [q.shape for q in cims]:
                raise ValueError(
                    f"uncertainty: rates of shapes {shapes}, but this fit's CIMs are "
                    f"{[q.shape for q in cims]}; give this fit's RateFit.uncertainty(...)."
                )
        columns = ["node", "parent_states", "from", "to", "rate"]
        if uncertainty is not None:
            lower, upper = interval_columns(uncertainty.level)
            columns += ["se", lower, upper, "estimated"]
            se, low, high, estimated = (
                [np.asarray(a) for a in arrays]
                for arrays in (
                    uncertainty.standard_errors,
                    uncertainty.lower,
                    uncertainty.upper,
                    uncertainty.estimated,
                )
            )
        flags = {
            name: [np.asarray(f) for f in value]
            for name, value in (
                ("at_lower_bound", self.at_lower_bound),
                ("at_upper_bound", self.at_upper_bound),
            )
            if value is not None
        }
        columns += list(flags)
        rows = []
        for n, u, x, y, states in free_rates(self.model, free):
            row = [self.model.names[n], assignment_label(states), x, y, float(cims[n][u, x, y])]
            if uncertainty is not None:
                known = bool(estimated[n][u, x, y])
                row += [float(a[n][u, x, y]) if known else np.nan for a in (se, low, high)]
                row.append(known)
            row += [bool(f[n][u, x, y]) for f in flags.values()]
            rows.append(row)
        return pd.DataFrame(rows, columns=columns)

    def effects_frame(self, covariates: Covariates, uncertainty: RateUncertainty) -> pd.DataFrame:
        r"""The covariates' effects as a pandas table, one row per covariate and rate it acts
        on (R msm's `hazard.msm` as rows; the `covariate_effects` of `jaxctbn fit`'s JSON).

        **Arguments:**

        - `covariates`: the fit's [`jaxctbn.panel.Covariates`][].
        - `uncertainty`: this fit's
          [`RateFit.uncertainty`][jaxctbn.panel.RateFit.uncertainty] with the same covariates.

        **Returns:** a `pandas.DataFrame` with columns `covariate`, `node`, `parent_states`,
        `from`, `to`, `hazard_ratio` ($e^{\hat\beta}$), `log_hazard_ratio` ($\hat\beta$),
        `se` (of $\hat\beta$), the hazard ratio's interval `ci95_lower`, `ci95_upper` (at the
        uncertainty's `level`; NaN where the effect is not estimated) and `estimated`. Refused
        with a `ValueError`: a fit without covariates, an `uncertainty` without effects. Eager,
        on the host."""
        pd = optional_import("pandas", "RateFit.effects_frame")
        self._check_covariates(covariates)
        if uncertainty.effects is None:
            raise ValueError(
                "uncertainty: it has no covariate effects; give RateFit.uncertainty(observations, "
                "covariates=covariates)."
            )
        lower, upper = interval_columns(uncertainty.level)
        columns = ["covariate", "node", "parent_states", "from", "to", "hazard_ratio"]
        columns += ["log_hazard_ratio", "se", lower, upper, "estimated"]
        rows = [
            [e.covariate, e.node, assignment_label(e.parent_states), e.source, e.target]
            + [math.exp(e.log_hazard_ratio), e.log_hazard_ratio]
            + ([e.se, e.lower, e.upper] if e.estimated else [math.nan] * 3)
            + [e.estimated]
            for e in covariate_effects(self.model, covariates, uncertainty)
        ]
        return pd.DataFrame(rows, columns=columns)

    def _check_covariates(self, covariates) -> None:
        if (covariates is None) != (self.effects is None):
            fitted = "with" if self.effects is not None else "without"
            raise ValueError(
                f"covariates: this fit was made {fitted} covariates; give the covariates of the "
                "fit (and only then)."
            )


class CovariateEffect(NamedTuple):
    """One covariate's effect on one rate, as the effect tables list it."""

    covariate: str
    node: str
    parent_states: dict
    source: int
    target: int
    log_hazard_ratio: float
    se: float
    lower: float
    upper: float
    estimated: bool


def covariate_effects(model, covariates: Covariates, uncertainty: RateUncertainty) -> list:
    """Every covariate's effect on every free rate it acts on (covariate by covariate within a
    node, nodes in order, rates in `(configuration, from, to)` order): the rows of
    [`RateFit.effects_frame`][jaxctbn.panel.RateFit.effects_frame] and of the `fit` command's
    `covariate_effects`."""
    import numpy as np

    masks = covariates.masks(tuple(jnp.asarray(f) for f in free_rate_masks(model)))
    tables = (
        uncertainty.effects,
        uncertainty.effect_standard_errors,
        uncertainty.hazard_ratio_lower,
        uncertainty.hazard_ratio_upper,
    )
    out = []
    for n, name in enumerate(model.names):
        configs = parent_states(model, n)
        beta, se, lo, hi = (np.asarray(cast(tuple, a)[n]) for a in tables)
        mask = np.asarray(masks[n])
        for c, label in enumerate(covariates.names):
            for u, x, y in zip(*np.nonzero(mask[c])):
                i = (c, u, x, y)
                finite = math.isfinite(float(se[i]))
                out.append(
                    CovariateEffect(
                        covariate=label,
                        node=name,
                        parent_states=configs[int(u)],
                        source=int(x),
                        target=int(y),
                        log_hazard_ratio=float(beta[i]),
                        se=float(se[i]),
                        lower=float(lo[i]),
                        upper=float(hi[i]),
                        estimated=finite,
                    )
                )
    return out
