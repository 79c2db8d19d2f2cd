"""jaxctbn: conditional continuous-time Bayesian networks in JAX, for active learning with
interventions (Linzner & Koeppl, ICML 2021).

The public surface, in the order the data flows: model -> generator -> master equation and
expected statistics -> paths and data -> priors and posteriors -> design criteria -> active
learning and experiments."""

# ruff: noqa: I001  (grouped by the data flow, not alphabetically)

# model
from ._model.ctbn import AbstractCTBN as AbstractCTBN
from ._model.ctbn import CTBN as CTBN
from ._model.ctbn import PaddedCTBN as PaddedCTBN
from ._model.interventions import Intervention as Intervention
from ._model.interventions import intervention_space as intervention_space
from ._model.interventions import single_node_interventions as single_node_interventions
from ._model.interventions import design_space as design_space
from ._model.random_networks import paper_network as paper_network
from ._model.random_networks import random_ctbn as random_ctbn
from ._model.random_networks import random_graph as random_graph
from ._model.random_networks import scaled_softmax_ctbn as scaled_softmax_ctbn

# generator
from ._master_equation.generator import AbstractGenerator as AbstractGenerator
from ._master_equation.generator import ExpandedGenerator as ExpandedGenerator
from ._master_equation.generator import FactoredGenerator as FactoredGenerator
from ._master_equation.generator import amalgamate as amalgamate
from ._master_equation.generator import batch_last as batch_last

# master equation
from ._master_equation.solvers import AbstractMasterEquationSolver as AbstractMasterEquationSolver
from ._master_equation.solvers import DiffraxSolver as DiffraxSolver
from ._master_equation.solvers import MatrixExponential as MatrixExponential
from ._master_equation.solvers import Uniformisation as Uniformisation
from ._master_equation.solvers import AbstractApproximateSolver as AbstractApproximateSolver
from ._master_equation.solvers import AutomaticSolver as AutomaticSolver
from ._master_equation.master_equation import (
    AbstractExpectedStatistics as AbstractExpectedStatistics,
)
from ._master_equation.master_equation import ExpectedStatistics as ExpectedStatistics
from ._master_equation.master_equation import expected_statistics as expected_statistics
from ._master_equation.master_equation import expected_statistics_batch as expected_statistics_batch
from ._master_equation.master_equation import initial_distribution as initial_distribution
from ._master_equation.master_equation import marginals as marginals
from ._master_equation.master_equation import resolve_solver as resolve_solver
from ._master_equation.mean_field import MeanField as MeanField
from ._master_equation.mean_field import MeanFieldStatistics as MeanFieldStatistics
from ._master_equation.monte_carlo import Gillespie as Gillespie
from ._master_equation.monte_carlo import SampledStatistics as SampledStatistics

# paths and data
from ._paths.sampling import Trajectories as Trajectories
from ._paths.sampling import automatic_max_events as automatic_max_events
from ._paths.sampling import sample_trajectories as sample_trajectories
from ._paths.sampling import sample_trajectory as sample_trajectory
from ._paths.sampling import sample_within_cap as sample_within_cap
from ._paths.sufficient_statistics import NodeStatistics as NodeStatistics
from ._paths.sufficient_statistics import SufficientStatistics as SufficientStatistics
from ._paths.sufficient_statistics import node_statistics as node_statistics
from ._paths.csv import read_trajectories_csv as read_trajectories_csv
from ._paths.csv import trajectories_from_dataframe as trajectories_from_dataframe
from ._paths.csv import trajectories_to_dataframe as trajectories_to_dataframe
from ._paths.csv import write_trajectories_csv as write_trajectories_csv
from ._panel.csv import panel_from_dataframe as panel_from_dataframe
from ._panel.csv import read_panel_csv as read_panel_csv
from ._paths.csv import infer_cardinalities as infer_cardinalities
from ._panel.datasets import DATASETS as DATASETS
from ._panel.datasets import dataset_path as dataset_path
from ._panel.observations import Emissions as Emissions
from ._panel.inference import PanelExpectedStatistics as PanelExpectedStatistics
from ._panel.observations import PanelObservations as PanelObservations
from ._panel.inference import panel_expected_statistics as panel_expected_statistics
from ._panel.inference import panel_log_likelihood as panel_log_likelihood
from ._panel.inference import panel_marginals as panel_marginals
from ._panel.fit import AbstractRateFitMethod as AbstractRateFitMethod
from ._panel.fit import EMFit as EMFit
from ._panel.fit import GradientFit as GradientFit
from ._panel.fit import RateFit as RateFit
from ._panel.fit import fit_rates as fit_rates

