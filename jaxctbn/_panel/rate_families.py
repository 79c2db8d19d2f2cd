r"""The posterior families of [`jaxctbn.panel.panel_rate_posterior`][] as Modules
([`jaxctbn.panel.AbstractPanelRateFamily`][]): the moment-matched Gamma, the sampled mixture of
Gammas and the particle filter, with the pooling of panel statistics per node they share."""

from __future__ import annotations

import abc
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, PRNGKeyArray

from .._batching import AbstractBatching
from .._learning.conjugate import off_diagonal_entries, with_zero_diagonal
from .._learning.gamma_mixture import ChainDiagnostics, GammaMixturePosterior
from .._learning.posterior import RatePosterior
from .._learning.resampling import reweighted_ancestors, systematic_indices
from .._master_equation import AbstractMasterEquationSolver
from .._model.interventions import exposure_scale
from .._paths.sufficient_statistics import NodeStatistics
from .buckets import PanelBuckets
from .e_step import DENSE_SOLVER
from .expected_statistics import PanelExpectedStatistics
from .gap_groups import GapGroups
from .inference import panel_expected_statistics
from .observations import Emissions, PanelObservations
from .rate_sampling import (
    LOG_RATE_BOUND,
    LOG_RATE_TIMES_SPAN_BOUND,
    log_likelihood_or_minus_infinity,
    log_prior,
    log_rate_model,
    log_rate_moments,
    log_rates,
    sampled_statistics,
    time_span,
)
from .update_checks import check_integer_fields

# panel gaps are long relative to the rates: the dense exponential has no limit on a gap


def pooled_node_statistics(
    statistics: PanelExpectedStatistics,
    parents: tuple[tuple[int, ...], ...],
    observations: PanelObservations | PanelBuckets,
) -> list[NodeStatistics]:
    """Per node, the statistics of a batch of panel trajectories (`statistics` with one leading
    trajectory axis, in the given order) on the graph `parents`, pooled: summed over the
    trajectories in which the node was not perfectly intervened on, the dwell times of a node
    whose rates an imperfect intervention scales by $s$ counted as the exposure $sT$
    (`exposure_scale`)."""
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
       $S_c\sim p(S\mid Y,\Lambda_c)$ exactly (`sample_path_statistics`;
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
        centre, scale = log_rate_moments(start, free)
        starts = jax.vmap(
            lambda k: jax.tree_util.tree_map(
                lambda t, c, s: (t - c) / s, log_rates(start.sample(k), free), centre, scale
            )
        )(jr.split(key_start, self.num_chains))

        log_span = jnp.log(time_span(observations))

        def log_density(z):
            theta = jax.tree_util.tree_map(lambda z, c, s: c + s * z, z, centre, scale)
            # a trial step far out (rates beyond e^{+-30}, or a rate whose product with the
            # data's time span exceeds 1e9, where the transition matrices are not finite) is
            # rejected, never computed with
            largest = jnp.max(
                jnp.stack([jnp.max(jnp.where(jnp.isnan(t), jnp.inf, t)) for t in theta])
            )
            outside = jnp.any(jnp.stack([jnp.any(~(jnp.abs(t) <= LOG_RATE_BOUND)) for t in theta]))
            outside = outside | ~(largest + log_span <= LOG_RATE_TIMES_SPAN_BOUND)
            theta = jax.tree_util.tree_map(lambda t: jnp.where(outside, 0.0, t), theta)
            likelihood = log_likelihood_or_minus_infinity(
                log_rate_model(mixture, theta), observations, emissions, self.solver, gaps
            )
            value = likelihood + jax.nn.logsumexp(log_prior(mixture, theta))
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
            j = jr.categorical(key_component, log_prior(mixture, theta))
            updated, _ = _updated_by_sampled_paths(
                self,
                mixture,
                j,
                log_rate_model(mixture, theta),
                observations,
                emissions,
                key_path,
                gaps,
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
       backward sampling, bridges: `sample_path_statistics`), added to the
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
    stats = sampled_statistics(
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
