"""Metrics for structure and parameter learning (jittable, so they run inside `lax.scan`)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float


def _prepare(scores, labels):
    scores = jnp.asarray(scores).ravel()
    labels = jnp.asarray(labels).ravel()
    if scores.shape != labels.shape:
        raise ValueError(
            f"scores {scores.shape} and labels {labels.shape} must have the same size."
        )
    if scores.shape[0] == 0:
        raise ValueError("scores: empty; the AUROC/AUPR of no candidates is undefined.")
    order = jnp.argsort(-scores, stable=True)
    s = scores[order]
    y = (labels[order] > 0).astype(jnp.result_type(scores.dtype, float))
    # last element of each group of tied scores
    group_end = jnp.concatenate([s[1:] != s[:-1], jnp.ones((1,), bool)])
    return s, y, group_end


def _require_classes(value, labels, *, negatives: bool, message: str):
    """`value`, guarded: `labels` must hold a positive (and, if `negatives`, a negative) label.
    A `ValueError` when the labels are concrete, an `eqx.error_if` on `value` when traced."""
    if isinstance(labels, jax.core.Tracer):
        y = jnp.ravel(labels) > 0
        bad = ~jnp.any(y) | (negatives & jnp.all(y))
        return eqx.error_if(value, bad, message)
    y = np.ravel(np.asarray(labels)) > 0
    if not y.any() or (negatives and y.all()):
        raise ValueError(message)
    return value


def auroc(scores: ArrayLike, labels: ArrayLike) -> Float[Array, ""]:
    r"""Area under the ROC curve, ties counted as one half (the Mann–Whitney statistic; equal to
    `sklearn.metrics.roc_auc_score`). The ROC curve is undefined when `labels` are all positive
    or all negative: that raises (a `ValueError` for concrete labels, an `eqx.error_if` on the
    result under `jit`), as do empty inputs."""
    return _require_classes(
        _auroc_value(scores, labels),
        labels,
        negatives=True,
        message="labels: the AUROC needs at least one positive and one negative label.",
    )


def _auroc_value(scores, labels):
    s, y, group_end = _prepare(scores, labels)
    n = s.shape[0]
    # average rank (1-based, ascending scores) of each tie group
    idx = jnp.arange(n)
    start = jnp.concatenate([jnp.ones((1,), bool), s[1:] != s[:-1]])
    first = _cummax(jnp.where(start, idx, 0))
    last = _cummin_reverse(jnp.where(group_end, idx, n - 1))
    desc_rank = (first + last) / 2.0  # 0-based position in descending order, averaged over ties
    asc_rank = n - desc_rank  # 1-based ascending rank
    P = y.sum()
    Q = n - P
    u = (asc_rank * y).sum() - P * (P + 1) / 2
    return u / jnp.maximum(P * Q, 1.0)


def aupr(scores: ArrayLike, labels: ArrayLike) -> Float[Array, ""]:
    r"""Area under the precision–recall curve as average precision,
    $\sum_j (R_j-R_{j-1})P_j$ over the distinct score thresholds (ties grouped), equal to
    `sklearn.metrics.average_precision_score`. Recall is undefined without a positive label: that
    raises (a `ValueError` for concrete labels, an `eqx.error_if` under `jit`), as do empty
    inputs."""
    return _require_classes(
        _aupr_value(scores, labels),
        labels,
        negatives=False,
        message="labels: the AUPR needs at least one positive label.",
    )


def _aupr_value(scores, labels):
    s, y, group_end = _prepare(scores, labels)
    n = s.shape[0]
    tp = jnp.cumsum(y)
    precision = tp / jnp.arange(1, n + 1)
    P = y.sum()
    tp_end = jnp.where(group_end, tp, 0.0)
    prev_end_tp = jnp.concatenate([jnp.zeros((1,), tp.dtype), _cummax(tp_end)[:-1]])
    gain = jnp.where(group_end, tp - prev_end_tp, 0.0)
    return (gain * precision).sum() / jnp.maximum(P, 1.0)


def _cummax(x):
    return jax.lax.cummax(x, axis=0)


def _cummin_reverse(x):
    return jax.lax.cummin(x, axis=0, reverse=True)


def _off_diagonal(matrix):
    if not isinstance(matrix, np.ndarray):
        matrix = jnp.asarray(matrix)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"expected a square (N, N) matrix, got shape {matrix.shape}.")
    n = matrix.shape[0]
    mask = ~np.eye(n, dtype=bool)  # concrete, so the indexing works under jit
    return matrix[mask]


def _edge_metric(metric, edge_probabilities, true_adjacency, name: str):
    """`metric` of the off-diagonal entries, with the true graph checked to have both an edge
    and an absent edge (else the metric is undefined) by `_require_classes`."""
    scores = _off_diagonal(edge_probabilities)
    message = (
        f"true_adjacency: the edge {name} needs a true graph with at least one edge and one "
        "absent edge."
    )
    if not isinstance(true_adjacency, jax.core.Tracer):
        true_adjacency = np.asarray(true_adjacency)
        if true_adjacency.ndim == 2 and true_adjacency.shape[0] == 1:
            raise ValueError(
                f"true_adjacency: a 1-node graph has no candidate edges; the edge {name} is "
                "undefined (structure learning needs at least 2 nodes)."
            )
    labels = _off_diagonal(true_adjacency)
    return _require_classes(metric(scores, labels), labels, negatives=True, message=message)


def edge_auroc(edge_probabilities: ArrayLike, true_adjacency: ArrayLike) -> Float[Array, ""]:
    """AUROC of edge marginals `[m, n] = p(m -> n)` against a true adjacency (diagonal ignored).
    Raises when the true graph has no edge or no absent edge (the AUROC is then undefined)."""
    return _edge_metric(_auroc_value, edge_probabilities, true_adjacency, "AUROC")


def edge_aupr(edge_probabilities: ArrayLike, true_adjacency: ArrayLike) -> Float[Array, ""]:
    """AUPR of edge marginals against a true adjacency (diagonal ignored). Raises when the true
    graph has no edge or no absent edge (as for [`jaxctbn.edge_auroc`][])."""
    return _edge_metric(_aupr_value, edge_probabilities, true_adjacency, "AUPR")


def structural_hamming_distance(adjacency: ArrayLike, true_adjacency: ArrayLike) -> Array:
    """Number of directed edges to add or remove to turn one graph into the other. CTBN edges
    $m\\to n$ and $n\\to m$ are separate (cycles are allowed), so a reversed edge counts 2."""
    a, b = jnp.asarray(adjacency), jnp.asarray(true_adjacency)
    if a.shape != b.shape:
        raise ValueError(f"adjacency shapes differ: {a.shape} vs {b.shape}.")
    return jnp.sum((_off_diagonal(a) > 0) != (_off_diagonal(b) > 0))


def adjacency_from_parents(parents, num_nodes: int) -> Array:
    """`(N, N)` 0/1 adjacency with `[m, n] = 1` for each parent m of n."""
    adj = [[0] * num_nodes for _ in range(num_nodes)]
    for n, ps in enumerate(parents):
        for m in ps:
            adj[int(m)][n] = 1
    return jnp.asarray(adj, jnp.int32)
