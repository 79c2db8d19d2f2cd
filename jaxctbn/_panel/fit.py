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

import abc
import dataclasses
import math
from typing import Any, ClassVar, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from .._learning.priors import GammaPrior, check_prior
from .._master_equation.solvers import (
    AbstractMasterEquationSolver,
    MatrixExponential,
    Uniformisation,
)
from .._model.ctbn import CTBN, with_diagonal
from .._model.interventions import is_concrete
from .buckets import PanelBuckets, as_flat_buckets, split_rows
from .covariates import Covariates, centred_values, scales_of, with_scales
from .inference import (
    GapGroups,
    PanelExpectedStatistics,
    _check_possible,
    _compute,
    _pooled_by_gaps,
    gap_groups,
)
from .observations import Emissions, PanelObservations

# the box and the flags, relative to the data's time scales (see the module docstring)
_LOWER = 1e-12  # lowest free rate, times the median gap
_UPPER = 1e8  # highest exit rate, times the longest gap (MatrixExponential and others)
_PUSH = 1.0  # rate times the shortest gap from which a rate is tried at the top of the box
_FLAG_LOWER = 1e-6  # rate times the median gap below this: at the lower bound
_FLAG_UPPER = 20.0  # rate times the shortest gap at least this: at the upper bound


# --------------------------------------------------------------------------- the problem
class _Problem(eqx.Module):
    """Everything one fit needs, with a flat batch of `R` trajectories."""

    model: CTBN  # the starting model, its free rates clipped into the box
    observations: tuple[PanelObservations, ...]  # flat buckets, R trajectories in all
    emissions: Emissions | None
    initial_distribution: tuple[Array | None, ...]  # per bucket: None, (S,) or (R_b, S)
    solver: AbstractMasterEquationSolver
    free: tuple[Array, ...]  # per node, bool (configs, k, k)
    pooled: Array  # (R, N) bool, buckets in turn: node n learns from trajectory r
    scales: tuple[Array | None, ...]  # per node, (R, configs, k, k) rate scales, or None
    alpha: Array  # (N,) prior shapes (1 without a prior)
    beta: Array  # (N,) prior rates (0 without a prior)
    has_prior: Array  # bool scalar
    tau: Array  # median positive gap
    shortest: Array  # shortest positive gap
    lower: Array  # lowest free rate
    upper: Array  # highest free rate
    groups: GapGroups | None  # intervals grouped by length (no interventions, dense solver)
    covariates: tuple[Array, ...] | None = None  # per bucket (R_b, C) or (R_b, O_b, C), centred
    covariate_means: Array | None = None  # (C,)
    effect_masks: tuple[Array, ...] | None = None  # per node (C, configs, k, k)
    effect_bound: Array | None = None  # (C,): |effect| at most this (|effect * z| <= 30)
    covariate_spread: Array | None = None  # (C,): standard deviation of each covariate
    effect_groups: tuple[Array, ...] | None = None  # per node (C, configs, k, k): parameter index
    covariate_extremes: Array | None = None  # (2, C): the lowest and highest centred values
    per_observation: bool = eqx.field(static=True, default=False)  # time-varying covariates
    num_effects: int = eqx.field(static=True, default=0)  # length of the effect parameters

    def with_rates(self, rates: tuple[Array, ...]) -> CTBN:
        """The model with these off-diagonal rates (diagonals recomputed)."""
        cims = tuple(with_diagonal(q) for q in rates)
        return eqx.tree_at(lambda m: m.cims, self.model, cims)

    def bound_flags(self, rates: tuple[Array, ...]) -> tuple[tuple[Array, ...], tuple[Array, ...]]:
        """Per node, the free rates `(configs, k, k)` driven to about 0 and to about infinity
        (the thresholds of the module docstring)."""
        lower = tuple(f & (q * self.tau < _FLAG_LOWER) for q, f in zip(rates, self.free))
        upper = tuple(
            f & ((q * self.shortest >= _FLAG_UPPER) | (q >= self.upper * (1 - 1e-9)))
            for q, f in zip(rates, self.free)
        )
        return lower, upper

    def start(self) -> tuple[Array, ...]:
        return tuple(_off_diagonal_rates(c) for c in self.model.cims)

    def clip(self, rates: tuple[Array, ...]) -> tuple[Array, ...]:
        """Free rates into the box, the others exactly 0."""
        return tuple(
            jnp.where(f, jnp.clip(q, self.lower, self.upper), 0) for q, f in zip(rates, self.free)
        )

    def log_prior(self, rates: tuple[Array, ...]) -> Array:
        """The Gamma log density of the free rates (0 without a prior)."""
        total = jnp.zeros((), self.tau.dtype)
        safe_beta = jnp.where(self.has_prior, self.beta, 1)
        constant = self.alpha * jnp.log(safe_beta) - jax.scipy.special.gammaln(self.alpha)
        for n, (q, f) in enumerate(zip(rates, self.free)):
            safe = jnp.where(f, q, 1)
            term = (self.alpha[n] - 1) * jnp.log(safe) - self.beta[n] * safe + constant[n]
            total = total + jnp.where(f, term, 0).sum()
        return jnp.where(self.has_prior, total, 0)

    def covariate_scales(
        self, rates: tuple[Array, ...], effects: tuple[Array, ...]
    ) -> tuple[tuple[Array, ...], ...]:
        r"""Per bucket, per node, the rate scales $e^{\beta\tilde z}$ of each trajectory
        `(R_b, configs, k, k)` (or of each observation, `(R_b, O_b, configs, k, k)`), capped so
        that no scaled rate exceeds the top of the box (where the solver's exponential would
        no longer be finite; an optimiser's trial point may ask for it, an optimum does not)."""
        assert self.covariates is not None and self.effect_masks is not None
        out = []
        for centred in self.covariates:
            scales = scales_of(centred, effects, self.effect_masks)
            out.append(
                tuple(
                    jnp.minimum(s, self.upper / jnp.where(q > 0, q, self.upper))
                    for s, q in zip(scales, rates)
                )
            )
        return tuple(out)

    def _pass(self, rates: tuple[Array, ...], what: str, effects: tuple[Array, ...] | None = None):
        """`(bad, result)` of the filter (`what="likelihood"`) or of forward-backward
        (`"statistics"`) at `rates` (and covariate `effects`): intervals grouped by length when
        `groups` is set, otherwise each solved on its own."""
        model = self.with_rates(rates)
        buckets = PanelBuckets(self.observations, np.arange(self.pooled.shape[0]))
        if self.groups is not None:
            return _pooled_by_gaps(
                model, buckets, self.emissions, self.initial_distribution, self.groups, what
            )
        observations = self.observations
        interval_scales: tuple[tuple[Array, ...] | None, ...] = (None,) * len(observations)
        if effects is not None and self.per_observation:
            interval_scales = self.covariate_scales(rates, effects)
        elif effects is not None:  # the trajectories' scales, with any of their intervention
            observations = tuple(
                eqx.tree_at(
                    lambda b: b.intervention,
                    bucket,
                    with_scales(bucket.intervention, scales, bucket.batch_shape[0]),
                    is_leaf=lambda x: x is None,
                )
                for bucket, scales in zip(observations, self.covariate_scales(rates, effects))
            )
        bads, outs = [], []
        for bucket, p0, scales in zip(observations, self.initial_distribution, interval_scales):
            bad, out = _compute(model, bucket, self.emissions, p0, self.solver, what, None, scales)
            bads.append(bad)
            outs.append(out)
        if len(outs) == 1:
            return tuple(bads), outs[0]
        if what == "likelihood":
            return tuple(bads), jnp.concatenate(outs)
        dwell, transitions, log_likelihood = jax.tree_util.tree_map(
            lambda *xs: jnp.concatenate(xs),
            *[(o.dwell_times, o.transitions, o.log_likelihood) for o in outs],
        )
        return tuple(bads), PanelExpectedStatistics(
            dwell_times=dwell,
            transitions=transitions,
            log_likelihood=log_likelihood,
            model=outs[0].model,
        )

    def log_likelihood(
        self, rates: tuple[Array, ...], effects: tuple[Array, ...] | None = None
    ) -> tuple[Array, tuple[Array, ...]]:
        """Summed log-likelihood, and the impossible-observation flags (one `(R_b, O_b)`
        array per bucket)."""
        bad, log_likelihood = self._pass(rates, "likelihood", effects)
        return jnp.sum(cast(Array, log_likelihood)), bad

    def objective(
        self, rates: tuple[Array, ...], effects: tuple[Array, ...] | None = None
    ) -> Array:
        return self.log_likelihood(rates, effects)[0] + self.log_prior(rates)

    def zero_effects(self) -> Array | None:
        """The effect parameters `(num_effects,)` at 0 (`None` without covariates)."""
        if self.effect_masks is None:
            return None
        return jnp.zeros((self.num_effects,), self.tau.dtype)

    def _per_parameter(self, per_entry: tuple[Array, ...], combine: str, fill) -> Array:
        """`(num_effects,)`: per node `(C, configs, k, k)` values reduced over the masked entries
        of each effect parameter (`"add"`, `"max"` or `"min"`; `fill` where it has none)."""
        assert self.effect_groups is not None and self.effect_masks is not None
        out = jnp.full((self.num_effects,), fill, jnp.asarray(per_entry[0]).dtype)
        for g, m, v in zip(self.effect_groups, self.effect_masks, per_entry):
            index = jnp.where(m, g, self.num_effects).reshape(-1)  # (unmasked: dropped)
            out = getattr(out.at[index], combine)(jnp.asarray(v).reshape(-1), mode="drop")
        return out

    def effect_parameters_free(self) -> Array:
        """`(num_effects,)`: the effect parameters that act on some free rate."""
        assert self.effect_masks is not None
        return self._per_parameter(self.effect_masks, "max", False)

    def effect_covariate(self) -> Array:
        """`(num_effects,)`: the covariate of each effect parameter."""
        assert self.effect_masks is not None
        C = self.effect_masks[0].shape[0]
        c = tuple(
            jnp.broadcast_to(jnp.arange(C)[:, None, None, None], m.shape) for m in self.effect_masks
        )
        return self._per_parameter(c, "max", 0)

    def effects_from(self, parameters: Array, fill=0.0) -> tuple[Array, ...]:
        """Per node `(C, configs, k, k)`: each masked entry's effect parameter (`fill`
        elsewhere)."""
        assert self.effect_groups is not None and self.effect_masks is not None
        return tuple(
            jnp.where(m, parameters[g], jnp.asarray(fill, parameters.dtype))
            for g, m in zip(self.effect_groups, self.effect_masks)
        )

    def parameters_of(self, effects: tuple[Array, ...]) -> Array:
        """The effect parameters of per-node effects (the mean over each parameter's entries,
        which a fit makes equal)."""
        assert self.effect_masks is not None
        dtype = self.tau.dtype
        total = self._per_parameter(tuple(jnp.asarray(b, dtype) for b in effects), "add", 0.0)
        count = self._per_parameter(tuple(m.astype(dtype) for m in self.effect_masks), "add", 0.0)
        return total / jnp.maximum(count, 1)

    def effects_at_bound(
        self, rates: tuple[Array, ...], effects: tuple[Array, ...]
    ) -> tuple[Array, ...]:
        r"""Per node `(C, configs, k, k)`: the effects that drive their rate to a bound for the
        subjects at the covariate's extreme (the rate flags of `bound_flags`, for
        $\lambda e^{\beta\tilde z}$ at the lowest and highest centred $\tilde z$), or that
        are at their own bound: hazard ratios the data push to 0 or $\infty$."""
        assert self.effect_masks is not None and self.covariate_extremes is not None
        assert self.effect_bound is not None
        low, high = (x[:, None, None, None] for x in self.covariate_extremes)
        bound = self.effect_bound[:, None, None, None] * (1 - 1e-9)
        out = []
        for q, b, m in zip(rates, effects, self.effect_masks):
            smallest = q[None] * jnp.exp(jnp.minimum(b * low, b * high))
            largest = q[None] * jnp.exp(jnp.maximum(b * low, b * high))
            out.append(
                m
                & (
                    (smallest * self.tau < _FLAG_LOWER)
                    | (largest * self.shortest >= _FLAG_UPPER)
                    | (jnp.abs(b) >= bound)
                )
            )
        return tuple(out)

    def clip_effects(self, parameters: Array) -> Array:
        """Effect parameters within `effect_bound` (that of their covariate)."""
        assert self.effect_bound is not None
        bound = self.effect_bound[self.effect_covariate()]
        return jnp.clip(parameters, -bound, bound)

    def objective_by_fisher(self, rates: tuple[Array, ...]) -> Array:
        r"""`objective`, reverse-mode differentiable through one forward-backward pass instead
        of through the filter: by Fisher's identity the gradient of the observed-data
        log-likelihood is the expected gradient of the complete-data one,
        $\partial\ell/\partial\Lambda=(\alpha-1+\bar M)/\Lambda-(\beta+\overline{cT})$ for a free
        rate (0 for the others), with the smoothed statistics of the E-step."""

        @jax.custom_vjp
        def value(rates):
            return self.objective(rates)

        def forward(rates):
            objective, stats, _ = self.e_step(rates)
            return objective, (rates, stats)

        def backward(residuals, cotangent):
            rates, stats = residuals
            gradient = tuple(
                jnp.where(f, a / jnp.where(f, q, 1) - b, 0) * cotangent
                for (a, b), q, f in zip(self._counts(stats), rates, self.free)
            )
            return (gradient,)

        value.defvjp(forward, backward)
        return value(rates)

    def e_step(
        self, rates: tuple[Array, ...]
    ) -> tuple[Array, PanelExpectedStatistics, tuple[Array, ...]]:
        """The objective at `rates`, the smoothed statistics of every trajectory (pooled,
        without a batch axis, when the intervals are grouped by length) and the
        impossible-observation flags (one `(R_b, O_b)` array per bucket)."""
        bad, stats = self._pass(rates, "statistics")
        stats = cast(PanelExpectedStatistics, stats)
        return jnp.sum(stats.log_likelihood) + self.log_prior(rates), stats, bad

    def _counts(self, stats: PanelExpectedStatistics) -> list[tuple[Array, Array]]:
        r"""Per node, $(\alpha-1+\bar M,\ \beta+\overline{cT})$ of every rate, `(configs, k, k)`:
        the pooled expected transitions and (rate-scaled) dwell times plus the prior's."""
        out = []
        for n, q in enumerate(self.model.cims):
            where = self.pooled[:, n]
            scale = self.scales[n]
            if self.groups is not None:  # already pooled: no interventions
                pooled = stats
                M = pooled.node_transitions(n)
                cT = jnp.broadcast_to(pooled.node_dwell_times(n)[..., None], M.shape)
            elif scale is None:
                pooled = stats.sum(where=where)
                M = pooled.node_transitions(n)
                cT = jnp.broadcast_to(pooled.node_dwell_times(n)[..., None], M.shape)
            else:
                w = where.astype(q.dtype)
                M = jnp.einsum("r,r...->...", w, stats.node_transitions(n))
                cT = jnp.einsum("r,rcxy,rcx->cxy", w, scale, stats.node_dwell_times(n))
            out.append((self.alpha[n] - 1 + M, self.beta[n] + cT))
        return out

    def m_step(self, rates: tuple[Array, ...], stats: PanelExpectedStatistics) -> tuple[Array, ...]:
        r"""Per free rate, the maximiser over the box of
        $(\alpha-1+\bar M)\log\lambda-(\beta+\overline{cT})\lambda$: the clipped ratio; where
        $\beta+\overline{cT}=0$ (no prior and no time spent), the rate is kept."""
        out = []
        for (a, b), q, f in zip(self._counts(stats), rates, self.free):
            known = b > 0
            proposal = jnp.clip(a / jnp.where(known, b, 1), self.lower, self.upper)
            out.append(jnp.where(f, jnp.where(known, proposal, q), 0))
        return tuple(out)


