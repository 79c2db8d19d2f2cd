"""Local scores of candidate parent sets: the log marginal likelihood of every set of every node
under a prior, from checked family statistics; the candidate sets within the memory budget."""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._model.layout import (
    num_configurations,
)
from .candidates import candidate_parent_sets
from .family_statistics import FamilyStatistics
from .memory import _check_memory, _memory_budget, _memory_parts
from .priors import AbstractPrior, GammaPrior, check_prior


def candidate_sets_within_budget(
    caller: str,
    names: tuple[str, ...],
    cards: tuple[int, ...],
    max_parents: int | Sequence[int],
    *,
    required_edges: Sequence[tuple[int, int]],
    forbidden_edges: Sequence[tuple[int, int]],
    tiers: Sequence[int] | None = None,
    memory_budget: int | float | str | None,
) -> tuple[Array, ...]:
    """The candidate parent sets, after checking that the statistics tables they need (no
    trajectory buffers) fit in the memory budget (a `ValueError` from `caller` otherwise)."""
    sets = candidate_parent_sets(
        len(cards),
        max_parents,
        required_edges=required_edges,
        forbidden_edges=forbidden_edges,
        tiers=tiers,
    )
    parts = _memory_parts(
        cards,
        [(int(S.shape[0]), int(S.shape[-1])) for S in sets],
        rows=0,
        events=0,
        method=None,
        chunk=1,
        itemsize=jnp.dtype(float).itemsize,
        names=names,
    )
    _check_memory(caller, parts, _memory_budget(memory_budget))
    return sets


def _check_statistics(statistics: FamilyStatistics) -> FamilyStatistics:
    """The same statistics, guarded (`eqx.error_if` on every field) by: dwell times and
    transition counts finite and >= 0."""
    bad_T = jnp.stack([jnp.any(~(T >= 0) | ~jnp.isfinite(T)) for T in statistics.dwell_times])
    bad_M = jnp.stack([jnp.any(~(M >= 0) | ~jnp.isfinite(M)) for M in statistics.transitions])
    preds = jnp.stack([bad_T.any(), bad_M.any()])
    return eqx.branched_error_if(
        statistics,
        preds.any(),
        jnp.argmax(preds),
        [
            "statistics: dwell times must be finite and >= 0.",
            "statistics: transition counts must be finite and >= 0.",
        ],
    )


def _scores(prior: AbstractPrior, statistics: FamilyStatistics) -> tuple:
    cards = statistics.cardinalities
    return tuple(
        jax.vmap(lambda M, T, u, n=n: prior.log_marginal_likelihood(n, M, T, u))(
            statistics.transitions[n],
            statistics.dwell_times[n],
            num_configurations(statistics.parent_sets[n], cards),
        )
        for n in range(len(cards))
    )


def score_parent_sets(
    statistics: FamilyStatistics, *, prior: AbstractPrior = GammaPrior()
) -> tuple[Float[Array, " _sets"], ...]:
    r"""Local log marginal likelihoods $\ln p(X_n\mid X_P)$ of every candidate parent set of
    every node under `prior` ([`jaxctbn.GammaPrior`][], the paper's, or
    [`jaxctbn.NodelmanPrior`][], CTBN-RLE's family score), vectorised over sets, **with** the
    prior's normalising terms (maths §5). Statistics must be finite and $\ge0$ (checked inside
    jit, guarding every score)."""
    check_prior(prior, len(statistics.cardinalities))
    return _scores(prior, _check_statistics(statistics))
