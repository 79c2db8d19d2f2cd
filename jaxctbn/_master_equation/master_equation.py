r"""The master equation of a cCTBN and the expected path statistics it yields.

For a generator $W$ and initial distribution $p_0$ we need, over $[0,\tau]$,

$$p_\tau = p_0 e^{\tau W},\qquad \mathsf E[T(s)] = \int_0^\tau p_t(s)\,\mathrm dt,\qquad
\mathsf E[M(s,s')] = W(s,s')\,\mathsf E[T(s)]$$

(maths §1), for any solver of [`jaxctbn.AbstractMasterEquationSolver`][] (default
[`jaxctbn.Uniformisation`][]). Node statistics are projections of the global ones onto a node
and any parent set, behind the interface [`jaxctbn.AbstractExpectedStatistics`][].
"""

from __future__ import annotations

import abc
import math
from typing import Any, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from .._model.ctbn import AbstractCTBN
from .._model.interventions import Intervention, is_concrete
from .._model.layout import (
    all_global_states,
    config_index,
    global_state_index,
    max_configs,
    num_configurations,
    state_bins_on_sets,
)
from .generator import AbstractGenerator, amalgamate
from .solvers import (
    AUTOMATIC_SOLVER,
    DEFAULT_SOLVER,
    AbstractApproximateSolver,
    AbstractMasterEquationSolver,
    AutomaticSolver,
    StatisticsSolver,
    check_state_space,
)


# --------------------------------------------------------------------------- results
def projection_bins(model: AbstractCTBN, node: int, parents) -> tuple[Array, Array, int]:
    """`(states, configs_of_states, configs)`: all global states `(S, N)`, the configuration
    index of `parents` (default: the model's; a static tuple of indices or names, or a padded
    array) in each of them `(S,)`, and the number of configurations (padded arrays: the most
    any set of that padding can have). The binning every node projection of per-state
    statistics uses."""
    parents, configs = projection_parents(model, node, parents)
    states = jnp.asarray(all_global_states(model.cardinalities))
    return states, config_index(states, parents, model.cardinalities), configs


def projection_parents(model: AbstractCTBN, node: int, parents) -> tuple[Any, int]:
    """`(parents, configs)`: the parent set a node statistic is projected onto (`None` = the
    model's; names resolved to indices, checked not to contain `node`) and its number of
    configurations (padded arrays: the most any set of that padding can have)."""
    cards = model.cardinalities
    if parents is None:
        parents = model.parent_list(node)
    if isinstance(parents, tuple | list):
        parents = tuple(model.node_index(p) for p in parents)
        if node in parents:
            raise ValueError(f"parents: node {node} cannot be its own parent.")
        return parents, num_configurations(parents, cards)
    return parents, max_configs(node, cards, parents.shape[-1])


