r"""A rate posterior that is a weighted mixture of Gamma posteriors: what is believed about the
rates of a known graph after data whose paths are not seen whole (panels).

With complete paths the posterior is one Gamma per rate ([`jaxctbn.RatePosterior`][]). When
the paths are hidden, $p(\Lambda\mid Y)=\int p(\Lambda\mid S)\,p(S\mid Y)\,dS$, and every
$p(\Lambda\mid S)$ is such a Gamma, so posterior draws of the hidden paths $S_c$ give the
Rao-Blackwellised estimate

$$p(\Lambda\mid Y)\approx\sum_cw_c\prod_{n,u,x,x'}\mathrm{Gam}\bigl(\Lambda_n(x,x',u)\mid
\alpha_c,\ \beta_c\bigr),\qquad \alpha_c=\alpha+M(S_c),\ \beta_c=\beta+T(S_c),$$

exact as the number of components grows (the components are dependent across rates only
through their common path). New complete-path statistics update each component conjugately
and reweight it by its marginal likelihood, so the mixture stays a mixture.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jax.scipy.special import digamma, gammainc
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from .._model.ctbn import CTBN
from .._model.frames import rate_draws_inference_data
from .._paths.sufficient_statistics import NodeStatistics
from .chain_diagnostics import effective_sample_size, split_r_hat
from .conjugate import gamma_log_density, gamma_poisson_log_marginal, off_diagonal
from .frames import rate_posterior_frame, sampled_inference_data
from .posterior import AbstractRatePosterior, RatePosterior

if TYPE_CHECKING:
    import arviz
    import pandas as pd


class ChainDiagnostics(eqx.Module):
    r"""The Markov chains behind a sampled posterior and their convergence, per rate (the
    layout of `alpha`; diagonal entries and structural zeros: $\hat R$ 1, ESS the draws'
    total):

    - `rate_draws[n]`: the chains' retained draws of node $n$'s rates, `(chains, draws,
      configs, k, k)` (e.g. for ArviZ);
    - `split_r_hat[n]`, `effective_sample_size[n]`: of the log-rate draws over all chains
      (`split_r_hat`, `effective_sample_size`);
    - `divergent_transitions`: the number of divergent transitions (Hamiltonian samplers).
    """

    rate_draws: tuple[Float[Array, "chains draws _configs _k _k"], ...]
    split_r_hat: tuple[Float[Array, "_configs _k _k"], ...]
    effective_sample_size: tuple[Float[Array, "_configs _k _k"], ...]
    divergent_transitions: Int[Array, ""]

    @classmethod
    def from_draws(
        cls,
        draws: Sequence[Float[Array, "chains draws _configs _k _k"]],
        divergent_transitions,
        free: Sequence[Bool[Array, "_configs _k _k"]] | None = None,
    ):
        """From each node's rate draws `(chains, draws, configs, k, k)`, the number of
        divergent transitions (0 for a sampler without) and the free rates (`None`: every
        off-diagonal rate)."""
        r_hats, sizes = [], []
        for n, d in enumerate(draws):
            k = d.shape[-1]
            keep = off_diagonal(k) if free is None else free[n] & off_diagonal(k)
            logs = jnp.log(jnp.where(keep, d, 1.0))
            r_hats.append(jnp.where(keep, split_r_hat(logs), 1.0))
            total = float(d.shape[0] * (d.shape[1] // 2 * 2))
            sizes.append(jnp.where(keep, effective_sample_size(logs), total))
        return cls(
            rate_draws=tuple(draws),
            split_r_hat=tuple(r_hats),
            effective_sample_size=tuple(sizes),
            divergent_transitions=jnp.asarray(divergent_transitions),
        )

    def max_split_r_hat(self) -> Float[Array, ""]:
        """The largest split-$\\hat R$ over all rates."""
        return jnp.max(jnp.stack([r.max() for r in self.split_r_hat]))

    def min_effective_sample_size(self) -> Float[Array, ""]:
        """The smallest effective sample size over all rates."""
        return jnp.min(jnp.stack([e.min() for e in self.effective_sample_size]))


class GammaMixturePosterior(AbstractRatePosterior):
    r"""A posterior over the rates of a CTBN with a known graph that is a weighted mixture of
    independent-Gamma components (the module page above).

    - `alpha[n]`: $\alpha_c(x,x',u)$ per component, shape `(components, configs, k, k)`
      (diagonal unused).
    - `beta[n]`: $\beta_c(x,u)$, shape `(components, configs, k)`, shared over $x'$.
    - `log_weights`: $\ln w_c$, shape `(components,)`, normalised ($\sum_cw_c=1$).
    - `free`: per node, which rates are free `(configs, k, k)`; the others are structural
      zeros (exactly 0 under the posterior: mean, s.d., quantiles and draws). `None`: every
      off-diagonal rate is free.
    - `diagnostics`: the [`jaxctbn.internal.ChainDiagnostics`][] of the chains that produced
      the components, or `None`.

    A [`jaxctbn.RatePosterior`][] is the mixture of one component
    ([`jaxctbn.GammaMixturePosterior.from_gamma`][]). Pure; works under `jit` and `vmap`.
    """

    alpha: tuple[Float[Array, "_components _configs _k _k"], ...]
    beta: tuple[Float[Array, "_components _configs _k"], ...]
    log_weights: Float[Array, " _components"]
    names: tuple[str, ...] = eqx.field(static=True)
    cardinalities: tuple[int, ...] = eqx.field(static=True)
    parents: tuple[tuple[int, ...], ...] = eqx.field(static=True)
    free: tuple[Bool[Array, "_configs _k _k"], ...] | None = None
    diagnostics: ChainDiagnostics | None = None

    def __check_init__(self):
        if not (len(self.alpha) == len(self.beta) == len(self.names) == len(self.parents)):
            raise ValueError("alpha, beta, names and parents need one entry per node.")
        C = self.log_weights.shape[0]
        for n, (a, b) in enumerate(zip(self.alpha, self.beta)):
            if a.ndim != 4 or b.ndim != 3 or a.shape[0] != C or b.shape != a.shape[:-1]:
                raise ValueError(
                    f"alpha[{n}], beta[{n}]: expected shapes (components, configs, k, k) and "
                    f"(components, configs, k) with {C} components, got {a.shape} and {b.shape}."
                )

    @classmethod
    def from_gamma(
        cls,
        posterior: RatePosterior,
        *,
        free: Sequence[Bool[ArrayLike, "_configs _k _k"]] | None = None,
    ) -> "GammaMixturePosterior":
        """The mixture of one component: `posterior` itself, with structural zeros where
        `free` (one boolean table per node) is false (e.g. `free=[q != 0 for q in
        model.cims]` keeps a model's zero rates at zero)."""
        if not isinstance(posterior, RatePosterior):
            raise ValueError(
                f"posterior: expected a RatePosterior, got {type(posterior).__name__}."
            )
        return cls(
            alpha=tuple(a[None] for a in posterior.alpha),
            beta=tuple(b[None] for b in posterior.beta),
            log_weights=jnp.zeros((1,), posterior.alpha[0].dtype),
            names=posterior.names,
            cardinalities=posterior.cardinalities,
            parents=posterior.parents,
            free=None if free is None else tuple(jnp.asarray(f, bool) for f in free),
        )

    def free_rates(self) -> tuple[Bool[Array, "_configs _k _k"], ...]:
        """Per node, the free off-diagonal rates (structural zeros and the diagonal false)."""
        # (configs, k, k) in every case: without `free`, the off-diagonal of every
        # configuration (a (k, k) mask would count one configuration in `mse`'s average)
        return tuple(
            jnp.broadcast_to(
                (off_diagonal(a.shape[-1]) if self.free is None else self.free[n])
                & off_diagonal(a.shape[-1]),
                a.shape[1:],
            )
            for n, a in enumerate(self.alpha)
        )

    @property
    def num_components(self) -> int:
        return self.log_weights.shape[0]

    def weights(self) -> Float[Array, " _components"]:
        return jax.nn.softmax(self.log_weights)

    def component(self, c) -> RatePosterior:
        """Component `c` as a [`jaxctbn.RatePosterior`][] (`c` may be traced)."""
        return RatePosterior(
            alpha=tuple(a[c] for a in self.alpha),
            beta=tuple(b[c] for b in self.beta),
            names=self.names,
            cardinalities=self.cardinalities,
            parents=self.parents,
        )

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def rate_means(self) -> tuple[Float[Array, "_configs _k _k"], ...]:
        r"""$\mathsf E[\Lambda]=\sum_cw_c\alpha_c/\beta_c$ per rate (zero diagonal)."""
        w = self.weights()
        return tuple(
            jnp.where(keep, jnp.einsum("c,c...->...", w, a / b[..., None]), 0.0)
            for a, b, keep in zip(self.alpha, self.beta, self.free_rates())
        )

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def rate_sds(self) -> tuple[Float[Array, "_configs _k _k"], ...]:
        r"""The posterior standard deviation per rate:
        $\mathrm{Var}=\sum_cw_c(\alpha_c/\beta_c^2+\alpha_c^2/\beta_c^2)-\mathsf E[\Lambda]^2$."""
        w = self.weights()
        out = []
        for a, b, mean, keep in zip(self.alpha, self.beta, self.rate_means(), self.free_rates()):
            second = jnp.einsum("c,c...->...", w, a * (a + 1) / b[..., None] ** 2)
            out.append(jnp.where(keep, jnp.sqrt(jnp.maximum(second - mean**2, 0)), 0.0))
        return tuple(out)

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def rate_quantiles(
        self, probabilities: Float[Array, " q"], *, bisections: int = 80
    ) -> tuple[Float[Array, "q _configs _k _k"], ...]:
        r"""Quantiles of each rate's marginal posterior, the mixture's CDF
        $\sum_cw_cP(\alpha_c,\beta_cx)$ ($P$ the regularised lower incomplete Gamma function)
        inverted by `bisections` steps of bisection on $\ln x$ (relative error about
        $2^{-\text{bisections}}$ of the bracket's log-width). Diagonal entries 0."""
        p = jnp.asarray(probabilities)
        w = self.weights()
        out = []
        for a, b, keep in zip(self.alpha, self.beta, self.free_rates()):
            a1 = jnp.where(keep, a, 1.0)
            b1 = jnp.broadcast_to(b[..., None], a.shape)
            # a bracket holding every component's bulk: means / 1e6 .. means * 1e3 + 50 sds
            means, sds = a1 / b1, jnp.sqrt(a1) / b1
            lo = jnp.log(jnp.min(means, 0) * 1e-6 + 1e-300)
            hi = jnp.log(jnp.max(means + 50 * sds, 0) * 1e3)

            def cdf(x, a1=a1, b1=b1):
                return jnp.einsum("c,c...->...", w, gammainc(a1, b1 * x))

            def one(q, lo=lo, hi=hi, cdf=cdf):
                def step(bounds, _):
                    low, high = bounds
                    mid = 0.5 * (low + high)
                    below = cdf(jnp.exp(mid)) < q
                    return (jnp.where(below, mid, low), jnp.where(below, high, mid)), None

                (low, high), _ = jax.lax.scan(step, (lo, hi), None, length=bisections)
                return jnp.exp(0.5 * (low + high))

            out.append(jnp.where(keep, jax.vmap(one)(p), 0.0))
        return tuple(out)

    def mean(self) -> CTBN:
        r"""The CTBN with posterior-mean rates $\mathsf E[\Lambda]$."""
        return CTBN(cims=list(self.rate_means()), parents=self.parents, names=self.names)

    def sample(self, key: PRNGKeyArray) -> CTBN:
        """One posterior draw of all rates: a component by its weight, then its Gammas
        (`jax.vmap` over keys for many)."""
        key_component, key_rates = jr.split(key)
        c = jr.categorical(key_component, self.log_weights)
        return self.component_sample(c, key_rates)

    def component_sample(self, c, key: PRNGKeyArray) -> CTBN:
        """One draw of all rates from component `c` (structural zeros kept at zero)."""
        draw = self.component(c).sample(key)
        if self.free is None:
            return draw
        cims = [jnp.where(keep, q, 0.0) for q, keep in zip(draw.cims, self.free_rates())]
        return CTBN(cims=cims, parents=self.parents, names=self.names)

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def expected_log_rates(self) -> tuple[Float[Array, "_configs _k _k"], ...]:
        r"""$\mathsf E[\ln\Lambda]=\sum_cw_c(\psi(\alpha_c)-\ln\beta_c)$ per free rate (zero on
        the diagonal and at structural zeros)."""
        w = self.weights()
        out = []
        for a, b, keep in zip(self.alpha, self.beta, self.free_rates()):
            value = digamma(jnp.where(keep, a, 1.0)) - jnp.log(b)[..., None]
            out.append(jnp.where(keep, jnp.einsum("c,c...->...", w, value), 0.0))
        return tuple(out)

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def component_log_marginals(self, pooled: Sequence[NodeStatistics]) -> Float[Array, " _c"]:
        r"""Each component's log marginal likelihood of complete-path statistics,
        $\ln p(M,T\mid\alpha_c,\beta_c)$ over its free rates (a structural zero must have
        $M=0$ and contributes nothing)."""
        free = self.free_rates()

        def log_marginal(c):
            total = jnp.asarray(0.0)
            for a, b, st, keep in zip(self.alpha, self.beta, pooled, free, strict=True):
                total = total + gamma_poisson_log_marginal(
                    a[c], b[c], st.transitions, st.dwell_times
                )
                # a structural zero (M = 0) adds alpha (ln b - ln(b + T)) there: taken out
                fixed = ~keep & off_diagonal(keep.shape[-1])
                ratio = jnp.log(b[c]) - jnp.log(b[c] + st.dwell_times)
                total = total - jnp.where(fixed, a[c] * ratio[..., None], 0.0).sum()
            return total

        return jax.vmap(log_marginal)(jnp.arange(self.num_components))

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def log_marginal_likelihood(self, pooled: Sequence[NodeStatistics]) -> Float[Array, ""]:
        r"""$\ln\sum_cw_c\,p(M,T\mid\alpha_c,\beta_c)$."""
        return jax.nn.logsumexp(self.log_weights + self.component_log_marginals(pooled))

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def log_density(self, model: CTBN) -> Float[Array, ""]:
        r"""$\ln\sum_cw_c\prod\mathrm{Gam}(\Lambda\mid\alpha_c,\beta_c)$ over the free rates of
        `model`."""
        free = self.free_rates()

        def component(c):
            total = jnp.asarray(0.0)
            for a, b, q, keep in zip(self.alpha, self.beta, model.cims, free):
                terms = gamma_log_density(
                    jnp.where(keep, q, 1.0), jnp.where(keep, a[c], 1.0), b[c][..., None]
                )
                total = total + jnp.where(keep, terms, 0.0).sum()
            return total

        per_component = jax.vmap(component)(jnp.arange(self.num_components))
        return jax.nn.logsumexp(self.log_weights + per_component)

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def moment_matched(self) -> RatePosterior:
        r"""A Gamma per rate near the mixture: for each rate its mean $m$ and variance $v$ give
        $\beta(x,u)$ = the mean over $x'$ of $m/v$ (the family shares $\beta$ over $x'$; exact
        for binary nodes) and $\alpha=m\beta$, so the means are the mixture's. (The start
        of a variational search; not a posterior to report.)"""
        alphas, betas = [], []
        for mean, sd, keep in zip(self.rate_means(), self.rate_sds(), self.free_rates()):
            k = mean.shape[-1]
            ratio = jnp.where(keep, mean / jnp.maximum(sd, 1e-300) ** 2, 0.0)
            count = jnp.maximum(keep.sum(-1), 1)
            beta = jnp.where(keep.any(-1), ratio.sum(-1) / count, 1.0)
            alphas.append(
                jnp.where(keep, mean * beta[..., None], jnp.where(off_diagonal(k), 1.0, 0.0))
            )
            betas.append(beta)
        return RatePosterior(
            alpha=tuple(alphas),
            beta=tuple(betas),
            names=self.names,
            cardinalities=self.cardinalities,
            parents=self.parents,
        )

    def effective_sample_size(self) -> Float[Array, ""]:
        r"""Kish's effective number of components, $1/\sum_cw_c^2$ (equal weights: the number
        of components)."""
        return 1.0 / jnp.sum(self.weights() ** 2)

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def update(self, pooled: Sequence[NodeStatistics]) -> "GammaMixturePosterior":
        r"""Add pooled complete-path statistics (one [`jaxctbn.internal.NodeStatistics`][] per
        node): each component $\alpha_c\mathrel{+}=M$, $\beta_c\mathrel{+}=T$, reweighted by its
        marginal likelihood of the statistics, $w_c\propto w_c\,p(M,T\mid\alpha_c,\beta_c)$."""
        marginals = self.component_log_marginals(pooled)
        updated = jax.vmap(lambda c: self.component(c).update(pooled))(
            jnp.arange(self.num_components)
        )
        log_weights = self.log_weights + marginals
        return GammaMixturePosterior(
            alpha=updated.alpha,
            beta=updated.beta,
            log_weights=log_weights - jax.nn.logsumexp(log_weights),
            names=self.names,
            cardinalities=self.cardinalities,
            parents=self.parents,
            free=self.free,
        )

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def mse(self, truth: CTBN) -> Float[Array, ""]:
        r"""Posterior-averaged squared error $\mathsf E[(\Lambda-\Lambda^*)^2]$, averaged over all
        off-diagonal rates: $\mathrm{Var}+(\mathsf E\Lambda-\Lambda^*)^2$."""
        if truth.parents != self.parents or truth.cardinalities != self.cardinalities:
            raise ValueError("truth: must have the posterior's graph and cardinalities.")
        total, count = jnp.asarray(0.0), 0
        for mean, sd, q, keep in zip(
            self.rate_means(), self.rate_sds(), truth.cims, self.free_rates()
        ):
            total = total + jnp.where(keep, sd**2 + (mean - q) ** 2, 0.0).sum()
            count = count + keep.sum()
        return total / count

    def to_frame(self, *, level: float = 0.95) -> pd.DataFrame:
        r"""The posterior as a pandas table, one row per free rate: the rows and names of
        `jaxctbn fit --posterior`'s `"rates"` ([Files](../formats.md#python-results)).

        **Arguments:**

        - `level`: the central interval's level, in $(0, 1)$.

        **Returns:** a `pandas.DataFrame` with columns `node`, `parent_states` (`A=0,B=1`;
        `""` without parents), `from`, `to` (the rate's position), `mean`, `sd` (`rate_means`,
        `rate_sds`), `ci95_lower`, `ci95_upper` (`rate_quantiles` at $(1\mp\text{level})/2$;
        `ci90_...` at level 0.9) and, with `diagnostics`, each rate's `split_r_hat` and `ess`.
        Eager, on the host."""
        return rate_posterior_frame(self, level, "GammaMixturePosterior.to_frame")

    def to_inference_data(
        self, *, key: PRNGKeyArray | None = None, num_draws: int = 1000, num_chains: int = 4
    ) -> arviz.InferenceData:
        """The free rates' draws as ArviZ `InferenceData`, for `arviz.summary`,
        `arviz.plot_trace` and the like (needs `pip install arviz`): without `key`, the draws
        of the chains that produced this posterior (`diagnostics.rate_draws`, e.g. of
        [`jaxctbn.panel.SampledGammaMixture`][]); with `key`, independent draws of `sample`.

        **Arguments:**

        - `key`: `None` (the chains' draws; a posterior without `diagnostics` refuses it with
          a `ValueError`) or a key, split into one key per draw.
        - `num_draws`, `num_chains`: with `key`, the draws of each chain and the number of
          chains (independent draws, so each "chain" is a group of them).

        **Returns:** an `arviz.InferenceData` whose posterior group holds one variable per free
        rate, named `NODE:X->Y` (`NODE|PARENT=STATE,...:X->Y` for a node with parents) with
        dimensions `chain` and `draw`: what `jaxctbn fit --posterior --draws-out x.nc`
        writes."""
        what = "GammaMixturePosterior.to_inference_data"
        if key is not None:
            return sampled_inference_data(
                self, self.free_rates(), key=key, num_draws=num_draws, num_chains=num_chains,
                what=what,
            )  # fmt: skip
        if self.diagnostics is None:
            raise ValueError(
                "key: this posterior has no chains (diagnostics is None); give key= to draw "
                "from it."
            )
        return rate_draws_inference_data(self, self.free_rates(), self.diagnostics.rate_draws, what)