def _off_diagonal_rates(cim: Array) -> Array:
    k = cim.shape[-1]
    return jnp.where(jnp.eye(k, dtype=bool), 0, cim)


def _time_scales(buckets: tuple[PanelObservations, ...], dtype) -> tuple[Array, Array, Array]:
    """The median, shortest and longest positive gaps of flat buckets (1 when there are
    none), between consecutive observations that observe some node (the censored rows of
    [`jaxctbn.panel.with_time_periods`][] are passed over)."""
    gaps = []
    for bucket in buckets:
        times = bucket.times.astype(dtype)
        num_slots = times.shape[-1]
        seen = jnp.any(bucket.states >= 0, axis=-1)
        # the time of the latest observing row before each row
        latest = jax.lax.cummax(jnp.where(seen, times, -jnp.inf), axis=times.ndim - 1)
        gap = times[..., 1:] - latest[..., :-1]
        ok = (jnp.arange(1, num_slots) < bucket.num_observations[:, None]) & (gap > 0)
        ok = ok & seen[..., 1:] & jnp.isfinite(gap)
        gaps.append(jnp.where(ok, gap, jnp.nan).reshape(-1))
    gaps = jnp.concatenate(gaps)
    ok = ~jnp.isnan(gaps)
    some = ok.any()
    one = jnp.ones((), dtype)
    median = jnp.nanmedian(gaps)
    shortest = jnp.min(jnp.where(ok, gaps, jnp.inf))
    longest = jnp.max(jnp.where(ok, gaps, 0))
    return (
        jnp.where(some, median, one),
        jnp.where(some, shortest, one),
        jnp.where(some, longest, one),
    )


