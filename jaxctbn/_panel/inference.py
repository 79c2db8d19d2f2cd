r"""Panel observations of a cCTBN: exact forward filtering and backward smoothing.

A **panel** trajectory is seen only at observation times $t_0<t_1<\dots<t_{m-1}$: at each, every
node is observed (possibly through a misclassification matrix $p(y\mid x)$) or missing, and the
process is hidden in between. Some observations may be **exact entry times** (msm's
`deathexact`): at $t_i$ the process *enters* the observed configuration by a jump, from a state
that is unknown and differs from it.

On the amalgamated generator $W$ of the (intervened) model, with $e_i(s)=\prod_n p(y_{i,n}\mid
s_n)$ the evidence of observation $i$ (a factor 1 for a missing node) and, for an exact entry into
the set $O_i$ of states consistent with $y_i$, the jump matrix
$J_i(s',s)=W(s',s)\,1[s'\notin O_i]\,1[s\in O_i]$, the **scaled forward filter** is

$$\tilde\alpha_i=\hat\alpha_{i-1}e^{(t_i-t_{i-1})W},\qquad
a_i=\begin{cases}\tilde\alpha_i\odot e_i\\ \tilde\alpha_iJ_i&\text{(exact entry)}\end{cases},
\qquad c_i=\textstyle\sum_sa_i(s),\qquad\hat\alpha_i=a_i/c_i,$$

so $\hat\alpha_i(s)=p(S(t_i)=s\mid y_{0..i})$ and $c_i=p(y_i\mid y_{0..i-1})$ (a density in time
for an exact entry), hence $\log p(y_{1..m-1}\mid y_0)=\sum_{i\ge1}\log c_i$ with no product of
small numbers ever formed. The **scaled backward** messages are $\hat\beta_{m-1}=\mathbf 1$,

$$b_i=\frac1{c_i}\begin{cases}e_i\odot\hat\beta_i\\ J_i\hat\beta_i&\text{(exact entry)}\end{cases},
\qquad\hat\beta_{i-1}=e^{(t_i-t_{i-1})W}b_i,$$

so that $\sum_s\hat\alpha_i(s)\hat\beta_i(s)=1$ and $p(S(t)=s\mid Y)\propto
(\hat\alpha_{i-1}e^{(t-t_{i-1})W})(s)\,(e^{(t_i-t)W}b_i)(s)$ for $t\in[t_{i-1},t_i)$. Over the
interval $(t_{i-1},t_i)$, with $\alpha_t=\hat\alpha_{i-1}e^{(t-t_{i-1})W}$ and
$\beta_t=e^{(t_i-t)W}b_i$ and $Z_i=\alpha_t\beta_t$ (constant in $t$; 1 in exact arithmetic),

$$\mathsf E[T(s)\mid Y]=\sum_i\frac1{Z_i}\int\alpha_t(s)\beta_t(s)\,dt,\qquad
\mathsf E[M(s,s')\mid Y]=\sum_i\frac{W(s,s')}{Z_i}\int\alpha_t(s)\beta_t(s')\,dt
+\sum_{i\,\text{exact}}\frac{\tilde\alpha_i(s)J_i(s,s')\hat\beta_i(s')}{\tilde\alpha_iJ_i\hat\beta_i},$$

the last term being the one jump that an exact entry time records. The interval integrals are
the solver's [`jaxctbn.AbstractMasterEquationSolver.forward_backward`][].
"""

from __future__ import annotations

from typing import cast

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from .._errors import error_if
from .._master_equation import DEFAULT_SOLVER, AbstractMasterEquationSolver, check_state_space
from .._model.ctbn import AbstractCTBN
from .buckets import PanelBuckets
from .checks import check_possible, checked_inputs
from .expected_statistics import PanelExpectedStatistics
from .filtering import filtered_log_likelihood, forward_filter
from .observations import Emissions, PanelObservations
from .smoothing import backward_messages, smoothed_marginals, smoothed_statistics


def _vmapped(fn, ndim: int):
    for _ in range(ndim):
        fn = jax.vmap(fn)
    return fn


