"""How [`jaxctbn.panel.fit_rates`][] maximises its objective: [`jaxctbn.panel.EMFit`][],
[`jaxctbn.panel.GradientFit`][] and [`jaxctbn.panel.SquaremFit`][] over a
`FitProblem`, and the loop EM and SQUAREM share.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from typing import Any, ClassVar, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._model.interventions import is_concrete
from .fit_problem import FitProblem


class FitOutcome(eqx.Module):
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


def _selected(condition: Array, new: Any, old: Any) -> Any:
    """Leaf by leaf, `new` where the scalar `condition` holds, else `old`."""
    return jax.tree_util.tree_map(lambda a, b: jnp.where(condition, a, b), new, old)


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
    def fit(self, problem: FitProblem) -> FitOutcome:
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
        def phase(k, rates, point, objective, stats, memory):
            # one E-step per iteration, at the EM step from the last iterate: its proposal
            return point, memory, (point, objective, stats, jnp.asarray(True))

        return ascent(problem, self.max_iterations, self.tolerance, 1, phase, lambda *_: ())


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
            theta = _selected(ok, new_theta, theta)
            state = _selected(ok, new_state, state)
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
        return FitOutcome(
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
            for (a, b), q, f in zip(problem.counts(stats), rates, free):
                g = a - b * q
                at_low = q <= problem.lower * (1 + 1e-9)
                at_high = q >= problem.upper * (1 - 1e-9)
                g = jnp.where(f & ~(at_low & (g < 0)) & ~(at_high & (g > 0)), g, 0)
                largest = jnp.maximum(largest, jnp.max(jnp.abs(g), initial=0))
            return largest

        def norm(tree):
            return jnp.sqrt(sum(jnp.sum(x**2) for x in tree))

        def phase(k, rates, point, objective, stats_at, memory):
            # the four E-steps of an iteration from θ0 = log `rates`, one per pass of the loop:
            # k = 0: `point` is F(θ0), next F(F(θ0)); k = 1: `point` is F(F(θ0)), kept, next the
            # extrapolation; k = 2: next its stabilisation; k = 3: the last, and the proposal
            one, two, objective_two, stats_two = memory
            one = _selected(k == 0, point, one)
            stepped = update(point, stats_at)
            two = _selected(k == 1, point, two)
            objective_two = jnp.where(k == 1, objective, objective_two)
            stats_two = _selected(k == 1, stats_at, stats_two)
            t0 = log_of(rates)
            t1, t2 = log_of(one), log_of(two)
            r = tuple(b - a for a, b in zip(t0, t1))
            v = tuple(c - 2 * b + a for a, b, c in zip(t0, t1, t2))
            norm_r, norm_v = norm(r), norm(v)
            length = -jnp.maximum(1.0, norm_r / jnp.where(norm_v > 0, norm_v, 1))
            length = jnp.where(norm_v > 0, length, -1.0)
            jumped = rates_of(
                tuple(a - 2 * length * x + length**2 * y for a, x, y in zip(t0, r, v))
            )
            following = _selected(k == 1, jumped, stepped)
            # the proposal (read at k = 3): the stabilised extrapolation when its objective is
            # at least that of the double step F(F(θ0)), else the double step
            take = jnp.isfinite(objective) & (objective >= objective_two)
            new_rates = _selected(take, point, two)
            new_objective = jnp.where(take, objective, objective_two)
            new_stats = _selected(take, stats_at, stats_two)
            scale = 1 + jnp.abs(new_objective)
            small_gradient = projected_gradient(new_rates, new_stats) <= jnp.sqrt(tol) * scale
            memory = (one, two, objective_two, stats_two)
            return following, memory, (new_rates, new_objective, new_stats, small_gradient)

        def memory(start, stats):  # (F(θ0), F(F(θ0)), its objective and statistics)
            return start, start, jnp.zeros((), dtype), stats

        return ascent(problem, self.max_iterations, self.tolerance, 4, phase, memory)


def ascent(
    problem: FitProblem,
    max_iterations: int,
    tolerance,
    phases: int,
    phase: Callable[..., tuple[Any, Any, tuple[Any, Array, Any, Array]]],
    memory: Callable[[tuple[Array, ...], Any], Any],
) -> FitOutcome:
    """The loop of [`jaxctbn.panel.EMFit`][] and [`jaxctbn.panel.SquaremFit`][], one E-step per
    pass, so that the compiled program holds a single forward-backward pass.

    The first pass evaluates the start (its objective, statistics and impossible-observation
    flags); each iteration then takes `phases` passes. A pass evaluates the E-step at `point`
    and calls `phase(k, rates, point, objective, stats, memory)`, `k` the pass within the
    iteration and `rates` the last iterate, which returns the next point, the method's
    `memory` (at first `memory(start, statistics of zeros)`) and its proposal `(rates,
    objective, stats, small_gradient)` (read on the last pass). An iteration's first point is
    the EM step from the last iterate. A non-finite objective stops the loop at the last finite
    iterate, and the fit has converged when the relative change of the objective is at most
    `tolerance` and `small_gradient` holds. No iteration runs when an observation is impossible
    at the start."""
    tol = jnp.asarray(tolerance, problem.tau.dtype)
    start = problem.start()
    objective_shape, stats_shape, bad_shape = jax.eval_shape(problem.e_step, start)
    zeros = lambda tree: jax.tree_util.tree_map(  # noqa: E731
        lambda x: jnp.zeros(x.shape, x.dtype), tree
    )

    def cond(carry):
        _, k, _, _, _, it, _, stop, _, _, _ = carry
        return ~stop & ((k != 0) | (it < max_iterations))

    def body(carry):
        point, k, rates, objective, stats, it, trace, stop, converged, memory, bad = carry
        objective_at, stats_at, bad_at = problem.e_step(point)
        following, memory, proposal = phase(
            jnp.maximum(k, 0), rates, point, objective_at, stats_at, memory
        )
        new_rates, new_objective, new_stats, small_gradient = proposal
        first, last = k < 0, k == phases - 1  # the start's pass; an iteration's last
        finite = jnp.isfinite(new_objective)
        change = jnp.abs(new_objective - objective)
        converged_now = finite & (change <= tol * (1 + jnp.abs(new_objective))) & small_gradient
        accept = last & finite
        rates = _selected(first, point, _selected(accept, new_rates, rates))
        objective = jnp.where(first, objective_at, jnp.where(accept, new_objective, objective))
        stats = _selected(first, stats_at, _selected(accept, new_stats, stats))
        bad = _selected(first, bad_at, bad)
        it = it + accept.astype(it.dtype)
        trace = jnp.where(
            first,
            jnp.full_like(trace, objective),
            jnp.where(last, trace.at[it].set(objective), trace),
        )
        stop = jnp.where(first, _any(bad_at), jnp.where(last, converged_now | ~finite, stop))
        converged = jnp.where(last, converged_now, converged)
        boundary = first | last
        following = _selected(boundary, problem.m_step(rates, stats), following)
        k = jnp.where(boundary, 0, k + 1)
        return following, k, rates, objective, stats, it, trace, stop, converged, memory, bad

    no = jnp.asarray(False)
    carry = (
        start,
        jnp.asarray(-1, jnp.int32),
        start,
        jnp.zeros(objective_shape.shape, objective_shape.dtype),
        zeros(stats_shape),
        jnp.zeros((), jnp.int32),
        jnp.zeros((max_iterations + 1,), objective_shape.dtype),
        no,
        no,
        memory(start, zeros(stats_shape)),
        zeros(bad_shape),
    )
    carry = jax.lax.while_loop(cond, body, carry)
    _, _, rates, objective, _, it, trace, _, converged, _, bad = carry
    return FitOutcome(
        rates=rates,
        objective=objective,
        converged=converged,
        iterations=it,
        trace=_padded(trace, it, objective),
        bad=bad,
    )
