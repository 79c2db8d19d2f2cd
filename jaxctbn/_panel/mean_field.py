r"""Mean-field inference under panel evidence (Cohn, El-Hay, Friedman and Kupferman, 2010).

The posterior law of the paths given the observations $Y$ is approximated by a product of
independent node processes, $Q=\prod_n Q_n$, each $Q_n$ a Markov chain with time-varying rates,
chosen to maximise the evidence lower bound

$$\mathcal F(Q)=\mathsf E_Q\big[\ln p(X, Y)\big]+H(Q)\;\le\;\ln p(Y)$$

one node at a time (coordinate ascent, so $\mathcal F$ never falls). Given the other nodes'
marginals, node $n$'s optimal process is the posterior of a single chain with the
"effective" matrix

$$A_n(t)=\operatorname{diag}\big(\bar q_n(x,x;t)+\psi_n(x;t)\big)+\tilde q_n(x,y;t),\qquad
\tilde q_n(x,y;t)=\exp\mathsf E_{\mu_{\mathrm{pa}(n)}}[\ln\Lambda_n(x,y\mid u)],$$

$\bar q_n(x,x;t)=\mathsf E[\Lambda_n(x,x\mid u)]$ (parents under their marginals), and $\psi_n$
collecting what $n$'s state does to its children's terms,

$$\psi_n(x;t)=\sum_{c:\,n\in\mathrm{pa}(c)}\sum_{x_c}\Big(\mu_c(x_c)\,
\mathsf E[\Lambda_c(x_c,x_c\mid u_c)\mid x_n=x]+\sum_{y_c\ne x_c}\gamma_c(x_c,y_c)\,
\mathsf E[\ln\Lambda_c(x_c,y_c\mid u_c)\mid x_n=x]\Big),$$

($\mu_c$ the child's marginal, $\gamma_c$ its expected transition rates, the expectation over
the child's other parents). The chain's posterior is a forward-backward pass: backwards
$\rho_n(t)=e^{A_n(s-t)}\rho_n(s)$, multiplied by the indicator of the observed state at every
observation; then forwards the Doob transform, rates $\tilde q_n(x,y)\rho_n(y)/\rho_n(x)$.

**Discretisation.** Each gap between observations is cut into `steps_per_gap` equal steps on
which the other nodes enter through their step averages (their dwell time in the step divided
by its length), so $A_n$ is constant on a step; within a step node $n$'s chain is solved
exactly (matrix exponentials, the dwell times and jump counts by the Van Loan block
integral). The bound $\mathcal F$ is that of this discretised problem (the couplings on a
step use the step averages); with no edges nothing is discretised and the statistics and the
bound are the exact forward-backward's. Its cost grows with the number of nodes and steps,
not with $\prod_n k_n$.

The expected statistics of node $n$ on any parent set $P$ are, as for the evidence-free
[`jaxctbn.MeanField`][], the product-law projections, here summed over the steps:
$\mathsf E[\hat T_n(x,u)]\approx\sum_s T_n(x;s)\prod_{p\in P}\bar\mu_p(u_p;s)$ and
$\mathsf E[\hat M_n(x,x',u)]\approx\sum_s M_n(x,x';s)\prod_{p\in P}\bar\mu_p(u_p;s)$.
"""

from __future__ import annotations

from typing import cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._errors import error_if
from .._master_equation import (
    expm,
    expm_batched,
    node_tables,
)
from .._model.ctbn import AbstractCTBN
from .buckets import as_flat_buckets
from .e_step import AbstractPanelEStep
from .mean_field_statistics import PanelMeanFieldStatistics
from .observations import PanelObservations, per_trajectory_tables, require_batch
from .panel_families import project_families
from .structural_em import PanelStructureFit, StructuralEMProblem, iterate_to_fixed_point


