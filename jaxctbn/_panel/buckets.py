r"""Panel trajectories of very unequal lengths, stored in buckets of similar lengths.

One padded batch `(R, O)` costs $R\cdot\max_rO_r$ cells whatever the lengths: one subject with
50,000 visits among 5,000 with ten makes it 25,000 times the data. A
[`jaxctbn.panel.PanelBuckets`][] keeps the trajectories in a few flat batches, each padded only to
its own longest trajectory, chosen to minimise the padded cells plus a cost per bucket (each
bucket is one more compiled shape). Every panel function accepts it where it accepts a flat
batch of [`jaxctbn.panel.PanelObservations`][] and returns per-trajectory results in the order
the trajectories were given: the filter of a trajectory never looks at another, so the results
are those of the padded batch (tested), computed bucket by bucket and put back in order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from .._model.ctbn import AbstractCTBN
from .._model.interventions import Intervention, is_concrete
from .._model.layout import rounded_size
from .observations import (
    Emissions,
    PanelObservations,
    _check_concrete,
    _checked,
    _padded_arrays,
    check_sequences,
)

#: The most buckets the grouping makes (each is one more compiled shape).
MAX_BUCKETS = 8


class PanelBuckets(eqx.Module):
    r"""A flat batch of panel trajectories stored as buckets of similar lengths, each padded only
    to its own longest trajectory (see the module page). Build it with
    [`jaxctbn.panel.PanelBuckets.from_sequences`][] (or
    [`jaxctbn.panel.PanelBuckets.read_csv`][]); pass it wherever a flat batch of
    [`jaxctbn.panel.PanelObservations`][] is accepted ([`jaxctbn.panel.panel_log_likelihood`][],
    [`jaxctbn.panel.panel_expected_statistics`][], `panel_marginals`,
    [`jaxctbn.panel.fit_rates`][], [`jaxctbn.panel.learn_structure_from_panels`][],
    [`jaxctbn.experiments.prepare_pool`][]): per-trajectory results come back in the order the
    trajectories were given, and messages name a trajectory by that order.

    - `buckets`: the flat batches `(R_b, O_b)`, each with its trajectories' interventions.
    - `order`: `(R,)`, the given index of each row of the buckets taken in turn.
    """

    buckets: tuple[PanelObservations, ...]
    order: Int[np.ndarray | Array, " trajectories"]

    def __init__(self, buckets: Sequence[PanelObservations], order: Any):
        buckets = tuple(buckets)
        if not buckets or not all(
            isinstance(b, PanelObservations) and len(b.batch_shape) == 1 for b in buckets
        ):
            raise ValueError("buckets: expected one or more flat batches of PanelObservations.")
        if len({b.num_nodes for b in buckets}) != 1:
            raise ValueError("buckets: every bucket must have the same nodes.")
        if len({b.intervention is None for b in buckets}) != 1:
            raise ValueError("buckets: either every bucket has interventions or none.")
        R = sum(b.batch_shape[0] for b in buckets)
        if is_concrete(order):
            order = np.asarray(order)
            if order.shape != (R,) or not np.array_equal(np.sort(order), np.arange(R)):
                raise ValueError(f"order: expected a permutation of 0..{R - 1}.")
            order = order.astype(np.int32)
        self.buckets = buckets
        self.order = order

    @property
    def num_nodes(self) -> int:
        return self.buckets[0].num_nodes

    @property
    def num_trajectories(self) -> int:
        return sum(b.batch_shape[0] for b in self.buckets)

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return (self.num_trajectories,)

    @property
    def intervention(self) -> Intervention | None:
        """The interventions of every trajectory, in the given order (`None` without)."""
        if self.buckets[0].intervention is None:
            return None
        return self.gather([b.intervention for b in self.buckets])

    @property
    def num_observations(self) -> Int[Array, " trajectories"]:
        """The number of observations of every trajectory, in the given order."""
        return self.gather([b.num_observations for b in self.buckets])

    @classmethod
    def from_sequences(
        cls,
        times: Sequence[Any],
        states: Sequence[Any],
        *,
        exact_entry: Sequence[Any] | None = None,
        intervention: Intervention | None = None,
        max_buckets: int = MAX_BUCKETS,
    ) -> "PanelBuckets":
        """Buckets from one array of times `(O_r,)` and of states `(O_r, N)` per trajectory (and
        optionally of exact-entry flags `(O_r,)`), as
        [`jaxctbn.panel.PanelObservations.from_sequences`][] takes them; `intervention`: one per
        trajectory (leading axis `R`) or one shared. The trajectories are grouped by length into
        at most `max_buckets` buckets (see `bucket_rows`)."""
        check_sequences(times, states, exact_entry)
        lengths = np.asarray([len(np.asarray(t)) for t in times])
        groups = bucket_rows(lengths, max_buckets=max_buckets)
        R = len(times)
        if intervention is not None and jnp.ndim(intervention.targets) == 2:
            if jnp.shape(intervention.targets)[0] != R:
                raise ValueError(
                    f"intervention: expected one per trajectory ({R}) or one shared, got "
                    f"targets of shape {jnp.shape(intervention.targets)}."
                )
        buckets = []
        for rows in groups:
            T, Y, E, m = _padded_arrays(times, states, exact_entry, rows)
            _check_concrete(T, Y, m, E, labels=rows)  # messages name the given index
            own = intervention
            if intervention is not None and jnp.ndim(intervention.targets) == 2:
                own = jax.tree_util.tree_map(lambda x: np.asarray(x)[rows], intervention)
            buckets.append(
                PanelObservations(T, Y, num_observations=m, exact_entry=E, intervention=own)
            )
        return cls(buckets, np.concatenate(groups))

    @classmethod
    def from_observations(
        cls,
        observations: PanelObservations,
        *,
        max_buckets: int = MAX_BUCKETS,
        groups: Sequence[Any] | None = None,
    ) -> "PanelBuckets":
        """The trajectories of a concrete flat batch, regrouped by their number of observations
        (`bucket_rows`), or into the given `groups` (the indices of each bucket's trajectories,
        every trajectory once), each bucket cut to its own longest."""
        if not isinstance(observations, PanelObservations) or len(observations.batch_shape) != 1:
            raise ValueError("observations: expected a flat batch of PanelObservations.")
        m = np.asarray(observations.num_observations)
        if groups is None:
            groups = bucket_rows(m, max_buckets=max_buckets)
        groups = [np.asarray(g, np.int32).reshape(-1) for g in groups]
        if any(g.size == 0 for g in groups):
            raise ValueError("groups: every bucket needs at least one trajectory.")
        buckets = []
        for rows in groups:
            width = int(m[rows].max())
            intervention = observations.intervention
            if intervention is not None:
                intervention = jax.tree_util.tree_map(lambda x: np.asarray(x)[rows], intervention)
            buckets.append(
                PanelObservations(
                    np.asarray(observations.times)[rows, :width],
                    np.asarray(observations.states)[rows, :width],
                    num_observations=m[rows],
                    exact_entry=np.asarray(observations.exact_entry)[rows, :width],
                    intervention=intervention,
                )
            )
        return cls(buckets, np.concatenate(groups))

    @classmethod
    def from_dataframe(
        cls, frame: Any, model, *, exact_entry: dict[str, int] | None = None
    ) -> tuple[PanelBuckets, list]:
        """The long format as panel data in buckets: read as
        [`jaxctbn.panel.PanelObservations.from_dataframe`][] reads it, with the trajectories
        grouped by length, each group padded to its own longest. **Returns:** the buckets and
        the trajectory id of each trajectory, in the order the results come back in."""
        from .csv import panel_from_dataframe

        return panel_from_dataframe(frame, model, exact_entry=exact_entry, bucketed=True)

    @classmethod
    def read_csv(
        cls, path: Any, model, *, exact_entry: dict[str, int] | None = None
    ) -> tuple[PanelBuckets, list]:
        """Read a long-format CSV file as panel data in buckets (see
        [`jaxctbn.panel.PanelBuckets.from_dataframe`][])."""
        from .._paths.csv import read_csv

        return cls.from_dataframe(read_csv(path), model, exact_entry=exact_entry)

    def with_time_periods(
        self, cut_times: Any, *, covariates: Any = None
    ) -> tuple[PanelBuckets, Any]:
        """[`jaxctbn.panel.PanelObservations.with_time_periods`][] for buckets (regrouped by the
        new lengths, in the same given order)."""
        from .periods import with_time_periods

        return with_time_periods(self, cut_times, covariates=covariates)

    def padded(self) -> PanelObservations:
        """The same trajectories as one batch padded to the longest, in the given order."""
        width = max(b.times.shape[-1] for b in self.buckets)

        def widen(b: PanelObservations) -> PanelObservations:
            extra = width - b.times.shape[-1]
            last = jnp.take_along_axis(b.times, b.num_observations[:, None] - 1, axis=-1)
            return eqx.tree_at(
                lambda o: (o.times, o.states, o.exact_entry),
                b,
                (
                    jnp.concatenate([b.times, jnp.broadcast_to(last, (len(last), extra))], -1),
                    jnp.pad(b.states, ((0, 0), (0, extra), (0, 0)), constant_values=-1),
                    jnp.pad(b.exact_entry, ((0, 0), (0, extra))),
                ),
            )

        return self.gather([widen(b) for b in self.buckets])

    def with_rounded_shapes(self) -> "PanelBuckets":
        r"""The same trajectories with every bucket's shape `(R_b, O_b)` rounded up: `R_b` to
        the next of $1, 2, 3, 4, 6, 8, 12, 16, \dots$ ($2^k$ and $3\cdot2^{k-1}$; at most
        half again), `O_b` to the next power of two (the longest trajectory of a bucket varies
        more between data sets of one design than their sizes do). Data sets of similar size
        then share their compiled programs (in a process, and across
        processes through the persistent compilation cache of the CLI). The added trajectories
        have one observation with no node observed, so they add nothing to a likelihood
        (conditional on the first observation or not: $\sum_x p(x)=1$) or to the expected
        statistics; they come after the given trajectories in the order (indices
        $R, R+1, \dots$), so per-trajectory results of the first $R$ are those of the given
        trajectories. Host-side (concrete arrays)."""
        rows = self.bucket_rows()
        if not all(is_concrete(r) for r in rows):
            raise ValueError("with_rounded_shapes: needs concrete buckets (outside jit).")
        R = self.num_trajectories
        buckets, order, extra = [], [], R
        for b, given in zip(self.buckets, rows):
            R_b, O_b = b.batch_shape[0], b.times.shape[-1]
            R_new, O_new = rounded_size(R_b), 1 << (O_b - 1).bit_length()
            times = np.asarray(b.times)
            last = times[np.arange(R_b), np.asarray(b.num_observations) - 1]
            # padding times repeat the last real time; padding states are -1
            times = np.concatenate([times, np.repeat(last[:, None], O_new - O_b, 1)], 1)
            times = np.concatenate([times, np.zeros((R_new - R_b, O_new), times.dtype)])
            states = np.pad(
                np.asarray(b.states),
                ((0, R_new - R_b), (0, O_new - O_b), (0, 0)),
                constant_values=-1,
            )
            entry = np.pad(np.asarray(b.exact_entry), ((0, R_new - R_b), (0, O_new - O_b)))
            count = np.concatenate(
                [np.asarray(b.num_observations), np.ones(R_new - R_b, np.int32)]
            ).astype(np.int32)
            intervention = b.intervention
            if intervention is not None:  # the padding under the bucket's first intervention
                intervention = jax.tree_util.tree_map(
                    lambda x: np.concatenate(
                        [np.asarray(x), np.repeat(np.asarray(x)[:1], R_new - R_b, 0)]
                    ),
                    intervention,
                )
            buckets.append(
                PanelObservations(
                    times,
                    states,
                    num_observations=count,
                    exact_entry=entry,
                    intervention=intervention,
                )  # fmt: skip
            )
            order.append(np.concatenate([np.asarray(given), np.arange(extra, extra + R_new - R_b)]))
            extra += R_new - R_b
        return PanelBuckets(buckets, np.concatenate(order).astype(np.int32))

    def checked(self, model: AbstractCTBN, emissions: Emissions | None = None) -> "PanelBuckets":
        """Every bucket checked as [`jaxctbn.panel.PanelObservations.checked`][] does, messages
        naming the trajectory by its given index."""
        rows = self.bucket_rows()
        buckets = [_checked(b, model, emissions, labels=r) for b, r in zip(self.buckets, rows)]
        return eqx.tree_at(lambda o: o.buckets, self, tuple(buckets))

    def bucket_rows(self) -> list[Any]:
        """The given indices of each bucket's trajectories."""
        out, start = [], 0
        for b in self.buckets:
            R = b.batch_shape[0]
            out.append(self.order[start : start + R])
            start += R
        return out

    def position(self) -> Int[np.ndarray | Array, " trajectories"]:
        """For each trajectory in the given order, its row in the buckets taken in turn."""
        if is_concrete(self.order):
            return np.argsort(np.asarray(self.order)).astype(np.int32)
        R = self.num_trajectories
        return jnp.zeros(R, jnp.int32).at[self.order].set(jnp.arange(R, dtype=jnp.int32))

    def gather(self, per_bucket: Sequence[Any]) -> Any:
        """Per-trajectory results of each bucket (pytrees of arrays with a leading axis
        `R_b`), concatenated and put in the given order."""
        position = self.position()
        return jax.tree_util.tree_map(
            lambda *xs: jnp.take(jnp.concatenate(xs), jnp.asarray(position), axis=0), *per_bucket
        )

    def split(self, per_trajectory: Any, name: str = "array") -> list[Any]:
        """A per-trajectory array (leading axis `R`, given order) cut into the buckets' rows
        (a `ValueError` naming `name` when its leading axis is not `R`)."""
        R = self.num_trajectories
        if jnp.ndim(per_trajectory) < 1 or jnp.shape(per_trajectory)[0] != R:
            raise ValueError(
                f"{name}: expected one row per trajectory ({R}), got shape "
                f"{jnp.shape(per_trajectory)}."
            )
        return [
            jnp.take(jnp.asarray(per_trajectory), jnp.asarray(r), axis=0)
            for r in self.bucket_rows()
        ]


