r"""Expected path statistics and their projections: [`jaxctbn.AbstractExpectedStatistics`][],
the interface the design criteria and the KL divergence use, and [`jaxctbn.ExpectedStatistics`][],
the exact statistics of the master equation, projected from the global dwell times onto a node
and any parent set (maths §1)."""

from __future__ import annotations

import abc
import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._model.ctbn import AbstractCTBN
from .._model.layout import (
    all_global_states,
    config_index,
    max_configs,
    num_configurations,
    state_bins_on_sets,
)
from .._model.node_groups import Node, node_index, node_table, representative
from .generator import AbstractGenerator


def projection_bins(model: AbstractCTBN, node: int, parents) -> tuple[Array, Array, int]:
    """`(states, configs_of_states, configs)`: all global states `(S, N)`, the configuration
    index of `parents` (default: the model's; a static tuple of indices or names, or a padded
    array) in each of them `(S,)`, and the number of configurations (padded arrays: the most
    any set of that padding can have). The binning every node projection of per-state
    statistics uses."""
    parents, configs = projection_parents(model, node, parents)
    states = jnp.asarray(all_global_states(model.cardinalities))
    return states, config_index(states, parents, model.cardinalities), configs


def projection_parents(model: AbstractCTBN, node: int, parents) -> tuple[Any, int]:
    """`(parents, configs)`: the parent set a node statistic is projected onto (`None` = the
    model's; names resolved to indices, checked not to contain `node`) and its number of
    configurations (padded arrays: the most any set of that padding can have)."""
    cards = model.cardinalities
    if parents is None:
        parents = model.parent_list(node)
    if isinstance(parents, tuple | list):
        parents = tuple(model.node_index(p) for p in parents)
        if node in parents:
            raise ValueError(f"parents: node {node} cannot be its own parent.")
        return parents, num_configurations(parents, cards)
    return parents, max_configs(node, cards, parents.shape[-1])


class AbstractExpectedStatistics(eqx.Module):
    r"""Expected node-level path statistics of a cCTBN over $[0,\tau]$: the interface the
    design criteria and the KL divergence use. The exact implementation,
    [`jaxctbn.ExpectedStatistics`][], projects global dwell times; an approximate one (mean-field,
    Monte Carlo) implements the same three methods and plugs into the criteria unchanged.

    `parents` is a static tuple of node indices or names, or a padded integer array (`-1` =
    empty slot); `None` means the model's own parents. `model` is the model the statistics
    are of (its cardinalities and default parent sets)."""

    model: eqx.AbstractVar[AbstractCTBN]

    @abc.abstractmethod
    def node_dwell_times(self, node: int | str, parents=None) -> Float[Array, "configs k"]:
        r"""$\mathsf E[\hat T_n(x,u)]$: expected time node $n$ spends in $x$ while its parent
        set `parents` is in configuration $u$."""

    @abc.abstractmethod
    def node_transitions(self, node: int | str, parents=None) -> Float[Array, "configs k k"]:
        r"""$\mathsf E[\hat M_n(x,x',u)]$: expected number of jumps $x\to x'$ of node $n$
        while `parents` is in configuration $u$ (zero diagonal)."""

    @abc.abstractmethod
    def node_statistics_on_sets(
        self, node: int, parent_sets: Int[Array, "sets max_parents"]
    ) -> tuple[Float[Array, "sets configs k k"], Float[Array, "sets configs k"]]:
        """`(node_transitions, node_dwell_times)` of `node` projected onto every padded parent
        set in `parent_sets` at once (`configs` = the most configurations any set of that
        padding can have)."""

    def nodes_statistics_on_sets(
        self, nodes: tuple[int, ...], parent_sets: Int[Array, "nodes sets max_parents"]
    ) -> tuple[Float[Array, "nodes sets configs k k"], Float[Array, "nodes sets configs k"]]:
        """[`node_statistics_on_sets`][jaxctbn.AbstractExpectedStatistics.node_statistics_on_sets]
        for several `nodes` of equal cardinality and padding, `parent_sets[i]` the sets of
        `nodes[i]`, stacked on a leading axis. By default one call per node; an implementation
        may vectorise over the nodes (the mean-field statistics do, which keeps the compiled
        program of a large network small)."""
        out = [self.node_statistics_on_sets(n, parent_sets[i]) for i, n in enumerate(nodes)]
        return jnp.stack([M for M, _ in out]), jnp.stack([T for _, T in out])


