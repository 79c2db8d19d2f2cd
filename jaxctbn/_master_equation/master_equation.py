r"""The master equation of a cCTBN and the expected path statistics it yields.

For a generator $W$ and initial distribution $p_0$ we need, over $[0,\tau]$,

$$p_\tau = p_0 e^{\tau W},\qquad \mathsf E[T(s)] = \int_0^\tau p_t(s)\,\mathrm dt,\qquad
\mathsf E[M(s,s')] = W(s,s')\,\mathsf E[T(s)]$$

(maths §1), for any solver of [`jaxctbn.AbstractMasterEquationSolver`][] (default
[`jaxctbn.Uniformisation`][]), or approximately for large networks. The entry points:
[`jaxctbn.expected_statistics`][] and its batched form, the solves shared by the interventions
that clamp the same nodes, and [`jaxctbn.marginals`][] on a time grid.
"""

from __future__ import annotations

from typing import cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._errors import error_if
from .._model.ctbn import AbstractCTBN
from .._model.interventions import Intervention, is_concrete
from .._model.layout import all_global_states
from .automatic_solver import AUTOMATIC_SOLVER, resolve_solver
from .generator import amalgamate
from .preparation import (
    check_horizon_shape,
    checked_horizon,
    initial_distribution,
    prepare_experiment,
    prepare_model,
)
from .solver import AbstractMasterEquationSolver, StatisticsSolver
from .statistics import AbstractExpectedStatistics, ExpectedStatistics
from .uniformisation import DEFAULT_SOLVER


def expected_statistics(
    model: AbstractCTBN,
    initial_state: ArrayLike,
    horizon: ArrayLike,
    *,
    intervention: Intervention | None = None,
    solver: StatisticsSolver = AUTOMATIC_SOLVER,
) -> AbstractExpectedStatistics:
    r"""Solve the master equation of `model` over $[0,\tau]$ and return the expected statistics.

    **Arguments:**

    - `model`: a [`jaxctbn.CTBN`][] or [`jaxctbn.PaddedCTBN`][].
    - `initial_state`: an initial state (ints, one per node) or distribution (floats).
    - `horizon`: $\tau>0$, a scalar.
    - `intervention`: an optional [`jaxctbn.Intervention`][].
    - `solver`: a master-equation solver ([`jaxctbn.Uniformisation`][], the fastest exact
      route measured in `benchmarks/master_equation/bench_master_equation.py`, ...), an approximate one for
      networks too large for the global state space ([`jaxctbn.MeanField`][]), or the default
      [`jaxctbn.AutomaticSolver`][]: exact up to $2^{14}$ global states, mean-field beyond
      (`resolve_solver` tells which).

    **Returns:** an [`jaxctbn.ExpectedStatistics`][] (exact solvers) or the approximate
    solver's [`jaxctbn.AbstractExpectedStatistics`][] (e.g. `MeanFieldStatistics`).

    Pure: works under `jax.jit`, `jax.vmap` (over models, interventions, initial states) and
    `jax.grad` (with respect to the rates). Compiled (`eqx.filter_jit`, like diffrax's
    `diffeqsolve`): an eager call compiles one program per model structure, solver and shape of
    the arguments, and a new horizon, initial state or rates reuse it (Python numbers and lists
    are converted to arrays first, so they are traced rather than baked in).

    Shapes are checked now (`ValueError`); values inside jit (`eqx.error_if`): rates of the model
    and of the intervened model finite and $\ge0$, node states and clamped states in `0..k-1`, a
    distribution that sums to 1, $\tau$ positive and finite (clamped states are checked now,
    with a `ValueError`, when the intervention is concrete). Each check guards every array
    computed from the value it checks (`final_marginal`, `dwell_times` and the node statistics
    projected from them), so selecting any one of them under `jax.jit` still raises.
    """
    check_horizon_shape(horizon)
    _check_concrete_intervention(model, intervention)
    solver = resolve_solver(solver, model).sized(model, horizon, intervention)
    return _expected_statistics(
        model, jnp.asarray(initial_state), _as_rate_array(horizon, model), intervention, solver
    )