def _solver_limit(solver: AbstractMasterEquationSolver) -> float:
    """The largest exit rate times gap that the fit lets the solver see."""
    if isinstance(solver, Uniformisation):
        # forward_backward needs about mu + 7 sqrt(mu) terms for a Poisson mean mu
        return solver.fb_max_terms / 2
    return _UPPER


def _problem(
    model, observations, prior, emissions, initial_distribution, solver, groups, covariates=None
) -> _Problem:
    dtype = jnp.result_type(*model.cims)
    N = model.num_nodes
    buckets = as_flat_buckets(observations)
    R = sum(b.batch_shape[0] for b in buckets)
    tau, shortest, longest = _time_scales(buckets, dtype)
    lower = _LOWER / tau
    # the largest exit rate of a global state is at most sum_n (k_n - 1) times the top rate
    upper = _solver_limit(solver) / (longest * sum(k - 1 for k in model.cardinalities))
    p0: tuple[Array | None, ...] = (None,) * len(buckets)
    if initial_distribution is not None:
        distribution = jnp.asarray(initial_distribution, dtype)
        if distribution.ndim > 1:
            p0 = tuple(split_rows(observations, distribution, "initial_distribution"))
        else:
            p0 = (distribution,) * len(buckets)
    # pooling: node n learns only from the trajectories in which it is not clamped, and not
    # at all where an intervention replaces its CIMs (its own rates are then never used)
    intervention = None
    if buckets[0].intervention is not None:
        intervention = jax.tree_util.tree_map(
            lambda *xs: jnp.concatenate(xs), *[b.intervention for b in buckets]
        )
    pooled = jnp.ones((R, N), bool)
    scales: list[Array | None] = [None] * N
    if intervention is not None:
        pooled = ~jnp.asarray(intervention.targets, bool).reshape(R, N)
        if intervention.replacement_cims is not None:
            replaced = jnp.asarray([c is not None for c in intervention.replacement_cims])
            pooled = pooled & ~replaced
        if intervention.rate_scales is not None:
            for n, s in enumerate(intervention.rate_scales):
                shape = model.cims[n].shape
                s = jnp.asarray(s, dtype)
                tail = s.shape[1:]
                s = s.reshape((R,) + (1,) * (3 - len(tail)) + tail)
                scales[n] = jnp.broadcast_to(s, (R,) + shape)
    free = tuple(
        (c != 0) & ~jnp.eye(c.shape[-1], dtype=bool) for c in model.cims
    )  # structural zeros are the exact zeros of the start
    alpha, beta, has_prior = prior
    problem = _Problem(
        model=model,
        observations=buckets,
        emissions=emissions,
        initial_distribution=p0,
        solver=solver,
        free=free,
        pooled=pooled,
        scales=tuple(scales),
        alpha=alpha,
        beta=beta,
        has_prior=has_prior,
        tau=tau,
        shortest=shortest,
        lower=lower,
        upper=upper,
        groups=groups,
        per_observation=covariates is not None and covariates.per_observation,
        num_effects=0
        if covariates is None
        else covariates.effect_groups([c.shape for c in model.cims])[1],
    )
    if covariates is not None:
        values = [jnp.asarray(v, dtype) for v in split_rows(observations, covariates.values)]
        centred, means, count = centred_values(covariates, buckets, values)
        # padding rows are 0 once centred: the largest |z - mean| and the root mean square
        rows = jnp.concatenate([c.reshape(-1, c.shape[-1]) for c in centred])
        spread = jnp.max(jnp.abs(rows), axis=0)
        problem = eqx.tree_at(
            lambda p: (
                p.covariates,
                p.covariate_means,
                p.effect_masks,
                p.effect_bound,
                p.covariate_spread,
                p.effect_groups,
                p.covariate_extremes,
            ),
            problem,
            (
                centred,
                means,
                covariates.masks(free),
                30 / spread,
                jnp.sqrt(jnp.sum(rows**2, axis=0) / count),
                covariates.effect_groups([c.shape for c in model.cims])[0],
                jnp.stack([rows.min(0), rows.max(0)]),  # (padding rows are 0: inside)
            ),
            is_leaf=lambda x: x is None,
        )
    start = problem.clip(problem.start())
    return eqx.tree_at(lambda p: p.model, problem, problem.with_rates(start))


