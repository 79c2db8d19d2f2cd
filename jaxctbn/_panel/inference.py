r"""Panel observations of a cCTBN: exact forward filtering and backward smoothing.

A **panel** trajectory is seen only at observation times $t_0<t_1<\dots<t_{m-1}$: at each, every
node is observed (possibly through a misclassification matrix $p(y\mid x)$) or missing, and the
process is hidden in between. Some observations may be **exact entry times** (msm's
`deathexact`): at $t_i$ the process *enters* the observed configuration by a jump, from a state
that is unknown and differs from it.

On the amalgamated generator $W$ of the (intervened) model, with $e_i(s)=\prod_n p(y_{i,n}\mid
s_n)$ the evidence of observation $i$ (a factor 1 for a missing node) and, for an exact entry into
the set $O_i$ of states consistent with $y_i$, the jump matrix
$J_i(s',s)=W(s',s)\,1[s'\notin O_i]\,1[s\in O_i]$, the **scaled forward filter** is

$$\tilde\alpha_i=\hat\alpha_{i-1}e^{(t_i-t_{i-1})W},\qquad
a_i=\begin{cases}\tilde\alpha_i\odot e_i\\ \tilde\alpha_iJ_i&\text{(exact entry)}\end{cases},
\qquad c_i=\textstyle\sum_sa_i(s),\qquad\hat\alpha_i=a_i/c_i,$$

so $\hat\alpha_i(s)=p(S(t_i)=s\mid y_{0..i})$ and $c_i=p(y_i\mid y_{0..i-1})$ (a density in time
for an exact entry), hence $\log p(y_{1..m-1}\mid y_0)=\sum_{i\ge1}\log c_i$ with no product of
small numbers ever formed. The **scaled backward** messages are $\hat\beta_{m-1}=\mathbf 1$,

$$b_i=\frac1{c_i}\begin{cases}e_i\odot\hat\beta_i\\ J_i\hat\beta_i&\text{(exact entry)}\end{cases},
\qquad\hat\beta_{i-1}=e^{(t_i-t_{i-1})W}b_i,$$

so that $\sum_s\hat\alpha_i(s)\hat\beta_i(s)=1$ and $p(S(t)=s\mid Y)\propto
(\hat\alpha_{i-1}e^{(t-t_{i-1})W})(s)\,(e^{(t_i-t)W}b_i)(s)$ for $t\in[t_{i-1},t_i)$. Over the
interval $(t_{i-1},t_i)$, with $\alpha_t=\hat\alpha_{i-1}e^{(t-t_{i-1})W}$ and
$\beta_t=e^{(t_i-t)W}b_i$ and $Z_i=\alpha_t\beta_t$ (constant in $t$; 1 in exact arithmetic),

$$\mathsf E[T(s)\mid Y]=\sum_i\frac1{Z_i}\int\alpha_t(s)\beta_t(s)\,dt,\qquad
\mathsf E[M(s,s')\mid Y]=\sum_i\frac{W(s,s')}{Z_i}\int\alpha_t(s)\beta_t(s')\,dt
+\sum_{i\,\text{exact}}\frac{\tilde\alpha_i(s)J_i(s,s')\hat\beta_i(s')}{\tilde\alpha_iJ_i\hat\beta_i},$$

the last term being the one jump that an exact entry time records. The interval integrals are
the solver's [`jaxctbn.AbstractMasterEquationSolver.forward_backward`][].
"""

from __future__ import annotations

import math
from typing import NamedTuple, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from .._master_equation.dense_linalg import matrix_vector, short_sum, vector_matrix
from .._master_equation.generator import AbstractGenerator, amalgamate, shift_indices
from .._master_equation.master_equation import (
    AbstractExpectedStatistics,
    checked_initial_distribution,
    projection_bins,
)
from .._master_equation.solvers import (
    DEFAULT_SOLVER,
    AbstractMasterEquationSolver,
    check_state_space,
    pull_shifts,
    push,
)
from .._model.ctbn import AbstractCTBN, with_diagonal
from .._model.interventions import is_concrete
from .._model.layout import max_configs, state_bins_on_sets
from .buckets import PanelBuckets, as_flat_buckets, rounded_size
from .observations import Emissions, PanelObservations, _label


