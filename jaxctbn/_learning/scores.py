"""Local scores of candidate parent sets: the log marginal likelihood of every set of every node
under a prior, from checked family statistics; the candidate sets within the memory budget."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._errors import branched_error_if
from .._model.layout import (
    num_configurations,
)
from .candidates import candidate_parent_sets
from .family_statistics import FamilyStatistics
from .memory import _check_memory, _memory_parts, memory_budget_bytes
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
    _check_memory(caller, parts, memory_budget_bytes(memory_budget))
    return sets


#: the most candidate sets of one group of `over_candidate_sets` (exhaustive scoring of 100
#: binary nodes, 495,000 sets: 16 groups, each a 6 MB copy of its statistics, not one 95 MB)
_GROUP_ROWS = 1 << 15


def over_candidate_sets(fn, cardinalities: Sequence[int], *per_node) -> tuple:
    """`tuple(vmap(lambda *row: fn(n, *row))(*(a[n] for a in per_node)) for n in nodes)`: a
    per-set computation of every node's candidate sets, compiled once per group of nodes with
    equal cardinality and equal trailing shapes of their arrays (not once per node: the nodes'
    sets are concatenated, at most `_GROUP_ROWS` per group, each row with its node's index `n`
    traced, and the results split back). Each `a` in `per_node` is a sequence of one array per
    node, its first axis the node's candidate sets (their numbers may differ). The same numbers
    as node by node; a program's size no longer grows with the number of nodes (a 100-node
    posterior was one 100 MiB program)."""
    out: list = [None] * len(cardinalities)
    for group, sizes, values in _grouped_rows(fn, cardinalities, *per_node):
        start = 0
        for n, size in zip(group, sizes):
            out[n] = jax.tree_util.tree_map(lambda v, a=start, b=start + size: v[a:b], values)
            start += size
    return tuple(out)


def _grouped_rows(fn, cardinalities: Sequence[int], *per_node) -> list:
    """`(group, sizes, values)` per group of nodes of `over_candidate_sets`: the group's nodes,
    their numbers of sets and `fn`'s values over the group's concatenated sets (not split)."""
    groups: dict[tuple, list[list[int]]] = {}
    filled: dict[tuple, int] = {}
    for n, k in enumerate(cardinalities):
        shape = (int(k), *(tuple(np.shape(a[n])[1:]) for a in per_node))
        size = int(np.shape(per_node[0][n])[0])
        # a group holds at most _GROUP_ROWS sets (or one node): its concatenated copy stays small
        if shape not in groups or filled[shape] + size > _GROUP_ROWS:
            groups.setdefault(shape, []).append([])
            filled[shape] = 0
        groups[shape][-1].append(n)
        filled[shape] += size
    out = []
    for group in (g for runs in groups.values() for g in runs):
        sizes = [int(np.shape(per_node[0][n])[0]) for n in group]
        rows = [jnp.concatenate([jnp.asarray(a[n]) for n in group]) for a in per_node]
        # the node of each row, from the group's few offsets (not a constant of every row)
        ends = jnp.asarray(np.cumsum(sizes))
        owner = jnp.searchsorted(ends, jax.lax.iota(jnp.int32, sum(sizes)), side="right")
        out.append((group, sizes, jax.vmap(fn)(jnp.asarray(group, jnp.int32)[owner], *rows)))
    return out


def _check_statistics(statistics: FamilyStatistics) -> FamilyStatistics:
    """The same statistics, guarded (`eqx.error_if` on every field) by: dwell times and
    transition counts finite and >= 0."""

    def bad(array):
        return jnp.any(~(array >= 0) | ~jnp.isfinite(array))

    groups = _grouped_rows(
        lambda n, T, M: jnp.stack([bad(T), bad(M)]),
        statistics.cardinalities,
        statistics.dwell_times,
        statistics.transitions,
    )
    preds = jnp.concatenate([flags for _, _, flags in groups]).any(0)
    return branched_error_if(
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
    return over_candidate_sets(
        lambda n, M, T, P: prior.log_marginal_likelihood(n, M, T, num_configurations(P, cards)),
        cards,
        statistics.transitions,
        statistics.dwell_times,
        statistics.parent_sets,
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
