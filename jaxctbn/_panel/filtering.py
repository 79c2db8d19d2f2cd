r"""The scaled forward filter of one panel trajectory (the maths in the module docstring of
`jaxctbn/_panel/inference.py`): the evidence of an observation over the global states, the one
jump of an exact entry time, and the filtered log-likelihood."""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .._master_equation import (
    AbstractGenerator,
    AbstractMasterEquationSolver,
    amalgamate,
    checked_initial_distribution,
    pull_shifts,
    push,
    short_sum,
    vector_matrix,
)
from .._model.ctbn import AbstractCTBN, with_diagonal
from .observations import PanelObservations


def observation_evidence(
    cardinalities: tuple[int, ...], y: Int[Array, " nodes"], matrices: tuple[Array, ...]
) -> Float[Array, " global_states"]:
    r"""$e(s)=\prod_n E_n(s_n,y_n)$ over the global states (factor 1 for missing nodes)."""
    N = len(cardinalities)
    e = jnp.ones(cardinalities, matrices[0].dtype)
    for n, k in enumerate(cardinalities):
        column = jnp.take(matrices[n], jnp.maximum(y[n], 0), axis=1)
        column = jnp.where(y[n] >= 0, column, jnp.ones_like(column))
        shape = [1] * N
        shape[n] = k
        e = e * column.reshape(shape)
    return e.reshape(-1)


def entry_forward(generator: AbstractGenerator, a: Array, inside: Array) -> Array:
    r"""$aJ$: $(aJ)(s)=1[s\in O]\sum_{s'\notin O}a(s')W(s',s)$ (one jump into $O$)."""
    cards = generator.cardinalities
    source = (a * (1 - inside)).reshape(cards)
    out = jnp.zeros(cards, a.dtype)
    for r, (n, j) in enumerate(generator.shifts):
        out = out + push(generator.shift_rate_tensor(r) * source, n, j, cards[n])
    return out.reshape(-1) * inside


def entry_jumps(generator: AbstractGenerator, a: Array, b: Array, inside: Array) -> Array:
    r"""Per shift $r$, $a(s)\,1[s\notin O]\,R_r(s)\,1[s_r'\in O]\,b(s_r')$, shape `(J, S)`."""
    rates = jnp.stack([generator.shift_rates(r) for r in range(len(generator.shifts))])
    return (a * (1 - inside))[None] * rates * pull_shifts(generator, inside * b)


def entry_backward(generator: AbstractGenerator, b: Array, inside: Array) -> Array:
    r"""$Jb$: $(Jb)(s')=1[s'\notin O]\sum_{s\in O}W(s',s)b(s)$."""
    return short_sum(entry_jumps(generator, jnp.ones_like(b), b, inside), 0)


# --------------------------------------------------------------------------- one trajectory
class Filtered(NamedTuple):
    times: Array  # (O,) padding replaced by the last real time
    valid: Array  # (O,)
    alphas: Array  # (O, S) filtered, after observation i
    predicted: Array  # (O, S) alpha_{i-1} e^{dt W} before observation i (row 0: the prior)
    norms: Array  # (O,) c_i (1 for padding)
    log_norms: Array  # (O,) log c_i (0 for padding)
    inside: Array  # (O, S) indicator of the states consistent with observation i


