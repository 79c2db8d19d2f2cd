r"""Gamma-conjugate Bayesian learning of CTBN rates, pooled across interventions.

Independent priors $\Lambda_n(x,x',u)\sim\mathrm{Gam}(\alpha,\beta)$ with the rate parameter
$\beta$ shared over $x'$. Given statistics $\bar M,\bar T$ pooled over the experiments in which node
$n$ was **not** perfectly intervened on (paper §4), the posterior is
$\mathrm{Gam}(\bar\alpha=\alpha+\bar M,\ \bar\beta=\beta+\bar T)$.
"""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, Float, PRNGKeyArray

from ._ctbn import CTBN
from ._layout import static_config_count
from ._statistics import NodeStatistics, SufficientStatistics


def _off_diagonal(k: int) -> Array:
    return ~jnp.eye(k, dtype=bool)


def _prior_arrays(value, shape, name, node_name):
    arr = jnp.asarray(value, dtype=float)
    try:
        arr = jnp.broadcast_to(arr, shape)
    except ValueError:
        raise ValueError(
            f"{name} of node {node_name!r}: shape {jnp.shape(value)} does not broadcast to {shape}."
        ) from None
    if not isinstance(arr, jax.core.Tracer) and bool(jnp.any(~(arr > 0))):
        raise ValueError(f"{name} of node {node_name!r}: prior parameters must be > 0.")
    return arr


class RatePosterior(eqx.Module):
    r"""Gamma posterior over the rates of a CTBN with a known graph.

    - `alpha[n]`: $\bar\alpha_n(x,x',u)$, shape `(configs, k, k)` (diagonal unused).
    - `beta[n]`: $\bar\beta_n(x,u)$, shape `(configs, k)`, shared over $x'$.

    Build with [`jaxctbn.RatePosterior.from_prior`][] and update with statistics.
    """

    alpha: tuple[Float[Array, "configs k k"], ...]
    beta: tuple[Float[Array, "configs k"], ...]
    names: tuple[str, ...] = eqx.field(static=True)
    cardinalities: tuple[int, ...] = eqx.field(static=True)
    parents: tuple[tuple[int, ...], ...] = eqx.field(static=True)

    @classmethod
    def from_prior(
        cls,
        names: Sequence[str],
        cardinalities: Sequence[int],
        parents: Sequence[Sequence[int]],
        *,
        alpha=1.0,
        beta=1.0,
    ) -> "RatePosterior":
        """The prior: `alpha`/`beta` scalars, or per node (a sequence) arrays broadcastable to
        `(configs, k, k)` / `(configs, k)`. All must be > 0."""
        names, cards = tuple(names), tuple(int(k) for k in cardinalities)
        parents = tuple(tuple(int(p) for p in ps) for ps in parents)
        if not (len(names) == len(cards) == len(parents)):
            raise ValueError("names, cardinalities and parents need one entry per node.")
        per_node_a = isinstance(alpha, list | tuple)
        per_node_b = isinstance(beta, list | tuple)
        for flag, value, what in ((per_node_a, alpha, "alpha"), (per_node_b, beta, "beta")):
            if flag and len(value) != len(names):
                raise ValueError(
                    f"{what}: need one entry per node ({len(names)}), got {len(value)}."
                )
        alphas, betas = [], []
        for n, k in enumerate(cards):
            C = static_config_count(parents[n], cards)
            alphas.append(
                _prior_arrays(alpha[n] if per_node_a else alpha, (C, k, k), "alpha", names[n])
            )
            betas.append(_prior_arrays(beta[n] if per_node_b else beta, (C, k), "beta", names[n]))
        return cls(
            alpha=tuple(alphas),
            beta=tuple(betas),
            names=names,
            cardinalities=cards,
            parents=parents,
        )

    @classmethod
    def for_model(cls, model: CTBN, *, alpha=1.0, beta=1.0) -> "RatePosterior":
        """The prior over the rates of `model`'s graph."""
        return cls.from_prior(
            model.names, model.cardinalities, model.parents, alpha=alpha, beta=beta
        )

    def update(self, pooled: Sequence[NodeStatistics]) -> "RatePosterior":
        r"""Add pooled statistics (one [`jaxctbn.NodeStatistics`][] per node, for this graph):
        $\bar\alpha\mathrel{+}=M$, $\bar\beta\mathrel{+}=T$. Statistics must be non-negative."""
        if len(pooled) != len(self.alpha):
            raise ValueError(f"statistics: need one entry per node ({len(self.alpha)}).")
        alphas, betas = [], []
        for n, (a, b, st) in enumerate(zip(self.alpha, self.beta, pooled)):
            if st.transitions.shape != a.shape or st.dwell_times.shape != b.shape:
                raise ValueError(
                    f"statistics of node {self.names[n]!r}: shapes {st.transitions.shape} and "
                    f"{st.dwell_times.shape}, expected {a.shape} and {b.shape}."
                )
            M = eqx.error_if(
                st.transitions,
                jnp.any(st.transitions < 0) | jnp.any(~jnp.isfinite(st.transitions)),
                "statistics: transition counts must be finite and >= 0.",
            )
            T = eqx.error_if(
                st.dwell_times,
                jnp.any(st.dwell_times < 0) | jnp.any(~jnp.isfinite(st.dwell_times)),
                "statistics: dwell times must be finite and >= 0.",
            )
            k = a.shape[-1]
            alphas.append(a + jnp.where(_off_diagonal(k), M, 0.0))
            betas.append(b + T)
        return eqx.tree_at(lambda p: (p.alpha, p.beta), self, (tuple(alphas), tuple(betas)))

    def update_with(self, statistics: SufficientStatistics) -> "RatePosterior":
        """Add the statistics of a batch of experiments, pooled: node $n$ uses only the
        trajectories in which it was not perfectly intervened on."""
        if statistics.parents != self.parents:
            raise ValueError("statistics were computed for a different graph than the posterior.")
        return self.update(statistics.pooled())

    def mean(self) -> CTBN:
        r"""The CTBN with posterior-mean rates $\bar\alpha/\bar\beta$."""
        cims = [a / b[..., None] for a, b in zip(self.alpha, self.beta)]
        return CTBN(cims=cims, parents=self.parents, names=self.names)

    def sample(self, key: PRNGKeyArray) -> CTBN:
        """One posterior draw of all rates (`jax.vmap` over keys for many)."""
        keys = jr.split(key, len(self.alpha))
        cims = [
            jr.gamma(kk, a, dtype=a.dtype) / b[..., None]
            for kk, a, b in zip(keys, self.alpha, self.beta)
        ]
        return CTBN(cims=cims, parents=self.parents, names=self.names)

    def mse(self, truth: CTBN) -> Float[Array, ""]:
        r"""Posterior-averaged squared error $\mathsf E[(\Lambda-\Lambda^*)^2]$, averaged over all
        off-diagonal rates: $\bar\alpha/\bar\beta^2 + (\bar\alpha/\bar\beta-\Lambda^*)^2$."""
        if truth.parents != self.parents or truth.cardinalities != self.cardinalities:
            raise ValueError("truth: must have the posterior's graph and cardinalities.")
        total, count = 0.0, 0
        for a, b, q in zip(self.alpha, self.beta, truth.cims):
            k = a.shape[-1]
            mean = a / b[..., None]
            err = a / b[..., None] ** 2 + (mean - q) ** 2
            total = total + jnp.where(_off_diagonal(k), err, 0.0).sum()
            count += a.shape[0] * k * (k - 1)
        return total / count
