"""The design criteria as closed-form functions (the Modules `jc.BHC`, `jc.VBHC`, `jc.EIG` call
these), the posterior draws they average over, the Gamma KL divergence, and what an experiment
reveals (`CompletePath`, `Panel`), batches of experiments (`score_batch`, `BatchDesign`) and how
costs rank candidates (`ByScore`, `ByScorePerCost`), intervention strengths as a design variable
(`Strengths`, `strength_design_scores`) and drugs of uncertain effect
(`uncertain_strength_scores`)."""

# ruff: noqa: I001  (grouped as in the package, not alphabetically)

from ._learning.conjugate import gamma_kl as gamma_kl
from ._criteria.parameter import ParameterDesignStatistics as ParameterDesignStatistics
from ._criteria.parameter import design_statistics as design_statistics
from ._criteria.parameter import kl_divergence as kl_divergence
from ._criteria.parameter import parameter_bhc as parameter_bhc
from ._criteria.parameter import parameter_eig as parameter_eig
from ._criteria.parameter import parameter_eig_nested as parameter_eig_nested
from ._criteria.parameter import parameter_vbhc as parameter_vbhc
from ._criteria.parameter import parameter_vbhc_minimise as parameter_vbhc_minimise
from ._criteria.parameter import parameter_vbhc_minimiser as parameter_vbhc_minimiser
from ._criteria.parameter import parameter_vbhc_minimum as parameter_vbhc_minimum
from ._criteria.parameter import posterior_draws as posterior_draws
from ._criteria.structure import AbstractGraphDraws as AbstractGraphDraws
from ._criteria.structure import JointGraphDraws as JointGraphDraws
from ._criteria.structure import JointStructureDraws as JointStructureDraws
from ._criteria.structure import StratifiedGraphDraws as StratifiedGraphDraws
from ._criteria.structure import StructureDraws as StructureDraws
from ._criteria.structure import joint_structure_draws as joint_structure_draws
from ._criteria.structure import predictive_log_likelihood as predictive_log_likelihood
from ._criteria.structure import structure_bhc as structure_bhc
from ._criteria.structure import structure_divergences as structure_divergences
from ._criteria.structure import structure_draws as structure_draws
from ._criteria.structure import structure_eig as structure_eig
from ._criteria.structure import structure_vbhc as structure_vbhc
from ._criteria.structure import structure_vbhc_minimise as structure_vbhc_minimise
from ._criteria.structure import structure_vbhc_minimum as structure_vbhc_minimum
from ._criteria.criteria import AbstractBoxHillCriterion as AbstractBoxHillCriterion
from ._criteria.batches import BatchDesign as BatchDesign
from ._criteria.batches import score_batch as score_batch
from ._criteria.costs import AbstractRanking as AbstractRanking
from ._criteria.costs import ByScore as ByScore
from ._criteria.costs import ByScorePerCost as ByScorePerCost
from ._criteria.strengths import Strengths as Strengths
from ._criteria.strengths import StrengthDesign as StrengthDesign
from ._criteria.strengths import strength_design_scores as strength_design_scores
from ._criteria.strengths import UncertainStrengthScores as UncertainStrengthScores
from ._criteria.strengths import uncertain_strength_scores as uncertain_strength_scores
from ._criteria.outcomes import AbstractOutcome as AbstractOutcome
from ._criteria.outcomes import CompletePath as CompletePath
from ._criteria.outcomes import Panel as Panel
from ._criteria.criteria import panel_design_scores as panel_design_scores
from ._criteria.panel_parameter import PanelDesign as PanelDesign
from ._criteria.panel_parameter import panel_parameter_eig as panel_parameter_eig
from ._criteria.panel_parameter import panel_parameter_vbhc as panel_parameter_vbhc
from ._criteria.panel_structure import PanelStructureDraws as PanelStructureDraws
from ._criteria.panel_structure import PanelStructureEIGDraws as PanelStructureEIGDraws
from ._criteria.panel_structure import panel_structure_bhc as panel_structure_bhc
from ._criteria.panel_structure import panel_structure_divergences as panel_structure_divergences
from ._criteria.panel_structure import panel_structure_draws as panel_structure_draws
from ._criteria.panel_structure import panel_structure_eig as panel_structure_eig
from ._criteria.panel_structure import panel_structure_eig_draws as panel_structure_eig_draws
from ._criteria.panel_structure import (
    panel_structure_vbhc_minimum as panel_structure_vbhc_minimum,
)