def panel_log_likelihood(
    model: AbstractCTBN,
    observations: PanelObservations | PanelBuckets,
    *,
    emissions: Emissions | None = None,
    initial_distribution: ArrayLike | None = None,
    solver: AbstractMasterEquationSolver = DEFAULT_SOLVER,
) -> Float[Array, "*batch"]:
    r"""Log-likelihood of each panel trajectory under `model`, by the scaled forward filter.

    - Default (`initial_distribution=None`, msm's convention): **conditional on the first
      observation**, $\log p(y_1,\dots,y_{m-1}\mid y_0)=\sum_{i\ge1}\log c_i$, where the state
      at $t_0$ is drawn uniformly among the global states the first observation allows
      (weighted by its emission probabilities; clamped nodes in their clamped state), which is
      exact when the first observation is complete. **A trajectory with one observation
      contributes 0.**
    - With `initial_distribution` $p_0$ (over the global states at $t_0$, shape `(S,)` shared or
      `(*batch, S)`): the full $\log p(y_0,\dots,y_{m-1})=\log\sum_sp_0(s)e_0(s)+
      \sum_{i\ge1}\log c_i$.

    An exact entry time contributes a density in time ($c_i$ contains a rate). Sum the result
    over trajectories for the data set's log-likelihood.

    **Arguments:**

    - `model`: a [`jaxctbn.CTBN`][] or [`jaxctbn.PaddedCTBN`][].
    - `observations`: [`jaxctbn.panel.PanelObservations`][] (one trajectory or a batch; their
      interventions are applied per trajectory), or a [`jaxctbn.panel.PanelBuckets`][]
      (trajectories of very unequal lengths; results in the order they were given).
    - `emissions`: optional [`jaxctbn.panel.Emissions`][] (default: error-free observations).
    - `initial_distribution`: see above.
    - `solver`: a master-equation solver (default [`jaxctbn.Uniformisation`][]).

    **Returns:** the log-likelihood per trajectory, shape `observations.batch_shape`.

    Pure: works under `jax.jit`, `jax.vmap` and `jax.grad` (with respect to the rates and the
    emission matrices), in float32 and float64. Raises (inside jit, `eqx.error_if`) when an
    observation is impossible under the model, naming the trajectory and time.
    """
    return cast(
        Array, _run(model, observations, emissions, initial_distribution, solver, "likelihood")
    )


def panel_expected_statistics(
    model: AbstractCTBN,
    observations: PanelObservations | PanelBuckets,
    *,
    emissions: Emissions | None = None,
    initial_distribution: ArrayLike | None = None,
    solver: AbstractMasterEquationSolver = DEFAULT_SOLVER,
) -> PanelExpectedStatistics:
    r"""Smoothed expected statistics $\mathsf E[T(s)\mid Y]$ and $\mathsf E[M(s\to s')\mid Y]$
    of each panel trajectory over $[t_0,t_{m-1}]$ (the interval integrals of the module
    docstring, plus one jump per exact entry time), as a
    [`jaxctbn.panel.PanelExpectedStatistics`][] with the batch axes of `observations` (pool a batch
    with its `sum`). Arguments as for [`jaxctbn.panel.panel_log_likelihood`][]; the solver's
    `forward_backward` bounds the length of one gap (for [`jaxctbn.Uniformisation`][],
    largest exit rate times the gap below about `fb_max_terms`, else it raises; use
    [`jaxctbn.MatrixExponential`][] for long gaps on small networks)."""
    return cast(
        PanelExpectedStatistics,
        _run(model, observations, emissions, initial_distribution, solver, "statistics"),
    )


def panel_marginals(
    model: AbstractCTBN,
    observations: PanelObservations | PanelBuckets,
    times: ArrayLike,
    *,
    emissions: Emissions | None = None,
    initial_distribution: ArrayLike | None = None,
    solver: AbstractMasterEquationSolver = DEFAULT_SOLVER,
) -> Float[Array, "*batch times global_states"]:
    r"""Smoothed marginals $p(S(t)=s\mid Y)$ at the grid `times` (shape `(G,)` shared by the
    batch, or `(*batch, G)`), each $\ge t_0$ of its trajectory (an error otherwise: the
    process before the first observation is not modelled); after the last observation the
    filter is simply propagated. At an exact entry time the marginal is the state entered.
    Arguments otherwise as for [`jaxctbn.panel.panel_log_likelihood`][]."""
    return cast(
        Array,
        _run(model, observations, emissions, initial_distribution, solver, "marginals", times),
    )


