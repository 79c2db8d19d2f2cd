r"""Inference under panel evidence by sampling: auxiliary-variable Gibbs sampling of whole CTBN
paths given panel observations (Rao & Teh 2013, "Fast MCMC sampling for Markov jump processes
and extensions", §5 for CTBNs), for networks beyond exact forward-backward (whose amalgamated
state space grows as $\prod_n k_n$).

One Gibbs update redraws the path of one node $n$ on $[t_0,t_{m-1}]$ given the paths of all
the others and the observations of $n$. Only $n$'s Markov blanket enters it: its parents
(its rates), its children (their likelihood) and the children's other parents (the children's
rates); the update works on those nodes' paths alone, so its cost does not grow with the
network:

1. **Uniformisation.** With $\Omega_n = 2\max_{x,u}q_n(x\mid u)$ (twice the node's largest exit
   rate), virtual jump times are drawn from a Poisson process of rate
   $\Omega_n-q_n(x_n(t)\mid u_n(t))$ along the current path (by thinning a rate-$\Omega_n$
   process). With the node's own jump times they form the candidate times $W$.
2. **Forward filtering, backward sampling** over the grid of $W$, the blanket's jump times
   and the observation times of $n$, in time order. At a candidate time the node moves by
   $B = I + Q_n(u_n(t))/\Omega_n$ (its parents' configuration at $t$); between grid points its
   children $c$ contribute $\exp(-\Delta\sum_c q_c(x_c\mid u_c))$, which depends on $x_n$
   through $u_c$; at a jump of a child, the child's rate of that jump; at an observation of $n$,
   the indicator of the observed state. The initial law of $x_n(t_0)$ is uniform (the exact
   route's default: conditional on the first observation).
3. The new path keeps the jumps at the candidate times where the sampled state changes
   (virtual jumps that stay are dropped).

A sweep updates every node once, in order; the chain's stationary law is the posterior over
complete paths given the observations. The first path jumps half-way between two
observations of a node that differ.

A path is held node by node: each node's jump times and values in a buffer of
`max_node_events` slots, so that an update gathers its blanket's rows (a grid of
$(1+|\mathrm{blanket}|)\cdot$`max_node_events` + `max_virtual` + observations points). The
samples are returned as whole paths of at most `max_events` jumps. Everything is padded to
static sizes and vectorised over trajectories (and chains) with `vmap`; a path or an update
that would need more than a buffer raises (`eqx.error_if`) rather than returning a truncated
sample.
"""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from .._errors import error_if
from .._learning.chain_diagnostics import autocovariance
from .._model.ctbn import AbstractCTBN
from .._paths.sampling import Trajectories
from .._paths.sufficient_statistics import NodeStatistics, node_statistics
from .gibbs_kernel import (
    Path,
    Tables,
    chain_start,
    padded_tables,
    sampler_bounds,
    sweep,
    to_trajectories,
    whole,
)
from .observations import (
    PanelObservations,
    clamped_nodes,
    per_trajectory_tables,
    require_batch,
    trajectory_tables,
)
from .panel_families import sampled_family_statistics
from .sampled_structural_em import AbstractSamplingEStep


