r"""What a solver of the expected statistics is: `AbstractStatisticsSolver`, what the verbs
call on any of them; [`jaxctbn.AbstractMasterEquationSolver`][], the exact solvers over the global
states (the final and integrated marginals, the backward equation and the forward-backward
interval integrals); [`jaxctbn.AbstractApproximateSolver`][], the routes to the node statistics
that never form the global states; and the check of the state space an exact solver accepts."""

from __future__ import annotations

import abc
import math
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

from .generator import AbstractGenerator
from .preparation import checked_horizon, prepare_experiment
from .statistics import ExpectedStatistics


class AbstractStatisticsSolver(eqx.Module):
    r"""Every solver of the expected statistics: an exact one over the global states
    ([`jaxctbn.AbstractMasterEquationSolver`][]), an approximate one
    ([`jaxctbn.AbstractApproximateSolver`][]), or [`jaxctbn.AutomaticSolver`][], which chooses
    between them by the size of the network. The verbs ([`jaxctbn.expected_statistics`][] and its
    batched form) call these methods and never ask which kind of solver they hold."""

    @abc.abstractmethod
    def resolve(self, model) -> AbstractMasterEquationSolver | AbstractApproximateSolver:
        """The solver this one stands for on `model` (see
        `resolve_solver`), checked against the global states it handles."""

    @abc.abstractmethod
    def sized(self, model, horizon, intervention) -> AbstractStatisticsSolver:
        """This solver with the static sizes it takes from concrete rates and horizon fixed
        (called before the compiled solve of an eager [`jaxctbn.expected_statistics`][], where
        they are still concrete); `self` when it has none."""

    @abc.abstractmethod
    def solve_statistics(self, model, initial_state, horizon, intervention) -> Any:
        r"""The [`jaxctbn.AbstractExpectedStatistics`][] of `model` over $[0,\tau]$ from
        `initial_state` under `intervention` (`None` = none), with `horizon` checked here."""

    @abc.abstractmethod
    def solve_statistics_batch(self, models, initial_state, horizon, interventions) -> Any:
        """`solve_statistics` for a batch: `models`, `initial_state` and `interventions` (or
        `None`) with a leading batch axis, `horizon` shared."""


