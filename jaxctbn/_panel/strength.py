r"""Learning an unknown intervention strength from panel data, by profile likelihood
(maths §8).

Some trajectories were recorded under a drug that scales node $n$'s rates by an unknown
$s$; the others without it. With panels the rates cannot be integrated out in closed form (as
they are for complete paths, [`jaxctbn.learn_strength`][]), so $s$ is learned by its **profile**
objective

$$\ell_p(s)=\max_\Lambda\Big[\sum_r\log p(Y_r\mid\Lambda,s)+\log p(\Lambda)\Big],$$

the rates fitted by [`jaxctbn.panel.fit_rates`][] at every $s$ of a grid in $\ln s$ (one
fit per grid point; without a prior $\ell_p$ is the profile log-likelihood). The
estimate $\hat s$ maximises $\ell_p$ (a parabola through the best grid point and its
neighbours), and the interval at level $1-a$ is $\{s:2[\ell_p(\hat s)-\ell_p(s)]\le
\chi^2_{1,1-a}\}$ (Wilks), read off the grid by linear interpolation. A first grid over
$[$`low`, `high`$]$ finds the region, a second, finer one covers the interval. An end of the
interval that the grid does not close (the objective still within the threshold at `low` or
`high`) is reported as open: the data do not bound $s$ on that side within the range.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from .._errors import error_if
from .._learning.priors import GammaPrior
from .._master_equation import AbstractMasterEquationSolver
from .._model.ctbn import CTBN
from .._model.interventions import Intervention
from .fit import fit_rates
from .fit_arguments import DEFAULT_PANEL_SOLVER
from .fit_methods import AbstractRateFitMethod, GradientFit
from .observations import PanelObservations

#: The default range of strengths searched.
LOW, HIGH = 1e-3, 1e3
#: The default rate fit at each grid point.
PROFILE_METHOD = GradientFit()


class StrengthProfile(eqx.Module):
    r"""What [`jaxctbn.panel.learn_strength_from_panels`][] returns.

    - `estimate`: $\hat s$, the maximiser of the profile objective;
    - `interval` `(2,)`: the profile-likelihood interval at `level`;
    - `open_below`, `open_above`: whether that end is the range's own (the data do not
      bound $s$ on that side within `[low, high]`);
    - `log_strengths` `(G,)`, `profile` `(G,)`, `converged` `(G,)`: the fine grid in $\ln s$,
      $\ell_p$ there and whether each grid point's rate fit converged;
    - `coarse_log_strengths`, `coarse_profile` `(G,)`: the first pass over the whole range;
    - `model`: the rates fitted at the fine grid's best point;
    - `level` (static): the interval's level."""

    estimate: Float[Array, ""]
    interval: Float[Array, " 2"]
    open_below: Bool[Array, ""]
    open_above: Bool[Array, ""]
    log_strengths: Float[Array, " grid"]
    profile: Float[Array, " grid"]
    converged: Bool[Array, " grid"]
    coarse_log_strengths: Float[Array, " grid"]
    coarse_profile: Float[Array, " grid"]
    model: CTBN
    level: float = eqx.field(static=True)


def scaled_observations(observations, node: int, scaled, s):
    """The observations with node `node`'s rates scaled by `s` in the `scaled` trajectories
    (on top of any scale their interventions already have)."""
    R = observations.times.shape[0]
    N = observations.states.shape[-1]
    base = observations.intervention
    if base is None:
        base = Intervention(targets=jnp.zeros((R, N), bool), states=jnp.zeros((R, N), jnp.int32))
    elif jnp.ndim(base.targets) == 1:
        base = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (R, *jnp.shape(a))), base)
    dtype = observations.times.dtype
    scales = (
        [jnp.ones((R,), dtype) for _ in range(N)]
        if base.rate_scales is None
        else [jnp.broadcast_to(jnp.asarray(a, dtype), (R,)) for a in base.rate_scales]
    )
    scales[node] = scales[node] * jnp.where(scaled, s, 1.0)
    return eqx.tree_at(
        lambda o: o.intervention,
        observations,
        base.with_rate_scales(scales),
        is_leaf=lambda x: x is None,
    )


