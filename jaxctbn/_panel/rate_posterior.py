r"""Rate posteriors from panel data, by a choice of posterior family
([`jaxctbn.panel.AbstractPanelRateFamily`][]): exact in the limit by default, or the fast
moment-matched Gamma.

With complete paths the Gamma posterior is exact: $\bar\alpha=\alpha+M$, $\bar\beta=\beta+T$.
A panel gives no counts, and $p(\Lambda\mid Y)\propto p(\Lambda)\,p(Y\mid\Lambda)$ is not a Gamma.

- [`jaxctbn.panel.SampledGammaMixture`][] (the default): the No-U-Turn sampler on the
  log-rates with the exact panel likelihood, each retained draw $\Lambda_c$ Rao-Blackwellised by
  an exact draw of the hidden paths $S_c\sim p(S\mid Y,\Lambda_c)$ (forward filtering, backward
  sampling, bridges) into a mixture of Gammas, one $\mathrm{Gam}(\alpha+M(S_c),\beta+T(S_c))$
  per draw ([`jaxctbn.GammaMixturePosterior`][]). Exact as the draws grow; its chains'
  split-$\hat R$ and effective sample sizes are reported with it.
- [`jaxctbn.panel.MomentMatchedGamma`][]: the Gamma whose counts are the smoothed expectations
  $\bar M=\mathsf E[M\mid Y,\hat\Lambda]$, $\bar T=\mathsf E[T\mid Y,\hat\Lambda]$ at its own
  mean $\hat\Lambda=\bar\alpha/\bar\beta$, iterated to a fixed point (the paper's appendix C.2;
  maths §7). It treats imputed statistics as observed, so it is **overconfident** where the
  visits say little: with visits at or beyond the mixing time its s.d. is 0.15-0.2 of the
  exact one (`benchmarks/results/panel_rate_posterior.md`). Exact only as the visits become
  dense.
"""

from __future__ import annotations

import abc
import math
import warnings
from typing import Protocol, cast, overload, runtime_checkable

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jax.scipy.special import digamma, gammaln, polygamma
from jaxtyping import Array, Bool, PRNGKeyArray

from .._batching import AbstractBatching
from .._learning.conjugate import off_diagonal_entries, with_zero_diagonal
from .._learning.gamma_mixture import ChainDiagnostics, GammaMixturePosterior
from .._learning.posterior import RatePosterior
from .._learning.resampling import reweighted_ancestors, systematic_indices
from .._learning.structure_mixture import StructureChainDiagnostics
from .._master_equation.dense_linalg import gap_transition_matrices
from .._master_equation.generator import amalgamate
from .._master_equation.solvers import AbstractMasterEquationSolver, MatrixExponential
from .._model.ctbn import CTBN
from .._model.interventions import exposure_scale, is_concrete
from .._paths.sufficient_statistics import NodeStatistics
from .buckets import PanelBuckets, as_flat_buckets
from .inference import (
    GapGroups,
    PanelExpectedStatistics,
    _compute,
    _pooled_by_gaps,
    gap_groups,
    panel_expected_statistics,
)
from .observations import Emissions, PanelObservations
from .path_statistics import sample_path_statistics, with_candidate_growth

# panel gaps are long relative to the rates: the dense exponential has no limit on a gap
DENSE_SOLVER = MatrixExponential()


def pooled_node_statistics(
    statistics: PanelExpectedStatistics,
    parents: tuple[tuple[int, ...], ...],
    observations: PanelObservations | PanelBuckets,
) -> list[NodeStatistics]:
    """Per node, the statistics of a batch of panel trajectories (`statistics` with one leading
    trajectory axis, in the given order) on the graph `parents`, pooled: summed over the
    trajectories in which the node was not perfectly intervened on, the dwell times of a node
    whose rates an imperfect intervention scales by $s$ counted as the exposure $sT$
    ([`jaxctbn.internal.exposure_scale`][])."""
    R = statistics.log_likelihood.shape[0]
    dtype = statistics.dwell_times.dtype
    intervention = observations.intervention
    out = []
    for n in range(len(parents)):
        keep = jnp.ones((R,), dtype)
        if intervention is not None:
            keep = jnp.broadcast_to(~jnp.asarray(intervention.targets)[..., n], (R,)).astype(dtype)
        exposure = keep * jnp.broadcast_to(exposure_scale(intervention, n, dtype), (R,))
        # summed over the trajectories on the global states first, then projected once
        pooled = PanelExpectedStatistics(
            dwell_times=jnp.einsum("r,rs->s", exposure, statistics.dwell_times),
            transitions=jnp.einsum("r,rjs->js", keep, statistics.transitions),
            log_likelihood=jnp.zeros((), dtype),
            model=statistics.model,
        )
        M = pooled.node_transitions(n, parents[n])
        T = pooled.node_dwell_times(n, parents[n])
        k = M.shape[-1]
        out.append(
            NodeStatistics(transitions=jnp.where(jnp.eye(k, dtype=bool), 0.0, M), dwell_times=T)
        )
    return out