class AbstractMasterEquationSolver(AbstractStatisticsSolver):
    r"""Solves the master equation $\dot p_t=p_tW$ of one amalgamated generator $W$ (a row
    vector $p$ over the $S$ global states), its adjoint $-\dot\beta_t=W\beta_t$ (a column vector
    $\beta$), and the forward-backward interval integrals.

    To add a solver, subclass this and implement `solve`, `solve_batch`, `solve_backward` and
    `forward_backward`; `solve_backward_batch` has a default (`jax.lax.map` over
    `solve_backward`) that a subclass may override with a faster batched form. Every method must
    be pure (work under `jax.jit` and `jax.vmap`) and should be reverse-mode differentiable with
    respect to the rates inside `generator`. Only [`jaxctbn.AbstractGenerator.apply`][]
    ($p\mapsto pW$), [`jaxctbn.AbstractGenerator.apply_transpose`][] ($v\mapsto Wv$),
    `shifts`/`shift_rates` and, for small networks, `dense()` are available from a generator.
    """

    #: The most global states this solver accepts (see `check_state_space`): its vectors of $S$
    #: entries (float64: 512 MiB at $2^{26}$) and the int32 indices of the generator's shifts.
    state_space_limit: ClassVar[int] = 2**26
    #: Whether panel inference tabulates $e^{\Delta W}$ once per distinct gap $\Delta$ with
    #: `transition_matrices` and shares the table across trajectories (dense solvers), rather
    #: than calling `forward_backward` per interval.
    tabulates_gaps: ClassVar[bool] = False

    def gap_rate_limit(self, default: float) -> float:
        r"""The largest exit rate $\times$ gap that panel fitting lets this solver see (its
        step of the rates is shortened to stay below): `default` unless the solver's own
        buffers bound it."""
        return default

    @abc.abstractmethod
    def solve(self, generator: AbstractGenerator, p0: Array, horizon: Array) -> tuple[Array, Array]:
        r"""The forward (master) equation $\dot p_t=p_tW$ on $[0,\tau]$ from $p_0$.

        **Arguments:**

        - `generator`: the amalgamated generator $W$ (one network, `batch_shape == ()`).
        - `p0`: the initial row vector $p_0$, shape `(S,)` (a distribution, or any vector).
        - `horizon`: $\tau>0$, a scalar (already validated by the caller).

        **Returns:** `(final_marginal, integrated_marginal)`: $p_\tau=p_0e^{\tau W}$ and
        $\int_0^\tau p_t\,dt$, both of shape `(S,)` and the dtype of `p0`.
        """

    @abc.abstractmethod
    def solve_batch(
        self, generators: AbstractGenerator, p0: Array, horizon: Array
    ) -> tuple[Array, Array]:
        r"""`solve` for a batch of problems sharing one $\tau$.

        **Arguments:**

        - `generators`: a batch of generators, every array with a leading batch axis `B`
          (e.g. from `jax.vmap(amalgamate)`); see `batch_last` for a vectorised
          product over the batch.
        - `p0`: initial row vectors, shape `(B, S)`.
        - `horizon`: $\tau>0$, one scalar shared by the batch.

        **Returns:** `(final_marginal, integrated_marginal)`, each of shape `(B, S)`.
        """

    @abc.abstractmethod
    def solve_backward(
        self, generator: AbstractGenerator, beta_end: Array, horizon: Array
    ) -> tuple[Array, Array]:
        r"""The backward (adjoint) equation $-\dot\beta_t=W\beta_t$ on $[0,\tau]$ with final
        condition $\beta_\tau$.

        **Arguments:**

        - `generator`: the amalgamated generator $W$ (one network).
        - `beta_end`: the final column vector $\beta_\tau$, shape `(S,)` (e.g. the likelihood of
          an observation at $\tau$ as a function of the global state).
        - `horizon`: $\tau>0$, a scalar.

        **Returns:** `(beta_start, integrated_beta)`: $\beta_0=e^{\tau W}\beta_\tau$ and
        $\int_0^\tau\beta_t\,dt=\int_0^\tau e^{tW}\beta_\tau\,dt$, both of shape `(S,)`.
        With $\beta_\tau=\mathbf 1$, $\beta_0=\mathbf 1$ (the rows of $e^{\tau W}$ sum to one).
        """

    def solve_backward_batch(
        self, generators: AbstractGenerator, beta_end: Array, horizon: Array
    ) -> tuple[Array, Array]:
        r"""`solve_backward` for a batch sharing one $\tau$ (leading batch axis `B` on
        `generators` and on `beta_end`, shape `(B, S)`).

        **Returns:** `(beta_start, integrated_beta)`, each of shape `(B, S)`. The default runs
        `solve_backward` once per member with `jax.lax.map`; override it for a vectorised form.
        """
        return jax.lax.map(
            lambda gb: self.solve_backward(gb[0], gb[1], horizon), (generators, beta_end)
        )

    def propagate(self, generator: AbstractGenerator, p0: Array, horizon: Array) -> Array:
        r"""$p_\tau=p_0e^{\tau W}$ alone (the panel filter's prediction; `solve` without the
        integral). The default takes it from `solve`; a solver may compute it more cheaply."""
        return self.solve(generator, p0, horizon)[0]

    def propagate_backward(
        self, generator: AbstractGenerator, beta_end: Array, horizon: Array
    ) -> Array:
        r"""$\beta_0=e^{\tau W}\beta_\tau$ alone (`solve_backward` without the integral)."""
        return self.solve_backward(generator, beta_end, horizon)[0]

    @abc.abstractmethod
    def forward_backward(
        self, generator: AbstractGenerator, alpha_start: Array, beta_end: Array, horizon: Array
    ) -> tuple[Array, Array]:
        r"""Interval integrals of forward times backward solution, for forward-backward smoothing.

        With $\alpha_t=\alpha_0e^{tW}$ (row vector) and $\beta_t=e^{(\tau-t)W}\beta_\tau$ (column
        vector), and for shift $r=(n,j)$ of `generator.shifts`, $s_r'$ the global state reached
        from $s$ by moving node $n$ forward by $j$ (mod $k_n$):

        $$\mathrm{dwell}(s)=\int_0^\tau\alpha_t(s)\,\beta_t(s)\,dt,\qquad
        \mathrm{flux}_r(s)=\int_0^\tau\alpha_t(s)\,\beta_t(s_r')\,dt .$$

        Conditioned on the evidence summarised by $\alpha_0$ and $\beta_\tau$, the expected dwell
        time in $s$ is $\mathrm{dwell}(s)/Z$ and the expected number of $s\to s_r'$ transitions
        is $R_r(s)\,\mathrm{flux}_r(s)/Z$ (`generator.shift_rates(r)`), with
        $Z=\alpha_0\beta_0=\alpha_t\beta_t$ for every $t$; that normalisation is the caller's.
        Since $\alpha_t\beta_t$ is constant, $\sum_s\mathrm{dwell}(s)=\tau\,\alpha_0\beta_0$.

        **Arguments:**

        - `generator`: the amalgamated generator $W$ (one network).
        - `alpha_start`: the row vector $\alpha_0$, shape `(S,)`.
        - `beta_end`: the column vector $\beta_\tau$, shape `(S,)`.
        - `horizon`: $\tau>0$, a scalar.

        **Returns:** `(dwell, flux)` of shapes `(S,)` and `(len(generator.shifts), S)`.
        """

    def resolve(self, model) -> AbstractMasterEquationSolver:
        """`self`, after a `ValueError` if `model` has more global states than it handles."""
        check_state_space(self, model.cardinalities)
        return self

    def sized(self, model, horizon, intervention) -> AbstractMasterEquationSolver:
        """`self` (an exact solver takes no sizes from the values)."""
        return self

    def solve_statistics(self, model, initial_state, horizon, intervention) -> Any:
        """The [`jaxctbn.ExpectedStatistics`][] of one experiment: `solve` from the initial
        distribution on the generator of the (intervened) model."""
        model, gen, p0 = prepare_experiment(model, initial_state, intervention)
        horizon = checked_horizon(horizon, p0.dtype)
        p_final, dwell = self.solve(gen, p0, horizon)
        return ExpectedStatistics(
            final_marginal=p_final, dwell_times=dwell, generator=gen, model=model
        )

    def solve_statistics_batch(self, models, initial_state, horizon, interventions) -> Any:
        """`solve_statistics` for a batch, by `solve_batch`."""
        if interventions is None:
            prepared = jax.vmap(lambda m, x: prepare_experiment(m, x, None))(models, initial_state)
        else:
            prepared = jax.vmap(prepare_experiment)(models, initial_state, interventions)
        models, gens, p0 = prepared
        horizon = checked_horizon(horizon, p0.dtype)
        p_final, dwell = self.solve_batch(gens, p0, horizon)
        return ExpectedStatistics(
            final_marginal=p_final, dwell_times=dwell, generator=gens, model=models
        )