# --------------------------------------------------------------------------- methods
class _Outcome(eqx.Module):
    rates: tuple[Array, ...]  # inside the box
    objective: Array  # at `rates`
    converged: Array
    iterations: Array
    trace: Array
    bad: tuple[Array, ...]  # per bucket (R_b, O_b): observations impossible at the start
    effects: tuple[Array, ...] | None = None  # covariate effects, per node (C, configs, k, k)


def _any(bad: tuple[Array, ...]) -> Array:
    return jnp.any(jnp.stack([b.any() for b in bad]))


def _padded(trace: Array, iterations: Array, final: Array) -> Array:
    return jnp.where(jnp.arange(trace.shape[0]) > iterations, final, trace)


def _check_method(tolerance, max_iterations, name: str) -> tuple[Any, int]:
    if isinstance(max_iterations, bool) or not isinstance(max_iterations, int | np.integer):
        raise ValueError(f"max_iterations: {name} needs an integer >= 1, got {max_iterations!r}.")
    if max_iterations < 1:
        raise ValueError(f"max_iterations: {name} needs an integer >= 1, got {max_iterations}.")
    if isinstance(tolerance, bool):
        raise ValueError(f"tolerance: {name} needs a finite number >= 0, got {tolerance!r}.")
    if isinstance(tolerance, int | float | np.floating | np.integer):
        if not (math.isfinite(float(tolerance)) and tolerance >= 0):
            raise ValueError(f"tolerance: {name} needs a finite number >= 0, got {tolerance}.")
        return float(tolerance), int(max_iterations)
    tolerance = jnp.asarray(tolerance)
    if tolerance.ndim != 0 or not jnp.issubdtype(tolerance.dtype, jnp.floating):
        raise ValueError(
            f"tolerance: {name} needs a scalar float, got {tolerance.dtype} {tolerance.shape}."
        )
    if is_concrete(tolerance) and not (bool(jnp.isfinite(tolerance)) and tolerance >= 0):
        raise ValueError(f"tolerance: {name} needs a finite number >= 0, got {tolerance}.")
    return tolerance, int(max_iterations)


class AbstractRateFitMethod(eqx.Module):
    r"""How [`jaxctbn.panel.fit_rates`][] maximises its objective: [`jaxctbn.panel.SquaremFit`][]
    (the default), [`jaxctbn.panel.EMFit`][] or [`jaxctbn.panel.GradientFit`][].

    Both stop when the relative change of the objective $\ell$ over one iteration is small,
    $|\Delta\ell|\le\mathtt{tolerance}\,(1+|\ell|)$ (a `tolerance` of 0 runs all
    `max_iterations`), and report `converged=False` when `max_iterations` is reached first.
    `tolerance` is data (changing it does not recompile); `max_iterations` is static (it sets
    the length of the trace).
    """

    tolerance: eqx.AbstractVar[float | Float[Array, ""]]
    max_iterations: eqx.AbstractVar[int]
    name: ClassVar[str]

    @abc.abstractmethod
    def fit(self, problem: _Problem) -> _Outcome:
        """Run the optimiser from `problem`'s starting rates (called by
        [`jaxctbn.panel.fit_rates`][], inside `jax.jit`); when an observation is impossible at the
        start (the first evaluation's flags, returned as `bad`), no iteration runs."""


class EMFit(AbstractRateFitMethod):
    r"""Expectation-maximisation: the E-step is the smoothed
    [`jaxctbn.panel.panel_expected_statistics`][] at the current rates, pooled per node over the
    trajectories in which the node was not perfectly intervened on and projected onto its
    parents, $\bar M_n(x,x',u)$ and $\bar T_n(x,u)$; the M-step is, per free rate,

    $$\Lambda_n(x,x',u)\leftarrow\frac{\alpha_n-1+\bar M_n(x,x',u)}{\beta_n+\bar T_n(x,u)}$$

    ($\alpha=1$, $\beta=0$ without a prior: $\bar M/\bar T$), clipped into the box of
    [`jaxctbn.panel.fit_rates`][]. Under imperfect interventions that scale node $n$'s rates by
    $c_r$ in trajectory $r$, $\bar T$ is replaced by $\sum_rc_rT_r$ (the complete-data
    likelihood of trajectory $r$ has rate $c_r\Lambda$). Where the denominator is 0 (no
    prior, and the configuration is never visited in the data) the rate is kept.

    With $\alpha_n<1$ the Gamma density is unbounded at 0: a rate with $\bar M<1-\alpha_n$
    has its (box-constrained) MAP at the lower end of the box, and is flagged
    `at_lower_bound`. Use $\alpha\ge1$ for an interior mode.

    Every iteration costs one forward-backward pass; the objective never decreases (EM is a
    minorise-maximise algorithm, and the clipped ratio maximises the M-step's objective over
    the box). Convergence is linear, slow where the data say little about a rate.

    **Arguments** (keyword-only): `tolerance` (default `1e-8`), `max_iterations` (default
    1000).
    """

    tolerance: float | Float[Array, ""]
    max_iterations: int = eqx.field(static=True)
    name: ClassVar[str] = "em"

    def __init__(self, *, tolerance: float | ArrayLike = 1e-8, max_iterations: int = 1000):
        self.tolerance, self.max_iterations = _check_method(tolerance, max_iterations, "EMFit")

    def fit(self, problem):
        def step(rates, stats):
            new_rates = problem.m_step(rates, stats)
            new_objective, new_stats, _ = problem.e_step(new_rates)
            return new_rates, new_objective, new_stats, jnp.asarray(True)

        return _ascent(problem, self.max_iterations, self.tolerance, step)


