"""jaxctbn: conditional continuous-time Bayesian networks in JAX, for active learning with
interventions (Linzner & Koeppl, ICML 2021)."""

from ._ctbn import AbstractCTBN as AbstractCTBN, CTBN as CTBN, PaddedCTBN as PaddedCTBN
from ._generator import Generator as Generator, amalgamate as amalgamate
from ._interventions import Intervention as Intervention, intervention_space as intervention_space
from ._master_equation import (
    AbstractMasterEquationSolver as AbstractMasterEquationSolver,
    DiffraxSolver as DiffraxSolver,
    ExpectedStatistics as ExpectedStatistics,
    MatrixExponential as MatrixExponential,
    Uniformisation as Uniformisation,
    expected_statistics as expected_statistics,
    expected_statistics_batch as expected_statistics_batch,
    initial_distribution as initial_distribution,
    marginals as marginals,
)
from ._random import (
    paper_network as paper_network,
    random_ctbn as random_ctbn,
    random_graph as random_graph,
    scaled_softmax_ctbn as scaled_softmax_ctbn,
)
from ._sampling import (
    Trajectories as Trajectories,
    sample_trajectories as sample_trajectories,
    sample_trajectory as sample_trajectory,
)
from ._statistics import (
    NodeStatistics as NodeStatistics,
    SufficientStatistics as SufficientStatistics,
    node_statistics as node_statistics,
    read_trajectories_csv as read_trajectories_csv,
    trajectories_from_dataframe as trajectories_from_dataframe,
    trajectories_to_dataframe as trajectories_to_dataframe,
    write_trajectories_csv as write_trajectories_csv,
)

__version__ = "0.1.0"
