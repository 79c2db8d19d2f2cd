r"""Design criteria for active **structure** learning (maths §4–§5).

For an intervention $i$ the structure VBHC is
$\mathrm{VBHC}(q)=\mathrm{KL}(q\|p(G\mid H))+\sum_{G'}q(G')A(G')$ with
$A(G')=\sum_G p(G\mid H)\,\mathrm{KL}(p(S\mid G,H,i)\|p(S\mid G',H,i))$ (the paper swaps $p$ and
$q$ and the sign). Because the graph posterior factorises over nodes, $A(G')=\sum_{n\in\aleph}
a_n(\mathrm{par}'(n))$ with

$$a_n(P')=\sum_P p(P\mid H)\,\mathsf E_{G_{\neg n},\Lambda,S\mid \mathrm{par}(n)=P}
\big[\ell_n(S;P)-\ell_n(S;P')\big],$$

$\ell_n$ the predictive log-likelihood of node $n$'s statistics given the history (maths §5). The
expectation needs draws of the *other* nodes' parent sets and of the rates, one master-equation
solve per draw, and node $n$'s expected statistics projected onto every alternative set $P'$
(Algorithm 2, stratified over $P$ and weighted by $p(P\mid H)$). Then, per node,
$\min_q\mathrm{VBHC}=\sum_n-\ln\sum_{P'}p(P'\mid H)e^{-a_n(P')}$ and
$\mathrm{BHC}=\sum_n\sum_{P'}p(P'\mid H)a_n(P')$.

The KL estimator is a Module ([`jaxctbn.PlugIn`][], the paper's first-order approximation with
$\ell_n$ evaluated at the expected statistics, biased because $\ell_n$ is convex in them, maths
§5; or [`jaxctbn.MonteCarlo`][] over sampled paths). $\ell_n$ is the rate prior's predictive
likelihood ([`jaxctbn.AbstractPrior.log_predictive`][]), so every prior works.
"""

from __future__ import annotations

import abc
import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from .._batching import AbstractBatching
from .._learning.conjugate import gamma_poisson_log_gamma_table, gamma_poisson_log_marginal
from .._learning.optimisers import AbstractVBHCOptimiser
from .._learning.priors import GammaPrior
from .._learning.structure_posterior import StructurePosterior
from .._master_equation.master_equation import (
    clamp_pattern_statistics,
    expected_statistics_batch,
    resolve_solver,
)
from .._master_equation.solvers import (
    AUTOMATIC_SOLVER,
    AbstractMasterEquationSolver,
    StatisticsSolver,
)
from .._model.ctbn import PaddedCTBN
from .._model.interventions import Intervention, exposure_scale
from .._model.layout import all_global_states, config_index, num_configurations
from .._paths.sampling import PathStatistics, check_count, nested_vmap, path_statistics
from .kl_estimators import AbstractKLEstimator, MonteCarlo, PlugIn


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
    return _predictive_on_sets(
        posterior.prior,
        node,
        transitions,
        dwell_times,
        posterior.statistics.transitions[node],
        posterior.statistics.dwell_times[node],
        num_configurations(sets, posterior.cardinalities),
    )


def _predictive_on_sets(
    prior, node, transitions, dwell_times, history_transitions, history_dwell_times, num_configs
):
    """The prior's predictive log-likelihood on every set (leading axis) of node `node` (an
    index, may be traced: the priors look their per-node values up by it)."""
    return jax.vmap(functools.partial(prior.log_predictive, node))(
        transitions, dwell_times, history_transitions, history_dwell_times, num_configs
    )


def _flat_draws(draws: StructureDraws, n: int):
    """Node n's draws as one batch `(sets * samples,)` of models, and the index of the set each
    draw fixes par(n) to."""
    models = draws.models[n]
    n_sets, n_samples = jax.tree_util.tree_leaves(models)[0].shape[:2]
    flat = jax.tree_util.tree_map(lambda a: a.reshape(n_sets * n_samples, *a.shape[2:]), models)
    return flat, jnp.repeat(jnp.arange(n_sets), n_samples)


def _sampled_statistics(
    draws, n, interventions, initial_state, horizon, path_key, num_paths, max_events
) -> PathStatistics:
    """What `num_paths` sampled paths per draw of node n and per candidate (`interventions`,
    leading axis) add to node n's statistics, batch `(candidates, draws, paths)`: all in one
    sampling loop, the same path keys for every candidate."""
    flat, _ = _flat_draws(draws, n)
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