class AbstractExpectedStatistics(eqx.Module):
    r"""Expected node-level path statistics of a cCTBN over $[0,\tau]$: the interface the
    design criteria and the KL divergence use. The exact implementation,
    [`jaxctbn.ExpectedStatistics`][], projects global dwell times; an approximate one (mean-field,
    Monte Carlo) implements the same three methods and plugs into the criteria unchanged.

    `parents` is a static tuple of node indices or names, or a padded integer array (`-1` =
    empty slot); `None` means the model's own parents. `model` is the model the statistics
    are of (its cardinalities and default parent sets)."""

    model: eqx.AbstractVar[AbstractCTBN]

    @abc.abstractmethod
    def node_dwell_times(self, node: int | str, parents=None) -> Float[Array, "configs k"]:
        r"""$\mathsf E[\hat T_n(x,u)]$: expected time node $n$ spends in $x$ while its parent
        set `parents` is in configuration $u$."""

    @abc.abstractmethod
    def node_transitions(self, node: int | str, parents=None) -> Float[Array, "configs k k"]:
        r"""$\mathsf E[\hat M_n(x,x',u)]$: expected number of jumps $x\to x'$ of node $n$
        while `parents` is in configuration $u$ (zero diagonal)."""

    @abc.abstractmethod
    def node_statistics_on_sets(
        self, node: int, parent_sets: Int[Array, "sets max_parents"]
    ) -> tuple[Float[Array, "sets configs k k"], Float[Array, "sets configs k"]]:
        """`(node_transitions, node_dwell_times)` of `node` projected onto every padded parent
        set in `parent_sets` at once (`configs` = the most configurations any set of that
        padding can have)."""

    def nodes_statistics_on_sets(
        self, nodes: tuple[int, ...], parent_sets: Int[Array, "nodes sets max_parents"]
    ) -> tuple[Float[Array, "nodes sets configs k k"], Float[Array, "nodes sets configs k"]]:
        """[`node_statistics_on_sets`][jaxctbn.AbstractExpectedStatistics.node_statistics_on_sets]
        for several `nodes` of equal cardinality and padding, `parent_sets[i]` the sets of
        `nodes[i]`, stacked on a leading axis. By default one call per node; an implementation
        may vectorise over the nodes (the mean-field statistics do, which keeps the compiled
        program of a large network small)."""
        out = [self.node_statistics_on_sets(n, parent_sets[i]) for i, n in enumerate(nodes)]
        return jnp.stack([M for M, _ in out]), jnp.stack([T for _, T in out])