def _profile(model, observations, node, scaled, log_s, method, prior, solver):
    def one(ls):
        fit = fit_rates(
            model,
            scaled_observations(observations, node, scaled, jnp.exp(ls)),
            method=method,
            prior=prior,
            solver=solver,
        )
        return fit.log_posterior, fit.converged, fit.model

    # one fit after another: under vmap the fits' loops (and the exponentials' branches) would
    # run in lockstep, every grid point paying for the slowest
    return jax.lax.map(one, log_s)


def _parabola_peak(x: Array, y: Array, i: Array) -> Array:
    """The maximiser of the parabola through grid points `i - 1, i, i + 1`, clipped to
    them (the grid point itself at an end of the grid or where the parabola is not
    concave)."""
    G = x.shape[0]
    j = jnp.clip(i, 1, G - 2)
    x0, x1, x2 = x[j - 1], x[j], x[j + 1]
    y0, y1, y2 = y[j - 1], y[j], y[j + 1]
    denom = (x0 - x1) * (x0 - x2) * (x1 - x2)
    a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / denom
    b = (x2**2 * (y0 - y1) + x1**2 * (y2 - y0) + x0**2 * (y1 - y2)) / denom
    vertex = jnp.clip(-b / (2 * jnp.where(a < 0, a, -1.0)), x0, x2)
    at_end = (i == 0) | (i == G - 1) | (a >= 0)
    return jnp.where(at_end, x[i], vertex)


def _crossings(x: Array, y: Array, threshold: Array, peak: Array):
    """Where `y` falls below `threshold` nearest to `peak` on each side (linear
    interpolation), and whether it does not within the grid (that end is then the grid's)."""
    G = x.shape[0]
    idx = jnp.arange(G)
    below = y < threshold
    jl = jnp.max(jnp.where(below & (idx < peak), idx, -1))
    ju = jnp.min(jnp.where(below & (idx > peak), idx, G))
    open_below, open_above = jl < 0, ju >= G
    jl, ju = jnp.clip(jl, 0, G - 2), jnp.clip(ju, 1, G - 1)

    def between(a, b):  # y[a] < threshold <= y[b]
        t = (y[b] - threshold) / (y[b] - y[a])
        return x[b] + t * (x[a] - x[b])

    lower = jnp.where(open_below, x[0], between(jl, jl + 1))
    upper = jnp.where(open_above, x[-1], between(ju, ju - 1))
    return lower, upper, open_below, open_above


