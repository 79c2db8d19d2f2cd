r"""Structure design criteria when the next experiment's outcome is a **panel** (maths §7): the
global state seen at $0<t_1<\dots<t_K\le\tau$.

With complete paths the predictive law $p(S\mid G,\mathcal H)$ of a graph (rates integrated out)
factorises over the nodes, and so do the structure (V)BHC's divergences. A panel's law
$p(Y\mid G,\mathcal H)=\int p(Y\mid G,\Lambda)\,p(\Lambda\mid G,\mathcal H)\,d\Lambda$ neither
factorises nor has a closed form. The criteria here bound it through a **coupling** of the rates:
for graphs $G$, $G'$, any joint law $\pi$ of $\Lambda\sim p(\cdot\mid G,\mathcal H)$ and
$\Lambda'\sim p(\cdot\mid G',\mathcal H)$ gives, by the joint convexity of the KL divergence,

$$\mathrm{KL}\big(p(Y\mid G,\mathcal H)\,\|\,p(Y\mid G',\mathcal H)\big)\le
\mathsf E_\pi\,\mathrm{KL}\big(p(Y\mid G,\Lambda)\,\|\,p(Y\mid G',\Lambda')\big)
=: D(G,G').$$

The coupling used draws both with the same random numbers node by node: a node whose parent set
is the same in $G$ and $G'$ gets the *same* rates (its rate posterior depends only on its own
set), so $D(G,G)=0$ and only the nodes whose parents differ contribute rate noise. With $N_S$
draws $(G_s,\Lambda_s)$ of the posterior and $N_S$ independent alternative graphs $G'_t$ (both
systematic over each node's sets), and $\Lambda'_{st}$ the rates of $G'_t$ drawn with
$\Lambda_s$'s keys, $D_{st}=\mathrm{KL}(p(Y\mid G_s,\Lambda_s)\|p(Y\mid G'_t,\Lambda'_{st}))$
(exact panel KLs) and

$$\widehat{\mathrm{BHC}}=\frac1{N_S^2}\sum_{s,t}D_{st},\qquad
\widehat{\min_q\mathrm{VBHC}}=-\ln\frac1{N_S}\sum_t e^{-\bar D_t},\quad
\bar D_t=\frac1{N_S}\sum_sD_{st},$$

the variational $q$ ranging over the drawn alternative graphs (closed form, as for complete paths,
§4). Both bound the structure EIG $I(G;Y)$ from above: $I(G;Y)\le\mathsf E_G[-\ln\mathsf E_{G'}
e^{-\mathrm{KL}(G\|G')}]\le-\ln\mathsf E_{G'}e^{-\mathsf E_G\mathrm{KL}(G\|G')}\le\mathsf
E_{G,G'}\mathrm{KL}(G\|G')$, each step monotone in the divergences, so $D\ge\mathrm{KL}$ keeps the
order ([`jaxctbn.RateCoupling`][]). The bound is loose (the rate noise of the nodes whose parents
differ); the default [`jaxctbn.PlugIn`][] instead compares each drawn graph at its
posterior-mean rates, $D_{st}=\mathrm{KL}(p(Y\mid G_s,\bar\Lambda_{G_s})\|p(Y\mid G'_t,
\bar\Lambda_{G'_t}))$: no longer a bound, but it ranks the candidates better (maths §7). The EIG
itself is estimated by nested Monte Carlo with exact panel likelihoods:
$p(Y\mid G_s,\mathcal H)$ by $J$ rate draws given $G_s$, $p(Y\mid\mathcal H)$ by $J$ joint draws.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from .._learning.structure_posterior import StructurePosterior
from .._model.ctbn import PaddedCTBN
from .._model.interventions import Intervention
from .._panel.outcome_law import law_log_likelihood, pairwise_panel_law_kl, sample_law_outcome
from .panel_parameter import draw_laws


class PanelStructureDraws(eqx.Module):
    r"""The draws of the panel structure (V)BHC (module page): `models`, $N_S$ draws
    $(G_s,\Lambda_s)$ (a [`jaxctbn.PaddedCTBN`][] batch `(S,)`); `alternatives`, the coupled
    $(G'_t,\Lambda'_{st})$ `(S, T)`, or with `coupled=False` the alternative graphs at their
    posterior-mean rates `(T,)` (and `models` at theirs); the graphs' parent-set indices
    `indices` `(S, N)` and `alternative_indices` `(T, N)`."""

    models: PaddedCTBN
    alternatives: PaddedCTBN
    indices: Int[Array, "samples nodes"]
    alternative_indices: Int[Array, "alternatives nodes"]
    coupled: bool = eqx.field(static=True)


def _graphs(posterior: StructurePosterior, key: PRNGKeyArray, num: int, systematic: bool):
    if systematic:
        return posterior.systematic_parent_sets(key, num)
    return jax.vmap(posterior.sample_parent_sets)(jr.split(key, num))


def panel_structure_draws(
    posterior: StructurePosterior,
    key: PRNGKeyArray,
    num_samples: int,
    *,
    coupled: bool,
    systematic: bool = True,
) -> PanelStructureDraws:
    """`num_samples` posterior draws of the graph, `num_samples` alternative graphs, and their
    rates: with `coupled=True` rates drawn from the posterior, the alternatives' coupled to each
    draw (the bound of the module page); with `False` every graph at its posterior-mean rates
    (the plug-in). Independent of the candidate, so every candidate sees the same draws
    (common random numbers)."""
    k_graphs, k_alternatives, k_rates = jr.split(key, 3)
    indices = _graphs(posterior, k_graphs, num_samples, systematic)
    alternative_indices = _graphs(posterior, k_alternatives, num_samples, systematic)
    if not coupled:
        return PanelStructureDraws(
            models=jax.vmap(posterior.mean_rates_given)(indices),
            alternatives=jax.vmap(posterior.mean_rates_given)(alternative_indices),
            indices=indices,
            alternative_indices=alternative_indices,
            coupled=False,
        )
    rate_keys = jr.split(k_rates, num_samples)
    models = jax.vmap(posterior.rates_given)(indices, rate_keys)
    alternatives = jax.vmap(
        lambda k: jax.vmap(lambda idx: posterior.rates_given(idx, k))(alternative_indices)
    )(rate_keys)
    return PanelStructureDraws(
        models=models,
        alternatives=alternatives,
        indices=indices,
        alternative_indices=alternative_indices,
        coupled=True,
    )


def panel_structure_divergences(
    draws: PanelStructureDraws,
    initial_state: ArrayLike,
    times: Array,
    intervention: Intervention | None,
) -> Float[Array, "samples alternatives"]:
    r"""$D_{st}$ `(S, T)`: the exact panel KL of each draw against each alternative (its
    coupled one, or the plug-in's shared ones) under one experiment; differentiable in the
    times."""
    laws = draw_laws(draws.models, initial_state, times, intervention)
    if not draws.coupled:
        return pairwise_panel_law_kl(
            laws, draw_laws(draws.alternatives, initial_state, times, intervention)
        )
    alternatives = jax.vmap(lambda m: draw_laws(m, initial_state, times, intervention))(
        draws.alternatives
    )

    def row(law, others):
        one = jax.tree_util.tree_map(lambda x: x[None], law)
        return pairwise_panel_law_kl(one, others)[0]

    return jax.vmap(row)(laws, alternatives)


def panel_structure_bhc(divergences: Array) -> Float[Array, ""]:
    r"""$\widehat{\mathrm{BHC}}=\frac1{N_S^2}\sum_{s,t}D_{st}$ (module page)."""
    return divergences.mean()


def panel_structure_vbhc_minimum(divergences: Array) -> Float[Array, ""]:
    r"""$-\ln\frac1T\sum_te^{-\bar D_t}$, $\bar D_t$ the mean over the draws (module page):
    the VBHC minimised in closed form over $q$ on the alternative graphs; never above the
    BHC of the same draws (Jensen)."""
    mean = divergences.mean(0)
    return -(jax.nn.logsumexp(-mean) - jnp.log(mean.shape[0]))


class PanelStructureEIGDraws(eqx.Module):
    r"""The draws of the nested Monte Carlo structure EIG: `models`, the outer $(G_s,\Lambda_s)$
    `(S,)`; `same_graph`, $J$ rate draws given each $G_s$ `(S, J)`; `inner`, $J$ joint draws
    $(G_j,\Lambda_j)$ `(J,)`."""

    models: PaddedCTBN
    same_graph: PaddedCTBN
    inner: PaddedCTBN


def panel_structure_eig_draws(
    posterior: StructurePosterior, key: PRNGKeyArray, num_samples: int, num_inner: int
) -> PanelStructureEIGDraws:
    """The outer and inner draws of `panel_structure_eig`
    (systematic graphs; the inner rates given $G_s$ drawn with the joint inner draws' keys)."""
    k_outer, k_inner, k_outer_rates, k_inner_rates = jr.split(key, 4)
    indices = posterior.systematic_parent_sets(k_outer, num_samples)
    models = jax.vmap(posterior.rates_given)(indices, jr.split(k_outer_rates, num_samples))
    inner_indices = posterior.systematic_parent_sets(k_inner, num_inner)
    inner_keys = jr.split(k_inner_rates, num_inner)
    inner = jax.vmap(posterior.rates_given)(inner_indices, inner_keys)
    same_graph = jax.vmap(
        lambda idx: jax.vmap(lambda k: posterior.rates_given(idx, k))(inner_keys)
    )(indices)
    return PanelStructureEIGDraws(models=models, same_graph=same_graph, inner=inner)


def panel_structure_eig(
    draws: PanelStructureEIGDraws,
    initial_state: ArrayLike,
    times: Array,
    intervention: Intervention | None,
    *,
    key: PRNGKeyArray,
    num_paths: int,
    emission: Array | None = None,
) -> Float[Array, ""]:
    r"""The structure EIG $I(G;Y)$ of a panel outcome by nested Monte Carlo:
    $\frac1{N_SR}\sum_{s,r}\big[\ln\frac1J\sum_jp(Y_{sr}\mid G_s,\Lambda^{(s)}_j)-
    \ln\frac1J\sum_jp(Y_{sr}\mid G_j,\Lambda_j)\big]$, with $R$ = `num_paths` outcomes of each
    outer draw, every likelihood exact (forward filter); consistent as $J\to\infty$. With an
    `emission` matrix the outcome is the recorded symbols, as in
    `panel_parameter_eig`."""
    laws = draw_laws(draws.models, initial_state, times, intervention)
    inner = draw_laws(draws.inner, initial_state, times, intervention)
    same = jax.vmap(lambda m: draw_laws(m, initial_state, times, intervention))(draws.same_graph)
    S = laws.transitions.shape[0]
    keys = jr.split(key, (S, num_paths))

    def log_mean(laws_j, outcome):
        lls = jax.vmap(lambda law: law_log_likelihood(law, outcome, emission))(laws_j)
        return jax.nn.logsumexp(lls) - jnp.log(lls.shape[0])

    def gain(law, same_s, k):
        outcome = sample_law_outcome(law, k, emission)
        return log_mean(same_s, outcome) - log_mean(inner, outcome)

    gains = jax.vmap(lambda law, same_s, ks: jax.vmap(lambda k: gain(law, same_s, k))(ks))(
        laws, same, keys
    )
    return gains.mean()