def _take_rows(x, rows, width: int, num_slots: int):
    x = np.asarray(x)[rows]
    if x.ndim >= 2 and x.shape[1] == num_slots:  # an observation axis: cut to the bucket's
        x = x[:, :width]
    return x


def bucket_rows(lengths: Any, *, max_buckets: int = MAX_BUCKETS) -> list[np.ndarray]:
    r"""The trajectories grouped into at most `max_buckets` buckets by length (host-side): the
    grouping of contiguous length classes ($(2^{j-1},2^j]$) minimising the padded cells
    $\sum_bR_b\max_{r\in b}O_r$ plus, per bucket, $\max(\sum_rO_r/8,\ 4096)$ (so a bucket is cut
    only when it saves an eighth of the data or more). Returns the given indices of each
    bucket, longest bucket last; one bucket when the lengths are alike."""
    lengths = np.asarray(lengths).astype(np.int64)
    if isinstance(max_buckets, bool) or not isinstance(max_buckets, int) or max_buckets < 1:
        raise ValueError(f"max_buckets: expected an integer >= 1, got {max_buckets!r}.")
    if lengths.ndim != 1 or lengths.size == 0:
        raise ValueError("lengths: expected one length per trajectory.")
    classes = np.ceil(np.log2(np.maximum(lengths, 1))).astype(np.int64)
    keys = np.unique(classes)
    counts = np.asarray([np.sum(classes == c) for c in keys])
    tops = np.asarray([lengths[classes == c].max() for c in keys])
    penalty = max(float(lengths.sum()) / 8, 4096.0)
    C = len(keys)
    prefix = np.concatenate([[0], np.cumsum(counts)])
    # cost[b][j]: the least cost of the first j classes in b buckets; back[b][j]: its last cut
    cost = np.full((max_buckets + 1, C + 1), math.inf)
    back = np.zeros((max_buckets + 1, C + 1), np.int64)
    cost[0, 0] = 0.0
    for b in range(1, max_buckets + 1):
        for j in range(1, C + 1):
            for i in range(j):
                c = cost[b - 1, i] + float(tops[j - 1]) * (prefix[j] - prefix[i]) + penalty
                if c < cost[b, j]:
                    cost[b, j], back[b, j] = c, i
    b = int(np.argmin(cost[:, C]))
    cuts, j = [], C
    while b > 0:
        i = int(back[b, j])
        cuts.append((i, j))
        j, b = i, b - 1
    out = []
    for i, j in reversed(cuts):
        members = np.isin(classes, keys[i:j])
        out.append(np.nonzero(members)[0].astype(np.int32))
    return out


