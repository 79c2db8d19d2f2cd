r"""The quantities a batch's criterion is built from, member by member (maths §8), and the
Monte Carlo EIG of a given batch: what [`jaxctbn.Batch`][] and
[`jaxctbn.criteria.GivenBatch`][] compute through the criterion and the outcome (see
`batches.py`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import jax.random as jr

from .._batching import Chunked, Vmap
from .._learning.conjugate import off_diagonal as _off
from .._learning.posterior import AbstractRatePosterior
from .._learning.structure_posterior import StructurePosterior
from .._master_equation import clamp_pattern_statistics, expected_statistics_batch
from .._model.interventions import exposure_scale
from .._model.node_groups import other_nodes, per_node, representative
from .._paths.sampling import check_count
from .._paths.sufficient_statistics import NodeStatistics
from .chunks import STRUCTURE_CHUNK, structure_batching
from .kl_estimators import PlugIn
from .node_divergences import (
    PatternBins,
    candidate_bins,
    check_single_structure_posterior,
    configuration_term,
    flat_draws,
    free_first,
    node_divergence_from,
    node_eig_from_statistics,
    pattern_bin_statistics,
    predictive_log_likelihood,
    rescorer,
    sampled_statistics,
    skipping_chunks,
    solvable_by_pattern,
)
from .panel_structure import panel_structure_divergences
from .parameter import _sampled_statistics as _sampled_node_statistics
from .parameter import design_statistics, information_gain, posterior_draws
from .structure import (
    JointGraphDraws,
    StratifiedGraphDraws,
    joint_structure_draws,
    structure_draws,
)


def path_batch_terms(
    criterion, posterior, candidates, initial_state, horizon, key, num_samples, solver, batching
) -> BatchTerms:
    """The terms of a batch of complete-path experiments: expected statistics for parameters,
    per-draw statistics on every parent set for structure."""
    check_single_structure_posterior(posterior)
    if isinstance(posterior, StructurePosterior):
        build = _structure_batch_terms
    elif isinstance(posterior, AbstractRatePosterior):
        build = _rate_batch_terms
    else:
        raise TypeError(
            f"posterior: expected a RatePosterior or StructurePosterior, got {type(posterior)}."
        )
    return build(
        criterion, posterior, candidates, initial_state, horizon, key, num_samples, solver, batching
    )


def _tree_sum(a, b):
    return jax.tree_util.tree_map(jnp.add, a, b)


def panel_batch_terms(criterion, posterior, candidates, initial_state, horizon, key, num_samples,
                      batching, outcome):  # fmt: skip
    """Panel outcomes at given times. Given the models the members' panels are independent, so
    their exact panel KLs add: the parameter BHC of a batch is the sum of its members' panel
    BHC; the structure criteria are those of the summed panel divergences $D_{st}$ (maths §7,
    §8). The parameter VBHC, minimised numerically per candidate, has no batch form here."""
    if isinstance(posterior, AbstractRatePosterior):
        scores = criterion.panel_design_rates(
            posterior, candidates, initial_state, horizon, key=key, num_samples=num_samples,
            batching=batching, outcome=outcome,
        ).scores  # fmt: skip

        def total(summed):
            return summed

        return _summing(scores, total)
    draws, horizon, truncated = criterion.panel_structure_setup(
        posterior, key, num_samples, horizon
    )
    times = outcome.visit_times(horizon, horizon.dtype)
    batching = Chunked(STRUCTURE_CHUNK) if batching is None else batching
    divergences = batching.map(
        lambda iv: panel_structure_divergences(draws, initial_state, times, iv), candidates
    )

    def value(summed):
        return criterion.panel_structure_value(summed)

    return _summing(divergences, value)


def _rate_batch_terms(
    criterion, posterior, candidates, initial_state, horizon, key, num_samples, solver, batching
):
    """Every candidate's design statistics `(candidates, ...)` and `value(summed statistics)`."""
    if not isinstance(criterion.estimator, PlugIn):
        raise ValueError("estimator: the parameter criteria are exact; use the default PlugIn().")
    draws = posterior_draws(posterior, key, num_samples)

    def one(iv):
        return design_statistics(
            posterior, draws, initial_state, horizon, intervention=iv, solver=solver
        )

    quantities = (Vmap() if batching is None else batching).map(one, candidates)

    def value(stats):
        return criterion.rate_value(posterior, stats)

    return _summing(quantities, value)


