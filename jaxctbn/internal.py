"""Building blocks for extending jaxctbn: generator helpers, sampler internals, family statistics
and parent-set scores. Stable names, but not needed to use the paper's method."""

# ruff: noqa: I001  (grouped as in the package, not alphabetically)

from ._master_equation.generator import amalgamate as amalgamate
from ._master_equation.generator import batch_last as batch_last
from ._master_equation.preparation import initial_distribution as initial_distribution
from ._master_equation.automatic_solver import resolve_solver as resolve_solver
from ._master_equation.mean_field import MeanFieldStatistics as MeanFieldStatistics
from ._master_equation.monte_carlo import SampledStatistics as SampledStatistics
from ._paths.sampling import automatic_max_events as automatic_max_events
from ._paths.sampling import sample_trajectory as sample_trajectory
from ._paths.sampling import sample_within_cap as sample_within_cap
from ._paths.sufficient_statistics import NodeStatistics as NodeStatistics
from ._paths.sufficient_statistics import node_statistics as node_statistics
from ._paths.csv import trajectories_from_dataframe as trajectories_from_dataframe
from ._paths.csv import trajectories_to_dataframe as trajectories_to_dataframe
from ._paths.csv import infer_cardinalities as infer_cardinalities
from ._learning.family_statistics import FamilyStatistics as FamilyStatistics
from ._learning.gamma_mixture import ChainDiagnostics as ChainDiagnostics
from ._learning.chain_diagnostics import split_r_hat as split_r_hat
from ._learning.chain_diagnostics import effective_sample_size as effective_sample_size
from ._panel.bridges import bridge as bridge
from ._learning.candidates import candidate_parent_sets as candidate_parent_sets
from ._learning.search import AbstractStructureSearch as AbstractStructureSearch
from ._learning.candidates import enumerate_parent_sets as enumerate_parent_sets
from ._learning.family_statistics import family_statistics as family_statistics
from ._learning.scores import score_parent_sets as score_parent_sets
from ._learning.structure_posterior import structure_log_prior as structure_log_prior
from ._learning.structure_mixture import StructureChainDiagnostics as StructureChainDiagnostics
from ._cli.threefry_lowering import use_unrolled_threefry_on_cpu as use_unrolled_threefry_on_cpu
from ._errors import error_message as error_message