def _run(model, observations, emissions, initial_distribution, solver, what, grid=None):
    if not isinstance(observations, PanelObservations | PanelBuckets):
        raise ValueError(
            f"observations: expected a PanelObservations or PanelBuckets, got "
            f"{type(observations).__name__}."
        )
    observations.checked(model, emissions)  # a ValueError now for concrete states
    check_state_space(solver, model.cardinalities)
    # Python numbers and lists made arrays: `eqx.filter_jit` would bake them into the program
    # (static), compiling it again for every new initial distribution or time grid
    if initial_distribution is not None:
        initial_distribution = jnp.asarray(initial_distribution)
    if grid is not None:
        grid = jnp.asarray(grid)
    if isinstance(observations, PanelObservations):
        bad, out = panel_inference(
            model, observations, emissions, initial_distribution, solver, what, grid
        )
        return check_possible(out, bad, observations)
    # buckets: one program per bucket shape, per-trajectory inputs cut and outputs gathered
    per_trajectory = lambda x, ndim: x is not None and x.ndim == ndim  # noqa: E731
    p0s = (
        observations.split(initial_distribution, "initial_distribution")
        if per_trajectory(initial_distribution, 2)
        else [initial_distribution] * len(observations.buckets)
    )
    grids = (
        observations.split(grid, "times")
        if per_trajectory(grid, 2)
        else [grid] * len(observations.buckets)
    )
    bads, outs = [], []
    for bucket, p0, g in zip(observations.buckets, p0s, grids):
        bad, out = panel_inference(model, bucket, emissions, p0, solver, what, g)
        bads.append(bad)
        if what == "statistics":  # the model is shared: only the arrays are gathered
            out = cast(PanelExpectedStatistics, out)
            out = (out.dwell_times, out.transitions, out.log_likelihood)
        outs.append(out)
    out = observations.gather(outs)
    if what == "statistics":
        dwell, transitions, log_likelihood = out
        out = PanelExpectedStatistics(
            dwell_times=dwell,
            transitions=transitions,
            log_likelihood=log_likelihood,
            model=model.checked(),
        )
    return check_possible(out, tuple(bads), observations)


@eqx.filter_jit
def panel_inference(
    model, observations, emissions, initial_distribution, solver, what, grid, interval_scales=None
):
    """One compiled program per call (eager calls would otherwise compile op by op).
    `interval_scales`: `None`, or per node `(*batch, O, configs, k, k)` rate scales from each
    observation to the next (time-varying covariates; the likelihood only)."""
    if interval_scales is not None and what != "likelihood":
        raise ValueError(
            "covariates: time-varying covariates enter the likelihood only (the fit and its "
            "standard errors), not the smoothed statistics or marginals."
        )
    model, observations, matrices, p0 = checked_inputs(
        model, observations, emissions, initial_distribution
    )
    batch = observations.batch_shape
    dtype = matrices[0].dtype
    if grid is not None:
        grid = jnp.asarray(grid, dtype)
        if grid.ndim == 1:
            grid = jnp.broadcast_to(grid, batch + grid.shape)
        elif grid.shape[:-1] != batch:
            raise ValueError(f"times: expected shape (G,) or {batch + ('G',)}, got {grid.shape}.")
        first = observations.times[..., 0].astype(dtype)
        grid = error_if(
            grid,
            jnp.any(grid < first[..., None]) | jnp.any(~jnp.isfinite(grid)),
            "times: every grid time must be finite and >= its trajectory's first observation "
            "time (the process before it is not modelled).",
        )

    def one(obs, p, g, scales):
        gen, filtered = forward_filter(model, obs, matrices, p, solver, interval_scales=scales)
        bad, log_likelihood = filtered_log_likelihood(filtered, p)
        if what == "likelihood":
            return bad, log_likelihood
        betas, ends = backward_messages(gen, obs, matrices, filtered, solver)
        if what == "marginals":
            return bad, smoothed_marginals(gen, filtered, ends, obs.num_observations, g, solver)
        dwell, transitions = smoothed_statistics(gen, obs, filtered, betas, ends, solver)
        return bad, (dwell, transitions, log_likelihood)

    bad, out = _vmapped(one, len(batch))(observations, p0, grid, interval_scales)
    if what == "statistics":
        # the model is shared by the batch: only the arrays have the batch axes
        dwell, transitions, log_likelihood = out
        out = PanelExpectedStatistics(
            dwell_times=dwell, transitions=transitions, log_likelihood=log_likelihood, model=model
        )
    return bad, out
