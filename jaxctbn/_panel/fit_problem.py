"""The optimisation problem of [`jaxctbn.panel.fit_rates`][]: the objective (the panel
log-likelihood plus the Gamma log prior), its E- and M-steps, the box the free rates are kept
in and the boundary flags (see `fit.py`'s module docstring), built from the data's time scales.
"""

from __future__ import annotations

from typing import cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._master_equation import AbstractMasterEquationSolver
from .._model.ctbn import CTBN, with_diagonal
from .buckets import PanelBuckets, as_flat_buckets, split_rows
from .covariates import centred_values, scales_of, with_scales
from .expected_statistics import PanelExpectedStatistics
from .gap_groups import GapGroups, pooled_by_gaps
from .inference import panel_inference as _compute
from .observations import Emissions, PanelObservations

_LOWER = 1e-12  # lowest free rate, times the median gap
_UPPER = 1e8  # highest exit rate, times the longest gap (MatrixExponential and others)
PUSH = 1.0  # rate times the shortest gap from which a rate is tried at the top of the box
_FLAG_LOWER = 1e-6  # rate times the median gap below this: at the lower bound
_FLAG_UPPER = 20.0  # rate times the shortest gap at least this: at the upper bound


# --------------------------------------------------------------------------- the problem
class FitProblem(eqx.Module):
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
    prior_constant: Array  # (N,) alpha ln beta - ln Gamma(alpha) (beta 1 without a prior)
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
    class_covariates: Array | None = None  # (K, C): centred values of groups' covariate classes
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
        for n, (q, f) in enumerate(zip(rates, self.free)):
            safe = jnp.where(f, q, 1)
            term = (
                (self.alpha[n] - 1) * jnp.log(safe) - self.beta[n] * safe + self.prior_constant[n]
            )
            total = total + jnp.where(f, term, 0).sum()
        return jnp.where(self.has_prior, total, 0)

    def covariate_scales(
        self, rates: tuple[Array, ...], effects: tuple[Array, ...]
    ) -> tuple[tuple[Array, ...], ...]:
        r"""Per bucket, per node, the rate scales $e^{\beta\tilde z}$ of each trajectory
        `(R_b, configs, k, k)` (or of each observation, `(R_b, O_b, configs, k, k)`), capped so
        that no scaled rate exceeds the top of the box (where the solver's exponential would
        no longer be finite; an optimiser's trial point may ask for it, an optimum does not)."""
        assert self.covariates is not None
        return tuple(self._capped_scales(c, rates, effects) for c in self.covariates)

    def _capped_scales(
        self, centred: Array, rates: tuple[Array, ...], effects: tuple[Array, ...]
    ) -> tuple[Array, ...]:
        assert self.effect_masks is not None
        scales = scales_of(centred, effects, self.effect_masks)
        return tuple(
            jnp.minimum(s, self.upper / jnp.where(q > 0, q, self.upper))
            for s, q in zip(scales, rates)
        )

    def _pass(self, rates: tuple[Array, ...], what: str, effects: tuple[Array, ...] | None = None):
        """`(bad, result)` of the filter (`what="likelihood"`) or of forward-backward
        (`"statistics"`) at `rates` (and covariate `effects`): intervals grouped by length
        (and covariate class) when `groups` is set, otherwise each solved on its own."""
        model = self.with_rates(rates)
        buckets = PanelBuckets(self.observations, np.arange(self.pooled.shape[0]))
        if self.groups is not None:
            class_scales = None
            if effects is not None:  # one generator per covariate class (`covariate_classes`)
                assert self.class_covariates is not None
                class_scales = self._capped_scales(self.class_covariates, rates, effects)
            return pooled_by_gaps(
                model,
                buckets,
                self.emissions,
                self.initial_distribution,
                self.groups,
                what,
                class_scales,
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
                for (a, b), q, f in zip(self.counts(stats), rates, self.free)
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

    def counts(self, stats: PanelExpectedStatistics) -> list[tuple[Array, Array]]:
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
        for (a, b), q, f in zip(self.counts(stats), rates, self.free):
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
    [`with_time_periods`][jaxctbn.panel.PanelObservations.with_time_periods] are passed over)."""
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
    return solver.gap_rate_limit(_UPPER)


def fit_problem(
    model, observations, prior, emissions, initial_distribution, solver, groups, covariates=None
) -> FitProblem:
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
    # the normalising constant once (a log-gamma is a long program; the objective is traced at
    # several places of a fit)
    safe_beta = jnp.where(has_prior, beta, 1)
    prior_constant = alpha * jnp.log(safe_beta) - jax.scipy.special.gammaln(alpha)
    problem = FitProblem(
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
        prior_constant=prior_constant,
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
        if groups is not None:  # with covariates: grouped by class too (`covariate_classes`)
            assert groups.class_values is not None
            problem = eqx.tree_at(
                lambda p: p.class_covariates,
                problem,
                jnp.asarray(groups.class_values, dtype) - means,
                is_leaf=lambda x: x is None,
            )
    start = problem.clip(problem.start())
    return eqx.tree_at(lambda p: p.model, problem, problem.with_rates(start))
