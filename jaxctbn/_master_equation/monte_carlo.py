r"""Monte Carlo (Gillespie) expected statistics for networks too large for the global master
equation.

`num_paths` independent paths $X^{(1)},\dots,X^{(R)}$ of the (intervened) model are sampled
exactly by the Gillespie algorithm ([`jaxctbn.sample_trajectories`][]) from the initial state
over $[0,\tau]$. The rates out of the current state are evaluated node by node, so no global
state space is formed: the cost grows with the number of jumps times the number of nodes, not
with $\prod_n k_n$. Each path is kept as its piecewise-constant segments, states
$s^{(r)}_j$ held for $\Delta^{(r)}_j$, and the node statistics are projected onto any parent
set $P$ afterwards, one estimate per path averaged over the paths:

$$\mathsf E[\hat T_n(x,u)]\approx\frac1R\sum_{r}\sum_j\Delta^{(r)}_j\,
1\big(s^{(r)}_{j,n}=x,\ s^{(r)}_{j,P}=u\big),$$

$$\mathsf E[\hat M_n(x,x',u)]\approx\frac1R\sum_{r}\sum_j\Delta^{(r)}_j\,
1\big(s^{(r)}_{j,n}=x,\ s^{(r)}_{j,P}=u\big)\,
\Lambda_n\big(x,x'\mid s^{(r)}_{j,\mathrm{pa}(n)}\big).$$

**Rao-Blackwellised transitions.** The transitions are not counted jumps: each segment adds its
dwell time times the node's true conditional rate there,
$\mathsf E[\hat M_n(x,x',u)]=\mathsf E\big[\int_0^\tau1(X_n=x,X_P=u)\,
\Lambda_n(x,x'\mid X_{\mathrm{pa}(n)})\,dt\big]$. The integral is the compensator of the counting
process of those jumps (count minus integral is a martingale that starts at zero), so both
estimators are unbiased. The integral drops the Poisson noise of the jump times and of the
choice among the destinations $x'$, and usually has the smaller variance (about half, for
the network of `tests/master_equation/test_monte_carlo.py`), but not always: a jump that almost surely
happens exactly once (into an absorbing state, rate 1 over $\tau=3$) has a count of variance
0.05 and an integral of variance 0.70. It is also positive for every possible transition of a
visited $(x,u)$, even one that no path took, it is differentiable in the rates given the
path, and when $P$ contains the true parents it equals $\Lambda_n\,\hat T_n$ path by path,
as the exact statistics do. Perfectly intervened nodes have zero rates, hence zero
transitions.

**Standard errors.** The $R$ per-path estimates are independent and identically distributed,
so the standard error of a mean is their sample standard deviation over $\sqrt R$
(`SampledStatistics.node_transitions_standard_error`).
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._errors import error_if
from .._model.ctbn import AbstractCTBN
from .._model.interventions import Intervention
from .._model.layout import config_index
from .._paths.sampling import automatic_max_events, batch_trajectories, draw_initial_state
from .._paths.sufficient_statistics import segments
from .preparation import prepare_model
from .solver import AbstractApproximateSolver
from .statistics import AbstractExpectedStatistics, projection_parents


def _project(
    model: AbstractCTBN,
    node: int,
    parents,
    configs: int,
    states: Int[Array, "paths segments nodes"],
    durations: Float[Array, "paths segments"],
    *,
    per_path: bool,
) -> tuple[Array, Array]:
    r"""`(transitions, dwell_times)` of `node` on `parents` (a static tuple or a padded array,
    `configs` configuration rows) from the segments of the paths: each segment's duration,
    and its duration times the node's conditional rates $\Lambda_n(x_n,\cdot\mid u)$ (zero at
    $x_n$), added into the bin of $(u_P, x_n)$ by one scatter. `per_path`: one estimate per
    path, `(paths, configs, k, k)` and `(paths, configs, k)`; otherwise their mean, without the
    per-path tables."""
    k = model.cardinalities[node]
    paths = states.shape[0]
    bins = config_index(states, parents, model.cardinalities) * k + states[..., node]
    tables = paths if per_path else 1
    if per_path:
        bins = bins + jnp.arange(paths)[:, None] * (configs * k)
    rates = model.node_rates(node, states)  # (paths, segments, k)
    values = durations[..., None] * jnp.concatenate([jnp.ones_like(rates[..., :1]), rates], -1)
    out = jax.ops.segment_sum(
        values.reshape(-1, 1 + k), bins.reshape(-1), num_segments=tables * configs * k
    ).reshape(tables, configs, k, 1 + k)
    if not per_path:
        out = out[0] / paths
    return out[..., 1:], out[..., 0]


class SampledStatistics(AbstractExpectedStatistics):
    r"""Monte Carlo expected node statistics of one cCTBN over $[0,\tau]$, from paths sampled
    by [`jaxctbn.Gillespie`][] (see there for the estimators): an
    [`jaxctbn.AbstractExpectedStatistics`][], so the design criteria take it unchanged.
    `node_dwell_times` and `node_transitions` are the means over the paths;
    `path_statistics` gives the per-path estimates, and the `*_standard_error` methods their
    standard errors.

    - `segment_states`: the state of every segment of every path, `(paths, max_events + 1, N)`
      (the initial state, then the state after each jump; slots after the last jump repeat
      the final state).
    - `segment_durations`: how long each segment lasted, `(paths, max_events + 1)` (zero for
      the unused slots; each path's sum is $\tau$).
    - `model`: the (intervened) model; its rates give the Rao-Blackwellised transitions.
    """

    segment_states: Int[Array, "*batch paths segments nodes"]
    segment_durations: Float[Array, "*batch paths segments"]
    model: AbstractCTBN

    @property
    def num_paths(self) -> int:
        return int(self.segment_durations.shape[-2])

    @property
    def final_states(self) -> Int[Array, "*batch paths nodes"]:
        r"""The node states of every path at $\tau$, `(paths, N)`."""
        return self.segment_states[..., -1, :]

    def _project(self, node: int | str, parents, *, per_path: bool):
        node = self.model.node_index(node)
        parents, configs = projection_parents(self.model, node, parents)
        return _project(
            self.model,
            node,
            parents,
            configs,
            self.segment_states,
            self.segment_durations,
            per_path=per_path,
        )

    def path_statistics(
        self, node: int | str, parents=None
    ) -> tuple[Float[Array, "paths configs k k"], Float[Array, "paths configs k"]]:
        r"""`(transitions, dwell_times)` of `node` on `parents` (default: the model's) for
        every path: the $R$ independent estimates whose means are `node_transitions` and
        `node_dwell_times`."""
        return self._project(node, parents, per_path=True)

    def node_dwell_times(self, node: int | str, parents=None) -> Float[Array, "configs k"]:
        r"""$\mathsf E[\hat T_n(x,u)]$ estimated by the mean over the paths."""
        return self._project(node, parents, per_path=False)[1]

    def node_transitions(self, node: int | str, parents=None) -> Float[Array, "configs k k"]:
        r"""$\mathsf E[\hat M_n(x,x',u)]$ estimated by the mean over the paths of the
        Rao-Blackwellised transitions."""
        return self._project(node, parents, per_path=False)[0]

    def node_dwell_times_standard_error(
        self, node: int | str, parents=None
    ) -> Float[Array, "configs k"]:
        r"""The standard error of `node_dwell_times`: the sample standard deviation of the
        per-path estimates over $\sqrt R$ ($R$ = `num_paths`)."""
        return _standard_error(self.path_statistics(node, parents)[1])

    def node_transitions_standard_error(
        self, node: int | str, parents=None
    ) -> Float[Array, "configs k k"]:
        r"""The standard error of `node_transitions`: the sample standard deviation of the
        per-path estimates over $\sqrt R$ ($R$ = `num_paths`)."""
        return _standard_error(self.path_statistics(node, parents)[0])

    def node_statistics_on_sets(
        self, node: int, parent_sets: Int[Array, "sets max_parents"]
    ) -> tuple[Float[Array, "sets configs k k"], Float[Array, "sets configs k"]]:
        """`(node_transitions, node_dwell_times)` of `node` projected onto every padded parent
        set in `parent_sets` at once (`configs` = the most configurations any set of that
        padding can have); the same numbers as the two methods per set."""
        sets = jnp.asarray(parent_sets, jnp.int32)
        return jax.vmap(lambda P: self._project(node, P, per_path=False))(sets)


def _standard_error(per_path: Array) -> Array:
    return jnp.std(per_path, axis=0, ddof=1) / jnp.sqrt(per_path.shape[0])


def _is_key(key) -> bool:
    """A typed PRNG key (`jax.random.key`, shape `()`) or a raw one (`PRNGKey`, uint32 `(2,)`)."""
    dtype, shape = getattr(key, "dtype", None), getattr(key, "shape", None)
    if dtype is None:
        return False
    if jnp.issubdtype(dtype, jax.dtypes.prng_key):
        return shape == ()
    return dtype == jnp.uint32 and shape == (2,)


def _is_count(value, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


class Gillespie(AbstractApproximateSolver):
    r"""Monte Carlo expected statistics: $R$ = `num_paths` exact Gillespie paths of the
    intervened model over $[0,\tau]$, kept as their segments (state $s_j$ held for $\Delta_j$)
    and projected onto any parent set $P$ afterwards. Returns a
    `SampledStatistics`, whose statistics are means over the paths of

    $$\hat T_n(x,u)=\sum_j\Delta_j\,1(s_{j,n}=x,\ s_{j,P}=u),\qquad
    \hat M_n(x,x',u)=\sum_j\Delta_j\,1(s_{j,n}=x,\ s_{j,P}=u)\,
    \Lambda_n(x,x'\mid s_{j,\mathrm{pa}(n)}).$$

    The transitions are Rao-Blackwellised: each segment adds its duration times the node's
    true conditional rate instead of a count of jumps. That integral is the compensator of the
    jump count, so it has the same expectation (unbiased), without the Poisson noise of the
    jumps themselves (usually a smaller variance, but not always: see
    [Monte Carlo statistics](../concepts/master-equation.md#monte-carlo)); it equals $\Lambda_n\hat T_n$ path by path when $P$
    contains the true parents, and is zero for a perfectly intervened node. Unbiased for any
    network, with a standard error that falls as $1/\sqrt R$ and that the statistics report;
    the rates out of a state are evaluated node by node and no global state space is formed,
    so it serves networks of tens to hundreds of nodes.

    **Arguments (keyword-only):**

    - `key`: the PRNG key of the paths. The same key gives the same paths (pure), and, used
      for several interventions or models (e.g. `jax.vmap` over candidate interventions, as
      [`jaxctbn.score_interventions`][] does), common random numbers: differences between
      candidates are then far less noisy than the statistics themselves.
    - `num_paths`: $R\ge2$ (static), default 1000.
    - `max_events`: the event buffer of a path (static). A path with more jumps raises an
      error naming `max_events` (never a silently cut path). `None` (default) sizes it from
      the rates with `automatic_max_events`; that needs concrete rates and
      horizon, so inside `jax.jit`, `jax.vmap` or `jax.grad` (the design criteria, a batch of
      models) give it explicitly.

    **Cost.** Memory `num_paths * (max_events + 1) * N` integers for the segments, kept
    by the statistics (times the batch under `jax.vmap`, e.g. candidates x posterior draws in
    the design criteria). Time: all paths advance together, one jump per path per step, for
    as many steps as the longest path has jumps; a step evaluates the rates of every node.

    **Initial state:** node states `(N,)` (the usual case; clamped nodes are moved to their
    clamped states), or a distribution over the global states (small networks only), from
    which each path draws its own.

    **Gradients.** The paths are sampled from the rates with their gradient stopped
    (`jax.lax.stop_gradient`; reverse-mode differentiation through the sampling loop is not
    possible, and the jumps are discontinuous in the rates). So under `jax.grad` with respect
    to the rates (or an imperfect intervention's scales) the dwell times have zero gradient
    and the transitions have the gradient of $\sum_j\Delta_j\,\Lambda_n(\cdot\mid\cdot)$ with
    the segments held fixed, e.g. $\partial\hat M_n(x,x',u)/\partial\Lambda_n(x,x',u)=
    \hat T_n(x,u)$ for the true parents. That is the derivative of the estimator given the
    paths, not an estimate of the derivative of the expected statistics (which would also
    need the change of the paths' law, a score-function term).

    **Example:**

    ```python
    solver = jc.Gillespie(key=jax.random.key(0), num_paths=2000)
    stats = jc.expected_statistics(model, jnp.zeros(40, int), 2.0, solver=solver)
    T, T_se = stats.node_dwell_times(5), stats.node_dwell_times_standard_error(5)
    ```
    """

    key: PRNGKeyArray = eqx.field(kw_only=True)
    num_paths: int = eqx.field(default=1000, static=True, kw_only=True)
    max_events: int | None = eqx.field(default=None, static=True, kw_only=True)

    def __check_init__(self):
        if not _is_key(self.key):
            raise ValueError(
                "Gillespie: key must be a PRNG key (jax.random.key(seed)), got "
                f"{type(self.key).__name__} of shape {getattr(self.key, 'shape', ())}."
            )
        if not _is_count(self.num_paths, 2):
            raise ValueError(
                f"Gillespie: num_paths must be an integer >= 2 (static), got {self.num_paths!r}."
            )
        if self.max_events is not None and not _is_count(self.max_events, 1):
            raise ValueError(
                "Gillespie: max_events must be an integer >= 1 (static) or None, got "
                f"{self.max_events!r}."
            )

    def _buffer(self, model: AbstractCTBN, horizon) -> int:
        """`max_events`, or the automatic size when it is `None`."""
        if self.max_events is not None:
            return self.max_events
        size = None
        if not isinstance(horizon, jax.core.Tracer):
            size = automatic_max_events(model, float(horizon))
        if size is None:
            raise ValueError(
                "Gillespie: max_events=None sizes the event buffer from concrete rates and "
                "horizon; inside jax.jit, jax.vmap or jax.grad give Gillespie(max_events=...) "
                "(the automatic size: Gillespie(...).sized(model, horizon, None) outside jit)."
            )
        return size

    def sized(self, model, horizon, intervention):
        """The automatic event buffer (`max_events=None`) sized now from concrete values;
        `self` when `max_events` is given or a value is traced (then `expected_statistics`
        asks for `max_events`)."""
        leaves = jax.tree_util.tree_leaves((model, horizon, intervention))
        if self.max_events is not None or any(isinstance(x, jax.core.Tracer) for x in leaves):
            return self
        intervened, _ = prepare_model(model, intervention)
        size = self._buffer(intervened, horizon)
        return dataclasses.replace(self, max_events=size)

    def expected_statistics(self, model, initial_state, horizon, intervention):
        model, intervention = prepare_model(model, intervention)
        if intervention is None:
            intervention = Intervention.none(model.num_nodes)
        max_events = self._buffer(model, horizon)
        # the paths of `sample_trajectories` with this key, from the model checked once above;
        # they carry no gradient (see the class docstring), the rates of their segments do
        frozen, frozen_intervention = jax.lax.stop_gradient((model, intervention))
        s0, keys = jax.vmap(
            lambda key: draw_initial_state(frozen, frozen_intervention, initial_state, key)
        )(jr.split(self.key, self.num_paths))
        paths = batch_trajectories(frozen, horizon, s0, keys, frozen_intervention, max_events)
        states, durations, _ = jax.vmap(segments)(paths)
        states, durations = error_if(
            (states, durations),
            jnp.any(paths.truncated),
            f"max_events: a path sampled by Gillespie has more than {max_events} jumps; raise "
            "Gillespie(max_events=...).",
        )
        return SampledStatistics(segment_states=states, segment_durations=durations, model=model)
