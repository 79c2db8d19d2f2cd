r"""Inference under panel evidence by importance sampling, with the mean-field posterior as the
proposal.

Likelihood weighting (forward simulation, weighted by the observations' likelihood) gives
weight zero to almost every path once many nodes are seen without error at every visit. Here
the proposal already meets every observation: it is the product of node processes
$Q=\prod_n Q_n$ fitted by `panel_mean_field_statistics`, each $Q_n$ a chain
whose matrix $A_n$ is constant on each step of the mean-field grid, conditioned on the node's
own observations. A path $x$ drawn from $Q$ gets the weight

$$w(x)=\frac{p(x, Y)}{Q(x)}=\frac{p_0(x(0))\,\prod_n e^{\int q_n(x_n,x_n\mid u_n)\,dt}
\prod_{\mathrm{jumps}}q_n(x_n^-,x_n^+\mid u_n)}{\prod_n p_{0,n}(x_n(0))\,
e^{\int A_n(x_n,x_n)\,dt}\prod_{\mathrm{jumps}}A_n(x_n^-,x_n^+)/Z_n}$$

(the initial laws are the same product and cancel), so that $\mathsf E_Q[w]=p(Y)$, the
likelihood of [`jaxctbn.panel.panel_log_likelihood`][] (conditional on the first
observation), and the self-normalised averages $\sum_s\bar w_s f(x_s)$ of any path statistic
converge to its posterior expectation, correcting the mean-field approximation. With no edges
the proposal is the posterior and every weight equals $p(Y)$.

**Drawing from $Q_n$ exactly.** The node's state at each step end is drawn forwards from the
fit's backward vectors $\rho$ (which carry the observations), $P(y\mid x)=e^{A_{n,s}\Delta_s}
(x,y)\rho(y)/\rho(x)$; then on each step a bridge between the drawn states (uniformisation,
Hobolth and Stone 2009): with $\Omega\ge\max_x(-A_{n,s}(x,x))$ and $B=I+A_{n,s}/\Omega$, the
number of candidate times $c$ has probability $e^{-\Omega\Delta}(\Omega\Delta)^c/c!\,B^c(a,b)
/e^{A_{n,s}\Delta}(a,b)$, the times are uniform on the step, and the states through them a
chain with weights $B(x,y)B^{c-i}(y,b)$; the node jumps where its state changes. Every node of
every sample is drawn at once (`vmap`); a path or node with more jumps than its buffer, or a
bridge with more candidate times than `max_candidates`, raises (`eqx.error_if`) rather than
returning a truncated sample.

**Diagnostics.** The effective sample size $(\sum_s w_s)^2/\sum_s w_s^2$ of each trajectory
(it falls as the network's couplings grow: the proposal ignores the dependence between
nodes), and $\ln\frac1S\sum_s w_s$, an estimate of $\ln p(Y)$ whose expectation lies between
$\mathsf E_Q[\ln w]$ (the proposal's evidence lower bound) and $\ln p(Y)$.
"""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, Float, PRNGKeyArray

from .._errors import error_if
from .._master_equation import uniformised_powers
from .._model.ctbn import AbstractCTBN
from .._model.layout import config_index
from .._paths.sampling import Trajectories
from .._paths.sufficient_statistics import segments
from .bridges import bridge, draw_index
from .gibbs_kernel import Path, compacted, to_trajectories, whole
from .mean_field import (
    DEFAULT_MEAN_FIELD,
    NodeProcesses,
    PanelMeanField,
    as_data,
    as_start,
    children_bound,
    fitted_product_law,
)
from .observations import PanelObservations, require_batch
from .panel_families import sampled_family_statistics
from .sampled_structural_em import AbstractSamplingEStep


