r"""Panels whose intervals share their lengths: the intervals grouped by gap, and the pooled
statistics and log-likelihoods with one dense exponential per distinct gap (the fit's and the
structural EM's route for the dense solver)."""

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
from .._model.interventions import is_concrete
from .buckets import PanelBuckets, as_flat_buckets
from .checks import checked_inputs
from .expected_statistics import PanelExpectedStatistics
from .filtering import filtered_log_likelihood, forward_filter
from .observations import PanelObservations
from .smoothing import backward_messages, exact_entry_transitions


class GapGroups(eqx.Module):
    """The intervals of the flat batches of `as_flat_buckets(observations)` grouped by their
    length: interval `i` of trajectory `r` of bucket `b` (between observations `i` and `i + 1`)
    has length `gaps[index[b][r, i]]` (padding intervals point anywhere; they carry no
    weight)."""

    index: tuple[Int[np.ndarray | Array, "trajectories intervals"], ...]
    gaps: Float[np.ndarray | Array, " groups"]
    exact_entries: bool = eqx.field(static=True, default=True)  # any exact entry time?


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
    # points at the copies) so that data sets of one design share a compiled program: classes
    # twice as wide as the trajectories' (`rounded_size`), because the distinct gaps follow the
    # visit times and vary more between such data sets than their sizes do (msm's cav panel,
    # 1,5xx distinct gaps, and the same subjects resampled with their times scaled, 1,6xx)
    gaps = values[keep]
    gaps = np.concatenate(
        [gaps, np.repeat(gaps[-1:], (1 << (gaps.size - 1).bit_length()) - gaps.size)]
    )
    return GapGroups(
        index=tuple(i.astype(np.int32) for i in index),
        gaps=gaps.astype(dtype),
        exact_entries=exact_entries,
    )


@eqx.filter_jit
def pooled_by_gaps(model, observations, emissions, initial_distribution, groups, what):
    r"""Pooled statistics (or only the log-likelihoods) of panels without interventions, with
    every dense exponential shared by the intervals of equal length: $e^{hW}$ once per
    distinct gap $h$ for the filter and the backward pass, and, because the interval integral
    $\int_0^h e^{tW^\top}Be^{(h-t)W^\top}dt$ is linear in $B=\hat\alpha b^\top/Z$, one Van
    Loan exponential per distinct gap for the summed $B$ of its intervals, over every bucket.
    `observations`: a `PanelObservations` or `PanelBuckets`; `initial_distribution`: `None`,
    `(S,)`, or one `(R_b, S)` per bucket of `as_flat_buckets(observations)` (a tuple).
    Returns `(bad, log-likelihoods (R,))` or `(bad, PanelExpectedStatistics without batch
    axis)`, `bad` one `(R_b, O_b)` array per bucket and the log-likelihoods in bucket order."""
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
    P = solver.transition_matrices(gen, gaps)
    bads, likelihoods = [], []
    summed = jnp.zeros((gaps.shape[0], S, S), W.dtype)
    jumps = jnp.zeros((len(gen.shifts), S), W.dtype)
    for bucket, p0, index in zip(buckets, initial_distribution, groups.index):
        _, bucket, matrices, p0 = checked_inputs(model, bucket, emissions, p0)

        def one(obs, p, index):
            _, filtered = forward_filter(
                model, obs, matrices, p, solver, (P, index), groups.exact_entries
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
        bad, out = jax.vmap(one)(bucket, p0, index)
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