@eqx.filter_jit
def structure_draws(
    posterior: StructurePosterior, key: PRNGKeyArray, num_samples: int
) -> StructureDraws:
    """Per node n, `num_samples` draws of the other nodes' parent sets and of all rates for each
    candidate set of n (see [`jaxctbn.criteria.StructureDraws`][]); `jax.jit`-compiled."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}.")

    def node_draws(n, sets, key_n):  # node n's draws (n traced within a group of nodes)
        keys = jr.split(key_n, (sets.shape[0], num_samples))

        def one(P, k):
            k_graph, k_rates = jr.split(k)
            idx = posterior.sample_parent_sets(k_graph).at[n].set(P)
            return posterior.rates_given(idx, k_rates)

        return jax.vmap(lambda P, ks: jax.vmap(lambda k: one(P, k))(ks))(
            jnp.arange(sets.shape[0]), keys
        )

    # the nodes of a group of equal shapes drawn together: one set of random draws each
    models = posterior._per_node(
        node_draws,
        [jnp.asarray(s) for s in posterior.parent_sets],
        jr.split(key, len(posterior.names)),
    )
    return StructureDraws(models=tuple(models))


@eqx.filter_jit
def structure_divergences(
    posterior: StructurePosterior,
    draws: StructureDraws,
    initial_state: ArrayLike,
    horizon: ArrayLike,
    *,
    intervention: Intervention | None = None,
    solver: StatisticsSolver = AUTOMATIC_SOLVER,
    estimator: AbstractKLEstimator = PlugIn(),
    path_key: PRNGKeyArray | None = None,
) -> tuple[Float[Array, " _sets"], ...]:
    r"""$a_n(P')$ for every node and candidate set (zeros for intervened nodes) over the draws.

    - `estimator=PlugIn()`: the paper's first-order form, $\ell_n$ at the expected statistics
      from one master-equation solve per draw (biased, can even be negative).
    - `estimator=MonteCarlo(num_paths)`: $\ell_n$ at the statistics of `num_paths` sampled
      paths per draw (`path_key`; reuse it across interventions for common random numbers);
      unbiased for $a_n$ up to Monte Carlo error.
    """
    divergence_of_node = _divergence_of_node(
        posterior, draws, initial_state, horizon, solver, estimator, path_key
    )
    ivs = _one_candidate(posterior, intervention)
    return tuple(divergence_of_node(n, ivs)[0] for n in range(len(draws.models)))


#: Joint draws whose projections are vectorised together (bounds the memory of many draws).
JOINT_DRAW_BATCH = 10


class JointStructureDraws(eqx.Module):
    r"""`num_samples` draws of the whole graph from $p(G\mid H)$ and of all rates given it, shared
    by every node: `models`, a [`jaxctbn.PaddedCTBN`][] batch `(num_samples,)`, and `indices`
    `(num_samples, N)`, the candidate-set index of each node's parents in each draw."""

    models: PaddedCTBN
    indices: Int[Array, "samples nodes"]


@eqx.filter_jit
def joint_structure_draws(
    posterior: StructurePosterior,
    key: PRNGKeyArray,
    num_samples: int,
    *,
    systematic: bool = True,
) -> JointStructureDraws:
    """`num_samples` joint draws of the graph and the rates (see
    [`jaxctbn.criteria.JointStructureDraws`][]); `jax.jit`-compiled. With `systematic=True` (default)
    the graphs come from
    [`StructurePosterior.systematic_parent_sets`][jaxctbn.StructurePosterior.systematic_parent_sets]
    (each draw distributed as an independent one, each node's sets in proportion to their
    probabilities across the draws: less variance at no cost); with `False`, independent draws
    ([`sample_parent_sets`][jaxctbn.StructurePosterior.sample_parent_sets])."""
    if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}.")
    k_graphs, k_rates = jr.split(key)
    if systematic:
        indices = posterior.systematic_parent_sets(k_graphs, num_samples)
    else:
        indices = jax.vmap(posterior.sample_parent_sets)(jr.split(k_graphs, num_samples))
    models = jax.vmap(posterior.rates_given)(indices, jr.split(k_rates, num_samples))
    return JointStructureDraws(models=models, indices=indices)