# --------------------------------------------------------------------------- results
class PanelExpectedStatistics(AbstractExpectedStatistics):
    r"""Smoothed expected path statistics of panel trajectories between their first and last
    observation times, conditional on the observations (one trajectory, or a batch with leading
    axes on the arrays; [`jaxctbn.panel.PanelExpectedStatistics.sum`][] pools a batch).

    - `dwell_times`: $\mathsf E[T(s)\mid Y]$, shape `(*batch, S)`; sums to $t_{m-1}-t_0$.
    - `transitions`: $\mathsf E[M(s\to s_r')\mid Y]$ per shift $r=(n,j)$ of the generator
      (node $n$ moved forward by $j$ mod $k_n$), shape `(*batch, J, S)`. Under smoothing these are
      **not** rate times dwell time, so they are stored.
    - `log_likelihood`: the log-likelihood of each trajectory, `(*batch,)` (as
      [`jaxctbn.panel.panel_log_likelihood`][] with the same arguments).
    - `model`: the model (not intervened; its graph gives the default parent sets).

    Node statistics project onto **any** parent set like [`jaxctbn.ExpectedStatistics`][]'s, and
    keep the leading batch axes.
    """

    dwell_times: Float[Array, "*batch global_states"]
    transitions: Float[Array, "*batch shifts global_states"]
    log_likelihood: Float[Array, "*batch"]
    model: AbstractCTBN

    def sum(self, where: Bool[Array, " batch"] | None = None) -> "PanelExpectedStatistics":
        """Sum over the leading trajectory axis (optionally only where `where` is `True`, e.g.
        the trajectories in which a node was not intervened on)."""
        if self.log_likelihood.ndim < 1:
            raise ValueError("sum: these statistics have no batch axis.")
        if where is None:
            where = jnp.ones(self.log_likelihood.shape[:1], bool)
        w = jnp.asarray(where).astype(self.dwell_times.dtype)
        return PanelExpectedStatistics(
            dwell_times=jnp.einsum("r,r...->...", w, self.dwell_times),
            transitions=jnp.einsum("r,r...->...", w, self.transitions),
            log_likelihood=jnp.einsum("r,r...->...", w, self.log_likelihood),
            model=self.model,
        )

    def _shifts(self) -> tuple[tuple[int, int], ...]:
        return tuple((n, j) for n, k in enumerate(self.model.cardinalities) for j in range(1, k))

    def node_dwell_times(self, node: int | str, parents=None) -> Float[Array, "*batch configs k"]:
        r"""$\mathsf E[\hat T_n(x,u)\mid Y]$ for parent set `parents` (default: the model's)."""
        node = self.model.node_index(node)
        k = self.model.cardinalities[node]
        states, c, configs = projection_bins(self.model, node, parents)
        one_hot = _one_hot(c * k + states[:, node], configs * k, self.dwell_times.dtype)
        out = self.dwell_times @ one_hot
        return out.reshape(*out.shape[:-1], configs, k)

    def node_transitions(self, node: int | str, parents=None) -> Float[Array, "*batch configs k k"]:
        r"""$\mathsf E[\hat M_n(x,x',u)\mid Y]$ for parent set `parents` (default: the
        model's); zero diagonal."""
        node = self.model.node_index(node)
        k = self.model.cardinalities[node]
        states, c, configs = projection_bins(self.model, node, parents)
        x = states[:, node]
        dtype = self.transitions.dtype
        out = jnp.zeros(self.transitions.shape[:-2] + (configs * k * k,), dtype)
        for r, (n, j) in enumerate(self._shifts()):
            if n == node:
                bins = (c * k + x) * k + (x + j) % k
                out = out + self.transitions[..., r, :] @ _one_hot(bins, configs * k * k, dtype)
        return out.reshape(*out.shape[:-1], configs, k, k)

    def node_statistics_on_sets(
        self, node: int, parent_sets: Int[Array, "sets max_parents"]
    ) -> tuple[Float[Array, "*batch sets configs k k"], Float[Array, "*batch sets configs k"]]:
        """`(node_transitions, node_dwell_times)` of `node` projected onto every padded parent
        set in `parent_sets` at once (`configs` = the most configurations any set of that
        padding can have)."""
        cards = self.model.cardinalities
        k = cards[node]
        configs = max_configs(node, cards, parent_sets.shape[-1])
        G = state_bins_on_sets(node, parent_sets, cards, self.dwell_times.dtype)
        shifts = [r for r, (n, _) in enumerate(self._shifts()) if n == node]
        jumps = [self._shifts()[r][1] for r in shifts]
        V = jnp.stack(
            [self.dwell_times] + [self.transitions[..., r, :] for r in shifts], axis=-1
        )  # (*batch, S, 1 + shifts)
        out = jnp.einsum("psb,...sj->...pbj", G, V)
        out = out.reshape(*out.shape[:-2], configs, k, 1 + len(shifts))
        x = jnp.arange(k)
        M = jnp.zeros(out.shape[:-1] + (k,), out.dtype)
        for i, j in enumerate(jumps):
            M = M.at[..., x, (x + j) % k].add(out[..., 1 + i])
        return M, out[..., 0]


