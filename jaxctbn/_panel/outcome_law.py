r"""The law of a **panel outcome**: an experiment started in a known state at time 0 whose
global state is seen only at $0<t_1<\dots<t_K$.

The outcome $Y=(S(t_1),\dots,S(t_K))$ is a Markov chain with the transition matrices
$P_k=e^{(t_k-t_{k-1})W}$ ($t_0=0$) of the (intervened) generator $W$, so for two CTBNs $\Lambda$
and $\Lambda'$ under the same intervention, by the chain rule of the KL divergence,

$$\mathrm{KL}\big(p(Y\mid\Lambda)\,\|\,p(Y\mid\Lambda')\big)=\sum_{k=1}^K\sum_s
p_{t_{k-1}}(s\mid\Lambda)\,\mathrm{KL}\big(P_k(s,\cdot)\,\|\,P'_k(s,\cdot)\big),\qquad
p_{t_k}=p_{t_{k-1}}P_k .$$

Exact, with $K$ dense exponentials per model: the state space is bounded as for
[`jaxctbn.MatrixExponential`][] (beyond it, a clear error). By the data-processing inequality it
never exceeds the KL between the path measures over $[0,t_K]$ (maths §2), and adding an
observation time never lowers it (tested). The same matrices give the log-likelihood of an outcome,
$\sum_k\ln P_k(y_{k-1},y_k)$, and its exact sampler.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from .._errors import error_if
from .._master_equation import (
    MatrixExponential,
    checked_node_states,
    gap_transition_matrices,
    prepare_experiment,
)
from .._model.ctbn import AbstractCTBN
from .._model.interventions import Intervention
from .._model.layout import global_state_index
from .observations import Emissions


def checked_observation_times(times: ArrayLike, dtype, horizon: ArrayLike | None = None) -> Array:
    """Observation times `(K,)` as an array of `dtype`: the shape checked now (one axis, at
    least one time), the values inside jit (`eqx.error_if` on the result): finite, $>0$,
    strictly increasing, and $\\le$ `horizon` when given."""
    times = jnp.asarray(times)
    if times.ndim != 1 or times.shape[0] < 1:
        raise ValueError(
            f"times: expected one or more observation times, shape (K,), got {times.shape}."
        )
    times = times.astype(dtype)
    bad = jnp.any(~jnp.isfinite(times)) | jnp.any(times <= 0) | jnp.any(jnp.diff(times) <= 0)
    message = "times: observation times must be finite, > 0 and strictly increasing"
    if horizon is not None:
        bad = bad | jnp.any(times > jnp.asarray(horizon, dtype) * (1 + 1e-12))
        message += ", and at most the horizon"
    return error_if(times, bad, message + ".")


class PanelLaw(eqx.Module):
    r"""The law of a panel outcome of one model: `transitions` $P_k$ `(K, S, S)` between visits
    ($t_0=0$) and `visit_marginals` $p_{t_{k-1}}$ `(K, S)`, the law of the state at the visit
    before each ($p_{t_0}$ the initial distribution)."""

    transitions: Float[Array, "visits global_states global_states"]
    visit_marginals: Float[Array, "visits global_states"]


#: Gaps within this relative distance of the first share its exponential (to first order).
EQUAL_GAPS_RTOL = 1e-9


def _gap_transition_matrices(W: Array, gaps: Array) -> Array:
    r"""$P_k=e^{h_kW}$ for the gaps $h_k$ `(K,)`. When the gaps are equal (equally spaced
    visits, the common case; to `EQUAL_GAPS_RTOL`) one exponential serves them all:
    $P_k=P_1+(h_k-h_1)WP_1$, the same values (the correction is of the order of the rounding)
    and the same first derivatives in every gap. The test runs on the values (`lax.cond`): a
    real branch when the times are shared by a batch (the candidates and draws of a design
    step), both branches under `vmap` over the times themselves."""
    equal = jnp.all(jnp.abs(gaps - gaps[0]) <= EQUAL_GAPS_RTOL * jnp.abs(gaps[0]))

    def shared(gaps):
        P1 = gap_transition_matrices(W, gaps[:1])[0]
        return P1[None] + (gaps - gaps[0])[:, None, None] * (W @ P1)[None]

    def separate(gaps):
        return gap_transition_matrices(W, gaps)

    return jax.lax.cond(equal, shared, separate, gaps)


def check_panel_state_space(cardinalities) -> None:
    """A one-line `ValueError` before anything is allocated when the global state space is
    larger than the dense exponentials of a panel law handle (those of
    [`jaxctbn.MatrixExponential`][])."""
    states = math.prod(int(k) for k in cardinalities)
    limit = MatrixExponential.state_space_limit
    if states > limit:
        raise ValueError(
            f"outcome: the law of a panel outcome needs dense exponentials over the {states:,} "
            f"global states of these {len(cardinalities)} nodes, more than the {limit:,} it "
            "handles; score such networks with CompletePath() (its criteria switch to the "
            "mean-field solver) or a smaller network."
        )


def panel_law(
    model: AbstractCTBN,
    initial_state: ArrayLike,
    times: ArrayLike,
    intervention: Intervention | None = None,
) -> PanelLaw:
    """The [`PanelLaw`][jaxctbn._panel.outcome_law.PanelLaw] of `model` started in
    `initial_state` (node states or a distribution) and seen at `times` under `intervention`
    (the state space bounded as for `MatrixExponential`; times checked inside jit)."""
    check_panel_state_space(model.cardinalities)
    model, gen, p0 = prepare_experiment(model, initial_state, intervention)
    W = gen.dense()
    times = checked_observation_times(times, W.dtype)
    gaps = jnp.diff(times, prepend=jnp.zeros((1,), W.dtype))
    P = _gap_transition_matrices(W, gaps)

    def step(p, P_k):
        return p @ P_k, p

    _, before = jax.lax.scan(step, p0, P)
    return PanelLaw(transitions=P, visit_marginals=before)


def pairwise_panel_law_kl(laws: PanelLaw, others: PanelLaw) -> Float[Array, "draws other_draws"]:
    r"""The panel KL of every pair of a batch of laws `(A,)` and another `(B,)`, `(A, B)`, by one
    matrix product: with $J_a(k,x,y)=p^a_{t_{k-1}}(x)P^a_k(x,y)$, the chain rule gives
    $\mathrm{KL}_{ab}=\sum J_a\ln P^a-\sum J_a\ln P^b$, the logarithms taken once per law
    (tested pair by pair against enumeration). Raises inside jit when a pair is not finite (law
    $b$ gives probability 0 to a transition law $a$ can make)."""
    joint = laws.visit_marginals[..., :, None] * laws.transitions  # (A, K, S, S)
    A, B = joint.shape[0], others.transitions.shape[0]
    joint = joint.reshape(A, -1)
    own = laws.transitions.reshape(A, -1)
    other = others.transitions.reshape(B, -1)
    log_own = jnp.log(jnp.where(own > 0, own, 1))
    log_other = jnp.log(jnp.where(other > 0, other, 1))
    self_term = jnp.sum(joint * log_own, axis=-1)
    kl = jnp.maximum(self_term[:, None] - joint @ log_other.T, 0)  # rounding can leave -1e-17
    # a transition that law a makes (joint > 0) and law b cannot (P = 0): an infinite KL
    impossible = (joint > 0).astype(joint.dtype) @ (other <= 0).astype(joint.dtype).T
    return error_if(
        kl,
        jnp.any(impossible > 0) | ~jnp.all(jnp.isfinite(kl)),
        "panel KL divergence: not finite: the second model gives probability 0 to an outcome "
        "that the first can produce (a structural zero or a perfect intervention that differ, "
        "or an underflow of a transition probability).",
    )


def panel_kl_divergence(
    model: AbstractCTBN,
    other: AbstractCTBN,
    initial_state: ArrayLike,
    times: ArrayLike,
    *,
    intervention: Intervention | None = None,
) -> Float[Array, ""]:
    r"""$\mathrm{KL}(p(Y\mid\Lambda,i)\,\|\,p(Y\mid\Lambda',i))$ between the laws of the panel
    outcome $Y=(S(t_1),\dots,S(t_K))$ of two CTBNs (any graphs over the same nodes) started in
    `initial_state` under `intervention` (see the module page): exact, from $K$ dense
    exponentials of each generator.

    **Arguments:** `model`, `other` (`CTBN` or `PaddedCTBN`); `initial_state` (node states
    `(N,)`, or a distribution over the global states); `times` `(K,)`, finite, $>0$ and strictly
    increasing (checked inside jit); `intervention` (keyword-only) applied to both models.

    Differentiable with respect to both models' rates and to the times (reverse mode), pure,
    and works under `jit` and `vmap`. Raises (inside jit) when the divergence is not finite:
    `other` gives probability 0 to an outcome `model` can produce (a structural zero, or an
    exponential that underflows)."""
    one = lambda law: jax.tree_util.tree_map(lambda x: x[None], law)  # noqa: E731
    law = panel_law(model, initial_state, times, intervention)
    other_law = panel_law(other, initial_state, times, intervention)
    return pairwise_panel_law_kl(one(law), one(other_law))[0, 0]


def global_emission_matrix(
    emissions: Emissions, model: AbstractCTBN, dtype
) -> Float[Array, "global_states symbols"]:
    r"""$E(s,y)=\prod_nE_n(s_n,y_n)$ `(S, M)` over the global states and the global symbols
    (both row-major over the nodes, the last node fastest) of the per-node matrices of
    `emissions` (value-checked inside jit); a node measured without error has the identity, an
    unmeasured node a single column of ones."""
    matrices = emissions.checked(model, dtype)
    out = matrices[0]
    for m in matrices[1:]:
        out = jnp.kron(out, m)
    return out


def sample_law_outcome(law: PanelLaw, key: PRNGKeyArray, emission: Array | None = None):
    """One outcome of a panel law whose start is a known state (a point mass). Without
    `emission`: `(before, after)`, the global states before and after each visit's transition
    `(K,)` each (`after` is the outcome). With a [`global_emission_matrix`][jaxctbn._panel.outcome_law.global_emission_matrix]
    `(S, M)`: the global symbols recorded at the visits `(K,)`, each drawn from its state's
    row."""
    K = law.transitions.shape[0]
    s0 = jnp.argmax(law.visit_marginals[0])
    key_states, key_symbols = (key, None) if emission is None else jr.split(key)

    def step(s, inputs):
        P_k, k = inputs
        nxt = jr.categorical(k, jnp.log(P_k[s]))
        return nxt, (s, nxt)

    _, (before, after) = jax.lax.scan(step, s0, (law.transitions, jr.split(key_states, K)))
    if emission is None or key_symbols is None:
        return before, after
    return jax.vmap(lambda k, s: jr.categorical(k, jnp.log(emission[s])))(
        jr.split(key_symbols, K), after
    )


def law_log_likelihood(law: PanelLaw, outcome, emission: Array | None = None) -> Float[Array, ""]:
    r"""The log-likelihood of an `outcome` of [`sample_law_outcome`][jaxctbn._panel.outcome_law.sample_law_outcome]
    under `law`: $\sum_k\ln P_k(x_{k-1},x_k)$ of the transitions `(before, after)`; with an
    `emission` matrix, of the symbols $y_{1:K}$ by the forward filter
    $\alpha_k=(\alpha_{k-1}P_k)\odot E(\cdot,y_k)$, $\ln p(y)=\sum_k\ln\sum_s\alpha_k(s)$
    ($\alpha$ renormalised at each visit)."""
    if emission is None:
        before, after = outcome
        K = law.transitions.shape[0]
        return jnp.log(law.transitions[jnp.arange(K), before, after]).sum()

    def step(alpha, inputs):
        P_k, y = inputs
        alpha = (alpha @ P_k) * emission[:, y]
        c = alpha.sum()
        return alpha / c, jnp.log(c)

    _, logs = jax.lax.scan(step, law.visit_marginals[0], (law.transitions, outcome))
    return logs.sum()


def sample_panel_outcome(
    model: AbstractCTBN,
    initial_state: ArrayLike,
    times: ArrayLike,
    *,
    key: PRNGKeyArray,
    intervention: Intervention | None = None,
) -> Int[Array, " visits"]:
    r"""One panel outcome: the global state (row-major index over the nodes' states, the last
    node fastest) at each of the `times`, drawn exactly from the
    Markov chain of the transition matrices $P_k$ (an initial distribution is sampled first)."""
    law = panel_law(model, initial_state, times, intervention)
    P = law.transitions
    key0, key = jr.split(key)
    s0 = jr.categorical(key0, jnp.log(law.visit_marginals[0]))

    def step(s, inputs):
        P_k, k = inputs
        s = jr.categorical(k, jnp.log(P_k[s]))
        return s, s

    _, states = jax.lax.scan(step, s0, (P, jr.split(key, P.shape[0])))
    return states


def panel_outcome_log_likelihood(
    model: AbstractCTBN,
    initial_state: Int[ArrayLike, " nodes"],
    times: ArrayLike,
    outcome: Int[ArrayLike, " visits"],
    *,
    intervention: Intervention | None = None,
) -> Float[Array, ""]:
    r"""$\ln p(Y\mid\Lambda,i)=\sum_k\ln P_k(y_{k-1},y_k)$ of a panel outcome (global state
    indices `(K,)`) of an experiment started in the known node states `initial_state`
    ($y_0$); $-\infty$ for an impossible outcome."""
    initial_state = jnp.asarray(initial_state)
    if not jnp.issubdtype(initial_state.dtype, jnp.integer):
        raise ValueError(
            "initial_state: the likelihood of an outcome needs the known node states (integers)."
        )
    P = panel_law(model, initial_state, times, intervention).transitions
    s0 = global_state_index(
        checked_node_states(model, initial_state, intervention and intervention.checked(model)),
        model.cardinalities,
    )
    outcome = jnp.asarray(outcome)
    previous = jnp.concatenate([jnp.asarray(s0)[None], outcome[:-1]])
    return jnp.log(P[jnp.arange(P.shape[0]), previous, outcome]).sum()
