r"""Rate posteriors from panel data: the Gamma posterior whose counts are the smoothed expected
statistics (the paper's appendix C.2; maths §7).

With complete paths the Gamma posterior is exact: $\bar\alpha=\alpha+M$, $\bar\beta=\beta+T$.
A panel gives no counts, and $p(\Lambda\mid Y)\propto p(\Lambda)\,p(Y\mid\Lambda)$ is not a Gamma.
The approximation replaces $M$ and $T$ by their smoothed expectations under the posterior mean,
$\bar M=\mathsf E[M\mid Y,\hat\Lambda]$ and $\bar T=\mathsf E[T\mid Y,\hat\Lambda]$ with
$\hat\Lambda=\bar\alpha/\bar\beta$, iterated to a fixed point (`iterations` times from the
prior's mean): each step is an EM step for the MAP of a Gamma prior with shape $\alpha+1$, so the
mean converges where EM does. It is exact as the visits become dense (the smoothed statistics
become the path's), and it ignores the uncertainty about the hidden path beyond its
expectation; the tests measure it against importance sampling of the exact posterior.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool

from .._learning.posterior import RatePosterior
from .._master_equation.solvers import AbstractMasterEquationSolver, MatrixExponential
from .._paths.sufficient_statistics import NodeStatistics
from .buckets import PanelBuckets
from .inference import PanelExpectedStatistics, panel_expected_statistics
from .observations import Emissions, PanelObservations

# panel gaps are long relative to the rates: the dense exponential has no limit on a gap
DENSE_SOLVER = MatrixExponential()


def pooled_node_statistics(
    statistics: PanelExpectedStatistics,
    posterior: RatePosterior,
    clamped: Bool[Array, "trajectories nodes"] | None,
) -> list[NodeStatistics]:
    """Per node, the smoothed statistics of a batch of panel trajectories on the posterior's
    graph, summed over the trajectories in which the node was not clamped (pooling)."""
    out = []
    R = statistics.log_likelihood.shape[0]
    for n in range(len(posterior.alpha)):
        where = jnp.ones((R,), bool) if clamped is None else ~clamped[:, n]
        pooled = statistics.sum(where=where)
        parents = posterior.parents[n]
        M = pooled.node_transitions(n, parents)
        k = M.shape[-1]
        out.append(
            NodeStatistics(
                transitions=jnp.where(jnp.eye(k, dtype=bool), 0.0, M),
                dwell_times=pooled.node_dwell_times(n, parents),
            )
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


def panel_rate_posterior(
    posterior: RatePosterior,
    observations: PanelObservations | PanelBuckets,
    *,
    iterations: int = 20,
    emissions: Emissions | None = None,
    solver: AbstractMasterEquationSolver = DENSE_SOLVER,
) -> RatePosterior:
    r"""`posterior` updated with panel trajectories (a flat batch, or buckets): the Gamma whose
    counts are the smoothed expected statistics under its own mean, by `iterations` fixed-point
    steps from the mean of `posterior` (see the module page; an approximation, exact for dense
    visits). Node $n$ learns only from the trajectories in which it is not perfectly
    intervened on. Pure; works under `jit` (`iterations` is static)."""
    if not isinstance(posterior, RatePosterior):
        raise ValueError(f"posterior: expected a RatePosterior, got {type(posterior).__name__}.")
    clamped = checked_panel_update(observations, iterations, len(posterior.alpha))

    def step(current: RatePosterior, _):
        stats = panel_expected_statistics(
            current.mean(), observations, emissions=emissions, solver=solver
        )
        return posterior.update(pooled_node_statistics(stats, posterior, clamped)), None

    out, _ = jax.lax.scan(step, posterior, None, length=iterations)
    return eqx.tree_at(lambda p: (p.alpha, p.beta), posterior, (out.alpha, out.beta))