class ExpectedStatistics(AbstractExpectedStatistics):
    r"""Expected path statistics of one cCTBN over $[0,\tau]$ under one intervention.

    - `final_marginal`: $p_\tau(s)$, shape `(S,)`.
    - `dwell_times`: $\mathsf E[T(s)]=\int_0^\tau p_t(s)dt$, shape `(S,)`; sums to $\tau$.
    - `generator`: the amalgamated generator of the intervened model.
    - `model`: the intervened model (for default parent sets).

    Node statistics can be projected onto **any** parent set (maths §1):
    $\mathsf E[\hat T_n(x,u)] = \sum_s 1(s_n=x,s_P=u)\mathsf E[T(s)]$ and
    $\mathsf E[\hat M_n(x,x',u)] = \sum_s 1(s_n=x,s_P=u)W_n(s\to x')\mathsf E[T(s)]$, which equals
    $\Lambda_n(x,x',u)\mathsf E[\hat T_n(x,u)]$ when $P$ contains the true parents.
    """

    final_marginal: Float[Array, "*batch global_states"]
    dwell_times: Float[Array, "*batch global_states"]
    generator: AbstractGenerator
    model: AbstractCTBN

    def _bins(self, node: int, parents):
        return projection_bins(self.model, node, parents)

    def node_dwell_times(self, node: int | str, parents=None) -> Float[Array, "configs k"]:
        """$\\mathsf E[\\hat T_n(x,u)]$ for parent set `parents` (default: the model's)."""
        node = self.model.node_index(node)
        k = self.model.cardinalities[node]
        states, c, configs = self._bins(node, parents)
        bins = c * k + states[:, node]
        out = jax.ops.segment_sum(self.dwell_times, bins, num_segments=configs * k)
        return out.reshape(configs, k)

    def node_transitions(self, node: int | str, parents=None) -> Float[Array, "configs k k"]:
        """$\\mathsf E[\\hat M_n(x,x',u)]$ for parent set `parents` (default: the model's)."""
        node = self.model.node_index(node)
        k = self.model.cardinalities[node]
        states, c, configs = self._bins(node, parents)
        values, bins = [], []
        for r, (n, j) in enumerate(self.generator.shifts):
            if n != node:
                continue
            x = states[:, node]
            values.append(self.generator.shift_rates(r) * self.dwell_times)
            bins.append((c * k + x) * k + (x + j) % k)
        out = jax.ops.segment_sum(
            jnp.concatenate(values), jnp.concatenate(bins), num_segments=configs * k * k
        )
        return out.reshape(configs, k, k)

    def node_statistics_on_sets(
        self, node: int, parent_sets: Int[Array, "sets max_parents"]
    ) -> tuple[Float[Array, "sets configs k k"], Float[Array, "sets configs k"]]:
        """`(node_transitions, node_dwell_times)` of `node` projected onto every padded parent
        set in `parent_sets` at once (`configs` = the most configurations any set of that
        padding can have). Same numbers as calling the two methods per set; here the binning
        is a one-hot matrix per set that does not depend on the model, so a batch of models
        shares it and the projections become one matrix product."""
        configs = max_configs(node, self.model.cardinalities, parent_sets.shape[-1])
        G = state_bins_on_sets(
            node, parent_sets, self.model.cardinalities, self.dwell_times.dtype
        )  # (sets, S, configs*k)
        return self._binned(node, G, configs)

    def _binned(self, node: int, G: Array, num_bins: int) -> tuple[Array, Array]:
        r"""`(transitions, dwell_times)` of `node`, `(sets, num_bins, k, k)` and `(sets,
        num_bins, k)`, with global state $s$ sent to bin $b\,k+s_n$ where `G[p, s, b k + s_n]`
        is one (a one-hot matrix per set): one matrix product for every set and statistic."""
        V = self._node_flows(node)
        out = jnp.einsum("psb,sj->pbj", G, V)
        return _assemble_node_statistics(
            self.generator.shifts, node, out, num_bins, self.model.cardinalities[node]
        )

    def _node_flows(self, node: int) -> Array:
        """`(S, 1 + shifts)`: per global state, the expected dwell time and the expected flow of
        each of `node`'s jumps (its rate times the dwell time)."""
        shifts = [r for r, (n, _) in enumerate(self.generator.shifts) if n == node]
        return jnp.stack(
            [self.dwell_times] + [self.generator.shift_rates(r) * self.dwell_times for r in shifts],
            axis=1,
        )

    def node_statistics_by_other_nodes(
        self, node: int, parent_sets: Int[Array, "sets max_parents"], clamped: Array
    ) -> tuple[Float[Array, "sets others k k"], Float[Array, "sets others k"]]:
        r"""Node `node`'s statistics on each padded parent set $P$ in `parent_sets`, split by the
        states of the `clamped` nodes $J$ (a boolean `(N,)`, may be traced): indexed by the
        configurations $w$ of all other nodes (mixed radix in node order, the first other node
        the most significant digit), where bin $w$ holds the states $s$ with $s_{P\cup J}=
        w_{P\cup J}$ if $w$ is zero outside $P\cup J$, and nothing otherwise. Summing the bins
        with $w_J=x_J$ gives the statistics on $P$ of the sub-cube $\{s:s_J=x_J\}$
        (see `clamp_pattern_statistics`); bin $w$ is parent configuration $c(w_P)$ of $P$."""
        cards = self.model.cardinalities
        k = cards[node]
        others = [j for j in range(len(cards)) if j != node]
        W = math.prod(cards[j] for j in others)
        states = jnp.asarray(all_global_states(cards))  # (S, N)
        strides = np.array(
            [math.prod(cards[j] for j in others[i + 1 :]) for i in range(len(others))]
        )

        def one_hot(parents):
            member = (jnp.asarray(parents)[:, None] == jnp.arange(len(cards))).any(0)
            keep = (member | clamped)[jnp.asarray(others)]
            w = (jnp.where(keep, states[:, others], 0) * jnp.asarray(strides)).sum(-1)
            bins = w * k + states[:, node]
            return (bins[:, None] == jnp.arange(W * k)).astype(self.dwell_times.dtype)

        return self._binned(node, jax.vmap(one_hot)(jnp.asarray(parent_sets)), W)


