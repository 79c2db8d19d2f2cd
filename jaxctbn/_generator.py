r"""Amalgamation: the global generator $W$ of a cCTBN, dense or as a matrix-free action.

The global generator is never needed as an $S\times S$ matrix. For every node $n$ and every shift
$j\in\{1,\dots,k_n-1\}$ we store the rate $R_{n,j}(s)=\Lambda_n(s_n,(s_n+j)\bmod k_n,u_n(s))$ of the
transition that moves node $n$ forward by $j$ (mod $k_n$) out of global state $s$. Then

$$(pW)(s') = -d(s')\,p(s') + \sum_{n}\sum_{j=1}^{k_n-1}\mathrm{roll}_n\big(R_{n,j}\circ p,\ j\big)(s'),$$

where $d=\sum_{n,j}R_{n,j}$ are the exit rates and $\mathrm{roll}_n$ rolls the tensor axis of node
$n$. For binary nodes the roll is a flip. Memory is $S\sum_n(k_n-1)$ rates: linear in $S$, and
identical for every graph over the same nodes (so batches over graphs share one compiled function).
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._ctbn import AbstractCTBN
from ._layout import all_global_states


def _shift_table(cardinalities: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple((n, j) for n, k in enumerate(cardinalities) for j in range(1, k))


class Generator(eqx.Module):
    r"""The amalgamated generator of a cCTBN in matrix-free form (see the module docstring).

    - `shift_rates`: `(J, S)` with $J=\sum_n(k_n-1)$; row $r$ belongs to `shifts[r] = (n, j)`.
    - `exit_rates`: `(S,)`, $d(s)=-W(s,s)$.
    """

    shift_rates: Float[Array, "shifts global_states"]
    exit_rates: Float[Array, " global_states"]
    cardinalities: tuple[int, ...] = eqx.field(static=True)

    @property
    def shifts(self) -> tuple[tuple[int, int], ...]:
        return _shift_table(self.cardinalities)

    @property
    def num_states(self) -> int:
        return int(np.prod(self.cardinalities))

    def apply(self, p: Float[Array, " global_states"]) -> Float[Array, " global_states"]:
        r"""The row-vector product $p\mapsto pW$ (right-hand side of the master equation)."""
        shape = self.cardinalities
        out = -self.exit_rates * p
        flows = (self.shift_rates * p).reshape((-1, *shape))
        out = out.reshape(shape)
        for r, (n, j) in enumerate(self.shifts):
            # rolling a size-2 axis by one is a flip, which XLA does without a concatenate
            moved = jnp.flip(flows[r], axis=n) if shape[n] == 2 else jnp.roll(flows[r], j, axis=n)
            out = out + moved
        return out.reshape(-1)

    def apply_transpose(self, v: Float[Array, " global_states"]) -> Float[Array, " global_states"]:
        r"""The column-vector product $v\mapsto Wv$ (backward / adjoint equation)."""
        shape = self.cardinalities
        v_t = v.reshape(shape)
        out = -self.exit_rates * v
        gathered = (
            jnp.stack([jnp.roll(v_t, -j, axis=n).reshape(-1) for (n, j) in self.shifts])
            if self.shifts
            else jnp.zeros((0, v.shape[0]), v.dtype)
        )
        return out + (self.shift_rates * gathered).sum(0)

    def dense(self) -> Float[Array, "global_states global_states"]:
        """The dense $S\\times S$ generator (for small networks and tests)."""
        src, dst = _shift_indices(self.cardinalities)
        S = self.num_states
        W = jnp.zeros((S, S), self.exit_rates.dtype)
        W = W.at[src.reshape(-1), dst.reshape(-1)].add(self.shift_rates.reshape(-1))
        return W - jnp.diag(self.exit_rates)

    def max_exit_rate(self) -> Float[Array, ""]:
        return jnp.max(self.exit_rates)


def _shift_indices(cardinalities):
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


def amalgamate(model: AbstractCTBN) -> Generator:
    """The global generator of `model` (apply an intervention to the model first)."""
    cards = model.cardinalities
    states = jnp.asarray(all_global_states(cards))
    rows = []
    for n, k in enumerate(cards):
        rates = model.node_rates(n, states)  # (S, k)
        for j in range(1, k):
            target = (states[:, n] + j) % k
            rows.append(jnp.take_along_axis(rates, target[:, None], axis=1)[:, 0])
    dtype = jnp.result_type(*model.cims)
    shift_rates = jnp.stack(rows) if rows else jnp.zeros((0, states.shape[0]), dtype)
    return Generator(shift_rates=shift_rates, exit_rates=shift_rates.sum(0), cardinalities=cards)
