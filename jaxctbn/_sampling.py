"""Exact (Gillespie) sampling of cCTBN trajectories under an intervention."""

from __future__ import annotations

from typing import cast

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from ._ctbn import AbstractCTBN
from ._interventions import Intervention
from ._layout import all_global_states


class Trajectories(eqx.Module):
    r"""Padded trajectories (one, or a batch with leading axes on every field).

    Trajectory $r$ starts in `initial_states[r]` at time 0; its `i`-th jump
    (`i < num_events[r]`) happens at `jump_times[r, i]` and leads to `states[r, i]` (the whole
    global state after the jump); it is observed until `durations[r]`. Slots past `num_events`
    are padding (time = horizon, state = the last state). `truncated[r]` is `True` when the event
    buffer was too small and the path is incomplete: statistics refuse such paths.
    `intervention_targets` / `intervention_states` record the perfect intervention each trajectory
    was recorded under (for data pooling).
    """

    initial_states: Int[Array, "*batch nodes"]
    jump_times: Float[Array, "*batch events"]
    states: Int[Array, "*batch events nodes"]
    num_events: Int[Array, "*batch"]
    durations: Float[Array, "*batch"]
    truncated: Bool[Array, "*batch"]
    intervention_targets: Bool[Array, "*batch nodes"]
    intervention_states: Int[Array, "*batch nodes"]

    @property
    def num_trajectories(self) -> int:
        return int(np.prod(self.num_events.shape))

    @property
    def max_events(self) -> int:
        return int(self.jump_times.shape[-1])