def _structure_batch_terms(
    criterion, posterior, candidates, initial_state, horizon, key, num_samples, solver, batching
):
    """Per node, every candidate's per-draw expected statistics projected on every parent set,
    `(candidates, draws, sets, configs, k[, k])` (zero where the candidate clamps the node), and
    `value(summed statistics)`."""
    if not isinstance(criterion.estimator, PlugIn):
        raise ValueError("estimator: batches of structure experiments use the PlugIn() estimator.")
    if criterion.max_sets is not None:
        posterior = posterior.truncated(criterion.max_sets)
    graph_draws = criterion.graph_draws
    batching = structure_batching(graph_draws) if batching is None else batching
    N = len(posterior.names)
    init = jnp.asarray(initial_state)

    def solve(models, iv):  # one candidate over a batch of models
        D = jax.tree_util.tree_leaves(models)[0].shape[0]
        return expected_statistics_batch(
            models,
            jnp.broadcast_to(init, (D, *init.shape)),
            horizon,
            interventions=jax.tree_util.tree_map(
                lambda a: jnp.broadcast_to(a, (D, *jnp.shape(a))), iv
            ),
            solver=solver,
        )

    def on_sets(stats, n, iv):
        M, T = jax.vmap(lambda st: st.node_statistics_on_sets(n, posterior.parent_sets[n]))(stats)
        keep = (~iv.targets[n]).astype(T.dtype)
        return keep * M, keep * exposure_scale(iv, n, T.dtype) * T

    def ells(n, M, T):  # (draws, sets)
        return jax.vmap(lambda m, t: predictive_log_likelihood(posterior, n, m, t))(M, T)

    if isinstance(graph_draws, StratifiedGraphDraws):
        key_draws, _ = jr.split(key)  # as StratifiedGraphDraws.divergences splits it
        stratified = structure_draws(posterior, key_draws, num_samples)
        if posterior.prior.factorises_over_configurations and solvable_by_pattern(
            candidates, solver, flat_draws(stratified, 0)[0]
        ):
            return _structure_by_pattern(
                criterion, posterior, candidates, init, horizon, stratified, solver
            )
        C = candidates.targets.shape[0]
        chunk = batching.chunk_size(C)
        # per node, the candidates that leave it free first, in chunks; a chunk of candidates
        # that all clamp the node is skipped (their statistics of the node are zero)
        orders = [free_first(candidates.targets[:, n], chunk) for n in range(N)]

        def node_quantities(n):
            flat = flat_draws(stratified, n)[0]

            def compute(ivs):
                return jax.vmap(lambda iv: on_sets(solve(flat, iv), n, iv))(ivs)

            return _over_free_chunks(orders[n], candidates, compute)

        quantities = tuple(node_quantities(n) for n in range(N))

        def divergence(n, M, T):
            return node_divergence_from(posterior, n, jnp.zeros((1,), bool), ells(n, M, T)[None])[0]

        def round_values(chosen):
            """Every candidate's criterion with the members `chosen`: per node, only the
            chunks of candidates that leave the node free are evaluated (the others keep the
            chosen members' divergence)."""
            divergences = []
            for n in range(N):
                base = divergence(n, *chosen[n])
                Mc, Tc = chosen[n]
                Mq, Tq = quantities[n]

                def compute(index, n=n, Mc=Mc, Tc=Tc, Mq=Mq, Tq=Tq):
                    return jax.vmap(lambda i: divergence(n, Mc + Mq[i], Tc + Tq[i]))(index)

                divergences.append(_over_free_indices(orders[n], compute, base, C))
            return jax.vmap(lambda *a: criterion.structure_value(posterior, a))(*divergences)

    elif isinstance(graph_draws, JointGraphDraws):
        draws = joint_structure_draws(
            posterior, key, num_samples, systematic=graph_draws.systematic
        )

        def one(iv):
            stats = solve(draws.models, iv)
            return tuple(on_sets(stats, n, iv) for n in range(N))

        quantities = batching.map(one, candidates)

        def divergence(n, M, T):
            e = ells(n, M, T)
            own = jnp.take_along_axis(e, draws.indices[:, n, None], axis=1)
            return (own - e).mean(0)

    else:
        raise ValueError(
            "graph_draws: batches of structure experiments take StratifiedGraphDraws() or "
            f"JointGraphDraws(), got {graph_draws!r}."
        )

    def value(summed):
        return criterion.structure_value(
            posterior, tuple(divergence(n, *summed[n]) for n in range(N))
        )

    if isinstance(graph_draws, StratifiedGraphDraws):
        return _summing(quantities, value, round_values)
    return _summing(quantities, value)


