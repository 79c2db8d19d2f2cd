r"""Structural EM from panel data, the part every E-step shares: what one run needs
(`StructuralEMProblem`), the M-step, the result (`PanelStructureFit`) and the loop to a fixed
point of the deterministic E-steps (exact forward-backward, the mean field). Each E-step Module
runs its own loop (`AbstractPanelEStep.structural_em`): the deterministic ones through
`iterate_to_fixed_point` here, the sampling ones through `sampled_structural_em.py`.
[`jaxctbn.panel.learn_structure_from_panels`][] checks the arguments and builds the problem."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .._learning.priors import AbstractPrior
from .._learning.structure_posterior import StructurePosterior
from .._model.ctbn import AbstractCTBN
from .buckets import PanelBuckets
from .observations import Emissions, PanelObservations


class PanelStructureFit(eqx.Module):
    r"""The result of [`jaxctbn.panel.learn_structure_from_panels`][].

    - `posterior`: the [`jaxctbn.StructurePosterior`][] scored with the expected statistics of
      the last E-step (what the design criteria and the active-learning loop use).
    - `model`: the network of the last E-step ($m_i$).
    - `log_likelihood`: $\sum_r\ln p(Y_r\mid m_i)$, conditional on each trajectory's first
      observation; `None` with a sampled or mean-field E-step (not computed: exact
      forward-backward is what they avoid).
    - `evidence_lower_bound`: with a mean-field E-step, its bound $\mathcal F\le\sum_r\ln
      p(Y_r\mid m_i)$ (`panel_mean_field_statistics`); else `None`.
    - `trace`: the log-likelihood (mean-field: the bound) after each iteration,
      `(iterations,)` (empty with a sampled E-step).
    - `iterations`, `converged`: the number of E-steps, and whether the graph was unchanged and
      the log-likelihood had converged (sampled: the rule under the sampling `e_step` below)
      before `max_iterations`.
    - `effective_sample_size`: with a sampled E-step, per node, the smallest effective sample
      size over the trajectories of the jump count's chain in the last E-step (`None` with exact
      inference); `median_effective_sample_size`: the median over the trajectories;
      `split_r_hat`: the largest split-$\hat R$ over the trajectories
      (`SampledPaths.split_r_hat`; `None` with fewer than 4 samples);
      `infeasible_updates`: Gibbs updates that kept their path, over all E-steps;
      `sampler`: the sampler of the last E-step (its buffers as grown). With importance
      sampling: the effective sample sizes are the weights'
      (`WeightedPaths.effective_sample_size`, the same for every node),
      `split_r_hat` and `infeasible_updates` are `None`, and `log_likelihood_estimate` is the
      last E-step's $\sum_r\ln\frac1S\sum_s w_{rs}$, an estimate of $\sum_r\ln p(Y_r\mid
      m_i)$ (biased low by about half the relative variance of the weights; `None`
      otherwise).
    """

    posterior: StructurePosterior
    model: AbstractCTBN
    log_likelihood: Float[Array, ""] | None
    trace: Float[Array, " iterations"]
    iterations: int = eqx.field(static=True)
    converged: bool = eqx.field(static=True)
    effective_sample_size: Float[Array, " nodes"] | None = None
    infeasible_updates: int | None = None
    sampler: eqx.Module | None = None  # the sampling E-step, buffers as grown
    log_likelihood_estimate: Float[Array, ""] | None = None
    median_effective_sample_size: Float[Array, " nodes"] | None = None
    split_r_hat: Float[Array, " nodes"] | None = None
    evidence_lower_bound: Float[Array, ""] | None = None


@dataclasses.dataclass(frozen=True)
class StructuralEMProblem:
    """One run of structural EM, checked by `learn_structure_from_panels`: the first E-step's
    `model`, the data, the node `names`, the candidate `parent_sets` per node (`int32`, padded
    with -1), the structure `prior` and `edge_prior`, and the stopping rules (`tolerance` and
    `max_iterations` for the deterministic E-steps; `patience` and `key` for the sampling
    ones)."""

    model: AbstractCTBN
    observations: PanelObservations | PanelBuckets
    emissions: Emissions | None
    names: tuple[str, ...]
    parent_sets: tuple[Array, ...]
    prior: AbstractPrior
    edge_prior: Array | None
    tolerance: float
    max_iterations: int
    patience: int
    key: PRNGKeyArray | None


@eqx.filter_jit
def m_step(family, names, prior, edge_prior):
    """The structure posterior of the family statistics `family`, its MAP parent-set indices
    and the MAP graph with posterior-mean rates (the next E-step's model)."""
    posterior = StructurePosterior.from_statistics(
        family, names, prior=prior, edge_prior=edge_prior
    )
    indices = posterior.map_indices()
    return posterior, indices, posterior.mean_rates_given(indices)


def graph_at(sets, indices) -> tuple[tuple[int, ...], ...]:
    """The graph of the candidate sets `indices[n]` of `sets` (the M-step's MAP graph)."""
    return tuple(
        tuple(int(p) for p in np.asarray(s[int(i)]) if p >= 0) for s, i in zip(sets, indices)
    )


def graph_of(model: AbstractCTBN) -> tuple[tuple[int, ...], ...]:
    return tuple(
        tuple(int(p) for p in np.asarray(model.parent_list(n)).reshape(-1) if p >= 0)
        for n in range(model.num_nodes)
    )


def iterate_to_fixed_point(
    problem: StructuralEMProblem,
    e_step: Callable[[AbstractCTBN, Any], tuple[Any, Array | float, Any]],
    state: Any,
    *,
    bound: bool,
) -> PanelStructureFit:
    """Structural EM with a deterministic E-step: `e_step(model, state)` gives the family
    statistics, the objective (the log-likelihood, or with `bound` the evidence lower bound)
    and the state the next E-step starts from. Stops when the MAP graph is the current one and
    the objective changed by at most `tolerance` $\\times(1+|\\ell|)$, or after
    `max_iterations` E-steps (runs on the host; each E-step is compiled once)."""
    model = problem.model
    trace: list[float] = []
    previous_graph = graph_of(model)
    converged = False
    posterior = None
    for _ in range(problem.max_iterations):
        family, objective, state = e_step(model, state)
        trace.append(float(objective))
        posterior, indices, next_model = m_step(
            family, problem.names, problem.prior, problem.edge_prior
        )
        graph = graph_at(problem.parent_sets, indices)
        steady = len(trace) >= 2 and abs(trace[-1] - trace[-2]) <= problem.tolerance * (
            1.0 + abs(trace[-1])
        )
        if graph == previous_graph and steady:
            converged = True
            break
        if len(trace) == problem.max_iterations:
            break
        model, previous_graph = next_model, graph
    assert posterior is not None
    value = jnp.asarray(trace[-1])
    return PanelStructureFit(
        posterior=posterior,
        model=model,
        log_likelihood=None if bound else value,
        trace=jnp.asarray(trace),
        iterations=len(trace),
        converged=converged,
        evidence_lower_bound=value if bound else None,
    )