def _one_hot(bins: Array, size: int, dtype) -> Array:
    return (bins[:, None] == jnp.arange(size)).astype(dtype)


# --------------------------------------------------------------------------- evidence and jumps
def _evidence(
    cardinalities: tuple[int, ...], y: Int[Array, " nodes"], matrices: tuple[Array, ...]
) -> Float[Array, " global_states"]:
    r"""$e(s)=\prod_n E_n(s_n,y_n)$ over the global states (factor 1 for missing nodes)."""
    N = len(cardinalities)
    e = jnp.ones(cardinalities, matrices[0].dtype)
    for n, k in enumerate(cardinalities):
        column = jnp.take(matrices[n], jnp.maximum(y[n], 0), axis=1)
        column = jnp.where(y[n] >= 0, column, jnp.ones_like(column))
        shape = [1] * N
        shape[n] = k
        e = e * column.reshape(shape)
    return e.reshape(-1)


def _entry_forward(generator: AbstractGenerator, a: Array, inside: Array) -> Array:
    r"""$aJ$: $(aJ)(s)=1[s\in O]\sum_{s'\notin O}a(s')W(s',s)$ (one jump into $O$)."""
    cards = generator.cardinalities
    source = (a * (1 - inside)).reshape(cards)
    out = jnp.zeros(cards, a.dtype)
    for r, (n, j) in enumerate(generator.shifts):
        out = out + push(generator.shift_rate_tensor(r) * source, n, j, cards[n])
    return out.reshape(-1) * inside


def _entry_jumps(generator: AbstractGenerator, a: Array, b: Array, inside: Array) -> Array:
    r"""Per shift $r$, $a(s)\,1[s\notin O]\,R_r(s)\,1[s_r'\in O]\,b(s_r')$, shape `(J, S)`."""
    rates = jnp.stack([generator.shift_rates(r) for r in range(len(generator.shifts))])
    return (a * (1 - inside))[None] * rates * pull_shifts(generator, inside * b)


def _entry_backward(generator: AbstractGenerator, b: Array, inside: Array) -> Array:
    r"""$Jb$: $(Jb)(s')=1[s'\notin O]\sum_{s\in O}W(s',s)b(s)$."""
    return short_sum(_entry_jumps(generator, jnp.ones_like(b), b, inside), 0)


# --------------------------------------------------------------------------- one trajectory
class _Smoothed(NamedTuple):
    times: Array  # (O,) padding replaced by the last real time
    valid: Array  # (O,)
    alphas: Array  # (O, S) filtered, after observation i
    predicted: Array  # (O, S) alpha_{i-1} e^{dt W} before observation i (row 0: the prior)
    norms: Array  # (O,) c_i (1 for padding)
    log_norms: Array  # (O,) log c_i (0 for padding)
    inside: Array  # (O, S) indicator of the states consistent with observation i


