r"""Batches of experiments run in parallel: the value of a batch, and a greedy choice of one
(maths §8).

Given the model, the members' outcomes are independent. The (V)BHC of a batch follows from
quantities that add over the members:

- **parameters:** the posterior-averaged expected statistics
  ([`jaxctbn.criteria.ParameterDesignStatistics`][]), linear in each member's, so the batch BHC is
  the sum of the members' BHC and the batch VBHC is today's closed form at the summed
  statistics: at least its best member's, at most the sum;
- **structure:** each draw's expected statistics of node $n$ projected on every parent set,
  summed over the members that leave $n$ free; $\ell_n$ (the predictive likelihood, which
  integrates the shared rates out) of the sum gives the batch's $a_n(P')$ (the plug-in
  estimator, as for one experiment). The rates couple the members, so here neither criterion
  is the sum of the members'.

[`jaxctbn.choose_batch`][] computes every candidate's quantities once (one batch of
master-equation solves, as for [`jaxctbn.score_interventions`][]) and then adds members
greedily: each round scores every candidate together with the members already chosen. The
nested Monte Carlo EIG of a given batch ([`jaxctbn.criteria.score_batch`][] with
[`jaxctbn.EIG`][]) is the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from .._batching import AbstractBatching, Chunked, Vmap
from .._learning.conjugate import off_diagonal as _off
from .._learning.posterior import AbstractPosterior, AbstractRatePosterior
from .._learning.structure_mixture import StructureMixturePosterior
from .._learning.structure_posterior import StructurePosterior
from .._master_equation.master_equation import (
    clamp_pattern_statistics,
    expected_statistics_batch,
)
from .._master_equation.solvers import AUTOMATIC_SOLVER, StatisticsSolver
from .._model.interventions import Intervention, exposure_scale
from .._paths.sampling import check_count
from .._paths.sufficient_statistics import NodeStatistics
from .costs import AbstractRanking, ByScore, Costs, affordable, check_budget
from .criteria import (
    BHC,
    COMPLETE_PATH,
    EIG,
    STRUCTURE_CHUNK,
    VBHC,
    AbstractBoxHillCriterion,
    AbstractCriterion,
    _structure_batching,
)
from .kl_estimators import PlugIn
from .outcomes import AbstractOutcome, Panel
from .panel_structure import panel_structure_divergences
from .parameter import _sampled_statistics as _sampled_node_statistics
from .parameter import design_statistics, information_gain, posterior_draws
from .structure import (
    JointGraphDraws,
    PatternBins,
    StratifiedGraphDraws,
    _flat_draws,
    _node_divergence_from,
    _node_eig_from_statistics,
    _rescorer,
    _sampled_statistics,
    candidate_bins,
    configuration_term,
    free_first,
    joint_structure_draws,
    pattern_bin_statistics,
    predictive_log_likelihood,
    skipping_chunks,
    solvable_by_pattern,
    structure_draws,
)


class BatchDesign(eqx.Module):
    """A batch chosen by [`jaxctbn.choose_batch`][]:

    - `members` `(size,)`: the chosen candidates' indices, in the order chosen; `-1` for a slot
      left empty because nothing affordable remained within the budget;
    - `scores` `(size,)`: each member's own single-experiment score (as
      [`jaxctbn.score_interventions`][] gives it);
    - `gains` `(size,)`: what each member added to the batch's score when it was chosen;
    - `costs` `(size,)`: each member's cost ([`jaxctbn.Costs`][]; zero without costs);
    - `batch_score`: the criterion of the whole batch, the sum of `gains`;
    - `total_cost`: the sum of `costs`;
    - `round_scores` `(size, candidates)`: every candidate's score together with the members
      chosen before each round; row 0 is the single-experiment scores.

    Empty slots have zero score, gain and cost."""

    members: Int[Array, " size"]
    scores: Float[Array, " size"]
    gains: Float[Array, " size"]
    costs: Float[Array, " size"]
    batch_score: Float[Array, ""]
    total_cost: Float[Array, ""]
    round_scores: Float[Array, "size candidates"]


def _tree_sum(a, b):
    return jax.tree_util.tree_map(jnp.add, a, b)


def _check_box_hill(criterion, what: str):
    if isinstance(criterion, EIG):
        raise ValueError(
            f"criterion: {what} adds members by the BHC or VBHC; the EIG of a given batch is "
            "jaxctbn.criteria.score_batch(..., criterion=EIG())."
        )
    if not isinstance(criterion, AbstractBoxHillCriterion):
        raise ValueError(
            f"criterion: {what} needs jaxctbn.BHC() or jaxctbn.VBHC(), got {criterion!r}."
        )


def _check_outcome(outcome):
    if not isinstance(outcome, AbstractOutcome):
        raise TypeError(f"outcome: expected CompletePath() or Panel(...), got {outcome!r}.")
    if isinstance(outcome, Panel) and (outcome.times is None or outcome.emissions is not None):
        raise ValueError(
            "outcome: panel batches are scored at given visit times without emissions "
            "(Panel(times)); choosing each member's times is not supported yet."
        )


def _panel_quantities(criterion, posterior, candidates, initial_state, horizon, key, num_samples,
                      batching, outcome):  # fmt: skip
    """Panel outcomes at given times. Given the models the members' panels are independent, so
    their exact panel KLs add: the parameter BHC of a batch is the sum of its members' panel
    BHC; the structure criteria are those of the summed panel divergences $D_{st}$ (maths §7,
    §8). The parameter VBHC, minimised numerically per candidate, has no batch form here."""
    if isinstance(posterior, AbstractRatePosterior):
        if not isinstance(criterion, BHC):
            raise ValueError(
                "criterion: panel batches for parameter learning take the BHC (the sum of the "
                "members' panel BHC); the panel VBHC's numerical minimum has no batch form yet."
            )
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


def _rate_quantities(
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


def _structure_quantities(
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
    batching = _structure_batching(graph_draws) if batching is None else batching
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
            candidates, solver, _flat_draws(stratified, 0)[0]
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
            flat = _flat_draws(stratified, n)[0]

            def compute(ivs):
                return jax.vmap(lambda iv: on_sets(solve(flat, iv), n, iv))(ivs)

            return _over_free_chunks(orders[n], candidates, compute)

        quantities = tuple(node_quantities(n) for n in range(N))

        def divergence(n, M, T):
            return _node_divergence_from(posterior, n, jnp.zeros((1,), bool), ells(n, M, T)[None])[
                0
            ]

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
    nodes = []
    for n in range(N):
        flat = _flat_draws(stratified, n)[0]
        others = tuple(j for j in range(N) if j != n)
        by_pattern = clamp_pattern_statistics(
            flat, init, horizon, candidates, clampable=others, solver=solver
        )
        layout = PatternBins.of(posterior, n)
        M, T = pattern_bin_statistics(posterior, n, by_pattern)  # (Q, D, sets, W, k[, k])
        own = candidate_bins(by_pattern, candidates, layout.slot_states).astype(T.dtype)
        num_configs = posterior.statistics.dwell_times[n].shape[1]
        to_config = jax.nn.one_hot(layout.config, num_configs, dtype=T.dtype)  # (sets, W, F)
        nodes.append((layout, M, T, own, to_config))

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
        return _node_divergence_from(posterior, n, jnp.zeros(ells.shape[:1], bool), ells)

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
    return _BatchTerms(empty, add, value, round_values)


class _BatchTerms(NamedTuple):
    """How a batch's criterion is built member by member: `empty` (no members), `add(chosen,
    index)` (one more member, candidate `index`), `value(chosen)` (the criterion) and
    `round_values(chosen)` (every candidate's criterion together with `chosen`)."""

    empty: Any
    add: Callable
    value: Callable
    round_values: Callable


def _summing(quantities, value, round_values=None) -> _BatchTerms:
    """The terms of quantities that add over the members, one row per candidate."""

    def add(chosen, index):
        return _tree_sum(chosen, jax.tree_util.tree_map(lambda x: x[index], quantities))

    def every_candidate(chosen):
        return jax.vmap(lambda q: value(_tree_sum(chosen, q)))(quantities)

    empty = jax.tree_util.tree_map(lambda x: jnp.zeros_like(x[0]), quantities)
    return _BatchTerms(empty, add, value, round_values or every_candidate)


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


def _quantities(
    criterion,
    posterior,
    candidates,
    initial_state,
    horizon,
    key,
    num_samples,
    solver,
    batching,
    outcome: AbstractOutcome = COMPLETE_PATH,
):
    if isinstance(outcome, Panel):
        return _panel_quantities(
            criterion, posterior, candidates, initial_state, horizon, key, num_samples, batching,
            outcome,
        )  # fmt: skip
    if isinstance(posterior, StructureMixturePosterior):
        raise ValueError(
            "posterior: the complete-path structure criteria score a StructurePosterior; a "
            "StructureMixturePosterior is scored with a Panel(...) outcome, or as if its paths "
            "were seen through posterior.moment_matched()."
        )
    if isinstance(posterior, StructurePosterior):
        build = _structure_quantities
    elif isinstance(posterior, AbstractRatePosterior):
        build = _rate_quantities
    else:
        raise TypeError(
            f"posterior: expected a RatePosterior or StructurePosterior, got {type(posterior)}."
        )
    return build(
        criterion, posterior, candidates, initial_state, horizon, key, num_samples, solver, batching
    )


def _check_size(size):
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"size: the batch size must be an integer >= 1, got {size!r}.")


def _check_initial_states(initial_state, candidates, size: int):
    """One initial state `(N,)` shared by the batch, or one per member `(size, N)`."""
    shape = jnp.shape(initial_state)
    N = candidates.targets.shape[-1]
    if shape not in ((N,), (size, N)):
        raise ValueError(
            f"initial_state: one state ({N},) shared by the batch or one per member "
            f"({size}, {N}), got shape {shape}."
        )


def _member_initial(initial_state, b: int):
    """Member b's initial state (the shared one, or row b of one per member)."""
    init = jnp.asarray(initial_state)
    return init[b] if init.ndim == 2 else init


def _check_common(posterior, candidates, num_samples):
    if not isinstance(posterior, AbstractPosterior):
        raise TypeError(
            f"posterior: expected a RatePosterior or StructurePosterior, got {type(posterior)}."
        )
    if not isinstance(candidates, Intervention) or jnp.ndim(candidates.targets) != 2:
        raise ValueError(
            "candidates: expected an Intervention with a leading axis (one row per candidate)."
        )
    if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}.")


@eqx.filter_jit
def choose_batch(
    posterior: AbstractPosterior,
    candidates: Intervention,
    initial_state: ArrayLike,
    horizon: ArrayLike,
    *,
    size: int,
    criterion: AbstractCriterion = VBHC(),
    key: PRNGKeyArray,
    num_samples: int = 10,
    solver: StatisticsSolver = AUTOMATIC_SOLVER,
    batching: AbstractBatching | None = None,
    outcome: AbstractOutcome = COMPLETE_PATH,
    costs: Costs | None = None,
    budget: ArrayLike | None = None,
    ranking: AbstractRanking = ByScore(),
) -> BatchDesign:
    r"""Choose `size` experiments to run in parallel, greedily, as one compiled computation
    (maths §8).

    Every candidate's quantities (expected statistics for parameters, per-draw statistics on
    every parent set for structure) are computed once, with the same posterior draws as
    [`jaxctbn.score_interventions`][] for the same `key`; then each of `size` rounds scores
    every candidate together with the members already chosen and adds the best by `ranking`
    among those the remaining `budget` affords. A candidate may be chosen again (a replicate).
    With `size=1` the scores are exactly `score_interventions`'.

    **Arguments:** as for [`jaxctbn.score_interventions`][] (the criterion must be
    [`jaxctbn.BHC`][] or [`jaxctbn.VBHC`][]; complete-path outcomes; structure learning with
    the [`jaxctbn.PlugIn`][] estimator), and

    - `initial_state`: one state `(N,)` every member starts from, or one per member
      `(size, N)` (slot $b$'s experiment starts from row $b$: its candidates' quantities are
      computed from it, and the rounds are unrolled, one per slot);
    - `size`: the number of experiments in the batch (static);
    - `costs`: a [`jaxctbn.Costs`][] pricing each candidate (default: free);
    - `budget`: the most the batch may cost (default: unbounded); the slots nothing affordable
      fills are left empty;
    - `ranking`: [`jaxctbn.criteria.ByScore`][] (default) or
      [`jaxctbn.criteria.ByScorePerCost`][] (gain per unit cost).

    **Returns:** a [`jaxctbn.criteria.BatchDesign`][].
    """
    _check_size(size)
    _check_common(posterior, candidates, num_samples)
    _check_initial_states(initial_state, candidates, size)
    _check_box_hill(criterion, "choose_batch")
    _check_outcome(outcome)
    check_budget(budget)
    if not isinstance(ranking, AbstractRanking):
        raise TypeError(f"ranking: expected ByScore() or ByScorePerCost(), got {ranking!r}.")
    C = candidates.targets.shape[0]
    dtype = jnp.result_type(float)
    if costs is None:
        candidate_costs = jnp.zeros((C,), dtype)
    elif isinstance(costs, Costs):
        candidate_costs = costs.of(candidates).astype(dtype)
    else:
        raise TypeError(f"costs: expected a jaxctbn.Costs or None, got {costs!r}.")
    budget = jnp.asarray(jnp.inf if budget is None else budget, dtype)
    return greedy_batch(
        posterior,
        candidates,
        initial_state,
        horizon,
        size=size,
        criterion=criterion,
        key=key,
        num_samples=num_samples,
        solver=solver,
        batching=batching,
        candidate_costs=candidate_costs,
        budget=budget,
        ranking=ranking,
        outcome=outcome,
    )


def greedy_batch(
    posterior,
    candidates,
    initial_state,
    horizon,
    *,
    size: int,
    criterion,
    key,
    num_samples: int,
    solver,
    batching,
    candidate_costs: Array,
    budget: Array,
    ranking: AbstractRanking,
    sign: ArrayLike = 1.0,
    outcome: AbstractOutcome = COMPLETE_PATH,
) -> BatchDesign:
    """[`jaxctbn.choose_batch`][]'s greedy rounds (the arguments checked by the caller), with
    every candidate's cost given as an array and the criterion multiplied by `sign` (-1 picks
    the least informative batch, the "negative" control); the active-learning loop calls it
    with the costs of its own outcome."""
    init = jnp.asarray(initial_state)
    per_slot = init.ndim == 2  # slot b's experiment starts from initial_state[b]

    def terms_from(state):
        return _quantities(
            criterion, posterior, candidates, state, horizon, key, num_samples, solver, batching,
            outcome,
        )  # fmt: skip

    slots = [terms_from(init[b]) for b in range(size)] if per_slot else [terms_from(init)]
    dtype = jnp.result_type(float)
    sign = jnp.asarray(sign, dtype)
    budget = eqx.error_if(
        budget, ~(budget >= 0), "budget: must be a number >= 0 (or None, unbounded)."
    )
    empty, value = slots[0].empty, slots[0].value

    def step_with(terms):
        def step(carry, _):
            chosen, current, spent = carry
            values = terms.round_values(chosen)
            gains = values - current
            ok = affordable(candidate_costs, budget - spent)
            rank = jnp.where(ok, ranking.rank(sign * gains, candidate_costs), -jnp.inf)
            pick = jnp.argmax(rank)
            found = ok.any()
            chosen = jax.tree_util.tree_map(
                lambda new, old: jnp.where(found, new, old), terms.add(chosen, pick), chosen
            )
            gain = jnp.where(found, gains[pick], 0.0)
            cost = jnp.where(found, candidate_costs[pick], 0.0)
            member = jnp.where(found, pick, -1)
            return (chosen, current + gain, spent + cost), (member, gain, cost, values)

        return step

    start = (empty, value(empty), jnp.zeros((), dtype))
    if per_slot:  # one round per slot, each with its slot's quantities (unrolled)
        carry, rounds = start, []
        for terms in slots:
            carry, out = step_with(terms)(carry, None)
            rounds.append(out)
        _, total, spent = carry
        members, gains, member_costs, round_scores = (
            jnp.stack([r[i] for r in rounds]) for i in range(4)
        )
        # each member's own score: alone, from its slot's initial state
        scores = jnp.stack(
            [
                jnp.where(m >= 0, terms.value(terms.add(empty, jnp.maximum(m, 0))) - start[1], 0.0)
                for terms, m in zip(slots, members)
            ]
        )
    else:
        (_, total, spent), (members, gains, member_costs, round_scores) = jax.lax.scan(
            step_with(slots[0]), start, None, length=size
        )
        singles = round_scores[0]
        scores = jnp.where(members >= 0, singles[jnp.maximum(members, 0)], 0.0)
    return BatchDesign(
        members=members,
        scores=scores,
        gains=gains,
        costs=member_costs,
        batch_score=total - start[1],
        total_cost=spent,
        round_scores=round_scores,
    )


@eqx.filter_jit
def score_batch(
    posterior: AbstractPosterior,
    members: Intervention,
    initial_state: ArrayLike,
    horizon: ArrayLike,
    *,
    criterion: AbstractCriterion = VBHC(),
    key: PRNGKeyArray,
    num_samples: int = 10,
    solver: StatisticsSolver = AUTOMATIC_SOLVER,
    batching: AbstractBatching | None = None,
    outcome: AbstractOutcome = COMPLETE_PATH,
) -> Float[Array, ""]:
    r"""The criterion of one batch of experiments run in parallel, `members` (an
    [`jaxctbn.Intervention`][] with a leading axis, one row per experiment, all from
    `initial_state` `(N,)` or each from its own row of `initial_state` `(members, N)`, over
    `horizon`; maths §8).

    - [`jaxctbn.BHC`][], [`jaxctbn.VBHC`][]: from the members' summed quantities, with the same
      draws as [`jaxctbn.score_interventions`][] and [`jaxctbn.choose_batch`][] for the same
      `key` (one member gives `score_interventions`' score).
    - [`jaxctbn.EIG`][]: the batch's expected information gain by Monte Carlo, `num_paths`
      outcomes per posterior draw, each outcome one independent path per member (member 0's
      path is the one `score_interventions` samples, so one member gives its EIG): for
      parameters by conjugacy, for structure Algorithm 4 with the stratum weights on the
      members' summed statistics. The reference for the Box-Hill batches.
    """
    _check_common(posterior, members, num_samples)
    if members.targets.shape[0] == 0:
        raise ValueError("members: a batch needs at least one experiment, got none.")
    _check_initial_states(initial_state, members, members.targets.shape[0])
    _check_outcome(outcome)
    if isinstance(criterion, EIG):
        if isinstance(posterior, StructureMixturePosterior):
            raise ValueError(
                "posterior: the batch EIG scores a StructurePosterior (complete paths); a "
                "StructureMixturePosterior's batches are scored by the BHC or VBHC with a "
                "Panel(times) outcome."
            )
        if isinstance(posterior, StructurePosterior):
            return _structure_batch_eig(
                criterion, posterior, members, initial_state, horizon, key, num_samples
            )
        return _rate_batch_eig(
            criterion, posterior, members, initial_state, horizon, key, num_samples
        )
    _check_box_hill(criterion, "score_batch")
    if jnp.ndim(initial_state) == 1:
        terms = _quantities(
            criterion, posterior, members, initial_state, horizon, key, num_samples, solver,
            batching, outcome,
        )  # fmt: skip
        chosen = terms.empty
        for b in range(members.targets.shape[0]):
            chosen = terms.add(chosen, b)
        return terms.value(chosen)
    chosen = None
    for b in range(members.targets.shape[0]):  # each member from its own initial state
        member = jax.tree_util.tree_map(lambda a, b=b: a[b : b + 1], members)
        terms = _quantities(
            criterion, posterior, member, _member_initial(initial_state, b), horizon, key,
            num_samples, solver, batching, outcome,
        )  # fmt: skip
        chosen = terms.add(terms.empty if chosen is None else chosen, 0)
    return terms.value(chosen)


def _member_key(key, b: int):
    """Member b's path key: member 0 the given key (so one member reproduces the single
    experiment), the others independent keys folded from it."""
    return key if b == 0 else jr.fold_in(key, b)


def _rate_batch_eig(criterion, posterior, members, initial_state, horizon, key, num_samples):
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
                _member_initial(initial_state, b),
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


def _structure_batch_eig(criterion, posterior, members, initial_state, horizon, key, num_samples):
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
            stats = _sampled_statistics(
                draws,
                n,
                member,
                _member_initial(initial_state, b),
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
        rescore = _rescorer(posterior, n, max_events * B)
        total = total + _node_eig_from_statistics(posterior, draws, n, rescore, *summed)
    return total
