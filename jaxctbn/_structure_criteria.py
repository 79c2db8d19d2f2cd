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

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from ._batching import AbstractBatching
from ._interventions import Intervention
from ._kl_estimators import AbstractKLEstimator, MonteCarlo, PlugIn
from ._layout import num_configurations
from ._master_equation import expected_statistics_batch
from ._optimisers import AbstractVBHCOptimiser
from ._sampling import sample_trajectory
from ._solvers import DEFAULT_SOLVER, AbstractMasterEquationSolver
from ._statistics import node_statistics
from ._structure import StructurePosterior


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
    return jax.vmap(functools.partial(posterior.prior.log_predictive, node))(
        transitions,
        dwell_times,
        posterior.statistics.transitions[node],
        posterior.statistics.dwell_times[node],
        num_configurations(sets, posterior.cardinalities),
    )


def _sampled_node_statistics(
    model, key, n, sets, configs, cards, initial_state, horizon, intervention, max_events
):
    """Sample one path of `model` and return node n's statistics under every candidate set."""
    path = sample_trajectory(
        model,
        jnp.asarray(initial_state),
        horizon,
        key=key,
        intervention=intervention,
        max_events=max_events,
    )
    st = jax.vmap(lambda P: node_statistics(path, n, P, cards, num_configs=configs))(sets)
    return st.transitions, st.dwell_times


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
    candidate set of n (see [`jaxctbn.StructureDraws`][]); `jax.jit`-compiled."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}.")
    models = []
    for n, (sets, key_n) in enumerate(
        zip(posterior.parent_sets, jr.split(key, len(posterior.names)))
    ):
        keys = jr.split(key_n, (sets.shape[0], num_samples))

        def one(P, k, n=n):
            k_graph, k_rates = jr.split(k)
            idx = posterior.sample_parent_sets(k_graph).at[n].set(P)
            return posterior.rates_given(idx, k_rates)

        models.append(
            jax.vmap(lambda P, ks: jax.vmap(lambda k: one(P, k))(ks))(
                jnp.arange(sets.shape[0]), keys
            )
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
    solver: AbstractMasterEquationSolver = DEFAULT_SOLVER,
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
    return tuple(divergence_of_node(n, intervention) for n in range(len(draws.models)))


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


def _node_divergence(
    posterior,
    draws,
    n,
    intervention,
    *,
    initial_state,
    horizon,
    solver,
    estimator,
    path_key,
):
    """$a_n(P')$ for one node `n` (zeros if `intervention` clamps it)."""
    models = draws.models[n]
    sets = posterior.parent_sets[n]
    n_sets, n_samples = sets.shape[0], jax.tree_util.tree_leaves(models)[0].shape[1]
    flat = jax.tree_util.tree_map(lambda a: a.reshape(n_sets * n_samples, *a.shape[2:]), models)
    B = n_sets * n_samples
    configs = posterior.statistics.transitions[n].shape[1]

    def ell(M_hat, T_hat):
        return predictive_log_likelihood(posterior, n, M_hat, T_hat)

    if isinstance(estimator, PlugIn):
        init = jnp.broadcast_to(jnp.asarray(initial_state), (B, *jnp.shape(initial_state)))
        ivs = (
            None
            if intervention is None
            else jax.tree_util.tree_map(
                lambda a: jnp.broadcast_to(a, (B, *jnp.shape(a))), intervention
            )
        )
        stats = expected_statistics_batch(flat, init, horizon, interventions=ivs, solver=solver)

        def ell_all(st):
            M_hat, T_hat = st.node_statistics_on_sets(n, sets)
            return ell(M_hat, T_hat)

        ells = jax.vmap(ell_all)(stats)
    else:
        keys = jr.split(jr.fold_in(path_key, n), (B, estimator.num_paths))

        def ell_paths(model, ks):
            def one_path(k):
                M, T = _sampled_node_statistics(
                    model,
                    k,
                    n,
                    sets,
                    configs,
                    posterior.cardinalities,
                    initial_state,
                    horizon,
                    intervention,
                    estimator.max_events,
                )
                return ell(M, T)

            return jax.vmap(one_path)(ks).mean(0)

        ells = jax.vmap(ell_paths)(flat, keys)
    ells = ells.reshape(n_sets, n_samples, n_sets)  # [P, s, P']
    own = jnp.diagonal(ells, axis1=0, axis2=2).T  # [P, s]: ell(S; P) for the true set
    diff = (own[:, :, None] - ells).mean(1)  # [P, P']
    probs = posterior.parent_set_probabilities()[n]
    a = probs @ diff
    keep = 1.0 if intervention is None else (~intervention.targets[n]).astype(a.dtype)
    return keep * a


def _divergences_all_candidates(
    posterior, draws, interventions, chunk, divergence_of_node
) -> tuple[Float[Array, "candidates _sets"], ...]:
    """$a_n(P')$ for every candidate and node, skipping the work for candidates that clamp
    node $n$ (their $a_n$ is 0): per node the candidates are ordered not-clamping first and
    mapped over in chunks of `chunk`, and a chunk of clamping candidates only is skipped by
    `lax.cond`. For the paper's space a node is clamped by 2/3 of the candidates, so this saves
    up to 2/3 of the master-equation solves. (Under `vmap` over histories the candidates are
    shared, the predicate stays unbatched and the skip is kept.)"""
    num_candidates = interventions.targets.shape[0]
    num_chunks = -(-num_candidates // chunk)
    pad = num_chunks * chunk - num_candidates
    out = []
    for n in range(len(draws.models)):
        n_sets = posterior.parent_sets[n].shape[0]
        clamps = interventions.targets[:, n]
        order = jnp.argsort(clamps, stable=True)  # candidates that leave n free come first
        order = jnp.concatenate([order, jnp.full((pad,), order[-1])]).reshape(num_chunks, chunk)
        free = ~clamps[order]  # (chunks, chunk)

        def run_chunk(xs, n=n, n_sets=n_sets):
            idx, free_c = xs
            ivs = jax.tree_util.tree_map(lambda a: a[idx], interventions)

            def compute(ivs):
                return jax.vmap(lambda iv: divergence_of_node(n, iv))(ivs)

            def skip(ivs):
                dtype = posterior.statistics.dwell_times[n].dtype
                return jnp.zeros((chunk, n_sets), dtype)

            return jax.lax.cond(free_c.any(), compute, skip, ivs)

        per_chunk = jax.lax.map(run_chunk, (order, free))  # (chunks, chunk, sets)
        flat_order = order.reshape(-1)[:num_candidates]
        a = (
            jnp.zeros((num_candidates, n_sets), per_chunk.dtype)
            .at[flat_order]
            .set(per_chunk.reshape(-1, n_sets)[:num_candidates])
        )
        out.append(a)
    return tuple(out)


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
    [`jaxctbn.structure_vbhc_minimum`][] at convergence."""
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
    solver: AbstractMasterEquationSolver,
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
    return _divergences_all_candidates(posterior, draws, candidates, chunk, divergence_of_node)


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
    overestimates (by ~2.4x in the example of maths §6)."""
    cards = posterior.cardinalities
    total = jnp.asarray(0.0)
    for n, models in enumerate(draws.models):
        sets = posterior.parent_sets[n]
        n_sets, n_samples = sets.shape[0], jax.tree_util.tree_leaves(models)[0].shape[1]
        flat = jax.tree_util.tree_map(lambda a: a.reshape(n_sets * n_samples, *a.shape[2:]), models)
        M_bar = posterior.statistics.transitions[n]
        T_bar = posterior.statistics.dwell_times[n]
        configs = M_bar.shape[1]
        U = num_configurations(sets, cards)
        prior_n = posterior.log_prior[n]
        old = posterior.log_posterior()[n]
        keys = jr.split(jr.fold_in(path_key, n), (n_sets * n_samples, num_paths))
        true_index = jnp.repeat(jnp.arange(n_sets), n_samples)

        def gain(
            model,
            ks,
            P,
            n=n,
            sets=sets,
            M_bar=M_bar,
            T_bar=T_bar,
            configs=configs,
            U=U,
            prior_n=prior_n,
            old=old,
        ):
            def one_path(k):
                M, T = _sampled_node_statistics(
                    model,
                    k,
                    n,
                    sets,
                    configs,
                    cards,
                    initial_state,
                    horizon,
                    intervention,
                    max_events,
                )

                def score(Mh, Th, Mb, Tb, u):
                    return posterior.prior.log_marginal_likelihood(n, Mb + Mh, Tb + Th, u)

                new = jax.nn.log_softmax(prior_n + jax.vmap(score)(M, T, M_bar, T_bar, U))
                return new[P] - old[P]

            return jax.vmap(one_path)(ks).mean()

        gains = jax.vmap(gain)(flat, keys, true_index).reshape(n_sets, n_samples).mean(1)
        keep = 1.0 if intervention is None else (~intervention.targets[n]).astype(gains.dtype)
        total = total + keep * (jnp.exp(old) * gains).sum()
    return total