class PanelImportanceSampler(AbstractSamplingEStep):
    """Importance sampling of complete paths given panel observations, the mean-field
    posterior as the proposal (module docstring). Keyword-only:

    - `num_samples` (static): paths drawn per trajectory (default 256).
    - `proposal`: the [`jaxctbn.panel.PanelMeanField`][] fit that gives the proposal.
    - `max_events` (static): jumps per sampled path (default 64); `max_node_events` (static):
      jumps per node of a path (default 32); `max_candidates` (static): uniformisation
      candidate times per node and step (default 16). A path that needs more raises."""

    em_buffers: ClassVar[tuple[str, ...]] = ("max_events", "max_node_events", "max_candidates")

    num_samples: int = eqx.field(default=256, static=True, kw_only=True)
    proposal: PanelMeanField = eqx.field(default=DEFAULT_MEAN_FIELD, kw_only=True)
    max_events: int = eqx.field(default=64, static=True, kw_only=True)
    max_node_events: int = eqx.field(default=32, static=True, kw_only=True)
    max_candidates: int = eqx.field(default=16, static=True, kw_only=True)

    def __check_init__(self):
        for name in ("num_samples", "max_events", "max_node_events", "max_candidates"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(
                    f"PanelImportanceSampler: {name} must be an integer >= 1, got {value!r}."
                )
        if not isinstance(self.proposal, PanelMeanField):
            raise ValueError(
                "PanelImportanceSampler: proposal must be a jaxctbn.panel.PanelMeanField, got "
                f"{self.proposal!r}."
            )

    # ------------------------------------------------------------ Monte Carlo structural EM
    def em_start(self, model, buckets):
        # the proposal's sweeps and tolerance as data (one program); each bucket's mean-field
        # fit starts the next E-step's proposal
        sampler = eqx.tree_at(lambda s: s.proposal, self, as_data(self.proposal))
        return sampler, [as_start(model, b, sampler.proposal, None) for b in buckets]

    def em_bounds(self, model):
        return children_bound(model)

    def em_step(self, model, bucket, parent_sets, key, state, bounds):
        family, diagnostics, overflow, fitted = _structure_e_step(
            model, bucket, self, parent_sets, key, state, bounds
        )
        return family, diagnostics, 0, overflow, fitted

    def em_fit_fields(self, diagnostics, num_nodes, infeasible):
        # the weights' effective sample sizes (the same for every node)
        ess = jnp.concatenate([d[0] for d in diagnostics])[:, None]
        ess = jnp.broadcast_to(ess, (ess.shape[0], num_nodes))
        return dict(
            effective_sample_size=ess.min(0),
            median_effective_sample_size=jnp.median(ess, axis=0),
            log_likelihood_estimate=jnp.asarray(sum(float(d[1]) for d in diagnostics)),
        )


#: The default sampler of `sample_panel_paths_by_importance`.
DEFAULT_IMPORTANCE_SAMPLER = PanelImportanceSampler()


class WeightedPaths(eqx.Module):
    r"""Complete paths drawn from the mean-field proposal, with their importance weights.

    - `trajectories`: a [`jaxctbn.Trajectories`][] batch `(R, num_samples)` on $[0,
      t_{m-1}-t_0]$ (time from each trajectory's first observation), recording the clamps.
    - `log_weights`: $\ln w$ `(R, num_samples)` (module docstring).
    - `evidence_lower_bound`: the proposal's mean-field bound per trajectory `(R,)`.
    """

    trajectories: Trajectories
    log_weights: Float[Array, "trajectories samples"]
    evidence_lower_bound: Float[Array, " trajectories"]

    def normalised_weights(self) -> Float[Array, "trajectories samples"]:
        r"""$\bar w_s=w_s/\sum_{s'}w_{s'}$ per trajectory."""
        return jax.nn.softmax(self.log_weights, axis=-1)

    def effective_sample_size(self) -> Float[Array, " trajectories"]:
        r"""$1/\sum_s\bar w_s^2$ per trajectory: from 1 (one path carries all the weight) to
        `num_samples` (equal weights)."""
        return 1.0 / (self.normalised_weights() ** 2).sum(-1)

    def log_likelihood(self) -> Float[Array, " trajectories"]:
        r"""$\ln\frac1S\sum_s w_s$ per trajectory: $\frac1S\sum_s w_s$ is an unbiased estimate
        of $p(Y)$ (conditional on the first observation)."""
        S = self.log_weights.shape[-1]
        return jax.nn.logsumexp(self.log_weights, axis=-1) - jnp.log(S)

    def resampled(self, key: PRNGKeyArray) -> Trajectories:
        """`num_samples` paths per trajectory drawn from the weighted ones by systematic
        resampling (each path kept about `num_samples` x its normalised weight times): equally
        weighted paths for the complete-data routes."""
        weights = self.normalised_weights()
        R, S = weights.shape
        offsets = jr.uniform(key, (R, 1), dtype=weights.dtype)
        positions = (offsets + jnp.arange(S, dtype=weights.dtype)) / S
        cumulative = jnp.cumsum(weights, axis=-1)
        picked = jax.vmap(lambda c, p: jnp.searchsorted(c, p, side="right"))(cumulative, positions)
        picked = jnp.minimum(picked, S - 1)
        return jax.tree_util.tree_map(
            lambda x: (
                jnp.take_along_axis(x, picked.reshape((R, S) + (1,) * (x.ndim - 2)), 1)
                if x.ndim >= 2
                else x
            ),
            self.trajectories,
        )


# --------------------------------------------------------------------------- one node's path
def _bridge(A, uniformised, E, dt, start, a, b, key):
    """A path of the chain with matrix `A` on `[start, start + dt]` from state `a` to state `b`
    (`uniformised`: `uniformised_powers(A)`): `(times, states after, jumped, log density without the
    normaliser, overflow)`, each of `max_candidates` slots (`inf` past the candidates)."""
    omega, B, powers = uniformised
    times, states, jumped, overflow = bridge(B, powers[:, :, b], E[a, b], omega, dt, start, a, key)
    # the log density: the diagonal over the intervals, the rates at the jumps
    before = jnp.concatenate([a[None], states[:-1]])
    clipped = jnp.minimum(times, start + dt)
    edges = jnp.concatenate([start[None], clipped, (start + dt)[None]])
    held = jnp.concatenate([a[None], states])
    integral = (jnp.diff(edges) * jnp.diagonal(A)[held]).sum()
    rates = A[before, states]
    log_rates = jnp.where(jumped, jnp.log(jnp.where(jumped, rates, 1.0)), 0.0).sum()
    return times, states, jumped, integral + log_rates, overflow


def _node_path(A, uniformised, E, ends, first, log_normaliser, steps, key, max_jumps: int):
    """One path of one node's process `Q_n` (module docstring): its state at each step's end
    drawn forwards from the backward vectors (`P(y | x) = e^{A dt}(x, y) rho(y) / rho(x)`),
    then a bridge on each step (`uniformised`: `uniformised_powers` of each step's matrix). Returns
    `(initial state, jump times (J,), values (J,), log density without the initial law's
    factor, flags (3,): too many jumps, too many candidates, no path)`."""
    S = A.shape[0]
    dtype = A.dtype
    key_first, key_ends, key_bridges = jr.split(key, 3)
    x0 = draw_index(first, jr.uniform(key_first, (), dtype))

    def forwards(x, inputs):
        E_s, end, v = inputs
        w = E_s[x] * end
        y = draw_index(w, v)
        return y, (y, w.sum() > 0)

    _, (at_ends, possible) = jax.lax.scan(
        forwards, x0, (E, ends, jr.uniform(key_ends, (S,), dtype))
    )
    at_starts = jnp.concatenate([x0[None], at_ends[:-1]])
    starts = jnp.concatenate([jnp.zeros((1,), dtype), jnp.cumsum(steps)[:-1]])
    times, states, jumped, log_q, overflow = jax.vmap(_bridge)(
        A, uniformised, E, steps, starts, at_starts, at_ends, jr.split(key_bridges, S)
    )
    jump_times, jump_values, too_many = compacted(
        jumped.reshape(-1), times.reshape(-1), states.reshape(-1), max_jumps
    )
    flags = jnp.stack([too_many, jnp.any(overflow), ~jnp.all(possible)])
    return x0, jump_times, jump_values, log_q.sum() - log_normaliser, flags


def _target_log_density(tables, trajectory: Trajectories, moved_nodes, cards) -> Array:
    r"""$\ln p(x)$ of one whole path without its initial law:
    $\sum_n\int q_n(x_n,x_n\mid u_n)\,dt+\sum_{\mathrm{jumps}}\ln q_n(x^-,x^+\mid u)$ under the
    (intervened) node tables `(present, safe, digits, valid, off)`; `moved_nodes`: the node
    of each jump slot (`-1` = none)."""
    present, safe, _, _, off = tables
    N = present.shape[0]
    states, dwell, real = segments(trajectory)  # (E + 1, N), (E + 1,), (E,)
    config = jax.vmap(lambda p: config_index(states, p, cards), out_axes=1)(
        jnp.where(present, safe, -1)
    )  # (E + 1, N): each node's parent configuration on each segment
    exits = off.sum(-1)  # (N, C, K)
    nodes = jnp.arange(N)
    held = exits[nodes[None], config, states]  # (E + 1, N)
    m = jnp.maximum(moved_nodes, 0)
    E = moved_nodes.shape[0]
    e = jnp.arange(E)
    rate = off[m, config[e, m], states[e, m], states[e + 1, m]]
    jump = real & (moved_nodes >= 0)
    log_rates = jnp.where(jump, jnp.log(jnp.where(jump, rate, 1.0)), 0.0)
    return -(dwell[:, None] * held).sum() + log_rates.sum()


# --------------------------------------------------------------------------- entry point
def sample_panel_paths_by_importance(
    model: AbstractCTBN,
    observations: PanelObservations,
    *,
    key: PRNGKeyArray,
    sampler: PanelImportanceSampler = DEFAULT_IMPORTANCE_SAMPLER,
) -> WeightedPaths:
    r"""Complete paths of a batch of panel trajectories drawn from the mean-field posterior and
    weighted towards the exact posterior (module docstring), all trajectories, samples and
    nodes at once.

    - `model`: a [`jaxctbn.CTBN`][] or [`jaxctbn.PaddedCTBN`][] (rates only; no global state
      space is built).
    - `observations`: a batch `(R, O)` of [`jaxctbn.panel.PanelObservations`][] with exact
      (error-free) states, `-1` = missing; their interventions (perfect and imperfect) apply
      per trajectory, the samples record the clamps; no exact entry times.
    - `key`; `sampler`: a [`jaxctbn.panel.PanelImportanceSampler`][].

    **Returns:** `WeightedPaths`: the paths, their log-weights, the
    proposal's bound; `effective_sample_size()`, `log_likelihood()`, `resampled(key)`. Raises
    (inside jit) when an observation is impossible under the model or a buffer is too small
    (`max_events`, `max_node_events`, `max_candidates`)."""
    require_batch(observations)
    if not isinstance(sampler, PanelImportanceSampler):
        raise ValueError(
            f"sampler: expected a jaxctbn.panel.PanelImportanceSampler, got {sampler!r}."
        )
    start = as_start(model, observations, sampler.proposal, None)
    sampler = eqx.tree_at(lambda s: s.proposal, sampler, as_data(sampler.proposal))
    return _weighted_paths(model, observations, key, sampler, start, children_bound(model))


@eqx.filter_jit
def _weighted_paths(model, observations, key, sampler, start, max_children) -> WeightedPaths:
    paths, overflow, _ = weighted_unguarded(model, observations, key, sampler, start, max_children)
    log_weights = error_if(
        paths.log_weights,
        overflow[0] | overflow[1],
        "sampler: a path needed more than max_events jumps (or a node more than "
        "max_node_events); raise them (PanelImportanceSampler(max_events=..., "
        "max_node_events=...)).",
    )
    log_weights = error_if(
        log_weights,
        overflow[2],
        "sampler: a node's path needed more than max_candidates uniformisation times on a "
        "step; raise it (PanelImportanceSampler(max_candidates=...)).",
    )
    return eqx.tree_at(lambda p: p.log_weights, paths, log_weights)


def weighted_unguarded(model, observations, key, sampler, start, max_children):
    """`_weighted_paths` without the buffer guards: the paths, which buffers overflowed, `(3,)`:
    `max_events`, `max_node_events`, `max_candidates` (then the paths are not valid; a caller
    that can grow the buffers retries), and the proposal's fitted `(dwell, transitions)` (a
    later call on the same observations may start its mean-field sweeps there: `start`). An
    impossible observation still raises."""
    statistics, processes, setup = fitted_product_law(
        model, observations, sampler.proposal, start, max_children, processes=True
    )
    assert processes is not None and setup is not None
    tables, targets, clamps, observations = setup
    cards = model.cardinalities
    R, N, S = observations.times.shape[0], model.num_nodes, sampler.num_samples
    t = observations.times
    durations = t[jnp.arange(R), observations.num_observations - 1] - t[:, 0]

    def one_trajectory(inputs):
        process, table, duration, target, clamp, key = inputs
        process: NodeProcesses
        # each node's and step's uniformisation, shared by the samples
        uniformised = jax.vmap(
            jax.vmap(lambda A: uniformised_powers(A, sampler.max_candidates + 1))
        )(process.matrices)

        def one_path(key):
            x0, times, values, log_q, flags = jax.vmap(
                lambda A, U, E, rho, first, z, k: _node_path(
                    A, U, E, rho, first, z, process.steps, k, sampler.max_node_events
                )
            )(process.matrices, uniformised, process.exponentials, process.ends, process.first,
              process.log_normalisers, jr.split(key, N))  # fmt: skip
            events, too_long = whole(Path(initial=x0, times=times, values=values),
                                      sampler.max_events)  # fmt: skip
            path = to_trajectories(events, duration, target, clamp)
            log_p = _target_log_density(table, path, events.nodes, cards)
            flags = jnp.concatenate([too_long[None], flags.any(0)])
            return path, log_p - log_q.sum(), flags

        return jax.vmap(one_path)(jr.split(key, S))

    paths, log_weights, flags = jax.lax.map(
        one_trajectory, (processes, tables, durations, targets, clamps, jr.split(key, R))
    )
    flags = flags.any((0, 1))
    log_weights = error_if(
        log_weights,
        ~flags[:3].any() & (flags[3] | ~jnp.all(jnp.isfinite(log_weights))),
        "observations: a trajectory is impossible under the model, or a weight is not finite.",
    )
    weighted = WeightedPaths(
        trajectories=paths,
        log_weights=log_weights,
        evidence_lower_bound=statistics.evidence_lower_bound,
    )
    return weighted, flags[:3], (statistics.dwell_times, statistics.transitions)


@eqx.filter_jit
def _structure_e_step(model, bucket, sampler, parent_sets, key, start, max_children):
    """The importance-sampling E-step of structural EM on one bucket: the family statistics of
    the weighted paths resampled to equal weights (systematic resampling), averaged over the
    samples; the weights' effective sample size per trajectory and the summed likelihood
    estimate; which buffers overflowed; and the proposal's fit `(dwell, transitions, given)`
    (the next E-step starts its mean-field sweeps there; `start`: the same from the previous
    E-step)."""
    key_draw, key_resample = jax.random.split(key)
    paths: WeightedPaths
    paths, overflow, fitted = weighted_unguarded(
        model, bucket, key_draw, sampler, start, max_children
    )
    resampled = paths.resampled(key_resample)
    family = sampled_family_statistics(resampled, model.cardinalities, parent_sets)
    diagnostics = (paths.effective_sample_size(), paths.log_likelihood().sum())
    return family, diagnostics, overflow, (*fitted, jnp.asarray(True))
