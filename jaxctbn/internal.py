"""Building blocks for extending jaxctbn: per-node and family statistics, chain diagnostics and
the structure-search base. Stable names, but not needed to use the paper's method."""

# ruff: noqa: I001  (grouped as in the package, not alphabetically)

from ._paths.sufficient_statistics import NodeStatistics as NodeStatistics
from ._learning.family_statistics import FamilyStatistics as FamilyStatistics
from ._learning.gamma_mixture import ChainDiagnostics as ChainDiagnostics
from ._learning.search import AbstractStructureSearch as AbstractStructureSearch
from ._learning.family_statistics import family_statistics as family_statistics
from ._learning.structure_mixture import StructureChainDiagnostics as StructureChainDiagnostics
