"""How the structure criteria batch their candidates by default."""

from __future__ import annotations

import jax

from .._batching import Chunked
from .structure import (
    AbstractGraphDraws,
    StratifiedGraphDraws,
)

#: Candidates scored together by default for structure learning: the scorer skips, per node, the
#: chunks whose candidates all clamp that node.
STRUCTURE_CHUNK = 9
#: The same for the (V)BHC with stratified draws on a CPU, where a chunk's candidates x draws are
#: solved as one batch, which the uniformisation sorts by rate into cache-sized groups of similar
#: rate (`Uniformisation.group_size`): 27 candidates x 8 sets x 10 draws of the paper's network
#: (every candidate that leaves a node free) are 2,160 problems in 9 groups, whose loops run
#: fewer products than 9 unsorted chunks of 3 candidates (why: the `jaxctbn.Uniformisation`
#: docstring; the step is timed in `benchmarks/criteria/bench_design_step.py`, results in
#: `benchmarks/results/design_step.md`).
CPU_STRATIFIED_CHUNK = 27


def structure_batching(graph_draws: AbstractGraphDraws) -> Chunked:
    """The default batching of the structure (V)BHC's candidates."""
    if isinstance(graph_draws, StratifiedGraphDraws) and jax.default_backend() == "cpu":
        return Chunked(CPU_STRATIFIED_CHUNK)
    return Chunked(STRUCTURE_CHUNK)