class AbstractApproximateSolver(AbstractStatisticsSolver):
    r"""An approximate route to the expected node statistics that never forms the $S=\prod_n k_n$
    global states, for networks too large for an exact solver ([`jaxctbn.MeanField`][],
    deterministic and fast; [`jaxctbn.Gillespie`][], unbiased Monte Carlo with standard
    errors). Pass it wherever a `solver` of the expected statistics is taken
    ([`jaxctbn.expected_statistics`][], the design criteria, the active-learning loop): they
    call `expected_statistics` instead of solving the master equation over the global states,
    and use the returned [`jaxctbn.AbstractExpectedStatistics`][] as they would the exact one.
    Must be pure (work under `jax.jit`, `jax.vmap` and `jax.grad`)."""

    @abc.abstractmethod
    def expected_statistics(self, model, initial_state, horizon, intervention) -> Any:
        r"""The (approximate) [`jaxctbn.AbstractExpectedStatistics`][] of `model` over
        $[0,\tau]$ from `initial_state` (node states `(N,)`) under `intervention`
        (`None` = none); `horizon` is already validated."""

    @abc.abstractmethod
    def sized(self, model, horizon, intervention) -> Any:
        """This solver with the static sizes it takes from concrete rates and horizon fixed
        (called before the compiled solve of an eager [`jaxctbn.expected_statistics`][], where
        they are still concrete); `self` when it has none."""

    def resolve(self, model) -> AbstractApproximateSolver:
        """`self` (an approximation is not limited by the global states)."""
        return self

    def solve_statistics(self, model, initial_state, horizon, intervention) -> Any:
        """`expected_statistics` with the horizon checked."""
        horizon = checked_horizon(horizon, jnp.result_type(*model.cims))
        return self.expected_statistics(model, initial_state, horizon, intervention)

    def solve_statistics_batch(self, models, initial_state, horizon, interventions) -> Any:
        """`expected_statistics` vmapped over the batch, with the horizon checked."""
        horizon = checked_horizon(horizon, jnp.result_type(*models.cims))
        if interventions is None:
            return jax.vmap(lambda m, x: self.expected_statistics(m, x, horizon, None))(
                models, initial_state
            )
        return jax.vmap(lambda m, x, i: self.expected_statistics(m, x, horizon, i))(
            models, initial_state, interventions
        )


#: Every solver of the expected statistics: exact (over the global states), approximate, or
#: chosen by the size of the network.
StatisticsSolver = AbstractStatisticsSolver


def check_state_space(solver, cardinalities) -> None:
    r"""A one-line `ValueError` before anything is allocated when an exact solver would work on
    more global states $S=\prod_n k_n$ than it handles (`state_space_limit`); approximate
    solvers are not limited."""
    if not isinstance(solver, AbstractMasterEquationSolver):
        return
    states = math.prod(int(k) for k in cardinalities)
    if states > solver.state_space_limit:
        raise ValueError(
            f"solver: {len(cardinalities)} nodes have {states:,} global states, more than the "
            f"exact {type(solver).__name__} handles ({solver.state_space_limit:,}); use an "
            "approximate solver, MeanField() or Gillespie() (CLI: --solver mean-field), or "
            "AutomaticSolver(), which switches to MeanField beyond 16,384 states."
        )