class PanelMeanField(AbstractPanelEStep):
    r"""Mean-field inference under panel evidence (module docstring): the choice passed to
    `panel_mean_field_statistics` and, as `e_step=`, to
    [`jaxctbn.panel.learn_structure_from_panels`][].

    **Arguments (keyword-only):**

    - `steps_per_gap`: steps each gap between observations is cut into (the couplings between
      nodes are constant on a step; default 8).
    - `max_sweeps`: the most sweeps over the nodes (default 100).
    - `tolerance`: stop when a sweep raises the bound by at most `tolerance` $\times(1+|\mathcal
      F|)$ (default 1e-8).
    """

    steps_per_gap: int = eqx.field(default=8, static=True, kw_only=True)
    max_sweeps: int = eqx.field(default=100, kw_only=True)
    tolerance: float = eqx.field(default=1e-8, kw_only=True)

    def __check_init__(self):
        # (the sweeps and the tolerance are data: changing them does not compile again)
        for name in ("steps_per_gap", "max_sweeps"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"PanelMeanField: {name} must be an integer >= 1, got {value!r}.")
        if not (isinstance(self.tolerance, (int, float)) and self.tolerance >= 0):
            raise ValueError(
                f"PanelMeanField: tolerance must be a number >= 0, got {self.tolerance!r}."
            )

    def structural_em(self, problem: StructuralEMProblem) -> PanelStructureFit:
        """Structural EM with mean-field E-steps; each bucket's sweeps start from its last
        E-step's fit (one program for all E-steps)."""
        buckets = as_flat_buckets(problem.observations)
        approximation = as_data(self)  # the sweeps and tolerance as data
        starts = [as_start(problem.model, b, approximation, None) for b in buckets]

        def e_step(model, starts):
            bound = children_bound(model)  # (static: a power of two, one program mostly)
            parts = [
                _structure_e_step(model, b, approximation, problem.parent_sets, start, bound)
                for b, start in zip(buckets, starts)
            ]
            family = parts[0][0]
            for part in parts[1:]:
                family = family + part[0]
            evidence_lower_bound = sum(float(part[1]) for part in parts)
            return family, evidence_lower_bound, [(*part[3], jnp.asarray(True)) for part in parts]

        return iterate_to_fixed_point(problem, e_step, starts, bound=True)


# --------------------------------------------------------------------------- one trajectory
def _van_loan(A: Array, left: Array, right: Array, dt: Array) -> Array:
    r"""$\int_0^{dt}(\mathrm{left}^\top e^{A\tau})_x\,(e^{A(dt-\tau)}\mathrm{right})_y\,d\tau$
    `(k, k)`: the upper-right block of $\exp\big([[A^\top,\ \mathrm{left}\,
    \mathrm{right}^\top],[0,\ A^\top]]\,dt\big)$."""
    k = A.shape[-1]
    top = jnp.concatenate([A.T, jnp.outer(left, right)], axis=1)
    bottom = jnp.concatenate([jnp.zeros_like(A), A.T], axis=1)
    return expm(jnp.concatenate([top, bottom], axis=0) * dt)[:k, k:]


class NodeProcesses(eqx.Module):
    r"""The fitted product law $Q=\prod_n Q_n$ of one trajectory, each node's process the
    posterior of a chain whose matrix is constant on each step (the proposal of importance
    sampling), for every node `(N, ...)`:

    - `matrices`: $A_n$ on each step `(N, S, K, K)` (off-diagonal: the rates $\tilde q_n$;
      diagonal: $\bar q_n(x,x)+\psi_n(x)$); `exponentials`: $e^{A_n\Delta_s}$ `(N, S, K, K)`;
    - `ends`: the backward vector $\rho_n$ at each step's end, times the indicator of the
      states an observation there allows, `(N, S, K)` (scaled per step);
    - `first`: the law of $x_n(0)$ under $Q_n$ `(N, K)`;
    - `log_normalisers`: $\ln Z_n$ `(N,)`, $Z_n=\sum p_{0,n}(x_n(0))\,e^{\int A_n(x_n,x_n)}
      \prod_{\mathrm{jumps}}A_n(x^-,x^+)$ over the node's paths that meet its observations;
    - `steps`: the step lengths $\Delta_s$ `(S,)`.

    $Q_n$ has the density $p_{0,n}(x(0))\,e^{\int A_n(x,x)}\prod A_n(x^-,x^+)/Z_n$ on the
    paths that meet the observations."""

    matrices: Float[Array, "nodes steps kmax kmax"]
    exponentials: Float[Array, "nodes steps kmax kmax"]
    ends: Float[Array, "nodes steps kmax"]
    first: Float[Array, "nodes kmax"]
    log_normalisers: Float[Array, " nodes"]
    steps: Float[Array, " steps"]


