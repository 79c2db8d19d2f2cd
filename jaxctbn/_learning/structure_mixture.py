r"""A structure posterior that is a weighted mixture of exact complete-data structure
posteriors: what is believed about a CTBN's graph after data whose paths are not seen whole
(panels).

With complete paths $S$ the posterior over graphs factorises over nodes and is exact
([`jaxctbn.StructurePosterior`][]). When the paths are hidden,
$p(G\mid Y)=\int p(G\mid S)\,p(S\mid Y)\,dS$, so posterior draws $S_c$ of the hidden paths give
the Rao-Blackwellised estimate

$$p(G\mid Y)\approx\sum_c w_c\prod_n p\bigl(\mathrm{par}(n)\mid S_c\bigr),$$

exact as the number of components grows. Each component keeps its statistics, so rates can be
drawn given a graph, and new complete-path statistics update every component conjugately and
reweight it by its marginal likelihood $p(\text{new}\mid S_c)$.

The mixture is no longer a product over nodes: its node marginals
([`parent_set_probabilities`][jaxctbn.StructureMixturePosterior.parent_set_probabilities])
and edge marginals are weighted averages of the components', and its MAP graph is taken node
by node from those marginals (the mode of each node's marginal; the joint mode of a mixture
has no closed form).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._model.ctbn import CTBN, PaddedCTBN
from .chain_diagnostics import effective_sample_size, split_r_hat
from .family_statistics import FamilyStatistics
from .frames import edge_frame, structure_graph
from .posterior import AbstractPosterior
from .resampling import systematic_indices
from .structure_posterior import StructurePosterior, _scores, map_model_of, most_probable_sets

if TYPE_CHECKING:
    import networkx
    import pandas as pd

#: The most graphs [`StructureMixturePosterior.entropy`][jaxctbn.StructureMixturePosterior.entropy]
#: enumerates; beyond, it returns the node-marginal upper bound.
MAX_ENUMERATED_GRAPHS = 2**16
_GRAPH_BLOCK = 1024


class StructureChainDiagnostics(eqx.Module):
    r"""The Markov chains behind a sampled structure posterior and their convergence, per edge
    `[m, n]` ($m\to n$):

    - `edge_draws`: the chains' retained graphs as 0/1 adjacency matrices, `(chains, sweeps,
      N, N)`;
    - `edge_marginal_draws`: per retained sweep, the Rao-Blackwellised edge marginals
      $p(m\to n\mid S_c)$, `(chains, sweeps, N, N)`;
    - `split_r_hat`, `effective_sample_size`: of the Rao-Blackwellised edge marginals over all
      chains (`split_r_hat`, `effective_sample_size`;
      an edge that is certain in every sweep, e.g. the diagonal: $\hat R$ 1, ESS the draws'
      total).
    """

    edge_draws: Float[Array, "chains sweeps nodes nodes"]
    edge_marginal_draws: Float[Array, "chains sweeps nodes nodes"]
    split_r_hat: Float[Array, "nodes nodes"]
    effective_sample_size: Float[Array, "nodes nodes"]

    @classmethod
    def from_draws(cls, edge_draws, edge_marginal_draws) -> "StructureChainDiagnostics":
        return cls(
            edge_draws=edge_draws,
            edge_marginal_draws=edge_marginal_draws,
            split_r_hat=split_r_hat(edge_marginal_draws),
            effective_sample_size=effective_sample_size(edge_marginal_draws),
        )

    def max_split_r_hat(self) -> Float[Array, ""]:
        """The largest split-$\\hat R$ over all edges."""
        return jnp.max(self.split_r_hat)

    def min_effective_sample_size(self) -> Float[Array, ""]:
        """The smallest effective sample size over all edges."""
        return jnp.min(self.effective_sample_size)


class StructureMixturePosterior(AbstractPosterior):
    r"""A posterior over CTBN graphs that is a weighted mixture of
    [`jaxctbn.StructurePosterior`][]s (the module page above).

    - `components`: one [`jaxctbn.StructurePosterior`][] per component, every array with a
      leading axis `(components, ...)`;
    - `log_weights`: $\ln w_c$, `(components,)`, normalised;
    - `diagnostics`: the chains' [`jaxctbn.internal.StructureChainDiagnostics`][] when the
      mixture came from a sampler, else `None`.
    """

    components: StructurePosterior
    log_weights: Float[Array, " components"]
    diagnostics: StructureChainDiagnostics | None
    names: tuple[str, ...] = eqx.field(static=True)

    def __init__(
        self,
        components: StructurePosterior,
        log_weights: Float[Array, " components"],
        diagnostics: StructureChainDiagnostics | None = None,
    ):
        self.components = components
        self.log_weights = log_weights
        self.diagnostics = diagnostics
        self.names = getattr(components, "names", ())

    def __check_init__(self):
        if not isinstance(self.components, StructurePosterior):
            raise ValueError(
                f"components: expected a StructurePosterior with a leading components axis, "
                f"got {type(self.components).__name__}."
            )
        if jnp.ndim(self.log_weights) != 1:
            raise ValueError("log_weights: expected one axis (components,).")
        if self.components.log_prior[0].shape[:1] != jnp.shape(self.log_weights):
            raise ValueError(
                f"components: expected the leading axis {jnp.shape(self.log_weights)} of "
                f"log_weights on every array, got {self.components.log_prior[0].shape[:1]}."
            )

    @classmethod
    def from_components(
        cls, components: StructurePosterior, diagnostics: StructureChainDiagnostics | None = None
    ) -> "StructureMixturePosterior":
        """Equal weights over stacked `components`."""
        C = components.log_prior[0].shape[0]
        dtype = components.log_prior[0].dtype
        return cls(components, jnp.full((C,), -jnp.log(C), dtype), diagnostics)

    @classmethod
    def copies(cls, posterior: StructurePosterior, count: int) -> "StructureMixturePosterior":
        """`count` equally weighted copies of `posterior` (e.g. the particles of a filter
        before any data)."""
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"count: expected a positive integer, got {count!r}.")
        stacked = jax.tree_util.tree_map(
            lambda x: jnp.repeat(jnp.asarray(x)[None], count, 0), posterior
        )
        return cls.from_components(stacked)

    @property
    def dtype(self):
        """The floating dtype of the statistics."""
        return self.components.dtype

    def score_with(
        self, criterion, candidates, initial_state, horizon, *, key, num_samples, solver,
        batching, outcome,
    ):  # fmt: skip
        return criterion.score_structure(
            self, candidates, initial_state, horizon, key=key, num_samples=num_samples,
            solver=solver, batching=batching, outcome=outcome,
        )  # fmt: skip

    @property
    def cardinalities(self) -> tuple[int, ...]:
        return self.components.cardinalities

    @property
    def num_components(self) -> int:
        return int(self.log_weights.shape[0])

    @property
    def parent_sets(self) -> tuple[Int[Array, "_sets max_parents"], ...]:
        """Each node's candidate sets (the components share them)."""
        return tuple(s[0] for s in self.components.parent_sets)

    def weights(self) -> Float[Array, " components"]:
        return jnp.exp(self.log_weights)

    def effective_sample_size(self) -> Float[Array, ""]:
        r"""$1/\sum_cw_c^2$: the number of equally weighted components worth as much."""
        return 1.0 / jnp.sum(self.weights() ** 2)

    def resampled(self, index: Int[Array, " draws"]) -> "StructureMixturePosterior":
        """The components at `index` (ancestors of a resampling), equally weighted; no
        diagnostics."""
        components = jax.tree_util.tree_map(lambda x: x[index], self.components)
        return StructureMixturePosterior.from_components(components)

    def moment_matched(self) -> StructurePosterior:
        r"""The single [`jaxctbn.StructurePosterior`][] of the components' weighted mean
        statistics $\sum_cw_cS_c$ (for panels: the posterior expected statistics of the hidden
        paths, treated as if observed). An approximation that discards the spread between the
        components (overconfident where they disagree); what the path-assuming designs score
        (`CriterionDesign(..., assume_complete_path=True)`)."""
        first = self.component(0)
        w = self.weights()

        def mean(x):
            return jnp.tensordot(w, x, axes=1)

        stats = eqx.tree_at(
            lambda s: (s.transitions, s.dwell_times),
            first.statistics,
            (
                tuple(mean(m) for m in self.components.statistics.transitions),
                tuple(mean(t) for t in self.components.statistics.dwell_times),
            ),
        )
        return eqx.tree_at(
            lambda p: (p.log_marginal_likelihoods, p.statistics),
            first,
            (_scores(first.prior, stats), stats),
        )

    def truncated(self, max_sets: int) -> "StructureMixturePosterior":
        """Every component restricted to each node's `max_sets` most probable candidate sets
        under the mixture's node marginals (the same sets for every component; see
        [`jaxctbn.StructurePosterior.truncated`][]). Jittable."""
        kept = most_probable_sets(self.log_posterior(), max_sets)
        components = jax.vmap(lambda p: p.restricted(kept))(self.components)
        return StructureMixturePosterior(components, self.log_weights, None)

    def component_log_weights_given(
        self, indices: Int[Array, " nodes"]
    ) -> Float[Array, " components"]:
        r"""$\ln p(c\mid G)=\ln w_c+\sum_n\ln p_c(\mathrm{par}(n)=G_n)-\ln p(G)$: which
        component a graph `indices` came from (normalised)."""
        return jax.nn.log_softmax(self._joint_log_weights(indices))

    def graph_log_probability(self, indices: Int[Array, " nodes"]) -> Float[Array, ""]:
        r"""$\ln p(G)=\ln\sum_cw_c\prod_np_c(\mathrm{par}(n)=G_n)$ of the graph `indices`."""
        return jax.nn.logsumexp(self._joint_log_weights(indices))

    def _joint_log_weights(self, indices: Int[Array, " nodes"]) -> Float[Array, " components"]:
        r"""$\ln w_c+\sum_n\ln p_c(\mathrm{par}(n)=G_n)$ per component."""
        per_component = jax.vmap(lambda p: p.log_posterior())(self.components)
        return self.log_weights + sum(lp[:, indices[n]] for n, lp in enumerate(per_component))

    def component(self, c) -> StructurePosterior:
        """Component `c` as a [`jaxctbn.StructurePosterior`][]."""
        return jax.tree_util.tree_map(lambda x: x[c], self.components)

    def parent_set_probabilities(self) -> tuple[Float[Array, " _sets"], ...]:
        r"""$p(\mathrm{par}(n)=P)=\sum_cw_c\,p_c(\mathrm{par}(n)=P)$ for every candidate set of
        every node."""
        per_component = jax.vmap(lambda p: p.parent_set_probabilities())(self.components)
        return tuple(self.weights() @ p for p in per_component)

    def log_posterior(self) -> tuple[Float[Array, " _sets"], ...]:
        r"""$\ln p(\mathrm{par}(n)=P)$ of the node marginals (the mixture's, in logs)."""
        per_component = jax.vmap(lambda p: p.log_posterior())(self.components)
        return tuple(
            jax.nn.logsumexp(lp + self.log_weights[:, None], axis=0) for lp in per_component
        )

    def edge_marginals(self) -> Float[Array, "nodes nodes"]:
        """`[m, n]` = $p(m\\to n)$ (zero diagonal), the weighted average of the components'."""
        per_component = jax.vmap(lambda p: p.edge_marginals())(self.components)
        return jnp.tensordot(self.weights(), per_component, axes=1)

    def map_indices(self) -> Int[Array, " nodes"]:
        """Per node, the index of the most probable parent set under its marginal."""
        return jnp.stack([jnp.argmax(lp) for lp in self.log_posterior()])

    def map_adjacency(self) -> Array:
        """[`map_indices`][jaxctbn.StructureMixturePosterior.map_indices] as an `(N, N)` 0/1
        adjacency matrix, `[m, n] = 1` for $m\\to n$."""
        N = len(self.names)
        index = self.map_indices()
        rows = [(self.parent_sets[n][index[n]][:, None] == jnp.arange(N)).any(0) for n in range(N)]
        return jnp.stack(rows, axis=1).astype(jnp.int32)

    def map_graph(self) -> tuple[tuple[int, ...], ...]:
        """[`map_indices`][jaxctbn.StructureMixturePosterior.map_indices] as static parent
        tuples (host-side)."""
        index = jax.device_get(self.map_indices())
        return tuple(
            tuple(int(p) for p in jax.device_get(self.parent_sets[n][int(index[n])]) if p >= 0)
            for n in range(len(self.names))
        )

    def rates_given(self, indices: Int[Array, " nodes"], key: PRNGKeyArray) -> PaddedCTBN:
        r"""Rates drawn from $p(\Lambda\mid G)$ given the parent-set `indices`: a component
        $c\sim p(c\mid G)$
        ([`component_log_weights_given`][jaxctbn.StructureMixturePosterior.component_log_weights_given]),
        then its rates given $G$ (a [`jaxctbn.PaddedCTBN`][]; jittable, vmaps over keys)."""
        key_component, key_rates = jr.split(key)
        c = jr.categorical(key_component, self.component_log_weights_given(indices))
        return self.component(c).rates_given(indices, key_rates)

    def mean_rates_given(self, indices: Int[Array, " nodes"]) -> PaddedCTBN:
        r"""Posterior-mean rates given the graph `indices`:
        $\mathsf E[\Lambda_n\mid G]=\sum_cp(c\mid G)\,\mathsf E_c[\Lambda_n\mid G_n]$
        (within a component the nodes are independent given the paths)."""
        means = jax.vmap(lambda p: p.mean_rates_given(indices))(self.components)
        w = jnp.exp(self.component_log_weights_given(indices))
        return PaddedCTBN(
            cims=tuple(jnp.tensordot(w, m, axes=1) for m in means.cims),
            parent_index=tuple(s[indices[n]] for n, s in enumerate(self.parent_sets)),
            names=self.names,
            cardinalities=self.cardinalities,
        )

    def map_model(self) -> CTBN:
        """The graph of [`map_indices`][jaxctbn.StructureMixturePosterior.map_indices] with
        [`mean_rates_given`][jaxctbn.StructureMixturePosterior.mean_rates_given] as a
        [`jaxctbn.CTBN`][] (host-side)."""
        return map_model_of(self)

    def marginal_entropy(self) -> Float[Array, ""]:
        r"""$\sum_nH[p(\mathrm{par}(n))]$ of the node marginals (nats): the graph entropy when the
        nodes are independent a posteriori, an upper bound on it otherwise (the joint entropy
        of a mixture has no closed form)."""
        total = jnp.asarray(0.0)
        for lp in self.log_posterior():
            total = total - jnp.sum(jnp.where(jnp.isfinite(lp), jnp.exp(lp) * lp, 0.0))
        return total

    def num_graphs(self) -> int:
        """The number of graphs (the product of the nodes' candidate-set counts; static)."""
        return math.prod(int(s.shape[0]) for s in self.parent_sets)

    def entropy(self) -> Float[Array, ""]:
        r"""$H[p(G)]=-\sum_Gp(G)\ln p(G)$ of the mixture over whole graphs (nats), by
        enumerating the graphs in blocks (memory bounded) when there are at most
        `MAX_ENUMERATED_GRAPHS` (65,536); for more, the node-marginal upper bound
        [`marginal_entropy`][jaxctbn.StructureMixturePosterior.marginal_entropy]."""
        counts = [int(s.shape[0]) for s in self.parent_sets]
        total = math.prod(counts)
        if total > MAX_ENUMERATED_GRAPHS:
            return self.marginal_entropy()
        per_component = jax.vmap(lambda p: p.log_posterior())(self.components)
        block = min(_GRAPH_BLOCK, total)
        num_blocks = -(-total // block)
        radices = jnp.asarray([math.prod(counts[n + 1 :]) for n in range(len(counts))])

        def one(b):
            g = b * block + jnp.arange(block)
            digits = (g[:, None] // radices) % jnp.asarray(counts)
            lp = self.log_weights[:, None] + sum(
                table[:, digits[:, n]] for n, table in enumerate(per_component)
            )
            log_p = jax.nn.logsumexp(lp, axis=0)
            terms = jnp.where(jnp.isfinite(log_p), jnp.exp(log_p) * log_p, 0.0)
            return -jnp.sum(jnp.where(g < total, terms, 0.0))

        return jnp.sum(jax.lax.map(one, jnp.arange(num_blocks)))

    def systematic_parent_sets(
        self, key: PRNGKeyArray, num_samples: int
    ) -> Int[Array, "samples nodes"]:
        """`num_samples` whole graphs: the components by systematic resampling of the weights
        (in a random order), then one graph from each drawn component. Each draw on its own is
        distributed as [`sample_parent_sets`][jaxctbn.StructureMixturePosterior.sample_parent_sets].
        Jittable."""
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
            raise ValueError(f"num_samples: expected a positive integer, got {num_samples!r}.")
        key_components, key_order, key_graphs = jr.split(key, 3)
        c = systematic_indices(key_components, self.log_weights, num_samples)
        c = jr.permutation(key_order, c)
        return jax.vmap(lambda ci, k: self.component(ci).sample_parent_sets(k))(
            c, jr.split(key_graphs, num_samples)
        )

    def sample_parent_sets(self, key: PRNGKeyArray) -> Int[Array, " nodes"]:
        """One draw of a whole graph: a component by its weight, then each node's parent set
        from it (jittable)."""
        key_component, key_graph = jr.split(key)
        c = jr.categorical(key_component, self.log_weights)
        return self.component(c).sample_parent_sets(key_graph)

    def update(self, new: FamilyStatistics) -> "StructureMixturePosterior":
        r"""Add complete-data statistics: every component updated conjugately, reweighted by
        $p(\text{new}\mid S_c)$ (the ratio of its evidences after and before)."""
        updated = jax.vmap(lambda p: p.update(new))(self.components)
        before = jax.vmap(lambda p: p.log_evidence())(self.components)
        after = jax.vmap(lambda p: p.log_evidence())(updated)
        return StructureMixturePosterior(
            updated, jax.nn.log_softmax(self.log_weights + after - before), self.diagnostics
        )

    def to_frame(self) -> pd.DataFrame:
        r"""The edge marginals as a pandas table, as
        [`StructurePosterior.to_frame`][jaxctbn.StructurePosterior.to_frame]: columns
        `parent`, `child`, `probability` ($p(m\to n)$, the mixture's). Eager, on the host."""
        return edge_frame(self, "StructureMixturePosterior.to_frame")

    def to_networkx(self, *, threshold: float = 0.0) -> networkx.DiGraph:
        r"""The graph posterior as a `networkx.DiGraph`, as
        [`StructurePosterior.to_networkx`][jaxctbn.StructurePosterior.to_networkx]: every
        node, and each edge of marginal probability above `threshold` with that probability
        as its `weight`. Eager, on the host."""
        return structure_graph(self, threshold, "StructureMixturePosterior.to_networkx")
