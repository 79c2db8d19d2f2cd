"""Random graphs and random CTBNs as used in the paper's experiments (§6)."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import PRNGKeyArray

from .ctbn import CTBN
from .layout import parent_configurations


def _host_rng(key: PRNGKeyArray) -> np.random.Generator:
    seed = np.asarray(
        jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    )
    return np.random.default_rng(seed.astype(np.uint32).ravel().tolist())


def random_graph(
    key: PRNGKeyArray, num_nodes: int, *, max_parents: int, edge_probability: float = 0.5
) -> tuple[tuple[int, ...], ...]:
    """A random directed graph (cycles allowed, no self-loops) with in-degree <= `max_parents`.

    Each possible edge is present with `edge_probability`; nodes with too many parents keep a
    uniformly chosen subset. The graph is static structure, so this runs on the host."""
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be >= 1, got {num_nodes}.")
    if not 0 <= max_parents <= num_nodes - 1:
        raise ValueError(f"max_parents must be between 0 and {num_nodes - 1}, got {max_parents}.")
    if not 0 <= edge_probability <= 1:
        raise ValueError(f"edge_probability must be in [0, 1], got {edge_probability}.")
    rng = _host_rng(key)
    parents = []
    for n in range(num_nodes):
        cand = [m for m in range(num_nodes) if m != n and rng.random() < edge_probability]
        if len(cand) > max_parents:
            cand = sorted(rng.choice(cand, size=max_parents, replace=False).tolist())
        parents.append(tuple(cand))
    return tuple(parents)


def _check_common(
    parents, cardinalities, fast, names
) -> tuple[tuple[int, ...], np.ndarray, Sequence[str] | None]:
    n = len(parents)
    cardinalities = tuple(int(k) for k in (cardinalities if cardinalities is not None else [2] * n))
    if len(cardinalities) != n:
        raise ValueError(f"cardinalities: need one per node ({n}), got {len(cardinalities)}.")
    fast = np.ones(n, bool) if fast is None else np.asarray(fast, bool)
    if fast.shape != (n,):
        raise ValueError(f"fast: need one flag per node ({n}), got shape {fast.shape}.")
    return cardinalities, fast, names


def random_ctbn(
    key: PRNGKeyArray,
    parents: Sequence[Sequence[int]],
    cardinalities: Sequence[int] | None = None,
    *,
    fast: Sequence[bool] | None = None,
    alpha_fast: float = 5.0,
    alpha_slow: float = 0.2,
    beta: float = 1.0,
    names: Sequence[str] | None = None,
) -> CTBN:
    r"""Rates $\Lambda_n(x,x',u)\sim\mathrm{Gam}(\alpha,\beta)$ independently, with
    $\alpha=\alpha_f=5$ for fast and $\alpha_s=1/5$ for slow nodes and $\beta=1$ (paper §6,
    structure learning). `fast` flags fast nodes (default: all fast)."""
    cardinalities, is_fast, names = _check_common(parents, cardinalities, fast, names)
    if alpha_fast <= 0 or alpha_slow <= 0 or beta <= 0:
        raise ValueError("alpha_fast, alpha_slow and beta must be > 0.")
    keys = jr.split(key, len(parents))
    cims = []
    for n, ps in enumerate(parents):
        k = cardinalities[n]
        configs = int(np.prod([cardinalities[p] for p in ps]))
        alpha = alpha_fast if is_fast[n] else alpha_slow
        rates = jr.gamma(keys[n], alpha, (configs, k, k)) / beta
        # Gamma(0.2) draws can underflow to exactly 0 in float32; keep rates strictly positive
        rates = jnp.maximum(rates, jnp.finfo(rates.dtype).tiny)
        cims.append(rates)
    return CTBN(cims=cims, parents=[list(p) for p in parents], names=names)


def scaled_softmax_ctbn(
    parents: Sequence[Sequence[int]],
    cardinalities: Sequence[int] | None = None,
    *,
    fast: Sequence[bool] | None = None,
    gamma: float = 3.0,
    rate_fast: float = 5.0,
    rate_slow: float = 0.2,
    names: Sequence[str] | None = None,
) -> CTBN:
    r"""The paper's parameter-learning rates (§6, after Cohn et al. 2010):
    $\Lambda_n(x,x',u)=r\,\mathrm{softmax}_{x'}\big(\gamma\sum_{y\in u}1(x'=y)\big)$, $x'\ne x$,
    with $r=r_f$ for fast and $r_s$ for slow nodes: a node is drawn towards the states its parents
    are in. The softmax is over all $k$ target states (the paper's formula leaves the index
    implicit; this is our reading). Parent states are compared as integers."""
    cardinalities, is_fast, names = _check_common(parents, cardinalities, fast, names)
    cims = []
    for n, ps in enumerate(parents):
        k = cardinalities[n]
        table = []
        for config in parent_configurations(tuple(ps), cardinalities):
            votes = np.array([sum(1 for y in config if y == x) for x in range(k)], float)
            w = np.exp(gamma * votes - (gamma * votes).max())
            soft = w / w.sum()
            r = rate_fast if is_fast[n] else rate_slow
            q = np.tile(r * soft, (k, 1))
            table.append(q)
        cims.append(np.stack(table))
    return CTBN(cims=cims, parents=[list(p) for p in parents], names=names)


#: The 4-node binary network used in the demo and the synthetic experiments: slow nodes drive
#: fast ones. The paper's figure of its ground truth is not part of the text, so this graph is
#: our choice (a chain with a fan-in and a cycle-free layout); `fast = (False, True, False, True)`.
PAPER_PARENTS: tuple[tuple[int, ...], ...] = ((), (0,), (1,), (0, 2))
PAPER_FAST: tuple[bool, ...] = (False, True, False, True)
PAPER_NAMES: tuple[str, ...] = ("X1", "X2", "X3", "X4")


def paper_network(key: PRNGKeyArray, *, rates: str = "gamma") -> CTBN:
    """The 4-node binary fast/slow network: `rates="gamma"` draws Gamma(5,1)/Gamma(1/5,1) rates
    (structure experiment), `rates="softmax"` uses the scaled softmax (parameter experiment)."""
    if rates == "gamma":
        return random_ctbn(key, PAPER_PARENTS, fast=PAPER_FAST, names=PAPER_NAMES)
    if rates == "softmax":
        return scaled_softmax_ctbn(PAPER_PARENTS, fast=PAPER_FAST, names=PAPER_NAMES)
    raise ValueError(f"rates must be 'gamma' or 'softmax', got {rates!r}.")
