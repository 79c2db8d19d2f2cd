"""The padded trajectories of a CTBN (one, or a batch), and their files: jaxctbn's long-format
CSV and the formats of other tools."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from .._model.ctbn import AbstractCTBN


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

    def with_rounded_shapes(self) -> Trajectories:
        r"""The same trajectories in a shape class: rows `R` rounded up to the next of $1, 2,
        3, 4, 6, 8, 12, \dots$, event slots `E` to a power of two, so that data sets of similar
        size share compiled programs (as the command line reads paths). Added rows are empty
        (no event, duration 0, no intervention) and come last: no statistic changes. One batch
        axis, concrete arrays."""
        from .rounded_shapes import rounded_trajectories

        return rounded_trajectories(self)

    @classmethod
    def read_csv(
        cls, path: Any, model, *, max_events: int | None = None
    ) -> tuple[Trajectories, list]:
        """Read trajectories from a long-format CSV file (`path`; a file that cannot be read or
        parsed is a one-line error naming it): the rows as
        [`jaxctbn.Trajectories.from_dataframe`][] reads a data frame's."""
        from .csv import read_csv

        return cls.from_dataframe(read_csv(path), model, max_events=max_events)

    @classmethod
    def from_dataframe(
        cls, frame: Any, model, *, max_events: int | None = None
    ) -> tuple[Trajectories, list]:
        """Trajectories from a data frame in the long format `trajectory_id, time, <node names>[,
        intervention]` (each row the state from that time on; see the Files page).

        Rows of a trajectory are taken in file order; times must be non-decreasing, consecutive rows
        may share a time stamp (a zero-length stay). Consecutive rows may differ in at most one node
        (a CTBN changes one node at a time); identical rows are allowed and ignored. The last row of
        a trajectory marks the end of observation. `model` is a CTBN or a dict
        `{node name: cardinality}`.

        **Long trajectories are cut into pieces.** Every row of the result holds at most `E` jumps,
        where `E` is `max_events` if given and otherwise the 99th percentile of the trajectories'
        jump counts. A trajectory with more jumps becomes consecutive rows: each piece starts in the
        state after the previous piece's last jump, at that jump's time (so the previous piece ends
        with a jump at its own end, followed by a zero-length stay), and keeps the trajectory's
        intervention. Dwell times and transition counts are sums over time, so the
        [sufficient statistics][jaxctbn.SufficientStatistics] (pooled or total),
        [`jaxctbn.internal.family_statistics`][] and the structure scores are those of the whole trajectory
        (up to rounding of the time differences). Nothing in the library uses a trajectory's initial
        state other than as the state of its first stay, so a piece's start state counts nowhere
        else. The padded arrays hold `rows x E` slots, at most `(trajectories + jumps / E) x E`, so
        one very long trajectory no longer makes every row as long as itself. Pass
        `max_events` >= the longest trajectory's jump count to keep one row per trajectory.

        **Returns:** the trajectories and, for each row, the id of its trajectory (the pieces of a
        trajectory are consecutive rows with the same id).
        """
        from .csv import trajectories_from_dataframe

        return trajectories_from_dataframe(frame, model, max_events=max_events)

    def write_csv(self, path: Any, model: AbstractCTBN) -> None:
        """Write these trajectories (a batch with leading axes) to the CSV file `path` in the long
        format `trajectory_id, time, <node names>, intervention` (see the Files page): per
        trajectory, its initial state at time 0, one row per jump (the state from that time on)
        and a last row at the end of observation; `model` names the nodes. The text is pandas'
        `DataFrame.to_csv(path, index=False)`; a failed write leaves no partial file."""
        from .csv import write_trajectories_csv

        write_trajectories_csv(self, model, path)

    @classmethod
    def read_pyagrum_csv(
        cls, path: Any, model: Any = None, *, max_events: int | None = None
    ) -> tuple[Trajectories, list, dict[str, list[str]]]:
        """`(trajectories, ids, nodes)` of pyAgrum's trajectory CSV; the format and `model`:
        `jaxctbn/_paths/pyagrum_csv.py`."""
        from .pyagrum_csv import read_trajectory_csv

        return read_trajectory_csv(path, model, max_events=max_events)

    def write_pyagrum_csv(self, path: Any, model: Any) -> None:
        """Write pyAgrum's trajectory CSV, atomically; the format and `model` (the labels):
        `jaxctbn/_paths/pyagrum_csv.py`."""
        from .pyagrum_csv import write_trajectory_csv

        write_trajectory_csv(self, model, path)

    @classmethod
    def from_causal_hub(
        cls, frames: Any, model: Any = None, *, durations: Any = None, max_events: int | None = None
    ) -> tuple[Trajectories, list, dict[str, list[str]]]:
        """`(trajectories, ids, nodes)` of causal-hub's frames (`CatTrjs.to_pandas()`); the
        format, `model` and `durations`: `jaxctbn/_paths/causal_hub_frames.py`."""
        from .causal_hub_frames import trajectories_from_frames

        return trajectories_from_frames(frames, model, durations=durations, max_events=max_events)

    def to_causal_hub(self, model: Any) -> list:
        """One causal-hub frame per trajectory (for `CatTrjs.from_pandas`), `model` giving the
        labels; the format: `jaxctbn/_paths/causal_hub_frames.py`."""
        from .causal_hub_frames import trajectories_to_frames

        return trajectories_to_frames(self, model)

    @classmethod
    def read_pyctbn_json(
        cls, path: Any, model: Any = None, *, index: int = 0, max_events: int | None = None
    ) -> tuple[Trajectories, list, dict[str, list[str]]]:
        """`(trajectories, ids, nodes)` of the samples of a PyCTBN JSON file; the format:
        `jaxctbn/_paths/pyctbn_samples.py`."""
        from .pyctbn_samples import read_samples

        return read_samples(path, model, index=index, max_events=max_events)

    def write_pyctbn_json(self, path: Any, model: Any) -> None:
        """Write these as a PyCTBN JSON file, atomically, with `model`'s network when it is a
        CTBN; the format: `jaxctbn/_paths/pyctbn_samples.py`."""
        from .pyctbn_samples import write_samples

        write_samples(self, model, path)
