r"""Baseline covariates with log-linear effects on the rates (R msm's `covariates = ~ ...`).

Trajectory $r$ carries covariates $z_r\in\mathbb R^C$; a rate that covariate $c$ acts on is

$$\lambda_{n}(x,x',u;z_r)=\lambda_n(x,x',u)\,\exp\Big(\sum_c\beta_{c,n}(x,x',u)\,
(z_{rc}-\bar z_c)\Big),$$

with $\bar z$ the mean over the observations that start an interval (every observation but each
trajectory's last: R msm's `center = TRUE`, so a trajectory weighs as its number of intervals):
$\lambda_n(x,x',u)$ is the rate at the covariates' means, and $e^{\beta}$ the hazard ratio of one unit of $z_c$. The
effects enter the panel likelihood as per-trajectory rate scales (the imperfect interventions
of [`jaxctbn.Intervention`][]), so every route of the filter applies unchanged.

**Time-varying covariates** (`per_observation=True`): trajectory $r$ carries $z_{ri}$ at each
observation time $t_i$, taken as constant until the next observation (msm's convention: the
value at the start of an interval holds over it), so the rates are piecewise constant and the
filter propagates interval $(t_i,t_{i+1}]$ with the generator at $z_{ri}$.
[`with_time_periods`][jaxctbn.panel.PanelObservations.with_time_periods] builds such covariates for
piecewise-constant baseline rates (msm's `pci`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from .._model.interventions import Intervention, is_concrete
from .buckets import PanelBuckets
from .observations import PanelObservations

if TYPE_CHECKING:
    import pandas as pd

#: the largest absolute covariate value accepted (products and squares of centred values stay
#: far from float64's overflow)
MAX_COVARIATE = 1e100


class Covariates(eqx.Module):
    r"""Covariates of every trajectory (baseline, or per observation) and the rates they act
    on.

    **Arguments:**

    - `values`: `(*batch, C)`, one row per trajectory (the leading axes of the
      [`jaxctbn.panel.PanelObservations`][], or of a [`jaxctbn.panel.PanelBuckets`][]' original
      order). Dummy-code categorical covariates (one column per level but the reference).
    - `names` (keyword-only): one per column (default `z0`, `z1`, ...).
    - `acts_on` (keyword-only): per node, booleans `(C, configs, k, k)`: which of its rates
      each covariate scales (default: every free rate of every node). Entries off the free
      rates (the diagonal, structural zeros) are ignored.
    - `shared` (keyword-only): per node, integers `(C, configs, k, k)`: entries of one
      covariate with the same label $\ge0$ share one effect, across rates, parent
      configurations and nodes (R msm's `constraint`); `-1` (and the default `None`): an
      effect of its own. Labels must be concrete.
    - `per_observation` (keyword-only, default `False`): `values` are `(*batch, O, C)`, one
      row per observation of each trajectory (aligned with its observations, padding
      ignored), each holding until the next observation: time-varying covariates. They enter
      the likelihood (the fit and [`RateFit.uncertainty`][jaxctbn.panel.RateFit.uncertainty]) only.

    Structure is checked here (a `ValueError` naming the argument); concrete values must be
    finite, and a covariate that is constant over the trajectories is refused (its effect is
    not identified once centred).
    """

    values: Float[Array, "*batch covariates"]
    acts_on: tuple[Bool[Array, "covariates _configs _k _k"], ...] | None
    shared: tuple[Int[Array, "covariates _configs _k _k"], ...] | None
    names: tuple[str, ...] = eqx.field(static=True)
    per_observation: bool = eqx.field(static=True)
    num_labels: int = eqx.field(static=True)

    def __init__(
        self,
        values: ArrayLike,
        *,
        names: Sequence[str] | None = None,
        acts_on: Sequence[ArrayLike] | None = None,
        shared: Sequence[ArrayLike] | None = None,
        per_observation: bool = False,
    ):
        values = jnp.asarray(values)
        per_observation = bool(per_observation)
        shape = (
            "(trajectories, observations, covariates)"
            if per_observation
            else ("(trajectories, covariates)")
        )
        if values.ndim < 2 + per_observation or not jnp.issubdtype(values.dtype, jnp.number):
            raise ValueError(
                f"values: expected numbers of shape {shape}, got {values.dtype} {values.shape}."
            )
        self.per_observation = per_observation
        if not jnp.issubdtype(values.dtype, jnp.floating):
            values = values.astype(float)
        C = values.shape[-1]
        if C < 1:
            raise ValueError("values: need at least one covariate column.")
        if names is None:
            names = tuple(f"z{c}" for c in range(C))
        names = tuple(str(n) for n in names)
        if len(names) != C:
            raise ValueError(f"names: need one per covariate column ({C}), got {len(names)}.")
        if len(set(names)) != C:
            raise ValueError(f"names: must be distinct, got {list(names)}.")
        if is_concrete(values):
            array = np.asarray(values).reshape(-1, C)
            if not np.all(np.isfinite(array)):
                raise ValueError("values: must be finite (no missing values).")
            huge = [(n, np.abs(c).max()) for n, c in zip(names, array.T)]
            huge = [(n, m) for n, m in huge if m > MAX_COVARIATE]
            if huge:
                raise ValueError(
                    f"values: covariate {huge[0][0]!r} reaches {huge[0][1]:.3g}, beyond "
                    f"{MAX_COVARIATE:g} (its centred spread would overflow the likelihood's "
                    "exponent arithmetic); state it in larger units."
                )
            constant = [n for n, col in zip(names, array.T) if np.ptp(col) == 0]
            if constant:
                over = "observations" if per_observation else "trajectories"
                raise ValueError(
                    f"values: covariate {constant[0]!r} is constant over the {over}, so its "
                    "effect is not identified; leave it out."
                )
        self.values = values
        self.names = names
        if acts_on is None:
            self.acts_on = None
        else:
            masks = tuple(jnp.asarray(a, bool) for a in acts_on)
            for n, m in enumerate(masks):
                if m.ndim != 4 or m.shape[0] != C or m.shape[-1] != m.shape[-2]:
                    raise ValueError(
                        f"acts_on[{n}]: expected booleans (covariates={C}, configs, k, k), got "
                        f"shape {m.shape}."
                    )
            self.acts_on = masks
        if shared is None:
            self.shared, self.num_labels = None, 0
        else:
            labels = tuple(np.asarray(a) for a in shared)
            for n, a in enumerate(labels):
                if a.ndim != 4 or a.shape[0] != C or not np.issubdtype(a.dtype, np.integer):
                    raise ValueError(
                        f"shared[{n}]: expected integer labels (covariates={C}, configs, k, k), "
                        f"got {a.dtype} {a.shape}."
                    )
                if np.any(a < -1):
                    raise ValueError(f"shared[{n}]: labels are -1 (not shared) or >= 0.")
            self.shared = tuple(jnp.asarray(a, jnp.int32) for a in labels)
            self.num_labels = int(max((int(a.max(initial=-1)) for a in labels), default=-1)) + 1

    @classmethod
    def from_dataframe(
        cls,
        df: pd.DataFrame,
        columns: Sequence[str],
        observations: PanelObservations | PanelBuckets,
        ids: Sequence[Any],
    ) -> tuple[Covariates, dict]:
        """The covariates of the data columns `columns` of the long-format `df`
        that [`PanelObservations.from_dataframe`][jaxctbn.panel.PanelObservations.from_dataframe] read as `(observations, ids)` (the columns
        are not nodes: drop them from the frame given to it).

        - A column constant within every trajectory is a baseline covariate, one row per
          trajectory in the order of `ids`. When some column changes within a trajectory, every
          column is per observation (`per_observation=True`): the value recorded with each
          observation, holding until the next (rows at one time must agree; the values of rows
          that observe no node, which the reader drops, are not used).
        - A column whose values are not all numbers is categorical: one 0/1 column `COL=level`
          per level but the first in sorted order (the reference).

        The covariates act on every free rate (`acts_on=None`; rebuild them with an `acts_on` to
        choose). **Returns** `(covariates, summary)`, the summary a dict with `names` (of the
        covariate columns), `columns`, `reference_levels` `{COL: level}` and `time_varying` (the
        columns that change within a trajectory). Bad input (an unknown column, missing values,
        two values at one visit, a single level) raises a `ValueError` naming the column."""
        import pandas as pd

        names = list(columns)
        if not names:
            raise ValueError("columns: give at least one covariate column.")
        for name in names:
            if name in ("trajectory_id", "time", "intervention"):
                raise ValueError(f"columns: {name!r} is a reserved column.")
            if name not in df.columns:
                raise ValueError(f"columns: no column {name!r} in the data.")
        grouped = df.groupby("trajectory_id", sort=False)
        for name in names:
            missing = df[name].isna().to_numpy()
            if missing.any():
                tid = df["trajectory_id"].to_numpy()[missing][0]
                raise ValueError(
                    f"columns: column {name!r} has missing values (trajectory {tid!r})."
                )
        varying = [name for name in names if (grouped[name].nunique() > 1).any()]
        if varying:  # every column per observation, aligned with the observations' slots
            flat = observations.padded() if isinstance(observations, PanelBuckets) else observations
            times = np.asarray(flat.times, float)
            counts = np.asarray(flat.num_observations)
            R, slots = times.shape
            real = np.arange(slots)[None, :] < counts[:, None]
            keys = pd.MultiIndex.from_arrays(
                [np.repeat(np.asarray(ids, dtype=object), counts), times[real]]
            )
            at_visits = df.groupby(["trajectory_id", "time"], sort=False)
            raw = []
            for name in names:
                conflict = at_visits[name].nunique() > 1
                if conflict.any():
                    tid, t = conflict.index[int(np.argmax(conflict.to_numpy()))]
                    raise ValueError(
                        f"columns: column {name!r} has two values at time {t:g} of trajectory {tid!r}."
                    )
                column = np.empty((R, slots), dtype=object)
                column[real] = at_visits[name].first().reindex(keys).to_numpy()
                last = column[np.arange(R), counts - 1]
                column[~real] = np.broadcast_to(last[:, None], (R, slots))[~real]
                raw.append(column)
        else:
            raw = [
                grouped[name].first().reindex(pd.Index(list(ids))).to_numpy(dtype=object)
                for name in names
            ]
        values, labels, reference = [], [], {}
        for name, column in zip(names, raw):
            numeric = np.asarray(pd.to_numeric(pd.Series(column.ravel()), errors="coerce"), float)
            if not np.isnan(numeric).any():
                if np.ptp(numeric) == 0:
                    raise ValueError(f"columns: column {name!r} has a single value.")
                values.append(numeric.reshape(column.shape))
                labels.append(name)
                continue
            text = np.vectorize(str, otypes=[object])(column)
            levels = sorted(set(text.ravel().tolist()))
            if len(levels) < 2:
                raise ValueError(f"columns: column {name!r} has a single value.")
            reference[name] = levels[0]
            for level in levels[1:]:
                values.append((text == level).astype(float))
                labels.append(f"{name}={level}")
        covariates = cls(np.stack(values, -1), names=labels, per_observation=bool(varying))
        summary = {
            "names": labels,
            "columns": names,
            "reference_levels": reference,
            "time_varying": varying,
        }
        return covariates, summary

    @property
    def num_covariates(self) -> int:
        return self.values.shape[-1]

    def padded_for(self, observations: PanelBuckets) -> Covariates:
        r"""These covariates for `observations`: the buckets they were made for after
        [`with_rounded_shapes`][jaxctbn.panel.PanelBuckets.with_rounded_shapes], which adds
        trajectories after the given ones and widens the observation axes. An added
        trajectory's row repeats the first row; per observation, each row is widened by
        repeating its last value. An added trajectory has one observation, so it starts no
        interval: its values enter no likelihood term and no mean (the means weigh a
        trajectory by its number of intervals), and the fit of the padded data is the fit of
        the given data. Host-side (concrete values); the values are not checked again."""
        values = self.values
        if not is_concrete(values):
            raise ValueError("padded_for: needs concrete covariate values (outside jit).")
        values = np.asarray(values)
        R, given = observations.num_trajectories, values.shape[0]
        if given > R:
            raise ValueError(
                f"observations: {R} trajectories, fewer than the covariates' {given} rows."
            )
        values = np.concatenate([values, np.repeat(values[:1], R - given, 0)])
        if self.per_observation:
            width = max(b.times.shape[-1] for b in observations.buckets)
            if width > values.shape[1]:
                extra = np.repeat(values[:, -1:], width - values.shape[1], 1)
                values = np.concatenate([values, extra], 1)
        return eqx.tree_at(lambda c: c.values, self, jnp.asarray(values))

    def masks(self, free: tuple[Array, ...]) -> tuple[Array, ...]:
        """Per node, `(C, configs, k, k)`: the free rates each covariate acts on."""
        C = self.num_covariates
        if self.acts_on is None:
            return tuple(jnp.broadcast_to(f, (C,) + f.shape) for f in free)
        if len(self.acts_on) != len(free):
            raise ValueError(
                f"acts_on: need one mask per node ({len(free)}), got {len(self.acts_on)}."
            )
        out = []
        for n, (m, f) in enumerate(zip(self.acts_on, free)):
            if m.shape[1:] != f.shape:
                raise ValueError(
                    f"acts_on[{n}]: expected shape {(C,) + f.shape} for this node, got {m.shape}."
                )
            out.append(m & f[None])
        return tuple(out)

    def effect_groups(self, shapes: Sequence[tuple[int, ...]]) -> tuple[tuple[Array, ...], int]:
        """Per node of CIM shape `(configs, k, k)` in `shapes`, the index `(C, configs, k, k)`
        of each entry's effect in one parameter vector, and the vector's length: covariate
        `c`'s label `l` is parameter `c * num_labels + l`, every unlabelled entry has its
        own parameter after those."""
        C, L = self.num_covariates, self.num_labels
        offset, out = C * L, []
        for n, shape in enumerate(shapes):
            size = C * math.prod(shape)
            own = offset + jnp.arange(size, dtype=jnp.int32).reshape((C,) + tuple(shape))
            offset += size
            if self.shared is None:
                out.append(own)
                continue
            labels = self.shared[n]
            if labels.shape[1:] != tuple(shape):
                raise ValueError(
                    f"shared[{n}]: expected shape {(C,) + tuple(shape)} for this node, got "
                    f"{labels.shape}."
                )
            c = jnp.arange(C, dtype=jnp.int32)[:, None, None, None]
            out.append(jnp.where(labels >= 0, c * L + labels, own))
        return tuple(out), offset


def scales_of(
    centred: Array, effects: tuple[Array, ...], masks: tuple[Array, ...]
) -> tuple[Array, ...]:
    r"""Per node, the rate scales `(*rows, configs, k, k)` $\exp(\sum_c\beta_c\tilde z_{rc})$
    of centred covariates `centred` `(*rows, C)` (1 off the masked rates): rows are
    trajectories, or trajectories and observations."""
    return tuple(
        jnp.exp(jnp.tensordot(centred, jnp.where(m, b, 0), axes=([-1], [0])))
        for b, m in zip(effects, masks)
    )


def with_scales(
    intervention: Intervention | None, scales: tuple[Array, ...], num_trajectories: int
) -> Intervention:
    """The per-trajectory intervention of a batch of `num_trajectories` with its rates also
    multiplied by `scales` (per node `(R, configs, k, k)`): a new intervention without clamps
    when there is none, the product with any rate scales it has."""
    R, N = num_trajectories, len(scales)
    out = list(scales)
    if intervention is None:
        intervention = Intervention(
            targets=jnp.zeros((R, N), bool), states=jnp.zeros((R, N), jnp.int32)
        )
    elif intervention.rate_scales is not None:
        for n, s in enumerate(intervention.rate_scales):
            s = jnp.asarray(s, out[n].dtype)
            s = jnp.broadcast_to(s, (R,)) if s.ndim == 0 else s
            tail = s.shape[1:]
            out[n] = out[n] * s.reshape((R,) + (1,) * (3 - len(tail)) + tail)
    return eqx.tree_at(
        lambda i: i.rate_scales, intervention, tuple(out), is_leaf=lambda x: x is None
    )


def centred_values(
    covariates: Covariates, buckets: tuple[PanelObservations, ...], per_bucket: Sequence[Array]
) -> tuple[tuple[Array, ...], Array, Array]:
    r"""`(centred, means, count)`: the covariate values of each flat bucket (`per_bucket`, cut
    as the buckets are: `(R_b, C)`, or `(R_b, O, C)` per observation) minus their means, and
    the number of values averaged. The means are R msm's: over the observations that start an
    interval (every observation but each trajectory's last), so a baseline covariate is
    weighted by its trajectory's number of intervals; per observation, the values of the
    other rows (the last, and padding) are set to 0 after centring."""
    dtype = per_bucket[0].dtype
    if not covariates.per_observation:
        weights = [jnp.maximum(b.num_observations - 1, 0).astype(dtype) for b in buckets]
        count = jnp.sum(jnp.stack([w.sum() for w in weights]))
        totals = jnp.stack([(w[:, None] * v).sum(0) for w, v in zip(weights, per_bucket)])
        means = totals.sum(0) / jnp.maximum(count, 1)
        return tuple(v - means for v in per_bucket), means, count
    values = [v[:, : b.times.shape[-1]] for v, b in zip(per_bucket, buckets)]
    starts = [
        (jnp.arange(b.times.shape[-1]) < b.num_observations[:, None] - 1)[..., None]
        for b in buckets
    ]
    count = jnp.sum(jnp.stack([r.sum((0, 1)) for r in starts]), 0).astype(dtype)
    totals = jnp.stack([jnp.where(r, v, 0).sum((0, 1)) for v, r in zip(values, starts)])
    means = totals.sum(0) / jnp.maximum(count, 1)
    return tuple(jnp.where(r, v - means, 0) for v, r in zip(values, starts)), means, count
