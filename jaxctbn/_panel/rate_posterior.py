r"""Rate posteriors from panel data, by a choice of posterior family
([`jaxctbn.panel.AbstractPanelRateFamily`][]): exact in the limit by default, or the fast
moment-matched Gamma.

With complete paths the Gamma posterior is exact: $\bar\alpha=\alpha+M$, $\bar\beta=\beta+T$.
A panel gives no counts, and $p(\Lambda\mid Y)\propto p(\Lambda)\,p(Y\mid\Lambda)$ is not a Gamma.

- [`jaxctbn.panel.SampledGammaMixture`][] (the default): data-augmentation Gibbs sampling of
  the hidden paths and the rates (paths | rates, $Y$ exactly by forward filtering, backward
  sampling and bridges; rates | paths conjugately), Rao-Blackwellised into a mixture of
  Gammas, one $\mathrm{Gam}(\alpha+M(S_c),\beta+T(S_c))$ per retained sweep
  ([`jaxctbn.GammaMixturePosterior`][]). Exact as the sweeps grow; its chains' split-$\hat R$
  and effective sample sizes are reported with it.
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

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, Bool, PRNGKeyArray

from .._learning.gamma_mixture import ChainDiagnostics, GammaMixturePosterior
from .._learning.posterior import RatePosterior
from .._master_equation.solvers import AbstractMasterEquationSolver, MatrixExponential
from .._model.interventions import exposure_scale, is_concrete
from .._paths.sufficient_statistics import NodeStatistics
from .buckets import PanelBuckets, as_flat_buckets
from .inference import PanelExpectedStatistics, panel_expected_statistics
from .observations import Emissions, PanelObservations
from .path_statistics import sample_path_statistics

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
        M = jnp.einsum("r,r...->...", keep, statistics.node_transitions(n, parents[n]))
        T = jnp.einsum("r,r...->...", exposure, statistics.node_dwell_times(n, parents[n]))
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
    ) -> RatePosterior | GammaMixturePosterior:
        """`prior` updated with `observations` (checked by the verb)."""


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

    def posterior(self, prior, observations, emissions, key):
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
    r"""The posterior as a mixture of Gammas Rao-Blackwellised over a data-augmentation Gibbs
    sampler (module page): `num_chains` chains, each `burn_in` sweeps then `num_draws` retained
    sweeps; a sweep draws every trajectory's hidden path given the rates and $Y$ exactly
    ([`jaxctbn.internal.sample_path_statistics`][]), then the rates given the paths from their
    conjugate posterior. With a mixture prior the component is drawn too (its weight times the
    marginal likelihood of the paths' statistics). Each retained sweep adds the component
    $\mathrm{Gam}(\alpha_c+M,\beta_c+T)$; the result is a [`jaxctbn.GammaMixturePosterior`][]
    of `num_chains * num_draws` equal-weight components whose `diagnostics` hold the split-$\hat
    R$ and effective sample size of the log-rate draws.

    Chains start from independent draws of the moment-matched posterior
    ([`jaxctbn.panel.MomentMatchedGamma`][] with `start_iterations` steps): near the bulk, and
    apart. `max_candidates` bounds the uniformisation times of one bridge (an error names it
    when a path needs more). `solver` propagates the filter (default: the dense matrix
    exponential; [`jaxctbn.Uniformisation`][] is cheaper on larger state spaces).

    All chains run in one program (`vmap`); the verb warns on the host when the largest split
    $\hat R$ exceeds `max_r_hat` or the smallest effective sample size falls below `min_ess`,
    naming the setting to raise."""

    num_draws: int = eqx.field(default=500, static=True)
    num_chains: int = eqx.field(default=4, static=True)
    burn_in: int = eqx.field(default=100, static=True)
    start_iterations: int = eqx.field(default=10, static=True)
    max_candidates: int = eqx.field(default=64, static=True)
    max_r_hat: float = eqx.field(default=1.01, static=True)
    min_ess: float = eqx.field(default=100.0, static=True)
    solver: AbstractMasterEquationSolver = DENSE_SOLVER

    def __check_init__(self):
        for name, least in (
            ("num_draws", 4),
            ("num_chains", 1),
            ("burn_in", 0),
            ("start_iterations", 1),
            ("max_candidates", 1),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name}: expected an integer >= {least}, got {value!r}.")

    def posterior(self, prior, observations, emissions, key):
        if key is None:
            raise ValueError(
                "key: SampledGammaMixture draws paths and rates; pass a PRNG key (or "
                "family=MomentMatchedGamma() for the deterministic approximation)."
            )
        mixture = (
            GammaMixturePosterior.from_gamma(prior) if isinstance(prior, RatePosterior) else prior
        )
        start = MomentMatchedGamma(self.start_iterations, self.solver).posterior(
            mixture.component(jnp.argmax(mixture.log_weights)), observations, emissions, None
        )
        key_start, key_chains = jr.split(key)
        starts = jax.vmap(start.sample)(jr.split(key_start, self.num_chains))
        alphas, betas, draws = jax.vmap(
            lambda model, k: self._chain(mixture, model, observations, emissions, k)
        )(starts, jr.split(key_chains, self.num_chains))
        total = self.num_chains * self.num_draws
        flat = lambda x: x.reshape(total, *x.shape[2:])  # noqa: E731
        return GammaMixturePosterior(
            alpha=tuple(flat(a) for a in alphas),
            beta=tuple(flat(b) for b in betas),
            log_weights=jnp.full((total,), -math.log(total), alphas[0].dtype),
            names=mixture.names,
            cardinalities=mixture.cardinalities,
            parents=mixture.parents,
            diagnostics=ChainDiagnostics.from_draws(draws),
        )

    def _chain(self, prior: GammaMixturePosterior, model, observations, emissions, key):
        """One chain from the rates of `model`: per retained sweep, its component's `(alpha,
        beta)` and its rate draw, each a tuple over nodes with a leading draws axis."""

        def sweep(model, key):
            key_paths, key_component, key_rates = jr.split(key, 3)
            stats = _sampled_statistics(
                model, observations, emissions, key_paths, self.solver, self.max_candidates
            )
            pooled = pooled_node_statistics(stats, prior.parents, observations)
            updated = prior.update(pooled)  # the components given the paths, reweighted
            c = jr.categorical(key_component, updated.log_weights)
            component = updated.component(c)
            new = component.sample(key_rates)
            return new, (component.alpha, component.beta, new.cims)

        keys = jr.split(key, self.burn_in + self.num_draws)
        model, _ = jax.lax.scan(lambda m, k: (sweep(m, k)[0], None), model, keys[: self.burn_in])
        _, (alphas, betas, draws) = jax.lax.scan(sweep, model, keys[self.burn_in :])
        return alphas, betas, draws


def _sampled_statistics(model, observations, emissions, key, solver, max_candidates):
    """`sample_path_statistics` of a flat batch or of every bucket (gathered in the given
    order)."""
    if isinstance(observations, PanelObservations):
        return sample_path_statistics(
            model,
            observations,
            key=key,
            solver=solver,
            emissions=emissions,
            max_candidates=max_candidates,
        )
    parts = [
        sample_path_statistics(
            model, b, key=k, solver=solver, emissions=emissions, max_candidates=max_candidates
        )
        for b, k in zip(observations.buckets, jr.split(key, len(observations.buckets)))
    ]
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
    sweeps grow, which needs `key`; [`jaxctbn.panel.MomentMatchedGamma`][] for the fast
    moment-matched Gamma (overconfident where the visits are sparse). Node $n$ learns only
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
            f"family: expected a SampledGammaMixture or MomentMatchedGamma, got "
            f"{type(family).__name__}."
        )
    checked_panel_update(observations, 1, len(posterior.alpha))
    out = _posterior(family, posterior, observations, emissions, key)
    if isinstance(out, GammaMixturePosterior) and isinstance(family, SampledGammaMixture):
        warn_unconverged(out.diagnostics, family)
    return out


@eqx.filter_jit
def _posterior(family, posterior, observations, emissions, key):
    return family.posterior(posterior, observations, emissions, key)


def warn_unconverged(diagnostics: ChainDiagnostics | None, family: SampledGammaMixture) -> None:
    """A `RuntimeWarning` naming the setting to raise when concrete diagnostics fail the
    family's thresholds (nothing under `jit`)."""
    if diagnostics is None:
        return
    r_hat = diagnostics.max_split_r_hat()
    ess = diagnostics.min_effective_sample_size()
    if not is_concrete(r_hat, ess):
        return
    r_hat, ess = float(r_hat), float(ess)
    if r_hat > family.max_r_hat or ess < family.min_ess:
        warnings.warn(
            f"panel rate posterior: the chains have not converged (largest split R-hat "
            f"{r_hat:.3f} > {family.max_r_hat}, or smallest effective sample size {ess:.0f} < "
            f"{family.min_ess:g}); raise num_draws (and burn_in) of SampledGammaMixture.",
            RuntimeWarning,
            stacklevel=3,
        )