def _structure_by_pattern(criterion, posterior, candidates, init, horizon, stratified, solver):
    r"""The structure (V)BHC of batches from the clamp-pattern solves (perfect interventions,
    an exact solver, a prior whose predictive factorises over configurations; maths §8).

    Per node $n$, the quantities are its statistics in the bins $w$ of each pattern $q$ and
    draw $d$ (`pattern_bin_statistics`), and the chosen members' sum $\hat S^{ch}$ lives on
    the configurations $f$ of every set $P$. A candidate $c$ adds its bins (those of its
    pattern inside its sub-cube, one per configuration it touches), so

    $$\ell_n(\hat S^{ch}+\hat S_c;P)=\ell_n(\hat S^{ch};P)+\sum_{q,w}1_c(q,w)
    \big[t_{f(P,w)}(\hat S^{ch}_{f(P,w)}+B_{q,d,P,w})-t_{f(P,w)}(\hat S^{ch}_{f(P,w)})\big],$$

    $t_f$ the prior's predictive term of configuration $f$: per round one term per pattern,
    bin, draw and set, shared by the candidates (as for one experiment), rather than one per
    candidate and padded configuration. With no member chosen the terms are the single
    experiment's."""
    N = len(posterior.names)

    def node_setup(n):
        flat = flat_draws(stratified, n)[0]
        others = other_nodes(n, N)
        by_pattern = clamp_pattern_statistics(
            flat, init, horizon, candidates, clampable=others, solver=solver
        )
        layout = PatternBins.of(posterior, n)
        M, T = pattern_bin_statistics(posterior, n, by_pattern)  # (Q, D, sets, W, k[, k])
        own = candidate_bins(by_pattern, candidates, layout.slot_states).astype(T.dtype)
        num_configs = posterior.statistics.dwell_times[representative(n)].shape[1]
        to_config = jax.nn.one_hot(layout.config, num_configs, dtype=T.dtype)  # (sets, W, F)
        return layout, M, T, own, to_config

    # the solves of the nodes of a group of equal shapes in one loop (one compiled body)
    nodes = per_node(node_setup, N, posterior._node_groups())

    def node_terms(n, chosen):
        """The chosen members' term of every draw, set and configuration `(D, sets, F)`."""
        term = configuration_term(posterior, n)
        hist_M = posterior.statistics.transitions[n]
        hist_T = posterior.statistics.dwell_times[n]
        layout = nodes[n][0]
        per_config = jax.vmap(term, in_axes=(0, 0, 0, 0, None))
        per_set = jax.vmap(per_config, in_axes=(0, 0, 0, 0, 0))
        M, T = chosen
        return jax.vmap(per_set, in_axes=(0, 0, None, None, None))(
            M, T, hist_M, hist_T, layout.num_configs
        )

    def divergence(n, ells):  # ells (candidates, D, sets)
        return node_divergence_from(posterior, n, jnp.zeros(ells.shape[:1], bool), ells)

    def value(chosen):
        return criterion.structure_value(
            posterior,
            tuple(divergence(n, node_terms(n, chosen[n]).sum(-1)[None])[0] for n in range(N)),
        )

    def round_values(chosen):
        divergences = []
        for n in range(N):
            layout, M, T, own, _ = nodes[n]
            term = configuration_term(posterior, n)
            chosen_terms = node_terms(n, chosen[n])  # (D, sets, F)
            at_bins = jnp.take_along_axis(chosen_terms, layout.config[None], axis=2)  # (D, sets, W)
            Mc = jnp.take_along_axis(chosen[n][0], layout.config[None, :, :, None, None], axis=2)
            Tc = jnp.take_along_axis(chosen[n][1], layout.config[None, :, :, None], axis=2)
            per_bin = jax.vmap(term, in_axes=(0, 0, 0, 0, None))
            per_draw = jax.vmap(jax.vmap(per_bin), in_axes=(0, 0, None, None, None))

            def delta(x, Mc=Mc, Tc=Tc, at_bins=at_bins, layout=layout, per_draw=per_draw):
                Mq, Tq = x  # one pattern's bins (D, sets, W, k[, k])
                new = per_draw(
                    Mc + Mq, Tc + Tq, layout.history_transitions, layout.history_dwell_times,
                    layout.num_configs,
                )  # fmt: skip
                return new - at_bins

            deltas = jax.lax.map(delta, (M, T))  # (Q, D, sets, W)
            ells = chosen_terms.sum(-1)[None] + jnp.einsum("qdpw,cqw->cdp", deltas, own)
            divergences.append(divergence(n, ells))
        return jax.vmap(lambda *a: criterion.structure_value(posterior, a))(*divergences)

    def add(chosen, index):
        out = []
        for n in range(N):
            _, M, T, own, to_config = nodes[n]
            mine = own[index]  # (Q, W)
            out.append(
                (
                    chosen[n][0] + jnp.einsum("qdswkl,qw,swf->dsfkl", M, mine, to_config),
                    chosen[n][1] + jnp.einsum("qdswk,qw,swf->dsfk", T, mine, to_config),
                )
            )
        return tuple(out)

    empty = tuple(
        (
            jnp.zeros((M.shape[1], *posterior.statistics.transitions[n].shape), M.dtype),
            jnp.zeros((M.shape[1], *posterior.statistics.dwell_times[n].shape), M.dtype),
        )
        for n, (_, M, _, _, _) in enumerate(nodes)
    )
    return BatchTerms(empty, add, value, round_values)


