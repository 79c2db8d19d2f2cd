r"""Metrics for structure and parameter learning (jittable, so they run inside `lax.scan`).

**Ties within a tolerance.** `auroc`, `aupr`, `edge_auroc` and `edge_aupr` treat scores that are
equal up to rounding as tied. Scores that are equal in exact arithmetic (for instance every edge
marginal out of a node that never moved, each $1/2$) often come out a few ulp apart, and ranking
them by that rounding noise moves the AUROC and AUPR by tenths. The scores are therefore grouped
before they are ranked:

1. sort them in descending order, $s_1\ge s_2\ge\dots\ge s_n$;
2. consecutive $s_i\ge s_{i+1}$ are linked (tied) when
   $s_i-s_{i+1}\le\mathrm{rtol}\cdot\max(|s_i|,|s_{i+1}|)$, with $\mathrm{rtol}=10^{-9}$ by
   default; a zero is therefore tied only with another exact zero;
3. the tie groups are the maximal runs of linked scores. Links chain: a run of scores, each
   within the tolerance of its neighbour, is one group even where its first and last scores are
   further apart than the tolerance;
4. each group then counts as one tied score, exactly as bit-identical ties do: a half in the
   AUROC (average ranks), one threshold in the AUPR.

With `rtol=0` the groups are the exactly equal scores, as in `sklearn.metrics.roc_auc_score` and
`average_precision_score`. The default $10^{-9}$ is about $10^7$ float64 ulp, far above rounding
and far below differences that carry information. It is below float32 resolution
($1.2\cdot10^{-7}$), so with float32 scores the default groups only exact ties; pass e.g.
`rtol=1e-5` there. The tolerance is jaxctbn's choice, not the paper's.

Scores must be finite: NaN or infinite scores raise (a `ValueError` when concrete, an
`eqx.error_if` on the result when traced) instead of being ranked silently.
"""

from __future__ import annotations

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._errors import error_if


def _prepare(scores, labels, rtol):
    """Scores sorted in descending order, their 0/1 labels, and the tie groups (within `rtol`)
    as two masks: `start` on the first and `end` on the last element of each group."""
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
    # a new group starts between sorted neighbours a >= b further apart than rtol * max(|a|, |b|)
    # (with rtol = 0: a != b); chains of close neighbours stay in one group
    a, b = s[:-1], s[1:]
    split = (a - b) > rtol * jnp.maximum(jnp.abs(a), jnp.abs(b))
    true = jnp.ones((1,), bool)
    return s, y, jnp.concatenate([true, split]), jnp.concatenate([split, true])


def _check_rtol(rtol):
    """`rtol` checked: a `ValueError` when concrete; when traced, `(rtol, bad)` with the
    condition for an `eqx.error_if` on the result."""
    if isinstance(rtol, jax.core.Tracer):
        return rtol, ~(jnp.isfinite(rtol) & (rtol >= 0))
    if np.ndim(rtol) != 0 or not (np.isfinite(rtol) and rtol >= 0):
        raise ValueError(f"rtol: must be a finite number >= 0, got {rtol!r}.")
    return float(rtol), None


def _require_classes(value, labels, *, negatives: bool, message: str):
    """`value`, guarded: `labels` must hold a positive (and, if `negatives`, a negative) label.
    A `ValueError` when the labels are concrete, an `eqx.error_if` on `value` when traced."""
    if isinstance(labels, jax.core.Tracer):
        y = jnp.ravel(labels) > 0
        bad = ~jnp.any(y) | (negatives & jnp.all(y))
        return error_if(value, bad, message)
    y = np.ravel(np.asarray(labels)) > 0
    if not y.any() or (negatives and y.all()):
        raise ValueError(message)
    return value


def _metric(value_fn, scores, labels, rtol, *, negatives, name, scores_name, labels_message):
    """`value_fn(scores, labels, rtol)` with every check: `rtol`, finite `scores`, both classes
    (or a positive one) in `labels`. `ValueError`s for concrete inputs, `eqx.error_if` on the
    result for traced ones."""
    rtol, bad_rtol = _check_rtol(rtol)
    finite = f"{scores_name}: must be finite; the {name} of NaN or infinite scores is undefined."
    traced = isinstance(scores, jax.core.Tracer)
    if not traced and not np.all(np.isfinite(np.asarray(scores))):
        raise ValueError(finite)
    value = value_fn(scores, labels, rtol)
    if bad_rtol is not None:
        value = error_if(value, bad_rtol, "rtol: must be a finite number >= 0.")
    if traced:
        value = error_if(value, ~jnp.all(jnp.isfinite(scores)), finite)
    return _require_classes(value, labels, negatives=negatives, message=labels_message)


def auroc(scores: ArrayLike, labels: ArrayLike, *, rtol: float = 1e-9) -> Float[Array, ""]:
    r"""Area under the ROC curve, ties counted as one half (the Mann–Whitney statistic,
    $U/(PQ)$ with average ranks for ties, $P$ positive and $Q$ negative labels).

    Scores equal within a relative tolerance are tied: with the scores sorted in descending
    order, neighbours $a\ge b$ are linked when $a-b\le\mathrm{rtol}\cdot\max(|a|,|b|)$ (so a
    zero ties only with an exact zero), and the tie groups are the maximal runs of links. Links
    chain: neighbours each within the tolerance form one group even where the run's ends are
    further apart. Each group then counts as one tied score. With `rtol=0` only equal scores tie
    and the value is `sklearn.metrics.roc_auc_score`; the default $10^{-9}$ also ties float64
    scores that differ by rounding (it is below float32 resolution: for float32 scores pass e.g.
    `rtol=1e-5`).

    **Arguments:**

    - `scores`: the scores, higher meaning "more likely positive"; any shape, flattened. Must be
      finite.
    - `labels`: labels of the same size; `> 0` is positive.
    - `rtol`: the relative tie tolerance, finite and $\ge0$ (keyword-only).

    **Returns:** the AUROC, a scalar in $[0, 1]$.

    The ROC curve is undefined when `labels` are all positive or all negative: that raises (a
    `ValueError` for concrete labels, an `eqx.error_if` on the result under `jit`), as do
    non-finite scores, a bad `rtol` and empty inputs.
    """
    return _metric(
        _auroc_value,
        scores,
        labels,
        rtol,
        negatives=True,
        name="AUROC",
        scores_name="scores",
        labels_message="labels: the AUROC needs at least one positive and one negative label.",
    )