@eqx.filter_jit
def learn_strength_from_panels(
    model: CTBN,
    observations: PanelObservations,
    *,
    node: int | str,
    scaled: ArrayLike,
    low: float = LOW,
    high: float = HIGH,
    num_points: int = 25,
    level: float = 0.95,
    method: AbstractRateFitMethod = PROFILE_METHOD,
    prior: GammaPrior | None = None,
    solver: AbstractMasterEquationSolver = DEFAULT_PANEL_SOLVER,
) -> StrengthProfile:
    r"""The strength $s$ by which an intervention scaled node `node`'s rates in the
    trajectories marked `scaled` `(R,)` of `observations` (a batch of R trajectories), by
    profile likelihood (module docstring): the estimate and its interval at `level`.

    - `model`: the graph, structural zeros and starting rates, as for
      [`jaxctbn.panel.fit_rates`][] (and `method`, `prior`, `solver` as there; the default
      method here is [`jaxctbn.panel.GradientFit`][], which converges in a few iterations at
      every grid point, where EM crawls at the extreme strengths);
    - `low`, `high` (static): the range searched, $0<$ `low` $<$ `high`; `num_points`
      (static) grid points per pass (two passes of rate fits).

    **Returns:** a [`jaxctbn.panel.StrengthProfile`][]."""
    if not (0 < low < high < np.inf):
        raise ValueError(f"low, high: need 0 < low < high < inf, got {low}, {high}.")
    if not isinstance(num_points, int) or isinstance(num_points, bool) or num_points < 5:
        raise ValueError(f"num_points: an integer >= 5, got {num_points!r}.")
    if not 0 < level < 1:
        raise ValueError(f"level: a probability in (0, 1), got {level!r}.")
    if not isinstance(observations, PanelObservations) or jnp.ndim(observations.times) != 2:
        raise ValueError(
            "observations: a batch of trajectories (PanelObservations with a leading axis)."
        )
    n = model.node_index(node)
    R = observations.times.shape[0]
    scaled = jnp.asarray(scaled)
    if scaled.shape != (R,) or scaled.dtype != bool:
        raise ValueError(f"scaled: one boolean per trajectory ({R},), got {scaled.shape}.")
    scaled = error_if(
        scaled, ~jnp.any(scaled), "scaled: no trajectory is marked as recorded under the strength."
    )
    # every trajectory scaled: s times the node's rates is all the data see, so s trades
    # against the rates exactly (a profile flat but for the rates' box, not an estimate)
    scaled = error_if(
        scaled,
        jnp.all(scaled),
        "scaled: every trajectory is recorded under the strength, so it cannot be told from "
        "the node's own rates; it needs trajectories without the intervention.",
    )
    dtype = observations.times.dtype
    import scipy.stats  # (here: importing scipy.stats costs every command half a second)

    drop = 0.5 * float(scipy.stats.chi2.ppf(level, 1))

    coarse = jnp.linspace(np.log(low), np.log(high), num_points, dtype=dtype)
    idx = jnp.arange(num_points)

    def next_grid(grid, values):
        """The fine pass's grid: the coarse points within `drop + 1` of the top, and one
        more on each side (the coarse pass itself gives its own grid back)."""
        near = values >= values.max() - drop - 1.0
        lo = jnp.maximum(jnp.min(jnp.where(near, idx, num_points)) - 1, 0)
        hi = jnp.minimum(jnp.max(jnp.where(near, idx, -1)) + 1, num_points - 1)
        fine = grid[lo] + (grid[hi] - grid[lo]) * jnp.linspace(0, 1, num_points, dtype=dtype)
        return fine, lo, hi

    def one_pass(grid, _):
        # both passes in one scan, so the fits' program is compiled once
        values, converged, models = _profile(
            model, observations, n, scaled, grid, method, prior, solver
        )
        fine, lo, hi = next_grid(grid, values)
        return fine, (grid, values, converged, models, lo, hi)

    _, (grids, values, convergeds, fits, los, his) = jax.lax.scan(one_pass, coarse, None, length=2)
    values = error_if(
        values,
        ~jnp.all(jnp.isfinite(values)),
        "observations: the profile objective is not finite on the grid; check the data "
        "against the model (a jump the graph does not allow, a structural zero).",
    )
    y1, y = values[0], values[1]
    lo_i, hi_i = los[0], his[0]
    fine, converged = grids[1], convergeds[1]
    models = jax.tree_util.tree_map(lambda a: a[1], fits)
    peak = jnp.argmax(y)
    log_estimate = _parabola_peak(fine, y, peak)
    lower, upper, open_below, open_above = _crossings(fine, y, y[peak] - drop, peak)
    # an end is the range's own only if the fine grid reaches it
    open_below = open_below & (lo_i == 0)
    open_above = open_above & (hi_i == num_points - 1)
    return StrengthProfile(
        estimate=jnp.exp(log_estimate),
        interval=jnp.exp(jnp.stack([lower, upper])),
        open_below=open_below,
        open_above=open_above,
        log_strengths=fine,
        profile=y,
        converged=converged,
        coarse_log_strengths=coarse,
        coarse_profile=y1,
        model=jax.tree_util.tree_map(lambda a: a[peak], models),
        level=float(level),
    )
