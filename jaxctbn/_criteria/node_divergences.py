r"""The structure criteria node by node (maths §4, §5): node $n$'s predictive log-likelihood
$\ell_n$ of its statistics given the history, its divergences $a_n(P')$ from drawn or
clamp-pattern statistics, and its EIG term; what `structure.py` builds the criteria from."""

from __future__ import annotations

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, Float

from .._batching import AbstractBatching
from .._learning.conjugate import gamma_poisson_log_gamma_table, gamma_poisson_log_marginal
from .._learning.priors import GammaPrior
from .._learning.structure_mixture import StructureMixturePosterior
from .._learning.structure_posterior import StructurePosterior
from .._master_equation import (
    AbstractMasterEquationSolver,
    clamp_pattern_statistics,
    expected_statistics_batch,
    resolve_solver,
)
from .._model.interventions import Intervention, exposure_scale
from .._model.layout import all_global_states, config_index, num_configurations
from .._model.node_groups import (
    GroupNode,
    Node,
    node_entry,
    node_index,
    node_table,
    other_nodes,
    per_node,
    representative,
)
from .._paths.sampling import PathStatistics, nested_vmap, path_statistics
from .kl_estimators import PlugIn


def check_single_structure_posterior(posterior) -> None:
    """The complete-path structure criteria factorise over nodes: they score one
    `StructurePosterior`, not a mixture."""
    if isinstance(posterior, StructureMixturePosterior):
        raise ValueError(
            "posterior: the complete-path structure criteria score a StructurePosterior; a "
            "StructureMixturePosterior (what panels leave) is scored with a PanelOutcome(...) outcome, "
            "or as if its paths were seen through posterior.moment_matched()."
        )


def predictive_log_likelihood(
    posterior: StructurePosterior, node: int, transitions, dwell_times
) -> Float[Array, " sets"]:
    r"""$\ell_n(\hat S;P)=\ln p(\hat S_n\mid P,H)$ for every candidate set $P$ of `node`: the
    rate prior's predictive likelihood of node statistics `transitions` `(sets, configs, k, k)`
    and `dwell_times` `(sets, configs, k)` (projected onto each set) given the history's (maths
    §5; for the Gamma prior $\sum[\ln\Gamma(\bar\alpha+\hat M)-\ln\Gamma(\bar\alpha)
    +\bar\alpha\ln\bar\beta-(\bar\alpha+\hat M)\ln(\bar\beta+\hat T)]$; the paper's
    $\exp\{-\Lambda+\hat T\}$ is a typo for $\exp\{-\Lambda\hat T\}$)."""
    sets = posterior.parent_sets[node]
    return predictive_on_sets(
        posterior.prior,
        node,
        transitions,
        dwell_times,
        posterior.statistics.transitions[node],
        posterior.statistics.dwell_times[node],
        num_configurations(sets, posterior.cardinalities),
    )


def predictive_on_sets(
    prior, node, transitions, dwell_times, history_transitions, history_dwell_times, num_configs
):
    """The prior's predictive log-likelihood on every set (leading axis) of node `node` (an
    index, may be traced: the priors look their per-node values up by it)."""
    return jax.vmap(functools.partial(prior.log_predictive, node))(
        transitions, dwell_times, history_transitions, history_dwell_times, num_configs
    )


def flat_draws(draws: StructureDraws, n: Node):
    """Node n's draws as one batch `(sets * samples,)` of models, and the index of the set each
    draw fixes par(n) to."""
    models = node_entry(n, draws.models)
    n_sets, n_samples = jax.tree_util.tree_leaves(models)[0].shape[:2]
    flat = jax.tree_util.tree_map(lambda a: a.reshape(n_sets * n_samples, *a.shape[2:]), models)
    return flat, jnp.repeat(jnp.arange(n_sets), n_samples)


def sampled_statistics(
    draws, n, interventions, initial_state, horizon, path_key, num_paths, max_events
) -> PathStatistics:
    """What `num_paths` sampled paths per draw of node n and per candidate (`interventions`,
    leading axis) add to node n's statistics, batch `(candidates, draws, paths)`: all in one
    sampling loop, the same path keys for every candidate."""
    flat, _ = flat_draws(draws, n)
    B = flat.parent_index[0].shape[0]
    C = interventions.targets.shape[0]
    keys = jr.split(jr.fold_in(path_key, n), (B, num_paths))
    return path_statistics(
        jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (C, *a.shape)), flat),
        jax.tree_util.tree_map(
            lambda a: jnp.broadcast_to(a[:, None], (C, B, *a.shape[1:])), interventions
        ),
        initial_state,
        horizon,
        jnp.broadcast_to(keys, (C, *keys.shape)),
        max_events,
        n,
    )


