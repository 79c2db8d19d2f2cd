"""Building blocks for extending jaxctbn: per-node and family statistics, trajectory tables, chain
diagnostics and the structure-search base. Stable names, but not needed to use the paper's
method."""

# ruff: noqa: I001  (grouped as in the package, not alphabetically)

from ._paths.sufficient_statistics import NodeStatistics as NodeStatistics
from ._paths.csv import trajectories_from_dataframe as trajectories_from_dataframe
from ._paths.csv import trajectories_to_dataframe as trajectories_to_dataframe
from ._paths.csv import infer_cardinalities as infer_cardinalities
from ._learning.family_statistics import FamilyStatistics as FamilyStatistics
from ._learning.gamma_mixture import ChainDiagnostics as ChainDiagnostics
from ._learning.search import AbstractStructureSearch as AbstractStructureSearch
from ._learning.family_statistics import family_statistics as family_statistics
from ._learning.structure_mixture import StructureChainDiagnostics as StructureChainDiagnostics
from ._cli.threefry_lowering import use_unrolled_threefry_on_cpu as use_unrolled_threefry_on_cpu
