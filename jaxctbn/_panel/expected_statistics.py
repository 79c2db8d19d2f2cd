r"""[`jaxctbn.panel.PanelExpectedStatistics`][]: the smoothed expected path statistics of panel
trajectories, projected onto a node and any parent set."""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from .._master_equation import AbstractExpectedStatistics, projection_bins
from .._model.ctbn import AbstractCTBN
from .._model.layout import max_configs, state_bins_on_sets


class PanelExpectedStatistics(AbstractExpectedStatistics):
    r"""Smoothed expected path statistics of panel trajectories between their first and last
    observation times, conditional on the observations (one trajectory, or a batch with leading
    axes on the arrays; [`jaxctbn.panel.PanelExpectedStatistics.sum`][] pools a batch).

    - `dwell_times`: $\mathsf E[T(s)\mid Y]$, shape `(*batch, S)`; sums to $t_{m-1}-t_0$.
    - `transitions`: $\mathsf E[M(s\to s_r')\mid Y]$ per shift $r=(n,j)$ of the generator
      (node $n$ moved forward by $j$ mod $k_n$), shape `(*batch, J, S)`. Under smoothing these are
      **not** rate times dwell time, so they are stored.
    - `log_likelihood`: the log-likelihood of each trajectory, `(*batch,)` (as
      [`jaxctbn.panel.panel_log_likelihood`][] with the same arguments).
    - `model`: the model (not intervened; its graph gives the default parent sets).

    Node statistics project onto **any** parent set like [`jaxctbn.ExpectedStatistics`][]'s, and
    keep the leading batch axes.
    """

    dwell_times: Float[Array, "*batch global_states"]
    transitions: Float[Array, "*batch shifts global_states"]
    log_likelihood: Float[Array, "*batch"]
    model: AbstractCTBN

    def sum(self, where: Bool[Array, " batch"] | None = None) -> "PanelExpectedStatistics":
        """Sum over the leading trajectory axis (optionally only where `where` is `True`, e.g.
        the trajectories in which a node was not intervened on)."""
        if self.log_likelihood.ndim < 1:
            raise ValueError("sum: these statistics have no batch axis.")
        if where is None:
            where = jnp.ones(self.log_likelihood.shape[:1], bool)
        w = jnp.asarray(where).astype(self.dwell_times.dtype)
        return PanelExpectedStatistics(
            dwell_times=jnp.einsum("r,r...->...", w, self.dwell_times),
            transitions=jnp.einsum("r,r...->...", w, self.transitions),
            log_likelihood=jnp.einsum("r,r...->...", w, self.log_likelihood),
            model=self.model,
        )

    def _shifts(self) -> tuple[tuple[int, int], ...]:
        return tuple((n, j) for n, k in enumerate(self.model.cardinalities) for j in range(1, k))

    def node_dwell_times(self, node: int | str, parents=None) -> Float[Array, "*batch configs k"]:
        r"""$\mathsf E[\hat T_n(x,u)\mid Y]$ for parent set `parents` (default: the model's)."""
        node = self.model.node_index(node)
        k = self.model.cardinalities[node]
        states, c, configs = projection_bins(self.model, node, parents)
        one_hot = _one_hot(c * k + states[:, node], configs * k, self.dwell_times.dtype)
        out = self.dwell_times @ one_hot
        return out.reshape(*out.shape[:-1], configs, k)

    def node_transitions(self, node: int | str, parents=None) -> Float[Array, "*batch configs k k"]:
        r"""$\mathsf E[\hat M_n(x,x',u)\mid Y]$ for parent set `parents` (default: the
        model's); zero diagonal."""
        node = self.model.node_index(node)
        k = self.model.cardinalities[node]
        states, c, configs = projection_bins(self.model, node, parents)
        x = states[:, node]
        dtype = self.transitions.dtype
        out = jnp.zeros(self.transitions.shape[:-2] + (configs * k * k,), dtype)
        for r, (n, j) in enumerate(self._shifts()):
            if n == node:
                bins = (c * k + x) * k + (x + j) % k
                out = out + self.transitions[..., r, :] @ _one_hot(bins, configs * k * k, dtype)
        return out.reshape(*out.shape[:-1], configs, k, k)

    def node_statistics_on_sets(
        self, node: int, parent_sets: Int[Array, "sets max_parents"]
    ) -> tuple[Float[Array, "*batch sets configs k k"], Float[Array, "*batch sets configs k"]]:
        """`(node_transitions, node_dwell_times)` of `node` projected onto every padded parent
        set in `parent_sets` at once (`configs` = the most configurations any set of that
        padding can have)."""
        cards = self.model.cardinalities
        k = cards[node]
        configs = max_configs(node, cards, parent_sets.shape[-1])
        G = state_bins_on_sets(node, parent_sets, cards, self.dwell_times.dtype)
        shifts = [r for r, (n, _) in enumerate(self._shifts()) if n == node]
        jumps = [self._shifts()[r][1] for r in shifts]
        V = jnp.stack(
            [self.dwell_times] + [self.transitions[..., r, :] for r in shifts], axis=-1
        )  # (*batch, S, 1 + shifts)
        out = jnp.einsum("psb,...sj->...pbj", G, V)
        out = out.reshape(*out.shape[:-2], configs, k, 1 + len(shifts))
        x = jnp.arange(k)
        M = jnp.zeros(out.shape[:-1] + (k,), out.dtype)
        for i, j in enumerate(jumps):
            M = M.at[..., x, (x + j) % k].add(out[..., 1 + i])
        return M, out[..., 0]


def _one_hot(bins: Array, size: int, dtype) -> Array:
    return (bins[:, None] == jnp.arange(size)).astype(dtype)
