r"""The exact E-step of structural EM from panel data, [`jaxctbn.panel.ForwardBackward`][]: each
iteration's expected statistics by forward-backward filtering on the amalgamated state space,
projected onto every candidate parent set and pooled across interventions."""

from __future__ import annotations

from typing import ClassVar, cast

import equinox as eqx
import jax.numpy as jnp

from .._master_equation import AbstractMasterEquationSolver
from .checks import check_possible
from .e_step import DENSE_SOLVER, AbstractPanelEStep
from .expected_statistics import PanelExpectedStatistics
from .gap_groups import gap_groups, pooled_by_gaps
from .inference import panel_expected_statistics
from .panel_families import expected_family_statistics, panel_family_statistics
from .structural_em import PanelStructureFit, StructuralEMProblem, iterate_to_fixed_point


class ForwardBackward(AbstractPanelEStep):
    """Exact inference under panel evidence: each E-step's expected statistics by
    forward-backward filtering with `solver` (default [`jaxctbn.MatrixExponential`][], no limit
    on the length of a gap), exponential in the number of nodes whatever the solver (the
    amalgamated state space). Takes `emissions`; reports the log-likelihood."""

    solver: AbstractMasterEquationSolver = DENSE_SOLVER
    exact_observations: ClassVar[bool] = False

    def __check_init__(self):
        if not isinstance(self.solver, AbstractMasterEquationSolver):
            raise ValueError(
                f"solver: expected a master-equation solver, got {type(self.solver).__name__}."
            )

    def structural_em(self, problem: StructuralEMProblem) -> PanelStructureFit:
        observations = problem.observations
        R, N = observations.batch_shape[0], observations.num_nodes
        intervention = observations.intervention
        if intervention is None:
            targets = jnp.zeros((R, N), bool)
        else:
            targets = jnp.broadcast_to(intervention.targets, (R, N))
        groups = None
        if intervention is None and self.solver.tabulates_gaps:
            groups = gap_groups(observations)

        def e_step(model, state):
            family, log_likelihood = _e_step(
                model, observations, problem.emissions, self.solver, problem.parent_sets,
                targets, groups,
            )  # fmt: skip
            return family, log_likelihood, state

        return iterate_to_fixed_point(problem, e_step, None, bound=False)


#: The default E-step: exact forward-backward with the dense matrix exponential.
EXACT_E_STEP = ForwardBackward()


@eqx.filter_jit
def _e_step(model, observations, emissions, solver, parent_sets, targets, groups):
    if groups is not None:  # no interventions: pooled directly, exponentials shared by gap
        bad, pooled = pooled_by_gaps(model, observations, emissions, None, groups, "statistics")
        pooled = cast(PanelExpectedStatistics, check_possible(pooled, bad, observations))
        return expected_family_statistics(pooled, parent_sets), pooled.log_likelihood
    stats = panel_expected_statistics(model, observations, emissions=emissions, solver=solver)
    family = panel_family_statistics(stats, parent_sets, intervention_targets=targets)
    return family, stats.log_likelihood.sum()
