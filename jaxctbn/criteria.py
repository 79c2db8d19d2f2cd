"""Design beyond one experiment's score: panel designs with their chosen visit times
(`panel_design_scores`, `PanelDesign`), batches of experiments (`score_batch`, `BatchDesign`) and
how costs rank candidates (`ByScore`, `ByScorePerCost`), intervention strengths as a design
variable (`Strengths`, `strength_design_scores`) and drugs of uncertain effect
(`uncertain_strength_scores`); the Box-Hill family's base and the quantities a criterion's value
follows from (`AbstractBoxHillCriterion`, `ParameterDesignStatistics`), and how structure
criteria draw graphs (`StratifiedGraphDraws`, `JointGraphDraws`)."""

# ruff: noqa: I001  (grouped as in the package, not alphabetically)

from ._criteria.parameter import ParameterDesignStatistics as ParameterDesignStatistics
from ._criteria.structure import AbstractGraphDraws as AbstractGraphDraws
from ._criteria.structure import JointGraphDraws as JointGraphDraws
from ._criteria.structure import StratifiedGraphDraws as StratifiedGraphDraws
from ._criteria.box_hill import AbstractBoxHillCriterion as AbstractBoxHillCriterion
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
from ._criteria.scoring import panel_design_scores as panel_design_scores
from ._criteria.panel_parameter import PanelDesign as PanelDesign
