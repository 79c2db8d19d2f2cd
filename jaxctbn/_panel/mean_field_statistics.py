r"""What mean-field inference under panel evidence returns (`mean_field.py`): the expected
statistics of the fitted product of node processes, per step, and their projections onto
candidate parent sets (the weights of a set's configurations are products of the parents' step
averages)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from .._master_equation import (
    AbstractExpectedStatistics,
    configuration_digits,
    padded_parents,
    projection_parents,
)
from .._model.ctbn import AbstractCTBN


class PanelMeanFieldStatistics(AbstractExpectedStatistics):
    r"""Mean-field expected statistics of panel trajectories (`mean_field.py`), per step.

    - `dwell_times`: $T_n(x;s)$, `(*batch, steps, N, k_max)` (states past $k_n$ are 0).
    - `transitions`: $M_n(x,x';s)$, `(*batch, steps, N, k_max, k_max)`.
    - `step_marginals`: $\bar\mu_n(x;s)$, the step averages, `(*batch, steps, N, k_max)`.
    - `evidence_lower_bound`: $\mathcal F\le\ln p(Y)$ per trajectory, conditional on the first
      observation as [`jaxctbn.panel.panel_log_likelihood`][] (`(*batch,)`; after `sum`, the
      total).
    - `sweeps`: the sweeps over the nodes each trajectory took.
    - `model`: the model (not intervened).

    `sum` pools trajectories (optionally only where `where`); the projections
    (`node_statistics_on_sets` and friends) sum over the steps (and the pooled trajectories).
    """

    dwell_times: Float[Array, "*batch steps nodes kmax"]
    transitions: Float[Array, "*batch steps nodes kmax kmax"]
    step_marginals: Float[Array, "*batch steps nodes kmax"]
    evidence_lower_bound: Float[Array, "*batch"]
    sweeps: Int[Array, "*batch"]
    model: AbstractCTBN

    def sum(self, where: Bool[Array, " batch"] | None = None) -> "PanelMeanFieldStatistics":
        """The trajectories pooled (optionally only where `where` is `True`, e.g. those in
        which a node was not intervened on): their steps concatenated, each trajectory's
        statistics weighted by `where`."""
        if self.evidence_lower_bound.ndim != 1:
            raise ValueError("sum: expected statistics with one trajectory axis.")
        R = self.evidence_lower_bound.shape[0]
        w = jnp.ones((R,), bool) if where is None else jnp.asarray(where)
        w = w.astype(self.dwell_times.dtype)

        def rows(x):
            return x.reshape((-1,) + x.shape[2:])

        return PanelMeanFieldStatistics(
            dwell_times=rows(self.dwell_times * w[:, None, None, None]),
            transitions=rows(self.transitions * w[:, None, None, None, None]),
            step_marginals=rows(self.step_marginals),
            evidence_lower_bound=(self.evidence_lower_bound * w).sum(),
            sweeps=self.sweeps.max(),
            model=self.model,
        )

    def _project(self, node: int, parents: Array, configs: int):
        mu = self.step_marginals  # (*batch, steps, N, kmax)
        k = self.model.cardinalities[node]
        present, safe, digits, valid = configuration_digits(
            parents, self.model.cardinalities, configs
        )
        picked = mu[..., safe[:, None], digits]  # (*batch, steps, slots, configs)
        picked = jnp.where(present[:, None], picked, 1.0)
        weights = jnp.prod(picked, axis=-2) * valid  # (*batch, steps, configs)
        T = jnp.einsum("...su,...sx->...ux", weights, self.dwell_times[..., node, :k])
        M = jnp.einsum("...su,...sxy->...uxy", weights, self.transitions[..., node, :k, :k])
        return M, T

    def _resolve(self, node, parents):
        node = self.model.node_index(node)
        parents, configs = projection_parents(self.model, node, parents)
        return node, padded_parents(parents), configs

    def node_dwell_times(self, node: int | str, parents=None) -> Float[Array, "*batch configs k"]:
        return self._project(*self._resolve(node, parents))[1]

    def node_transitions(self, node: int | str, parents=None) -> Float[Array, "*batch configs k k"]:
        return self._project(*self._resolve(node, parents))[0]

    def node_statistics_on_sets(self, node: int, parent_sets: Int[Array, "sets max_parents"]):
        """The projections onto every set in `parent_sets`, `_SETS_PER_PASS` sets at a time
        (sequentially), so that the product weights held at once are `(_SETS_PER_PASS, steps,
        configs)`, not one per set: at 50 nodes all sets at once held 6.7 GB."""
        _, configs = projection_parents(self.model, node, parent_sets)
        sets = jnp.asarray(parent_sets, jnp.int32)
        out = jax.lax.map(
            lambda P: self._project(node, P, configs),
            sets,
            batch_size=min(_SETS_PER_PASS, sets.shape[0]),
        )
        ndim = self.evidence_lower_bound.ndim
        return jax.tree_util.tree_map(lambda x: jnp.moveaxis(x, 0, ndim), out)


#: candidate sets projected at once by `PanelMeanFieldStatistics.node_statistics_on_sets`
_SETS_PER_PASS = 64