def _assemble_node_statistics(shifts, node: int, out: Array, num_bins: int, k: int):
    r"""`(transitions, dwell_times)` `(..., num_bins, k, k)` and `(..., num_bins, k)` from binned
    flows `out` `(..., num_bins * k, 1 + jumps)` (`ExpectedStatistics._node_flows` summed into
    bins $b\,k+s_n$): column 0 the dwell times, column $1+i$ the $i$-th jump of `node` in the
    generator's `shifts`."""
    jumps = [j for n, j in shifts if n == node]
    out = out.reshape(*out.shape[:-2], num_bins, k, 1 + len(jumps))
    T = out[..., 0]
    x = jnp.arange(k)
    M = jnp.zeros((*out.shape[:-1], k), out.dtype)
    for i, j in enumerate(jumps):
        M = M.at[..., x, (x + j) % k].add(out[..., 1 + i])
    return M, T


# --------------------------------------------------------------------------- entry points
def initial_distribution(
    model: AbstractCTBN,
    initial_state: ArrayLike,
    intervention: Intervention | None = None,
) -> Float[Array, " global_states"]:
    """The initial distribution over global states.

    `initial_state` is an integer array of node states `(N,)` (a point mass) or a float array: a
    distribution over the global states `(S,)` or a tensor with one axis per node. Under a perfect
    intervention, clamped nodes are moved to their clamped state (their marginal mass is kept).

    Values are checked inside jit (`eqx.error_if` on the result): node states in `0..k-1`,
    probabilities finite, non-negative and summing to 1, clamped states of the intervention in
    `0..k-1` (reported as the intervention's, not as `initial_state`).
    """
    if intervention is not None:
        intervention = intervention.checked(model)
    return checked_initial_distribution(model, initial_state, intervention)


def checked_node_states(
    model: AbstractCTBN, initial_state: Array, intervention: Intervention | None
) -> Int[Array, " nodes"]:
    """An integer initial state `(N,)` with its shape checked now and its values (`0..k-1`)
    inside jit, clamped nodes moved to their clamped states (an intervention already passed
    through `checked(model)`; a clamped node's given state is replaced, not checked)."""
    cards = model.cardinalities
    if initial_state.shape != (model.num_nodes,):
        raise ValueError(
            f"initial_state: expected {model.num_nodes} node states, got shape {initial_state.shape}."
        )
    bad = (initial_state < 0) | (initial_state >= jnp.asarray(cards))
    if intervention is not None:
        bad = bad & ~intervention.targets
        initial_state = intervention.initial_states(initial_state)
    return eqx.branched_error_if(
        initial_state,
        jnp.any(bad),
        jnp.argmax(bad),
        [
            f"initial_state: node states must be in 0..k-1; node {name!r} has states 0..{k - 1}."
            for name, k in zip(model.names, cards)
        ],
    )


def checked_initial_distribution(
    model: AbstractCTBN, initial_state: ArrayLike, intervention: Intervention | None
) -> Float[Array, " global_states"]:
    """`initial_distribution` for an intervention already passed through `checked(model)`."""
    initial_state = jnp.asarray(initial_state)
    cards = model.cardinalities
    S = model.num_global_states
    dtype = jnp.result_type(*model.cims)
    if jnp.issubdtype(initial_state.dtype, jnp.integer):
        initial_state = checked_node_states(model, initial_state, intervention)
        return jnp.zeros((S,), dtype).at[global_state_index(initial_state, cards)].set(1.0)
    if initial_state.size != S:
        raise ValueError(
            f"initial distribution: expected {S} probabilities (one per global state), got shape "
            f"{initial_state.shape}."
        )
    p = initial_state.astype(dtype).reshape(cards)
    p = eqx.error_if(
        p,
        jnp.any(p < 0) | (jnp.abs(p.sum() - 1) > 1e-6) | jnp.any(~jnp.isfinite(p)),
        "initial distribution: probabilities must be finite, non-negative and sum to 1.",
    )
    if intervention is not None:
        for n, k in enumerate(cards):
            onehot = (jnp.arange(k) == intervention.states[n]).astype(dtype)
            shape = [1] * len(cards)
            shape[n] = k
            clamped = p.sum(axis=n, keepdims=True) * onehot.reshape(shape)
            p = jnp.where(intervention.targets[n], clamped, p)
    return p.reshape(-1)