class ExpectedStatistics(AbstractExpectedStatistics):
    r"""Expected path statistics of one cCTBN over $[0,\tau]$ under one intervention.

    - `final_marginal`: $p_\tau(s)$, shape `(S,)`.
    - `dwell_times`: $\mathsf E[T(s)]=\int_0^\tau p_t(s)dt$, shape `(S,)`; sums to $\tau$.
    - `generator`: the amalgamated generator of the intervened model.
    - `model`: the intervened model (for default parent sets).

    Node statistics can be projected onto **any** parent set (maths §1):
    $\mathsf E[\hat T_n(x,u)] = \sum_s 1(s_n=x,s_P=u)\mathsf E[T(s)]$ and
    $\mathsf E[\hat M_n(x,x',u)] = \sum_s 1(s_n=x,s_P=u)W_n(s\to x')\mathsf E[T(s)]$, which equals
    $\Lambda_n(x,x',u)\mathsf E[\hat T_n(x,u)]$ when $P$ contains the true parents.
    """

    final_marginal: Float[Array, "*batch global_states"]
    dwell_times: Float[Array, "*batch global_states"]
    generator: AbstractGenerator
    model: AbstractCTBN

    def _bins(self, node: int, parents):
        return projection_bins(self.model, node, parents)

    def node_dwell_times(self, node: int | str, parents=None) -> Float[Array, "configs k"]:
        """$\\mathsf E[\\hat T_n(x,u)]$ for parent set `parents` (default: the model's)."""
        node = self.model.node_index(node)
        k = self.model.cardinalities[node]
        states, c, configs = self._bins(node, parents)
        bins = c * k + states[:, node]
        out = jax.ops.segment_sum(self.dwell_times, bins, num_segments=configs * k)
        return out.reshape(configs, k)

    def node_transitions(self, node: int | str, parents=None) -> Float[Array, "configs k k"]:
        """$\\mathsf E[\\hat M_n(x,x',u)]$ for parent set `parents` (default: the model's)."""
        node = self.model.node_index(node)
        k = self.model.cardinalities[node]
        states, c, configs = self._bins(node, parents)
        values, bins = [], []
        for r, (n, j) in enumerate(self.generator.shifts):
            if n != node:
                continue
            x = states[:, node]
            values.append(self.generator.shift_rates(r) * self.dwell_times)
            bins.append((c * k + x) * k + (x + j) % k)
        out = jax.ops.segment_sum(
            jnp.concatenate(values), jnp.concatenate(bins), num_segments=configs * k * k
        )
        return out.reshape(configs, k, k)

    def node_statistics_on_sets(
        self, node: int, parent_sets: Int[Array, "sets max_parents"]
    ) -> tuple[Float[Array, "sets configs k k"], Float[Array, "sets configs k"]]:
        """`(node_transitions, node_dwell_times)` of `node` projected onto every padded parent
        set in `parent_sets` at once (`configs` = the most configurations any set of that
        padding can have). Same numbers as calling the two methods per set; here the binning
        is a one-hot matrix per set that does not depend on the model, so a batch of models
        shares it and the projections become one matrix product."""
        configs = max_configs(node, self.model.cardinalities, parent_sets.shape[-1])
        G = state_bins_on_sets(
            node, parent_sets, self.model.cardinalities, self.dwell_times.dtype
        )  # (sets, S, configs*k)
        return self._binned(node, G, configs)

    def _binned(self, node: Node, G: Array, num_bins: int) -> tuple[Array, Array]:
        r"""`(transitions, dwell_times)` of `node`, `(sets, num_bins, k, k)` and `(sets,
        num_bins, k)`, with global state $s$ sent to bin $b\,k+s_n$ where `G[p, s, b k + s_n]`
        is one (a one-hot matrix per set): one matrix product for every set and statistic."""
        V = self._node_flows(node)
        out = jnp.einsum("psb,sj->pbj", G, V)
        return _assemble_node_statistics(
            self.generator.shifts,
            representative(node),
            out,
            num_bins,
            self.model.cardinalities[representative(node)],
        )

    def _node_flows(self, node: Node) -> Array:
        """`(S, 1 + shifts)`: per global state, the expected dwell time and the expected flow of
        each of `node`'s jumps (its rate times the dwell time)."""
        shifts = node_table(
            node, lambda m: [r for r, (n, _) in enumerate(self.generator.shifts) if n == m]
        )
        return jnp.stack(
            [self.dwell_times]
            + [
                self.generator.shift_rates(shifts[i]) * self.dwell_times for i in range(len(shifts))
            ],
            axis=1,
        )

    def node_statistics_by_other_nodes(
        self, node: Node, parent_sets: Int[Array, "sets max_parents"], clamped: Array
    ) -> tuple[Float[Array, "sets others k k"], Float[Array, "sets others k"]]:
        r"""Node `node`'s statistics on each padded parent set $P$ in `parent_sets`, split by the
        states of the `clamped` nodes $J$ (a boolean `(N,)`, may be traced): indexed by the
        configurations $w$ of all other nodes (mixed radix in node order, the first other node
        the most significant digit), where bin $w$ holds the states $s$ with $s_{P\cup J}=
        w_{P\cup J}$ if $w$ is zero outside $P\cup J$, and nothing otherwise. Summing the bins
        with $w_J=x_J$ gives the statistics on $P$ of the sub-cube $\{s:s_J=x_J\}$
        (see `clamp_pattern_statistics`); bin $w$ is parent configuration $c(w_P)$ of $P$."""
        cards = self.model.cardinalities
        k = cards[representative(node)]
        W = math.prod(cards) // k
        states = jnp.asarray(all_global_states(cards))  # (S, N)

        def layout(n):  # the other nodes and their strides in w
            others = [j for j in range(len(cards)) if j != n]
            strides = [math.prod(cards[j] for j in others[i + 1 :]) for i in range(len(others))]
            return np.array(others), np.array(strides)

        others, strides = node_table(node, layout)

        def one_hot(parents):
            member = (jnp.asarray(parents)[:, None] == jnp.arange(len(cards))).any(0)
            keep = (member | clamped)[jnp.asarray(others)]
            w = (jnp.where(keep, states[:, others], 0) * jnp.asarray(strides)).sum(-1)
            bins = w * k + states[:, node_index(node)]
            return (bins[:, None] == jnp.arange(W * k)).astype(self.dwell_times.dtype)

        return self._binned(node, jax.vmap(one_hot)(jnp.asarray(parent_sets)), W)


def _assemble_node_statistics(shifts, node: int, out: Array, num_bins: int, k: int):
    r"""`(transitions, dwell_times)` `(..., num_bins, k, k)` and `(..., num_bins, k)` from binned
    flows `out` `(..., num_bins * k, 1 + jumps)` (`ExpectedStatistics._node_flows` summed into
    bins $b\,k+s_n$): column 0 the dwell times, column $1+i$ the $i$-th jump of `node` in the
    generator's `shifts`."""
    jumps = [j for n, j in shifts if n == node]
    out = out.reshape(*out.shape[:-2], num_bins, k, 1 + len(jumps))
    T = out[..., 0]
    x = jnp.arange(k)
    M = jnp.zeros((*out.shape[:-1], k), out.dtype)
    for i, j in enumerate(jumps):
        M = M.at[..., x, (x + j) % k].add(out[..., 1 + i])
    return M, T