class GradientFit(AbstractRateFitMethod):
    r"""Quasi-Newton ascent: `optax.lbfgs` (zoom line search) on $\theta=\log\Lambda$ of the free
    rates; the rates are $\Lambda=\exp(\mathrm{clip}(\theta))$, clipped into the box of
    [`jaxctbn.panel.fit_rates`][] (the objective is flat outside it). It maximises the same objective as [`jaxctbn.panel.EMFit`][] (the
    prior density in rate space, no Jacobian term), so the two share the optimum.

    The gradient comes from one forward-backward pass by Fisher's identity (the gradient of the
    observed-data log-likelihood is the smoothed expectation of the complete-data one):
    $\partial\ell/\partial\Lambda_n(x,x',u)=(\alpha_n-1+\bar M)/\Lambda-(\beta_n+\overline{cT})$
    with the pooled statistics of [`jaxctbn.panel.EMFit`][]'s E-step, then the chain rule through
    $\exp$ (equal to reverse-mode autodiff of the filter, tested; cheaper).

    Stops when, besides the objective criterion, the gradient in $\theta$ is small,
    $\|\nabla_\theta\ell\|_\infty\le\sqrt{\mathtt{tolerance}}\,(1+|\ell|)$ (near an optimum
    $\Delta\ell\approx\|\nabla\ell\|^2/(2|\ell''|)$, with a curvature of the order of $|\ell|$),
    or when a line search makes no progress (then `converged` says whether the gradient
    criterion holds). Every iteration costs one gradient and up to 20 line-search evaluations
    (typically one or two), and usually far fewer iterations than EM.

    **Arguments** (keyword-only): `tolerance` (default `1e-8`), `max_iterations` (default
    500).
    """

    tolerance: float | Float[Array, ""]
    max_iterations: int = eqx.field(static=True)
    name: ClassVar[str] = "gradient"

    def __init__(self, *, tolerance: float | ArrayLike = 1e-8, max_iterations: int = 500):
        self.tolerance, self.max_iterations = _check_method(
            tolerance, max_iterations, "GradientFit"
        )

    def fit(self, problem):
        import optax

        dtype = problem.tau.dtype
        tol = jnp.asarray(self.tolerance, dtype)
        low, high = jnp.log(problem.lower), jnp.log(problem.upper)

        def rates_of(theta):
            return tuple(
                jnp.where(f, jnp.exp(jnp.clip(t, low, high)), 0)
                for t, f in zip(theta, problem.free)
            )

        # with covariates, theta is (log-rates, effects) and the gradient is reverse-mode
        # autodiff of the filter (the effects have no Fisher-identity shortcut here)
        covariates = problem.effect_masks is not None

        def parts(theta):
            # the effects are optimised per standard deviation of their covariate (a covariate
            # in years and one in 0/1 then have effects of similar size: L-BFGS on raw units
            # stalled on msm's cav data with donor age and sex)
            if covariates:
                assert problem.covariate_spread is not None
                spread = problem.covariate_spread[problem.effect_covariate()]
                free = problem.effect_parameters_free()
                parameters = jnp.where(free, problem.clip_effects(theta[1] / spread), 0)
                return rates_of(theta[0]), problem.effects_from(parameters)
            return rates_of(theta), None

        def loss(theta):
            rates, effects = parts(theta)
            if covariates:
                return -problem.objective(rates, effects)
            return -problem.objective_by_fisher(rates)

        theta0 = tuple(
            jnp.where(f, jnp.log(jnp.where(f, q, 1)), 0)
            for q, f in zip(problem.start(), problem.free)
        )
        if covariates:
            theta0 = (theta0, problem.zero_effects())
        opt = optax.lbfgs()
        value_and_grad = optax.value_and_grad_from_state(loss)
        start_likelihood, bad = problem.log_likelihood(*parts(theta0))
        value0 = -(start_likelihood + problem.log_prior(parts(theta0)[0]))
        trace = jnp.full((self.max_iterations + 1,), -value0)

        def cond(carry):
            _, _, _, it, _, stop, _ = carry
            return (it < self.max_iterations) & ~stop

        def body(carry):
            theta, state, value, it, trace, _, _ = carry
            v, g = value_and_grad(theta, state=state)
            updates, new_state = opt.update(g, state, theta, value=v, grad=g, value_fn=loss)
            new_theta = optax.apply_updates(theta, updates)
            new_value = optax.tree.get(new_state, "value")
            new_grad = optax.tree.get(new_state, "grad")
            ok = jnp.isfinite(new_value) & (new_value <= value)
            scale = 1 + jnp.abs(new_value)
            small_change = jnp.abs(new_value - value) <= tol * scale
            gradient = jnp.max(
                jnp.stack(
                    [jnp.max(jnp.abs(x), initial=0) for x in jax.tree_util.tree_leaves(new_grad)]
                )
            )
            small_gradient = gradient <= jnp.sqrt(tol) * scale
            converged = ok & small_change & small_gradient
            stalled = ~ok | (new_value == value)
            pick = lambda new, old: jax.tree_util.tree_map(  # noqa: E731
                lambda a, b: jnp.where(ok, a, b), new, old
            )
            theta = pick(new_theta, theta)
            state = pick(new_state, state)
            value = jnp.where(ok, new_value, value)
            it = it + ok.astype(it.dtype)
            trace = trace.at[it].set(-value)
            stop = converged | stalled
            return theta, state, value, it, trace, stop, converged | (stalled & small_gradient)

        carry = (
            theta0,
            opt.init(cast(Any, theta0)),
            value0,
            jnp.zeros((), jnp.int32),
            trace,
            _any(bad),
        )
        carry = (*carry, jnp.asarray(False))
        theta, _, value, it, trace, _, converged = jax.lax.while_loop(cond, body, carry)
        rates, effects = parts(theta)
        return _Outcome(
            rates=rates,
            objective=-value,
            converged=converged,
            iterations=it,
            trace=_padded(trace, it, -value),
            bad=bad,
            effects=effects,
        )