def _filter(
    model: AbstractCTBN,
    observations: PanelObservations,
    matrices: tuple[Array, ...],
    p0: Array | None,
    solver: AbstractMasterEquationSolver,
    propagators: tuple[Array, Array] | None = None,
    exact_entries: bool = True,
    interval_scales: tuple[Array, ...] | None = None,
) -> tuple[AbstractGenerator, _Smoothed]:
    """The scaled forward filter of one trajectory (see the module docstring). With
    `propagators = (table, index)`, interval $i$'s $e^{(t_i-t_{i-1})W}$ is read as
    `table[index[i]]` (`table` `(G, S, S)`, `index` `(O - 1,)`) instead of being solved.
    `exact_entries=False` (static: no observation of the batch records an exact entry time)
    leaves out the entry terms. `interval_scales`: per node `(O, configs, k, k)`, the rate
    scales from each observation to the next (time-varying covariates): the interval ending
    at observation $i$ runs on the generator with the rates times `interval_scales[n][i - 1]`
    (the returned generator is then that of no scales)."""
    model, intervention = _under_intervention(model, observations)
    gen = amalgamate(model)
    cards = model.cardinalities
    dtype = matrices[0].dtype
    S = model.num_global_states
    times, valid = _padded_times(observations, dtype)
    exact = observations.exact_entry & valid
    y = jnp.where(valid[:, None], observations.states, -1)
    identity = tuple(jnp.eye(k, dtype=dtype) for k in cards)
    inside = jax.vmap(lambda v: _evidence(cards, v, identity))(y)
    evidence = jax.vmap(lambda v: _evidence(cards, v, matrices))(y)

    if p0 is None:  # msm's convention: uniform over the states the first observation allows
        p0 = jnp.full((S,), 1.0 / S, dtype)
    prior = checked_initial_distribution(model, p0, intervention)
    a0 = prior * evidence[0]
    c0 = short_sum(a0)
    # an impossible observation (c = 0) is reported by `_check_possible` from the norms; the
    # filter stays finite meanwhile, so that no solver downstream fails first on NaN inputs
    alpha0 = jnp.where(_positive(c0), a0 / jnp.where(_positive(c0), c0, 1), prior)

    table, index = (None, None) if propagators is None else propagators
    if interval_scales is not None and table is not None:
        raise ValueError("interval_scales: not with shared propagators.")
    starts = None if interval_scales is None else tuple(s[:-1] for s in interval_scales)

    def step(alpha, inputs):
        dt, ok, is_exact, e, o, i, scales = inputs
        step_gen = gen
        if scales is not None:
            step_gen = amalgamate(
                eqx.tree_at(
                    lambda m: m.cims,
                    model,
                    tuple(with_diagonal(c * s.astype(dtype)) for c, s in zip(model.cims, scales)),
                )
            )
        if table is None:
            predicted = solver.propagate(step_gen, alpha, _safe(dt, ok))
        else:  # gathered inside the step: fused, never materialised per interval
            predicted = vector_matrix(alpha, table[i])
        a = predicted * e
        if exact_entries:
            a = jnp.where(is_exact, _entry_forward(step_gen, predicted, o), a)
        c = jnp.where(ok, short_sum(a), 1)
        alpha = jnp.where(ok & _positive(c), a / jnp.where(_positive(c), c, 1), alpha)
        return alpha, (alpha, predicted, c)

    inputs = (jnp.diff(times), valid[1:], exact[1:], evidence[1:], inside[1:], index, starts)
    _, (alphas, predicted, norms) = jax.lax.scan(step, alpha0, inputs)
    norms = jnp.concatenate([c0[None], norms])
    return gen, _Smoothed(
        times=times,
        valid=valid,
        alphas=jnp.concatenate([alpha0[None], alphas]),
        predicted=jnp.concatenate([prior[None], predicted]),
        norms=norms,
        log_norms=jnp.where(valid, jnp.log(norms), 0),
        inside=inside,
    )


def _under_intervention(model: AbstractCTBN, observations: PanelObservations):
    """`(model, intervention)`: the model under one trajectory's intervention (checked), or as
    it is when the trajectory has none."""
    intervention = observations.intervention
    if intervention is not None:
        intervention = intervention.checked(model)
        model = intervention.apply(model).checked("cims under the intervention")
    return model, intervention


def _padded_times(observations: PanelObservations, dtype) -> tuple[Array, Array]:
    """`(times, valid)` of one trajectory: the observation times with the padding slots at the
    last observation's time, and which slots are observations."""
    num_slots = observations.times.shape[-1]
    valid = jnp.arange(num_slots) < observations.num_observations
    last = observations.times[observations.num_observations - 1].astype(dtype)
    return jnp.where(valid, observations.times.astype(dtype), last), valid


def _filtered_log_likelihood(filtered: _Smoothed, p0: Array | None) -> tuple[Array, Array]:
    r"""`(bad, log-likelihood)` of one filtered trajectory: the observations whose norm is not
    usable (likelihood 0), and $\sum_i\log c_i$, without $c_0$ under the conditional
    convention (`p0` is `None`)."""
    first = 0 if p0 is not None else filtered.log_norms[0]
    return filtered.valid & ~_positive(filtered.norms), short_sum(filtered.log_norms) - first


def _positive(c: Array) -> Array:
    """Whether a filter norm is usable (positive and finite)."""
    return (c > 0) & jnp.isfinite(c)


def _safe(dt: Array, ok: Array) -> Array:
    """A positive horizon for every solve: padding intervals (discarded) get a short one, which
    costs uniformisation about one product."""
    return jnp.where(ok & (dt > 0), dt, jnp.asarray(1e-3, dt.dtype))