class StructureDraws(eqx.Module):
    """Per node n: models (a `PaddedCTBN` batch of shape `(sets_n, num_samples)`) with
    par(n) fixed to each candidate set and the other parent sets and all rates drawn from the
    posterior. Independent of the intervention, so every intervention sees the same draws."""

    models: tuple


def solvable_by_pattern(interventions: Intervention, solver, models) -> bool:
    """Whether candidates can be solved by clamp pattern (`clamp_pattern_statistics`): perfect
    interventions and an exact solver."""
    return (
        interventions.rate_scales is None
        and interventions.replacement_cims is None
        and isinstance(resolve_solver(solver, models), AbstractMasterEquationSolver)
    )


def _fewer_patterns_than(num_others: int, num_candidates: int) -> bool:
    """Whether the clamp patterns of `num_others` other nodes (each clamped or not:
    $2^{N-1}$) are fewer than a chunk's `num_candidates`: solving by pattern then pays."""
    return 2**num_others < num_candidates


def _shares_clamp_patterns(interventions: Intervention, num_others: int, solver, models) -> bool:
    """Whether a chunk of candidates is solved by clamp pattern: `solvable_by_pattern`, and
    fewer patterns of the other nodes than candidates."""
    return solvable_by_pattern(interventions, solver, models) and _fewer_patterns_than(
        num_others, interventions.targets.shape[0]
    )


def pattern_route_takes_groups(posterior, draws, interventions, chunk: int, solver, estimator):
    """Whether `node_divergence` takes its nodes traced in their groups (a `GroupNode`): the
    plug-in estimator on chunks of `chunk` candidates solved by clamp pattern, with a prior
    whose predictive factorises over configurations (the route written for traced nodes)."""
    return (
        isinstance(estimator, PlugIn)
        and posterior.prior.factorises_over_configurations
        and solvable_by_pattern(interventions, solver, flat_draws(draws, 0)[0])
        and _fewer_patterns_than(len(posterior.names) - 1, chunk)
    )


class PatternBins(eqx.Module):
    r"""Node $n$'s layout of the bins $w$ of the other nodes' configurations (see
    `node_statistics_by_other_nodes`), for a prior whose predictive factorises over
    configurations:

    - `slot_states` `(W, N)`: bin $w$'s states (node $n$ at 0);
    - `config` `(sets, W)`: the configuration $c(w_P)$ of each set $P$ that bin $w$ falls in;
    - `history_transitions`, `history_dwell_times` `(sets, W, k[, k])`: the history's
      statistics of that configuration;
    - `num_configs` `(sets,)`: each set's number of configurations."""

    slot_states: Array
    config: Array
    history_transitions: Array
    history_dwell_times: Array
    num_configs: Array

    @staticmethod
    def of(posterior: StructurePosterior, n: Node) -> "PatternBins":
        sets = jnp.asarray(node_entry(n, posterior.parent_sets))
        cards = posterior.cardinalities

        def slots(m):
            others = [j for j in range(len(cards)) if j != m]
            slot_states = np.zeros((math.prod(cards[j] for j in others), len(cards)), np.int32)
            slot_states[:, others] = all_global_states(tuple(cards[j] for j in others))
            return slot_states

        slot_states = jnp.asarray(node_table(n, slots))
        config = jax.vmap(lambda P: config_index(slot_states, P, cards))(sets)  # (sets, W)
        history_M = jnp.take_along_axis(
            node_entry(n, posterior.statistics.transitions), config[:, :, None, None], axis=1
        )
        history_T = jnp.take_along_axis(
            node_entry(n, posterior.statistics.dwell_times), config[:, :, None], axis=1
        )
        return PatternBins(
            slot_states, config, history_M, history_T, num_configurations(sets, cards)
        )


def configuration_term(posterior: StructurePosterior, n: Node):
    """`term(M, T, M_bar, T_bar, U)`: the prior's predictive term of one configuration of a set
    with `U` configurations, node statistics `(k, k)`, `(k,)` given the history's."""
    prior = posterior.prior
    index = node_index(n)

    def term(M, T, M_bar, T_bar, U):
        return prior.log_predictive(index, M[None], T[None], M_bar[None], T_bar[None], U)

    return term


