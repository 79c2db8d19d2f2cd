r"""Empirical Bayes: the rate prior's hyper-parameters chosen from the data (beyond the paper).

The paper fixes the Gamma prior's $(\alpha,\beta)$ and gives no values; the outcome of active
structure learning depends strongly on them ([Findings](../findings.md#sensitivity)). Type-II
maximum likelihood chooses them by maximising the marginal likelihood of the data seen so far,
averaged over graphs,

$$\hat\theta=\arg\max_\theta\ \ln p(H\mid\theta)
=\arg\max_\theta\sum_n\ln\sum_P p(P)\,p(X_n\mid X_P,\theta),$$

([`jaxctbn.StructurePosterior.log_evidence`][]) with autodiff gradients and an optax optimiser,
in log space and within bounds. In the active-learning loop
([`jaxctbn.StructureLearningTask`][]`(empirical_bayes=EmpiricalBayes())`) the fit is redone
after every experiment, warm-started at the previous value, so a user need not guess $\alpha$,
$\beta$; the criteria then score with the fitted prior.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp

from .optimisers import LBFGS, AbstractVBHCOptimiser
from .priors import AbstractPrior, check_prior
from .structure_posterior import StructurePosterior


class EmpiricalBayes(eqx.Module):
    r"""Fit the rate prior's hyper-parameters (its `hyperparameter_names`, e.g. $(\alpha,\beta)$
    of [`jaxctbn.GammaPrior`][], $(\alpha,\tau)$ of [`jaxctbn.NodelmanPrior`][]) by type-II
    maximum likelihood.

    **Arguments (keyword-only):**

    - `per_node`: one value of each hyper-parameter per node (the objective then splits over
      nodes) instead of one shared value (default `False`: shared, the better-posed choice for
      few data).
    - `optimiser`: the minimiser of $-\ln p(H\mid\theta)$ over the unconstrained parameters
      (default [`jaxctbn.LBFGS`][]`(steps=100)`).
    - `bounds`: `(low, high)`, $0<$ low $<$ high $<\infty$: every hyper-parameter stays in this
      range (default $(10^{-3},10^{3})$). The evidence can keep rising as $\alpha,\beta\to\infty$
      at a fixed ratio (data consistent with one shared rate); the bound stops that. A
      hyper-parameter is parametrised as
      $\ln\theta=\ln\mathrm{low}+(\ln\mathrm{high}-\ln\mathrm{low})\,\sigma(z)$, $z$ free.

    The fitted values are kept only if they raise the evidence above the start's; without data
    the evidence is flat and the hyper-parameters stay where they start.
    """

    per_node: bool = eqx.field(default=False, static=True, kw_only=True)
    optimiser: AbstractVBHCOptimiser = eqx.field(default=LBFGS(steps=100), kw_only=True)
    bounds: tuple[float, float] = eqx.field(default=(1e-3, 1e3), static=True, kw_only=True)

    def settings(self) -> dict:
        """As JSON, for a run's `config.json`."""
        return {"per_node": self.per_node, "bounds": list(self.bounds)}

    def __check_init__(self):
        low, high = self.bounds
        if not (0 < low < high < math.inf):
            raise ValueError(f"bounds: need 0 < low < high < inf, got {self.bounds}.")
        if not isinstance(self.optimiser, AbstractVBHCOptimiser):
            raise ValueError(
                f"optimiser: expected jaxctbn.LBFGS(...) or jaxctbn.Adam(...), got "
                f"{self.optimiser!r}."
            )

    def initial_prior(self, prior: AbstractPrior, num_nodes: int) -> AbstractPrior:
        """`prior` with its hyper-parameters as float arrays, of shape `(num_nodes,)` when
        `per_node`, clipped into `bounds`: the form the fit returns (so the active-learning loop
        carries one pytree structure)."""
        names = _names(prior)
        check_prior(prior, num_nodes)
        low, high = self.bounds
        values = []
        for name in names:
            v = jnp.clip(jnp.asarray(getattr(prior, name), float), low, high)
            if self.per_node:
                v = jnp.broadcast_to(v, (num_nodes,))
            elif v.ndim:
                raise ValueError(
                    f"prior: {name} has one value per node; use EmpiricalBayes(per_node=True)."
                )
            values.append(v)
        return _replace(prior, names, values)

    def fit(self, posterior: StructurePosterior) -> StructurePosterior:
        r"""`posterior` rescored under the hyper-parameters that maximise
        $\ln p(H\mid\theta)$, starting from its current prior (jittable, differentiable)."""
        N = len(posterior.names)
        start = self.initial_prior(posterior.prior, N)
        names = _names(start)
        low, high = (math.log(b) for b in self.bounds)

        def to_values(z):
            return [jnp.exp(low + (high - low) * jax.nn.sigmoid(zi)) for zi in z]

        def loss(z):
            prior = _replace(start, names, to_values(z))
            return -posterior.with_prior(prior).log_evidence()

        init = []
        for name in names:
            u = (jnp.log(getattr(start, name)) - low) / (high - low)
            u = jnp.clip(u, 1e-6, 1 - 1e-6)
            init.append(jnp.log(u) - jnp.log1p(-u))
        value, z = self.optimiser.minimise(loss, init)
        # keep the start unless the optimiser improved on it (without data the evidence is flat
        # and a quasi-Newton step on a zero gradient is not guaranteed to stay put)
        better = value < loss(init)
        fitted = [jnp.where(better, v, getattr(start, n)) for v, n in zip(to_values(z), names)]
        return posterior.with_prior(_replace(start, names, fitted))


def _names(prior: AbstractPrior) -> tuple[str, ...]:
    names = type(prior).hyperparameter_names
    if not names:
        raise ValueError(
            f"prior: {type(prior).__name__} names no hyper-parameters (hyperparameter_names), "
            "so empirical Bayes cannot fit it."
        )
    return names


def _replace(prior: AbstractPrior, names, values) -> AbstractPrior:
    return eqx.tree_at(
        lambda p: tuple(getattr(p, n) for n in names),
        prior,
        tuple(values),
        is_leaf=lambda x: x is None,
    )
