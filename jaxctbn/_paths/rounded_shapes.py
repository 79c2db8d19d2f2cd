"""Trajectories in shape classes: rows and event slots rounded up, so that data sets of similar
size share their compiled programs ([`Trajectories.with_rounded_shapes`][jaxctbn.Trajectories.with_rounded_shapes])."""

from __future__ import annotations

import jax
import numpy as np

from .._model.interventions import is_concrete
from .._model.layout import rounded_size
from .trajectories import Trajectories


def rounded_trajectories(traj: Trajectories) -> Trajectories:
    """`traj` with `(R, E)` rounded up, empty rows and padding slots added (see
    `Trajectories.with_rounded_shapes`)."""
    if traj.num_events.ndim != 1:
        raise ValueError(
            f"with_rounded_shapes: needs one batch axis, got batch shape {traj.num_events.shape}."
        )
    if not all(is_concrete(x) for x in jax.tree_util.tree_leaves(traj)):
        raise ValueError("with_rounded_shapes: needs concrete trajectories (outside jit).")
    R, E = traj.jump_times.shape
    rows, slots = rounded_size(R) - R, (1 << (E - 1).bit_length()) - E
    durations = np.asarray(traj.durations)
    # padding slots: time = the row's duration, state = its last state
    jump_times = np.concatenate(
        [np.asarray(traj.jump_times), np.repeat(durations[:, None], slots, 1)], 1
    )
    states = np.asarray(traj.states)
    states = np.concatenate([states, np.repeat(states[:, -1:], slots, 1)], 1)

    def rows_added(x):
        return np.concatenate([x, np.zeros((rows, *x.shape[1:]), x.dtype)])

    arrays = {
        "initial_states": np.asarray(traj.initial_states),
        "jump_times": jump_times,
        "states": states,
        "num_events": np.asarray(traj.num_events),
        "durations": durations,
        "truncated": np.asarray(traj.truncated),
        "intervention_targets": np.asarray(traj.intervention_targets),
        "intervention_states": np.asarray(traj.intervention_states),
    }
    return Trajectories(**jax.device_put({k: rows_added(v) for k, v in arrays.items()}))
