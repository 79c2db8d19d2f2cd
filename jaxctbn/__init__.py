"""jaxctbn: conditional continuous-time Bayesian networks in JAX, for active learning with
interventions (Linzner & Koeppl, ICML 2021).

The public surface, in the order the data flows: model -> generator -> master equation and
expected statistics -> paths and data -> priors and posteriors -> design criteria -> active
learning. The rest lives in four namespaces: `jaxctbn.panel` (incompletely observed data),
`jaxctbn.criteria` (the criteria as closed-form functions), `jaxctbn.experiments` (the paper's
experiments, the real-data pool, metrics) and `jaxctbn.internal` (building blocks for extending
the library)."""

# ruff: noqa: I001  (grouped by the data flow, not alphabetically)
import typing

from . import _lazy

if typing.TYPE_CHECKING:  # the public names, each imported on first use (`_lazy`)
    # model
    from ._model.ctbn import AbstractCTBN as AbstractCTBN
    from ._model.ctbn import CTBN as CTBN
    from ._model.ctbn import PaddedCTBN as PaddedCTBN
    from ._model.interventions import Intervention as Intervention
    from ._model.interventions import intervention_space as intervention_space
    from ._model.interventions import single_node_interventions as single_node_interventions
    from ._model.random_networks import paper_network as paper_network
    from ._model.random_networks import random_ctbn as random_ctbn

    # generator
    from ._master_equation.generator import AbstractGenerator as AbstractGenerator

    # master equation
    from ._master_equation.solver import (
        AbstractMasterEquationSolver as AbstractMasterEquationSolver,
    )
    from ._master_equation.diffrax_solver import DiffraxSolver as DiffraxSolver
    from ._master_equation.matrix_exponential import MatrixExponential as MatrixExponential
    from ._master_equation.uniformisation import Uniformisation as Uniformisation
    from ._master_equation.solver import AbstractApproximateSolver as AbstractApproximateSolver
    from ._master_equation.automatic_solver import AutomaticSolver as AutomaticSolver
    from ._master_equation.statistics import (
        AbstractExpectedStatistics as AbstractExpectedStatistics,
    )
    from ._master_equation.statistics import ExpectedStatistics as ExpectedStatistics
    from ._master_equation.master_equation import expected_statistics as expected_statistics
    from ._master_equation.master_equation import (
        expected_statistics_batch as expected_statistics_batch,
    )
    from ._master_equation.master_equation import marginals as marginals
    from ._master_equation.mean_field import MeanField as MeanField
    from ._master_equation.monte_carlo import Gillespie as Gillespie

    # paths and data
    from ._paths.trajectories import Trajectories as Trajectories
    from ._paths.sampling import sample_trajectories as sample_trajectories
    from ._paths.sufficient_statistics import SufficientStatistics as SufficientStatistics

    # priors and posteriors
    from ._learning.priors import AbstractPrior as AbstractPrior
    from ._learning.priors import GammaPrior as GammaPrior
    from ._learning.priors import NodelmanPrior as NodelmanPrior
    from ._learning.posterior import AbstractPosterior as AbstractPosterior
    from ._learning.posterior import AbstractRatePosterior as AbstractRatePosterior
    from ._learning.posterior import RatePosterior as RatePosterior
    from ._learning.gamma_mixture import GammaMixturePosterior as GammaMixturePosterior
    from ._learning.posterior import path_log_likelihood as path_log_likelihood
    from ._learning.structure_posterior import StructurePosterior as StructurePosterior
    from ._learning.structure_posterior import learn_structure as learn_structure
    from ._learning.knowledge import PriorKnowledge as PriorKnowledge
    from ._learning.structure_mixture import StructureMixturePosterior as StructureMixturePosterior
    from ._learning.search import Exhaustive as Exhaustive
    from ._learning.search import HillClimbing as HillClimbing
    from ._learning.independence import CTPC as CTPC
    from ._learning.empirical_bayes import EmpiricalBayes as EmpiricalBayes
    from ._learning.strength import StrengthPosterior as StrengthPosterior
    from ._learning.strength import learn_strength as learn_strength

    # design criteria
    from ._batching import AbstractBatching as AbstractBatching
    from ._batching import Chunked as Chunked
    from ._batching import Sharded as Sharded
    from ._batching import Vmap as Vmap
    from ._criteria.kl_estimators import AbstractKLEstimator as AbstractKLEstimator
    from ._criteria.kl_estimators import MonteCarlo as MonteCarlo
    from ._criteria.kl_estimators import PlugIn as PlugIn
    from ._criteria.kl_estimators import RateCoupling as RateCoupling
    from ._learning.optimisers import AbstractVBHCOptimiser as AbstractVBHCOptimiser
    from ._learning.optimisers import Adam as Adam
    from ._learning.optimisers import LBFGS as LBFGS
    from ._criteria.box_hill import BHC as BHC
    from ._criteria.eig import EIG as EIG
    from ._criteria.box_hill import VBHC as VBHC
    from ._criteria.criterion import AbstractCriterion as AbstractCriterion
    from ._criteria.scoring import score_interventions as score_interventions
    from ._criteria.costs import Costs as Costs
    from ._criteria.outcomes import AbstractOutcome as AbstractOutcome
    from ._criteria.outcomes import CompletePath as CompletePath
    from ._criteria.outcomes import PanelOutcome as PanelOutcome
    from ._criteria.batches import Batch as Batch

    # active learning
    from ._active_learning.designs import AbstractDesign as AbstractDesign
    from ._active_learning.initial_states import (
        AbstractInitialStatePolicy as AbstractInitialStatePolicy,
    )
    from ._active_learning.initial_states import FixedInitialState as FixedInitialState
    from ._active_learning.initial_states import (
        InitialStateDistribution as InitialStateDistribution,
    )
    from ._active_learning.initial_states import RandomInitialState as RandomInitialState
    from ._active_learning.tasks import AbstractLearningTask as AbstractLearningTask
    from ._active_learning.loop import ActiveLearningResult as ActiveLearningResult
    from ._active_learning.designs import CallableDesign as CallableDesign
    from ._active_learning.designs import CriterionDesign as CriterionDesign
    from ._active_learning.tasks import ParameterLearningTask as ParameterLearningTask
    from ._active_learning.designs import PassiveDesign as PassiveDesign
    from ._active_learning.designs import RandomDesign as RandomDesign
    from ._active_learning.tasks import StructureLearningTask as StructureLearningTask
    from ._active_learning.loop import run_active_learning as run_active_learning
    from ._active_learning.repetitions import run_repetitions as run_repetitions

    # compiling
    from ._compilation import use_compilation_cache as use_compilation_cache

    # the namespaces
    from . import criteria as criteria
    from . import experiments as experiments
    from . import internal as internal
    from . import panel as panel

__getattr__, __dir__ = _lazy.lazy_exports(__name__, __file__)

__version__ = "0.1.0"
