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

from typing import overload

import equinox as eqx
from jaxtyping import PRNGKeyArray

from .._learning.gamma_mixture import GammaMixturePosterior
from .._learning.posterior import RatePosterior
from .buckets import PanelBuckets
from .gap_groups import gap_groups
from .observations import Emissions, PanelObservations
from .path_statistics import with_candidate_growth
from .rate_families import (
    AbstractPanelRateFamily,
    MomentMatchedGamma,
    ParticleFilter,
    SampledGammaMixture,
)
from .update_checks import checked_panel_update, warn_unconverged

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
