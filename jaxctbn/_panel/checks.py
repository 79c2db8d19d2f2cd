"""The checks of the panel verbs' inputs, and the error naming the trajectory and time of an
observation that is impossible under the model."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool

from .._errors import branched_error_if
from .._model.interventions import is_concrete
from .buckets import PanelBuckets
from .observations import PanelObservations, _label


def checked_inputs(model, observations, emissions, initial_distribution):
    """Checked observations, emission matrices and the initial distribution(s) in the model's
    dtype, with the initial distribution broadcast over the batch (or `None`)."""
    if not isinstance(observations, PanelObservations):
        raise ValueError("observations: expected a PanelObservations.")
    model = model.checked()
    dtype = jnp.result_type(*model.cims)
    observations = observations.checked(model, emissions)
    if emissions is None:
        matrices = tuple(jnp.eye(k, dtype=dtype) for k in model.cardinalities)
    else:
        matrices = emissions.checked(model, dtype)
    p0 = None
    if initial_distribution is not None:
        p0 = jnp.asarray(initial_distribution, dtype)
        S = model.num_global_states
        batch = observations.batch_shape
        if p0.shape == (S,):
            p0 = jnp.broadcast_to(p0, batch + (S,))
        elif p0.shape != batch + (S,):
            raise ValueError(
                f"initial_distribution: expected shape ({S},) or {batch + (S,)} (a distribution "
                f"over the global states, shared or per trajectory), got {p0.shape}."
            )
    return model, observations, matrices, p0


def check_possible(
    outputs,
    bad: Bool[Array | np.ndarray, "*batch observations"] | tuple[Array | np.ndarray, ...],
    observations: PanelObservations | PanelBuckets,
):
    """Raise if an observation has likelihood 0 (or the filter is not finite), naming the
    trajectory and the time: a `ValueError` when `bad` is concrete (an eager call), otherwise
    an `eqx.branched_error_if` on `outputs` naming the trajectory and the observation's index.
    `bad` has the batch shape of `observations` plus the observation axis, or is one flat
    `(R_b, O_b)` array per bucket of `as_flat_buckets(observations)`."""
    if isinstance(bad, tuple) and isinstance(observations, PanelObservations):
        (bad,) = bad
        shape = observations.batch_shape + (observations.times.shape[-1],)
        bad = np.reshape(bad, shape) if is_concrete(bad) else jnp.reshape(bad, shape)
    reason = (
        "is impossible under the model (likelihood 0: a structural zero rate, a perfect "
        "intervention clamping an observed node to another state, or an emission probability "
        "0 rules it out), or the filter is not finite."
    )
    if isinstance(observations, PanelBuckets):
        return _check_possible_in_buckets(outputs, tuple(bad), observations, reason)
    assert not isinstance(bad, tuple)
    batch, num_slots = observations.batch_shape, observations.times.shape[-1]
    if is_concrete(bad):
        found = np.argwhere(np.asarray(bad))
        if len(found):
            *r, i = (int(x) for x in found[0])
            t = float(np.asarray(observations.times)[(*r, i)])
            raise ValueError(
                f"observations: trajectory {_label(r)} at time {t:g} (observation {i}) {reason}"
            )
        return outputs
    size = math.prod(batch) * num_slots
    detail = size <= 20_000  # one message per observation; beyond, one per trajectory
    messages = []
    for flat_index in range(size if detail else math.prod(batch)):
        if detail:
            *r, i = np.unravel_index(flat_index, batch + (num_slots,))
            when = f"observation {i}"
        else:
            r = np.unravel_index(flat_index, batch) if batch else ()
            when = "one of its observations"
        messages.append(f"observations: trajectory {_label(r)} at {when} {reason}")
    flat = bad.reshape(-1)
    index = jnp.argmax(flat) if detail else jnp.argmax(bad.reshape(-1, num_slots).any(-1))
    return branched_error_if(outputs, flat.any(), index, messages)


def _check_possible_in_buckets(outputs, bad: tuple, observations: PanelBuckets, reason: str):
    """`check_possible` of buckets: the trajectory is named by its given index."""
    if is_concrete(*bad):
        first = None  # (given index, observation, time) of the first impossible trajectory
        for flags, bucket, rows in zip(bad, observations.buckets, observations.bucket_rows()):
            flags, rows = np.asarray(flags), np.asarray(rows)
            hit = flags.any(-1)
            if hit.any():
                r = int(np.argmin(np.where(hit, rows, observations.num_trajectories)))
                i = int(np.argmax(flags[r]))
                candidate = (int(rows[r]), i, float(np.asarray(bucket.times)[r, i]))
                first = candidate if first is None else min(first, candidate)
        if first is not None:
            r, i, t = first
            raise ValueError(
                f"observations: trajectory {r} at time {t:g} (observation {i}) {reason}"
            )
        return outputs
    per_trajectory = observations.gather([flags.any(-1) for flags in bad])
    messages = [
        f"observations: trajectory {r} at one of its observations {reason}"
        for r in range(observations.num_trajectories)
    ]
    return branched_error_if(outputs, per_trajectory.any(), jnp.argmax(per_trajectory), messages)
