r"""Structural EM with a sampling E-step (Monte Carlo structural EM): the loop shared by
[`jaxctbn.panel.GibbsSampler`][] and [`jaxctbn.panel.PanelImportanceSampler`][], each of which
supplies its per-bucket E-step (`em_step`), the buffers it may grow and its diagnostics.

Each E-step imputes paths under the current model; the M-step scores the average of the
E-steps' family statistics since the graph last changed (their later half: the rates have
settled), so that the sampling noise of one E-step does not move the graph. The rule to stop:
the graph unchanged and this E-step's evidence (of its own statistics) not higher than the
previous one's, `patience` times (it rises while EM converges, then moves by sampling noise
alone). A buffer too small for the paths of an update is doubled and the E-step redone, up to
`MAX_BUFFER`.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import numpy as np
from jaxtyping import Array, PRNGKeyArray

from .._learning.family_statistics import FamilyStatistics
from .._model.ctbn import AbstractCTBN
from .buckets import as_flat_buckets
from .e_step import AbstractPanelEStep
from .panel_families import scaled
from .structural_em import PanelStructureFit, StructuralEMProblem, graph_at, graph_of, m_step


class AbstractSamplingEStep(AbstractPanelEStep):
    """An E-step that draws paths given the observations: what Monte Carlo structural EM
    (`sampled_structural_em.py`) asks of it, per bucket of trajectories."""

    samples: ClassVar[bool] = True
    #: the static buffer sizes the loop may double when the paths outgrow them, in the order of
    #: `em_step`'s overflow flags
    em_buffers: ClassVar[tuple[str, ...]]

    def structural_em(self, problem: StructuralEMProblem) -> PanelStructureFit:
        return sampled_structural_em(problem, self)

    @abc.abstractmethod
    def em_start(self, model: AbstractCTBN, buckets: Sequence) -> tuple[Any, list]:
        """This sampler as the loop runs it, and each bucket's starting state."""

    @abc.abstractmethod
    def em_bounds(self, model: AbstractCTBN) -> Any:
        """The static bounds of an E-step under `model` (one program while they hold)."""

    @abc.abstractmethod
    def em_step(
        self, model, bucket, parent_sets, key: PRNGKeyArray, state, bounds
    ) -> tuple[Any, Any, Array, Array, Any]:
        """One bucket's E-step: its family statistics, its chains' diagnostics, the infeasible
        updates, the overflow flags of `em_buffers` and the state the next E-step starts
        from."""

    @abc.abstractmethod
    def em_fit_fields(self, diagnostics: list, num_nodes: int, infeasible: int) -> dict:
        """The diagnostic fields of `PanelStructureFit` from the last E-step's buckets."""


#: the largest size the sampled E-step grows a buffer to
MAX_BUFFER = 1 << 14


def sampled_structural_em(
    problem: StructuralEMProblem, sampler: AbstractSamplingEStep
) -> PanelStructureFit:
    """Monte Carlo structural EM with `sampler`'s E-step (module docstring)."""
    assert problem.key is not None
    model = problem.model
    buckets = as_flat_buckets(problem.observations)
    sampler, states = sampler.em_start(model, buckets)
    previous_graph = graph_of(model)
    window: list[FamilyStatistics] = []  # the E-steps under the current graph
    infeasible, stable, converged = 0, 0, False
    posterior, diagnostics, previous_evidence = None, [], -np.inf
    i = 0
    for i in range(problem.max_iterations):
        bounds = sampler.em_bounds(model)
        family, diagnostics = None, []
        for b, bucket in enumerate(buckets):
            while True:  # a buffer too small for these paths: doubled, the step redone
                step_key = jax.random.fold_in(jax.random.fold_in(problem.key, i), b)
                part, chains, stuck, overflow, state = sampler.em_step(
                    model, bucket, problem.parent_sets, step_key, states[b], bounds
                )
                grow = [
                    name for name, flag in zip(sampler.em_buffers, np.asarray(overflow)) if flag
                ]
                if not grow:
                    states[b] = state
                    break
                if any(getattr(sampler, name) >= MAX_BUFFER for name in grow):
                    raise ValueError(
                        f"sampler: the paths need more than {MAX_BUFFER} jumps or virtual "
                        f"times per update ({', '.join(grow)}); the rates are too fast for the "
                        "time between the observations."
                    )
                sampler = dataclasses.replace(
                    sampler, **{name: min(2 * getattr(sampler, name), MAX_BUFFER) for name in grow}
                )
            family = part if family is None else family + part
            diagnostics.append(chains)
            infeasible += int(stuck)
        assert family is not None
        # this E-step's evidence (of its own statistics): it rises while EM converges and then
        # moves by sampling noise alone
        names, prior, edge_prior = problem.names, problem.prior, problem.edge_prior
        evidence = float(m_step(family, names, prior, edge_prior)[0].log_evidence())
        window.append(family)
        recent = window[len(window) // 2 :]  # the later half: the rates have settled
        averaged = scaled(sum(recent[1:], recent[0]), 1.0 / len(recent))
        posterior, indices, next_model = m_step(averaged, names, prior, edge_prior)
        graph = graph_at(problem.parent_sets, indices)
        if graph != previous_graph:
            stable, window = 0, []
        elif evidence <= previous_evidence:
            stable += 1
        previous_evidence = evidence
        if stable >= problem.patience:
            converged = True
            break
        if i + 1 == problem.max_iterations:
            break
        model, previous_graph = next_model, graph
    assert posterior is not None
    return PanelStructureFit(
        posterior=posterior,
        model=model,
        log_likelihood=None,
        trace=jax.numpy.zeros((0,)),
        iterations=i + 1,
        converged=converged,
        sampler=sampler,
        **sampler.em_fit_fields(diagnostics, model.num_nodes, infeasible),
    )
