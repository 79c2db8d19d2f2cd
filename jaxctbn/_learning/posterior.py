r"""Posteriors: the abstract interface, and Gamma-conjugate learning of CTBN rates pooled
across interventions.

Independent priors $\Lambda_n(x,x',u)\sim\mathrm{Gam}(\alpha,\beta)$ with the rate parameter
$\beta$ shared over $x'$ ([`jaxctbn.GammaPrior`][]). Given statistics $\bar M,\bar T$ pooled over
the experiments in which node $n$ was **not** perfectly intervened on (paper §4), the posterior is
$\mathrm{Gam}(\bar\alpha=\alpha+\bar M,\ \bar\beta=\beta+\bar T)$.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import equinox as eqx
import jax.numpy as jnp
from jax.scipy.special import digamma
from jaxtyping import Array, Float, PRNGKeyArray

from .._errors import branched_error_if
from .._model.ctbn import CTBN
from .._model.layout import num_configurations
from .._paths.sufficient_statistics import NodeStatistics, SufficientStatistics
from .conjugate import (
    gamma_log_density,
    gamma_poisson_log_marginal,
    off_diagonal,
    off_diagonal_entries,
    poisson_path_log_likelihood,
    with_zero_diagonal,
)
from .frames import rate_posterior_frame, sampled_inference_data
from .gamma_variates import gamma_variates
from .priors import GammaPrior, check_prior

if TYPE_CHECKING:
    import arviz
    import pandas as pd


class AbstractPosterior(eqx.Module):
    """A posterior that design criteria can score interventions for: the rates of a known graph
    ([`jaxctbn.RatePosterior`][]) or the graph itself ([`jaxctbn.StructurePosterior`][]).

    [`jaxctbn.score_interventions`][] dispatches through `score_with`: each posterior calls the
    criterion's method for its learning target, so a criterion implements one method per target
    and a new kind of posterior adds one method here, with no `isinstance` anywhere."""

    names: eqx.AbstractVar[tuple[str, ...]]

    @abc.abstractmethod
    def score_with(
        self, criterion: Any, candidates, initial_state, horizon, *, key, num_samples, solver,
        batching, outcome,
    ) -> Array:  # fmt: skip
        """`criterion.score_rates(self, ...)` or `criterion.score_structure(self, ...)`: one
        score per candidate intervention (larger = more informative); the keywords are those
        of [`jaxctbn.score_interventions`][]."""


class AbstractRatePosterior(AbstractPosterior):
    r"""A posterior over the rates of a CTBN with a known graph: one Gamma per rate
    ([`jaxctbn.RatePosterior`][]) or a weighted mixture of such
    ([`jaxctbn.GammaMixturePosterior`][], what panel data leave). The parameter criteria read
    it only through the methods below, so every criterion scores under either: the BHC from
    $\mathsf E[\Lambda]$ and $\mathsf E[\ln\Lambda]$, the VBHC's minimum and the EIG from the
    marginal likelihood of statistics, the Monte Carlo criteria from `sample`."""

    alpha: eqx.AbstractVar[tuple[Array, ...]]
    beta: eqx.AbstractVar[tuple[Array, ...]]
    cardinalities: eqx.AbstractVar[tuple[int, ...]]
    parents: eqx.AbstractVar[tuple[tuple[int, ...], ...]]

    def score_with(
        self, criterion, candidates, initial_state, horizon, *, key, num_samples, solver,
        batching, outcome,
    ):  # fmt: skip
        return criterion.score_rates(
            self, candidates, initial_state, horizon, key=key, num_samples=num_samples,
            solver=solver, batching=batching, outcome=outcome,
        )  # fmt: skip

    @abc.abstractmethod
    def rate_means(self) -> tuple[Float[Array, "_configs _k _k"], ...]:
        r"""$\mathsf E[\Lambda]$ per rate, shape `(configs, k, k)` per node (zero diagonal)."""

    @abc.abstractmethod
    def expected_log_rates(self) -> tuple[Float[Array, "_configs _k _k"], ...]:
        r"""$\mathsf E[\ln\Lambda]$ per free rate (zero on the diagonal and at structural
        zeros)."""

    @abc.abstractmethod
    def log_marginal_likelihood(self, pooled: Sequence[NodeStatistics]) -> Float[Array, ""]:
        r"""$\ln\int p(\Lambda)\prod\Lambda^{M}e^{-\Lambda T}\,d\Lambda$: the log marginal
        likelihood of complete-path statistics (one [`jaxctbn.internal.NodeStatistics`][] per
        node), the base measure of [`jaxctbn.path_log_likelihood`][] (so that
        $\ln p(S\mid\Lambda)-$ this is the log posterior ratio)."""

    @abc.abstractmethod
    def log_density(self, model: CTBN) -> Float[Array, ""]:
        r"""$\ln p(\Lambda)$ at the free rates of `model` (with respect to Lebesgue measure
        on them)."""

    @abc.abstractmethod
    def update(self, pooled: Sequence[NodeStatistics]) -> "AbstractRatePosterior":
        """The posterior after adding pooled complete-path statistics."""

    @abc.abstractmethod
    def mean(self) -> CTBN:
        """The CTBN with the posterior-mean rates."""

    @abc.abstractmethod
    def sample(self, key: PRNGKeyArray) -> CTBN:
        """One posterior draw of all rates (`jax.vmap` over keys for many)."""

    @abc.abstractmethod
    def mse(self, truth: CTBN) -> Float[Array, ""]:
        r"""Posterior-averaged squared error $\mathsf E[(\Lambda-\Lambda^*)^2]$ over the rates."""


class RatePosterior(AbstractRatePosterior):
    r"""Gamma posterior over the rates of a CTBN with a known graph.

    - `alpha[n]`: $\bar\alpha_n(x,x',u)$, shape `(configs, k, k)` (diagonal unused).
    - `beta[n]`: $\bar\beta_n(x,u)$, shape `(configs, k)`, shared over $x'$.

    Build with [`jaxctbn.RatePosterior.from_prior`][] (or `for_model`) and update with
    statistics.
    """

    alpha: tuple[Float[Array, "_configs _k _k"], ...]
    beta: tuple[Float[Array, "_configs _k"], ...]
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
        prior: GammaPrior = GammaPrior(),
    ) -> "RatePosterior":
        """The prior over the rates of the graph `parents`: a [`jaxctbn.GammaPrior`][] whose
        parameters are scalars or one value per node."""
        names, cards = tuple(names), tuple(int(k) for k in cardinalities)
        parents = tuple(tuple(int(p) for p in ps) for ps in parents)
        if not (len(names) == len(cards) == len(parents)):
            raise ValueError("names, cardinalities and parents need one entry per node.")
        if not isinstance(prior, GammaPrior):
            raise ValueError(
                f"prior: RatePosterior needs a GammaPrior (one Gamma per rate), got "
                f"{type(prior).__name__}."
            )
        check_prior(prior, len(names))
        alphas, betas = [], []
        for n, k in enumerate(cards):
            C = num_configurations(parents[n], cards)
            alpha, beta = prior.node_parameters(n)
            alphas.append(jnp.broadcast_to(alpha, (C, k, k)))
            betas.append(jnp.broadcast_to(beta, (C, k)))
        return cls(
            alpha=tuple(alphas),
            beta=tuple(betas),
            names=names,
            cardinalities=cards,
            parents=parents,
        )

    @classmethod
    def for_model(cls, model: CTBN, *, prior: GammaPrior = GammaPrior()) -> "RatePosterior":
        """The prior over the rates of `model`'s graph."""
        return cls.from_prior(model.names, model.cardinalities, model.parents, prior=prior)

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def update(self, pooled: Sequence[NodeStatistics]) -> "RatePosterior":
        r"""Add pooled statistics (one [`jaxctbn.internal.NodeStatistics`][] per node, for this graph):
        $\bar\alpha\mathrel{+}=M$, $\bar\beta\mathrel{+}=T$. Statistics must be finite and
        non-negative (checked inside jit; the check guards every `alpha` and `beta`)."""
        if len(pooled) != len(self.alpha):
            raise ValueError(f"statistics: need one entry per node ({len(self.alpha)}).")
        for n, (a, b, st) in enumerate(zip(self.alpha, self.beta, pooled)):
            if st.transitions.shape != a.shape or st.dwell_times.shape != b.shape:
                raise ValueError(
                    f"statistics of node {self.names[n]!r}: shapes {st.transitions.shape} and "
                    f"{st.dwell_times.shape}, expected {a.shape} and {b.shape}."
                )
        # one check over all nodes, attached to all statistics: every alpha and beta is guarded
        stats = [(st.transitions, st.dwell_times) for st in pooled]
        preds = jnp.stack(
            [jnp.any((M < 0) | ~jnp.isfinite(M)) for M, _ in stats]
            + [jnp.any((T < 0) | ~jnp.isfinite(T)) for _, T in stats]
        )
        msgs = [
            f"statistics of node {name!r}: transition counts must be finite and >= 0."
            for name in self.names
        ] + [
            f"statistics of node {name!r}: dwell times must be finite and >= 0."
            for name in self.names
        ]
        stats = branched_error_if(stats, preds.any(), jnp.argmax(preds), msgs)
        alphas, betas = [], []
        for a, b, (M, T) in zip(self.alpha, self.beta, stats):
            k = a.shape[-1]
            alphas.append(a + jnp.where(off_diagonal(k), M, 0.0))
            betas.append(b + T)
        return eqx.tree_at(lambda p: (p.alpha, p.beta), self, (tuple(alphas), tuple(betas)))

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def update_with(self, statistics: SufficientStatistics) -> "RatePosterior":
        """Add the statistics of a batch of experiments, pooled: node $n$ uses only the
        trajectories in which it was not perfectly intervened on."""
        if statistics.parents != self.parents:
            raise ValueError("statistics were computed for a different graph than the posterior.")
        return self.update(statistics.pooled())

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def rate_means(self) -> tuple[Float[Array, "_configs _k _k"], ...]:
        r"""$\bar\alpha/\bar\beta$ per rate (zero diagonal)."""
        return tuple(
            jnp.where(off_diagonal(a.shape[-1]), a / b[..., None], 0.0)
            for a, b in zip(self.alpha, self.beta)
        )

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def expected_log_rates(self) -> tuple[Float[Array, "_configs _k _k"], ...]:
        r"""$\psi(\bar\alpha)-\ln\bar\beta$ per rate (zero diagonal)."""
        out = []
        for a, b in zip(self.alpha, self.beta):
            off = off_diagonal(a.shape[-1])
            value = digamma(jnp.where(off, a, 1.0)) - jnp.log(b)[..., None]
            out.append(jnp.where(off, value, 0.0))
        return tuple(out)

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def log_marginal_likelihood(self, pooled: Sequence[NodeStatistics]) -> Float[Array, ""]:
        r"""$\sum[\ln\Gamma(\bar\alpha+M)-\ln\Gamma(\bar\alpha)+\bar\alpha\ln\bar\beta
        -(\bar\alpha+M)\ln(\bar\beta+T)]$ over the rates."""
        return jnp.asarray(
            sum(
                gamma_poisson_log_marginal(a, b, st.transitions, st.dwell_times)
                for a, b, st in zip(self.alpha, self.beta, pooled, strict=True)
            )
        )

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def log_density(self, model: CTBN) -> Float[Array, ""]:
        r"""$\sum\ln\mathrm{Gam}(\Lambda\mid\bar\alpha,\bar\beta)$ over the off-diagonal rates
        of `model`."""
        total = jnp.asarray(0.0)
        for a, b, q in zip(self.alpha, self.beta, model.cims):
            off = off_diagonal(a.shape[-1])
            terms = gamma_log_density(jnp.where(off, q, 1.0), jnp.where(off, a, 1.0), b[..., None])
            total = total + jnp.where(off, terms, 0.0).sum()
        return total

    def mean(self) -> CTBN:
        r"""The CTBN with posterior-mean rates $\bar\alpha/\bar\beta$."""
        cims = [a / b[..., None] for a, b in zip(self.alpha, self.beta)]
        return CTBN(cims=cims, parents=self.parents, names=self.names)

    def sample(self, key: PRNGKeyArray) -> CTBN:
        """One posterior draw of all rates (`jax.vmap` over keys for many)."""
        # every node's variates from one sampler call (one rejection loop in the program, not
        # one per node: a smaller program, compiled and traced faster)
        entries = [off_diagonal_entries(a) for a in self.alpha]
        flat = gamma_variates(key, jnp.concatenate([e.reshape(-1) for e in entries]))
        cims, start = [], 0
        for e, b in zip(entries, self.beta):
            draw = flat[start : start + e.size].reshape(e.shape)
            cims.append(with_zero_diagonal(draw) / b[..., None])
            start += e.size
        return CTBN(cims=cims, parents=self.parents, names=self.names)

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def mse(self, truth: CTBN) -> Float[Array, ""]:
        r"""Posterior-averaged squared error $\mathsf E[(\Lambda-\Lambda^*)^2]$, averaged over all
        off-diagonal rates: $\bar\alpha/\bar\beta^2 + (\bar\alpha/\bar\beta-\Lambda^*)^2$."""
        if truth.parents != self.parents or truth.cardinalities != self.cardinalities:
            raise ValueError("truth: must have the posterior's graph and cardinalities.")
        total, count = jnp.asarray(0.0), 0
        for a, b, q in zip(self.alpha, self.beta, truth.cims):
            k = a.shape[-1]
            mean = a / b[..., None]
            err = a / b[..., None] ** 2 + (mean - q) ** 2
            total = total + jnp.where(off_diagonal(k), err, 0.0).sum()
            count += a.shape[0] * k * (k - 1)
        return total / count

    def _off_diagonal(self) -> list[Array]:
        """Every off-diagonal rate, per node `(configs, k, k)`: a Gamma posterior's free rates."""
        return [jnp.broadcast_to(off_diagonal(a.shape[-1]), a.shape) for a in self.alpha]

    def to_frame(self, *, level: float = 0.95) -> pd.DataFrame:
        r"""The posterior as a pandas table, one row per off-diagonal rate: the table of
        [`GammaMixturePosterior.to_frame`][jaxctbn.GammaMixturePosterior.to_frame] for this
        posterior as a mixture of one component, the rows of `jaxctbn fit --posterior`'s
        `"rates"` with complete paths (for a network without structural zeros;
        [Files](../formats.md#python-results)).

        **Arguments:**

        - `level`: the central interval's level, in $(0, 1)$.

        **Returns:** a `pandas.DataFrame` with columns `node`, `parent_states` (`A=0,B=1`;
        `""` without parents), `from`, `to`, `mean` ($\bar\alpha/\bar\beta$), `sd`
        ($\sqrt{\bar\alpha}/\bar\beta$), `ci95_lower`, `ci95_upper` (the Gamma's quantiles;
        `ci90_...` at level 0.9). Eager, on the host."""
        from .gamma_mixture import GammaMixturePosterior  # (which imports this module)

        mixture = GammaMixturePosterior.from_gamma(self, free=self._off_diagonal())
        return rate_posterior_frame(mixture, level, "RatePosterior.to_frame")

    def to_inference_data(
        self, *, key: PRNGKeyArray, num_draws: int = 1000, num_chains: int = 4
    ) -> arviz.InferenceData:
        """Independent draws of the rates (`sample`) as ArviZ `InferenceData`, for
        `arviz.summary`, `arviz.plot_trace` and the like (needs `pip install arviz`).

        **Arguments:**

        - `key`: split into one key per draw.
        - `num_draws`, `num_chains`: the draws of each chain and the number of chains
          (independent draws, so each "chain" is a group of them).

        **Returns:** an `arviz.InferenceData` whose posterior group holds one variable per
        off-diagonal rate, named `NODE:X->Y` (`NODE|PARENT=STATE,...:X->Y` for a node with
        parents) as in `jaxctbn fit --draws-out`, with dimensions `chain` and `draw`."""
        return sampled_inference_data(
            self, self._off_diagonal(), key=key, num_draws=num_draws, num_chains=num_chains,
            what="RatePosterior.to_inference_data",
        )  # fmt: skip


def path_log_likelihood(model: CTBN, statistics: SufficientStatistics) -> Float[Array, ""]:
    r"""The log-likelihood of the observed paths given the rates of `model` (the paper's eq. for
    the experimental sequence, without the initial-state factor):
    $\sum_{n}\sum_{u,x,x'\ne x}[M_n(x,x',u)\ln\Lambda_n(x,x',u)-T_n(x,u)\Lambda_n(x,x',u)]$ over
    the pooled statistics, so a node contributes nothing from trajectories in which it was
    perfectly intervened on (its path is then fixed by the experimenter).

    Differentiable in the rates: use it to fit rates, imperfect-intervention strengths or a
    network that outputs rates by gradient descent. A transition observed where the model's rate
    is zero gives $-\infty$; negative or NaN rates are an error (`eqx.error_if`)."""
    if statistics.parents != model.parents or statistics.cardinalities != model.cardinalities:
        raise ValueError("statistics: computed for another graph or cardinalities than model.")
    cims = model.checked().cims  # a negative or NaN rate would give NaN, not an error
    return jnp.asarray(
        sum(
            poisson_path_log_likelihood(q, st.transitions, st.dwell_times)
            for q, st in zip(cims, statistics.pooled())
        )
    )