class BatchTerms(NamedTuple):
    """How a batch's criterion is built member by member: `empty` (no members), `add(chosen,
    index)` (one more member, candidate `index`), `value(chosen)` (the criterion) and
    `round_values(chosen)` (every candidate's criterion together with `chosen`)."""

    empty: Any
    add: Callable
    value: Callable
    round_values: Callable


def _summing(quantities, value, round_values=None) -> BatchTerms:
    """The terms of quantities that add over the members, one row per candidate."""

    def add(chosen, index):
        return _tree_sum(chosen, jax.tree_util.tree_map(lambda x: x[index], quantities))

    def every_candidate(chosen):
        return jax.vmap(lambda q: value(_tree_sum(chosen, q)))(quantities)

    empty = jax.tree_util.tree_map(lambda x: jnp.zeros_like(x[0]), quantities)
    return BatchTerms(empty, add, value, round_values or every_candidate)


def _over_free_chunks(order_free, candidates, compute):
    """`compute(chunk of candidates)` over the chunks of `order_free` that hold a free
    candidate (zeros for the others), scattered back to candidate order."""
    order, free = order_free
    per_chunk = jax.lax.map(skipping_chunks(compute, candidates), (order, free))
    return _scatter(order, per_chunk, candidates.targets.shape[0])


def _over_free_indices(order_free, compute, base, num_candidates: int):
    """`compute(candidate indices)` `(chunk, ...)` over the chunks of `order_free` that hold a
    free candidate; every other candidate gets `base`."""
    order, free = order_free

    def run(xs):
        index, any_free = xs
        return jax.lax.cond(
            any_free.any(),
            compute,
            lambda i: jnp.broadcast_to(base, (i.shape[0], *base.shape)),
            index,
        )

    per_chunk = jax.lax.map(run, (order, free))
    values = per_chunk.reshape(-1, *per_chunk.shape[2:])
    out = jnp.broadcast_to(base, (num_candidates, *base.shape))
    # the padding repeats a real candidate with its own value
    return out.at[order.reshape(-1)].set(values)


def _scatter(order, per_chunk, num_candidates: int):
    """Chunks `(chunks, chunk, ...)` in `order` back to candidate order `(candidates, ...)`."""
    flat = order.reshape(-1)

    def place(a):
        values = a.reshape(-1, *a.shape[2:])
        return jnp.zeros((num_candidates, *values.shape[1:]), a.dtype).at[flat].set(values)

    return jax.tree_util.tree_map(place, per_chunk)


