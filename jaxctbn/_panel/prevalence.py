r"""Observed against expected prevalence over time: a check of a panel fit's calibration
(R msm's `prevalence.msm`).

At each time $t$ of a grid and for each node $n$, the trajectories **at risk** are those under
observation at $t$ (first observation $\le t\le$ last observation) whose node $n$ was seen at
or before $t$. The **observed** count of state $x$ is the number of them whose last observation
of $n$ at or before $t$ was $x$ (the state taken as constant between observations, msm's
convention); the **expected** count is

$$E_{n,x}(t)=\sum_{r\ \text{at risk}}\Pr\big(X_n(t)=x\mid y_{r,0}\big),\qquad
\Pr(X(t)\mid y_{r,0})=\pi_r^\top e^{(t-t_{r,0})W_r},$$

the forecast of the fitted model from each trajectory's own first observation $y_{r,0}$ at
$t_{r,0}$ ($\pi_r$ uniform over the global states consistent with it: unobserved nodes
uniform), with the trajectory's generator $W_r$ (its intervention, and its covariates'
scales). With time-varying covariates (or the periods of
[`with_time_periods`][jaxctbn.panel.PanelObservations.with_time_periods]) the generator changes at the trajectory's observations,
each value holding until the next, and the forecast is the product of the intervals'
exponentials up to $t$. Agreement of the two curves is a check of fit: a model that is right forecasts the
states it did not see; systematic gaps show where it is not (msm's `plot.prevalence.msm`).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from .._master_equation import amalgamate, transition_matrices
from .._model.ctbn import CTBN, with_diagonal
from .._model.interventions import Intervention
from .covariates import Covariates, centred_values, scales_of
from .filtering import observation_evidence as _evidence
from .observations import PanelObservations


class Prevalence(eqx.Module):
    r"""What [`RateFit.prevalence`][jaxctbn.panel.RateFit.prevalence] returns, for the times `(G,)` and the nodes, states
    padded to the largest cardinality `K` (0 beyond a node's own):

    - `times` `(G,)`;
    - `at_risk` `(G, N)`: trajectories under observation at $t$ with the node seen by then;
    - `observed` `(G, N, K)`: their counts by last observed state;
    - `expected` `(G, N, K)`: the fitted model's forecast of those counts."""

    times: Float[Array, " times"]
    at_risk: Int[Array, "times nodes"]
    observed: Int[Array, "times nodes states"]
    expected: Float[Array, "times nodes states"]


def _observed(observations: PanelObservations, times: np.ndarray, K: int) -> tuple:
    """Host-side: the at-risk mask `(G, R, N)` and the observed counts `(G, N, K)`."""
    obs_times = np.asarray(observations.times, float)
    states = np.asarray(observations.states)
    counts = np.asarray(observations.num_observations)
    R, slots, N = states.shape
    valid = np.arange(slots)[None, :] < counts[:, None]  # (R, slots)
    first = obs_times[:, 0]
    last = obs_times[np.arange(R), counts - 1]
    masks = np.zeros((len(times), R, N), bool)
    observed = np.zeros((len(times), N, K), int)
    for g, t in enumerate(times):
        under = (first <= t) & (t <= last)
        seen = valid[..., None] & (obs_times[..., None] <= t) & (states >= 0)  # (R, slots, N)
        masks[g] = seen.any(1) & under[:, None]
        latest = np.where(seen, np.arange(slots)[None, :, None], -1).max(1)  # (R, N)
        for n in range(N):
            state = states[np.arange(R), np.maximum(latest[:, n], 0), n]
            observed[g, n] = np.bincount(state[masks[g, :, n]], minlength=K)[:K]
    return masks, observed


@eqx.filter_jit
def _expected(model, observations, times, masks, scales):
    """The expected counts `(G, N, K)`: each trajectory's forecast from its first observation,
    its generator changing at its observations when `scales` (per node `(R, O, configs, k,
    k)`, the covariate scales from each observation to the next) are given."""
    cards = model.cardinalities
    N = len(cards)
    K = max(cards)
    dtype = jnp.result_type(*model.cims)
    eye = tuple(jnp.eye(k, dtype=dtype) for k in cards)
    R, slots = observations.times.shape
    intervention = observations.intervention
    if intervention is None:
        intervention = Intervention(
            targets=jnp.zeros((R, N), bool), states=jnp.zeros((R, N), jnp.int32)
        )

    def one(t, count, y0, iv, mask, row_scales):
        base = iv.apply(model)

        def generator(s):
            cims = tuple(with_diagonal(c * x.astype(dtype)) for c, x in zip(base.cims, s))
            return amalgamate(eqx.tree_at(lambda m: m.cims, base, cims)).dense()

        if row_scales is None:
            W = jnp.broadcast_to(amalgamate(base).dense(), (slots,) + (base.num_global_states,) * 2)
        else:
            W = jax.vmap(generator)(row_scales)  # (O, S, S): from observation i to the next
        valid = jnp.arange(slots) < count
        t = jnp.where(valid, t.astype(dtype), t[count - 1].astype(dtype))
        start = _evidence(cards, y0, eye)
        start = start / start.sum()
        P = transition_matrices(jnp.diff(t)[:, None, None] * W[:-1])

        def step(p, P_i):
            p = p @ P_i
            return p, p

        _, later = jax.lax.scan(step, start, P)
        at_rows = jnp.concatenate([start[None], later])  # (O, S): the forecast at t_i
        # the grid time's interval: the last observation at or before it
        index = jnp.searchsorted(jnp.where(valid, t, jnp.inf), times, side="right") - 1
        index = jnp.clip(index, 0, count - 1)
        h = jnp.maximum(times - t[index], 0).astype(dtype)
        p = jnp.einsum(
            "gs,gst->gt", at_rows[index], transition_matrices(h[:, None, None] * W[index])
        )
        p = p.reshape((-1,) + cards)  # (G, *cards)
        per_node = []
        for n, k in enumerate(cards):
            axes = tuple(a + 1 for a in range(N) if a != n)
            marginal = p.sum(axes) if axes else p
            per_node.append(jnp.pad(marginal, ((0, 0), (0, K - k))))
        return jnp.stack(per_node, 1) * mask[..., None]  # (G, N, K)

    contributions = jax.vmap(one)(
        observations.times,
        observations.num_observations,
        observations.states[:, 0],
        intervention,
        masks,
        scales,
    )
    return contributions.sum(0)


def prevalence(
    model: CTBN,
    observations: PanelObservations,
    times: ArrayLike,
    *,
    covariates: Covariates | None = None,
    effects=None,
) -> Prevalence:
    r"""Observed and expected counts of each node's states over `times` under `model` (module
    docstring; `covariates`, `effects`: a fit's): what
    [`RateFit.prevalence`][jaxctbn.panel.RateFit.prevalence] computes, and the command line
    with a fit read from its JSON."""
    if not isinstance(model, CTBN):
        raise ValueError(f"model: expected a CTBN, got {type(model).__name__}.")
    if not isinstance(observations, PanelObservations) or len(observations.batch_shape) != 1:
        raise ValueError(
            "observations: expected a PanelObservations with one batch axis (trajectories); "
            "read the data as PanelObservations (not PanelBuckets)."
        )
    observations.checked(model, None)
    grid = np.asarray(times, float)
    if grid.ndim != 1 or grid.size == 0 or not np.all(np.isfinite(grid)):
        raise ValueError("times: expected a non-empty 1-D array of finite times.")
    if np.any(np.diff(grid) <= 0):
        raise ValueError("times: must be strictly increasing.")
    if (covariates is None) != (effects is None):
        raise ValueError("covariates, effects: give both (a fit with covariates) or neither.")
    masks, observed = _observed(observations, grid, max(model.cardinalities))
    scales = None
    if covariates is not None:
        if not isinstance(covariates, Covariates):
            raise ValueError(
                f"covariates: expected a jaxctbn.panel.Covariates, got {type(covariates).__name__}."
            )
        leading = covariates.values.shape[:-1]
        R, slots = observations.times.shape
        if leading[:1] != (R,) or (covariates.per_observation and leading[1] < slots):
            raise ValueError(
                f"covariates: expected leading axes {(R, slots) if covariates.per_observation else (R,)}"
                f" (those of the fit), got values of shape {covariates.values.shape}."
            )
        values = jnp.asarray(covariates.values, jnp.result_type(*model.cims))
        (centred,), _, _ = centred_values(covariates, (observations,), [values])
        free = tuple((jnp.asarray(c) != 0) & ~jnp.eye(c.shape[-1], dtype=bool) for c in model.cims)
        assert effects is not None
        scales = scales_of(centred, tuple(jnp.asarray(b) for b in effects), covariates.masks(free))
        if not covariates.per_observation:  # the same scales from every observation
            scales = tuple(jnp.broadcast_to(s[:, None], (R, slots) + s.shape[1:]) for s in scales)
    expected = _expected(
        model, observations, jnp.asarray(grid), jnp.asarray(np.moveaxis(masks, 0, 1)), scales
    )
    return Prevalence(
        times=jnp.asarray(grid),
        at_risk=jnp.asarray(masks.sum(1)),
        observed=jnp.asarray(observed),
        expected=expected,
    )