def _check_horizon_shape(horizon: ArrayLike) -> None:
    if jnp.ndim(horizon) != 0:
        raise ValueError(f"horizon: expected a scalar, got shape {jnp.shape(horizon)}.")


def _check_horizon(horizon: ArrayLike, dtype) -> Float[Array, ""]:
    _check_horizon_shape(horizon)
    horizon = jnp.asarray(horizon, dtype)
    return eqx.error_if(
        horizon,
        ~(horizon > 0) | ~jnp.isfinite(horizon),
        "horizon: must be a positive finite number.",
    )


def prepare_experiment(
    model: AbstractCTBN, initial_state: ArrayLike, intervention: Intervention | None
) -> tuple[AbstractCTBN, AbstractGenerator, Float[Array, " global_states"]]:
    """The checked (intervened) model, its generator and the initial distribution. Every check
    is attached to values that all of the solve's outputs are computed from: the rates to the
    model (hence the generator), the initial state and the intervention's states to `p0`."""
    model, intervention = prepare_model(model, intervention)
    p0 = checked_initial_distribution(model, initial_state, intervention)
    return model, amalgamate(model), p0


def prepare_model(
    model: AbstractCTBN, intervention: Intervention | None
) -> tuple[AbstractCTBN, Intervention | None]:
    r"""The checked intervened model and the checked intervention: rates finite and $\ge0$
    before and after the intervention (an imperfect one can make them negative or NaN), clamped
    states in range."""
    if intervention is not None:
        intervention = intervention.checked(model)
    model = model.checked()
    if intervention is not None:
        model = intervention.apply(model).checked("cims under the intervention")
    return model, intervention


def resolve_solver(
    solver: StatisticsSolver, model: AbstractCTBN
) -> AbstractMasterEquationSolver | AbstractApproximateSolver:
    """The solver that `solver` stands for on `model`: an [`jaxctbn.AutomaticSolver`][] gives
    its exact solver while `model` has at most `max_global_states` global states, else its
    approximate one (default [`jaxctbn.MeanField`][]); any other solver is itself."""
    if not isinstance(solver, AutomaticSolver):
        check_state_space(solver, model.cardinalities)
        return solver
    if math.prod(model.cardinalities) <= solver.max_global_states:
        check_state_space(solver.exact, model.cardinalities)
        return solver.exact
    if solver.approximate is not None:
        return solver.approximate
    from .mean_field import MeanField  # the approximation builds on this module

    return MeanField()


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
      route measured in `benchmarks/bench_master_equation.py`, ...), an approximate one for
      networks too large for the global state space ([`jaxctbn.MeanField`][]), or the default
      [`jaxctbn.AutomaticSolver`][]: exact up to $2^{14}$ global states, mean-field beyond
      ([`jaxctbn.internal.resolve_solver`][] tells which).

    **Returns:** an [`jaxctbn.ExpectedStatistics`][] (exact solvers) or the approximate
    solver's [`jaxctbn.AbstractExpectedStatistics`][] (e.g. [`jaxctbn.internal.MeanFieldStatistics`][]).

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
    _check_horizon_shape(horizon)
    _check_concrete_intervention(model, intervention)
    solver = _sized_solver(resolve_solver(solver, model), model, horizon, intervention)
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


def _sized_solver(
    solver: StatisticsSolver, model: AbstractCTBN, horizon, intervention
) -> StatisticsSolver:
    """An approximate solver with the static sizes it takes from concrete values (Gillespie's
    automatic event buffer) fixed before the compiled solve, where the values are traced."""
    if not isinstance(solver, AbstractApproximateSolver):
        return solver
    return solver.sized(model, horizon, intervention)


def _check_concrete_intervention(model: AbstractCTBN, intervention: Intervention | None) -> None:
    """The `ValueError` (naming the clamped state) of a concrete intervention's states, before
    they become tracers inside the compiled solve (where the same check is an `eqx.error_if`)."""
    if intervention is not None and is_concrete(intervention.targets, intervention.states):
        intervention.checked(model)