def _backward(
    gen: AbstractGenerator,
    observations: PanelObservations,
    matrices: tuple[Array, ...],
    filtered: _Smoothed,
    solver: AbstractMasterEquationSolver,
    propagators: tuple[Array, Array] | None = None,
    exact_entries: bool = True,
) -> tuple[Array, Array]:
    r"""The scaled backward messages: `betas` $\hat\beta_i$ `(O, S)` and `ends` `(O, S)`, row
    $i$ = $b_{i+1}$, the backward message at the end of the interval after observation $i$
    (ones after the last). `propagators` and `exact_entries` as in `_filter`."""
    cards = gen.cardinalities
    valid = filtered.valid
    exact = observations.exact_entry & valid
    y = jnp.where(valid[:, None], observations.states, -1)
    evidence = jax.vmap(lambda v: _evidence(cards, v, matrices))(y)

    table, index = (None, None) if propagators is None else propagators

    def step(beta, inputs):
        dt, ok, is_exact, e, o, c, i = inputs
        end = e * beta
        if exact_entries:
            end = jnp.where(is_exact, _entry_backward(gen, beta, o), end)
        end = end / jnp.where(_positive(c), c, 1)  # c = 0 is reported, not propagated
        if table is None:
            previous = solver.propagate_backward(gen, end, _safe(dt, ok))
        else:
            previous = matrix_vector(table[i], end)
        beta = jnp.where(ok, previous, beta)
        return beta, (beta, jnp.where(ok, end, 1))

    ones = jnp.ones_like(filtered.alphas[0])
    inputs = (
        jnp.diff(filtered.times),
        valid[1:],
        exact[1:],
        evidence[1:],
        filtered.inside[1:],
        filtered.norms[1:],
        index,
    )
    # reversed scan; the outputs of interval i (between observations i - 1 and i) are
    # (beta_{i-1}, b_i), stacked in the original order
    _, (betas, ends) = jax.lax.scan(step, ones, inputs, reverse=True)
    betas = jnp.concatenate([betas, ones[None]])
    ends = jnp.concatenate([ends, ones[None]])
    return betas, ends


def _statistics(
    gen: AbstractGenerator,
    observations: PanelObservations,
    filtered: _Smoothed,
    betas: Array,
    ends: Array,
    solver: AbstractMasterEquationSolver,
) -> tuple[Array, Array]:
    """Summed smoothed dwell times `(S,)` and per-shift transitions `(J, S)` of one trajectory."""
    ok = filtered.valid[1:]
    dt = jnp.diff(filtered.times)
    h = _safe(dt, ok)
    dwell, flux = jax.vmap(lambda a, b, t: solver.forward_backward(gen, a, b, t))(
        filtered.alphas[:-1], ends[:-1], h
    )
    # Z = alpha_t beta_t (1 in exact arithmetic): normalising by the integral's own total
    # makes the dwell times sum to the interval exactly
    Z = dwell.sum(-1) / h
    weight = jnp.where(ok, 1 / Z, 0)
    rates = jnp.stack([gen.shift_rates(r) for r in range(len(gen.shifts))])
    dwell_times = jnp.einsum("i,is->s", weight, dwell)
    transitions = rates * jnp.einsum("i,irs->rs", weight, flux)
    return dwell_times, transitions + _exact_entry_transitions(gen, observations, filtered, betas)


def _exact_entry_transitions(
    gen: AbstractGenerator, observations: PanelObservations, filtered: _Smoothed, betas: Array
) -> Array:
    """Per shift `(J, S)`: the one jump into the observed configuration that each exact entry
    time records, smoothed over its source state."""
    exact = (observations.exact_entry & filtered.valid)[1:]
    jumps = jax.vmap(lambda a, b, o: _entry_jumps(gen, a, b, o))(
        filtered.predicted[1:], betas[1:], filtered.inside[1:]
    )
    total = short_sum(short_sum(jumps, -1), -1)
    jump_weight = jnp.where(exact, 1 / jnp.where(exact, total, 1), 0)
    return jnp.einsum("i,irs->rs", jump_weight, jumps)


# --------------------------------------------------------------------------- equal gaps pooled
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
    # the number of groups rounded up (1, 2, 3, 4, 6, 8, 12, ...; the last gap repeated, no
    # interval points at the copies) so that data sets of similar size share a compiled program
    gaps = values[keep]
    gaps = np.concatenate([gaps, np.repeat(gaps[-1:], rounded_size(gaps.size) - gaps.size)])
    return GapGroups(
        index=tuple(i.astype(np.int32) for i in index),
        gaps=gaps.astype(dtype),
        exact_entries=exact_entries,
    )