def forward_filter(
    model: AbstractCTBN,
    observations: PanelObservations,
    matrices: tuple[Array, ...],
    p0: Array | None,
    solver: AbstractMasterEquationSolver,
    propagators: tuple[Array, Array] | None = None,
    exact_entries: bool = True,
    interval_scales: tuple[Array, ...] | None = None,
) -> tuple[AbstractGenerator, Filtered]:
    """The scaled forward filter of one trajectory (`inference.py`'s docstring). With
    `propagators = (table, index)`, interval $i$'s $e^{(t_i-t_{i-1})W}$ is read as
    `table[index[i]]` (`table` `(G, S, S)`, `index` `(O - 1,)`) instead of being solved.
    `exact_entries=False` (static: no observation of the batch records an exact entry time)
    leaves out the entry terms. `interval_scales`: per node `(O, configs, k, k)`, the rate
    scales from each observation to the next (time-varying covariates): the interval ending
    at observation $i$ runs on the generator with the rates times `interval_scales[n][i - 1]`
    (the returned generator is then that of no scales)."""
    model, intervention = under_intervention(model, observations)
    gen = amalgamate(model)
    cards = model.cardinalities
    dtype = matrices[0].dtype
    S = model.num_global_states
    times, valid = padded_times(observations, dtype)
    exact = observations.exact_entry & valid
    y = jnp.where(valid[:, None], observations.states, -1)
    identity = tuple(jnp.eye(k, dtype=dtype) for k in cards)
    inside = jax.vmap(lambda v: observation_evidence(cards, v, identity))(y)
    evidence = jax.vmap(lambda v: observation_evidence(cards, v, matrices))(y)

    if p0 is None:  # msm's convention: uniform over the states the first observation allows
        p0 = jnp.full((S,), 1.0 / S, dtype)
    prior = checked_initial_distribution(model, p0, intervention)
    a0 = prior * evidence[0]
    c0 = short_sum(a0)
    # an impossible observation (c = 0) is reported by `check_possible` from the norms; the
    # filter stays finite meanwhile, so that no solver downstream fails first on NaN inputs
    alpha0 = jnp.where(positive(c0), a0 / jnp.where(positive(c0), c0, 1), prior)

    table, index = (None, None) if propagators is None else propagators
    if interval_scales is not None and table is not None:
        raise ValueError("interval_scales: not with shared propagators.")
    starts = None if interval_scales is None else tuple(s[:-1] for s in interval_scales)

    def step(alpha, inputs):
        dt, ok, is_exact, e, o, i, scales = inputs
        step_gen = gen
        if scales is not None:
            step_gen = amalgamate(
                eqx.tree_at(
                    lambda m: m.cims,
                    model,
                    tuple(with_diagonal(c * s.astype(dtype)) for c, s in zip(model.cims, scales)),
                )
            )
        if table is None:
            predicted = solver.propagate(step_gen, alpha, safe_horizon(dt, ok))
        else:  # gathered inside the step: fused, never materialised per interval
            predicted = vector_matrix(alpha, table[i])
        a = predicted * e
        if exact_entries:
            a = jnp.where(is_exact, entry_forward(step_gen, predicted, o), a)
        c = jnp.where(ok, short_sum(a), 1)
        alpha = jnp.where(ok & positive(c), a / jnp.where(positive(c), c, 1), alpha)
        return alpha, (alpha, predicted, c)

    inputs = (jnp.diff(times), valid[1:], exact[1:], evidence[1:], inside[1:], index, starts)
    _, (alphas, predicted, norms) = jax.lax.scan(step, alpha0, inputs)
    norms = jnp.concatenate([c0[None], norms])
    return gen, Filtered(
        times=times,
        valid=valid,
        alphas=jnp.concatenate([alpha0[None], alphas]),
        predicted=jnp.concatenate([prior[None], predicted]),
        norms=norms,
        log_norms=jnp.where(valid, jnp.log(norms), 0),
        inside=inside,
    )


def under_intervention(model: AbstractCTBN, observations: PanelObservations):
    """`(model, intervention)`: the model under one trajectory's intervention (checked), or as
    it is when the trajectory has none."""
    intervention = observations.intervention
    if intervention is not None:
        intervention = intervention.checked(model)
        model = intervention.apply(model).checked("cims under the intervention")
    return model, intervention


def padded_times(observations: PanelObservations, dtype) -> tuple[Array, Array]:
    """`(times, valid)` of one trajectory: the observation times with the padding slots at the
    last observation's time, and which slots are observations."""
    num_slots = observations.times.shape[-1]
    valid = jnp.arange(num_slots) < observations.num_observations
    last = observations.times[observations.num_observations - 1].astype(dtype)
    return jnp.where(valid, observations.times.astype(dtype), last), valid


def filtered_log_likelihood(filtered: Filtered, p0: Array | None) -> tuple[Array, Array]:
    r"""`(bad, log-likelihood)` of one filtered trajectory: the observations whose norm is not
    usable (likelihood 0), and $\sum_i\log c_i$, without $c_0$ under the conditional
    convention (`p0` is `None`)."""
    first = 0 if p0 is not None else filtered.log_norms[0]
    return filtered.valid & ~positive(filtered.norms), short_sum(filtered.log_norms) - first


def positive(c: Array) -> Array:
    """Whether a filter norm is usable (positive and finite)."""
    return (c > 0) & jnp.isfinite(c)


def safe_horizon(dt: Array, ok: Array) -> Array:
    """A positive horizon for every solve: padding intervals (discarded) get a short one, which
    costs uniformisation about one product."""
    return jnp.where(ok & (dt > 0), dt, jnp.asarray(1e-3, dt.dtype))
