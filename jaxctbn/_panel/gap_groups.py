r"""Panels whose intervals share their lengths: the intervals grouped by gap, and the pooled
statistics and log-likelihoods with one dense exponential per distinct gap (the fit's and the
structural EM's route for the dense solver); with baseline covariates that take few distinct
values (categorical ones), one table of exponentials per covariate class."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._master_equation import (
    MatrixExponential,
    amalgamate,
    check_state_space,
    short_sum,
)
from .._model.ctbn import with_diagonal
from .._model.interventions import is_concrete
from .buckets import PanelBuckets, as_flat_buckets
from .checks import checked_inputs
from .covariates import Covariates
from .expected_statistics import PanelExpectedStatistics
from .filtering import filtered_log_likelihood, forward_filter
from .observations import PanelObservations
from .smoothing import backward_messages, exact_entry_transitions


class GapGroups(eqx.Module):
    """The intervals of the flat batches of `as_flat_buckets(observations)` grouped by their
    length: interval `i` of trajectory `r` of bucket `b` (between observations `i` and `i + 1`)
    has length `gaps[index[b][r, i]]` (padding intervals point anywhere; they carry no
    weight). With covariate classes (`covariate_classes`), trajectory `r` of bucket `b` has the
    baseline covariates `class_values[classes[b][r]]`."""

    index: tuple[Int[np.ndarray | Array, "trajectories intervals"], ...]
    gaps: Float[np.ndarray | Array, " groups"]
    exact_entries: bool = eqx.field(static=True, default=True)  # any exact entry time?
    classes: tuple[Int[np.ndarray | Array, " trajectories"], ...] | None = None
    class_values: Float[np.ndarray | Array, "classes covariates"] | None = None


def gap_groups(observations: PanelObservations | PanelBuckets) -> GapGroups | None:
    """The distinct positive gaps of concrete observations (host-side), over every bucket (the
    batch axes of a `PanelObservations` flattened into one), `index[b]` `(R_b, O_b - 1)`;
    `None` for traced arrays (inside `jit` the grouping cannot be computed)."""
    buckets = as_flat_buckets(observations)
    if not all(is_concrete(b.times, b.num_observations, b.exact_entry) for b in buckets):
        return None
    per_bucket = []
    for b in buckets:
        times = np.asarray(b.times, float)
        counts = np.asarray(b.num_observations)
        ok = np.arange(1, times.shape[-1]) < counts[:, None]
        per_bucket.append(np.where(ok, np.diff(times, axis=-1), np.nan))
    values, inverse = np.unique(
        np.concatenate([g.reshape(-1) for g in per_bucket]), return_inverse=True
    )
    keep = np.isfinite(values) & (values > 0)
    if not keep.any():
        return None
    # padding (nan) maps to group 0, masked by the filter's validity anyway
    remap = np.where(keep, np.cumsum(keep) - 1, 0)
    index, start = [], 0
    for g in per_bucket:
        index.append(remap[inverse.reshape(-1)[start : start + g.size]].reshape(g.shape))
        start += g.size
    dtype = (
        buckets[0].times.dtype if jnp.issubdtype(buckets[0].times.dtype, jnp.floating) else float
    )
    # numpy arrays: converted when passed to the compiled fit (no eager dispatch here)
    exact_entries = any(bool(np.any(np.asarray(b.exact_entry))) for b in buckets)
    # the number of groups rounded up to a power of two (the last gap repeated, no interval
    # points at the copies) so that data sets of one design share a compiled program. Where
    # the visit times are irregular (most intervals of a length of their own), the count
    # follows the number of intervals, which varies between such data sets across a power of
    # two (msm's cav panel, ~2,000 distinct gaps in 2,224 intervals, and the same subjects
    # resampled with their times scaled, 1,9xx to 2,0xx): there the table of buckets is at
    # least a quarter of the interval slots' power of two (`_table_size`), whose classes are
    # the buckets' shapes. Observations not in buckets keep the power of two of their gaps:
    # their shapes are the data's own, so no other data set shares their programs, and a
    # quarter of their slots (every subject padded to the most visits) is up to twice the
    # table, each row a Van Loan exponential per E-step (cav's SQUAREM fit: 0.42 s against
    # 0.19 s with 2,048 rows)
    gaps = values[keep]
    intervals = sum(int(np.isfinite(g).sum()) for g in per_bucket)
    slots = sum(i.size for i in index) if isinstance(observations, PanelBuckets) else 0
    size = _table_size(gaps.size, intervals, slots)
    gaps = np.concatenate([gaps, np.repeat(gaps[-1:], size - gaps.size)])
    return GapGroups(
        index=tuple(i.astype(np.int32) for i in index),
        gaps=gaps.astype(dtype),
        exact_entries=exact_entries,
    )


#: the most covariate classes that get a gap table each (`covariate_classes`)
MAX_COVARIATE_CLASSES = 64
#: and the most exponentials of their tables per interval slot of the data
_TABLE_ENTRIES_PER_SLOT = 4


def covariate_classes(
    groups: GapGroups | None,
    covariates: Covariates,
    observations: PanelObservations | PanelBuckets,
) -> GapGroups | None:
    r"""`groups` with the trajectories grouped by their baseline covariates (host-side): the
    distinct rows of `covariates.values` are the classes, and the trajectories of a class share
    one generator, so that the intervals of one class and one length share an exponential (a
    categorical covariate: one gap table per level). `None` (each interval solved on its own,
    as every trajectory had a generator of its own) without `groups`, for time-varying or
    traced covariates, and when the tables would hold more exponentials than the data has
    interval slots (the padded `(R_b, O_b - 1)` of every bucket: a count that data sets of one
    design share, as they share the tables' size), times `_TABLE_ENTRIES_PER_SLOT`, or with
    more than `MAX_COVARIATE_CLASSES` classes (a continuous covariate)."""
    if groups is None or covariates.per_observation or not is_concrete(covariates.values):
        return None
    values = np.asarray(covariates.values)
    rows, inverse = np.unique(values.reshape(-1, values.shape[-1]), axis=0, return_inverse=True)
    slots = sum(i.size for i in groups.index)
    entries = rows.shape[0] * groups.gaps.shape[0]
    if rows.shape[0] > MAX_COVARIATE_CLASSES or entries > _TABLE_ENTRIES_PER_SLOT * slots:
        return None
    inverse = inverse.reshape(-1).astype(np.int32)
    if isinstance(observations, PanelBuckets):
        classes = tuple(inverse[np.asarray(r)] for r in observations.bucket_rows())
    else:
        classes = (inverse,)
    return eqx.tree_at(
        lambda g: (g.classes, g.class_values),
        groups,
        (classes, rows.astype(values.dtype)),
        is_leaf=lambda x: x is None,
    )


def _power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _table_size(distinct: int, intervals: int, slots: int) -> int:
    """The rows of a gap table of `distinct` gaps of `intervals` intervals in `slots` interval
    slots (the padded `(R_b, O_b - 1)` of every bucket): `distinct` rounded up to a power of
    two, and, when more than a quarter of the intervals have lengths of their own (irregular
    visit times), at least a quarter of the slots' power of two."""
    if 4 * distinct > intervals:
        return _power_of_two(max(distinct, _power_of_two(slots) // 4))
    return _power_of_two(distinct)


@eqx.filter_jit
def pooled_by_gaps(
    model, observations, emissions, initial_distribution, groups, what, class_scales=None
):
    r"""Pooled statistics (or only the log-likelihoods) of panels without interventions, with
    every dense exponential shared by the intervals of equal length: $e^{hW}$ once per
    distinct gap $h$ for the filter and the backward pass, and, because the interval integral
    $\int_0^h e^{tW^\top}Be^{(h-t)W^\top}dt$ is linear in $B=\hat\alpha b^\top/Z$, one Van
    Loan exponential per distinct gap for the summed $B$ of its intervals, over every bucket.
    `observations`: a `PanelObservations` or `PanelBuckets`; `initial_distribution`: `None`,
    `(S,)`, or one `(R_b, S)` per bucket of `as_flat_buckets(observations)` (a tuple).
    Returns `(bad, log-likelihoods (R,))` or `(bad, PanelExpectedStatistics without batch
    axis)`, `bad` one `(R_b, O_b)` array per bucket and the log-likelihoods in bucket order.

    `class_scales` (log-likelihoods only; `groups` with `classes`): per node `(K, configs, k,
    k)`, the rate scales of each covariate class: class $c$'s trajectories run on the
    generator of the rates times its scales, with a gap table of its own."""
    solver = MatrixExponential()
    check_state_space(solver, model.cardinalities)
    buckets = as_flat_buckets(observations)
    if not isinstance(initial_distribution, tuple):
        initial_distribution = (initial_distribution,) * len(buckets)
    model = model.checked()
    gen = amalgamate(model)
    W = gen.dense()
    S = W.shape[0]
    gaps = groups.gaps.astype(W.dtype)
    classes = (None,) * len(buckets)
    if class_scales is None:
        P = solver.transition_matrices(gen, gaps)
    else:
        if what != "likelihood" or groups.classes is None:
            raise ValueError("class_scales: for log-likelihoods of groups with classes only.")
        classes = groups.classes
        # per class (a leading axis): the scaled rates, the dense generator and its gap table
        class_cims = tuple(with_diagonal(c * s) for c, s in zip(model.cims, class_scales))
        dense = jax.vmap(
            lambda cims: amalgamate(eqx.tree_at(lambda m: m.cims, model, cims)).dense()
        )(class_cims)
        tables = solver.transition_matrices(dense, gaps)
        P = tables.reshape(-1, *tables.shape[-2:])
    bads, likelihoods = [], []
    summed = jnp.zeros((gaps.shape[0], S, S), W.dtype)
    jumps = jnp.zeros((len(gen.shifts), S), W.dtype)
    for bucket, p0, index, cls in zip(buckets, initial_distribution, groups.index, classes):
        _, bucket, matrices, p0 = checked_inputs(model, bucket, emissions, p0)

        def one(obs, p, index, cls):
            own = model
            if cls is not None:  # the trajectory's class: its model, its table's rows
                own = eqx.tree_at(lambda m: m.cims, model, tuple(c[cls] for c in class_cims))
                index = cls * gaps.shape[0] + index
            _, filtered = forward_filter(
                own, obs, matrices, p, solver, (P, index), groups.exact_entries
            )
            bad, log_likelihood = filtered_log_likelihood(filtered, p)
            if what == "likelihood":
                return bad, log_likelihood
            betas, ends = backward_messages(
                gen, obs, matrices, filtered, solver, (P, index), groups.exact_entries
            )
            a, b = filtered.alphas[:-1], ends[:-1]
            ok = filtered.valid[1:]
            Z = short_sum(a * betas[:-1])  # a_i P_i b_i, with P_i b_i = beta_i
            weight = jnp.where(ok, 1 / jnp.where(ok & (Z > 0), Z, 1), 0)
            outer = weight[:, None, None] * a[:, :, None] * b[:, None, :]
            if groups.exact_entries:
                entry = exact_entry_transitions(gen, obs, filtered, betas)
            else:
                entry = jnp.zeros((len(gen.shifts), S), W.dtype)
            return bad, (outer, entry, log_likelihood)

        index = jnp.asarray(index)
        cls = None if cls is None else jnp.asarray(cls)
        bad, out = jax.vmap(one)(bucket, p0, index, cls)
        bads.append(bad)
        if what == "likelihood":
            likelihoods.append(out)
            continue
        outer, entry, log_likelihood = out
        likelihoods.append(log_likelihood)
        summed = summed + jax.ops.segment_sum(
            outer.reshape(-1, S, S), index.reshape(-1), num_segments=gaps.shape[0]
        )
        jumps = jumps + entry.sum(0)
    log_likelihood = jnp.concatenate(likelihoods)
    if what == "likelihood":
        return tuple(bads), log_likelihood
    dwell, flux = solver.forward_backward_by_gaps(gen, gaps, summed)
    rates = jnp.stack([gen.shift_rates(r) for r in range(len(gen.shifts))])
    statistics = PanelExpectedStatistics(
        dwell_times=dwell,
        transitions=rates * flux + jumps,
        log_likelihood=log_likelihood.sum(),
        model=model,
    )
    return tuple(bads), statistics