@eqx.filter_jit
def _pooled_by_gaps(model, observations, emissions, initial_distribution, groups, what):
    r"""Pooled statistics (or only the log-likelihoods) of panels without interventions, with
    every dense exponential shared by the intervals of equal length: $e^{hW}$ once per
    distinct gap $h$ for the filter and the backward pass, and, because the interval integral
    $\int_0^h e^{tW^\top}Be^{(h-t)W^\top}dt$ is linear in $B=\hat\alpha b^\top/Z$, one Van
    Loan exponential per distinct gap for the summed $B$ of its intervals, over every bucket.
    `observations`: a `PanelObservations` or `PanelBuckets`; `initial_distribution`: `None`,
    `(S,)`, or one `(R_b, S)` per bucket of `as_flat_buckets(observations)` (a tuple).
    Returns `(bad, log-likelihoods (R,))` or `(bad, PanelExpectedStatistics without batch
    axis)`, `bad` one `(R_b, O_b)` array per bucket and the log-likelihoods in bucket order."""
    from .._master_equation.dense_linalg import expm_batched, gap_transition_matrices
    from .._master_equation.solvers import MatrixExponential

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
    P = MatrixExponential._checked((gap_transition_matrices(W, gaps),))[0]
    bads, likelihoods = [], []
    summed = jnp.zeros((gaps.shape[0], S, S), W.dtype)
    jumps = jnp.zeros((len(gen.shifts), S), W.dtype)
    for bucket, p0, index in zip(buckets, initial_distribution, groups.index):
        _, bucket, matrices, p0 = _setup(model, bucket, emissions, p0)

        def one(obs, p, index):
            _, filtered = _filter(model, obs, matrices, p, solver, (P, index), groups.exact_entries)
            bad, log_likelihood = _filtered_log_likelihood(filtered, p)
            if what == "likelihood":
                return bad, log_likelihood
            betas, ends = _backward(
                gen, obs, matrices, filtered, solver, (P, index), groups.exact_entries
            )
            a, b = filtered.alphas[:-1], ends[:-1]
            ok = filtered.valid[1:]
            Z = short_sum(a * betas[:-1])  # a_i P_i b_i, with P_i b_i = beta_i
            weight = jnp.where(ok, 1 / jnp.where(ok & (Z > 0), Z, 1), 0)
            outer = weight[:, None, None] * a[:, :, None] * b[:, None, :]
            if groups.exact_entries:
                entry = _exact_entry_transitions(gen, obs, filtered, betas)
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
    A = W.T
    zero = jnp.zeros_like(A)

    # the integral is linear in B: scaled to the 1-norm of A, the block's norm (hence the
    # number of squarings) is set by h W, not by the size of the summed messages
    norm_A = jnp.abs(A).sum(0).max()
    norm_B = jnp.abs(summed).sum(-2).max(-1)
    scale = jnp.where((norm_B > 0) & (norm_A > 0), norm_B / jnp.where(norm_A > 0, norm_A, 1), 1)
    blocks = jax.vmap(lambda h, B: h * jnp.block([[A, B], [zero, A]]))(
        gaps, summed / scale[:, None, None]
    )
    upper_right = expm_batched(blocks)[:, :S, S:] * scale[:, None, None]
    C = MatrixExponential._checked((upper_right.sum(0),))[0]
    src, dst = shift_indices(gen.cardinalities)
    rates = jnp.stack([gen.shift_rates(r) for r in range(len(gen.shifts))])
    statistics = PanelExpectedStatistics(
        dwell_times=jnp.diagonal(C),
        transitions=rates * C[src, dst] + jumps,
        log_likelihood=log_likelihood.sum(),
        model=model,
    )
    return tuple(bads), statistics


def _marginals(
    gen: AbstractGenerator,
    filtered: _Smoothed,
    ends: Array,
    num_observations: Array,
    grid: Array,
    solver: AbstractMasterEquationSolver,
) -> Array:
    """Smoothed marginals `(G, S)` of one trajectory at the times `grid` `(G,)`."""
    times = filtered.times
    num_slots = times.shape[0]
    last = num_observations - 1

    def one(t):
        j = jnp.minimum(jnp.searchsorted(times, t, side="right") - 1, last)
        j = jnp.maximum(j, 0)
        forward_h = t - times[j]
        forward = solver.propagate(gen, filtered.alphas[j], _safe(forward_h, forward_h > 0))
        forward = jnp.where(forward_h > 0, forward, filtered.alphas[j])
        has_next = j < last
        nxt = jnp.minimum(j + 1, num_slots - 1)
        backward_h = times[nxt] - t
        backward = solver.propagate_backward(gen, ends[j], _safe(backward_h, has_next))
        backward = jnp.where(has_next, backward, jnp.ones_like(backward))
        p = forward * backward
        return p / p.sum()

    return jax.vmap(one)(grid)


# --------------------------------------------------------------------------- entry points
def _setup(model, observations, emissions, initial_distribution):
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


def _vmapped(fn, ndim: int):
    for _ in range(ndim):
        fn = jax.vmap(fn)
    return fn