class SquaremFit(AbstractRateFitMethod):
    r"""EM accelerated by SQUAREM (Varadhan & Roland 2008, scheme S3), in the log-rates
    $\theta=\log\Lambda$ of the free rates: the default of [`jaxctbn.panel.fit_rates`][].

    From $\theta_0$, two EM steps ([`jaxctbn.panel.EMFit`][]'s update $F$) give
    $r=F(\theta_0)-\theta_0$ and $v=F(F(\theta_0))-2F(\theta_0)+\theta_0$; the extrapolation
    $\theta'=\theta_0-2ar+a^2v$ with $a=-\max(1,\|r\|/\|v\|)$ is clipped into the box and
    followed by one more EM step (stabilisation). The result is kept when its objective is at
    least that of the plain double step $F(F(\theta_0))$, which is taken otherwise, so the
    objective never decreases (as for EM). Each iteration costs four forward-backward passes
    (three when the double step is taken) and typically replaces tens of EM iterations where EM
    crawls: along a ridge of weakly identified rates, or towards a rate of 0 or $\infty$,
    where EM's steps shrink geometrically and its objective-change criterion stops it short.

    **Stopping.** Besides the relative change of the objective over an iteration,
    $|\Delta\ell|\le\mathtt{tolerance}\,(1+|\ell|)$, the projected gradient in $\theta$ must
    be small, $\|g\|_\infty\le\sqrt{\mathtt{tolerance}}\,(1+|\ell|)$, where
    $g=\alpha-1+\bar M-(\beta+\overline{cT})\Lambda$ per free rate (Fisher's identity, free with
    the E-step), with the components that push a rate out of the box at its end dropped. A
    slowly crawling EM can meet the first criterion far from the optimum, never the second.

    **When it stops short.** On a boundary optimum (rates driven to 0 or $\infty$ together)
    the extrapolations can stall, and `max_iterations` end the run unconverged. Called
    eagerly, [`jaxctbn.panel.fit_rates`][] then continues with `polish` (default
    [`jaxctbn.panel.GradientFit`][]: L-BFGS on the log-rates) from where SQUAREM stopped and
    keeps the better objective; the fit's `method` is then `"squarem+gradient"` and its
    `iterations` and `trace` those of both. `polish=None` leaves an unconverged fit as it is
    (so does a call under `jit`, whose `converged` is traced).

    **Arguments** (keyword-only): `tolerance` (default `1e-8`), `max_iterations` (default
    500), `polish` (default `GradientFit()` with the same tolerance; `None`: none).
    """

    tolerance: float | Float[Array, ""]
    max_iterations: int = eqx.field(static=True)
    polish: GradientFit | None
    name: ClassVar[str] = "squarem"

    def __init__(
        self,
        *,
        tolerance: float | ArrayLike = 1e-8,
        max_iterations: int = 500,
        polish: GradientFit | None | str = "default",
    ):
        self.tolerance, self.max_iterations = _check_method(tolerance, max_iterations, "SquaremFit")
        if isinstance(polish, str) and polish == "default":
            polish = GradientFit(tolerance=self.tolerance)
        if polish is not None and not isinstance(polish, GradientFit):
            raise ValueError(
                f"polish: expected a jaxctbn.panel.GradientFit or None, got {polish!r}."
            )
        self.polish = polish

    def fit(self, problem):
        dtype = problem.tau.dtype
        tol = jnp.asarray(self.tolerance, dtype)
        low, high = jnp.log(problem.lower), jnp.log(problem.upper)
        free = problem.free

        def log_of(rates):
            return tuple(jnp.where(f, jnp.log(jnp.where(f, q, 1)), 0) for q, f in zip(rates, free))

        def rates_of(theta):
            return tuple(
                jnp.where(f, jnp.exp(jnp.clip(t, low, high)), 0) for t, f in zip(theta, free)
            )

        def update(rates, stats):  # one EM step, from the E-step at `rates`
            return problem.m_step(rates, stats)

        def projected_gradient(rates, stats):
            largest = jnp.zeros((), dtype)
            for (a, b), q, f in zip(problem._counts(stats), rates, free):
                g = a - b * q
                at_low = q <= problem.lower * (1 + 1e-9)
                at_high = q >= problem.upper * (1 - 1e-9)
                g = jnp.where(f & ~(at_low & (g < 0)) & ~(at_high & (g > 0)), g, 0)
                largest = jnp.maximum(largest, jnp.max(jnp.abs(g), initial=0))
            return largest

        def norm(tree):
            return jnp.sqrt(sum(jnp.sum(x**2) for x in tree))

        def step(rates, stats):
            # the four E-steps of an iteration (at F(θ0), F(F(θ0)), the extrapolation and its
            # stabilisation) as one E-step in a loop of four phases: the program holds one
            # forward-backward pass instead of four (a quarter of the tracing, lowering and
            # compiled code that a first call pays)
            one = update(rates, stats)
            t0 = log_of(rates)

            def extrapolated(one, two):
                t1, t2 = log_of(one), log_of(two)
                r = tuple(b - a for a, b in zip(t0, t1))
                v = tuple(c - 2 * b + a for a, b, c in zip(t0, t1, t2))
                norm_r, norm_v = norm(r), norm(v)
                length = -jnp.maximum(1.0, norm_r / jnp.where(norm_v > 0, norm_v, 1))
                length = jnp.where(norm_v > 0, length, -1.0)
                return rates_of(
                    tuple(a - 2 * length * x + length**2 * y for a, x, y in zip(t0, r, v))
                )

            def phase(carry, k):
                point, one, two, objective_two, stats_two = carry
                objective, stats_at, _ = problem.e_step(point)
                # k = 0: `point` is F(θ0), next F(F(θ0)); k = 1: `point` is F(F(θ0)), kept,
                # next the extrapolation; k = 2: next its stabilisation; k = 3: the last
                stepped = update(point, stats_at)
                two = jax.tree_util.tree_map(lambda a, b: jnp.where(k == 1, a, b), point, two)
                objective_two = jnp.where(k == 1, objective, objective_two)
                stats_two = jax.tree_util.tree_map(
                    lambda a, b: jnp.where(k == 1, a, b), stats_at, stats_two
                )
                jumped = extrapolated(one, two)
                following = jax.tree_util.tree_map(
                    lambda a, b: jnp.where(k == 1, a, b), jumped, stepped
                )
                return (following, one, two, objective_two, stats_two), (point, objective, stats_at)

            dtype_objective = problem.tau.dtype
            start = (one, one, one, jnp.zeros((), dtype_objective), stats)
            (_, _, two, objective_two, stats_two), (points, objectives, all_stats) = jax.lax.scan(
                phase, start, jnp.arange(4)
            )
            stabilised = tuple(p[3] for p in points)
            objective_new = objectives[3]
            stats_new = jax.tree_util.tree_map(lambda x: x[3], all_stats)
            take = jnp.isfinite(objective_new) & (objective_new >= objective_two)
            pick = lambda new, old: jax.tree_util.tree_map(  # noqa: E731
                lambda a, b: jnp.where(take, a, b), new, old
            )
            new_rates = pick(stabilised, two)
            new_objective = jnp.where(take, objective_new, objective_two)
            new_stats = pick(stats_new, stats_two)
            scale = 1 + jnp.abs(new_objective)
            small_gradient = projected_gradient(new_rates, new_stats) <= jnp.sqrt(tol) * scale
            return new_rates, new_objective, new_stats, small_gradient

        return _ascent(problem, self.max_iterations, self.tolerance, step)