@eqx.filter_jit
def _expected_statistics(model, initial_state, horizon, intervention, solver):
    solver = resolve_solver(solver, model)
    if isinstance(solver, AbstractApproximateSolver):
        horizon = _check_horizon(horizon, jnp.result_type(*model.cims))
        return solver.expected_statistics(model, initial_state, horizon, intervention)
    model, gen, p0 = prepare_experiment(model, initial_state, intervention)
    horizon = _check_horizon(horizon, p0.dtype)
    p_final, dwell = solver.solve(gen, p0, horizon)
    return ExpectedStatistics(final_marginal=p_final, dwell_times=dwell, generator=gen, model=model)


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
    _check_horizon_shape(horizon)
    return _expected_statistics_batch(
        models, jnp.asarray(initial_state), _as_rate_array(horizon, models), interventions, solver
    )


@eqx.filter_jit
def _expected_statistics_batch(models, initial_state, horizon, interventions, solver):
    solver = resolve_solver(solver, models)
    if isinstance(solver, AbstractApproximateSolver):
        horizon = _check_horizon(horizon, jnp.result_type(*models.cims))
        if interventions is None:
            return jax.vmap(lambda m, x: solver.expected_statistics(m, x, horizon, None))(
                models, initial_state
            )
        return jax.vmap(lambda m, x, i: solver.expected_statistics(m, x, horizon, i))(
            models, initial_state, interventions
        )
    if interventions is None:
        prepared = jax.vmap(lambda m, x: prepare_experiment(m, x, None))(models, initial_state)
    else:
        prepared = jax.vmap(prepare_experiment)(models, initial_state, interventions)
    models, gens, p0 = prepared
    horizon = _check_horizon(horizon, p0.dtype)
    p_final, dwell = solver.solve_batch(gens, p0, horizon)
    return ExpectedStatistics(
        final_marginal=p_final, dwell_times=dwell, generator=gens, model=models
    )


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
    clampable: tuple[int, ...],
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

    - `clampable` (static): the nodes the patterns may clamp; an intervention that clamps
      another node is left out of every pattern (`valid` false).
    - `solver`: an exact master-equation solver (the sharing needs a solution linear in $p_0$);
      an approximate one is a `ValueError`.
    """
    _check_horizon_shape(horizon)
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
    if len(set(clampable)) != len(clampable) or not all(0 <= j < N for j in clampable):
        raise ValueError(f"clampable: distinct node indices in 0..{N - 1}, got {clampable!r}.")
    B = jax.tree_util.tree_leaves(models)[0].shape[0]
    C = interventions.targets.shape[0]
    P = 2 ** len(clampable)
    targets = jnp.asarray(interventions.targets, bool)
    outside = np.ones(N, bool)
    outside[list(clampable)] = False
    valid = ~(targets & jnp.asarray(outside)).any(-1)  # (C,): clamps only clampable nodes
    pattern = sum(
        (targets[:, node].astype(jnp.int32) << b for b, node in enumerate(clampable)),
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
    clamps = np.zeros((P, N), bool)
    for q in range(P):
        for b, node in enumerate(clampable):
            clamps[q, node] = bool((q >> b) & 1)
    patterns = Intervention(targets=jnp.asarray(clamps), states=jnp.zeros((P, N), jnp.int32))
    grid = jax.tree_util.tree_map(
        lambda a: jnp.broadcast_to(a, (P, *a.shape)).reshape(P * B, *a.shape[1:]), models
    )
    grid, _ = jax.vmap(prepare_model)(
        grid, jax.tree_util.tree_map(lambda a: jnp.repeat(a, B, axis=0), patterns)
    )
    gens = jax.vmap(amalgamate)(grid)
    p0 = jnp.repeat(p0, B, axis=0)
    horizon = _check_horizon(horizon, p0.dtype)
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
        eqx.error_if(
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