def pattern_bin_statistics(posterior, n, by_pattern, func=None, sets=None):
    """Node `n`'s statistics in the bins of each clamp pattern and draw, `((patterns, draws,
    sets, W, k, k), (patterns, draws, sets, W, k))` (`node_statistics_by_other_nodes`), or
    `func(M, T)` of each pattern's `(draws, sets, W, ...)` (evaluated pattern by pattern).
    `sets`: node n's candidate sets, if gathered already."""
    sets = jnp.asarray(node_entry(n, posterior.parent_sets) if sets is None else sets)

    def one_pattern(x):
        stats, clamped = x  # the pattern's solves, one per draw
        M, T = jax.vmap(lambda st: st.node_statistics_by_other_nodes(n, sets, clamped))(stats)
        return (M, T) if func is None else func(M, T)

    Q = by_pattern.clamped.shape[0]
    grouped = jax.tree_util.tree_map(
        lambda a: a.reshape(Q, a.shape[0] // Q, *a.shape[1:]), by_pattern.statistics
    )
    return jax.lax.map(one_pattern, (grouped, by_pattern.clamped))


def candidate_bins(by_pattern, interventions, slot_states) -> Array:
    """`(C, patterns, W)`: one where bin $w$ of pattern $q$ belongs to candidate $c$ (its
    pattern, inside its sub-cube; none for a candidate clamping the node)."""
    mine = by_pattern.on_sub_cubes(interventions, slot_states)  # (C, W)
    Q = by_pattern.clamped.shape[0]
    own = jax.nn.one_hot(by_pattern.pattern, Q, dtype=bool)  # (C, patterns)
    return own[:, :, None] & mine[:, None, :]


def _predictive_by_pattern(posterior, n, by_pattern, interventions, bins, sets):
    r"""$\ell_n(\hat S_{c,b};P)$ `(candidates, draws, sets)` from the clamp-pattern solves, for a
    prior whose predictive factorises over configurations: per pattern $J$ and draw, node $n$'s
    statistics in the bins $w$ of the other nodes' configurations that $P\cup J$ separates
    (`node_statistics_by_other_nodes`), one predictive term per bin (with the history of
    configuration $c(w_P)$ of $P$; empty bins give zero), and each candidate's $\ell$ the sum
    of the bins of its clamped states. $2^{|\text{others}|}$ bins per pattern and set instead
    of the padded configurations of every candidate (for the paper's space, 3.4x fewer
    terms). `bins` (`PatternBins.of`) and `sets`: node n's, gathered already."""
    term = configuration_term(posterior, n)
    per_set = jax.vmap(term, in_axes=(0, 0, 0, 0, None))  # over bins
    per_draw = jax.vmap(jax.vmap(per_set), in_axes=(0, 0, None, None, None))  # sets, draws

    def terms_of(M, T):
        return per_draw(M, T, bins.history_transitions, bins.history_dwell_times, bins.num_configs)

    terms = pattern_bin_statistics(posterior, n, by_pattern, terms_of, sets)  # (Q, draws, sets, W)
    # candidate c's bins: those of its pattern with its clamped states (none for a candidate
    # clamping n), as one contraction over (pattern, bin) rather than a gather of each
    # candidate's pattern, which costs more per design step (the step is timed in
    # `benchmarks/criteria/bench_design_step.py`; results in `benchmarks/results/design_step.md`)
    own = candidate_bins(by_pattern, interventions, bins.slot_states).astype(terms.dtype)
    return jnp.einsum("qbpw,cqw->cbp", terms, own)


#: Problems (candidate x draw) whose predictive likelihoods are evaluated together.
PREDICTIVE_BATCH = 240


def node_divergence(
    posterior,
    draws,
    n,
    *,
    initial_state,
    horizon,
    solver,
    estimator,
    path_key,
):
    """`interventions -> a_n(P')` for node `n`: for a batch of candidates `interventions`
    (leading axis), `(candidates, sets)` (zeros for a candidate that clamps n). Node n's draws,
    candidate sets, set probabilities and bins are gathered here, once (for a node traced in
    its group: outside the loop over chunks of candidates, not once per chunk)."""
    sets = node_entry(n, posterior.parent_sets)
    n_sets = sets.shape[0]
    flat, _ = flat_draws(draws, n)
    probs = node_entry(n, posterior.parent_set_probabilities())
    factorises = posterior.prior.factorises_over_configurations
    bins = PatternBins.of(posterior, n) if isinstance(estimator, PlugIn) and factorises else None

    def ell(M_hat, T_hat):
        return predictive_log_likelihood(posterior, n, M_hat, T_hat)

    def divergence(interventions):
        if isinstance(estimator, PlugIn):
            # the chunk's candidates x draws as one batch of solves: one loop for the chunk
            # (with one uniformisation rate), rather than a loop per candidate under vmap,
            # whose batched trip counts cost a select of every array at every product
            C = interventions.targets.shape[0]
            B = flat.parent_index[0].shape[0]
            N = len(posterior.names)
            if _shares_clamp_patterns(interventions, N - 1, solver, flat):
                # candidates that clamp the same other nodes share their solves (the sub-cubes
                # of the clamped states do not communicate); those clamping n get zeros
                others = other_nodes(n, N)
                by_pattern = clamp_pattern_statistics(
                    flat, initial_state, horizon, interventions, clampable=others, solver=solver
                )
                if bins is not None:
                    # and each configuration's predictive term, shared by the candidates it
                    # serves
                    ells = _predictive_by_pattern(
                        posterior, n, by_pattern, interventions, bins, sets
                    )
                    clamped = interventions.targets[:, node_index(n)]
                    return node_divergence_from(posterior, n, clamped, ells, probs)
                _static_node_only(n)
                stats = by_pattern.members(interventions)
            else:
                _static_node_only(n)
                models = jax.tree_util.tree_map(
                    lambda a: jnp.broadcast_to(a, (C, *a.shape)).reshape(C * B, *a.shape[1:]),
                    flat,
                )
                ivs = jax.tree_util.tree_map(lambda a: jnp.repeat(a, B, axis=0), interventions)
                init = jnp.broadcast_to(
                    jnp.asarray(initial_state), (C * B, *jnp.shape(initial_state))
                )
                stats = expected_statistics_batch(
                    models, init, horizon, interventions=ivs, solver=solver
                )
            # the predictive likelihoods in cache-sized batches of problems (at once, the
            # chunk's statistics on every set leave the cache and the design step takes longer;
            # timed in `benchmarks/criteria/bench_design_step.py`, results in
            # `benchmarks/results/design_step.md`)
            scales = jnp.repeat(_exposures(interventions, n, C), B)  # per problem

            def ell_of(x):
                st, scale = x
                M, T = st.node_statistics_on_sets(n, sets)
                return ell(M, scale * T)

            ells = jax.lax.map(ell_of, (stats, scales), batch_size=PREDICTIVE_BATCH)
            ells = ells.reshape(C, B, n_sets)  # (candidates, draws, sets)
        else:
            _static_node_only(n)
            stats = sampled_statistics(
                draws,
                n,
                interventions,
                initial_state,
                horizon,
                path_key,
                estimator.num_paths,
                estimator.max_events,
            )

            def ells_of(x):  # one candidate's paths: mean over the paths of each draw
                stats, scale = x
                M, T = stats.node_statistics_on_sets(sets)
                return nested_vmap(ell, 2)(M, scale * T).mean(1)

            # candidate by candidate: the statistics on every set of every path are the big
            # arrays
            scales = _exposures(interventions, n, interventions.targets.shape[0])
            ells = jax.lax.map(ells_of, (stats, scales))  # (candidates, draws, sets)
        return node_divergence_from(posterior, n, interventions.targets[:, n], ells, probs)

    return divergence


def _exposures(interventions: Intervention, n: int, num: int) -> Array:
    """Node n's exposure scale (`exposure_scale`) for each of `num` candidates."""
    dtype = jnp.result_type(float)
    return jnp.broadcast_to(exposure_scale(interventions, n, dtype), (num,))


def _static_node_only(n: Node) -> None:
    """The routes of `node_divergence` other than the clamp patterns with a factorising prior
    take static nodes only (`pattern_route_takes_groups` says when nodes come in groups)."""
    if isinstance(n, GroupNode):
        raise AssertionError("node_divergence: a node traced in its group on a static route.")


def node_divergence_from(posterior, n: Node, clamped, ells, probs=None):
    """$a_n(P')$ `(candidates, sets)` from the predictive log-likelihoods `ells` `(candidates,
    draws, sets)` of node n's draws (stratified: the draws of each set $P$ in a block); zero
    where `clamped` `(candidates,)` says the candidate clamps n. `probs`: node n's parent set
    probabilities, if gathered already."""
    n_sets = posterior.parent_sets[representative(n)].shape[0]
    ells = ells.reshape(-1, n_sets, ells.shape[1] // n_sets, n_sets)  # [i, P, s, P']
    own = jnp.diagonal(ells, axis1=1, axis2=3).transpose(0, 2, 1)  # [i, P, s]: ell(S; P)
    diff = (own[..., None] - ells).mean(2)  # [i, P, P']
    if probs is None:
        probs = node_entry(n, posterior.parent_set_probabilities())
    a = jnp.einsum("p,ipq->iq", probs, diff)
    keep = (~clamped).astype(a.dtype)
    return keep[:, None] * a


def node_eig_terms(
    posterior,
    draws,
    n,
    interventions,
    *,
    initial_state,
    horizon,
    path_key,
    num_paths,
    max_events,
    rescore,
):
    r"""Node n's term of the structure EIG, $\sum_P p(P\mid H)\,\mathsf E[\ln p(P\mid S,H)
    -\ln p(P\mid H)]$, for a batch of candidates `interventions` (leading axis), `(candidates,)`
    (zero for a candidate that clamps n). `rescore` is node n's `rescorer`."""
    sets = posterior.parent_sets[n]
    stats = sampled_statistics(
        draws, n, interventions, initial_state, horizon, path_key, num_paths, max_events
    )

    def gain_of(x):  # one candidate's paths
        stats, scale = x
        M, T = stats.node_statistics_on_sets(sets)
        return node_eig_from_statistics(posterior, draws, n, rescore, M, scale * T)

    # candidate by candidate: the statistics on every set of every path are the big arrays
    scales = _exposures(interventions, n, interventions.targets.shape[0])
    gains = jax.lax.map(gain_of, (stats, scales))  # (candidates,)
    keep = (~interventions.targets[:, n]).astype(gains.dtype)
    return keep * gains


def node_eig_from_statistics(posterior, draws, n, rescore, transitions, dwell_times):
    r"""Node n's EIG term $\sum_P p(P\mid H)\,\mathsf E[\ln p(P\mid S,H)-\ln p(P\mid H)]$ from
    the statistics of node n's sampled paths projected on every set, `transitions` `(draws,
    paths, sets, configs, k, k)` and `dwell_times` `(draws, paths, sets, configs, k)` (the
    draws of each stratum $P$ in a block)."""
    old = posterior.log_posterior()[n]
    _, true_index = flat_draws(draws, n)
    # ln p(P | S, H) - ln p(P | H) for the true P of each draw
    new = nested_vmap(rescore, 2)(transitions, dwell_times)  # (draws, paths, P)
    own = jnp.take_along_axis(new, true_index[:, None, None], axis=-1)[..., 0]
    gains = (own - old[true_index][:, None]).mean(1)  # mean over the paths of each draw
    gains = gains.reshape(old.shape[0], -1).mean(1)  # [P]: mean over the stratum's draws
    return (jnp.exp(old) * gains).sum()


def rescorer(posterior: StructurePosterior, n: int, max_events: int):
    r"""`(M, T) -> ln p(P | S, H)` for every candidate set P of node n: the sets rescored with a
    path's statistics `M` `(sets, configs, k, k)`, `T` `(sets, configs, k)` added to the
    history's. For the Gamma prior the $\ln\Gamma$ terms, which dominate the cost, are looked up
    in a table over the possible counts (a path has at most `max_events` jumps); the same
    numbers as the prior's `log_marginal_likelihood`, which every other prior uses."""
    M_bar = posterior.statistics.transitions[n]
    T_bar = posterior.statistics.dwell_times[n]
    U = num_configurations(posterior.parent_sets[n], posterior.cardinalities)
    prior = posterior.prior
    if type(prior) is GammaPrior:
        alpha, beta = prior.node_parameters(n)
        table = gamma_poisson_log_gamma_table(alpha, M_bar, max_events)

        def score(Mh, Th, Mb, Tb, table, u):
            index = jnp.clip(Mh.astype(jnp.int32), 0, max_events)[..., None]
            log_gamma = jnp.take_along_axis(table, index, axis=-1)[..., 0]
            return gamma_poisson_log_marginal(alpha, beta, Mb + Mh, Tb + Th, log_gamma=log_gamma)

        def rescored(M, T):
            return jax.nn.log_softmax(
                posterior.log_prior[n] + jax.vmap(score)(M, T, M_bar, T_bar, table, U)
            )

        return rescored

    def generic_score(Mh, Th, Mb, Tb, u):
        return prior.log_marginal_likelihood(n, Mb + Mh, Tb + Th, u)

    def generic(M, T):
        return jax.nn.log_softmax(
            posterior.log_prior[n] + jax.vmap(generic_score)(M, T, M_bar, T_bar, U)
        )

    return generic


def over_free_candidates(
    interventions,
    num_nodes,
    batching: AbstractBatching,
    value_of_node,
    groups: tuple[tuple[int, ...], ...] | None = None,
) -> tuple[Array, ...]:
    """`value_of_node(n)(chunk_of_candidates)` for every node and candidate, one array per node
    with the candidates on the leading axis, skipping the work for candidates that clamp node
    $n$ (whose value is 0; `value_of_node(n)` must give 0 for them too): per node the candidates
    are ordered not-clamping first and computed in chunks of `chunk` (`value_of_node(n)` gets
    a whole chunk, so it can batch it as it likes; `value_of_node(n)` itself is called once per
    node, before the loop over its chunks), and a chunk of clamping candidates only is
    skipped by `lax.cond`. For the paper's space a node is clamped by 2/3 of the candidates, so
    this saves up to 2/3 of the master-equation solves or sampled paths. (Under `vmap` over
    histories the candidates are shared, the predicate stays unbatched and the skip is kept.)
    The chunks have `batching.chunk_size` candidates and are mapped by
    `batching.map_sequentially` (one after another; [`jaxctbn.Sharded`][] splits them across
    its devices).

    `groups` (static; default one node each): nodes of equal shapes whose values are computed
    in one loop over the group, the node a [`GroupNode`][jaxctbn._model.node_groups.GroupNode]
    (`value_of_node` must take one): one compiled body per group instead of one per node, the
    same numbers."""
    num_candidates = interventions.targets.shape[0]
    chunk = batching.chunk_size(num_candidates)

    def node_values(n):
        order, free = free_first(interventions.targets[:, node_index(n)], chunk)
        # what node n needs is gathered here, before the loop over its chunks
        run_chunk = skipping_chunks(value_of_node(n), interventions)
        per_chunk = batching.map_sequentially(run_chunk, (order, free))  # (chunks, chunk, ...)
        values = per_chunk.reshape(-1, *per_chunk.shape[2:])[:num_candidates]
        flat_order = order.reshape(-1)[:num_candidates]
        return jnp.zeros_like(values).at[flat_order].set(values)

    return tuple(per_node(node_values, num_nodes, groups))


def skipping_chunks(compute, interventions: Intervention):
    """`(indices, free) -> compute(those candidates)` for a chunk of `free_first`, or zeros of
    its output's shape (any pytree) when no candidate of the chunk is free (`lax.cond`)."""

    def run_chunk(xs):
        idx, free_c = xs
        ivs = jax.tree_util.tree_map(lambda a: a[idx], interventions)
        # traced once (its output shape is needed for the skipped chunks' zeros)
        traced = eqx.filter_closure_convert(compute, ivs)
        shape = traced.out_struct
        return jax.lax.cond(
            free_c.any(),
            lambda v: traced(v),  # lax.cond hashes its branches; `traced` is not hashable
            lambda _: jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shape),
            ivs,
        )

    return run_chunk


def free_first(clamps: Array, chunk: int) -> tuple[Array, Array]:
    """The candidates that leave a node free first (`clamps` false), padded with the last
    index to whole chunks: `(order (chunks, chunk), free (chunks, chunk))` (the chunks of
    candidates that all clamp the node come last and can be skipped)."""
    C = clamps.shape[0]
    num_chunks = -(-C // chunk)
    order = jnp.argsort(clamps, stable=True)
    order = jnp.concatenate([order, jnp.full((num_chunks * chunk - C,), order[-1])])
    order = order.reshape(num_chunks, chunk)
    return order, ~clamps[order]