def _as_rate_array(value: ArrayLike, model: AbstractCTBN) -> Array:
    """A Python number or list as an array of the rates' dtype (the dtype the solve casts it
    to), so that it is traced by the compiled verb instead of being compiled in as a
    constant; an array is passed on as it is."""
    if isinstance(value, jax.Array | np.ndarray):
        return jnp.asarray(value)
    return jnp.asarray(value, jnp.result_type(*model.cims))


def _check_concrete_intervention(model: AbstractCTBN, intervention: Intervention | None) -> None:
    """The `ValueError` (naming the clamped state) of a concrete intervention's states, before
    they become tracers inside the compiled solve (where the same check is an `eqx.error_if`)."""
    if intervention is not None and is_concrete(intervention.targets, intervention.states):
        intervention.checked(model)


@eqx.filter_jit
def _expected_statistics(model, initial_state, horizon, intervention, solver):
    solver = resolve_solver(solver, model)
    return solver.solve_statistics(model, initial_state, horizon, intervention)


def expected_statistics_batch(
    models: AbstractCTBN,
    initial_state: ArrayLike,
    horizon: ArrayLike,
    *,
    interventions: Intervention | None = None,
    solver: StatisticsSolver = AUTOMATIC_SOLVER,
) -> AbstractExpectedStatistics:
    """[`jaxctbn.expected_statistics`][] for a batch: `models`, `initial_state` and `interventions`
    carry a leading batch axis (broadcast them yourself); `horizon` is shared. Uses the solver's
    batched form (one shared-step ODE solve for [`jaxctbn.DiffraxSolver`][]). Compiled like
    [`jaxctbn.expected_statistics`][].
    """
    check_horizon_shape(horizon)
    return _expected_statistics_batch(
        models, jnp.asarray(initial_state), _as_rate_array(horizon, models), interventions, solver
    )


@eqx.filter_jit
def _expected_statistics_batch(models, initial_state, horizon, interventions, solver):
    solver = resolve_solver(solver, models)
    return solver.solve_statistics_batch(models, initial_state, horizon, interventions)


class ClampPatternStatistics(eqx.Module):
    """What `clamp_pattern_statistics` returns: `statistics`, a batch `(patterns * B,)`
    pattern-major (pattern $q$ clamps the clampable nodes whose bit is set in $q$, the first
    clampable node being bit 0);
    `clamped` `(patterns, N)`, the nodes each pattern clamps; `pattern` `(C,)`, each
    intervention's pattern; `valid` `(C,)`, whether it clamps clampable nodes only."""

    statistics: ExpectedStatistics
    clamped: Array
    pattern: Array
    valid: Array

    def on_sub_cubes(self, interventions: Intervention, states: Array) -> Array:
        """`(C, rows)`: whether each row of `states` `(rows, N)` lies in each intervention's
        sub-cube (its clamped nodes at their clamped states; false where not `valid`)."""
        targets = jnp.asarray(interventions.targets, bool)
        inside = ~targets[:, None, :] | (states[None] == jnp.asarray(interventions.states)[:, None])
        return inside.all(-1) & self.valid[:, None]

    def members(self, interventions: Intervention) -> ExpectedStatistics:
        """The statistics of every (intervention, model) pair, `(C * B,)` intervention-major:
        its pattern's solve with its model, masked to its own sub-cube (zeros where not
        `valid`). `interventions`: the ones the patterns were solved for."""
        stats = self.statistics
        Q = self.clamped.shape[0]
        B = stats.dwell_times.shape[0] // Q
        states = jnp.asarray(all_global_states(stats.model.cardinalities))  # (S, N)
        mask = self.on_sub_cubes(interventions, states).astype(stats.dwell_times.dtype)
        mask = jnp.repeat(mask, B, axis=0)
        rows = (self.pattern[:, None] * B + jnp.arange(B, dtype=jnp.int32)).reshape(-1)

        def take(a):
            return a[rows]

        return ExpectedStatistics(
            final_marginal=stats.final_marginal[rows] * mask,
            dwell_times=stats.dwell_times[rows] * mask,
            generator=jax.tree_util.tree_map(take, stats.generator),
            model=jax.tree_util.tree_map(take, stats.model),
        )


