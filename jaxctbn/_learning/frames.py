"""The posteriors as other packages' objects: a rate posterior's table (the `posterior` of
`jaxctbn fit --posterior`'s JSON) and its draws as ArviZ `InferenceData`; a structure
posterior's edge and parent-set tables (the `nodes` of `jaxctbn learn`'s JSON) and its graph as
a networkx `DiGraph`. Eager, on the host; the labels are `jaxctbn._model.frames`'."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from .._model.frames import (
    assignment_label,
    free_rates,
    optional_import,
    rate_draws_inference_data,
)


def check_level(level: float) -> float:
    """An interval's level, in $(0, 1)$."""
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"level: expected a number in (0, 1), got {level!r}.")
    return float(level)


def interval_columns(level: float) -> tuple[str, str]:
    """The interval's column names: `ci95_lower`, `ci95_upper` at level 0.95 (the JSON's
    `ci95`)."""
    name = f"ci{100 * level:g}"
    return f"{name}_lower", f"{name}_upper"


@eqx.filter_jit  # one program (eagerly: one per operation, and the bisection's loop)
def _summaries(mixture, probabilities):
    return mixture.rate_means(), mixture.rate_sds(), mixture.rate_quantiles(probabilities)


def rate_posterior_frame(mixture: Any, level: float, what: str) -> Any:
    """One row per free rate of a `GammaMixturePosterior`: node, parent states, from, to,
    mean, sd, the central interval at `level` and, with chains, split R-hat and ESS."""
    pd = optional_import("pandas", what)
    level = check_level(level)
    lower, upper = interval_columns(level)
    probabilities = jnp.array([(1 - level) / 2, (1 + level) / 2])
    means, sds, quantiles = jax.device_get(_summaries(mixture, probabilities))
    diagnostics = mixture.diagnostics
    rows = []
    for n, u, x, y, states in free_rates(mixture, mixture.free_rates()):
        row = {
            "node": mixture.names[n],
            "parent_states": assignment_label(states),
            "from": x,
            "to": y,
            "mean": float(means[n][u, x, y]),
            "sd": float(sds[n][u, x, y]),
            lower: float(quantiles[n][0, u, x, y]),
            upper: float(quantiles[n][1, u, x, y]),
        }
        if diagnostics is not None:
            row["split_r_hat"] = float(diagnostics.split_r_hat[n][u, x, y])
            row["ess"] = float(diagnostics.effective_sample_size[n][u, x, y])
        rows.append(row)
    columns = ["node", "parent_states", "from", "to", "mean", "sd", lower, upper]
    columns += [] if diagnostics is None else ["split_r_hat", "ess"]
    return pd.DataFrame(rows, columns=columns)


def _count(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}.")
    return value


@eqx.filter_jit
def _sampled_cims(posterior, keys):
    return jax.vmap(posterior.sample)(keys).cims


def sampled_inference_data(
    posterior: Any, free: Any, *, key: Any, num_draws: int, num_chains: int, what: str
) -> Any:
    """`num_chains` x `num_draws` independent draws of `posterior.sample` (one key each, split
    from `key`) as ArviZ `InferenceData` (the free rates `free`, named as in
    `jaxctbn._model.frames.rate_name`)."""
    optional_import("arviz", what)
    num_draws, num_chains = _count(num_draws, "num_draws"), _count(num_chains, "num_chains")
    keys = jr.split(key, num_chains * num_draws)
    cims = jax.device_get(_sampled_cims(posterior, keys))
    draws = [np.reshape(q, (num_chains, num_draws) + q.shape[1:]) for q in cims]
    return rate_draws_inference_data(posterior, free, draws, what)


def edge_frame(posterior: Any, what: str) -> Any:
    """`parent`, `child`, `probability`: every ordered pair of distinct nodes, child by child
    (the `edge_marginals` of `jaxctbn learn`'s JSON)."""
    pd = optional_import("pandas", what)
    edges = np.asarray(jax.device_get(posterior.edge_marginals()))
    names = posterior.names
    rows = [
        (names[m], names[n], float(edges[m, n]))
        for n in range(len(names))
        for m in range(len(names))
        if m != n
    ]
    return pd.DataFrame(rows, columns=["parent", "child", "probability"])


def parent_set_frame(posterior: Any, what: str) -> Any:
    """`node`, `parents` (`A,B`; `""` for none), `log_marginal_likelihood`, `posterior`: every
    candidate parent set of every node (the `parent_sets` of `jaxctbn learn`'s JSON)."""
    pd = optional_import("pandas", what)
    probabilities, scores = jax.device_get(
        (posterior.parent_set_probabilities(), posterior.log_marginal_likelihoods)
    )
    names = posterior.names
    rows = []
    for n, name in enumerate(names):
        for i, parents in enumerate(np.asarray(posterior.parent_sets[n])):
            label = ",".join(names[p] for p in parents if p >= 0)
            rows.append((name, label, float(scores[n][i]), float(probabilities[n][i])))
    columns = ["node", "parents", "log_marginal_likelihood", "posterior"]
    return pd.DataFrame(rows, columns=columns)


def structure_graph(posterior: Any, threshold: float, what: str) -> Any:
    """A networkx `DiGraph`: every node (attribute `cardinality`) and each edge whose marginal
    probability exceeds `threshold` (attribute `weight`, that probability)."""
    nx = optional_import("networkx", what)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        raise ValueError(f"threshold: expected a number in [0, 1), got {threshold!r}.")
    if not 0 <= threshold < 1:
        raise ValueError(f"threshold: expected a number in [0, 1), got {threshold!r}.")
    edges = np.asarray(jax.device_get(posterior.edge_marginals()))
    names = posterior.names
    graph = nx.DiGraph()
    for name, k in zip(names, posterior.cardinalities):
        graph.add_node(name, cardinality=int(k))
    for m, n in zip(*np.nonzero(edges > threshold)):
        if m != n:
            graph.add_edge(names[m], names[n], weight=float(edges[m, n]))
    return graph