def _joint_divergences(
    posterior: StructurePosterior,
    draws: JointStructureDraws,
    intervention: Intervention,
    initial_state,
    horizon,
    solver,
) -> tuple[Float[Array, " _sets"], ...]:
    r"""$a_n(P')$ of every node for one candidate `intervention` from joint draws: one solve per
    draw, shared by all nodes, $a_n(P')=\frac1S\sum_s[\ell_n(\hat S_s;P_s)-\ell_n(\hat S_s;P')]$
    with $P_s$ the draw's parents of $n$ (zeros for a node the candidate clamps)."""
    S = draws.indices.shape[0]
    stats = expected_statistics_batch(
        draws.models,
        jnp.broadcast_to(jnp.asarray(initial_state), (S, *jnp.shape(initial_state))),
        horizon,
        interventions=jax.tree_util.tree_map(
            lambda a: jnp.broadcast_to(a, (S, *jnp.shape(a))), intervention
        ),
        solver=solver,
    )
    cards = posterior.cardinalities
    out: list = [None] * len(cards)
    for group in posterior._node_groups():  # the nodes of a group vectorised together
        index = jnp.asarray(group, jnp.int32)

        def stacked(arrays, group=group):
            return jnp.stack([jnp.asarray(arrays[n]) for n in group])

        sets = stacked(posterior.parent_sets)
        history = (
            stacked(posterior.statistics.transitions),
            stacked(posterior.statistics.dwell_times),
            stacked([num_configurations(s, cards) for s in posterior.parent_sets]),
        )

        scale = jnp.stack([exposure_scale(intervention, n, jnp.result_type(float)) for n in group])

        def ells_of(st, group=group, index=index, sets=sets, history=history, scale=scale):
            M, T = st.nodes_statistics_on_sets(tuple(group), sets)
            T = T * scale.reshape(-1, *(1,) * (T.ndim - 1))
            predictive = functools.partial(_predictive_on_sets, posterior.prior)
            return jax.vmap(predictive)(index, M, T, *history)  # (nodes, sets)

        # draws in batches: the projections' intermediates grow with draws x nodes x sets
        ells = jax.lax.map(ells_of, stats, batch_size=JOINT_DRAW_BATCH)  # (draws, nodes, sets)
        own = jnp.take_along_axis(ells, draws.indices[:, index, None], axis=2)  # ell(S_s; P_s)
        a = (own - ells).mean(0)
        a = jnp.where(intervention.targets[index][:, None], jnp.zeros_like(a), a)
        for i, n in enumerate(group):
            out[n] = a[i]
    return tuple(out)


class AbstractGraphDraws(eqx.Module):
    r"""How the structure (V)BHC draws graphs and rates to estimate the divergences $a_n(P')$
    (a Module passed to [`jaxctbn.VBHC`][] and [`jaxctbn.BHC`][] as `graph_draws=`). Both
    subclasses estimate the same $a_n(P')$ without bias; they differ in cost and variance."""

    @abc.abstractmethod
    def divergences(
        self,
        posterior: StructurePosterior,
        candidates: Intervention,
        initial_state: ArrayLike,
        horizon: ArrayLike,
        *,
        key: PRNGKeyArray,
        num_samples: int,
        solver: StatisticsSolver,
        estimator: AbstractKLEstimator,
        batching: AbstractBatching,
    ) -> tuple[Float[Array, "candidates _sets"], ...]:
        """$a_n(P')$ for every candidate (leading axis), node and candidate set, with the same
        draws for every candidate (common random numbers)."""


class StratifiedGraphDraws(AbstractGraphDraws):
    r"""The paper's Algorithm 2: per node $n$ and candidate set $P$, `num_samples` draws of the
    other nodes' parent sets and of the rates with $\mathrm{par}(n)=P$
    ([`jaxctbn.criteria.structure_draws`][]), weighted by $p(P\mid H)$. Every set gets its draws, so the
    rare ones are estimated as well as the likely ones; the cost is
    $\sum_n|\mathcal P_n|\cdot N_S$ master-equation solves per candidate, which limits it to
    small networks or few sets (see `max_sets`). Takes both KL estimators (the default)."""

    def divergences(
        self,
        posterior,
        candidates,
        initial_state,
        horizon,
        *,
        key,
        num_samples,
        solver,
        estimator,
        batching,
    ):
        key_draws, key_paths = jr.split(key)
        draws = structure_draws(posterior, key_draws, num_samples)
        return divergences_all_candidates(
            posterior,
            draws,
            candidates,
            initial_state,
            horizon,
            key=key_paths,
            solver=solver,
            estimator=estimator,
            batching=batching,
        )