def as_flat_buckets(
    observations: PanelObservations | PanelBuckets,
) -> tuple[PanelObservations, ...]:
    """The flat batches a panel computation loops over: a [`jaxctbn.panel.PanelBuckets`][]'s
    buckets, or one batch with the batch axes of a `PanelObservations` flattened into one."""
    if isinstance(observations, PanelBuckets):
        return observations.buckets
    batch = observations.batch_shape
    R = math.prod(batch)
    return (
        jax.tree_util.tree_map(
            lambda x: jnp.reshape(x, (R,) + jnp.shape(x)[len(batch) :]), observations
        ),
    )


def split_rows(
    observations: PanelObservations | PanelBuckets, per_trajectory: Any, name: str = "array"
) -> list[Any]:
    """A per-trajectory array (leading batch axes of `observations`) cut as
    `as_flat_buckets(observations)` is (a `ValueError` naming `name` on a wrong shape)."""
    if isinstance(observations, PanelBuckets):
        return observations.split(per_trajectory, name)
    batch = observations.batch_shape
    x = jnp.asarray(per_trajectory)
    if x.shape[: len(batch)] != batch:
        raise ValueError(
            f"{name}: expected leading axes {batch} (one row per trajectory), got shape {x.shape}."
        )
    return [jnp.reshape(x, (math.prod(batch),) + x.shape[len(batch) :])]


def per_trajectory_on_host(observations: PanelObservations | PanelBuckets, fn) -> np.ndarray:
    """`fn(times (R_b, O_b), states (R_b, O_b, N), num_observations (R_b,))` → a numpy array
    with leading axis `R_b`, of each flat bucket of concrete observations, assembled in the
    given order of the trajectories (host-side)."""
    buckets = as_flat_buckets(observations)
    rows = (
        observations.bucket_rows()
        if isinstance(observations, PanelBuckets)
        else [np.arange(buckets[0].batch_shape[0])]
    )
    parts = [
        np.asarray(fn(np.asarray(b.times), np.asarray(b.states), np.asarray(b.num_observations)))
        for b in buckets
    ]
    out = np.empty((sum(len(p) for p in parts),) + parts[0].shape[1:], parts[0].dtype)
    for r, p in zip(rows, parts):
        out[np.asarray(r)] = p
    return out