def _ascent(problem: _Problem, max_iterations: int, tolerance, step) -> _Outcome:
    """The loop of [`jaxctbn.panel.EMFit`][] and [`jaxctbn.panel.SquaremFit`][]: from the
    E-step at the start, `step(rates, stats)` proposes `(rates, objective, stats,
    small_gradient)`; a non-finite objective stops the loop at the last finite iterate, and
    the fit has converged when the relative change of the objective is at most `tolerance`
    and `small_gradient` holds. No iteration runs when an observation is impossible at the
    start."""
    tol = jnp.asarray(tolerance, problem.tau.dtype)
    rates = problem.start()
    objective, stats, bad = problem.e_step(rates)
    trace = jnp.full((max_iterations + 1,), objective)

    def cond(carry):
        _, _, _, it, _, stop, _ = carry
        return (it < max_iterations) & ~stop

    def body(carry):
        rates, objective, stats, it, trace, _, _ = carry
        new_rates, new_objective, new_stats, small_gradient = step(rates, stats)
        finite = jnp.isfinite(new_objective)
        change = jnp.abs(new_objective - objective)
        converged = finite & (change <= tol * (1 + jnp.abs(new_objective))) & small_gradient
        keep = lambda new, old: jax.tree_util.tree_map(  # noqa: E731
            lambda a, b: jnp.where(finite, a, b), new, old
        )
        rates = keep(new_rates, rates)
        objective = jnp.where(finite, new_objective, objective)
        stats = keep(new_stats, stats)
        it = it + finite.astype(it.dtype)
        trace = trace.at[it].set(objective)
        return rates, objective, stats, it, trace, converged | ~finite, converged

    no = jnp.asarray(False)
    carry = (rates, objective, stats, jnp.zeros((), jnp.int32), trace, _any(bad), no)
    rates, objective, _, it, trace, _, converged = jax.lax.while_loop(cond, body, carry)
    return _Outcome(
        rates=rates,
        objective=objective,
        converged=converged,
        iterations=it,
        trace=_padded(trace, it, objective),
        bad=bad,
    )