def _trajectory(
    tables, times, states, num_observations, targets, clamps, initial, cards, approximation,
    max_children, processes=False,
):  # fmt: skip
    """Mean-field statistics of one trajectory: `(dwell, transitions, marginals, bound,
    sweeps, impossible)`, and with `processes` (static) the fitted `NodeProcesses`
    last; `initial`: `(dwell, transitions, given)`, the fit to start from where `given`;
    `max_children`: at least the most children a node has."""
    present, safe, digits, valid, off = tables  # (N,q) (N,q) (N,q,C) (N,C) (N,C,K,K)
    N, q, C = digits.shape
    K = off.shape[-1]
    G = approximation.steps_per_gap
    num_slots = times.shape[-1]
    dtype = off.dtype
    gaps = max(num_slots - 1, 1)
    S = gaps * G
    card = jnp.asarray(cards, jnp.int32)
    in_range = jnp.arange(K)[None, :] < card[:, None]  # (N, K)
    off_mask = in_range[:, :, None] & in_range[:, None, :] & ~jnp.eye(K, dtype=bool)  # (N,K,K)
    exits = off.sum(-1)  # (N, C, K)
    log_rates = jnp.where(off > 0, jnp.log(jnp.where(off > 0, off, 1.0)), 0.0)
    zero_rates = (off <= 0) & off_mask[:, None]  # (N, C, K, K)

    # evidence: which states each observation allows, and at which step ends it applies
    o = jnp.arange(num_slots)
    real = o < num_observations
    observed = (states[..., None] == jnp.arange(K)) | (states[..., None] < 0) | ~real[:, None, None]
    clamp_ok = ~targets[:, None] | (jnp.arange(K)[None, :] == clamps[:, None])  # (N, K)
    allowed = observed & in_range[None] & clamp_ok[None]  # (num_slots, N, K)
    impossible = jnp.any(~jnp.any(allowed, -1))
    allowed = allowed.astype(dtype)
    gap_dt = (
        jnp.where(o[1:] < num_observations, jnp.diff(times), 0.0) / G
        if num_slots > 1
        else (jnp.zeros((1,), dtype))
    )
    dt = jnp.repeat(gap_dt.astype(dtype), G)  # (S,)
    s = jnp.arange(S)
    boundary = (s + 1) % G == 0
    ev_end = jnp.where(
        boundary[:, None, None], allowed[jnp.minimum((s + 1) // G, num_slots - 1)], in_range[None]
    ).astype(dtype)  # (S, N, K)
    uniform = allowed / allowed.sum(-1, keepdims=True).clip(1e-300)  # (num_slots, N, K)
    p0 = uniform[0]

    def safe_div(a, b):
        return jnp.where(b > 0, a / jnp.where(b > 0, b, 1.0), 0.0)

    # start: each step at the mean of the allowed states at its gap's two ends
    gap = jnp.minimum(s // G, num_slots - 1)
    mbar0 = 0.5 * (uniform[gap] + uniform[jnp.minimum(gap + 1, num_slots - 1)])  # (S, N, K)
    start = (mbar0 * dt[:, None, None], jnp.zeros((S, N, K, K), dtype), jnp.zeros((N,), dtype))
    # or the given start (an earlier fit; `initial[2]` says whether there is one: data, so one
    # program serves both); the entropies are all set by the first sweep
    start = (
        jnp.where(initial[2], initial[0].astype(dtype), start[0]),
        jnp.where(initial[2], initial[1].astype(dtype), start[1]),
        start[2],
    )

    def averages(dwell, transitions):
        return safe_div(dwell, dt[:, None, None]), safe_div(transitions, dt[:, None, None, None])

    def picked_of(mbar, nodes):
        """The parents' marginals of `nodes` in each configuration `(S, len, q, C)`."""
        picked = mbar[:, safe[nodes][..., None], digits[nodes]]
        return jnp.where(present[nodes][None, :, :, None], picked, 1.0)

    def node_terms(weights):
        """`E[q(x,x|u)]` `(S, N, K)`, `E[ln q(x,y|u)]` and whether a zero rate has weight."""
        diag = -jnp.einsum("snc,ncx->snx", weights, exits)
        log_mean = jnp.einsum("snc,ncxy->snxy", weights, log_rates)
        has_zero = jnp.einsum("snc,ncxy->snxy", weights, zero_rates.astype(dtype)) > 0
        return diag, log_mean, has_zero

    # each node's children: `(N, M)` flat (child, slot) indices `c * q + j`, -1 = none
    flat_parent = jnp.where(present, safe, N).reshape(-1)
    order = jnp.argsort(flat_parent, stable=True)
    counts = jnp.bincount(flat_parent, length=N + 1)[:N]
    first = jnp.cumsum(counts) - counts
    m = jnp.arange(max_children)
    children = jnp.where(
        m[None] < counts[:, None], order[jnp.minimum(first[:, None] + m[None], N * q - 1)], -1
    )

    def process(n, state):
        """Node `n`'s optimal process given the other nodes in `state`: its matrix `A` `(S, K,
        K)`, the diagonal `diag + psi` `(S, K)`, the off-diagonal rates `tilde` and their
        logarithms `(S, K, K)`, the step exponentials, the backward vectors at each step's end
        and begin, `log Z` and the law of the first state."""
        dwell, transitions, _ = state
        mbar, gbar = averages(dwell, transitions)
        own = picked_of(mbar, n[None])[:, 0]  # (S, q, C)
        weights_n = jnp.prod(own, axis=1) * valid[n]  # (S, C): n's parents only
        diag_n = -jnp.einsum("sc,cx->sx", weights_n, exits[n])
        log_n = jnp.einsum("sc,cxy->sxy", weights_n, log_rates[n])
        zero_n = jnp.einsum("sc,cxy->sxy", weights_n, zero_rates[n].astype(dtype)) > 0
        tilde = jnp.where(off_mask[n] & ~zero_n, jnp.exp(log_n), 0.0)  # (S, K, K)
        # psi: what n's state does to its children's terms (child c with n in its slot j)
        idx = children[n]
        has = (idx >= 0).astype(dtype)
        c, j = jnp.maximum(idx, 0) // q, jnp.maximum(idx, 0) % q  # (M,)
        others = jnp.where(
            jnp.arange(q)[None, None, :, None] == j[None, :, None, None], 1.0, picked_of(mbar, c)
        ).prod(2)  # (S, M, C): the child's other slots' product
        h = -jnp.einsum("smx,mcx->smc", mbar[:, c], exits[c]) + jnp.einsum(
            "smxy,mcxy->smc", gbar[:, c], log_rates[c]
        )  # (S, M, C)
        onehot = (digits[c, j][..., None] == jnp.arange(K)).astype(dtype)  # (M, C, K)
        psi = jnp.einsum("smu,mux,m->sx", others * valid[c][None] * h, onehot, has)
        a_diag = jnp.where(in_range[n], diag_n + psi, 0.0)  # (S, K)
        A = jnp.where(jnp.eye(K, dtype=bool), a_diag[:, :, None], tilde)  # (S, K, K)
        E = expm_batched(A * dt[:, None, None])

        def backward(carry, x):
            rho, log_scale = carry
            E_s, ev = x
            end = rho * ev
            c = end.max()
            c = jnp.where(c > 0, c, 1.0)
            end = end / c
            begin = E_s @ end
            return (begin, log_scale + jnp.log(c)), (end, begin)

        (rho0, log_scale), (ends, begins) = jax.lax.scan(
            backward, (in_range[n].astype(dtype), jnp.zeros((), dtype)), (E, ev_end[:, n]),
            reverse=True,
        )  # fmt: skip
        rho0 = rho0 * allowed[0, n]
        Z = p0[n] @ rho0
        log_Z = jnp.log(jnp.where(Z > 0, Z, 0.0)) + log_scale
        mu0 = safe_div(p0[n] * rho0, Z)
        return A, a_diag, tilde, log_n, E, ends, begins, log_Z, mu0

    def update(n, state):
        dwell, transitions, entropy = state
        A, a_diag, tilde, log_n, E, ends, begins, log_Z, mu0 = process(n, state)

        def forward(mu, x):
            E_s, begin, end = x
            alpha = safe_div(mu, begin)
            nxt = (alpha @ E_s) * end
            return nxt / jnp.where(nxt.sum() > 0, nxt.sum(), 1.0), alpha

        _, alphas = jax.lax.scan(forward, mu0, (E, begins, ends))
        integral = jax.vmap(_van_loan)(A, alphas, ends, dt)  # (S, K, K)
        dwell_n = jnp.clip(jnp.diagonal(integral, axis1=-2, axis2=-1), 0.0)
        transitions_n = jnp.clip(tilde * integral, 0.0)
        # F = sum_n (energy_n + E ln p0_n + H(Q_n)); Q_n maximises E_Q[Phi_n] + H(Q_n) = log Z_n
        # with Phi_n = ln p0_n + the A-terms below, so E ln p0_n + H(Q_n) = log Z_n - A-terms
        a_terms = (dwell_n * a_diag).sum() + jnp.where(
            transitions_n > 0, transitions_n * log_n, 0.0
        ).sum()
        new_entropy = log_Z - a_terms
        keep = targets[n]
        dwell = dwell.at[:, n].set(jnp.where(keep, dwell[:, n], dwell_n))
        transitions = transitions.at[:, n].set(jnp.where(keep, transitions[:, n], transitions_n))
        entropy = entropy.at[n].set(jnp.where(keep, 0.0, new_entropy))
        return dwell, transitions, entropy

    def bound(state):
        dwell, transitions, entropy = state
        mbar, _ = averages(dwell, transitions)
        # every node's parents' product law `(S, N, C)`
        weights = jnp.prod(picked_of(mbar, jnp.arange(N)), axis=2) * valid[None]
        diag, log_mean, _ = node_terms(weights)
        energy = (dwell * diag).sum() + jnp.where(
            transitions > 0, transitions * log_mean, 0.0
        ).sum()
        return energy + entropy.sum()

    def sweep(state):
        return jax.lax.fori_loop(0, N, update, state)

    def not_done(carry):
        i, previous, current, _ = carry
        change = jnp.abs(current - previous)
        moving = (change > approximation.tolerance * (1.0 + jnp.abs(current))) & jnp.isfinite(
            current
        )
        return (i < approximation.max_sweeps) & ((i < 2) | moving)

    def body(carry):
        i, _, current, state = carry
        state = sweep(state)
        return i + 1, current, bound(state), state

    inf = jnp.asarray(jnp.inf, dtype)
    sweeps, _, value, (dwell, transitions, _) = jax.lax.while_loop(
        not_done, body, (jnp.zeros((), jnp.int32), -inf, -inf / 2, start)
    )
    mbar, _ = averages(dwell, transitions)
    out = (dwell, transitions, mbar, value, sweeps, impossible | ~jnp.isfinite(value))
    if not processes:
        return out
    # every node's process given the others at the fit: the product law of the fit
    final = (dwell, transitions, jnp.zeros((N,), dtype))
    A, _, _, _, E, ends, _, log_Z, mu0 = jax.vmap(lambda n: process(n, final))(jnp.arange(N))
    fitted = NodeProcesses(
        matrices=A, exponentials=E, ends=ends, first=mu0, log_normalisers=log_Z, steps=dt
    )
    return out + (fitted,)


# --------------------------------------------------------------------------- entry point
DEFAULT_MEAN_FIELD = PanelMeanField()


def panel_mean_field_statistics(
    model: AbstractCTBN,
    observations: PanelObservations,
    *,
    approximation: PanelMeanField = DEFAULT_MEAN_FIELD,
    initial: PanelMeanFieldStatistics | None = None,
) -> PanelMeanFieldStatistics:
    r"""Mean-field expected statistics of a batch of panel trajectories (module docstring): one
    product of node processes per trajectory, fitted to its observations by coordinate ascent
    on the evidence lower bound, all trajectories at once (`vmap`).

    - `model`: a [`jaxctbn.CTBN`][] or [`jaxctbn.PaddedCTBN`][] (rates only; no global state
      space is built).
    - `observations`: a batch `(R, O)` of [`jaxctbn.panel.PanelObservations`][] with exact
      (error-free) states, `-1` = missing; their interventions (perfect and imperfect) apply
      per trajectory; no exact entry times. A node missing at the first observation starts
      uniform over its states (clamped nodes at their clamp), as in the exact route.
    - `approximation`: a [`jaxctbn.panel.PanelMeanField`][].
    - `initial`: `None` (each step starts at the mean of the states allowed at its gap's two
      ends), or an earlier result for the same observations and `steps_per_gap` to start the
      sweeps from (structural EM starts each E-step from the previous one's: fewer sweeps).

    **Returns:** `PanelMeanFieldStatistics` with the batch axis; its
    `evidence_lower_bound` is $\le$ [`jaxctbn.panel.panel_log_likelihood`][] (up to the
    discretisation of the couplings), and equal to it, with equal statistics, for a network
    without edges. Raises (inside jit, `eqx.error_if`) when an observation is impossible under
    the model."""
    require_batch(observations)
    if not isinstance(approximation, PanelMeanField):
        raise ValueError(
            f"approximation: expected a jaxctbn.panel.PanelMeanField, got {approximation!r}."
        )
    given = None
    if initial is not None:
        if not isinstance(initial, PanelMeanFieldStatistics):
            raise ValueError(
                f"initial: expected a PanelMeanFieldStatistics or None, got {type(initial)}."
            )
        R, num_slots = observations.times.shape
        steps = max(num_slots - 1, 1) * approximation.steps_per_gap
        expected = (R, steps, observations.num_nodes, max(model.cardinalities))
        if initial.dwell_times.shape != expected:
            raise ValueError(
                f"initial: statistics of shape {initial.dwell_times.shape}, expected {expected} "
                "(a result for the same observations and steps_per_gap)."
            )
        given = (initial.dwell_times, initial.transitions)
    start = as_start(model, observations, approximation, given)
    approximation = as_data(approximation)
    return _statistics(model, observations, approximation, start, children_bound(model))


def as_data(approximation: PanelMeanField) -> PanelMeanField:
    """`approximation` with its sweeps and tolerance as arrays: data to a compiled program, not
    constants, so that changing them does not compile again."""
    return jax.tree_util.tree_map(jnp.asarray, approximation)


def children_bound(model: AbstractCTBN) -> int | None:
    """A static bound on the children of any node of `model` (a power of two, at least 8) when
    its parents are concrete, else `None` (every (node, parent slot) pair): the size of the
    children table of a node update, whose cost it sets."""
    try:
        parents = [np.asarray(model.parent_list(n)).reshape(-1) for n in range(model.num_nodes)]
    except jax.errors.ConcretizationTypeError:
        return None
    flat = np.concatenate([p[p >= 0] for p in parents] + [np.zeros(0, int)]).astype(int)
    most = int(np.bincount(flat, minlength=model.num_nodes).max(initial=0))
    return max(8, 1 << max(most - 1, 0).bit_length())


def as_start(model, observations, approximation, initial):
    """`(dwell, transitions, given)` for `_statistics`: the given `(dwell, transitions)`, or
    zeros with `given = False` (the default start)."""
    if initial is not None:
        return (*initial, jnp.asarray(True))
    R, num_slots = observations.times.shape
    K = max(model.cardinalities)
    shape = (R, max(num_slots - 1, 1) * approximation.steps_per_gap, model.num_nodes, K)
    dtype = jnp.result_type(*model.cims)
    return jnp.zeros(shape, dtype), jnp.zeros(shape + (K,), dtype), jnp.asarray(False)


@eqx.filter_jit
def _statistics(
    model, observations, approximation, initial, max_children=None
) -> PanelMeanFieldStatistics:
    """The fit (`panel_mean_field_statistics`); `max_children`: a static bound on any node's
    children (default: every (node, parent slot) pair; see `children_bound`)."""
    return fitted_product_law(model, observations, approximation, initial, max_children)[0]


def fitted_product_law(model, observations, approximation, initial, max_children, processes=False):
    """The fit of `_statistics` (not compiled on its own), and with `processes` (static) also
    every trajectory's fitted `NodeProcesses` (a leading trajectory axis) and the
    per-trajectory set-up of `per_trajectory_tables`: `(statistics, processes, (tables,
    targets, clamps, observations))`; without, `(statistics, None, None)`."""
    kmax = max(model.cardinalities)
    model, observations, tables, targets, clamps = per_trajectory_tables(
        model, observations, lambda m: node_tables(m, kmax), "mean-field inference"
    )
    R = observations.times.shape[0]
    present, safe = tables[0][0], tables[1][0]  # (the parents are those of the model)
    N, q = present.shape
    bound_c = N * q if max_children is None else min(max_children, N * q)
    most = jnp.bincount(jnp.where(present, safe, N).reshape(-1), length=N + 1)[:N].max()
    tables = error_if(
        tables, most > bound_c, "max_children: a node has more children than the bound."
    )
    dtype = jnp.result_type(*model.cims)
    out = jax.vmap(
        lambda tab, t, s, m, tg, c, i: _trajectory(
            tab, t.astype(dtype), s, m, tg, c, i, model.cardinalities, approximation, bound_c,
            processes,
        )
    )(tables, observations.times, observations.states, observations.num_observations, targets,
      clamps, (initial[0], initial[1], jnp.broadcast_to(initial[2], (R,))))  # fmt: skip
    dwell, transitions, mbar, bound, sweeps, impossible = out[:6]
    bound = error_if(
        bound,
        jnp.any(impossible),
        "observations: a trajectory is impossible under the model (a structural zero rate, or "
        "a perfect intervention clamping an observed node to another state), or the mean-field "
        "bound is not finite.",
    )
    statistics = PanelMeanFieldStatistics(
        dwell_times=dwell,
        transitions=transitions,
        step_marginals=mbar,
        evidence_lower_bound=bound,
        sweeps=sweeps,
        model=model,
    )
    if not processes:
        return statistics, None, None
    fitted = cast(NodeProcesses, out[-1])
    return statistics, fitted, (tables, targets, clamps, observations)


@eqx.filter_jit
def _structure_e_step(model, bucket, approximation, parent_sets, initial, max_children):
    """The mean-field E-step of structural EM on one bucket: the pooled family statistics (node
    $n$ pools the trajectories in which it is not clamped), the summed bound, the most sweeps
    taken, and the fitted `(dwell, transitions)` (the next E-step starts from them; `initial`:
    `None` or the previous E-step's, `(dwell, transitions, given)`)."""
    stats: PanelMeanFieldStatistics = _statistics(
        model, bucket, approximation, initial, max_children
    )
    R, N = bucket.times.shape[0], model.num_nodes
    if bucket.intervention is None:
        targets = jnp.zeros((R, N), bool)
    else:
        targets = jnp.broadcast_to(bucket.intervention.targets, (R, N))
    family = project_families(
        lambda n: stats.sum(where=~targets[:, n]), parent_sets, model.cardinalities
    )
    fitted = (stats.dwell_times, stats.transitions)
    return family, stats.evidence_lower_bound.sum(), stats.sweeps.max(), fitted