def checked_panel_update(
    observations: PanelObservations | PanelBuckets, iterations: int, num_nodes: int
) -> Bool[Array, "trajectories nodes"] | None:
    """Check the arguments of a posterior update from panel trajectories (one-line errors
    naming them) and return which nodes each trajectory clamps (`None`: no intervention)."""
    if not isinstance(observations, PanelObservations | PanelBuckets):
        raise ValueError(
            f"observations: expected a PanelObservations or PanelBuckets, got "
            f"{type(observations).__name__}."
        )
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations: expected an integer >= 1, got {iterations!r}.")
    if len(observations.batch_shape) != 1:
        raise ValueError("observations: expected a batch with one leading axis.")
    if observations.intervention is None:
        return None
    return jnp.broadcast_to(
        jnp.asarray(observations.intervention.targets, bool),
        (observations.batch_shape[0], num_nodes),
    )


def check_integer_fields(module: eqx.Module, **least: int) -> None:
    """A one-line `ValueError` naming the first field of `module` that is not an integer at
    least its bound in `least`."""
    for name, bound in least.items():
        value = getattr(module, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < bound:
            raise ValueError(f"{name}: expected an integer >= {bound}, got {value!r}.")


class AbstractPanelRateFamily(eqx.Module):
    """How [`jaxctbn.panel.panel_rate_posterior`][] represents and computes the posterior over
    the rates after panel data: [`jaxctbn.panel.SampledGammaMixture`][] (exact in the limit,
    the default) or [`jaxctbn.panel.MomentMatchedGamma`][] (fast, overconfident)."""

    @abc.abstractmethod
    def posterior(
        self,
        prior: RatePosterior | GammaMixturePosterior,
        observations: PanelObservations | PanelBuckets,
        emissions: Emissions | None,
        key: PRNGKeyArray | None,
        gaps: GapGroups | None = None,
    ) -> RatePosterior | GammaMixturePosterior:
        """`prior` updated with `observations` (checked by the verb). `gaps`: the intervals
        grouped by length (observations without interventions, computed on the host), so that
        one transition matrix serves every interval of a length; `None` otherwise."""

    def initial(self, prior: RatePosterior) -> RatePosterior | GammaMixturePosterior:
        """`prior` in the representation this family's updates keep (the same structure after
        every update, so that a sequential loop carries it through `jax.lax.scan`): the Gamma
        itself, or a mixture of as many copies of it as the family has components."""
        return prior


class MomentMatchedGamma(AbstractPanelRateFamily):
    r"""The Gamma whose counts are the smoothed expected statistics under its own mean, by
    `iterations` fixed-point steps from the prior's mean (module page): a
    [`jaxctbn.RatePosterior`][]. Each step is an EM step for the MAP of a Gamma prior with shape
    $\alpha+1$, so the mean converges where EM does. **Overconfident** when visits are sparse
    (it ignores the uncertainty about the hidden path beyond its expectation); exact as the
    visits become dense. No key needed. `solver`: the master-equation solver of the smoothed
    statistics (default: the dense matrix exponential, which has no limit on a gap)."""

    iterations: int = eqx.field(default=20, static=True)
    solver: AbstractMasterEquationSolver = DENSE_SOLVER

    def __check_init__(self):
        if (
            isinstance(self.iterations, bool)
            or not isinstance(self.iterations, int)
            or self.iterations < 1
        ):
            raise ValueError(f"iterations: expected an integer >= 1, got {self.iterations!r}.")

    def posterior(self, prior, observations, emissions, key, gaps=None):
        if not isinstance(prior, RatePosterior):
            raise ValueError(
                f"posterior: MomentMatchedGamma updates a RatePosterior, got "
                f"{type(prior).__name__}."
            )

        def step(current: RatePosterior, _):
            stats = panel_expected_statistics(
                current.mean(), observations, emissions=emissions, solver=self.solver
            )
            return prior.update(pooled_node_statistics(stats, prior.parents, observations)), None

        out, _ = jax.lax.scan(step, prior, None, length=self.iterations)
        return eqx.tree_at(lambda p: (p.alpha, p.beta), prior, (out.alpha, out.beta))


class SampledGammaMixture(AbstractPanelRateFamily):
    r"""The posterior as a mixture of Gammas, Rao-Blackwellised over exact posterior draws of
    the rates and of the hidden paths (module page).

    1. **Rates.** `num_chains` chains of the No-U-Turn sampler (blackjax's NUTS, step size and
       diagonal mass matrix tuned by its window adaptation over `burn_in` steps) on the
       log-rates $\theta=\ln\Lambda$, with the exact log posterior
       $\ln p(\Lambda)+\sum_r\ln p(Y_r\mid\Lambda)+\sum\theta$ (the prior's Gammas, or their
       mixture; the panel likelihood of [`jaxctbn.panel.panel_log_likelihood`][], conditional
       on each trajectory's first observation; the Jacobian of the logarithm), differentiated by
       autodiff; `num_draws` retained draws per chain.
    2. **Paths.** For each retained draw $\Lambda_c$, every trajectory's hidden path
       $S_c\sim p(S\mid Y,\Lambda_c)$ exactly ([`jaxctbn.internal.sample_path_statistics`][];
       with a mixture prior also its component $j\sim p(j\mid\Lambda_c)$), giving the component
       $\mathrm{Gam}(\alpha_j+M(S_c),\beta_j+T(S_c))$. Since $(\Lambda_c,S_c)$ are draws of the
       joint posterior, $\frac1C\sum_c p(\Lambda\mid S_c,Y)$ converges to $p(\Lambda\mid Y)$.

    The result is a [`jaxctbn.GammaMixturePosterior`][] of equal-weight components, one per
    retained draw, each chain's draws thinned evenly so that there are at most
    `max_components` (a path draw costs a forward-backward pass over every trajectory, so on
    large data they dominate; the mixture stays exact in the limit), whose `diagnostics` hold the
    split-$\hat R$ and effective sample size of all the log-rate draws and the number of
    divergent transitions. (A data-augmentation
    Gibbs sampler, alternating paths | rates and rates | paths, has the same stationary law but
    mixes slowly where the visits are sparse: effective sample size 71 of 4,000 draws with
    visits at 2.3 mixing times, where NUTS on the marginal gave ~800 of 4,000 on the same
    data.)

    Chains start from independent draws of the moment-matched posterior
    ([`jaxctbn.panel.MomentMatchedGamma`][], `start_iterations` steps). `max_candidates` bounds one bridge's uniformisation times at first: called eagerly, the verb redoes the update with it doubled when a path needs more (up to 1,024; under `jit` an error names it); `solver`
    propagates the filter (default: the dense matrix exponential). All chains run in one
    program (`vmap`); the verb warns on the host when the largest split $\hat R$ exceeds
    `max_r_hat`, the smallest effective sample size falls below `min_ess`, or a transition
    diverged, naming the setting to raise.

    `batching` (keyword-only): how the chains run, a [`jaxctbn.Vmap`][],
    [`jaxctbn.Chunked`][] or [`jaxctbn.Sharded`][] (chains across devices). Default `None`: all
    at once (`Vmap()`) on an accelerator, one after another on the CPU, where vectorised chains
    wait for the deepest trajectory of any of them at every draw (cav, 4 chains: 1.8x the
    time). The chains are independent, each with its own key: the same draws either way, up to
    rounding."""

    num_draws: int = eqx.field(default=500, static=True)
    num_chains: int = eqx.field(default=4, static=True)
    burn_in: int = eqx.field(default=300, static=True)
    start_iterations: int = eqx.field(default=10, static=True)
    max_candidates: int = eqx.field(default=64, static=True)
    max_components: int = eqx.field(default=1000, static=True)
    max_r_hat: float = eqx.field(default=1.01, static=True)
    min_ess: float = eqx.field(default=100.0, static=True)
    solver: AbstractMasterEquationSolver = DENSE_SOLVER
    batching: AbstractBatching | None = eqx.field(default=None, kw_only=True)

    def __check_init__(self):
        if self.batching is not None and not isinstance(self.batching, AbstractBatching):
            raise ValueError(
                f"batching: expected Vmap(), Chunked(size), Sharded() or None, got "
                f"{type(self.batching).__name__}."
            )
        check_integer_fields(
            self,
            num_draws=4,
            num_chains=1,
            max_components=1,
            burn_in=1,
            start_iterations=1,
            max_candidates=1,
        )

    def initial(self, prior: RatePosterior) -> GammaMixturePosterior:
        per_chain = min(self.num_draws, max(1, self.max_components // self.num_chains))
        return copies(prior, self.num_chains * per_chain)

    def posterior(self, prior, observations, emissions, key, gaps=None):
        import blackjax  # on demand: importing it runs JAX operations (backend set-up first)

        if key is None:
            raise ValueError(
                "key: SampledGammaMixture draws rates and paths; pass a PRNG key (or "
                "family=MomentMatchedGamma() for the deterministic approximation)."
            )
        mixture = (
            GammaMixturePosterior.from_gamma(prior) if isinstance(prior, RatePosterior) else prior
        )
        start = MomentMatchedGamma(self.start_iterations, self.solver).posterior(
            mixture.component(jnp.argmax(mixture.log_weights)), observations, emissions, None
        )
        key_start, key_chains, key_paths = jr.split(key, 3)
        free = tuple(off_diagonal_entries(f) for f in mixture.free_rates())
        # the chains run on z = (theta - centre) / scale, centre and scale the log-rates' mean
        # and (twice the) s.d. under the moment-matched Gamma: a linear change of variables
        # (constant Jacobian, the same posterior) under which the sampler's unit starting mass
        # matrix and step size already fit, so the adaptation starts close
        centre, scale = _log_rate_moments(start, free)
        starts = jax.vmap(
            lambda k: jax.tree_util.tree_map(
                lambda t, c, s: (t - c) / s, _log_rates(start.sample(k), free), centre, scale
            )
        )(jr.split(key_start, self.num_chains))

        log_span = jnp.log(_time_span(observations))

        def log_density(z):
            theta = jax.tree_util.tree_map(lambda z, c, s: c + s * z, z, centre, scale)
            # a trial step far out (rates beyond e^{+-30}, or a rate whose product with the
            # data's time span exceeds 1e9, where the transition matrices are not finite) is
            # rejected, never computed with
            largest = jnp.max(
                jnp.stack([jnp.max(jnp.where(jnp.isnan(t), jnp.inf, t)) for t in theta])
            )
            outside = jnp.any(jnp.stack([jnp.any(~(jnp.abs(t) <= _LOG_RATE_BOUND)) for t in theta]))
            outside = outside | ~(largest + log_span <= _LOG_RATE_TIMES_SPAN_BOUND)
            theta = jax.tree_util.tree_map(lambda t: jnp.where(outside, 0.0, t), theta)
            likelihood = _log_likelihood_or_minus_infinity(
                _model(mixture, theta), observations, emissions, self.solver, gaps
            )
            value = likelihood + jax.nn.logsumexp(_log_prior(mixture, theta))
            return jnp.where(outside, -jnp.inf, value)

        def chain(position, key):
            key_warm, key_draws = jr.split(key)
            warmup = blackjax.window_adaptation(blackjax.nuts, log_density)
            run = warmup.run  # typed by blackjax without its num_steps argument
            (state, parameters), _ = run(key_warm, position, self.burn_in)  # pyright: ignore
            kernel = blackjax.nuts(log_density, **parameters)

            def step(state, key):
                state, info = kernel.step(key, state)
                # blackjax's generic State and Info types do not name their fields
                return state, (state.position, info.is_divergent)  # pyright: ignore

            _, out = jax.lax.scan(step, state, jr.split(key_draws, self.num_draws))
            return out

        chains = (starts, jr.split(key_chains, self.num_chains))
        if self.batching is not None:
            positions, divergent = self.batching.map(lambda xs: chain(*xs), chains)
        elif jax.default_backend() == "cpu":
            positions, divergent = jax.lax.map(lambda xs: chain(*xs), chains)
        else:
            positions, divergent = jax.vmap(chain)(*chains)
        positions = jax.tree_util.tree_map(lambda z, c, s: c + s * z, positions, centre, scale)
        # every chain's draws, thinned evenly to at most `max_components` for the path draws
        per_chain = min(self.num_draws, max(1, self.max_components // self.num_chains))
        kept = np.linspace(0, self.num_draws - 1, per_chain).round().astype(np.int32)
        total = self.num_chains * per_chain
        flat = jax.tree_util.tree_map(lambda x: x[:, kept].reshape(total, *x.shape[2:]), positions)

        def component(inputs):
            theta, key = inputs
            key_component, key_path = jr.split(key)
            j = jr.categorical(key_component, _log_prior(mixture, theta))
            updated, _ = _updated_by_sampled_paths(
                self, mixture, j, _model(mixture, theta), observations, emissions, key_path, gaps
            )
            return updated.alpha, updated.beta

        alphas, betas = jax.lax.map(component, (flat, jr.split(key_paths, total)), batch_size=64)
        rates = tuple(
            with_zero_diagonal(jnp.where(f, jnp.exp(t), 0.0)) for t, f in zip(positions, free)
        )
        return GammaMixturePosterior(
            alpha=alphas,
            beta=betas,
            log_weights=jnp.full((total,), -math.log(total), alphas[0].dtype),
            names=mixture.names,
            cardinalities=mixture.cardinalities,
            parents=mixture.parents,
            free=mixture.free,
            diagnostics=ChainDiagnostics.from_draws(rates, divergent.sum(), mixture.free),
        )


class ParticleFilter(AbstractPanelRateFamily):
    r"""Sequential Monte Carlo over the hidden paths with Rao-Blackwellised Gamma particles
    (Storvik's filter): the posterior of a sequence of experiments, updated one experiment (one
    batch of panel trajectories $Y_k$) at a time, exact as `num_particles` grows. The family
    of the sequential loop ([`jaxctbn.ParameterLearningTask`][] with a panel outcome).

    Particle $c$ holds the complete-path statistics of one draw of every earlier experiment's
    hidden paths, i.e. the Gamma component $\mathrm{Gam}(lpha+M_c,eta+T_c)=p(\Lambda\mid
    S^c_{1:k-1})$, and a weight $w_c$. An update with $Y_k$, per particle:

    1. $\Lambda^*_c\sim p(\Lambda\mid S^c_{1:k-1})$ (its Gamma component);
    2. the new paths $S^c_k\sim p(S_k\mid Y_k,\Lambda^*_c)$ exactly (forward filtering,
       backward sampling, bridges: [`jaxctbn.internal.sample_path_statistics`][]), added to the
       component's statistics;
    3. $w_c\leftarrow w_c\,p(Y_k\mid\Lambda^*_c)$, the exact panel likelihood (conditional on
       each trajectory's first observation).

    With the extended target $p(S_{1:k}\mid Y_{1:k})\,p(\Lambda^*\mid S_{1:k})$ the
    incremental weight of this proposal is exactly $p(Y_k\mid\Lambda^*_c)$, so
    $\sum_cw_c\,p(\Lambda\mid S^c_{1:k})	o p(\Lambda\mid Y_{1:k})$: a
    [`jaxctbn.GammaMixturePosterior`][] of `num_particles` components. When the effective
    number of particles $1/\sum_cw_c^2$ falls below `resample_below` $	imes$ `num_particles`,
    the particles are resampled (systematic resampling) to equal weights. Earlier experiments'
    paths are not redrawn, so over many experiments the particles share their early paths;
    each particle's Gamma still carries the uncertainty given its paths. The weights'
    degeneracy over one update grows with the information in $Y_k$: meant for one experiment
    at a time (use [`jaxctbn.panel.SampledGammaMixture`][] for a whole data set).

    `max_candidates` bounds one bridge's uniformisation times at first: called eagerly, the verb redoes the update with it doubled when a path needs more (up to 1,024; under `jit` an error names it);
    `solver` propagates the filter (default: the dense matrix exponential). A prior that is a
    mixture of another number of components is first resampled to `num_particles`."""

    num_particles: int = eqx.field(default=256, static=True)
    resample_below: float = eqx.field(default=0.5, static=True)
    max_candidates: int = eqx.field(default=64, static=True)
    solver: AbstractMasterEquationSolver = DENSE_SOLVER

    def __check_init__(self):
        check_integer_fields(self, num_particles=1, max_candidates=1)
        if isinstance(self.resample_below, bool) or not 0 <= self.resample_below <= 1:
            raise ValueError(
                f"resample_below: expected a fraction in [0, 1], got {self.resample_below!r}."
            )

    def initial(self, prior: RatePosterior) -> GammaMixturePosterior:
        return copies(prior, self.num_particles)

    def posterior(self, prior, observations, emissions, key, gaps=None):
        if key is None:
            raise ValueError(
                "key: ParticleFilter draws rates and paths; pass a PRNG key (or "
                "family=MomentMatchedGamma() for the deterministic approximation)."
            )
        P = self.num_particles
        key_prior, key_particles, key_resample = jr.split(key, 3)
        if isinstance(prior, RatePosterior):
            mixture = self.initial(prior)
        elif prior.num_components != P:
            mixture = _resampled(prior, systematic_indices(key_prior, prior.log_weights, P))
        else:
            mixture = prior

        def particle(c, key):
            key_rates, key_paths = jr.split(key)
            model = mixture.component_sample(c, key_rates)
            updated, stats = _updated_by_sampled_paths(
                self, mixture, c, model, observations, emissions, key_paths, gaps
            )
            return updated.alpha, updated.beta, stats.log_likelihood.sum()

        alphas, betas, log_likelihood = jax.vmap(particle)(
            jnp.arange(P), jr.split(key_particles, P)
        )
        index, log_weights = reweighted_ancestors(
            key_resample, mixture.log_weights, log_likelihood, self.resample_below
        )
        updated = eqx.tree_at(lambda m: (m.alpha, m.beta), mixture, (alphas, betas))
        out = _resampled(updated, index)
        return eqx.tree_at(lambda m: m.log_weights, out, log_weights)


def _updated_by_sampled_paths(family, mixture, j, model, observations, emissions, key, gaps):
    """Component `j` of `mixture` updated with the statistics of one exact draw of the hidden
    paths given the rates of `model` (the family's `solver` and `max_candidates`), and the
    draw's statistics (with each trajectory's panel log-likelihood under `model`)."""
    stats = _sampled_statistics(
        model, observations, emissions, key, family.solver, family.max_candidates, gaps
    )
    updated = mixture.component(j).update(
        pooled_node_statistics(stats, mixture.parents, observations)
    )
    return updated, stats


def copies(prior: RatePosterior, count: int) -> GammaMixturePosterior:
    """The mixture of `count` equally weighted copies of the Gamma posterior `prior`."""
    one = GammaMixturePosterior.from_gamma(prior)
    return eqx.tree_at(
        lambda m: (m.alpha, m.beta, m.log_weights),
        one,
        (
            tuple(jnp.repeat(a, count, axis=0) for a in one.alpha),
            tuple(jnp.repeat(b, count, axis=0) for b in one.beta),
            jnp.full((count,), -math.log(count), one.log_weights.dtype),
        ),
    )


def _resampled(mixture: GammaMixturePosterior, index: Array) -> GammaMixturePosterior:
    """The components at `index`, equally weighted (no chain diagnostics)."""
    count = index.shape[0]
    return GammaMixturePosterior(
        alpha=tuple(a[index] for a in mixture.alpha),
        beta=tuple(b[index] for b in mixture.beta),
        log_weights=jnp.full((count,), -math.log(count), mixture.log_weights.dtype),
        names=mixture.names,
        cardinalities=mixture.cardinalities,
        parents=mixture.parents,
        free=mixture.free,
    )


#: log-rates beyond this bound are outside the sampler's support (rates e^{+-30})
_LOG_RATE_BOUND = 30.0
#: and so are rates whose product with the data's time span exceeds 1e9 (the chain equilibrates
#: in a billionth of the span: no posterior mass under any proper prior the data leave alone)
_LOG_RATE_TIMES_SPAN_BOUND = math.log(1e9)


def _time_span(observations: PanelObservations | PanelBuckets) -> Array:
    """An upper bound on every gap between two observations: the largest observation time
    minus the smallest (padding slots repeat a trajectory's times or are 0; at least 1e-300)."""
    buckets = as_flat_buckets(observations)
    times = [jnp.where(jnp.isfinite(b.times), b.times, 0.0) for b in buckets]
    top = jnp.max(jnp.stack([t.max() for t in times]))
    bottom = jnp.min(jnp.stack([jnp.minimum(t.min(), 0.0) for t in times]))
    return jnp.maximum(top - bottom, 1e-300)


def _log_likelihood_or_minus_infinity(model, observations, emissions, solver, gaps) -> Array:
    """The panel log-likelihood of all trajectories (as `panel_log_likelihood`; with `gaps`,
    one transition matrix per distinct gap), $-\\infty$ where an observation is impossible or
    the filter not finite: a proposal the sampler rejects, not an error (the data were checked
    possible at the start)."""
    if gaps is not None:
        bads, log_likelihood = _pooled_by_gaps(
            model, observations, emissions, None, gaps, "likelihood"
        )
        total = cast(Array, log_likelihood).sum()
        impossible = jnp.any(jnp.stack([jnp.any(b) for b in bads]))
    else:
        total, impossible = jnp.asarray(0.0), jnp.asarray(False)
        for bucket in as_flat_buckets(observations):
            bad, log_likelihood = _compute(
                model, bucket, emissions, None, solver, "likelihood", None
            )
            total = total + cast(Array, log_likelihood).sum()
            impossible = impossible | jnp.any(bad)
    impossible = impossible | ~jnp.isfinite(total)
    return jnp.where(impossible, -jnp.inf, total)


def _log_rates(model, free: tuple[Array, ...]) -> tuple[Array, ...]:
    """The off-diagonal log-rates of `model`, per node `(configs, k - 1, k)` (0 at the
    coordinates of structural zeros, which carry a standard normal and no rate)."""
    return tuple(
        jnp.where(f, jnp.log(jnp.where(f, off_diagonal_entries(c), 1.0)), 0.0)
        for c, f in zip(model.cims, free)
    )


def _log_rate_moments(
    posterior: RatePosterior, free: tuple[Array, ...]
) -> tuple[tuple[Array, ...], tuple[Array, ...]]:
    r"""Per node `(configs, k - 1, k)`: the mean $\psi(\alpha)-\ln\beta$ and twice the s.d.
    $\sqrt{\psi_1(\alpha)}$ of the log-rates under the Gammas of `posterior` (0 and 1 at
    structural zeros)."""
    centres, scales = [], []
    for a, b, f in zip(posterior.alpha, posterior.beta, free):
        k = a.shape[-1]
        a = jnp.where(f, off_diagonal_entries(a), 1.0)
        b = jnp.where(f, off_diagonal_entries(jnp.broadcast_to(b[..., None], b.shape + (k,))), 1.0)
        centres.append(jnp.where(f, digamma(a) - jnp.log(b), 0.0))
        scales.append(jnp.where(f, 2.0 * jnp.sqrt(polygamma(1, a)), 1.0))
    return tuple(centres), tuple(scales)


def _model(mixture: GammaMixturePosterior, theta: tuple[Array, ...]) -> CTBN:
    """The CTBN whose free off-diagonal rates are $e^\\theta$ (structural zeros 0)."""
    cims = [
        with_zero_diagonal(jnp.where(off_diagonal_entries(f), jnp.exp(t), 0.0))
        for t, f in zip(theta, mixture.free_rates())
    ]
    return CTBN(cims=cims, parents=mixture.parents, names=mixture.names)


def _log_prior(mixture: GammaMixturePosterior, theta: tuple[Array, ...]) -> Array:
    r"""Per component $j$, $\ln w_j+\sum\ln\mathrm{Gam}(e^\theta\mid\alpha_j,\beta_j)+\sum\theta$
    over the free rates: the log density of the log-rates under the component (logsumexp for
    the mixture's). The coordinates of structural zeros get a standard normal (a proper
    density that moves nothing: their rates are 0)."""
    total = mixture.log_weights
    for a, b, t, f in zip(mixture.alpha, mixture.beta, theta, mixture.free_rates()):
        k = a.shape[-1]
        keep = off_diagonal_entries(f)
        a = jnp.where(keep, off_diagonal_entries(a), 1.0)
        b = jnp.where(
            keep, off_diagonal_entries(jnp.broadcast_to(b[..., None], b.shape + (k,))), 1.0
        )
        terms = a * jnp.log(b) - gammaln(a) + a * t[None] - b * jnp.exp(t)[None]
        terms = jnp.where(keep, terms, -0.5 * t[None] ** 2)
        total = total + terms.reshape(terms.shape[0], -1).sum(1)
    return total


def _sampled_statistics(model, observations, emissions, key, solver, max_candidates, gaps):
    """`sample_path_statistics` of a flat batch or of every bucket (gathered in the given
    order); with `gaps`, each interval's transition matrix from its gap's."""
    propagators: list[tuple[Array, Array] | None] = [None] * len(as_flat_buckets(observations))
    if gaps is not None:
        W = amalgamate(model.checked()).dense()
        table = MatrixExponential._checked(
            (gap_transition_matrices(W, jnp.asarray(gaps.gaps, W.dtype)),)
        )[0]
        propagators = [(table, jnp.asarray(index)) for index in gaps.index]
    buckets = as_flat_buckets(observations)
    parts = [
        sample_path_statistics(
            model,
            bucket,
            key=k,
            solver=solver,
            emissions=emissions,
            max_candidates=max_candidates,
            propagators=p,
        )
        for bucket, k, p in zip(buckets, jr.split(key, len(buckets)), propagators)
    ]
    if isinstance(observations, PanelObservations):
        return parts[0]
    dwell, transitions, log_likelihood = observations.gather(
        [(p.dwell_times, p.transitions, p.log_likelihood) for p in parts]
    )
    return PanelExpectedStatistics(
        dwell_times=dwell,
        transitions=transitions,
        log_likelihood=log_likelihood,
        model=parts[0].model,
    )


DEFAULT_FAMILY = SampledGammaMixture()


@overload
def panel_rate_posterior(
    posterior: RatePosterior | GammaMixturePosterior,
    observations: PanelObservations | PanelBuckets,
    *,
    family: MomentMatchedGamma,
    key: PRNGKeyArray | None = None,
    emissions: Emissions | None = None,
) -> RatePosterior: ...


@overload
def panel_rate_posterior(
    posterior: RatePosterior | GammaMixturePosterior,
    observations: PanelObservations | PanelBuckets,
    *,
    family: SampledGammaMixture | ParticleFilter = ...,
    key: PRNGKeyArray | None = None,
    emissions: Emissions | None = None,
) -> GammaMixturePosterior: ...


@overload
def panel_rate_posterior(
    posterior: RatePosterior | GammaMixturePosterior,
    observations: PanelObservations | PanelBuckets,
    *,
    family: AbstractPanelRateFamily,
    key: PRNGKeyArray | None = None,
    emissions: Emissions | None = None,
) -> RatePosterior | GammaMixturePosterior: ...


def panel_rate_posterior(
    posterior: RatePosterior | GammaMixturePosterior,
    observations: PanelObservations | PanelBuckets,
    *,
    family: AbstractPanelRateFamily = DEFAULT_FAMILY,
    key: PRNGKeyArray | None = None,
    emissions: Emissions | None = None,
) -> RatePosterior | GammaMixturePosterior:
    r"""`posterior` updated with panel trajectories (a flat batch, or buckets), in the posterior
    `family` (module page): by default [`jaxctbn.panel.SampledGammaMixture`][], exact as its
    sweeps grow, which needs `key`; [`jaxctbn.panel.ParticleFilter`][] for one experiment at a
    time after earlier ones (sequential Monte Carlo, exact as its particles grow; needs `key`);
    [`jaxctbn.panel.MomentMatchedGamma`][] for the fast moment-matched Gamma (overconfident
    where the visits are sparse). Node $n$ learns only
    from the trajectories in which it is not perfectly intervened on; an imperfect
    intervention's scale counts as exposure.

    **Arguments:**

    - `posterior`: the prior, a [`jaxctbn.RatePosterior`][] (or, for the sampled family, a
      [`jaxctbn.GammaMixturePosterior`][], e.g. an earlier result).
    - `observations`: [`jaxctbn.panel.PanelObservations`][] (a flat batch) or
      [`jaxctbn.panel.PanelBuckets`][]; exact entry times, missing nodes and interventions
      (perfect and imperfect, per trajectory) are supported by both families.
    - `family`, `key`: see above.
    - `emissions`: optional [`jaxctbn.panel.Emissions`][] (misclassification), both families.

    **Returns:** a [`jaxctbn.RatePosterior`][] (moment-matched) or a
    [`jaxctbn.GammaMixturePosterior`][] (sampled; with its chains' `diagnostics`).

    Pure; works under `jit` (the family is static). Called eagerly with the sampled family it
    warns when the chains' diagnostics fail the family's thresholds."""
    if not isinstance(posterior, RatePosterior | GammaMixturePosterior):
        raise ValueError(
            f"posterior: expected a RatePosterior or GammaMixturePosterior, got "
            f"{type(posterior).__name__}."
        )
    if not isinstance(family, AbstractPanelRateFamily):
        raise ValueError(
            f"family: expected a SampledGammaMixture, ParticleFilter or MomentMatchedGamma, got "
            f"{type(family).__name__}."
        )
    checked_panel_update(observations, 1, len(posterior.alpha))
    # equal gaps share one transition matrix (host-side grouping; not with interventions,
    # whose generators differ per trajectory, nor for traced observations)
    gaps = gap_groups(observations) if observations.intervention is None else None

    def run(family):
        return _posterior(family, posterior, observations, emissions, key, gaps)

    if isinstance(family, SampledGammaMixture | ParticleFilter):
        out, _ = with_candidate_growth(run, family, inputs=(posterior, observations, key))
    else:
        out = run(family)
    if isinstance(out, GammaMixturePosterior) and isinstance(family, SampledGammaMixture):
        warn_unconverged(out.diagnostics, family)
    return out


@eqx.filter_jit
def _posterior(family, posterior, observations, emissions, key, gaps):
    return family.posterior(posterior, observations, emissions, key, gaps)


@runtime_checkable
class _ConvergenceThresholds(Protocol):
    """A sampled family's convergence thresholds (`SampledGammaMixture`, `SampledStructure`)."""

    max_r_hat: float
    min_ess: float


def warn_unconverged(
    diagnostics: ChainDiagnostics | StructureChainDiagnostics | None,
    family: _ConvergenceThresholds,
) -> None:
    """A `RuntimeWarning` naming the setting to raise when concrete diagnostics fail the
    family's thresholds `max_r_hat`, `min_ess` (and, for Hamiltonian chains, any divergent
    transition); nothing under `jit`. Shared by the rate and the structure samplers."""
    if diagnostics is None:
        return
    r_hat = diagnostics.max_split_r_hat()
    ess = diagnostics.min_effective_sample_size()
    if not is_concrete(r_hat, ess):
        return
    r_hat, ess = float(r_hat), float(ess)
    hamiltonian = isinstance(diagnostics, ChainDiagnostics)
    divergent = int(diagnostics.divergent_transitions) if hamiltonian else 0
    if r_hat > family.max_r_hat or ess < family.min_ess or divergent > 0:
        if hamiltonian:
            what, of = "panel rate posterior", "R-hat"
            tail = f"; {divergent} divergent transitions); raise num_draws"
        else:
            what, of = "panel structure posterior", "R-hat of the edge marginals"
            tail = "); raise num_sweeps"
        warnings.warn(
            f"{what}: the chains may not have converged (largest split {of} {r_hat:.3f}, "
            f"limit {family.max_r_hat}; smallest effective sample size {ess:.0f}, limit "
            f"{family.min_ess:g}{tail} (and burn_in) of {type(family).__name__}.",
            RuntimeWarning,
            stacklevel=3,
        )
