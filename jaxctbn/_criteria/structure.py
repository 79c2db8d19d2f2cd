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

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from .._batching import AbstractBatching
from .._learning.optimisers import AbstractVBHCOptimiser
from .._learning.structure_posterior import StructurePosterior
from .._master_equation import (
    AUTOMATIC_SOLVER,
    StatisticsSolver,
    expected_statistics_batch,
)
from .._model.ctbn import PaddedCTBN
from .._model.interventions import Intervention, exposure_scale
from .._model.layout import num_configurations
from .._paths.sampling import check_count
from .kl_estimators import AbstractKLEstimator, MonteCarlo, PlugIn
from .node_divergences import (
    StructureDraws,
    node_divergence,
    node_eig_terms,
    over_free_candidates,
    pattern_route_takes_groups,
    predictive_on_sets,
    rescorer,
)


@eqx.filter_jit
def structure_draws(
    posterior: StructurePosterior, key: PRNGKeyArray, num_samples: int
) -> StructureDraws:
    """Per node n, `num_samples` draws of the other nodes' parent sets and of all rates for each
    candidate set of n (see `StructureDraws`); `jax.jit`-compiled."""
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
    return tuple(divergence_of_node(n)(ivs)[0] for n in range(len(draws.models)))


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
    `JointStructureDraws`); `jax.jit`-compiled. With `systematic=True` (default)
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
            predictive = functools.partial(predictive_on_sets, posterior.prior)
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
    (`structure_draws`), weighted by $p(P\mid H)$. Every set gets its draws, so the
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
    (`joint_structure_draws`), shared by every node: one master-equation solve per
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
    """Validate the estimator settings and return `n -> (interventions -> a_n)`."""
    if not isinstance(estimator, PlugIn | MonteCarlo):
        raise ValueError(
            f"estimator: expected jaxctbn.PlugIn() or jaxctbn.MonteCarlo(...), got {estimator!r}."
        )
    if isinstance(estimator, MonteCarlo) and path_key is None:
        raise ValueError("path_key: required for the MonteCarlo estimator.")
    return functools.partial(
        node_divergence,
        posterior,
        draws,
        initial_state=initial_state,
        horizon=horizon,
        solver=solver,
        estimator=estimator,
        path_key=path_key,
    )


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
    `structure_vbhc_minimum` at convergence."""
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
    chunk = batching.chunk_size(candidates.targets.shape[0])
    groups = (
        tuple(posterior._node_groups())  # one compiled body per group of equal shapes
        if pattern_route_takes_groups(posterior, draws, candidates, chunk, solver, estimator)
        else None
    )
    return over_free_candidates(
        candidates, len(draws.models), batching, divergence_of_node, groups=groups
    )


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
    rescorers = [rescorer(posterior, n, max_events) for n in range(len(draws.models))]

    def node_eig(n, interventions):
        return node_eig_terms(
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
    """`structure_eig` of every candidate (leading axis), with the same draws and
    path keys for every candidate (common random numbers): per node, the candidates in chunks
    of `batching.chunk_size`, each chunk's paths sampled in one loop, and chunks whose
    candidates all clamp the node skipped (their term is 0)."""
    node_eig = _eig_of_node(posterior, draws, initial_state, horizon, key, num_paths, max_events)
    per_node = over_free_candidates(
        candidates, len(draws.models), batching, lambda n: functools.partial(node_eig, n)
    )
    return sum(per_node[1:], start=per_node[0])
