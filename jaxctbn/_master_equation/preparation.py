"""What a solve starts from: the checked (intervened) model, its generator, the initial
distribution over the global states and the horizon, every check attached to the values the
solve's outputs are computed from."""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int

from .._errors import branched_error_if, error_if
from .._model.ctbn import AbstractCTBN
from .._model.interventions import Intervention
from .._model.layout import global_state_index
from .generator import AbstractGenerator, amalgamate


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
    return branched_error_if(
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
    p = error_if(
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


def check_horizon_shape(horizon: ArrayLike) -> None:
    if jnp.ndim(horizon) != 0:
        raise ValueError(f"horizon: expected a scalar, got shape {jnp.shape(horizon)}.")


def checked_horizon(horizon: ArrayLike, dtype) -> Float[Array, ""]:
    """The horizon as a scalar of `dtype`, checked (inside jit) to be positive and finite."""
    check_horizon_shape(horizon)
    horizon = jnp.asarray(horizon, dtype)
    return error_if(
        horizon,
        ~(horizon > 0) | ~jnp.isfinite(horizon),
        "horizon: must be a positive finite number.",
    )
