"""jaxctbn: conditional continuous-time Bayesian networks in JAX, for active learning with
interventions (Linzner & Koeppl, ICML 2021).

The public surface, in the order the data flows: model -> generator -> master equation and
expected statistics -> paths and data -> priors and posteriors -> design criteria -> active
learning and experiments."""

# ruff: noqa: I001  (grouped by the data flow, not alphabetically)

# model
from ._ctbn import AbstractCTBN as AbstractCTBN
from ._ctbn import CTBN as CTBN
from ._ctbn import PaddedCTBN as PaddedCTBN
from ._interventions import Intervention as Intervention
from ._interventions import intervention_space as intervention_space
from ._interventions import single_node_interventions as single_node_interventions
from ._interventions import design_space as design_space
from ._random import paper_network as paper_network
from ._random import random_ctbn as random_ctbn
from ._random import random_graph as random_graph
from ._random import scaled_softmax_ctbn as scaled_softmax_ctbn

# generator
from ._generator import AbstractGenerator as AbstractGenerator
from ._generator import ExpandedGenerator as ExpandedGenerator
from ._generator import FactoredGenerator as FactoredGenerator
from ._generator import amalgamate as amalgamate
from ._generator import batch_last as batch_last

# master equation
from ._solvers import AbstractMasterEquationSolver as AbstractMasterEquationSolver
from ._solvers import DiffraxSolver as DiffraxSolver
from ._solvers import MatrixExponential as MatrixExponential
from ._solvers import Uniformisation as Uniformisation
from ._solvers import AbstractApproximateSolver as AbstractApproximateSolver
from ._solvers import AutomaticSolver as AutomaticSolver
from ._master_equation import AbstractExpectedStatistics as AbstractExpectedStatistics
from ._master_equation import ExpectedStatistics as ExpectedStatistics
from ._master_equation import expected_statistics as expected_statistics
from ._master_equation import expected_statistics_batch as expected_statistics_batch
from ._master_equation import initial_distribution as initial_distribution
from ._master_equation import marginals as marginals
from ._master_equation import resolve_solver as resolve_solver
from ._mean_field import MeanField as MeanField
from ._mean_field import MeanFieldStatistics as MeanFieldStatistics
from ._monte_carlo import Gillespie as Gillespie
from ._monte_carlo import SampledStatistics as SampledStatistics

# paths and data
from ._sampling import Trajectories as Trajectories
from ._sampling import automatic_max_events as automatic_max_events
from ._sampling import sample_trajectories as sample_trajectories
from ._sampling import sample_trajectory as sample_trajectory
from ._sampling import sample_within_cap as sample_within_cap
from ._statistics import NodeStatistics as NodeStatistics
from ._statistics import SufficientStatistics as SufficientStatistics
from ._statistics import node_statistics as node_statistics
from ._io import read_trajectories_csv as read_trajectories_csv
from ._io import trajectories_from_dataframe as trajectories_from_dataframe
from ._io import trajectories_to_dataframe as trajectories_to_dataframe
from ._io import write_trajectories_csv as write_trajectories_csv
from ._io import panel_from_dataframe as panel_from_dataframe
from ._io import read_panel_csv as read_panel_csv
from ._io import infer_cardinalities as infer_cardinalities
from ._datasets import DATASETS as DATASETS
from ._datasets import dataset_path as dataset_path
from ._panel import Emissions as Emissions
from ._panel import PanelExpectedStatistics as PanelExpectedStatistics
from ._panel import PanelObservations as PanelObservations
from ._panel import panel_expected_statistics as panel_expected_statistics
from ._panel import panel_log_likelihood as panel_log_likelihood
from ._panel import panel_marginals as panel_marginals
from ._panel_fit import AbstractRateFitMethod as AbstractRateFitMethod
from ._panel_fit import EMFit as EMFit
from ._panel_fit import GradientFit as GradientFit
from ._panel_fit import RateFit as RateFit
from ._panel_fit import fit_rates as fit_rates

# priors and posteriors
from ._conjugate import gamma_kl as gamma_kl
from ._priors import AbstractPrior as AbstractPrior
from ._priors import GammaPrior as GammaPrior
from ._priors import NodelmanPrior as NodelmanPrior
from ._posterior import AbstractPosterior as AbstractPosterior
from ._posterior import RatePosterior as RatePosterior
from ._posterior import path_log_likelihood as path_log_likelihood
from ._structure import FamilyStatistics as FamilyStatistics
from ._structure import StructurePosterior as StructurePosterior
from ._structure import candidate_parent_sets as candidate_parent_sets
from ._structure import enumerate_parent_sets as enumerate_parent_sets
from ._structure import family_statistics as family_statistics
from ._structure import learn_structure as learn_structure
from ._structure import score_parent_sets as score_parent_sets
from ._structure import structure_log_prior as structure_log_prior
from ._empirical_bayes import EmpiricalBayes as EmpiricalBayes
from ._panel_structure import PanelStructureFit as PanelStructureFit
from ._panel_structure import expected_family_statistics as expected_family_statistics
from ._panel_structure import learn_structure_from_panels as learn_structure_from_panels
from ._panel_structure import panel_family_statistics as panel_family_statistics