def _auroc_value(scores, labels, rtol):
    s, y, start, end = _prepare(scores, labels, rtol)
    n = s.shape[0]
    # average rank (1-based, ascending scores) of each tie group
    idx = jnp.arange(n)
    first = _cummax(jnp.where(start, idx, 0))
    last = _cummin_reverse(jnp.where(end, idx, n - 1))
    desc_rank = (first + last) / 2.0  # 0-based position in descending order, averaged over ties
    asc_rank = n - desc_rank  # 1-based ascending rank
    P = y.sum()
    Q = n - P
    u = (asc_rank * y).sum() - P * (P + 1) / 2
    return u / jnp.maximum(P * Q, 1.0)


def aupr(scores: ArrayLike, labels: ArrayLike, *, rtol: float = 1e-9) -> Float[Array, ""]:
    r"""Area under the precision–recall curve as average precision,
    $\sum_j (R_j-R_{j-1})P_j$ over the score thresholds $j$, one threshold per tie group.

    Tie groups as in `auroc`: sorted in descending order, neighbours $a\ge b$ are
    tied when $a-b\le\mathrm{rtol}\cdot\max(|a|,|b|)$, and the groups are the maximal (chained)
    runs. With `rtol=0` only equal scores tie and the value is
    `sklearn.metrics.average_precision_score`.

    **Arguments:**

    - `scores`: the scores, any shape, flattened. Must be finite.
    - `labels`: labels of the same size; `> 0` is positive.
    - `rtol`: the relative tie tolerance, finite and $\ge0$ (keyword-only).

    **Returns:** the average precision, a scalar in $[0, 1]$.

    Recall is undefined without a positive label: that raises (a `ValueError` for concrete
    labels, an `eqx.error_if` under `jit`), as do non-finite scores, a bad `rtol` and empty
    inputs.
    """
    return _metric(
        _aupr_value,
        scores,
        labels,
        rtol,
        negatives=False,
        name="AUPR",
        scores_name="scores",
        labels_message="labels: the AUPR needs at least one positive label.",
    )


def _aupr_value(scores, labels, rtol):
    s, y, _, end = _prepare(scores, labels, rtol)
    n = s.shape[0]
    tp = jnp.cumsum(y)
    precision = tp / jnp.arange(1, n + 1)
    P = y.sum()
    tp_end = jnp.where(end, tp, 0.0)
    prev_end_tp = jnp.concatenate([jnp.zeros((1,), tp.dtype), _cummax(tp_end)[:-1]])
    gain = jnp.where(end, tp - prev_end_tp, 0.0)
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


def _edge_metric(metric, edge_probabilities, true_adjacency, rtol, name: str):
    """`metric` of the off-diagonal entries, with the true graph checked to have both an edge
    and an absent edge (else the metric is undefined) by `_require_classes`."""
    scores = _off_diagonal(edge_probabilities)
    if not isinstance(true_adjacency, jax.core.Tracer):
        true_adjacency = np.asarray(true_adjacency)
        if true_adjacency.ndim == 2 and true_adjacency.shape[0] == 1:
            raise ValueError(
                f"true_adjacency: a 1-node graph has no candidate edges; the edge {name} is "
                "undefined (structure learning needs at least 2 nodes)."
            )
    return _metric(
        metric,
        scores,
        _off_diagonal(true_adjacency),
        rtol,
        negatives=True,
        name=f"edge {name}",
        scores_name="edge_probabilities (off the diagonal)",
        labels_message=(
            f"true_adjacency: the edge {name} needs a true graph with at least one edge and one "
            "absent edge."
        ),
    )


def edge_auroc(
    edge_probabilities: ArrayLike, true_adjacency: ArrayLike, *, rtol: float = 1e-9
) -> Float[Array, ""]:
    """AUROC of edge marginals `[m, n] = p(m -> n)` against a true adjacency (diagonal ignored):
    `auroc` of the off-diagonal entries, with the same tie tolerance `rtol`
    (keyword-only, default $10^{-9}$; marginals equal up to rounding are tied). The off-diagonal
    marginals must be finite. Raises when the true graph has no edge or no absent edge (the
    AUROC is then undefined)."""
    return _edge_metric(_auroc_value, edge_probabilities, true_adjacency, rtol, "AUROC")


def edge_aupr(
    edge_probabilities: ArrayLike, true_adjacency: ArrayLike, *, rtol: float = 1e-9
) -> Float[Array, ""]:
    """AUPR of edge marginals against a true adjacency (diagonal ignored): `aupr` of
    the off-diagonal entries, with the same tie tolerance `rtol` (keyword-only, default
    $10^{-9}$). The off-diagonal marginals must be finite. Raises when the true graph has no edge
    or no absent edge (as for [`jaxctbn.experiments.edge_auroc`][])."""
    return _edge_metric(_aupr_value, edge_probabilities, true_adjacency, rtol, "AUPR")


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
