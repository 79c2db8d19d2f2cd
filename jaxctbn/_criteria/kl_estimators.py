r"""Estimators of the structure criteria's divergences $a_n(P')$ (maths §5), as Modules passed to
[`jaxctbn.VBHC`][] and [`jaxctbn.BHC`][] (`estimator=`).

- [`jaxctbn.PlugIn`][] (default): the paper's first-order form, the predictive log-likelihood
  $\ell_n$ evaluated at the *expected* statistics from one master-equation solve per posterior
  draw. Cheap; biased because $\ell_n$ is convex in the statistics (can even be negative).
- [`jaxctbn.MonteCarlo`][]: $\ell_n$ averaged over `num_paths` sampled paths per draw; unbiased
  up to Monte Carlo error.

With a **panel** outcome (maths §7) the structure divergences are panel KLs between drawn graphs:
with `PlugIn()` each graph at its posterior-mean rates (no rate noise; an approximation), with
[`jaxctbn.RateCoupling`][] averaged over coupled rate draws (an upper bound on the structure
EIG).

For the parameter criteria the divergence is linear in the expected statistics, so it is exact
and takes no estimator.
"""

from __future__ import annotations

import equinox as eqx


class AbstractKLEstimator(eqx.Module):
    """How the structure criteria estimate the expected predictive log-likelihood ratio."""


class PlugIn(AbstractKLEstimator):
    """The predictive log-likelihood at the expected statistics (the paper's approximation);
    with a panel outcome, each drawn graph at its posterior-mean rates."""


class RateCoupling(AbstractKLEstimator):
    """Panel outcomes, structure learning: the panel KL of each drawn graph against each
    alternative averaged over rate draws coupled node by node (a node whose parents are the
    same keeps its rates), which bounds the structure EIG from above (maths §7). Looser than
    `PlugIn()` in practice (benchmarks: `panel_structure_variants.md`)."""


class MonteCarlo(AbstractKLEstimator):
    """The predictive log-likelihood averaged over `num_paths` sampled paths per posterior draw
    (at most `max_events` jumps each; an overflowing path raises an error)."""

    num_paths: int = eqx.field(default=10, static=True)
    max_events: int = eqx.field(default=256, static=True)

    def __check_init__(self):
        if self.num_paths < 1 or self.max_events < 1:
            raise ValueError(
                f"MonteCarlo: num_paths and max_events must be >= 1, got {self.num_paths}, "
                f"{self.max_events}."
            )
