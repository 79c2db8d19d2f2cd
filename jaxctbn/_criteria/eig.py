r"""[`jaxctbn.EIG`][]: the expected information gain by Monte Carlo over sampled paths (maths
§6, §7)."""

from __future__ import annotations

import equinox as eqx
import jax.random as jr

from .._batching import Chunked, Vmap
from .._learning.structure_mixture import StructureMixturePosterior
from .._learning.structure_posterior import StructurePosterior
from .batch_terms import (
    rate_batch_eig,
    structure_batch_eig,
)
from .chunks import STRUCTURE_CHUNK
from .criterion import AbstractCriterion
from .node_divergences import check_single_structure_posterior
from .panel_parameter import (
    panel_parameter_eig,
)
from .panel_structure import (
    panel_structure_eig,
    panel_structure_eig_draws,
)
from .parameter import (
    parameter_eig,
    posterior_draws,
)
from .structure import (
    eig_all_candidates,
    structure_draws,
)

_EIG_TIMES = (
    "outcome: the EIG cannot choose visit times (its Monte Carlo outcomes are not "
    "differentiable in them); give PanelOutcome(times=...) or choose the times with the BHC or VBHC."
)


class EIG(AbstractCriterion):
    r"""The expected information gain by Monte Carlo (maths §6): `num_paths` sampled paths per
    posterior draw, the same path keys for every candidate. For parameters by conjugacy without
    an inner loop (`parameter_eig`); for structure Algorithm 4 with the stratum
    weights (`structure_eig`), per node all candidates x draws x paths of a chunk
    of candidates in one sampling loop that keeps only the paths' statistics, and the chunks
    whose candidates all clamp the node skipped (default batching `Chunked(9)`, as for the
    other structure criteria).

    **Arguments (keyword-only):** `num_paths` (default 10), `max_events` (the most jumps a
    sampled path may have, a longer path raises an error; default 512 for parameters, where it
    is the jump buffer of each path, and 256 for structure, where no jumps are stored and its
    size hardly changes the cost)."""

    num_paths: int = eqx.field(default=10, static=True, kw_only=True)
    max_events: int | None = eqx.field(default=None, static=True, kw_only=True)
    num_inner: int = eqx.field(default=100, static=True, kw_only=True)

    def __check_init__(self):
        if self.num_paths < 1 or (self.max_events is not None and self.max_events < 1):
            raise ValueError(
                f"EIG: num_paths and max_events must be >= 1, got {self.num_paths}, "
                f"{self.max_events}."
            )
        if self.num_inner < 1:
            raise ValueError(f"EIG: num_inner must be >= 1, got {self.num_inner}.")

    def panel_rate_scores(
        self, posterior, candidates, initial_state, horizon, *, key, num_samples, batching,
        outcome,
    ):  # fmt: skip
        if outcome.times is None:
            raise ValueError(_EIG_TIMES)
        key_outer, key_inner, key_paths = jr.split(key, 3)
        draws = posterior_draws(posterior, key_outer, num_samples)
        inner = posterior_draws(posterior, key_inner, self.num_inner)
        times = outcome.visit_times(horizon, posterior.alpha[0].dtype)
        emission = outcome.emission_matrix(draws, times.dtype)

        def panel_eig(iv):
            return panel_parameter_eig(
                posterior,
                draws,
                inner,
                initial_state,
                times,
                iv,
                key=key_paths,
                num_paths=self.num_paths,
                emission=emission,
            )

        return (Vmap() if batching is None else batching).map(panel_eig, candidates)

    def path_rate_scores(
        self, posterior, candidates, initial_state, horizon, *, key, num_samples, solver,
        batching,
    ):  # fmt: skip
        def eig(iv):
            return parameter_eig(
                posterior,
                initial_state,
                horizon,
                key=key,
                num_samples=num_samples,
                num_paths=self.num_paths,
                intervention=iv,
                max_events=self.max_events or 512,
            )

        return (Vmap() if batching is None else batching).map(eig, candidates)

    def panel_structure_scores(
        self, posterior, candidates, initial_state, horizon, *, key, num_samples, batching,
        outcome,
    ):  # fmt: skip
        if outcome.times is None:
            raise ValueError(_EIG_TIMES)
        key_draws, key_paths = jr.split(key)
        draws = panel_structure_eig_draws(posterior, key_draws, num_samples, self.num_inner)
        times = outcome.visit_times(horizon, posterior.dtype)
        emission = outcome.emission_matrix(draws.models, times.dtype)

        def panel_eig(iv):
            return panel_structure_eig(
                draws,
                initial_state,
                times,
                iv,
                key=key_paths,
                num_paths=self.num_paths,
                emission=emission,
            )

        return (Chunked(STRUCTURE_CHUNK) if batching is None else batching).map(
            panel_eig, candidates
        )

    def path_structure_scores(
        self, posterior, candidates, initial_state, horizon, *, key, num_samples, solver,
        batching,
    ):  # fmt: skip
        check_single_structure_posterior(posterior)
        key_draws, key_paths = jr.split(key)
        draws = structure_draws(posterior, key_draws, num_samples)
        return eig_all_candidates(
            posterior,
            draws,
            candidates,
            initial_state,
            horizon,
            key=key_paths,
            num_paths=self.num_paths,
            max_events=self.max_events or 256,
            batching=Chunked(STRUCTURE_CHUNK) if batching is None else batching,
        )

    def path_batch_eig(self, posterior, members, initial_state, horizon, *, key, num_samples):
        """The EIG of one batch of complete-path experiments
        ([`jaxctbn.criteria.GivenBatch`][])."""
        if isinstance(posterior, StructureMixturePosterior):
            raise ValueError(
                "posterior: the batch EIG scores a StructurePosterior (complete paths); a "
                "StructureMixturePosterior's batches are scored by the BHC or VBHC with a "
                "PanelOutcome(times) outcome."
            )
        if isinstance(posterior, StructurePosterior):
            return structure_batch_eig(
                self, posterior, members, initial_state, horizon, key, num_samples
            )
        return rate_batch_eig(self, posterior, members, initial_state, horizon, key, num_samples)
