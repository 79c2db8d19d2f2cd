"""Design questions beyond one experiment's score, as the Modules and results of
`jaxctbn.score_interventions`: panel designs with their chosen visit times (`PanelDesign`),
batches of experiments (`GivenBatch`, `BatchDesign`; `jaxctbn.Batch` chooses one) and how costs
rank candidates (`ByScore`, `ByScorePerCost`), intervention strengths as a design variable
(`Strengths`, `StrengthDesign`) and drugs of uncertain effect (`UncertainStrength`,
`UncertainStrengthScores`); the Box-Hill family's base and the quantities a criterion's value
follows from (`AbstractBoxHillCriterion`, `ParameterDesignStatistics`), and how structure
criteria draw graphs (`StratifiedGraphDraws`, `JointGraphDraws`)."""

# ruff: noqa: I001  (grouped as in the package, not alphabetically)

from ._criteria.parameter import ParameterDesignStatistics as ParameterDesignStatistics
from ._criteria.structure import AbstractGraphDraws as AbstractGraphDraws
from ._criteria.structure import JointGraphDraws as JointGraphDraws
from ._criteria.structure import StratifiedGraphDraws as StratifiedGraphDraws
from ._criteria.box_hill import AbstractBoxHillCriterion as AbstractBoxHillCriterion
from ._criteria.batches import BatchDesign as BatchDesign
from ._criteria.batches import GivenBatch as GivenBatch
from ._criteria.costs import AbstractRanking as AbstractRanking
from ._criteria.costs import ByScore as ByScore
from ._criteria.costs import ByScorePerCost as ByScorePerCost
from ._criteria.strengths import Strengths as Strengths
from ._criteria.strengths import StrengthDesign as StrengthDesign
from ._criteria.strengths import UncertainStrengthScores as UncertainStrengthScores
from ._criteria.strengths import UncertainStrength as UncertainStrength
from ._criteria.panel_parameter import PanelDesign as PanelDesign