def sample_trajectory(
    model: AbstractCTBN,
    initial_state: ArrayLike,
    horizon: ArrayLike,
    *,
    key: PRNGKeyArray,
    intervention: Intervention | None = None,
    max_events: int = 256,
) -> Trajectories:
    r"""One exact trajectory by the Gillespie algorithm (use `jax.vmap` over keys for many).

    At state $s$ every node $n$ offers transitions $x_n\to x'$ at rate $\Lambda_n(x_n,x',u_n(s))$
    (zero for perfectly intervened nodes); the waiting time is exponential with the total rate and
    the transition is drawn proportionally to its rate.

    **Arguments:**

    - `model`, `initial_state` (ints, one per node, or a float distribution over the global
      states to draw it from; clamped nodes are moved to their clamped state),
      `horizon` ($\tau>0$), `key`, optional `intervention`.
    - `max_events`: buffer size (static). If the path has more jumps the result has
      `truncated=True`; statistics computed from it raise an error instead of using a cut path.
    """
    if max_events < 1:
        raise ValueError(f"max_events must be >= 1, got {max_events}.")
    n_nodes = model.num_nodes
    if intervention is None:
        intervention = Intervention.none(n_nodes)
    # checked again after an imperfect intervention, which can make rates negative or NaN
    model = intervention.apply(model.checked()).checked("cims under the intervention")
    dtype = jnp.result_type(*model.cims)
    horizon = jnp.asarray(horizon, dtype)
    horizon = cast(
        Array,
        eqx.error_if(
            horizon,
            ~(horizon > 0) | ~jnp.isfinite(horizon),
            "horizon: must be positive and finite.",
        ),
    )
    s0 = jnp.asarray(initial_state)
    if jnp.issubdtype(s0.dtype, jnp.floating):
        # a distribution over the global states: draw the initial state from it
        if s0.size != model.num_global_states:
            raise ValueError(
                f"initial_state: a distribution needs {model.num_global_states} probabilities "
                f"(one per global state), got shape {s0.shape}."
            )
        p0 = eqx.error_if(
            s0.reshape(-1),
            jnp.any(s0 < 0) | (jnp.abs(s0.sum() - 1) > 1e-6) | jnp.any(~jnp.isfinite(s0)),
            "initial_state: probabilities must be finite, non-negative and sum to 1.",
        )
        key, key_init = jr.split(key)
        index = jr.categorical(key_init, jnp.log(p0))
        s0 = jnp.asarray(all_global_states(model.cardinalities))[index]
    if s0.shape != (n_nodes,) or not jnp.issubdtype(s0.dtype, jnp.integer):
        raise ValueError(f"initial_state: expected {n_nodes} integer node states, got {s0.shape}.")
    s0 = intervention.initial_states(s0.astype(jnp.int32))
    s0 = eqx.error_if(
        s0,
        jnp.any((s0 < 0) | (s0 >= jnp.asarray(model.cardinalities))),
        f"initial_state: node states must be in 0..k-1 for cardinalities {model.cardinalities}.",
    )
    cards = model.cardinalities
    owner = jnp.asarray(np.concatenate([[n] * k for n, k in enumerate(cards)]), jnp.int32)
    target = jnp.asarray(np.concatenate([np.arange(k) for k in cards]), jnp.int32)

    def rates_at(s):
        return jnp.concatenate([model.node_rates(n, s) for n in range(n_nodes)])

    def cond(carry):
        return ~carry[-1]

    def body(carry):
        t, s, count, times, states, key, truncated, _ = carry
        key, k_time, k_choice = jr.split(key, 3)
        rates = rates_at(s)
        total = rates.sum()
        wait = jr.exponential(k_time, dtype=dtype) / total
        t_new = t + wait
        stops = ~(t_new < horizon)  # also when total == 0 (wait = inf)
        overflow = ~stops & (count >= max_events)
        u = jr.uniform(k_choice, dtype=dtype) * total
        idx = jnp.clip(jnp.searchsorted(jnp.cumsum(rates), u, side="right"), 0, rates.shape[0] - 1)
        s_new = s.at[owner[idx]].set(target[idx])
        accept = ~stops & ~overflow
        slot = jnp.minimum(count, max_events - 1)
        times = times.at[slot].set(jnp.where(accept, t_new, times[slot]))
        states = states.at[slot].set(jnp.where(accept, s_new, states[slot]))
        s = jnp.where(accept, s_new, s)
        t = jnp.where(accept, t_new, t)
        count = count + accept.astype(count.dtype)
        return t, s, count, times, states, key, truncated | overflow, stops | overflow

    init = (
        jnp.zeros((), dtype),
        s0,
        jnp.zeros((), jnp.int32),
        jnp.full((max_events,), horizon, dtype),
        jnp.broadcast_to(s0, (max_events, n_nodes)),
        key,
        jnp.zeros((), bool),
        jnp.zeros((), bool),
    )
    _, s_end, count, times, states, _, truncated, _ = jax.lax.while_loop(cond, body, init)
    # padding after the last jump repeats the final state
    pad = jnp.arange(max_events) >= count
    states = jnp.where(pad[:, None], s_end, states)
    return Trajectories(
        initial_states=s0,
        jump_times=times,
        states=states,
        num_events=count,
        durations=horizon,
        truncated=truncated,
        intervention_targets=intervention.targets,
        intervention_states=intervention.states,
    )


def sample_trajectories(
    model: AbstractCTBN,
    initial_states: ArrayLike,
    horizon: ArrayLike,
    *,
    key: PRNGKeyArray,
    num_trajectories: int,
    intervention: Intervention | None = None,
    max_events: int = 256,
) -> Trajectories:
    """`num_trajectories` independent trajectories (vmapped [`jaxctbn.sample_trajectory`][]).

    `initial_states` is one state `(N,)` shared by all trajectories or one per trajectory
    `(num_trajectories, N)`.
    """
    initial_states = jnp.asarray(initial_states)
    keys = jr.split(key, num_trajectories)
    in_axes = 0 if initial_states.ndim == 2 else None
    if in_axes == 0 and initial_states.shape[0] != num_trajectories:
        raise ValueError(
            f"initial_states: got {initial_states.shape[0]} states for {num_trajectories} trajectories."
        )
    return jax.vmap(
        lambda k, s: sample_trajectory(
            model, s, horizon, key=k, intervention=intervention, max_events=max_events
        ),
        in_axes=(0, in_axes),
    )(keys, initial_states)