def clamp_pattern_statistics(
    models: AbstractCTBN,
    initial_state: ArrayLike,
    horizon: ArrayLike,
    interventions: Intervention,
    *,
    clampable: tuple[int, ...] | np.ndarray | Array,
    solver: StatisticsSolver = AUTOMATIC_SOLVER,
) -> ClampPatternStatistics:
    r"""One solve per model of a batch (`models`, leading axis $B$) and *clamp pattern* for a
    batch of **perfect** interventions (`interventions`, leading axis $C$).

    Interventions that clamp the same set $J$ of nodes (a pattern) differ only in the clamped
    states $x_J$. With $J$'s rates zero, the generator has no flow between the sub-cubes
    $\{s:s_J=x_J\}$ and acts on each alone, and the other nodes' rates are the same functions
    of the state whatever $x_J$ is; so one solve from the sum of the initial distributions of
    the pattern's distinct members (disjoint supports, each with its own mass) gives every
    member's statistics on its own sub-cube, exactly (and linearly, so also their gradients): per model, $2^{|\text{clampable}|}$ solves for
    $C$ interventions (8 for the 27 interventions of the paper's space that leave a node free).
    The solver's error is per solve (a shared uniformisation rate is the largest of the
    pattern's, which changes results by rounding only).

    - `clampable`: the nodes the patterns may clamp (a static tuple, or a traced integer
      array: the other nodes of a node traced in its group); an intervention that clamps
      another node is left out of every pattern (`valid` false).
    - `solver`: an exact master-equation solver (the sharing needs a solution linear in $p_0$);
      an approximate one is a `ValueError`.
    """
    check_horizon_shape(horizon)
    if interventions.rate_scales is not None or interventions.replacement_cims is not None:
        raise ValueError(
            "interventions: the clamp-pattern solves take perfect interventions only (no "
            "rate_scales or replacement_cims); use expected_statistics_batch."
        )
    solver = resolve_solver(solver, models)
    if not isinstance(solver, AbstractMasterEquationSolver):
        raise ValueError(
            f"solver: the clamp-pattern solves need an exact solver, got {solver!r} (an "
            "approximation is not linear in the initial distribution)."
        )
    cards = models.cardinalities
    N = len(cards)
    if isinstance(clampable, tuple | list | np.ndarray):  # static: checked here
        listed = [int(j) for j in np.reshape(clampable, -1)]
        if len(set(listed)) != len(listed) or not all(0 <= j < N for j in listed):
            raise ValueError(
                f"clampable: distinct node indices in 0..{N - 1}, got {tuple(listed)!r}."
            )
        nodes: np.ndarray | Array = np.asarray(listed, np.int32)
    else:
        nodes = clampable
    B = jax.tree_util.tree_leaves(models)[0].shape[0]
    C = interventions.targets.shape[0]
    L = nodes.shape[0]
    P = 2**L
    targets = jnp.asarray(interventions.targets, bool)
    outside = jnp.ones(N, bool).at[nodes].set(False)
    valid = ~(targets & outside).any(-1)  # (C,): clamps only clampable nodes
    pattern = sum(
        (targets[:, nodes[b]].astype(jnp.int32) << b for b in range(L)),
        start=jnp.zeros((C,), jnp.int32),
    )
    # the pattern's initial distribution: the sum of its distinct members' (disjoint
    # supports); a member equal to an earlier one (same clamped nodes and states) is left out
    first = jax.tree_util.tree_map(lambda a: a[0], models)
    p0 = jax.vmap(lambda iv: initial_distribution(first, initial_state, iv))(interventions)
    states = jnp.where(targets, jnp.asarray(interventions.states), -1)
    same = (targets[:, None] == targets[None]).all(-1) & (states[:, None] == states[None]).all(-1)
    earlier = jnp.tril(same & valid[:, None] & valid[None], k=-1).any(1)
    distinct = (valid & ~earlier).astype(p0.dtype)
    p0 = jax.ops.segment_sum(distinct[:, None] * p0, pattern, num_segments=P)  # (P, S)
    # pattern q clamps the clampable node nodes[b] where bit b of q is set
    bits = (np.arange(P)[:, None] >> np.arange(L)) & 1  # (P, L)
    clamps = jnp.zeros((P, N), bool).at[:, nodes].set(jnp.asarray(bits, bool))
    patterns = Intervention(targets=clamps, states=jnp.zeros((P, N), jnp.int32))
    grid = jax.tree_util.tree_map(
        lambda a: jnp.broadcast_to(a, (P, *a.shape)).reshape(P * B, *a.shape[1:]), models
    )
    grid, _ = jax.vmap(prepare_model)(
        grid, jax.tree_util.tree_map(lambda a: jnp.repeat(a, B, axis=0), patterns)
    )
    gens = jax.vmap(amalgamate)(grid)
    p0 = jnp.repeat(p0, B, axis=0)
    horizon = checked_horizon(horizon, p0.dtype)
    p_final, dwell = solver.solve_batch(gens, p0, horizon)
    stats = ExpectedStatistics(
        final_marginal=p_final, dwell_times=dwell, generator=gens, model=grid
    )
    return ClampPatternStatistics(
        statistics=stats, clamped=jnp.asarray(clamps), pattern=pattern, valid=valid
    )


