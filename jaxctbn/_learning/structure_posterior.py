r"""Exact Bayesian structure learning of CTBNs with data pooled across interventions.

Because CTBN graphs may be cyclic, the posterior over graphs factorises over nodes:
$p(G\mid H)=\prod_n p(\mathrm{par}(n)\mid H)$ with
$p(\mathrm{par}(n)=P\mid H)\propto p(P)\,p(X_n\mid X_P)$, the local marginal likelihood of node
$n$'s pooled statistics under parent set $P$ (maths §5, **with** the prior normalising terms that the
paper's "$\propto$" drops). Every candidate parent set of every node is scored in one vectorised
computation from [`jaxctbn.internal.FamilyStatistics`][] (statistics of node $n$ projected onto each
candidate set), which are additive, so adding an experiment never needs the raw paths again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._errors import error_if
from .._model.ctbn import CTBN, PaddedCTBN
from .._model.interventions import is_concrete
from .._model.layout import (
    max_configs,
    num_configurations,
)
from .._model.node_groups import node_entry, node_index, per_node
from .._paths.sampling import Trajectories
from .._paths.sufficient_statistics import check_states_now
from .._programs import run_program
from .candidates import candidate_parent_sets
from .family_statistics import FamilyStatistics, family_statistics
from .frames import edge_frame, parent_set_frame, structure_graph
from .independence import CTPC, ctpc_pools
from .knowledge import NO_KNOWLEDGE, PriorKnowledge, check_knowledge
from .memory import _plan_family_statistics, memory_budget_bytes
from .posterior import AbstractPosterior
from .priors import AbstractPrior, GammaPrior, check_prior
from .scores import (
    _check_statistics,
    _scores,
    candidate_sets_within_budget,
    over_candidate_sets,
)
from .search import AbstractStructureSearch, Exhaustive, HillClimbing, hill_climb
from .search_data import search_data
from .search_pool import pool_parent_sets, pool_statistics

if TYPE_CHECKING:
    import networkx
    import pandas as pd


class StructurePosterior(AbstractPosterior):
    r"""The exact posterior over CTBN graphs, factorised over nodes.

    - `log_marginal_likelihoods[n]`: $\ln p(X_n\mid X_P)$ per candidate set $P$ of node $n$;
    - `log_prior[n]`: $\ln p(P)$ (unnormalised) per candidate set;
    - `statistics`: the [`jaxctbn.internal.FamilyStatistics`][] they were computed from (for updates and
      for rate draws given a graph).
    """

    log_marginal_likelihoods: tuple[Float[Array, " _sets"], ...]
    log_prior: tuple[Float[Array, " _sets"], ...]
    statistics: FamilyStatistics
    prior: AbstractPrior
    names: tuple[str, ...] = eqx.field(static=True)

    @classmethod
    def from_statistics(
        cls,
        statistics: FamilyStatistics,
        names: Sequence[str],
        *,
        prior: AbstractPrior = GammaPrior(),
        edge_prior: Array | None = None,
    ) -> "StructurePosterior":
        r"""Score every candidate set under the rate `prior`. `edge_prior` (optional, `(N, N)`, entry `[m, n]` the prior
        probability of the edge $m\to n$ in $(0,1)$) gives
        $\ln p(P)=\sum_{m\in P}\ln\pi_{mn}+\sum_{m\notin P}\ln(1-\pi_{mn})$; default uniform over
        the candidate sets."""
        names = tuple(names)
        N = len(statistics.cardinalities)
        if len(names) != N:
            raise ValueError(f"names: need {N} node names, got {len(names)}.")
        check_prior(prior, N)
        if edge_prior is not None:  # an array (a nested list would be static under jit)
            edge_prior = jnp.asarray(edge_prior, float)
        return _scored(statistics, names, prior, edge_prior)

    @classmethod
    def from_prior(
        cls,
        names: Sequence[str],
        cardinalities: Sequence[int],
        *,
        max_parents: int | Sequence[int],
        prior: AbstractPrior = GammaPrior(),
        knowledge: PriorKnowledge = NO_KNOWLEDGE,
        memory_budget: int | float | str | None = None,
    ) -> "StructurePosterior":
        """The posterior before any data (zero statistics), e.g. the start of an active-learning
        run; add experiments with [`jaxctbn.StructurePosterior.update`][]. The memory of the
        statistics tables is estimated first and checked against the budget as in
        [`jaxctbn.internal.family_statistics`][]."""
        names, cards = tuple(names), tuple(int(k) for k in cardinalities)
        N = len(cards)
        if len(names) != N:
            raise ValueError(f"names: need {N} node names, got {len(names)}.")
        check_knowledge(knowledge)
        edge_prior = knowledge.edge_prior
        sets = candidate_sets_within_budget(
            "StructurePosterior.from_prior",
            names,
            cards,
            max_parents,
            **knowledge.constraints(names),
            memory_budget=memory_budget,
        )
        Ms, Ts = [], []
        for n, k in enumerate(cards):
            configs = max_configs(n, cards, sets[n].shape[-1])
            Ms.append(jnp.zeros((sets[n].shape[0], configs, k, k)))
            Ts.append(jnp.zeros((sets[n].shape[0], configs, k)))
        stats = FamilyStatistics(
            transitions=tuple(Ms),
            dwell_times=tuple(Ts),
            parent_sets=tuple(jnp.asarray(s, jnp.int32) for s in sets),
            cardinalities=cards,
        )
        return cls.from_statistics(stats, names, prior=prior, edge_prior=edge_prior)

    @property
    def cardinalities(self) -> tuple[int, ...]:
        return self.statistics.cardinalities

    @property
    def dtype(self):
        """The floating dtype of the statistics."""
        return self.statistics.dwell_times[0].dtype

    def score_with(
        self, criterion, candidates, initial_state, horizon, *, key, num_samples, solver,
        batching, outcome,
    ):  # fmt: skip
        return criterion.score_structure(
            self, candidates, initial_state, horizon, key=key, num_samples=num_samples,
            solver=solver, batching=batching, outcome=outcome,
        )  # fmt: skip

    @property
    def parent_sets(self) -> tuple[Int[Array | np.ndarray, "_sets max_parents"], ...]:
        return self.statistics.parent_sets

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def update(self, new: FamilyStatistics) -> "StructurePosterior":
        r"""Add the statistics of new experiments and rescore (no raw paths needed). The new
        statistics must be finite and $\ge0$ (checked inside jit, guarding every field)."""
        stats = self.statistics + _check_statistics(new)
        scores = _scores(self.prior, stats)
        return eqx.tree_at(
            lambda p: (p.log_marginal_likelihoods, p.statistics), self, (scores, stats)
        )

    def with_prior(self, prior: AbstractPrior) -> "StructurePosterior":
        """The same data scored under another rate `prior` (e.g. hyper-parameters fitted by
        [`jaxctbn.EmpiricalBayes`][]); jittable."""
        check_prior(prior, len(self.names))
        scores = _scores(prior, self.statistics)
        return eqx.tree_at(lambda p: (p.log_marginal_likelihoods, p.prior), self, (scores, prior))

    def truncated(self, max_sets: int) -> "StructurePosterior":
        r"""The posterior restricted to each node's `max_sets` most probable candidate sets (all
        of them where a node has fewer), renormalised over the kept sets:
        $\tilde p(P\mid H)=p(P\mid H)/\sum_{P'\in\mathcal K_n}p(P'\mid H)$ on the kept sets
        $\mathcal K_n$. Everything else (statistics, prior, further updates) is kept per kept
        set, so the result is an ordinary posterior over a smaller model space; its
        `log_evidence` is over that space. The mass left out per node is
        `1 - exp(logsumexp(log_posterior()[n][kept]))`; the design criteria use this to make
        their cost independent of $\binom{N-1}{\le k}$ (see [`jaxctbn.VBHC`][]'s `max_sets`).
        Jittable: the sets are chosen by `jax.lax.top_k` (ties keep the lower index) and kept in
        their original order."""
        return self.restricted(most_probable_sets(self.log_posterior(), max_sets))

    def restricted(self, kept: Sequence[Int[Array, " _kept"]]) -> "StructurePosterior":
        """The posterior over the candidate sets `kept[n]` (indices into node $n$'s sets) only,
        renormalised over them (see [`truncated`][jaxctbn.StructurePosterior.truncated]).
        Jittable."""

        def take(arrays):
            return tuple(jnp.asarray(a)[i] for a, i in zip(arrays, kept))

        statistics = FamilyStatistics(
            transitions=take(self.statistics.transitions),
            dwell_times=take(self.statistics.dwell_times),
            parent_sets=take(self.statistics.parent_sets),
            cardinalities=self.statistics.cardinalities,
        )
        return StructurePosterior(
            log_marginal_likelihoods=take(self.log_marginal_likelihoods),
            log_prior=take(self.log_prior),
            statistics=statistics,
            prior=self.prior,
            names=self.names,
        )

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def log_evidence(self) -> Float[Array, ""]:
        r"""$\ln p(H)=\sum_n\ln\sum_P p(P)\,p(X_n\mid X_P)$: the marginal likelihood of the
        data under the rate prior, averaged over graphs with the structure prior normalised
        (it factorises over nodes). Zero before any data."""
        return jnp.asarray(
            sum(
                jax.nn.logsumexp(jax.nn.log_softmax(p) + s)
                for s, p in zip(self.log_marginal_likelihoods, self.log_prior)
            )
        )

    def log_posterior(self) -> tuple[Float[Array, " _sets"], ...]:
        """$\\ln p(\\mathrm{par}(n)=P\\mid H)$ for every candidate set of every node."""
        return tuple(
            jax.nn.log_softmax(s + p) for s, p in zip(self.log_marginal_likelihoods, self.log_prior)
        )

    def parent_set_probabilities(self) -> tuple[Float[Array, " _sets"], ...]:
        return tuple(jnp.exp(lp) for lp in self.log_posterior())

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def edge_marginals(self) -> Float[Array, "nodes nodes"]:
        """`[m, n]` = $p(m\\to n\\mid H)$ (zero diagonal)."""
        N = len(self.names)
        cols = []
        for n, probs in enumerate(self.parent_set_probabilities()):
            member = (self.parent_sets[n][:, :, None] == jnp.arange(N)).any(1)  # (sets, N)
            cols.append(probs @ member.astype(probs.dtype))
        return jnp.stack(cols, axis=1)

    def map_indices(self) -> Int[Array, " nodes"]:
        """Index of the MAP parent set of each node (jittable)."""
        return jnp.stack([jnp.argmax(lp) for lp in self.log_posterior()])

    def map_graph(self) -> tuple[tuple[int, ...], ...]:
        """The MAP graph as static parent tuples (host-side)."""
        return parent_tuples(self.parent_sets, np.asarray(_map_indices(self)))

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def map_adjacency(self) -> Array:
        """MAP graph as an `(N, N)` 0/1 adjacency matrix, `[m, n] = 1` for $m\\to n$ (jittable)."""
        N = len(self.names)
        idx = self.map_indices()
        rows = [(self.parent_sets[n][idx[n]][:, None] == jnp.arange(N)).any(0) for n in range(N)]
        return jnp.stack(rows, axis=1).astype(jnp.int32)

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def entropy(self) -> Float[Array, ""]:
        """Entropy of the structure posterior, $\\sum_n H[p(\\mathrm{par}(n)\\mid H)]$ (nats)."""
        total = jnp.asarray(0.0)
        for lp in self.log_posterior():
            total = total - jnp.sum(jnp.where(jnp.isfinite(lp), jnp.exp(lp) * lp, 0.0))
        return total

    def sample_parent_sets(self, key: PRNGKeyArray) -> Int[Array, " nodes"]:
        """One draw of a whole graph: the index of each node's parent set (jittable)."""
        keys = jr.split(key, len(self.names))
        return jnp.stack(
            self._per_node(lambda n, k, lp: jr.categorical(k, lp), keys, self.log_posterior())
        )

    def systematic_parent_sets(
        self, key: PRNGKeyArray, num_samples: int
    ) -> Int[Array, "samples nodes"]:
        r"""`num_samples` whole graphs by systematic sampling, node by node: node $n$'s sets are
        read off its posterior CDF at $u_s=(s+U_n)/S$, $s=0,\dots,S-1$, with one
        $U_n\sim\mathcal U(0,1)$ per node, and randomly permuted over the $S$ draws (an
        independent permutation per node). Each draw on its own is distributed as
        [`sample_parent_sets`][jaxctbn.StructurePosterior.sample_parent_sets] (product of the
        nodes' posteriors), so averages over the draws stay unbiased; but node $n$ takes set $P$
        in $\lfloor Sp\rfloor$ or $\lceil Sp\rceil$ of the draws, $p=p(P\mid H)$, rather
        than a binomial number, which removes the graph-sampling variance of the averages'
        per-node terms. Sets of zero probability are never drawn. Jittable."""
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
            raise ValueError(f"num_samples: expected a positive integer, got {num_samples!r}.")
        columns = []
        for lp, k in zip(self.log_posterior(), jr.split(key, len(self.names))):
            k_offset, k_order = jr.split(k)
            cdf = jnp.cumsum(jnp.exp(lp - jnp.max(lp)))
            cdf = cdf / cdf[-1]  # cdf[-1] == 1 exactly: u < 1 always lands on a set
            u = (jnp.arange(num_samples) + jr.uniform(k_offset, dtype=cdf.dtype)) / num_samples
            index = jnp.searchsorted(cdf, u, side="right")  # first set with cdf > u
            columns.append(jr.permutation(k_order, index.astype(jnp.int32)))
        return jnp.stack(columns, axis=1)

    def _node_groups(self) -> list[tuple[int, ...]]:
        """The nodes in groups of equal cardinality and equal shapes of their candidate sets and
        statistics tables: a per-node computation can be vectorised over a group."""
        groups: dict[tuple, list[int]] = {}
        for n, k in enumerate(self.cardinalities):
            shape = (k, np.shape(self.parent_sets[n]), np.shape(self.statistics.transitions[n]))
            groups.setdefault(shape, []).append(n)
        return [tuple(g) for g in groups.values()]

    def _per_node(self, fn, *sequences):
        """`[fn(n, *(a[n] for a in sequences)) for n in nodes]`, vectorised (`vmap`, with a traced
        node index `n`) over each group of nodes of equal shapes: one random draw, or one loop,
        per group instead of one per node. Each `a` in `sequences` is a sequence with one pytree
        per node; the results are the same numbers as node by node (random draws included: a
        node's draws depend only on its own key)."""

        def one(n):
            return fn(node_index(n), *(node_entry(n, a) for a in sequences))

        return per_node(one, len(self.names), self._node_groups(), vectorised=True)

    def _rates_per_node(self, indices, rates_of_node, *sequences):
        """`rates_of_node(n, M, T, U, *args_n)` for every node, with node n's history statistics
        `M`, `T` under its candidate set `indices[n]` and that set's configurations `U`."""

        def one(n, transitions, dwell_times, sets, index, *args):
            U = num_configurations(jnp.asarray(sets)[index], self.cardinalities)
            return rates_of_node(n, transitions[index], dwell_times[index], U, *args)

        return self._per_node(
            one,
            [jnp.asarray(m) for m in self.statistics.transitions],
            [jnp.asarray(t) for t in self.statistics.dwell_times],
            self.parent_sets,
            list(indices),
            *sequences,
        )

    def _padded_model(self, indices, rates) -> PaddedCTBN:
        cims = []
        for n, k in enumerate(self.cardinalities):
            r = jnp.where(~jnp.eye(k, dtype=bool), rates[n], 0.0)
            cims.append(r - jnp.eye(k) * r.sum(-1, keepdims=True))
        return PaddedCTBN(
            cims=tuple(cims),
            parent_index=tuple(
                self.statistics.parent_sets[n][indices[n]] for n in range(len(self.names))
            ),
            names=self.names,
            cardinalities=self.cardinalities,
        )

    def rates_given(self, indices: Int[Array, " nodes"], key: PRNGKeyArray) -> PaddedCTBN:
        """Rates drawn from their posterior under the rate prior, given the parent-set `indices`
        (a [`jaxctbn.PaddedCTBN`][]: same shapes for every graph, so it vmaps over keys)."""
        keys = jr.split(key, len(self.names))
        rates = self._rates_per_node(indices, self.prior.sample_rates, keys)
        return self._padded_model(indices, rates)

    def mean_rates_given(self, indices: Int[Array, " nodes"]) -> PaddedCTBN:
        """Posterior-mean rates given the parent-set `indices` (e.g. `map_indices()`)."""
        rates = self._rates_per_node(indices, self.prior.posterior_mean_rates)
        return self._padded_model(indices, rates)

    def map_model(self) -> CTBN:
        """The MAP graph with posterior-mean rates as a [`jaxctbn.CTBN`][] (host-side)."""
        return map_model_of(self)

    def to_frame(self) -> pd.DataFrame:
        r"""The edge marginals as a pandas table: columns `parent`, `child`, `probability`
        ($p(m\to n\mid H)$), one row per ordered pair of distinct nodes, child by child (the
        `edge_marginals` of `jaxctbn learn`'s JSON). Eager, on the host."""
        return edge_frame(self, "StructurePosterior.to_frame")

    def parent_sets_frame(self) -> pd.DataFrame:
        """Every candidate parent set of every node as a pandas table: columns `node`,
        `parents` (`A,B`; `""` for none), `log_marginal_likelihood`, `posterior` (the
        `parent_sets` of `jaxctbn learn`'s JSON). Eager, on the host."""
        return parent_set_frame(self, "StructurePosterior.parent_sets_frame")

    def to_networkx(self, *, threshold: float = 0.0) -> networkx.DiGraph:
        r"""The graph posterior as a `networkx.DiGraph` (needs `pip install networkx`): every
        node (attribute `cardinality`) and each edge $m\to n$ whose marginal probability
        exceeds `threshold` (in $[0, 1)$; by default every edge of nonzero probability), with
        that probability as its `weight`. Eager, on the host."""
        return structure_graph(self, threshold, "StructurePosterior.to_networkx")


@eqx.filter_jit
def _map_indices(posterior: StructurePosterior) -> Array:
    return posterior.map_indices()


@eqx.filter_jit
def _map_indices_and_rates(posterior) -> tuple[Array, PaddedCTBN]:
    indices = posterior.map_indices()
    return indices, posterior.mean_rates_given(indices)


def parent_tuples(parent_sets, indices) -> tuple[tuple[int, ...], ...]:
    """Parent tuples of one candidate index per node (host-side)."""
    return tuple(
        tuple(int(p) for p in np.asarray(sets[int(i)]) if p >= 0)
        for sets, i in zip(parent_sets, indices, strict=True)
    )


def map_model_of(posterior) -> CTBN:
    """`map_model` of a structure posterior or mixture: the graph of its `map_indices` with its
    `mean_rates_given` them, as a [`jaxctbn.CTBN`][] (host-side; one program, exported and
    loaded by the command line)."""
    indices, padded = jax.device_get(run_program("map_model", _map_indices_and_rates, posterior))
    graph = parent_tuples(posterior.parent_sets, indices)
    cims = [
        padded.cims[n][: num_configurations(graph[n], posterior.cardinalities)]
        for n in range(len(graph))
    ]
    return CTBN(cims=cims, parents=graph, names=posterior.names)


def most_probable_sets(log_posterior, max_sets: int) -> list[Int[Array, " _kept"]]:
    """Per node, the indices of its `max_sets` most probable candidate sets under
    `log_posterior` (all where it has fewer), in their original order so that keeping every set
    changes nothing (ties keep the lower index). Jittable."""
    if not isinstance(max_sets, int) or isinstance(max_sets, bool) or max_sets < 1:
        raise ValueError(f"max_sets: expected a positive integer, got {max_sets!r}.")
    return [jnp.sort(jax.lax.top_k(lp, min(max_sets, lp.shape[0]))[1]) for lp in log_posterior]


def structure_log_prior(parent_sets, edge_prior=None) -> tuple[Array, ...]:
    """Log prior of each candidate set: uniform (zeros) or from per-edge probabilities."""
    N = len(parent_sets)
    if edge_prior is None:
        return tuple(jnp.zeros(s.shape[0]) for s in parent_sets)
    pi = jnp.asarray(edge_prior, float)
    if pi.shape != (N, N):
        raise ValueError(f"edge_prior: expected shape ({N}, {N}), got {pi.shape}.")
    off = ~np.eye(N, dtype=bool)
    pi = error_if(
        pi,
        ~jnp.all(jnp.where(off, (pi > 0) & (pi < 1), True)),
        "edge_prior: off-diagonal edge probabilities must be in (0, 1).",
    )
    # ln p(P) = sum_{m != n} ln(1 - pi_mn) + sum_{m in P} logit(pi_mn): O(|P|) per set (not
    # O(N): 495,000 sets x 100 nodes was a 400 MB temporary), grouped over nodes
    absent = jnp.where(jnp.eye(N, dtype=bool), 0.0, jnp.log1p(-pi)).sum(0)  # (N,) per child
    odds = jnp.log(pi) - jnp.log1p(-pi)

    def log_prior(n, parents):
        held = parents >= 0
        return absent[n] + jnp.where(held, odds[jnp.maximum(parents, 0), n], 0.0).sum()

    return over_candidate_sets(log_prior, (1,) * N, parent_sets)


def learn_structure(
    trajectories: Trajectories,
    names: Sequence[str],
    cardinalities: Sequence[int],
    *,
    max_parents: int | Sequence[int],
    prior: AbstractPrior = GammaPrior(),
    knowledge: PriorKnowledge = NO_KNOWLEDGE,
    search: AbstractStructureSearch = Exhaustive(),
    method: str = "auto",
    memory_budget: int | float | str | None = None,
) -> StructurePosterior:
    """Exhaustive Bayesian structure learning from trajectories pooled across interventions:
    candidate sets, [`jaxctbn.internal.family_statistics`][] and [`jaxctbn.StructurePosterior`][] in one
    compiled call (arguments other than arrays are static).

    **Prior knowledge**: `max_parents` (one in-degree, or one per node) and `knowledge`, a
    [`jaxctbn.PriorKnowledge`][] (hard: required and forbidden edges and tiers, a set that breaks
    them is no candidate, its posterior is 0; soft: per-edge probabilities).

    Before compiling: node states in the data must be in `0..k-1` for `cardinalities`
    (`ValueError` naming the node, when the arrays are concrete; inside jit an `eqx.error_if`),
    and the memory of the request is estimated and checked against the budget
    (`memory_budget`, bytes or e.g. `"8G"`; default the environment variable
    `JAXCTBN_MEMORY_BUDGET`, else 4 GiB): above it, a one-line `ValueError` says what is large
    (e.g. a node with many states) and how to reduce it, instead of running out of memory.
    """
    names, cards = tuple(names), tuple(int(k) for k in cardinalities)
    if len(names) != len(cards):
        raise ValueError(f"names: need {len(cards)} node names, got {len(names)}.")
    budget = memory_budget_bytes(memory_budget)
    # concrete data: a state >= k is reported now, naming the node
    check_states_now(trajectories, cards, names)
    check_knowledge(knowledge)
    edge_prior = knowledge.edge_prior
    constraints: dict[str, Any] = knowledge.constraints(names)
    if isinstance(search, (HillClimbing, CTPC)):
        if not is_concrete(trajectories.jump_times, trajectories.states):
            raise ValueError(
                f"search: {type(search).__name__} needs concrete trajectories (outside jit): "
                "the parent sets it finds give the shapes of the exact posterior."
            )
        check_prior(prior, len(cards))
        data = search_data(trajectories, cards)
        if isinstance(search, HillClimbing):
            pools = hill_climb(
                trajectories, cards, search, prior=prior, max_parents=max_parents,
                edge_prior=edge_prior, data=data, **constraints,
            ).pools  # fmt: skip
        else:
            pools, _ = ctpc_pools(
                trajectories, cards, search, max_parents=max_parents, data=data, **constraints
            )
        sets = pool_parent_sets(pools, max_parents, **constraints)
        stats = pool_statistics(data, cards, jnp.asarray(pools), sets, search.chunk)
        return StructurePosterior.from_statistics(stats, names, prior=prior, edge_prior=edge_prior)
    elif isinstance(search, Exhaustive):
        sets = candidate_parent_sets(len(cards), max_parents, **constraints)
    else:
        raise ValueError(
            f"search: expected Exhaustive(), HillClimbing(...) or CTPC(...), got {search!r}."
        )
    if method in ("auto", "scatter", "matmul", "jumps") and trajectories.jump_times.ndim == 2:
        # checked here too (not only when family_statistics is traced) for the data's states
        method = _plan_family_statistics(
            "learn_structure",
            trajectories,
            cards,
            [(int(S.shape[0]), int(S.shape[-1])) for S in sets],
            method=method,
            chunk=None,
            names=names,
            budget=budget,
            largest_states=lambda: _largest_states(trajectories),
        )
    return run_program(
        "learn_structure",
        _learn_structure,
        trajectories,
        names,
        cards,
        sets,
        prior,
        edge_prior,
        method,
        budget,
    )


def _largest_states(trajectories: Trajectories) -> list[int] | None:
    """The largest state of each node in concrete data (for messages), else `None`."""
    if isinstance(trajectories.states, jax.core.Tracer) or isinstance(
        trajectories.initial_states, jax.core.Tracer
    ):
        return None
    N = trajectories.initial_states.shape[-1]
    seen = np.concatenate(
        [
            np.asarray(trajectories.initial_states).reshape(-1, N),
            np.asarray(trajectories.states).reshape(-1, N),
        ]
    )
    return [int(v) for v in seen.max(0)]


@eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
def _scored(
    statistics: FamilyStatistics, names: tuple[str, ...], prior, edge_prior
) -> StructurePosterior:
    """`StructurePosterior.from_statistics` once its arguments are checked."""
    # the stored statistics are the checked ones, so every field is guarded
    statistics = _check_statistics(statistics)
    return StructurePosterior(
        log_marginal_likelihoods=_scores(prior, statistics),
        log_prior=structure_log_prior(statistics.parent_sets, edge_prior),
        statistics=statistics,
        prior=prior,
        names=names,
    )


@eqx.filter_jit
def _learn_structure(
    trajectories: Trajectories, names, cards, sets, prior, edge_prior, method, memory_budget
) -> StructurePosterior:
    stats = family_statistics(
        trajectories, cards, sets, method=method, names=names, memory_budget=memory_budget
    )
    return StructurePosterior.from_statistics(stats, names, prior=prior, edge_prior=edge_prior)