def _check_possible(
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
    return eqx.branched_error_if(outputs, flat.any(), index, messages)


def _check_possible_in_buckets(outputs, bad: tuple, observations: PanelBuckets, reason: str):
    """`_check_possible` of buckets: the trajectory is named by its given index."""
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
    return eqx.branched_error_if(
        outputs, per_trajectory.any(), jnp.argmax(per_trajectory), messages
    )


def panel_log_likelihood(
    model: AbstractCTBN,
    observations: PanelObservations | PanelBuckets,
    *,
    emissions: Emissions | None = None,
    initial_distribution: ArrayLike | None = None,
    solver: AbstractMasterEquationSolver = DEFAULT_SOLVER,
) -> Float[Array, "*batch"]:
    r"""Log-likelihood of each panel trajectory under `model`, by the scaled forward filter.

    - Default (`initial_distribution=None`, msm's convention): **conditional on the first
      observation**, $\log p(y_1,\dots,y_{m-1}\mid y_0)=\sum_{i\ge1}\log c_i$, where the state
      at $t_0$ is drawn uniformly among the global states the first observation allows
      (weighted by its emission probabilities; clamped nodes in their clamped state), which is
      exact when the first observation is complete. **A trajectory with one observation
      contributes 0.**
    - With `initial_distribution` $p_0$ (over the global states at $t_0$, shape `(S,)` shared or
      `(*batch, S)`): the full $\log p(y_0,\dots,y_{m-1})=\log\sum_sp_0(s)e_0(s)+
      \sum_{i\ge1}\log c_i$.

    An exact entry time contributes a density in time ($c_i$ contains a rate). Sum the result
    over trajectories for the data set's log-likelihood.

    **Arguments:**

    - `model`: a [`jaxctbn.CTBN`][] or [`jaxctbn.PaddedCTBN`][].
    - `observations`: [`jaxctbn.panel.PanelObservations`][] (one trajectory or a batch; their
      interventions are applied per trajectory), or a [`jaxctbn.panel.PanelBuckets`][]
      (trajectories of very unequal lengths; results in the order they were given).
    - `emissions`: optional [`jaxctbn.panel.Emissions`][] (default: error-free observations).
    - `initial_distribution`: see above.
    - `solver`: a master-equation solver (default [`jaxctbn.Uniformisation`][]).

    **Returns:** the log-likelihood per trajectory, shape `observations.batch_shape`.

    Pure: works under `jax.jit`, `jax.vmap` and `jax.grad` (with respect to the rates and the
    emission matrices), in float32 and float64. Raises (inside jit, `eqx.error_if`) when an
    observation is impossible under the model, naming the trajectory and time.
    """
    return cast(
        Array, _run(model, observations, emissions, initial_distribution, solver, "likelihood")
    )


def panel_expected_statistics(
    model: AbstractCTBN,
    observations: PanelObservations | PanelBuckets,
    *,
    emissions: Emissions | None = None,
    initial_distribution: ArrayLike | None = None,
    solver: AbstractMasterEquationSolver = DEFAULT_SOLVER,
) -> PanelExpectedStatistics:
    r"""Smoothed expected statistics $\mathsf E[T(s)\mid Y]$ and $\mathsf E[M(s\to s')\mid Y]$
    of each panel trajectory over $[t_0,t_{m-1}]$ (the interval integrals of the module
    docstring, plus one jump per exact entry time), as a
    [`jaxctbn.panel.PanelExpectedStatistics`][] with the batch axes of `observations` (pool a batch
    with its `sum`). Arguments as for [`jaxctbn.panel.panel_log_likelihood`][]; the solver's
    `forward_backward` bounds the length of one gap (for [`jaxctbn.Uniformisation`][],
    largest exit rate times the gap below about `fb_max_terms`, else it raises; use
    [`jaxctbn.MatrixExponential`][] for long gaps on small networks)."""
    return cast(
        PanelExpectedStatistics,
        _run(model, observations, emissions, initial_distribution, solver, "statistics"),
    )


def panel_marginals(
    model: AbstractCTBN,
    observations: PanelObservations | PanelBuckets,
    times: ArrayLike,
    *,
    emissions: Emissions | None = None,
    initial_distribution: ArrayLike | None = None,
    solver: AbstractMasterEquationSolver = DEFAULT_SOLVER,
) -> Float[Array, "*batch times global_states"]:
    r"""Smoothed marginals $p(S(t)=s\mid Y)$ at the grid `times` (shape `(G,)` shared by the
    batch, or `(*batch, G)`), each $\ge t_0$ of its trajectory (an error otherwise: the
    process before the first observation is not modelled); after the last observation the
    filter is simply propagated. At an exact entry time the marginal is the state entered.
    Arguments otherwise as for [`jaxctbn.panel.panel_log_likelihood`][]."""
    return cast(
        Array,
        _run(model, observations, emissions, initial_distribution, solver, "marginals", times),
    )


def _run(model, observations, emissions, initial_distribution, solver, what, grid=None):
    if not isinstance(observations, PanelObservations | PanelBuckets):
        raise ValueError(
            f"observations: expected a PanelObservations or PanelBuckets, got "
            f"{type(observations).__name__}."
        )
    observations.checked(model, emissions)  # a ValueError now for concrete states
    check_state_space(solver, model.cardinalities)
    # Python numbers and lists made arrays: `eqx.filter_jit` would bake them into the program
    # (static), compiling it again for every new initial distribution or time grid
    if initial_distribution is not None:
        initial_distribution = jnp.asarray(initial_distribution)
    if grid is not None:
        grid = jnp.asarray(grid)
    if isinstance(observations, PanelObservations):
        bad, out = _compute(
            model, observations, emissions, initial_distribution, solver, what, grid
        )
        return _check_possible(out, bad, observations)
    # buckets: one program per bucket shape, per-trajectory inputs cut and outputs gathered
    per_trajectory = lambda x, ndim: x is not None and x.ndim == ndim  # noqa: E731
    p0s = (
        observations.split(initial_distribution, "initial_distribution")
        if per_trajectory(initial_distribution, 2)
        else [initial_distribution] * len(observations.buckets)
    )
    grids = (
        observations.split(grid, "times")
        if per_trajectory(grid, 2)
        else [grid] * len(observations.buckets)
    )
    bads, outs = [], []
    for bucket, p0, g in zip(observations.buckets, p0s, grids):
        bad, out = _compute(model, bucket, emissions, p0, solver, what, g)
        bads.append(bad)
        if what == "statistics":  # the model is shared: only the arrays are gathered
            out = cast(PanelExpectedStatistics, out)
            out = (out.dwell_times, out.transitions, out.log_likelihood)
        outs.append(out)
    out = observations.gather(outs)
    if what == "statistics":
        dwell, transitions, log_likelihood = out
        out = PanelExpectedStatistics(
            dwell_times=dwell,
            transitions=transitions,
            log_likelihood=log_likelihood,
            model=model.checked(),
        )
    return _check_possible(out, tuple(bads), observations)


@eqx.filter_jit
def _compute(
    model, observations, emissions, initial_distribution, solver, what, grid, interval_scales=None
):
    """One compiled program per call (eager calls would otherwise compile op by op).
    `interval_scales`: `None`, or per node `(*batch, O, configs, k, k)` rate scales from each
    observation to the next (time-varying covariates; the likelihood only)."""
    if interval_scales is not None and what != "likelihood":
        raise ValueError(
            "covariates: time-varying covariates enter the likelihood only (the fit and its "
            "standard errors), not the smoothed statistics or marginals."
        )
    model, observations, matrices, p0 = _setup(model, observations, emissions, initial_distribution)
    batch = observations.batch_shape
    dtype = matrices[0].dtype
    if grid is not None:
        grid = jnp.asarray(grid, dtype)
        if grid.ndim == 1:
            grid = jnp.broadcast_to(grid, batch + grid.shape)
        elif grid.shape[:-1] != batch:
            raise ValueError(f"times: expected shape (G,) or {batch + ('G',)}, got {grid.shape}.")
        first = observations.times[..., 0].astype(dtype)
        grid = eqx.error_if(
            grid,
            jnp.any(grid < first[..., None]) | jnp.any(~jnp.isfinite(grid)),
            "times: every grid time must be finite and >= its trajectory's first observation "
            "time (the process before it is not modelled).",
        )

    def one(obs, p, g, scales):
        gen, filtered = _filter(model, obs, matrices, p, solver, interval_scales=scales)
        bad, log_likelihood = _filtered_log_likelihood(filtered, p)
        if what == "likelihood":
            return bad, log_likelihood
        betas, ends = _backward(gen, obs, matrices, filtered, solver)
        if what == "marginals":
            return bad, _marginals(gen, filtered, ends, obs.num_observations, g, solver)
        dwell, transitions = _statistics(gen, obs, filtered, betas, ends, solver)
        return bad, (dwell, transitions, log_likelihood)

    bad, out = _vmapped(one, len(batch))(observations, p0, grid, interval_scales)
    if what == "statistics":
        # the model is shared by the batch: only the arrays have the batch axes
        dwell, transitions, log_likelihood = out
        out = PanelExpectedStatistics(
            dwell_times=dwell, transitions=transitions, log_likelihood=log_likelihood, model=model
        )
    return bad, out