class JointGraphDraws(AbstractGraphDraws):
    r"""`num_samples` draws of the *whole* graph from $p(G\mid H)$ and of the rates given it
    ([`jaxctbn.criteria.joint_structure_draws`][]), shared by every node: one master-equation solve per
    draw and candidate serves all $N$ nodes, and
    $a_n(P')\approx\frac1{N_S}\sum_s[\ell_n(\hat S_s;P_s)-\ell_n(\hat S_s;P')]$ with $P_s$ the
    draw's parents of $n$. Since $\mathrm{par}(n)\sim p(P\mid H)$ in these draws, this is the
    same expectation as the stratified sum $\sum_P p(P\mid H)\,\mathsf E[\cdot\mid P]$, without
    bias; the cost is $N_S$ solves per candidate whatever the number of nodes and sets (the
    stratified scheme needs $\sum_n|\mathcal P_n|N_S$), at the price of more variance where the
    posterior is diffuse (a set is drawn in proportion to its probability). For large networks.
    Takes the [`jaxctbn.PlugIn`][] estimator.

    **Arguments:** `systematic` (static, default `True`): the graphs are drawn by systematic
    sampling of each node's parent set across the draws
    ([`StructurePosterior.systematic_parent_sets`][jaxctbn.StructurePosterior.systematic_parent_sets]),
    still unbiased, with less variance at the same cost; `False` draws them independently."""

    systematic: bool = eqx.field(default=True, static=True)

    def __check_init__(self):
        if not isinstance(self.systematic, bool):
            raise ValueError(
                f"JointGraphDraws: systematic must be True or False, got {self.systematic!r}."
            )

    def divergences(
        self,
        posterior,
        candidates,
        initial_state,
        horizon,
        *,
        key,
        num_samples,
        solver,
        estimator,
        batching,
    ):
        if not isinstance(estimator, PlugIn):
            raise ValueError(
                f"estimator: JointGraphDraws takes the PlugIn() estimator, got {estimator!r}; "
                "use StratifiedGraphDraws() for MonteCarlo."
            )
        draws = joint_structure_draws(posterior, key, num_samples, systematic=self.systematic)
        return batching.map(
            lambda iv: _joint_divergences(posterior, draws, iv, initial_state, horizon, solver),
            candidates,
        )


def _one_candidate(posterior: StructurePosterior, intervention: Intervention | None):
    """`intervention` (`None` = none) as a batch of one candidate."""
    if intervention is None:
        intervention = Intervention.none(len(posterior.names))
    return jax.tree_util.tree_map(lambda a: a[None], intervention)


def _divergence_of_node(posterior, draws, initial_state, horizon, solver, estimator, path_key):
    """Validate the estimator settings and return `(n, intervention) -> a_n`."""
    if not isinstance(estimator, PlugIn | MonteCarlo):
        raise ValueError(
            f"estimator: expected jaxctbn.PlugIn() or jaxctbn.MonteCarlo(...), got {estimator!r}."
        )
    if isinstance(estimator, MonteCarlo) and path_key is None:
        raise ValueError("path_key: required for the MonteCarlo estimator.")
    return functools.partial(
        _node_divergence,
        posterior,
        draws,
        initial_state=initial_state,
        horizon=horizon,
        solver=solver,
        estimator=estimator,
        path_key=path_key,
    )


def solvable_by_pattern(interventions: Intervention, solver, models) -> bool:
    """Whether candidates can be solved by clamp pattern (`clamp_pattern_statistics`): perfect
    interventions and an exact solver."""
    return (
        interventions.rate_scales is None
        and interventions.replacement_cims is None
        and isinstance(resolve_solver(solver, models), AbstractMasterEquationSolver)
    )