def marginals(
    model: AbstractCTBN,
    initial_state: ArrayLike,
    times: ArrayLike,
    *,
    intervention: Intervention | None = None,
    solver: AbstractMasterEquationSolver = DEFAULT_SOLVER,
) -> tuple[Float[Array, "times global_states"], Float[Array, "times global_states"]]:
    r"""Marginals $p_t$ and cumulative dwell times $\int_0^t p_s ds$ at non-decreasing `times`
    ($\ge 0$), one solve per interval inside a `lax.scan`. Compiled like
    [`jaxctbn.expected_statistics`][]: new `times` of the same length reuse the program."""
    _check_concrete_intervention(model, intervention)
    return _marginals(
        model, jnp.asarray(initial_state), _as_rate_array(times, model), intervention, solver
    )


@eqx.filter_jit
def _marginals(model, initial_state, times, intervention, solver):
    model, gen, p0 = prepare_experiment(model, initial_state, intervention)
    times = jnp.asarray(times, p0.dtype)
    if times.ndim != 1:
        raise ValueError(f"times: expected a 1-d array, got shape {times.shape}.")
    times = cast(
        Array,
        error_if(
            times,
            jnp.any(times < 0) | jnp.any(jnp.diff(times) < 0) | jnp.any(~jnp.isfinite(times)),
            "times: must be finite, >= 0 and non-decreasing.",
        ),
    )
    increments = jnp.diff(times, prepend=jnp.zeros((1,), times.dtype))

    def step(carry, dt):
        p, acc = carry

        safe_dt = jnp.where(dt > 0, dt, jnp.ones_like(dt))
        p_adv, integral = solver.solve(gen, p, safe_dt)
        p_new = jnp.where(dt > 0, p_adv, p)
        integral = jnp.where(dt > 0, integral, jnp.zeros_like(p))
        acc = acc + integral
        return (p_new, acc), (p_new, acc)

    _, (ps, accs) = jax.lax.scan(step, (p0, jnp.zeros_like(p0)), increments)
    return ps, accs
