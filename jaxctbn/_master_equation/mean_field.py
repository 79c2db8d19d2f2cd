r"""Mean-field expected statistics for networks too large for the global master equation.

The joint law of the $N$ nodes at time $t$ is approximated by a product of node marginals,
$p_t(s)\approx\prod_n\mu_n(s_n,t)$. Each marginal follows its own master equation, driven by the
marginals of its parents,

$$\dot\mu_n(x',t)=\sum_{x}\mu_n(x,t)\,\bar\Lambda_n(x,x';t),\qquad
\bar\Lambda_n(x,x';t)=\sum_u\Big[\prod_{p\in\mathrm{par}(n)}\mu_p(u_p,t)\Big]\Lambda_n(x,x'\mid u),$$

(diagonal $\bar\Lambda_n(x,x)=-\sum_{x'\ne x}\bar\Lambda_n(x,x')$), one ODE of $\sum_n k_n$ states
solved with diffrax. It is exact for a network without edges and for every node whose
ancestors are all clamped; otherwise it ignores the correlation between a node and its parents
(the forward, evidence-free form of the mean-field approximation of Cohn et al., 2010). Cost and
memory grow with $\sum_n k_n\prod_{p\in\mathrm{par}(n)}k_p$, not with $\prod_n k_n$.

The node statistics projected onto a node $n$ and any parent set $P$ are the exact projection
formulas of [`jaxctbn.ExpectedStatistics`][] evaluated at the product law, integrated over
$[0,\tau]$ by composite Gauss-Legendre quadrature of the saved marginals:

$$\mathsf E[\hat T_n(x,u)]\approx\int_0^\tau\mu_n(x,t)\prod_{p\in P}\mu_p(u_p,t)\,dt,\qquad
\mathsf E[\hat M_n(x,x',u)]\approx\int_0^\tau\mu_n(x,t)\prod_{p\in P}\mu_p(u_p,t)\,
\bar\Lambda_n(x,x'\mid u;t)\,dt,$$

where $\bar\Lambda_n(\cdot\mid u;t)$ averages $\Lambda_n$ over the configurations of the true
parents outside $P$ under their marginals (the parents inside $P$ are fixed by $u$). When $P$
contains the true parents, $\mathsf E[\hat M_n]=\Lambda_n\,\mathsf E[\hat T_n]$ as for the exact
statistics.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from .._model.ctbn import AbstractCTBN
from .._model.interventions import Intervention
from .._model.layout import slot_strides
from .preparation import checked_initial_distribution, checked_node_states, prepare_model
from .solver import AbstractApproximateSolver
from .statistics import AbstractExpectedStatistics, projection_parents


# --------------------------------------------------------------------------- parent layouts
def padded_parents(parents, width: int | None = None) -> Int[Array, " slots"]:
    """A static tuple of indices or a padded array as an int32 array (`-1` = empty slot),
    padded with `-1` to `width` slots."""
    if isinstance(parents, tuple | list):
        parents = np.asarray(parents, np.int32).reshape(-1)
    parents = jnp.asarray(parents, jnp.int32)
    if width is not None and parents.shape[-1] < width:
        pad = jnp.full((*parents.shape[:-1], width - parents.shape[-1]), -1, jnp.int32)
        parents = jnp.concatenate([parents, pad], axis=-1)
    return parents


def configuration_digits(
    parents: Int[Array, " slots"], cardinalities: tuple[int, ...], configs: int
) -> tuple[Array, Array, Array, Array]:
    """For a padded parent array: `(present, safe, digits, valid)`: which slots hold a parent,
    the slot's node index (0 where empty), the state of each slot's parent in each of `configs`
    configurations `(slots, configs)` (first parent most significant, as
    [`jaxctbn.CTBN`][]'s CIM rows), and which configuration indices exist (`< prod k_p`)."""
    present, safe, slot_card, strides = slot_strides(parents, cardinalities)
    u = jnp.arange(configs, dtype=jnp.int32)
    digits = (u[None, :] // strides[:, None]) % slot_card[:, None]  # (slots, configs)
    return present, safe, digits, u < jnp.prod(slot_card)


# --------------------------------------------------------------------------- statistics
class MeanFieldStatistics(AbstractExpectedStatistics):
    r"""Mean-field expected node statistics of one cCTBN over $[0,\tau]$ (see the module
    docstring for the approximation): an [`jaxctbn.AbstractExpectedStatistics`][], so the
    design criteria take it unchanged.

    - `node_marginals`: $\mu_n(x,t_q)$ at the quadrature times, `(times, N, k_max)` (states past
      $k_n$ are 0).
    - `quadrature_weights`: `(times,)`, summing to $\tau$.
    - `final_marginals`: $\mu_n(x,\tau)$, `(N, k_max)`.
    - `model`: the (intervened) model.
    """

    node_marginals: Float[Array, "*batch times nodes kmax"]
    quadrature_weights: Float[Array, "*batch times"]
    final_marginals: Float[Array, "*batch nodes kmax"]
    model: AbstractCTBN

    def _resolve(self, node: int | str, parents) -> tuple[int, Array, int]:
        """`(node index, padded parent array, configs)` of a projection."""
        node = self.model.node_index(node)
        parents, configs = projection_parents(self.model, node, parents)
        return node, padded_parents(parents), configs

    def _project(self, node: int, parents: Array, configs: int):
        """`(M, T)` of `node` on one padded parent array with `configs` configuration rows."""
        true = padded_parents(self.model.parent_list(node))
        return self._project_node(node, self.model.cims[node], true, parents, configs)

    def _project_node(self, node, cim, true, parents: Array, configs: int):
        """`(M, T)` of the node with index `node` (may be traced), CIM table `cim` and padded
        true parents `true` on one padded parent array with `configs` configuration rows.

        Computed with the quadrature times as the last (contiguous) axis and as elementwise
        products summed over time rather than small batched matrix products: under the
        design criteria's vmaps over draws, nodes and sets this is faster on a CPU (the design
        step with mean-field statistics is timed in `benchmarks/master_equation/bench_mean_field.py`; results
        in `benchmarks/results/mean_field.md`)."""
        k = cim.shape[-1]
        mu = jnp.moveaxis(self.node_marginals, 0, -1)  # (N, kmax, t)
        cards = self.model.cardinalities
        present, safe, digits, valid = configuration_digits(parents, cards, configs)
        picked = jnp.where(present[:, None, None], mu[safe[:, None], digits, :], 1.0)
        occupancy = jnp.prod(picked, axis=0) * (valid[:, None] * self.quadrature_weights)  # (u, t)
        weighted = occupancy[:, None, :] * mu[node, :k, :][None]  # (u, x, t)
        T = weighted.sum(-1)
        # the true parents: fixed by u where they are in P, averaged under their marginals if not
        t_present, t_safe, t_digits, t_valid = configuration_digits(true, cards, cim.shape[0])
        same = (true[:, None] == parents[None, :]) & t_present[:, None] & present[None, :]
        in_P = same.any(1)  # (q,)
        fixed = (same[:, :, None] * digits[None]).sum(1)  # (q, u): P's digit of parent i
        agree = (t_digits[:, :, None] == fixed[:, None, :]).astype(mu.dtype)  # (q, w, u)
        free = mu[t_safe[:, None], t_digits, :]  # (q, w, t)
        factor = jnp.where(in_P[:, None, None, None], agree[..., None], free[:, :, None, :])
        factor = jnp.where(t_present[:, None, None, None], factor, 1.0)  # (q, w, u, t)
        given = jnp.prod(factor, axis=0) * t_valid[:, None, None]  # (w, u, t)
        mixed = (weighted[:, :, None, :] * jnp.moveaxis(given, 0, 1)[:, None]).sum(-1)  # (u,x,w)
        off = jnp.where(jnp.eye(k, dtype=bool), 0.0, cim)
        M = jnp.einsum("uxw,wxy->uxy", mixed, off)
        return M, T

    def node_dwell_times(self, node: int | str, parents=None) -> Float[Array, "configs k"]:
        return self._project(*self._resolve(node, parents))[1]

    def node_transitions(self, node: int | str, parents=None) -> Float[Array, "configs k k"]:
        return self._project(*self._resolve(node, parents))[0]

    def node_statistics_on_sets(
        self, node: int, parent_sets: Int[Array, "sets max_parents"]
    ) -> tuple[Float[Array, "sets configs k k"], Float[Array, "sets configs k"]]:
        _, configs = projection_parents(self.model, node, parent_sets)
        return jax.vmap(lambda P: self._project(node, P, configs))(
            jnp.asarray(parent_sets, jnp.int32)
        )

    def nodes_statistics_on_sets(self, nodes, parent_sets):
        """One vectorised projection over `nodes` (the node index, CIM table and true parents
        become data; CIM rows and parent slots padded to the group's largest, which the
        projection ignores), so the compiled program does not grow with the number of nodes."""
        cards = self.model.cardinalities
        configs = {
            projection_parents(self.model, n, parent_sets[i])[1] for i, n in enumerate(nodes)
        }
        if len({cards[n] for n in nodes}) > 1 or len(configs) > 1:
            return super().nodes_statistics_on_sets(nodes, parent_sets)
        width = max(padded_parents(self.model.parent_list(n)).shape[-1] for n in nodes)
        rows = max(self.model.cims[n].shape[0] for n in nodes)
        cims = jnp.stack(
            [
                jnp.pad(
                    self.model.cims[n], ((0, rows - self.model.cims[n].shape[0]), (0, 0), (0, 0))
                )
                for n in nodes
            ]
        )
        true = jnp.stack([padded_parents(self.model.parent_list(n), width) for n in nodes])
        (configs,) = configs

        def one(node, cim, parents, sets):
            return jax.vmap(lambda P: self._project_node(node, cim, parents, P, configs))(sets)

        return jax.vmap(one)(
            jnp.asarray(nodes, jnp.int32), cims, true, jnp.asarray(parent_sets, jnp.int32)
        )


# --------------------------------------------------------------------------- the solver
def node_tables(model: AbstractCTBN, kmax: int):
    """Every node's parents padded to a common width `(N, q)`, their configuration digits
    `(N, q, C)` and validity `(N, C)`, and the off-diagonal rates `(N, C, kmax, kmax)`."""
    cards = model.cardinalities
    width = max(
        len(p) if isinstance(p, tuple | list) else int(jnp.shape(p)[-1])
        for p in (model.parent_list(n) for n in range(model.num_nodes))
    )
    rows = max(c.shape[0] for c in model.cims)
    presents, safes, digits, valids, rates = [], [], [], [], []
    for n, cim in enumerate(model.cims):
        padded = padded_parents(model.parent_list(n), width)
        present, safe, d, valid = configuration_digits(padded, cards, rows)
        k = cards[n]
        off = jnp.where(jnp.eye(k, dtype=bool), 0.0, cim)
        off = jnp.pad(off, ((0, rows - cim.shape[0]), (0, kmax - k), (0, kmax - k)))
        presents.append(present)
        safes.append(safe)
        digits.append(d)
        valids.append(valid & (jnp.arange(rows) < cim.shape[0]))
        rates.append(off)
    return (
        jnp.stack(presents),
        jnp.stack(safes),
        jnp.stack(digits),
        jnp.stack(valids),
        jnp.stack(rates),
    )


def _gauss_legendre(points: int, panels: int, horizon, dtype) -> tuple[Array, Array]:
    """Composite Gauss-Legendre nodes and weights on $[0,\\tau]$ (ascending)."""
    x, w = np.polynomial.legendre.leggauss(points)
    starts = np.arange(panels)[:, None]
    nodes = ((starts + (x[None] + 1) / 2) / panels).reshape(-1)
    weights = np.broadcast_to(w[None] / (2 * panels), (panels, points)).reshape(-1)
    return horizon * jnp.asarray(nodes, dtype), horizon * jnp.asarray(weights, dtype)


class MeanField(AbstractApproximateSolver):
    r"""Mean-field expected statistics (module docstring): a product of node marginals, each
    following its own master equation driven by its parents' marginals, solved by diffrax; node
    statistics on any parent set by composite Gauss-Legendre quadrature. Returns a
    `MeanFieldStatistics`. Exact for a network without edges; otherwise an
    approximation whose error grows with the coupling between a node and its parents (measured
    in `benchmarks/master_equation/bench_mean_field.py`; results in `benchmarks/results/mean_field.md`).

    **Arguments (keyword-only):** `rtol`, `atol` of the adaptive step control (diffrax
    `Tsit5`, error measured in the max norm; the defaults, 1e-4 and 1e-7, put the node
    statistics within 1.2e-5 (relative) of a 1e-11 solve on random 10-node networks with rates
    scaled by 1, 4 and 10, below the quadrature's error and far below the approximation's own
    (1-11%), and make the parameter design step at 100 nodes faster than 1e-6 and 1e-9, with
    scores within 1e-6; the step is timed in `benchmarks/master_equation/bench_mean_field.py`, results in
    `benchmarks/results/mean_field.md`); `panels` and `points` of the quadrature
    ($\tau$ split into `panels` equal pieces with `points` Gauss-Legendre nodes each; the
    marginals are saved there; default 8 x 8: on random 10-node networks its projections are as
    close to a 64 x 8 reference as a 32 x 4 rule's, with half the nodes, and the
    projections dominate the design step's cost); `max_steps` of the ODE solve (exceeding it
    raises).

    Initial states: node states `(N,)` (a point mass, the usual case), or a distribution over
    the global states (small networks only; its node marginals are used).
    """

    rtol: float = 1e-4
    atol: float = 1e-7
    panels: int = eqx.field(default=8, static=True)
    points: int = eqx.field(default=8, static=True)
    max_steps: int = eqx.field(default=100_000, static=True)

    def __check_init__(self):
        if self.panels < 1 or self.points < 1:
            raise ValueError(
                f"MeanField: panels and points must be >= 1, got {self.panels} and {self.points}."
            )

    def initial_marginals(
        self, model: AbstractCTBN, initial_state: ArrayLike, intervention: Intervention | None
    ) -> Float[Array, "nodes kmax"]:
        """Node marginals of the initial state `(N, k_max)`, clamped nodes at their states."""
        initial_state = jnp.asarray(initial_state)
        cards = model.cardinalities
        kmax = max(cards)
        dtype = jnp.result_type(*model.cims)
        if jnp.issubdtype(initial_state.dtype, jnp.integer):
            states = checked_node_states(model, initial_state, intervention)
            return (states[:, None] == jnp.arange(kmax)).astype(dtype)
        p = checked_initial_distribution(model, initial_state, intervention).reshape(cards)
        rows = []
        for n, k in enumerate(cards):
            axes = tuple(a for a in range(len(cards)) if a != n)
            rows.append(jnp.pad(p.sum(axis=axes), (0, kmax - k)))
        return jnp.stack(rows)

    def sized(self, model, horizon, intervention):
        return self

    def expected_statistics(self, model, initial_state, horizon, intervention):
        import diffrax

        model, intervention = prepare_model(model, intervention)
        mu0 = self.initial_marginals(model, initial_state, intervention)
        present, safe, digits, valid, rates = node_tables(model, mu0.shape[-1])
        dtype = mu0.dtype
        horizon = jnp.asarray(horizon, dtype)

        def vector_field(t, mu, args):
            picked = jnp.take_along_axis(mu[safe], digits, -1)  # (N, q, C)
            picked = jnp.where(present[..., None], picked, 1.0)
            weights = jnp.prod(picked, axis=1) * valid  # (N, C)
            mean_rates = jnp.einsum("nc,ncxy->nxy", weights, rates)
            inflow = jnp.einsum("nx,nxy->ny", mu, mean_rates)
            return inflow - mu * mean_rates.sum(-1)

        times, weights = _gauss_legendre(self.points, self.panels, horizon, dtype)
        solution = diffrax.diffeqsolve(
            diffrax.ODETerm(vector_field),
            diffrax.Tsit5(),
            t0=jnp.zeros((), dtype),
            t1=horizon,
            dt0=None,
            y0=mu0,
            stepsize_controller=diffrax.PIDController(
                rtol=self.rtol, atol=self.atol, norm=lambda y: jnp.max(jnp.abs(y))
            ),
            saveat=diffrax.SaveAt(ts=jnp.concatenate([times, horizon[None]])),
            max_steps=self.max_steps,
        )
        ys = solution.ys
        assert ys is not None
        return MeanFieldStatistics(
            node_marginals=ys[:-1],
            quadrature_weights=weights,
            final_marginals=ys[-1],
            model=model,
        )