def _shares_clamp_patterns(interventions: Intervention, num_others: int, solver, models) -> bool:
    """Whether a chunk of candidates is solved by clamp pattern: `solvable_by_pattern`, and
    fewer patterns of the other nodes than candidates."""
    return solvable_by_pattern(interventions, solver, models) and (
        2**num_others < interventions.targets.shape[0]
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
    def of(posterior: StructurePosterior, n: int) -> "PatternBins":
        sets = jnp.asarray(posterior.parent_sets[n])
        cards = posterior.cardinalities
        others = [j for j in range(len(cards)) if j != n]
        slot_states = np.zeros((math.prod(cards[j] for j in others), len(cards)), np.int32)
        slot_states[:, others] = all_global_states(tuple(cards[j] for j in others))
        slot_states = jnp.asarray(slot_states)
        config = jax.vmap(lambda P: config_index(slot_states, P, cards))(sets)  # (sets, W)
        history_M = jnp.take_along_axis(
            posterior.statistics.transitions[n], config[:, :, None, None], axis=1
        )
        history_T = jnp.take_along_axis(
            posterior.statistics.dwell_times[n], config[:, :, None], axis=1
        )
        return PatternBins(
            slot_states, config, history_M, history_T, num_configurations(sets, cards)
        )


def configuration_term(posterior: StructurePosterior, n: int):
    """`term(M, T, M_bar, T_bar, U)`: the prior's predictive term of one configuration of a set
    with `U` configurations, node statistics `(k, k)`, `(k,)` given the history's."""
    prior = posterior.prior

    def term(M, T, M_bar, T_bar, U):
        return prior.log_predictive(n, M[None], T[None], M_bar[None], T_bar[None], U)

    return term


def pattern_bin_statistics(posterior, n, by_pattern, func=None):
    """Node `n`'s statistics in the bins of each clamp pattern and draw, `((patterns, draws,
    sets, W, k, k), (patterns, draws, sets, W, k))` (`node_statistics_by_other_nodes`), or
    `func(M, T)` of each pattern's `(draws, sets, W, ...)` (evaluated pattern by pattern)."""
    sets = jnp.asarray(posterior.parent_sets[n])

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


def _predictive_by_pattern(posterior, n, by_pattern, interventions):
    r"""$\ell_n(\hat S_{c,b};P)$ `(candidates, draws, sets)` from the clamp-pattern solves, for a
    prior whose predictive factorises over configurations: per pattern $J$ and draw, node $n$'s
    statistics in the bins $w$ of the other nodes' configurations that $P\cup J$ separates
    (`node_statistics_by_other_nodes`), one predictive term per bin (with the history of
    configuration $c(w_P)$ of $P$; empty bins give zero), and each candidate's $\ell$ the sum
    of the bins of its clamped states. $2^{|\text{others}|}$ bins per pattern and set instead
    of the padded configurations of every candidate (for the paper's space, 3.4x fewer
    terms)."""
    bins = PatternBins.of(posterior, n)
    term = configuration_term(posterior, n)
    per_set = jax.vmap(term, in_axes=(0, 0, 0, 0, None))  # over bins
    per_draw = jax.vmap(jax.vmap(per_set), in_axes=(0, 0, None, None, None))  # sets, draws

    def terms_of(M, T):
        return per_draw(M, T, bins.history_transitions, bins.history_dwell_times, bins.num_configs)

    terms = pattern_bin_statistics(posterior, n, by_pattern, terms_of)  # (patterns, draws, sets, W)
    # candidate c's bins: those of its pattern with its clamped states (none for a candidate
    # clamping n), as one contraction over (pattern, bin) rather than a gather of each
    # candidate's pattern, which costs more per design step (the step is timed in
    # `benchmarks/bench_design_step.py`; results in `benchmarks/results/design_step.md`)
    own = candidate_bins(by_pattern, interventions, bins.slot_states).astype(terms.dtype)
    return jnp.einsum("qbpw,cqw->cbp", terms, own)


#: Problems (candidate x draw) whose predictive likelihoods are evaluated together.
PREDICTIVE_BATCH = 240


def _node_divergence(
    posterior,
    draws,
    n,
    interventions,
    *,
    initial_state,
    horizon,
    solver,
    estimator,
    path_key,
):
    """$a_n(P')$ for one node `n` and a batch of candidates `interventions` (leading axis),
    `(candidates, sets)` (zeros for a candidate that clamps n)."""
    sets = posterior.parent_sets[n]
    n_sets = sets.shape[0]
    flat, _ = _flat_draws(draws, n)

    def ell(M_hat, T_hat):
        return predictive_log_likelihood(posterior, n, M_hat, T_hat)

    if isinstance(estimator, PlugIn):
        # the chunk's candidates x draws as one batch of solves: one loop for the chunk (with
        # one uniformisation rate), rather than a loop per candidate under vmap, whose batched
        # trip counts cost a select of every array at every product
        C = interventions.targets.shape[0]
        B = flat.parent_index[0].shape[0]
        others = tuple(j for j in range(len(posterior.names)) if j != n)
        if _shares_clamp_patterns(interventions, len(others), solver, flat):
            # candidates that clamp the same other nodes share their solves (the sub-cubes of
            # the clamped states do not communicate); those clamping n get zeros
            by_pattern = clamp_pattern_statistics(
                flat, initial_state, horizon, interventions, clampable=others, solver=solver
            )
            if posterior.prior.factorises_over_configurations:
                # and each configuration's predictive term, shared by the candidates it serves
                ells = _predictive_by_pattern(posterior, n, by_pattern, interventions)
                return _node_divergence_from(posterior, n, interventions.targets[:, n], ells)
            stats = by_pattern.members(interventions)
        else:
            models = jax.tree_util.tree_map(
                lambda a: jnp.broadcast_to(a, (C, *a.shape)).reshape(C * B, *a.shape[1:]), flat
            )
            ivs = jax.tree_util.tree_map(lambda a: jnp.repeat(a, B, axis=0), interventions)
            init = jnp.broadcast_to(jnp.asarray(initial_state), (C * B, *jnp.shape(initial_state)))
            stats = expected_statistics_batch(
                models, init, horizon, interventions=ivs, solver=solver
            )
        # the predictive likelihoods in cache-sized batches of problems (at once, the chunk's
        # statistics on every set leave the cache and the design step takes longer; timed in
        # `benchmarks/bench_design_step.py`, results in `benchmarks/results/design_step.md`)
        scales = jnp.repeat(_exposures(interventions, n, C), B)  # per problem

        def ell_of(x):
            st, scale = x
            M, T = st.node_statistics_on_sets(n, sets)
            return ell(M, scale * T)

        ells = jax.lax.map(ell_of, (stats, scales), batch_size=PREDICTIVE_BATCH)
        ells = ells.reshape(C, B, n_sets)  # (candidates, draws, sets)
    else:
        stats = _sampled_statistics(
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

        # candidate by candidate: the statistics on every set of every path are the big arrays
        scales = _exposures(interventions, n, interventions.targets.shape[0])
        ells = jax.lax.map(ells_of, (stats, scales))  # (candidates, draws, sets)
    return _node_divergence_from(posterior, n, interventions.targets[:, n], ells)


def _exposures(interventions: Intervention, n: int, num: int) -> Array:
    """Node n's exposure scale (`exposure_scale`) for each of `num` candidates."""
    dtype = jnp.result_type(float)
    return jnp.broadcast_to(exposure_scale(interventions, n, dtype), (num,))


def _node_divergence_from(posterior, n, clamped, ells):
    """$a_n(P')$ `(candidates, sets)` from the predictive log-likelihoods `ells` `(candidates,
    draws, sets)` of node n's draws (stratified: the draws of each set $P$ in a block); zero
    where `clamped` `(candidates,)` says the candidate clamps n."""
    n_sets = posterior.parent_sets[n].shape[0]
    ells = ells.reshape(-1, n_sets, ells.shape[1] // n_sets, n_sets)  # [i, P, s, P']
    own = jnp.diagonal(ells, axis1=1, axis2=3).transpose(0, 2, 1)  # [i, P, s]: ell(S; P)
    diff = (own[..., None] - ells).mean(2)  # [i, P, P']
    probs = posterior.parent_set_probabilities()[n]
    a = jnp.einsum("p,ipq->iq", probs, diff)
    keep = (~clamped).astype(a.dtype)
    return keep[:, None] * a


def _node_eig(
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
    (zero for a candidate that clamps n). `rescore` is node n's `_rescorer`."""
    sets = posterior.parent_sets[n]
    stats = _sampled_statistics(
        draws, n, interventions, initial_state, horizon, path_key, num_paths, max_events
    )

    def gain_of(x):  # one candidate's paths
        stats, scale = x
        M, T = stats.node_statistics_on_sets(sets)
        return _node_eig_from_statistics(posterior, draws, n, rescore, M, scale * T)

    # candidate by candidate: the statistics on every set of every path are the big arrays
    scales = _exposures(interventions, n, interventions.targets.shape[0])
    gains = jax.lax.map(gain_of, (stats, scales))  # (candidates,)
    keep = (~interventions.targets[:, n]).astype(gains.dtype)
    return keep * gains


def _node_eig_from_statistics(posterior, draws, n, rescore, transitions, dwell_times):
    r"""Node n's EIG term $\sum_P p(P\mid H)\,\mathsf E[\ln p(P\mid S,H)-\ln p(P\mid H)]$ from
    the statistics of node n's sampled paths projected on every set, `transitions` `(draws,
    paths, sets, configs, k, k)` and `dwell_times` `(draws, paths, sets, configs, k)` (the
    draws of each stratum $P$ in a block)."""
    old = posterior.log_posterior()[n]
    _, true_index = _flat_draws(draws, n)
    # ln p(P | S, H) - ln p(P | H) for the true P of each draw
    new = nested_vmap(rescore, 2)(transitions, dwell_times)  # (draws, paths, P)
    own = jnp.take_along_axis(new, true_index[:, None, None], axis=-1)[..., 0]
    gains = (own - old[true_index][:, None]).mean(1)  # mean over the paths of each draw
    gains = gains.reshape(old.shape[0], -1).mean(1)  # [P]: mean over the stratum's draws
    return (jnp.exp(old) * gains).sum()


def _rescorer(posterior: StructurePosterior, n: int, max_events: int):
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


def _over_free_candidates(
    interventions, num_nodes, batching: AbstractBatching, value_of_node
) -> tuple[Array, ...]:
    """`value_of_node(n, chunk_of_candidates)` for every node and candidate, one array per node
    with the candidates on the leading axis, skipping the work for candidates that clamp node
    $n$ (whose value is 0; `value_of_node` must give 0 for them too): per node the candidates
    are ordered not-clamping first and computed in chunks of `chunk` (`value_of_node` gets a
    whole chunk, so it can batch it as it likes), and a chunk of clamping candidates only is
    skipped by `lax.cond`. For the paper's space a node is clamped by 2/3 of the candidates, so
    this saves up to 2/3 of the master-equation solves or sampled paths. (Under `vmap` over
    histories the candidates are shared, the predicate stays unbatched and the skip is kept.)
    The chunks have `batching.chunk_size` candidates and are mapped by
    `batching.map_sequentially` (one after another; [`jaxctbn.Sharded`][] splits them across
    its devices)."""
    num_candidates = interventions.targets.shape[0]
    chunk = batching.chunk_size(num_candidates)
    out = []
    for n in range(num_nodes):
        order, free = free_first(interventions.targets[:, n], chunk)

        def compute(ivs, n=n):
            return value_of_node(n, ivs)

        run_chunk = skipping_chunks(compute, interventions)
        per_chunk = batching.map_sequentially(run_chunk, (order, free))  # (chunks, chunk, ...)
        values = per_chunk.reshape(-1, *per_chunk.shape[2:])[:num_candidates]
        flat_order = order.reshape(-1)[:num_candidates]
        out.append(jnp.zeros_like(values).at[flat_order].set(values))
    return tuple(out)


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


def structure_vbhc_minimum(posterior: StructurePosterior, divergences) -> Float[Array, ""]:
    r"""$\min_q\mathrm{VBHC}=\sum_n-\ln\sum_{P'}p(P'\mid H)e^{-a_n(P')}$ (maths §4)."""
    return jnp.asarray(
        sum(-jax.nn.logsumexp(lp - a) for lp, a in zip(posterior.log_posterior(), divergences))
    )


def structure_bhc(posterior: StructurePosterior, divergences) -> Float[Array, ""]:
    r"""$\mathrm{BHC}=\sum_n\sum_{P'}p(P'\mid H)\,a_n(P')$."""
    return jnp.asarray(
        sum((jnp.exp(lp) * a).sum() for lp, a in zip(posterior.log_posterior(), divergences))
    )


def structure_vbhc(posterior: StructurePosterior, divergences, logits) -> Float[Array, ""]:
    r"""$\sum_n[\mathrm{KL}(q_n\|p_n)+\sum_{P'}q_n(P')a_n(P')]$ with $q_n=\mathrm{softmax}$(`logits[n]`)."""
    total = jnp.asarray(0.0)
    for lp, a, z in zip(posterior.log_posterior(), divergences, logits):
        lq = jax.nn.log_softmax(z)
        q = jnp.exp(lq)
        total = total + (q * (lq - lp)).sum() + (q * a).sum()
    return total


def structure_vbhc_minimise(
    posterior: StructurePosterior, divergences, optimiser: AbstractVBHCOptimiser
) -> tuple[Float[Array, ""], tuple[Array, ...]]:
    r"""$\min_q$ VBHC by a numerical `optimiser` over softmax logits with autodiff gradients,
    starting at $q=p(G\mid H)$. Returns `(min VBHC, logits)`; agrees with
    [`jaxctbn.criteria.structure_vbhc_minimum`][] at convergence."""
    logits = tuple(lp for lp in posterior.log_posterior())
    return optimiser.minimise(lambda z: structure_vbhc(posterior, divergences, z), logits)


def divergences_all_candidates(
    posterior: StructurePosterior,
    draws: StructureDraws,
    candidates: Intervention,
    initial_state: ArrayLike,
    horizon: ArrayLike,
    *,
    key: PRNGKeyArray,
    solver: StatisticsSolver,
    estimator: AbstractKLEstimator,
    batching: AbstractBatching,
) -> tuple[Float[Array, "candidates _sets"], ...]:
    """$a_n(P')$ for every candidate (leading axis), node and candidate set, with the same draws
    and path keys for every candidate (common random numbers). Per node, candidates are computed
    in chunks of `batching.chunk_size`, and chunks whose candidates all clamp the node are
    skipped (their $a_n$ is 0)."""
    divergence_of_node = _divergence_of_node(
        posterior, draws, initial_state, horizon, solver, estimator, key
    )
    return _over_free_candidates(candidates, len(draws.models), batching, divergence_of_node)


@eqx.filter_jit
def structure_eig(
    posterior: StructurePosterior,
    draws: StructureDraws,
    initial_state: ArrayLike,
    horizon: ArrayLike,
    *,
    path_key: PRNGKeyArray,
    num_paths: int = 10,
    intervention: Intervention | None = None,
    max_events: int = 256,
) -> Float[Array, ""]:
    r"""The structure EIG by Monte Carlo (maths §6, Algorithm 4 **with** the stratum weights):
    $\sum_{n\in\aleph}\sum_P p(P\mid H)\,\mathsf E_{G_{\neg n},\Lambda,S\mid\mathrm{par}(n)=P}
    [\ln p(P\mid S,H)-\ln p(P\mid H)]$, where $p(\cdot\mid S,H)$ rescores node $n$'s candidate
    sets with the path's statistics added. As printed, Algorithm 4 drops $p(P\mid H)$ and
    overestimates (by ~2.4x in the example of maths §6).

    `num_paths` paths per draw (keys from `path_key`; reuse it across interventions for common
    random numbers), each with at most `max_events` jumps (a longer path raises an error; only
    the statistics of the paths are kept, so the cost hardly grows with `max_events`). For a
    batch of candidates use [`jaxctbn.score_interventions`][] with [`jaxctbn.EIG`][]: the same
    numbers, with each node's paths for a whole chunk of candidates sampled in one loop and the
    nodes a candidate clamps skipped."""
    ivs = _one_candidate(posterior, intervention)
    node_eig = _eig_of_node(
        posterior, draws, initial_state, horizon, path_key, num_paths, max_events
    )
    return sum((node_eig(n, ivs)[0] for n in range(len(draws.models))), start=jnp.asarray(0.0))


def _eig_of_node(posterior, draws, initial_state, horizon, path_key, num_paths, max_events):
    """Validate the settings and return `(n, candidates) -> node n's EIG term per candidate`."""
    check_count(num_paths, "num_paths")
    check_count(max_events, "max_events")
    # built here, before the caller's loop over chunks of candidates: XLA would otherwise fuse
    # the rescorers' lgamma tables into their lookups and evaluate lgamma per lookup again
    rescorers = [_rescorer(posterior, n, max_events) for n in range(len(draws.models))]

    def node_eig(n, interventions):
        return _node_eig(
            posterior,
            draws,
            n,
            interventions,
            initial_state=initial_state,
            horizon=horizon,
            path_key=path_key,
            num_paths=num_paths,
            max_events=max_events,
            rescore=rescorers[n],
        )

    return node_eig


def eig_all_candidates(
    posterior: StructurePosterior,
    draws: StructureDraws,
    candidates: Intervention,
    initial_state: ArrayLike,
    horizon: ArrayLike,
    *,
    key: PRNGKeyArray,
    num_paths: int,
    max_events: int,
    batching: AbstractBatching,
) -> Float[Array, " candidates"]:
    """[`jaxctbn.criteria.structure_eig`][] of every candidate (leading axis), with the same draws and
    path keys for every candidate (common random numbers): per node, the candidates in chunks
    of `batching.chunk_size`, each chunk's paths sampled in one loop, and chunks whose
    candidates all clamp the node skipped (their term is 0)."""
    node_eig = _eig_of_node(posterior, draws, initial_state, horizon, key, num_paths, max_events)
    per_node = _over_free_candidates(candidates, len(draws.models), batching, node_eig)
    return sum(per_node[1:], start=per_node[0])