# --------------------------------------------------------------------------- result
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
    - `method`: `"squarem"`, `"em"` or `"gradient"` (static).
    - `effects`: with covariates, per node `(C, configs, k, k)`: the log hazard ratio
      $\beta_c$ of one unit of covariate $c$ on each rate (0 where it does not act); `model`
      then holds the rates at the covariates' means `covariate_means` `(C,)`. `None` without.
    - `num_parameters`: the free rates (those at a bound included) plus the covariate effects
      fitted: the parameter count of AIC and of
      [`jaxctbn.panel.likelihood_ratio_test`][].
    - `effects_at_bound`: with covariates, per node `(C, configs, k, k)`: the effects the data
      drive to $\pm\infty$ (a hazard ratio of 0 or $\infty$: not an estimate, like a rate at
      a bound): those whose rate, for the subjects at the covariate's lowest or highest value,
      meets the rate flags above ($\lambda e^{\beta\tilde z}\tau<10^{-6}$ or
      $\lambda e^{\beta\tilde z}\tau_{\min}\ge20$), or at their own bound
      $|\beta|\max_r|\tilde z_{rc}|=30$. `None` without.
    """

    model: CTBN
    log_likelihood: Float[Array, ""]
    log_posterior: Float[Array, ""]
    converged: Bool[Array, ""]
    iterations: Int[Array, ""]
    trace: Float[Array, " iterations_plus_one"]
    at_lower_bound: tuple[Bool[Array, "_configs _k _k"], ...]
    at_upper_bound: tuple[Bool[Array, "_configs _k _k"], ...]
    num_parameters: Int[Array, ""]
    method: str = eqx.field(static=True)
    effects: tuple[Float[Array, "covariates _configs _k _k"], ...] | None = None
    covariate_means: Float[Array, " covariates"] | None = None
    effects_at_bound: tuple[Bool[Array, "covariates _configs _k _k"], ...] | None = None


# --------------------------------------------------------------------------- entry point
DEFAULT_METHOD = SquaremFit()
DEFAULT_PANEL_SOLVER = MatrixExponential()


def fit_rates(
    model: CTBN,
    observations: PanelObservations | PanelBuckets,
    *,
    method: AbstractRateFitMethod | None = None,
    prior: GammaPrior | None = None,
    emissions: Emissions | None = None,
    initial_distribution: ArrayLike | None = None,
    solver: AbstractMasterEquationSolver = DEFAULT_PANEL_SOLVER,
    covariates: Covariates | None = None,
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
      with their `tolerance` and `max_iterations`.
    - `prior`: `None` (maximum likelihood) or a [`jaxctbn.GammaPrior`][]
      $\mathrm{Gam}(\alpha_n,\beta_n)$ on every free rate of node $n$ (scalars or one value per
      node): the MAP, whose M-step is the mode $(\alpha-1+\bar M)/(\beta+\bar T)$ clipped into
      the box. With $\alpha<1$ the density is unbounded at 0, and a rate with few transitions
      has its mode at the bottom of the box.
    - `emissions`, `initial_distribution`: as for [`jaxctbn.panel.panel_log_likelihood`][] (fixed,
      not fitted).
    - `covariates`: `None`, or [`jaxctbn.panel.Covariates`][]: covariates per trajectory
      (baseline) or per observation (time-varying; the periods of
      [`jaxctbn.panel.with_time_periods`][] among them) with log-linear effects on chosen
      rates, fitted jointly with the rates by
      [`jaxctbn.panel.GradientFit`][] (the default then; the EM methods are refused: the
      effects have no closed-form update); the result's `effects` are the log hazard ratios
      and `model` the rates at the covariates' means.
    - `solver`: the master-equation solver of the forward-backward pass. Default
      [`jaxctbn.MatrixExponential`][]: panel gaps are long compared with the rates' time
      scale, and the dense exponential has no limit on rate times gap (its cost grows with the
      number of global states $S$ as $S^3$). For larger networks pass
      [`jaxctbn.Uniformisation`][], whose smoothed statistics need the largest exit rate times
      the longest gap below about its `fb_max_terms` (it raises otherwise): the top of the
      box is lowered to keep it so, and a rate that the data put above it is flagged.

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
    if method is None:
        method = DEFAULT_METHOD if covariates is None else GradientFit()
    parameters, groups, method = _checked_arguments(
        model, observations, method, prior, emissions, solver, "fit_rates"
    )
    if covariates is not None:
        _check_covariates(covariates, observations, method)
        groups = None  # every trajectory has its own generator
    fit, bad = _fit(
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
    fit = _check_possible(fit, bad, observations)
    if isinstance(method, SquaremFit) and method.polish is not None:
        fit = _polished(fit, method.polish, observations, parameters, emissions,
                        initial_distribution, solver, groups, covariates)  # fmt: skip
    return fit


def _polished(fit: RateFit, polish, observations, *arguments) -> RateFit:
    """`fit` continued by `polish` when it stopped unconverged (concrete values only): the
    better objective of the two, labelled with both methods."""
    if not is_concrete(fit.converged) or bool(fit.converged):
        return fit
    second, bad = _fit(fit.model, observations, polish, *arguments)
    second = _check_possible(second, bad, observations)
    if not float(second.log_posterior) >= float(fit.log_posterior):
        return fit
    return dataclasses.replace(
        second,
        method=f"{fit.method}+{second.method}",
        iterations=fit.iterations + second.iterations,
        trace=jnp.concatenate([fit.trace[: int(fit.iterations) + 1], second.trace]),
    )


def _check_covariates(covariates, observations, method) -> None:
    if not isinstance(covariates, Covariates):
        raise ValueError(
            f"covariates: expected a jaxctbn.panel.Covariates or None, got "
            f"{type(covariates).__name__}."
        )
    if not isinstance(method, GradientFit):
        raise ValueError(
            f"method: covariate effects have no closed-form EM update; fit them with "
            f"GradientFit() (the default with covariates), got {type(method).__name__}."
        )
    batch = (
        (observations.num_trajectories,)
        if isinstance(observations, PanelBuckets)
        else observations.batch_shape
    )
    leading = covariates.values.shape[:-1]
    if covariates.per_observation:
        slots = max(b.times.shape[-1] for b in as_flat_buckets(observations))
        if leading[:-1] != batch or leading[-1] < slots:
            raise ValueError(
                f"covariates: per_observation values need leading axes {batch + (slots,)} (one "
                f"row per observation slot of each trajectory), got {covariates.values.shape}."
            )
    elif leading != batch:
        raise ValueError(
            f"covariates: expected one row per trajectory, leading axes {batch}, got values of "
            f"shape {covariates.values.shape}."
        )
    _check_identifiable(covariates)


def _check_identifiable(covariates: Covariates) -> None:
    """A one-line `ValueError` when the effects on some rate are not identifiable: covariates
    whose values are linearly dependent once centred (their effects trade against one another;
    a constant covariate is refused by `Covariates` itself). Checked per rate over the
    covariates acting on it (concrete values only; the rows of per-observation values include
    padding slots, which repeat a trajectory's last row)."""
    if not is_concrete(covariates.values):
        return
    values = np.asarray(covariates.values, float)
    rows = values.reshape(-1, values.shape[-1])
    names = list(covariates.names) if covariates.names else [f"#{c}" for c in range(rows.shape[1])]
    centred = rows - rows.mean(0)
    if covariates.acts_on is None:
        patterns = {tuple(range(rows.shape[1]))}
    else:
        acts = [np.asarray(a, bool).reshape(a.shape[0], -1) for a in covariates.acts_on]
        patterns = {
            tuple(int(c) for c in np.nonzero(a[:, j])[0]) for a in acts for j in range(a.shape[1])
        }
    for pattern in sorted(patterns, key=len, reverse=True):
        if len(pattern) < 2:
            continue
        block = centred[:, list(pattern)] / np.abs(centred[:, list(pattern)]).max(0)
        _, sing, vt = np.linalg.svd(block, full_matrices=False)
        if sing[-1] <= 1e-8 * sing[0]:
            involved = [names[pattern[i]] for i in np.nonzero(np.abs(vt[-1]) > 1e-6)[0]]
            raise ValueError(
                f"covariates: {involved} are collinear (one is a linear function of the others "
                "over the data): their effects on a rate they act on together cannot be told "
                "apart; drop one."
            )


def _checked_arguments(model, observations, method, prior, emissions, solver, verb: str):
    """The checks shared by `fit_rates` and `rate_uncertainty`, and what both pass to the
    compiled program: the prior as arrays, the intervals grouped by length (or `None`) and
    `method` with its tolerance as data."""
    if not isinstance(model, CTBN):
        raise ValueError(f"model: {verb} needs a CTBN (a fixed graph), got {type(model).__name__}.")
    if not isinstance(observations, PanelObservations | PanelBuckets):
        raise ValueError(
            f"observations: expected a PanelObservations or PanelBuckets, got "
            f"{type(observations).__name__}."
        )
    if observations.num_nodes != model.num_nodes:
        raise ValueError(
            f"observations: have {observations.num_nodes} nodes, the model has {model.num_nodes}."
        )
    if not isinstance(method, AbstractRateFitMethod):
        raise ValueError(
            f"method: expected SquaremFit(), EMFit() or GradientFit(), got {type(method).__name__}."
        )
    if prior is not None:
        if not isinstance(prior, GammaPrior):
            raise ValueError(
                f"prior: {verb} needs a GammaPrior (one Gamma per rate) or None, got "
                f"{type(prior).__name__}."
            )
        check_prior(prior, model.num_nodes)
    if emissions is not None and not isinstance(emissions, Emissions):
        raise ValueError(f"emissions: expected an Emissions, got {type(emissions).__name__}.")
    if not isinstance(solver, AbstractMasterEquationSolver):
        raise ValueError(f"solver: expected a master-equation solver, got {type(solver).__name__}.")
    if is_concrete(*model.cims):
        for name, c in zip(model.names, model.cims):
            c = np.asarray(c)
            off = c[..., ~np.eye(c.shape[-1], dtype=bool)]
            if not np.all(np.isfinite(off)) or np.any(off < 0):
                raise ValueError(
                    f"model: the starting rates of node {name!r} must be finite and >= 0."
                )
    observations.checked(model, emissions)  # a ValueError now for concrete states
    counts = [b.num_observations for b in as_flat_buckets(observations)]
    if is_concrete(*counts) and not any(np.any(np.asarray(m) >= 2) for m in counts):
        raise ValueError(
            "observations: every trajectory has a single observation time, so there is no "
            "interval to fit rates from; each subject needs at least two visits."
        )
    # host-side (numpy) arrays where possible: each eager jax operation costs a dispatch
    dtype = np.dtype(jnp.result_type(*model.cims))
    tolerance = method.tolerance
    tolerance = np.asarray(tolerance, dtype) if is_concrete(tolerance) else tolerance
    method = eqx.tree_at(
        lambda m: m.tolerance, method, jnp.asarray(tolerance, dtype)
    )  # data, so that a new tolerance does not recompile
    # the prior as arrays: one compiled fit serves every prior, and none
    N = model.num_nodes
    if prior is None:
        parameters = (np.ones(N, dtype), np.zeros(N, dtype), np.asarray(False))
    else:
        pairs = [prior.node_parameters(n) for n in range(N)]
        parameters = (
            jnp.stack([jnp.asarray(a, dtype) for a, _ in pairs]),
            jnp.stack([jnp.asarray(b, dtype) for _, b in pairs]),
            jnp.asarray(True),
        )
    # intervals of equal length share their dense exponentials (see `_pooled_by_gaps`): only
    # for concrete data without interventions and the dense solver
    groups = None
    no_intervention = as_flat_buckets(observations)[0].intervention is None
    if no_intervention and isinstance(solver, MatrixExponential):
        groups = gap_groups(observations)
    return parameters, groups, method


@eqx.filter_jit
def _fit(
    model, observations, method, prior, emissions, initial_distribution, solver, groups, covariates
):
    problem = _problem(
        model, observations, prior, emissions, initial_distribution, solver, groups, covariates
    )
    outcome = method.fit(problem)
    effects = outcome.effects
    rates = problem.clip(outcome.rates)  # (the optimisers stay inside; rounding)
    # a rate driven to infinity creeps up (the objective flattens out); try the fast rates at
    # the top of the box, ratios kept, and keep that when the objective does not decrease
    candidates = tuple(f & (q * problem.shortest >= _PUSH) for q, f in zip(rates, problem.free))
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