class GibbsSampler(AbstractSamplingEStep):
    """Auxiliary-variable Gibbs sampling of complete paths given panel observations (module
    docstring): `burn_in` sweeps, then `num_samples` samples `thin` sweeps apart (all static).
    Static buffer sizes: `max_events` jumps per sampled path, `max_node_events` jumps per
    node of a path, `max_virtual` virtual jump times per node update; a path or update that
    needs more raises. A node update costs about
    $(1+b)\\cdot$`max_node_events` + `max_virtual` steps, $b$ the largest Markov blanket."""

    em_buffers: ClassVar[tuple[str, ...]] = ("max_events", "max_node_events", "max_virtual")

    num_samples: int = eqx.field(default=200, static=True)
    burn_in: int = eqx.field(default=50, static=True)
    thin: int = eqx.field(default=1, static=True)
    max_events: int = eqx.field(default=64, static=True)
    max_virtual: int = eqx.field(default=64, static=True)
    max_node_events: int = eqx.field(default=32, static=True)

    def __check_init__(self):
        for name in ("num_samples", "thin", "max_events", "max_virtual", "max_node_events"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"GibbsSampler: {name} must be an integer >= 1, got {value!r}.")
        if not isinstance(self.burn_in, int) or isinstance(self.burn_in, bool) or self.burn_in < 0:
            raise ValueError(
                f"GibbsSampler: burn_in must be an integer >= 0, got {self.burn_in!r}."
            )

    # ------------------------------------------------------------ Monte Carlo structural EM
    def em_start(self, model, buckets):
        return self, [None] * len(buckets)

    def em_bounds(self, model):
        return sampler_bounds(model)

    def em_step(self, model, bucket, parent_sets, key, state, bounds):
        family, diagnostics, infeasible, overflow = _structure_e_step(
            model, bucket, self, parent_sets, key, bounds
        )
        return family, diagnostics, infeasible, overflow, state

    def em_fit_fields(self, diagnostics, num_nodes, infeasible):
        ess = jnp.concatenate([d[0] for d in diagnostics])  # (trajectories, nodes)
        r_hat = None
        if diagnostics[0][1] is not None:
            r_hat = jnp.concatenate([d[1] for d in diagnostics]).max(0)
        return dict(
            effective_sample_size=ess.min(0),
            median_effective_sample_size=jnp.median(ess, axis=0),
            split_r_hat=r_hat,
            infeasible_updates=infeasible,
        )


#: The default sampler of `sample_panel_paths`.
DEFAULT_SAMPLER = GibbsSampler()


