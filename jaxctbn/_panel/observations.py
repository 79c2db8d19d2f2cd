"""Panel observations as data: the observation times and states of each trajectory (missing
nodes, exact entry times, intervention labels), checked at construction, and misclassification
matrices (emissions)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from .._errors import branched_error_if, error_if
from .._model.ctbn import AbstractCTBN
from .._model.interventions import Intervention, is_concrete


def _array(x: Any) -> Array:
    """`jnp.asarray(x)`; a numpy array copied to the device as it is (`jnp.asarray` compiles a
    program for each new shape and dtype of a numpy array, 7-14 ms each: 0.1 s of a `fit`)."""
    return jax.device_put(x) if type(x) is np.ndarray else jnp.asarray(x)


class PanelObservations(eqx.Module):
    r"""Panel observations of one trajectory, or of a batch (leading axes on every field),
    padded to a common number of observations.

    **Arguments:**

    - `times`: observation times `(*batch, O)`, strictly increasing within each trajectory's
      first `num_observations` entries (entries beyond are padding and ignored).
    - `states`: observed states `(*batch, O, N)`; `-1` = missing (the node was not observed at
      that time). With [`jaxctbn.panel.Emissions`][] a state is the *observed symbol* $y$ of the
      node's misclassification matrix.
    - `num_observations` (keyword-only): real observations per trajectory `(*batch,)`, each
      $\ge1$ (default: all `O`).
    - `exact_entry` (keyword-only): `(*batch, O)` booleans; `True` marks an **exact entry
      time**: the process *enters* the observed configuration (of the observed nodes) by a jump
      at that time, from a state in which the observed nodes were not all at their observed
      values (msm's `deathexact`). Such rows are taken as error-free (no emission matrix), need
      at least one observed node, and cannot be a trajectory's first observation.
    - `intervention` (keyword-only): the [`jaxctbn.Intervention`][] each trajectory was
      recorded under (batched like `times`, or one shared by all); `None` = none. A perfect
      intervention clamps its nodes, so the filter runs on the generator of the intervened model
      and clamped nodes stay in their clamped state.

    Structure is checked here with `ValueError`s naming the argument: shapes, integer states
    $\ge-1$, `num_observations` in `1..O`, and, for concrete arrays, finite and strictly
    increasing times (two rows at the same time are reported as conflicting states when they
    disagree, else as a duplicate to merge). States beyond a node's cardinality are checked
    against the model by the inference functions (see [`jaxctbn.panel.PanelObservations.checked`][]).
    """

    times: Float[Array, "*batch observations"]
    states: Int[Array, "*batch observations nodes"]
    num_observations: Int[Array, "*batch"]
    exact_entry: Bool[Array, "*batch observations"]
    intervention: Intervention | None

    def __init__(
        self,
        times: ArrayLike | Sequence[Any],
        states: ArrayLike | Sequence[Any],
        *,
        num_observations: ArrayLike | Sequence[Any] | None = None,
        exact_entry: ArrayLike | Sequence[Any] | None = None,
        intervention: Intervention | None = None,
    ):
        times = _array(times)
        states = _array(states)
        if times.ndim < 1:
            raise ValueError(f"times: expected shape (*batch, observations), got {times.shape}.")
        if not jnp.issubdtype(times.dtype, jnp.floating):
            times = times.astype(float)
        if states.shape[:-1] != times.shape or states.ndim != times.ndim + 1:
            raise ValueError(
                f"states: expected shape {times.shape + ('nodes',)} (one row of node states per "
                f"observation time), got {states.shape}."
            )
        if not jnp.issubdtype(states.dtype, jnp.integer):
            raise ValueError(f"states: expected integers (-1 = missing), got {states.dtype}.")
        batch, num_slots = times.shape[:-1], times.shape[-1]
        if num_slots < 1:
            raise ValueError("times: need at least one observation per trajectory.")
        if num_observations is None:
            num_observations = jnp.full(batch, num_slots, jnp.int32)
        num_observations = _array(num_observations)
        if num_observations.shape != batch or not jnp.issubdtype(
            num_observations.dtype, jnp.integer
        ):
            raise ValueError(
                f"num_observations: expected integers of shape {batch} (one per trajectory), got "
                f"{num_observations.dtype} {num_observations.shape}."
            )
        if exact_entry is None:
            exact_entry = jnp.zeros(times.shape, bool)
        exact_entry = _array(exact_entry)
        if exact_entry.shape != times.shape or exact_entry.dtype != bool:
            raise ValueError(
                f"exact_entry: expected booleans of shape {times.shape} (one per observation), "
                f"got {exact_entry.dtype} {exact_entry.shape}."
            )
        if intervention is not None:
            N = states.shape[-1]
            if intervention.num_nodes != N:
                raise ValueError(f"intervention: has {intervention.num_nodes} nodes, states {N}.")
            if jnp.shape(intervention.targets) == (N,) and batch:
                intervention = jax.tree_util.tree_map(
                    lambda x: jnp.broadcast_to(x, batch + jnp.shape(x)), intervention
                )
            elif jnp.shape(intervention.targets)[:-1] != batch:
                raise ValueError(
                    f"intervention: expected one per trajectory (batch shape {batch}) or one "
                    f"shared, got targets of shape {jnp.shape(intervention.targets)}."
                )
        if is_concrete(times, states, num_observations, exact_entry):
            _check_concrete(
                np.asarray(times), np.asarray(states), np.asarray(num_observations),
                np.asarray(exact_entry),
            )  # fmt: skip
        self.times = times
        self.states = states.astype(jnp.int32)
        self.num_observations = num_observations.astype(jnp.int32)
        self.exact_entry = exact_entry
        self.intervention = intervention

    @property
    def num_nodes(self) -> int:
        return int(self.states.shape[-1])

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return tuple(self.times.shape[:-1])

    @classmethod
    def from_sequences(
        cls,
        times: Sequence[Any],
        states: Sequence[Any],
        *,
        exact_entry: Sequence[Any] | None = None,
        intervention: Intervention | None = None,
    ) -> "PanelObservations":
        """A batch from one array of times `(O_r,)` and of states `(O_r, N)` per trajectory (and
        optionally of exact-entry flags `(O_r,)`), padded to the longest."""
        check_sequences(times, states, exact_entry)
        T, Y, E, lengths = _padded_arrays(times, states, exact_entry, range(len(times)))
        return cls(
            T,
            Y,
            num_observations=lengths,
            exact_entry=E,
            intervention=intervention,
        )

    @classmethod
    def from_paths(cls, paths, times: ArrayLike) -> PanelObservations:
        r"""Complete `paths` seen only at `times` `(K,)` (every node, without error): a flat batch of
        [`jaxctbn.panel.PanelObservations`][], the state of each path at each time (a jump at $t$
        counts as seen at $t$), each trajectory under its recorded perfect intervention. `paths`: a
        batch of [`jaxctbn.Trajectories`][] with one leading axis. Pure and jittable (the times are
        values); times beyond a path's duration see its last state."""
        jump_times = jnp.asarray(paths.jump_times)
        if jump_times.ndim != 2:
            raise ValueError("paths: expected a batch of trajectories with one leading axis.")
        times = jnp.asarray(times, jump_times.dtype)
        if times.ndim != 1 or times.shape[0] < 1:
            raise ValueError(f"times: expected one or more times, shape (K,), got {times.shape}.")
        R, E = jump_times.shape
        happened = jnp.arange(E) < paths.num_events[:, None]
        count = jnp.sum(
            (jump_times[:, None, :] <= times[None, :, None]) & happened[:, None, :], axis=-1
        )  # (R, K): jumps up to each time
        after = jnp.take_along_axis(paths.states, jnp.maximum(count - 1, 0)[..., None], axis=1)
        states = jnp.where((count > 0)[..., None], after, paths.initial_states[:, None, :])
        intervention = Intervention(
            targets=jnp.asarray(paths.intervention_targets, bool),
            states=jnp.asarray(paths.intervention_states, jnp.int32),
        )
        return cls(jnp.broadcast_to(times, (R, times.shape[0])), states, intervention=intervention)

    @classmethod
    def from_dataframe(
        cls, frame: Any, model, *, exact_entry: dict[str, int] | None = None
    ) -> tuple[PanelObservations, list]:
        """Parse the long format as **panel** data: each row is an observation of the nodes at that
        time (an empty cell = that node was not observed then), the process being hidden between
        rows. Same columns as the trajectory CSV ([`jaxctbn.Trajectories.read_csv`][]):
        `trajectory_id, time, <nodes>[, intervention]`.

        - Rows of a trajectory are sorted by time. Two rows at the same time are merged when they
          agree on every node observed in both, and are an error naming the trajectory and time when
          they conflict.
        - A row with no observed node is dropped (it carries no information).
        - A trajectory with a single observation time is kept; under the default likelihood,
          conditional on the first observation, it contributes nothing (see
          [`jaxctbn.panel.panel_log_likelihood`][]).
        - `exact_entry` `{node: state}` (msm's `deathexact`): a row observing `node` in `state`
          is an **exact entry time** (the process entered the state by a jump at that time; the
          state before is unknown) unless it is the trajectory's first row or the previous row
          already observed `node` in `state`.
        - `intervention` labels (`A=1;B=0`) are per trajectory as for paths; a clamped node must
          be observed only in its clamped state.

        `model` is a CTBN or a dict `{node name: cardinality}`. **Returns:** the
        [`jaxctbn.panel.PanelObservations`][] (a batch padded to the longest trajectory) and the
        trajectory id of each trajectory, in the order of the batch. A warning names
        [`jaxctbn.panel.PanelBuckets.from_dataframe`][] when padding would take more than four
        times the data's own size (and more than 64 MiB): buckets group trajectories by length,
        each group padded to its own longest (use them when the numbers of visits differ a lot,
        e.g. one subject with 50,000 visits among thousands with ten)."""
        from .csv import panel_from_dataframe

        return panel_from_dataframe(frame, model, exact_entry=exact_entry)

    @classmethod
    def read_csv(
        cls, path: Any, model, *, exact_entry: dict[str, int] | None = None
    ) -> tuple[PanelObservations, list]:
        """Read a long-format CSV file as panel data: the file's rows as
        [`PanelObservations.from_dataframe`][jaxctbn.panel.PanelObservations.from_dataframe]
        reads a data frame's (`path` a file name; a file that cannot be read or parsed is a
        one-line error naming it)."""
        from .._paths.csv import read_csv

        return cls.from_dataframe(read_csv(path), model, exact_entry=exact_entry)

    def with_time_periods(
        self, cut_times: ArrayLike, *, covariates: Any = None
    ) -> tuple[PanelObservations, Any]:
        r"""These observations and covariates for rates that are piecewise constant in time, changing
        at `cut_times` (R msm's `pci`).

        With cut times $c_1<\dots<c_P$, the time axis splits into periods $[c_0{=}{-}\infty,c_1),\
        [c_1,c_2),\dots,[c_P,\infty)$, and every rate $\lambda$ a period acts on is
        
        $$\lambda(t)=\lambda\,\exp\Big(\sum_{p=1}^P\beta_p\,(1[t\in[c_p,c_{p+1})]-\bar d_p)\Big),$$
        
        a time-varying covariate per later period (dummy-coded against the first), centred like every
        covariate. A trajectory's interval that spans a cut is split there by a **censored row** (no
        node observed: the likelihood is unchanged, the filter only changes generator there), and the
        period dummies are per-observation covariates ([`jaxctbn.panel.Covariates`][] with
        `per_observation=True`), so [`jaxctbn.panel.fit_rates`][] and
        [`RateFit.uncertainty`][jaxctbn.panel.RateFit.uncertainty] fit and report the periods' hazard ratios as covariate
        effects, the way msm reports `timeperiod[c1,c2)`.

        **Arguments** (the observations concrete, with one batch axis):

        - `cut_times`: `(P,)` finite, strictly increasing, each strictly inside the data's
          follow-up (after the earliest first observation, before the latest last one), and each
          period after the first must hold the start of some interval (else its rates are not
          identified).
        - `covariates` (keyword-only): other covariates of the fit (baseline or per observation;
          a censored row takes the value of the observation before it), kept in front of the
          period dummies with their `acts_on`.

        **Returns:** `(observations, covariates)`: the data with a censored row at every cut time
        inside a trajectory's follow-up (not already an observation time), of the same kind as
        given (buckets regrouped by the new lengths, in the same given order), and per-observation
        covariates: the given ones, then one dummy per period after the first, named
        `period[c1,c2)`, ..., `period[cP,Inf)`, acting on every free rate. Pass both to
        [`jaxctbn.panel.fit_rates`][].
        """
        from .periods import with_time_periods

        return with_time_periods(self, cut_times, covariates=covariates)

    def checked(
        self, model: AbstractCTBN, emissions: "Emissions | None" = None
    ) -> "PanelObservations":
        """The same observations with every observed state checked against `model` (states
        `0..k-1`, or the emission matrix's symbols `0..m-1`): a `ValueError` naming the
        trajectory, time and node when the arrays are concrete, otherwise an `eqx.error_if` on
        the returned states (which every result is computed from)."""
        return _checked(self, model, emissions)


def require_batch(observations) -> None:
    """A one-line error unless `observations` is a batch `(R, O)` of `PanelObservations` (the
    routes that vmap over trajectories)."""
    if not isinstance(observations, PanelObservations) or jnp.ndim(observations.times) != 2:
        raise ValueError(
            "observations: a batch of trajectories (PanelObservations with shape (R, O))."
        )


def per_trajectory_tables(model: AbstractCTBN, observations: "PanelObservations", build, route):
    """For a batch `(R, O)` of exact observations (no emissions, no exact entry times: an
    `eqx.error_if` naming `route`): the checked model and observations, `build(m)` of each
    trajectory's intervened model `m` (stacked on a leading axis of length R; one
    `build(model)` per trajectory without interventions), the clamped nodes `(R, N)` and their
    clamped states `(R, N)`. The per-trajectory set-up of the samplers and approximations that
    vmap over trajectories."""
    model = model.checked()
    observations = observations.checked(model, None)
    observations = error_if(
        observations,
        jnp.any(observations.exact_entry),
        f"observations: exact entry times are not supported by {route}.",
    )
    if observations.intervention is not None:
        observations = eqx.tree_at(
            lambda o: o.intervention, observations, observations.intervention.checked(model)
        )
    tables, targets, clamps = trajectory_tables(model, observations, build)
    return model, observations, tables, targets, clamps


def trajectory_tables(model: AbstractCTBN, observations: "PanelObservations", build):
    """`per_trajectory_tables` without the checks (for a model that changes inside a loop
    whose observations were checked once): `build(m)` of each trajectory's intervened model,
    the clamped nodes `(R, N)` and their clamped states `(R, N)`."""
    R = observations.times.shape[0]
    intervention = observations.intervention
    targets, clamps = clamped_nodes(observations, model.num_nodes)
    if intervention is None:
        return jax.vmap(lambda _: build(model))(jnp.arange(R)), targets, clamps
    per_trajectory = jnp.ndim(intervention.targets) == 2
    tables = jax.vmap(
        lambda i: build(i.apply(model)), in_axes=0 if per_trajectory else None, axis_size=R
    )(intervention)
    return tables, targets, clamps


def clamped_nodes(observations: "PanelObservations", num_nodes: int) -> tuple[Array, Array]:
    """Per trajectory of a flat batch `(R, O)`, the nodes its intervention clamps `(R, N)` and
    their clamped states `(R, N)` (none without an intervention)."""
    R = observations.times.shape[0]
    intervention = observations.intervention
    if intervention is None:
        return jnp.zeros((R, num_nodes), bool), jnp.zeros((R, num_nodes), jnp.int32)
    targets = jnp.broadcast_to(intervention.targets, (R, num_nodes))
    clamps = jnp.broadcast_to(intervention.states, (R, num_nodes)).astype(jnp.int32)
    return targets, clamps


def check_sequences(times, states, exact_entry) -> None:
    """One array of times, of states and (optionally) of exact-entry flags per trajectory."""
    if len(times) != len(states) or not times:
        raise ValueError(
            f"times, states: need one array per trajectory each, got {len(times)} and "
            f"{len(states)}."
        )
    if exact_entry is not None and len(exact_entry) != len(times):
        raise ValueError(f"exact_entry: need one array per trajectory ({len(times)}).")


def _padded_arrays(times, states, exact_entry, rows) -> tuple[np.ndarray, ...]:
    """Host-side `(times (R, O), states (R, O, N), exact_entry (R, O), lengths (R,))` of the
    trajectories `rows` of per-trajectory sequences, padded to the longest of them (padding
    times repeat the last real time, padding states are -1)."""
    rows = list(rows)
    lengths = np.asarray([len(np.asarray(times[r])) for r in rows], np.int32)
    num_slots = int(lengths.max())
    first = np.asarray(states[rows[0]])
    if first.ndim not in (1, 2) or first.shape[0] != lengths[0]:
        raise ValueError(
            f"states[{rows[0]}]: expected shape ({lengths[0]}, N), one row of node states per "
            f"time of times[{rows[0]}], got {first.shape}."
        )
    N = first.reshape(lengths[0], -1).shape[-1]
    R = len(rows)
    T = np.zeros((R, num_slots))
    Y = np.full((R, num_slots, N), -1, np.int32)
    E = np.zeros((R, num_slots), bool)
    for i, r in enumerate(rows):
        t, y, m = np.asarray(times[r], float), np.asarray(states[r]), int(lengths[i])
        if y.shape != (m, N):
            raise ValueError(f"states[{r}]: expected shape ({m}, {N}), got {y.shape}.")
        T[i, :m] = t
        T[i, m:] = t[-1] if m else 0.0
        Y[i, :m] = y
        if exact_entry is not None:
            E[i, :m] = np.asarray(exact_entry[r], bool)
    return T, Y, E, lengths


def _checked(
    observations: PanelObservations,
    model: AbstractCTBN,
    emissions: "Emissions | None",
    labels: np.ndarray | None = None,
) -> PanelObservations:
    """`PanelObservations.checked`, naming trajectory `r` of a flat batch as `labels[r]` when
    given (its index in the data set a bucket was cut from)."""
    if observations.num_nodes != model.num_nodes:
        raise ValueError(
            f"observations: have {observations.num_nodes} nodes, the model has {model.num_nodes}."
        )
    symbols = np.asarray(model.cardinalities if emissions is None else emissions.symbols(model))
    states = observations.states
    if is_concrete(states, observations.num_observations, observations.exact_entry):
        y = np.asarray(states)
        ok = (np.arange(y.shape[-2]) < np.asarray(observations.num_observations)[..., None])[
            ..., None
        ]
        exact = np.asarray(observations.exact_entry)[..., None]
        limit = np.where(exact, np.asarray(model.cardinalities), symbols)
        bad = ok & (y >= limit)
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            *where, i, n = index
            t = float(np.asarray(observations.times)[(*where, i)])
            symbol = emissions is not None and not bool(exact[(*where, i, 0)])
            symbol = symbol and emissions is not None and emissions.matrices[n] is not None
            what = (
                f"symbol {y[index]} for node {model.names[n]!r}, whose emission matrix has "
                f"symbols 0..{int(limit[index]) - 1} (its columns)"
                if symbol
                else f"state {y[index]} for node {model.names[n]!r}, which has states "
                f"0..{int(limit[index]) - 1}"
            )
            raise ValueError(
                f"states: trajectory {_label(where, labels)} at time {t:g} has {what}."
            )
        return observations
    limit = jnp.where(
        observations.exact_entry[..., None], jnp.asarray(model.cardinalities), jnp.asarray(symbols)
    )
    valid = jnp.arange(states.shape[-2]) < observations.num_observations[..., None]
    bad = valid[..., None] & (states >= limit)
    per_node = bad.reshape(-1, model.num_nodes).any(0)
    states = branched_error_if(
        states,
        per_node.any(),
        jnp.argmax(per_node),
        [
            f"states: an observed state of node {name!r} is outside its states (or its "
            "emission matrix's symbols)."
            for name in model.names
        ],
    )
    # the structure checks of the constructor, on traced values
    times = observations.times
    real_step = valid[..., 1:] & ~(jnp.diff(times, axis=-1) > 0)
    times = error_if(
        times,
        jnp.any(real_step) | jnp.any(valid & ~jnp.isfinite(times)),
        "times: each trajectory's observation times must be finite and strictly increasing.",
    )
    exact = observations.exact_entry & valid
    states = error_if(
        states,
        jnp.any(valid[..., None] & (states < -1))
        | jnp.any(exact[..., 0])
        | jnp.any(exact & jnp.all(states < 0, axis=-1)),
        "states: observed states must be >= -1 (-1 = missing), and an exact entry time "
        "needs an observed node and cannot be a trajectory's first observation.",
    )
    return eqx.tree_at(lambda o: (o.times, o.states), observations, (times, states))


def _label(index, labels: np.ndarray | None = None) -> str:
    """A trajectory's name in messages: its batch index, or `labels[index]` for a flat batch
    cut from a larger data set."""
    index = tuple(int(i) for i in index)
    if labels is not None and len(index) == 1:
        return str(int(labels[index[0]]))
    if not index:
        return "0"
    return str(index[0]) if len(index) == 1 else str(index)


def _check_concrete(
    times, states, num_observations, exact_entry, labels: np.ndarray | None = None
) -> None:
    """Structure checks of concrete panel arrays (one-line `ValueError`s; trajectory `r` of a
    flat batch named `labels[r]` when given)."""
    num_slots = times.shape[-1]
    out_of_range = (num_observations < 1) | (num_observations > num_slots)
    if np.any(out_of_range):
        index = tuple(np.argwhere(out_of_range)[0])
        raise ValueError(
            f"num_observations: every trajectory needs 1..{num_slots} observations; trajectory "
            f"{_label(index, labels)} has {int(num_observations[index])}."
        )
    valid = np.arange(num_slots) < num_observations[..., None]
    if np.any(valid[..., None] & (states < -1)):
        index = tuple(np.argwhere(valid[..., None] & (states < -1))[0])
        raise ValueError(
            f"states: unknown state {states[index]} of node {index[-1]} in trajectory "
            f"{_label(index[:-2], labels)} at time {times[index[:-1]]:g}; states are 0..k-1, or -1 = "
            "missing."
        )
    if np.any(valid & ~np.isfinite(times)):
        index = tuple(np.argwhere(valid & ~np.isfinite(times))[0])
        raise ValueError(f"times: trajectory {_label(index[:-1], labels)} has a non-finite time.")
    pair = valid[..., 1:]
    step = np.diff(times, axis=-1)
    if np.any(pair & (step < 0)):
        index = tuple(np.argwhere(pair & (step < 0))[0])
        raise ValueError(
            f"times: trajectory {_label(index[:-1], labels)} is not sorted (time {times[index]:g} comes "
            "before an earlier one); sort each trajectory's observations by time."
        )
    if np.any(pair & (step == 0)):
        index = tuple(np.argwhere(pair & (step == 0))[0])
        a, b = states[index], states[(*index[:-1], index[-1] + 1)]
        conflict = (a >= 0) & (b >= 0) & (a != b)
        where = f"trajectory {_label(index[:-1], labels)} at time {times[index]:g}"
        if conflict.any():
            n = int(np.argmax(conflict))
            raise ValueError(
                f"states: conflicting states at the same time: {where} has node {n} in states "
                f"{a[n]} and {b[n]}."
            )
        raise ValueError(
            f"times: {where} is observed twice; merge the rows into one (-1 = missing)."
        )
    exact = valid & exact_entry
    if np.any(exact[..., 0]):
        index = tuple(np.argwhere(exact[..., 0])[0])
        raise ValueError(
            f"exact_entry: the first observation of trajectory {_label(index, labels)} cannot be an exact "
            "entry time (nothing before it is modelled)."
        )
    if np.any(exact & np.all(states < 0, axis=-1)):
        index = tuple(np.argwhere(exact & np.all(states < 0, axis=-1))[0])
        raise ValueError(
            f"exact_entry: trajectory {_label(index[:-1], labels)} at time {times[index]:g} is an exact "
            "entry time but observes no node."
        )


class Emissions(eqx.Module):
    r"""Per-node misclassification (emission) matrices $E_n(x,y)=p(y\mid x)$: node $n$ in
    true state $x$ is recorded as symbol $y$.

    **Arguments:**

    - `matrices`: one entry per node, `None` (the node is observed without error) or an array
      of shape `(k_n, m_n)` whose rows are distributions over the $m_n$ symbols.

    Shapes are checked against the model by the inference functions (`ValueError`); the values
    (finite, $\ge0$, rows summing to 1) inside jit (`eqx.error_if` on the evidence). The
    evidence of an observation is $e(s)=\prod_{n\ \mathrm{observed}}E_n(s_n,y_n)$.
    """

    matrices: tuple[Array | None, ...]

    def __init__(self, matrices: Sequence[ArrayLike | None]):
        out = []
        for n, m in enumerate(matrices):
            if m is None:
                out.append(None)
                continue
            if isinstance(m, np.ndarray | list | tuple):
                kind = np.asarray(m).dtype.kind
                if kind not in "biuf":
                    raise ValueError(
                        f"matrices[{n}]: expected probabilities (numbers), got an array of "
                        f"dtype {np.asarray(m).dtype}."
                    )
            m = jnp.asarray(m)
            if m.ndim != 2:
                raise ValueError(f"matrices[{n}]: expected shape (k, symbols), got {m.shape}.")
            out.append(m)
        self.matrices = tuple(out)

    def symbols(self, model: AbstractCTBN) -> tuple[int, ...]:
        """The number of symbols of each node (its cardinality where it has no matrix); checks
        the shapes against `model`."""
        if len(self.matrices) != model.num_nodes:
            raise ValueError(
                f"emissions: {len(self.matrices)} matrices for a model of {model.num_nodes} nodes."
            )
        out = []
        for name, k, m in zip(model.names, model.cardinalities, self.matrices):
            if m is not None and m.shape[0] != k:
                raise ValueError(
                    f"emissions: the matrix of node {name!r} has {m.shape[0]} rows, the node "
                    f"{k} states."
                )
            out.append(k if m is None else int(m.shape[1]))
        return tuple(out)

    def checked(self, model: AbstractCTBN, dtype) -> tuple[Array, ...]:
        """Per node the `(k_n, m_n)` matrix (identity where none), in `dtype`, value-checked."""
        self.symbols(model)
        out = []
        for name, k, m in zip(model.names, model.cardinalities, self.matrices):
            if m is None:
                out.append(jnp.eye(k, dtype=dtype))
                continue
            m = jnp.asarray(m, dtype)
            tol = 1e-6 if jnp.finfo(dtype).bits >= 64 else 1e-4
            bad = jnp.any(~jnp.isfinite(m)) | jnp.any(m < 0) | jnp.any(jnp.abs(m.sum(-1) - 1) > tol)
            out.append(
                error_if(
                    m,
                    bad,
                    f"emissions: the matrix of node {name!r} must be finite and >= 0, with rows "
                    "summing to 1 (p(y | x) over the symbols y).",
                )
            )
        return tuple(out)
