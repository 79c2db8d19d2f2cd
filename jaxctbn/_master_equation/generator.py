r"""Amalgamation: the global generator $W$ of a cCTBN, dense or as a matrix-free action.

The global generator is never needed as an $S\times S$ matrix. For every node $n$ and every shift
$j\in\{1,\dots,k_n-1\}$ let $R_{n,j}(s)=\Lambda_n(s_n,(s_n+j)\bmod k_n,u_n(s))$ be the rate of the
transition that moves node $n$ forward by $j$ (mod $k_n$) out of global state $s$. Then

$$(pW)(s') = -d(s')\,p(s') + \sum_{n}\sum_{j=1}^{k_n-1}\mathrm{roll}_n\big(R_{n,j}\circ p,\ j\big)(s'),$$

where $d=\sum_{n,j}R_{n,j}$ are the exit rates and $\mathrm{roll}_n$ rolls the tensor axis of node
$n$ (a flip for binary nodes). Two storage forms of $R_{n,j}$:

- [`FactoredGenerator`][jaxctbn._master_equation.generator.FactoredGenerator] (graphs known statically, [`jaxctbn.CTBN`][]): $R_{n,j}$ is kept
  as a small tensor over the axes of node $n$ and its parents only, broadcast against $p$ inside
  the fused product. A product reads and writes $O(S)$ numbers and no rate table.
- [`ExpandedGenerator`][jaxctbn._master_equation.generator.ExpandedGenerator] (graphs as data, [`jaxctbn.PaddedCTBN`][]): $R_{n,j}$ expanded
  over all $S$ global states, memory $S\sum_n(k_n-1)$ (linear in $S$) and the same shapes for
  every graph over the same nodes, so batches over graphs share one compiled function.
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._model.ctbn import CTBN, AbstractCTBN
from .._model.layout import all_global_states


def _shift_table(cardinalities: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple((n, j) for n, k in enumerate(cardinalities) for j in range(1, k))


def _move(x: Array, n: int, j: int, k: int) -> Array:
    # rolling a size-2 axis by one is a flip, which XLA does without a concatenate
    return jnp.flip(x, axis=n) if k == 2 else jnp.roll(x, j, axis=n)


class AbstractGenerator(eqx.Module):
    """The amalgamated generator of a cCTBN in matrix-free form (see the module docstring)."""

    exit_rates: eqx.AbstractVar[Float[Array, " global_states"]]
    cardinalities: eqx.AbstractVar[tuple[int, ...]]

    @abc.abstractmethod
    def shift_rate_tensor(self, r: int) -> Array:
        """$R_{n,j}$ for shift `r` (`shifts[r] = (n, j)`), broadcastable to the state tensor."""

    @property
    def shifts(self) -> tuple[tuple[int, int], ...]:
        return _shift_table(self.cardinalities)

    @property
    def num_states(self) -> int:
        return int(np.prod(self.cardinalities))

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """Trailing batch axes (see `batch_last`); `()` for one generator."""
        return tuple(self.exit_rates.shape[1:])

    def shift_rates(self, r: int) -> Float[Array, " global_states *batch"]:
        """$R_{n,j}$ of shift `r` over all global states, flat `(S, *batch_shape)`."""
        shape = self.cardinalities + self.batch_shape
        return jnp.broadcast_to(self.shift_rate_tensor(r), shape).reshape(-1, *self.batch_shape)

    def apply(
        self, p: Float[Array, " global_states *batch"]
    ) -> Float[Array, " global_states *batch"]:
        r"""The row-vector product $p\mapsto pW$ (right-hand side of the master equation).

        `p` has shape `(S, *batch_shape)`: a batch in trailing position (see
        `batch_last`) runs as one fused, vectorised product."""
        shape = self.cardinalities + self.batch_shape
        pt = p.reshape(shape)
        out = -self.exit_rates.reshape(shape) * pt
        for r, (n, j) in enumerate(self.shifts):
            out = out + _move(self.shift_rate_tensor(r) * pt, n, j, shape[n])
        return out.reshape(p.shape)

    def apply_transpose(
        self, v: Float[Array, " global_states *batch"]
    ) -> Float[Array, " global_states *batch"]:
        r"""The column-vector product $v\mapsto Wv$ (backward / adjoint equation)."""
        shape = self.cardinalities + self.batch_shape
        vt = v.reshape(shape)
        out = -self.exit_rates.reshape(shape) * vt
        for r, (n, j) in enumerate(self.shifts):
            back = jnp.flip(vt, axis=n) if shape[n] == 2 else jnp.roll(vt, -j, axis=n)
            out = out + self.shift_rate_tensor(r) * back
        return out.reshape(v.shape)

    def dense(self) -> Float[Array, "global_states global_states"]:
        """The dense $S\\times S$ generator (for small networks and tests)."""
        src, dst = shift_indices(self.cardinalities)
        S = self.num_states
        W = jnp.zeros((S, S), self.exit_rates.dtype)
        if self.shifts:
            values = jnp.stack([self.shift_rates(r) for r in range(len(self.shifts))])
            W = W.at[src.reshape(-1), dst.reshape(-1)].add(values.reshape(-1))
        return W - jnp.diag(self.exit_rates)

    def max_exit_rate(self) -> Float[Array, "*batch"]:
        return jnp.max(self.exit_rates, axis=0)


class ExpandedGenerator(AbstractGenerator):
    """Rates expanded over all global states: `expanded_rates` is `(J, S)`, row `r` = shift
    `shifts[r]`. Shapes depend only on the cardinalities, not on the graph."""

    expanded_rates: Float[Array, "shifts global_states"]
    exit_rates: Float[Array, " global_states"]
    cardinalities: tuple[int, ...] = eqx.field(static=True)

    def shift_rate_tensor(self, r: int) -> Array:
        return self.expanded_rates[r].reshape(self.cardinalities + self.batch_shape)


class FactoredGenerator(AbstractGenerator):
    """Rates kept over the axes of each node and its parents only: `factors[r]` has the state
    tensor's rank with size-1 axes for every node that is neither node `n` nor one of its parents.
    Memory $\\sum_{n}(k_n-1)k_n\\prod_{m\\in\\mathrm{par}(n)}k_m$ plus the exit rates ($S$)."""

    factors: tuple[Array, ...]
    exit_rates: Float[Array, " global_states"]
    cardinalities: tuple[int, ...] = eqx.field(static=True)

    def shift_rate_tensor(self, r: int) -> Array:
        return self.factors[r]


def batch_last(generators: AbstractGenerator) -> AbstractGenerator:
    """Move the leading batch axis of a batch of generators (e.g. from `jax.vmap(amalgamate)`)
    to the end of every array. [`jaxctbn.AbstractGenerator.apply`][] then takes `p` of shape
    `(S, batch)` and runs one vectorised product for the whole batch: on CPU faster than
    `jax.vmap` of the single product, whose batch axis is outermost and does not vectorise
    (measured in `benchmarks/master_equation/bench_master_equation.py`, 'batched' against 'vmap'; results in
    `benchmarks/results/master_equation.md`)."""
    return jax.tree_util.tree_map(lambda a: jnp.moveaxis(a, 0, -1), generators)


def shift_indices(cardinalities):
    states = all_global_states(cardinalities)
    S = states.shape[0]
    strides = np.array(
        [int(np.prod(cardinalities[i + 1 :])) for i in range(len(cardinalities))], dtype=np.int64
    )
    src, dst = [], []
    for n, j in _shift_table(cardinalities):
        k = cardinalities[n]
        new = (states[:, n] + j) % k
        src.append(np.arange(S))
        dst.append(np.arange(S) + (new - states[:, n]) * strides[n])
    if not src:
        return np.zeros((0, S), np.int64), np.zeros((0, S), np.int64)
    return np.stack(src), np.stack(dst)


def _factored(model: CTBN) -> FactoredGenerator:
    cards = model.cardinalities
    N = len(cards)
    factors = []
    for n, k in enumerate(cards):
        ps = model.parents[n]
        table = model.cims[n].reshape(*(cards[p] for p in ps), k, k)  # (u_1..u_m, x, x')
        axes = (*ps, n)  # global node of each axis of `table` (without the x' axis)
        order = tuple(int(a) for a in np.argsort(axes))
        for j in range(1, k):
            target = (jnp.arange(k) + j) % k
            rates = jnp.take_along_axis(
                table, jnp.broadcast_to(target[:, None], table.shape[:-1] + (1,)), axis=-1
            )[..., 0]  # (u_1..u_m, x): rate of x -> x + j
            rates = jnp.transpose(rates, order)
            shape = [1] * N
            for a in axes:
                shape[a] = cards[a]
            factors.append(rates.reshape(shape))
    exit_rates = sum(
        (jnp.broadcast_to(f, cards) for f in factors),
        jnp.zeros(cards, jnp.result_type(*model.cims)),
    )
    return FactoredGenerator(
        factors=tuple(factors), exit_rates=exit_rates.reshape(-1), cardinalities=cards
    )


def _expanded(model: AbstractCTBN) -> ExpandedGenerator:
    cards = model.cardinalities
    states = jnp.asarray(all_global_states(cards))
    rows = []
    for n, k in enumerate(cards):
        rates = model.node_rates(n, states)  # (S, k)
        for j in range(1, k):
            target = (states[:, n] + j) % k
            rows.append(jnp.take_along_axis(rates, target[:, None], axis=1)[:, 0])
    dtype = jnp.result_type(*model.cims)
    expanded = jnp.stack(rows) if rows else jnp.zeros((0, states.shape[0]), dtype)
    return ExpandedGenerator(
        expanded_rates=expanded, exit_rates=expanded.sum(0), cardinalities=cards
    )


def amalgamate(model: AbstractCTBN, *, expanded: bool | None = None) -> AbstractGenerator:
    """The global generator of `model` (apply an intervention to the model first).

    A [`jaxctbn.CTBN`][] (static graph) gives a [`FactoredGenerator`][jaxctbn._master_equation.generator.FactoredGenerator]; a
    [`jaxctbn.PaddedCTBN`][] (graph as data) an [`ExpandedGenerator`][jaxctbn._master_equation.generator.ExpandedGenerator]. Pass
    `expanded=True` to force the expanded form.
    """
    if isinstance(model, CTBN) and not expanded:
        return _factored(model)
    return _expanded(model)