# design criteria
from ._batching import AbstractBatching as AbstractBatching
from ._batching import Chunked as Chunked
from ._batching import Sharded as Sharded
from ._batching import Vmap as Vmap
from ._kl_estimators import AbstractKLEstimator as AbstractKLEstimator
from ._kl_estimators import MonteCarlo as MonteCarlo
from ._kl_estimators import PlugIn as PlugIn
from ._optimisers import AbstractVBHCOptimiser as AbstractVBHCOptimiser
from ._optimisers import Adam as Adam
from ._optimisers import LBFGS as LBFGS
from ._parameter_criteria import ParameterDesignStatistics as ParameterDesignStatistics
from ._parameter_criteria import design_statistics as design_statistics
from ._parameter_criteria import kl_divergence as kl_divergence
from ._parameter_criteria import parameter_bhc as parameter_bhc
from ._parameter_criteria import parameter_eig as parameter_eig
from ._parameter_criteria import parameter_eig_nested as parameter_eig_nested
from ._parameter_criteria import parameter_vbhc as parameter_vbhc
from ._parameter_criteria import parameter_vbhc_minimise as parameter_vbhc_minimise
from ._parameter_criteria import parameter_vbhc_minimiser as parameter_vbhc_minimiser
from ._parameter_criteria import parameter_vbhc_minimum as parameter_vbhc_minimum
from ._parameter_criteria import posterior_draws as posterior_draws
from ._structure_criteria import AbstractGraphDraws as AbstractGraphDraws
from ._structure_criteria import JointGraphDraws as JointGraphDraws
from ._structure_criteria import JointStructureDraws as JointStructureDraws
from ._structure_criteria import StratifiedGraphDraws as StratifiedGraphDraws
from ._structure_criteria import StructureDraws as StructureDraws
from ._structure_criteria import joint_structure_draws as joint_structure_draws
from ._structure_criteria import predictive_log_likelihood as predictive_log_likelihood
from ._structure_criteria import structure_bhc as structure_bhc
from ._structure_criteria import structure_divergences as structure_divergences
from ._structure_criteria import structure_draws as structure_draws
from ._structure_criteria import structure_eig as structure_eig
from ._structure_criteria import structure_vbhc as structure_vbhc
from ._structure_criteria import structure_vbhc_minimise as structure_vbhc_minimise
from ._structure_criteria import structure_vbhc_minimum as structure_vbhc_minimum
from ._criteria import BHC as BHC
from ._criteria import EIG as EIG
from ._criteria import VBHC as VBHC
from ._criteria import AbstractCriterion as AbstractCriterion
from ._criteria import AbstractBoxHillCriterion as AbstractBoxHillCriterion
from ._criteria import score_interventions as score_interventions

# active learning
from ._active_learning import DESIGN_NAMES as DESIGN_NAMES
from ._active_learning import AbstractDesign as AbstractDesign
from ._active_learning import AbstractInitialStatePolicy as AbstractInitialStatePolicy
from ._active_learning import FixedInitialState as FixedInitialState
from ._active_learning import InitialStateDistribution as InitialStateDistribution
from ._active_learning import RandomInitialState as RandomInitialState
from ._active_learning import AbstractLearningTask as AbstractLearningTask
from ._active_learning import ActiveLearningResult as ActiveLearningResult
from ._active_learning import CallableDesign as CallableDesign
from ._active_learning import CriterionDesign as CriterionDesign
from ._active_learning import ParameterLearningTask as ParameterLearningTask
from ._active_learning import PassiveDesign as PassiveDesign
from ._active_learning import RandomDesign as RandomDesign
from ._active_learning import RepetitionStatus as RepetitionStatus
from ._active_learning import StructureLearningTask as StructureLearningTask
from ._active_learning import design_from_name as design_from_name
from ._active_learning import run_active_learning as run_active_learning
from ._active_learning import run_repetitions as run_repetitions
from ._experiments import ExperimentConfig as ExperimentConfig
from ._experiments import run_experiment as run_experiment
from ._experiments import default_graph_draws as default_graph_draws

# metrics
from ._metrics import adjacency_from_parents as adjacency_from_parents
from ._metrics import aupr as aupr
from ._metrics import auroc as auroc
from ._metrics import edge_aupr as edge_aupr
from ._metrics import edge_auroc as edge_auroc
from ._metrics import structural_hamming_distance as structural_hamming_distance

# the real-data pool experiment
from ._pool import POOL_DESIGN_NAMES as POOL_DESIGN_NAMES
from ._pool import AbstractPoolDesign as AbstractPoolDesign
from ._pool import CriterionPool as CriterionPool
from ._pool import PassivePool as PassivePool
from ._pool import PoolExperiment as PoolExperiment
from ._pool import PoolResult as PoolResult
from ._pool import RandomPool as RandomPool
from ._pool import pool_design_from_name as pool_design_from_name
from ._pool import pool_membership as pool_membership
from ._pool import pool_scores as pool_scores
from ._pool import prepare_pool as prepare_pool
from ._pool import run_pool as run_pool
from ._pool import run_pool_experiment as run_pool_experiment
from ._pool import run_pool_repetitions as run_pool_repetitions
from ._pool import subject_family_statistics as subject_family_statistics

# compiling on the CPU
from ._threefry_lowering import use_unrolled_threefry_on_cpu as use_unrolled_threefry_on_cpu

__version__ = "0.1.0"