class SampledPaths(eqx.Module):
    """Posterior samples of complete paths given panel observations.

    - `trajectories`: a [`jaxctbn.Trajectories`][] batch `(R, num_samples)` (trajectory, then
      sample), each on $[0, t_{m-1}-t_0]$ (time from its first observation), ready for the
      complete-data statistics (`jaxctbn.SufficientStatistics.from_trajectories`, structure
      learning).
    - `infeasible_updates`: per trajectory, node updates that found no path through their grid
      and kept the old one (0 for a chain started from a feasible path).
    - `jumps`: `(R, num_samples, N)` jumps of each node in each sample, the trace whose
      effective sample size `effective_sample_size` and split R-hat `split_r_hat` report.
    """

    trajectories: Trajectories
    infeasible_updates: Int[Array, " trajectories"]
    jumps: Int[Array, "trajectories samples nodes"]

    def effective_sample_size(self) -> Float[Array, "trajectories nodes"]:
        r"""Per trajectory and node, the effective sample size of the node's jump count over the
        samples: $S/\tau$, $\tau=-1+2\sum_{k}(\hat\rho_{2k}+\hat\rho_{2k+1})$ over the pairs of
        autocorrelations before the first pair that is not positive (Geyer's initial positive
        sequence; the autocorrelations by FFT); $S$ for a constant trace."""
        x = self.jumps.astype(self.trajectories.durations.dtype)
        S = x.shape[1]
        covariances = autocovariance(x)
        variance = covariances[:, 0]
        rho = covariances / jnp.where(variance > 0, variance, 1)[:, None]
        pairs = rho[:, : S // 2 * 2].reshape(rho.shape[0], -1, 2, rho.shape[2]).sum(2)
        positive = jnp.cumprod(pairs > 0, axis=1).astype(x.dtype)
        tau = -1 + 2 * (positive * pairs).sum(1)
        return jnp.where(variance > 0, S / jnp.maximum(tau, 1e-12), float(S))

    def split_r_hat(self) -> Float[Array, "trajectories nodes"]:
        r"""Per trajectory and node, the split-$\hat R$ of the node's jump count (Gelman et
        al., *Bayesian Data Analysis*, 3rd ed., §11.4): the chain's first $2n$ samples cut into
        two halves of $n$, $W$ the mean of their variances, $B/n$ the variance of their means,
        $\hat R=\sqrt{\bigl(\tfrac{n-1}{n}W+B/n\bigr)/W}$. Near 1 when the halves agree; above
        ~1.01-1.1 the chain has not mixed (it drifts, or is stuck in one region). 1 for a
        constant trace, $+\infty$ for two constant halves that differ; NaN-free. Needs
        `num_samples >= 4`."""
        x = self.jumps.astype(self.trajectories.durations.dtype)
        n = x.shape[1] // 2
        if n < 2:
            raise ValueError(f"split_r_hat: needs at least 4 samples, got {x.shape[1]}.")
        halves = jnp.stack([x[:, :n], x[:, n : 2 * n]])  # (2, R, n, N)
        within = halves.var(2, ddof=1).mean(0)  # W
        between_n = halves.mean(2).var(0, ddof=1)  # B / n
        pooled = (n - 1) / n * within + between_n
        safe = jnp.where(within > 0, within, 1.0)
        ratio = jnp.where(within > 0, pooled / safe, jnp.where(between_n > 0, jnp.inf, 1.0))
        return jnp.sqrt(ratio)


def _chain(
    tables: Tables, times, states, num_observations, targets, clamps, key, sampler: GibbsSampler
):
    """One trajectory's chain: its samples (as `Path`s with a leading sample axis), the
    overflow flags (a node's jumps, the virtual times), the number of infeasible updates and
    whether an observation contradicts a clamp (`chain_start`)."""
    evidence, duration, path, overflow, contradiction = chain_start(
        times, states, num_observations, targets, clamps, sampler.max_node_events
    )

    def sweeps(carry, keys):
        carry = jax.lax.fori_loop(
            0,
            keys.shape[0],
            lambda i, c: sweep(tables, evidence, duration, c, keys[i], sampler.max_virtual),
            carry,
        )
        return carry, carry[0]

    key_burn, key_samples = jr.split(key)
    carry = (path, overflow, jnp.zeros((), jnp.int32))
    if sampler.burn_in:
        carry, _ = sweeps(carry, jr.split(key_burn, sampler.burn_in))
    keys = jr.split(key_samples, sampler.num_samples * sampler.thin)
    keys = keys.reshape(sampler.num_samples, sampler.thin, *keys.shape[1:])
    (_, overflow, infeasible), samples = jax.lax.scan(sweeps, carry, keys)
    return samples, duration, overflow, infeasible, contradiction


class PathChains(eqx.Module):
    """Gibbs chains over the hidden paths of a flat batch of `R` panel trajectories, held
    between sweeps by a sampler whose model changes from sweep to sweep
    ([`jaxctbn.panel.SampledStructure`][] with a `path_sampler`): each trajectory's current
    path, its evidence and duration, its clamps, the buffers' overflow flags `(R, 2)`
    (`max_node_events`, `max_virtual`) and the infeasible updates `(R,)`."""

    paths: Path
    evidence: tuple[Array, Array, Array]
    durations: Float[Array, " trajectories"]
    targets: Bool[Array, "trajectories nodes"]
    clamps: Int[Array, "trajectories nodes"]
    overflow: Bool[Array, "trajectories 2"]
    infeasible: Int[Array, " trajectories"]

    @classmethod
    def start(cls, observations: PanelObservations, num_nodes: int, sampler: GibbsSampler):
        """The chains' first paths (each node jumps half-way between two of its observations
        that differ), for observations already checked against the model; a contradiction
        between an observation and a clamp raises."""
        R = observations.times.shape[0]
        targets, clamps = clamped_nodes(observations, num_nodes)
        evidence, durations, paths, overflow, contradiction = jax.vmap(
            lambda t, s, m, tg, c: chain_start(t, s, m, tg, c, sampler.max_node_events)
        )(observations.times, observations.states, observations.num_observations, targets, clamps)
        paths = error_if(
            paths,
            jnp.any(contradiction),
            "observations: a node observed in another state than its intervention's clamp.",
        )
        return cls(
            paths, evidence, durations, targets, clamps, overflow, jnp.zeros((R,), jnp.int32)
        )

    def swept(
        self,
        model: AbstractCTBN,
        observations: PanelObservations,
        key: PRNGKeyArray,
        sampler: GibbsSampler,
        bounds: tuple[int, int],
    ) -> PathChains:
        r"""Every trajectory's path after `sampler.thin` Gibbs sweeps under `model` (its
        intervened model per trajectory), from the current one: each leaves
        $p(S\mid Y,\text{model})$ invariant. `bounds`: static bounds on a node's children and
        Markov blanket under every graph the model may have (`sampler_bounds`)."""
        tables, _, _ = trajectory_tables(model, observations, lambda m: padded_tables(m, bounds))
        R = self.durations.shape[0]

        def chain(tab, evidence, duration, path, overflow, infeasible, key):
            carry = (path, overflow, infeasible)
            return jax.lax.fori_loop(
                0,
                sampler.thin,
                lambda i, c: sweep(
                    tab, evidence, duration, c, jr.fold_in(key, i), sampler.max_virtual
                ),
                carry,
            )

        paths, overflow, infeasible = jax.vmap(chain)(
            tables,
            self.evidence,
            self.durations,
            self.paths,
            self.overflow,
            self.infeasible,
            jr.split(key, R),
        )
        return PathChains(
            paths, self.evidence, self.durations, self.targets, self.clamps, overflow, infeasible
        )

    def trajectories(self, max_events: int) -> tuple[Trajectories, Array]:
        """The current paths as a [`jaxctbn.Trajectories`][] batch `(R,)` of at most
        `max_events` jumps each (with the clamps, so that the structure scores pool them), and
        whether any needed more."""
        events, too_long = jax.vmap(lambda p: whole(p, max_events))(self.paths)
        trajectories = jax.vmap(to_trajectories)(events, self.durations, self.targets, self.clamps)
        return trajectories, jnp.any(too_long)


def sample_panel_paths(
    model: AbstractCTBN,
    observations: PanelObservations,
    *,
    key: PRNGKeyArray,
    sampler: GibbsSampler = DEFAULT_SAMPLER,
) -> SampledPaths:
    r"""Posterior samples of the complete paths of a batch of panel trajectories given their
    observations, by auxiliary-variable Gibbs sampling (module docstring): one chain per
    trajectory, all trajectories at once (`vmap`).

    - `model`: the CTBN whose path law is conditioned (its rates; no structural check of the
      observations beyond the exact route's: an observation the model cannot reach makes every
      update infeasible, reported in `infeasible_updates`).
    - `observations`: a batch `(R, O)` of [`jaxctbn.panel.PanelObservations`][] with exact
      (error-free) states, `-1` = missing; their interventions (perfect and imperfect, one per
      trajectory or one for all) apply as in the exact route: a clamped node stays at its
      clamped state (an observation of another state raises) and the samples record the
      clamps, so that the structure scores pool them; no exact entry times (not yet).
    - `key`; `sampler`: a [`jaxctbn.panel.GibbsSampler`][].

    **Returns:** `SampledPaths`. Raises when a buffer is too small
    (`max_events`, `max_node_events`, `max_virtual`)."""
    require_batch(observations)
    if not isinstance(sampler, GibbsSampler):
        raise ValueError(f"sampler: expected a jaxctbn.panel.GibbsSampler, got {sampler!r}.")
    return _sample_panel_paths(model, observations, key, sampler, sampler_bounds(model))


@eqx.filter_jit
def _sample_panel_paths(model, observations, key, sampler, bounds: tuple[int, int]) -> SampledPaths:
    paths, overflow = sample_unguarded(model, observations, key, sampler, bounds)
    trajectories = error_if(
        paths.trajectories,
        jnp.any(overflow),
        "sampler: a path needed more than max_events jumps (or a node more than "
        "max_node_events), or an update more than max_virtual virtual times; raise them "
        "(GibbsSampler(max_events=..., max_node_events=..., max_virtual=...)).",
    )
    return eqx.tree_at(lambda p: p.trajectories, paths, trajectories)


def sample_unguarded(model, observations, key, sampler, bounds: tuple[int, int]):
    """`_sample_panel_paths` without the buffer guard: the samples and which buffers
    overflowed, `(3,)`: `max_events`, `max_node_events`, `max_virtual` (then the samples are
    not valid; a caller that can grow the buffers retries)."""
    model, observations, tables, targets, clamps = per_trajectory_tables(
        model, observations, lambda m: padded_tables(m, bounds), "sampling yet"
    )
    R = observations.times.shape[0]
    keys = jr.split(key, R)
    samples, durations, overflow, infeasible, contradiction = jax.vmap(
        lambda tab, t, s, m, tg, c, k: _chain(tab, t, s, m, tg, c, k, sampler)
    )(
        tables,
        observations.times,
        observations.states,
        observations.num_observations,
        targets,
        clamps,
        keys,
    )
    events, too_long = jax.vmap(jax.vmap(lambda p: whole(p, sampler.max_events)))(samples)
    trajectories = jax.vmap(
        jax.vmap(to_trajectories, in_axes=(0, None, None, None)), in_axes=(0, 0, 0, 0)
    )(events, durations, targets, clamps)
    jumps = jnp.isfinite(samples.times).sum(-1).astype(jnp.int32)  # (R, samples, N)
    trajectories = error_if(
        trajectories,
        jnp.any(contradiction),
        "observations: a node observed in another state than its intervention's clamp.",
    )
    paths = SampledPaths(trajectories=trajectories, infeasible_updates=infeasible, jumps=jumps)
    return paths, jnp.concatenate([jnp.any(too_long)[None], jnp.any(overflow, axis=0)])


def sampled_node_statistics(
    trajectories: Trajectories,
    parents: tuple[tuple[int, ...], ...],
    cardinalities: tuple[int, ...],
) -> tuple[NodeStatistics, ...]:
    """Each node's statistics for the parent sets `parents` from sampled `trajectories` `(R,
    samples)` (`SampledPaths.trajectories`), averaged over the samples and summed over the
    trajectories: the Monte Carlo estimate of the expected statistics given the
    observations (the E-step of EM)."""
    out = []
    for n, ps in enumerate(parents):
        stats = jax.vmap(jax.vmap(lambda t: node_statistics(t, n, tuple(ps), cardinalities)))(
            trajectories
        )
        out.append(
            NodeStatistics(
                transitions=stats.transitions.mean(1).sum(0),
                dwell_times=stats.dwell_times.mean(1).sum(0),
            )
        )
    return tuple(out)


@eqx.filter_jit
def _structure_e_step(model, bucket, sampler, parent_sets, key, bounds):
    """The Monte Carlo E-step of structural EM on one bucket: the family statistics of the
    sampled paths (pooled by their interventions), averaged over the samples; the chains'
    diagnostics (effective sample sizes and split-R-hat, per trajectory and node), the number
    of infeasible updates and the overflow flags."""
    paths: SampledPaths
    paths, overflow = sample_unguarded(model, bucket, key, sampler, bounds)
    family = sampled_family_statistics(paths.trajectories, model.cardinalities, parent_sets)
    r_hat = paths.split_r_hat() if sampler.num_samples >= 4 else None
    diagnostics = (paths.effective_sample_size(), r_hat)
    return family, diagnostics, paths.infeasible_updates.sum(), overflow
