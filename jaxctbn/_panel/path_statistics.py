r"""Exact posterior draws of the complete-path statistics of panel trajectories given the rates:
forward filtering, backward sampling on the amalgamated chain, and a bridge in every interval.

Given the rates $\Lambda$, a panel trajectory's hidden path $S$ on $[t_0,t_{m-1}]$ is drawn
from $p(S\mid Y,\Lambda)$ exactly (for networks small enough for the exact forward filter of
[`jaxctbn.panel.panel_log_likelihood`][]):

1. the scaled forward filter $\hat\alpha_i$ (the same filter, evidence and initial-law
   convention as the likelihood: emissions, missing nodes, interventions, exact entry times);
2. backwards, the state at the last observation from $\hat\alpha_{m-1}$, then at each earlier
   observation $x_{i-1}\sim\hat\alpha_{i-1}(s)\,e^{\Delta_iW}(s,b_i)$, where $b_i$ is the state
   just before $t_i$: $x_i$ itself, or, at an **exact entry time**, the state the jump came
   from, $b_i\sim\tilde\alpha_i(s')W(s',x_i)1[s'\notin O_i]$ (the entry jump is recorded);
3. in each interval, an endpoint-conditioned path from $x_{i-1}$ to $b_i$ by uniformisation
   (`bridge`, the module `bridges`).

The path's dwell time in every global state and its transitions per shift of the generator are
returned in the container of the smoothed statistics
([`jaxctbn.panel.PanelExpectedStatistics`][]: one sampled path each instead of an expectation),
so that they project onto node statistics the same way. A bridge that needs more candidate
times than `max_candidates` raises (`eqx.error_if`, naming the setting) rather than returning
a cut path; the eager verbs that draw paths redo the draw with the bound doubled
(`with_candidate_growth`, up to
`MAX_CANDIDATES_LIMIT`), so it needs no tuning outside `jit`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, PRNGKeyArray

from .._errors import error_if, error_message
from .._master_equation import (
    AbstractMasterEquationSolver,
    amalgamate,
    gap_transition_matrices,
    shift_indices,
    uniformisation_rate,
)
from .._model.ctbn import AbstractCTBN
from .._model.interventions import is_concrete
from .bridges import bridge, draw_index
from .checks import check_possible
from .checks import checked_inputs as _setup
from .expected_statistics import PanelExpectedStatistics
from .filtering import filtered_log_likelihood, padded_times, under_intervention
from .filtering import forward_filter as _filter
from .filtering import safe_horizon as _safe
from .observations import Emissions, PanelObservations

#: the largest bound on one bridge's uniformisation times that the eager verbs grow to: a path
#: that needs more has rates far beyond the gaps' scale (e.g. a rate prior in another time unit)
MAX_CANDIDATES_LIMIT = 1024

_Family = TypeVar("_Family", bound=eqx.Module)
_Out = TypeVar("_Out")

_OVERFLOW = "max_candidates:"


def with_candidate_growth(
    run: Callable[[_Family], _Out], family: _Family, *, inputs: object = None
) -> tuple[_Out, _Family]:
    """`(run(family), family)`, waited for; when a bridge needed more uniformisation times than
    the family's `max_candidates` (the error of `sample_path_statistics`),
    run again with it doubled, up to `MAX_CANDIDATES_LIMIT` (then the error stands), and return
    the family that ran. The same arguments give the same result (each size draws from the same
    keys). When `inputs` (the arrays `run` reads) are traced, the error surfaces only when the
    caller's program runs:
    `run(family)` as is."""
    if not is_concrete(*jax.tree_util.tree_leaves(inputs)):
        return run(family), family
    while True:
        try:
            return jax.block_until_ready(run(family)), family
        except (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError) as error:
            size = family.max_candidates  # pyright: ignore[reportAttributeAccessIssue]
            if not error_message(error).startswith(_OVERFLOW) or size >= MAX_CANDIDATES_LIMIT:
                raise
            family = dataclasses.replace(  # pyright: ignore[reportArgumentType]
                family, max_candidates=min(2 * size, MAX_CANDIDATES_LIMIT)
            )


def _shift_of(cardinalities: tuple[int, ...]) -> np.ndarray:
    """`(S, S)`: the shift index `r` of the generator that moves state `s` to `s'` (-1 where
    no single node's move does)."""
    src, dst = shift_indices(cardinalities)
    S = int(np.prod(cardinalities))
    table = -np.ones((S, S), np.int32)
    for r in range(src.shape[0]):
        table[src[r], dst[r]] = r
    return table


def _trajectory_statistics(
    model, obs, matrices, solver, key, shift_of: np.ndarray, max_candidates: int, propagators
):
    r"""One trajectory: `(bad, log-likelihood, dwell (S,), transitions (J, S), overflow)`.
    `propagators`: `None`, or `(table, index)` as in the filter (interval `i`'s $e^{\Delta W}$
    is `table[index[i]]`). With the dense exponential and no shared table, each interval's
    $e^{\Delta W}$ is computed once (a batch) for both the filter and the backward draws."""
    if propagators is None and solver.tabulates_gaps:
        under, _ = under_intervention(model, obs)
        times, valid = padded_times(obs, matrices[0].dtype)
        steps = _safe(jnp.diff(times), valid[1:])
        table = gap_transition_matrices(amalgamate(under).dense(), steps)
        propagators = (table, jnp.arange(steps.shape[0]))
    gen, filtered = _filter(model, obs, matrices, None, solver, propagators)
    bad, log_likelihood = filtered_log_likelihood(filtered, None)
    W = gen.dense()
    dtype = W.dtype
    S = W.shape[0]
    J = len(gen.shifts)
    omega = uniformisation_rate(W)
    B = jnp.eye(S, dtype=dtype) + W / omega
    exact = obs.exact_entry & filtered.valid
    m = obs.num_observations
    key_last, key_steps = jr.split(key)
    last = draw_index(filtered.alphas[m - 1], jr.uniform(key_last, (), dtype))

    def step(carry, inputs):
        x_next, dwell, transitions, overflow = carry
        i, key = inputs
        key_entry, key_start, key_bridge = jr.split(key, 3)
        ok = filtered.valid[i + 1]
        dt = _safe(filtered.times[i + 1] - filtered.times[i], ok)
        # the state just before t_{i+1}: the entered state, or where an exact entry came from
        source = filtered.predicted[i + 1] * W[:, x_next] * (1 - filtered.inside[i + 1])
        entered = draw_index(source, jr.uniform(key_entry, (), dtype))
        b = jnp.where(exact[i + 1], entered, x_next)
        if propagators is None:
            column = solver.propagate_backward(gen, jax.nn.one_hot(b, S, dtype=dtype), dt)
        else:
            table, index = propagators
            column = table[index[i]][:, b]
        a = draw_index(filtered.alphas[i] * column, jr.uniform(key_start, (), dtype))
        _, columns = jax.lax.scan(
            lambda v, _: (B @ v, v),
            jax.nn.one_hot(b, S, dtype=dtype),
            None,
            length=max_candidates + 1,
        )
        start = filtered.times[i]
        times, states, jumped, cut = bridge(B, columns, column[a], omega, dt, start, a, key_bridge)
        edges = jnp.concatenate([start[None], jnp.minimum(times, start + dt), (start + dt)[None]])
        held = jnp.concatenate([a[None], states])
        before = jnp.concatenate([a[None], states[:-1]])
        weight = ok.astype(dtype)
        dwell = dwell.at[held].add(weight * jnp.diff(edges))
        shifts = jnp.asarray(shift_of)[before, states]
        counted = (jumped & ok).astype(dtype)
        transitions = transitions.at[jnp.maximum(shifts, 0), before].add(counted)
        entry = (exact[i + 1] & ok).astype(dtype)
        transitions = transitions.at[jnp.maximum(jnp.asarray(shift_of)[b, x_next], 0), b].add(entry)
        x = jnp.where(ok, a, x_next)
        return (x, dwell, transitions, overflow | (cut & ok)), None

    num_slots = obs.times.shape[-1]
    init = (last, jnp.zeros((S,), dtype), jnp.zeros((J, S), dtype), jnp.asarray(False))
    steps = (jnp.arange(num_slots - 1), jr.split(key_steps, num_slots - 1))
    (_, dwell, transitions, overflow), _ = jax.lax.scan(step, init, steps, reverse=True)
    return bad, log_likelihood, dwell, transitions, overflow


def sample_path_statistics(
    model: AbstractCTBN,
    observations: PanelObservations,
    *,
    key: PRNGKeyArray,
    solver: AbstractMasterEquationSolver,
    emissions: Emissions | None = None,
    max_candidates: int = 64,
    propagators: tuple[Array, Array] | None = None,
) -> PanelExpectedStatistics:
    r"""One exact posterior draw of each trajectory's complete-path statistics given the rates
    of `model` (module page): a [`jaxctbn.panel.PanelExpectedStatistics`][] with the batch axis
    of `observations` (a flat batch), whose `dwell_times` and `transitions` are those of the
    sampled paths and whose `log_likelihood` is each trajectory's panel log-likelihood
    (conditional on its first observation). Raises inside jit when an observation is impossible
    or a bridge needs more than `max_candidates` candidate times. `propagators`: optionally
    `(table (G, S, S), index (R, O - 1))`, the transition matrices of the distinct gaps and each
    interval's gap (observations without interventions; `solver` is then not used)."""
    model, observations, matrices, _ = _setup(model, observations, emissions, None)
    if len(observations.batch_shape) != 1:
        raise ValueError("observations: expected a flat batch with one leading axis.")
    shift_of = _shift_of(model.cardinalities)
    R = observations.batch_shape[0]
    # the gap table is shared; each trajectory has its own row of gap indices
    table, index = (None, None) if propagators is None else propagators
    per_trajectory = jax.vmap(
        lambda obs, k, i: _trajectory_statistics(
            model,
            obs,
            matrices,
            solver,
            k,
            shift_of,
            max_candidates,
            None if table is None else (table, i),
        )
    )(observations, jr.split(key, R), None if index is None else jnp.asarray(index))
    bad, log_likelihood, dwell, transitions, overflow = per_trajectory
    dwell = error_if(
        dwell,
        jnp.any(overflow),
        f"max_candidates: a sampled path needed more than {max_candidates} uniformisation "
        "times in one interval between visits (fast rates or long gaps: check that the rate "
        "prior is in the data's time unit); raise it.",
    )
    out = PanelExpectedStatistics(
        dwell_times=dwell, transitions=transitions, log_likelihood=log_likelihood, model=model
    )
    return check_possible(out, bad, observations)
