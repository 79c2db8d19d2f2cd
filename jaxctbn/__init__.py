"""jaxctbn: conditional continuous-time Bayesian networks in JAX, for active learning with
interventions (Linzner & Koeppl, ICML 2021)."""

from ._active_learning import DESIGN_NAMES as DESIGN_NAMES
from ._active_learning import AbstractDesign as AbstractDesign
from ._active_learning import AbstractLearningTask as AbstractLearningTask
from ._active_learning import ActiveLearningResult as ActiveLearningResult
from ._active_learning import CallableDesign as CallableDesign
from ._active_learning import CriterionDesign as CriterionDesign
from ._active_learning import ParameterLearningTask as ParameterLearningTask
from ._active_learning import PassiveDesign as PassiveDesign
from ._active_learning import RandomDesign as RandomDesign
from ._active_learning import StructureLearningTask as StructureLearningTask
from ._active_learning import design_from_name as design_from_name
from ._active_learning import run_active_learning as run_active_learning
from ._active_learning import run_repetitions as run_repetitions
from ._criteria import ParameterDesignStatistics as ParameterDesignStatistics
from ._criteria import VBHCOptimiser as VBHCOptimiser
from ._criteria import design_statistics as design_statistics
from ._criteria import gamma_kl as gamma_kl
from ._criteria import kl_divergence as kl_divergence
from ._criteria import map_interventions as map_interventions
from ._criteria import parameter_bhc as parameter_bhc
from ._criteria import parameter_eig as parameter_eig
from ._criteria import parameter_eig_nested as parameter_eig_nested
from ._criteria import parameter_vbhc as parameter_vbhc
from ._criteria import parameter_vbhc_minimiser as parameter_vbhc_minimiser
from ._criteria import parameter_vbhc_minimum as parameter_vbhc_minimum
from ._criteria import posterior_draws as posterior_draws
from ._criteria import score_interventions as score_interventions
from ._ctbn import CTBN as CTBN
from ._ctbn import AbstractCTBN as AbstractCTBN
from ._ctbn import PaddedCTBN as PaddedCTBN
from ._experiments import run_experiment as run_experiment
from ._generator import AbstractGenerator as AbstractGenerator
from ._generator import ExpandedGenerator as ExpandedGenerator
from ._generator import FactoredGenerator as FactoredGenerator
from ._generator import amalgamate as amalgamate
from ._generator import batch_last as batch_last
from ._interventions import Intervention as Intervention
from ._interventions import intervention_space as intervention_space
from ._master_equation import (
    AbstractMasterEquationSolver as AbstractMasterEquationSolver,
)
from ._master_equation import (
    DiffraxSolver as DiffraxSolver,
)
from ._master_equation import (
    ExpectedStatistics as ExpectedStatistics,
)
from ._master_equation import (
    MatrixExponential as MatrixExponential,
)
from ._master_equation import (
    Uniformisation as Uniformisation,
)
from ._master_equation import (
    expected_statistics as expected_statistics,
)
from ._master_equation import (
    expected_statistics_batch as expected_statistics_batch,
)
from ._master_equation import (
    initial_distribution as initial_distribution,
)
from ._master_equation import (
    marginals as marginals,
)
from ._metrics import adjacency_from_parents as adjacency_from_parents
from ._metrics import aupr as aupr
from ._metrics import auroc as auroc
from ._metrics import edge_aupr as edge_aupr
from ._metrics import edge_auroc as edge_auroc
from ._metrics import structural_hamming_distance as structural_hamming_distance
from ._posterior import RatePosterior as RatePosterior
from ._random import (
    paper_network as paper_network,
)
from ._random import (
    random_ctbn as random_ctbn,
)
from ._random import (
    random_graph as random_graph,
)
from ._random import (
    scaled_softmax_ctbn as scaled_softmax_ctbn,
)
from ._sampling import (
    Trajectories as Trajectories,
)
from ._sampling import (
    sample_trajectories as sample_trajectories,
)
from ._sampling import (
    sample_trajectory as sample_trajectory,
)
from ._statistics import (
    NodeStatistics as NodeStatistics,
)
from ._statistics import (
    SufficientStatistics as SufficientStatistics,
)
from ._statistics import (
    node_statistics as node_statistics,
)
from ._statistics import (
    path_log_likelihood as path_log_likelihood,
)
from ._statistics import (
    read_trajectories_csv as read_trajectories_csv,
)
from ._statistics import (
    trajectories_from_dataframe as trajectories_from_dataframe,
)
from ._statistics import (
    trajectories_to_dataframe as trajectories_to_dataframe,
)
from ._statistics import (
    write_trajectories_csv as write_trajectories_csv,
)
from ._structure import FamilyStatistics as FamilyStatistics
from ._structure import StructurePosterior as StructurePosterior
from ._structure import candidate_parent_sets as candidate_parent_sets
from ._structure import enumerate_parent_sets as enumerate_parent_sets
from ._structure import family_statistics as family_statistics
from ._structure import learn_structure as learn_structure
from ._structure import local_log_marginal_likelihood as local_log_marginal_likelihood
from ._structure import score_parent_sets as score_parent_sets
from ._structure import structure_log_prior as structure_log_prior
from ._structure_criteria import StructureDraws as StructureDraws
from ._structure_criteria import StructureVBHCOptimiser as StructureVBHCOptimiser
from ._structure_criteria import predictive_log_likelihood as predictive_log_likelihood
from ._structure_criteria import score_interventions_structure as score_interventions_structure
from ._structure_criteria import structure_bhc as structure_bhc
from ._structure_criteria import structure_divergences as structure_divergences
from ._structure_criteria import structure_draws as structure_draws
from ._structure_criteria import structure_eig as structure_eig
from ._structure_criteria import structure_vbhc as structure_vbhc
from ._structure_criteria import structure_vbhc_minimum as structure_vbhc_minimum

__version__ = "0.1.0"