def member_initial(initial_state, b: int):
    """Member b's initial state (the shared one, or row b of one per member)."""
    init = jnp.asarray(initial_state)
    return init[b] if init.ndim == 2 else init


def _member_key(key, b: int):
    """Member b's path key: member 0 the given key (so one member reproduces the single
    experiment), the others independent keys folded from it."""
    return key if b == 0 else jr.fold_in(key, b)


def rate_batch_eig(criterion, posterior, members, initial_state, horizon, key, num_samples):
    r"""$\mathsf E_{\Lambda}\mathsf E_{S_1..S_B\mid\Lambda}[\ln p(\Lambda\mid\mathcal H,S_{1..B})
    -\ln p(\Lambda\mid\mathcal H)]$ (for a Gamma posterior
    $\sum_n[\ln\mathrm{Gam}(\Lambda\mid\bar\alpha+\sum_b\hat M_b,\bar\beta+\sum_b\hat T_b)
    -\ln\mathrm{Gam}(\Lambda\mid\bar\alpha,\bar\beta)]$), the members' statistics of node
    $n$ counted where they leave $n$ free."""
    k_draw, k_path = jr.split(key)
    draws = posterior_draws(posterior, k_draw, num_samples)
    keys = jr.split(k_path, (num_samples, criterion.num_paths))
    B = members.targets.shape[0]
    max_events = criterion.max_events or 512

    def one(model, key):
        per_member = [
            _sampled_node_statistics(
                posterior,
                model,
                _member_key(key, b),
                member_initial(initial_state, b),
                horizon,
                jax.tree_util.tree_map(lambda a, b=b: a[b], members),
                max_events,
            )
            for b in range(B)
        ]
        pooled = []
        for n, a in enumerate(posterior.alpha):
            k = a.shape[-1]
            dtype = per_member[0][n].dwell_times.dtype
            keep = [(~members.targets[b, n]).astype(dtype) for b in range(B)]
            M = jnp.stack([keep[b] * per_member[b][n].transitions for b in range(B)]).sum(0)
            T = jnp.stack([keep[b] * per_member[b][n].dwell_times for b in range(B)]).sum(0)
            pooled.append(NodeStatistics(transitions=jnp.where(_off(k), M, 0.0), dwell_times=T))
        return information_gain(posterior, model, pooled)

    gains = jax.vmap(lambda m, ks: jax.vmap(lambda kk: one(m, kk))(ks))(draws, keys)
    return gains.mean()


def structure_batch_eig(criterion, posterior, members, initial_state, horizon, key, num_samples):
    """The structure EIG of a batch (stratified draws, as [`jaxctbn.EIG`][] for one
    experiment), node by node on the members' summed path statistics."""
    key_draws, key_paths = jr.split(key)
    draws = structure_draws(posterior, key_draws, num_samples)
    num_paths = criterion.num_paths
    max_events = criterion.max_events or 256
    check_count(num_paths, "num_paths")
    check_count(max_events, "max_events")
    B = members.targets.shape[0]
    total = jnp.asarray(0.0)
    for n in range(len(posterior.names)):
        sets = posterior.parent_sets[n]
        summed = None
        for b in range(B):
            member = jax.tree_util.tree_map(lambda a, b=b: a[b : b + 1], members)
            stats = sampled_statistics(
                draws,
                n,
                member,
                member_initial(initial_state, b),
                horizon,
                _member_key(key_paths, b),
                num_paths,
                max_events,
            )
            M, T = stats.node_statistics_on_sets(sets)
            keep = (~members.targets[b, n]).astype(T.dtype)
            keep_t = keep * jnp.ravel(exposure_scale(member, n, T.dtype))[0]
            summed = (
                (keep * M[0], keep_t * T[0])
                if summed is None
                else (summed[0] + keep * M[0], summed[1] + keep_t * T[0])
            )
        assert summed is not None
        rescore = rescorer(posterior, n, max_events * B)
        total = total + node_eig_from_statistics(posterior, draws, n, rescore, *summed)
    return total
