"""The paper's synthetic experiments, the real-data pool experiment and the metrics they report."""

# ruff: noqa: I001  (grouped as in the package, not alphabetically)

from ._model.random_networks import random_graph as random_graph
from ._model.random_networks import scaled_softmax_ctbn as scaled_softmax_ctbn
from ._active_learning.repetitions import RepetitionStatus as RepetitionStatus
from ._experiments.config import ExperimentConfig as ExperimentConfig
from ._experiments.run import run_experiment as run_experiment
from ._active_learning.metrics import edge_aupr as edge_aupr
from ._active_learning.metrics import edge_auroc as edge_auroc
from ._active_learning.metrics import structural_hamming_distance as structural_hamming_distance
from ._experiments.pool_subjects import PoolExperiment as PoolExperiment
from ._experiments.pool import PoolResult as PoolResult
from ._experiments.pool_subjects import prepare_pool as prepare_pool
from ._experiments.pool import run_pool as run_pool