# priors and posteriors
from ._learning.conjugate import gamma_kl as gamma_kl
from ._learning.priors import AbstractPrior as AbstractPrior
from ._learning.priors import GammaPrior as GammaPrior
from ._learning.priors import NodelmanPrior as NodelmanPrior
from ._learning.posterior import AbstractPosterior as AbstractPosterior
from ._learning.posterior import RatePosterior as RatePosterior
from ._learning.posterior import path_log_likelihood as path_log_likelihood
from ._learning.family_statistics import FamilyStatistics as FamilyStatistics
from ._learning.structure_posterior import StructurePosterior as StructurePosterior
from ._learning.candidates import candidate_parent_sets as candidate_parent_sets
from ._learning.candidates import enumerate_parent_sets as enumerate_parent_sets
from ._learning.family_statistics import family_statistics as family_statistics
from ._learning.structure_posterior import learn_structure as learn_structure
from ._learning.scores import score_parent_sets as score_parent_sets
from ._learning.structure_posterior import structure_log_prior as structure_log_prior
from ._learning.empirical_bayes import EmpiricalBayes as EmpiricalBayes
from ._panel.structure import PanelStructureFit as PanelStructureFit
from ._panel.structure import expected_family_statistics as expected_family_statistics
from ._panel.structure import learn_structure_from_panels as learn_structure_from_panels
from ._panel.structure import panel_family_statistics as panel_family_statistics

# design criteria
from ._criteria.batching import AbstractBatching as AbstractBatching
from ._criteria.batching import Chunked as Chunked
from ._criteria.batching import Sharded as Sharded
from ._criteria.batching import Vmap as Vmap
from ._criteria.kl_estimators import AbstractKLEstimator as AbstractKLEstimator
from ._criteria.kl_estimators import MonteCarlo as MonteCarlo
from ._criteria.kl_estimators import PlugIn as PlugIn
from ._learning.optimisers import AbstractVBHCOptimiser as AbstractVBHCOptimiser
from ._learning.optimisers import Adam as Adam
from ._learning.optimisers import LBFGS as LBFGS
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
from ._criteria.criteria import BHC as BHC
from ._criteria.criteria import EIG as EIG
from ._criteria.criteria import VBHC as VBHC
from ._criteria.criteria import AbstractCriterion as AbstractCriterion
from ._criteria.criteria import AbstractBoxHillCriterion as AbstractBoxHillCriterion
from ._criteria.criteria import score_interventions as score_interventions

# active learning
from ._active_learning.designs import DESIGN_NAMES as DESIGN_NAMES
from ._active_learning.designs import AbstractDesign as AbstractDesign
from ._active_learning.initial_states import (
    AbstractInitialStatePolicy as AbstractInitialStatePolicy,
)
from ._active_learning.initial_states import FixedInitialState as FixedInitialState
from ._active_learning.initial_states import InitialStateDistribution as InitialStateDistribution
from ._active_learning.initial_states import RandomInitialState as RandomInitialState
from ._active_learning.tasks import AbstractLearningTask as AbstractLearningTask
from ._active_learning.loop import ActiveLearningResult as ActiveLearningResult
from ._active_learning.designs import CallableDesign as CallableDesign
from ._active_learning.designs import CriterionDesign as CriterionDesign
from ._active_learning.tasks import ParameterLearningTask as ParameterLearningTask
from ._active_learning.designs import PassiveDesign as PassiveDesign
from ._active_learning.designs import RandomDesign as RandomDesign
from ._active_learning.loop import RepetitionStatus as RepetitionStatus
from ._active_learning.tasks import StructureLearningTask as StructureLearningTask
from ._active_learning.designs import design_from_name as design_from_name
from ._active_learning.loop import run_active_learning as run_active_learning
from ._active_learning.loop import run_repetitions as run_repetitions
from ._experiments.config import ExperimentConfig as ExperimentConfig
from ._experiments.run import run_experiment as run_experiment
from ._experiments.config import default_graph_draws as default_graph_draws

# metrics
from ._active_learning.metrics import adjacency_from_parents as adjacency_from_parents
from ._active_learning.metrics import aupr as aupr
from ._active_learning.metrics import auroc as auroc
from ._active_learning.metrics import edge_aupr as edge_aupr
from ._active_learning.metrics import edge_auroc as edge_auroc
from ._active_learning.metrics import structural_hamming_distance as structural_hamming_distance

# the real-data pool experiment
from ._experiments.pool import POOL_DESIGN_NAMES as POOL_DESIGN_NAMES
from ._experiments.pool import PoolExperiment as PoolExperiment
from ._experiments.pool import PoolResult as PoolResult
from ._experiments.pool import pool_design_from_name as pool_design_from_name
from ._experiments.pool import pool_membership as pool_membership
from ._experiments.pool import pool_scores as pool_scores
from ._experiments.pool import prepare_pool as prepare_pool
from ._experiments.pool import run_pool as run_pool
from ._experiments.pool import run_pool_experiment as run_pool_experiment
from ._experiments.pool import run_pool_repetitions as run_pool_repetitions
from ._experiments.pool import subject_family_statistics as subject_family_statistics

# compiling on the CPU
from ._cli.threefry_lowering import use_unrolled_threefry_on_cpu as use_unrolled_threefry_on_cpu

__version__ = "0.1.0"
