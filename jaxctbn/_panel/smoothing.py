r"""Backward smoothing of one panel trajectory (the maths in `jaxctbn/_panel/inference.py`): the
scaled backward messages, the smoothed dwell times and transitions from the solver's interval
integrals, the jumps that exact entry times record, and the smoothed marginals on a grid."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array

from .._master_equation import (
    AbstractGenerator,
    AbstractMasterEquationSolver,
    matrix_vector,
    short_sum,
)
from .filtering import (
    Filtered,
    entry_backward,
    entry_jumps,
    observation_evidence,
    positive,
    safe_horizon,
)
from .observations import PanelObservations


def backward_messages(
    gen: AbstractGenerator,
    observations: PanelObservations,
    matrices: tuple[Array, ...],
    filtered: Filtered,
    solver: AbstractMasterEquationSolver,
    propagators: tuple[Array, Array] | None = None,
    exact_entries: bool = True,
) -> tuple[Array, Array]:
    r"""The scaled backward messages: `betas` $\hat\beta_i$ `(O, S)` and `ends` `(O, S)`, row
    $i$ = $b_{i+1}$, the backward message at the end of the interval after observation $i$
    (ones after the last). `propagators` and `exact_entries` as in `forward_filter`."""
    cards = gen.cardinalities
    valid = filtered.valid
    exact = observations.exact_entry & valid
    y = jnp.where(valid[:, None], observations.states, -1)
    evidence = jax.vmap(lambda v: observation_evidence(cards, v, matrices))(y)

    table, index = (None, None) if propagators is None else propagators

    def step(beta, inputs):
        dt, ok, is_exact, e, o, c, i = inputs
        end = e * beta
        if exact_entries:
            end = jnp.where(is_exact, entry_backward(gen, beta, o), end)
        end = end / jnp.where(positive(c), c, 1)  # c = 0 is reported, not propagated
        if table is None:
            previous = solver.propagate_backward(gen, end, safe_horizon(dt, ok))
        else:
            previous = matrix_vector(table[i], end)
        beta = jnp.where(ok, previous, beta)
        return beta, (beta, jnp.where(ok, end, 1))

    ones = jnp.ones_like(filtered.alphas[0])
    inputs = (
        jnp.diff(filtered.times),
        valid[1:],
        exact[1:],
        evidence[1:],
        filtered.inside[1:],
        filtered.norms[1:],
        index,
    )
    # reversed scan; the outputs of interval i (between observations i - 1 and i) are
    # (beta_{i-1}, b_i), stacked in the original order
    _, (betas, ends) = jax.lax.scan(step, ones, inputs, reverse=True)
    betas = jnp.concatenate([betas, ones[None]])
    ends = jnp.concatenate([ends, ones[None]])
    return betas, ends


def smoothed_statistics(
    gen: AbstractGenerator,
    observations: PanelObservations,
    filtered: Filtered,
    betas: Array,
    ends: Array,
    solver: AbstractMasterEquationSolver,
) -> tuple[Array, Array]:
    """Summed smoothed dwell times `(S,)` and per-shift transitions `(J, S)` of one trajectory."""
    ok = filtered.valid[1:]
    dt = jnp.diff(filtered.times)
    h = safe_horizon(dt, ok)
    dwell, flux = jax.vmap(lambda a, b, t: solver.forward_backward(gen, a, b, t))(
        filtered.alphas[:-1], ends[:-1], h
    )
    # Z = alpha_t beta_t (1 in exact arithmetic): normalising by the integral's own total
    # makes the dwell times sum to the interval exactly
    Z = dwell.sum(-1) / h
    weight = jnp.where(ok, 1 / Z, 0)
    rates = jnp.stack([gen.shift_rates(r) for r in range(len(gen.shifts))])
    dwell_times = jnp.einsum("i,is->s", weight, dwell)
    transitions = rates * jnp.einsum("i,irs->rs", weight, flux)
    return dwell_times, transitions + exact_entry_transitions(gen, observations, filtered, betas)


def exact_entry_transitions(
    gen: AbstractGenerator, observations: PanelObservations, filtered: Filtered, betas: Array
) -> Array:
    """Per shift `(J, S)`: the one jump into the observed configuration that each exact entry
    time records, smoothed over its source state."""
    exact = (observations.exact_entry & filtered.valid)[1:]
    jumps = jax.vmap(lambda a, b, o: entry_jumps(gen, a, b, o))(
        filtered.predicted[1:], betas[1:], filtered.inside[1:]
    )
    total = short_sum(short_sum(jumps, -1), -1)
    jump_weight = jnp.where(exact, 1 / jnp.where(exact, total, 1), 0)
    return jnp.einsum("i,irs->rs", jump_weight, jumps)


def smoothed_marginals(
    gen: AbstractGenerator,
    filtered: Filtered,
    ends: Array,
    num_observations: Array,
    grid: Array,
    solver: AbstractMasterEquationSolver,
) -> Array:
    """Smoothed marginals `(G, S)` of one trajectory at the times `grid` `(G,)`."""
    times = filtered.times
    num_slots = times.shape[0]
    last = num_observations - 1

    def one(t):
        j = jnp.minimum(jnp.searchsorted(times, t, side="right") - 1, last)
        j = jnp.maximum(j, 0)
        forward_h = t - times[j]
        forward = solver.propagate(gen, filtered.alphas[j], safe_horizon(forward_h, forward_h > 0))
        forward = jnp.where(forward_h > 0, forward, filtered.alphas[j])
        has_next = j < last
        nxt = jnp.minimum(j + 1, num_slots - 1)
        backward_h = times[nxt] - t
        backward = solver.propagate_backward(gen, ends[j], safe_horizon(backward_h, has_next))
        backward = jnp.where(has_next, backward, jnp.ones_like(backward))
        p = forward * backward
        return p / p.sum()

    return jax.vmap(one)(grid)
