r"""Conjugate priors over the rates of one CTBN node, as Modules.

A prior is a choice passed keyword-only (`prior=GammaPrior(1.0, 1.0)`) to everything that learns
or scores: [`jaxctbn.RatePosterior`][], [`jaxctbn.StructurePosterior`][],
[`jaxctbn.learn_structure`][], the learning tasks of the active-learning loop and the structure
design criteria. Its parameters are scalars or one value per node (arrays of shape `(N,)`), are
pytree leaves (changing them does not recompile) and must be $>0$.

Every prior gives, for node $n$ with statistics $(M, T)$ under a parent set with $|U|$
configurations, the log marginal likelihood, the log predictive likelihood of new statistics given
old ones, and the posterior mean and draws of the rates.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from .._errors import error_if
from .conjugate import (
    dirichlet_gamma_log_marginal,
    gamma_poisson_log_marginal,
    off_diagonal,
    off_diagonal_entries,
    with_zero_diagonal,
)
from .gamma_variates import gamma_variates


def json_value(v):
    """A hyper-parameter as JSON: a float, or a list of one per node."""
    return float(v) if np.ndim(v) == 0 else np.asarray(v, float).tolist()


#: A node's index: a Python int, or a traced integer scalar when a computation is vectorised over
#: nodes (the per-node prior values are then looked up by it).
NodeIndex = int | Int[Array, ""]


#: The largest hyper-parameter accepted. Above it the log marginal likelihoods lose every digit
#: that tells parent sets apart ($\ln\Gamma(\alpha+M)-\ln\Gamma(\alpha)$ is a difference of
#: numbers near $\alpha\ln\alpha$), and near float64's range they overflow to NaN.
MAX_HYPERPARAMETER = 1e8


def _range_message(name: str, value) -> str:
    return (
        f"{name}: prior parameters must be > 0 and finite, at most {MAX_HYPERPARAMETER:g}, got "
        f"{value}."
    )


def _positive_per_node(value, name: str):
    """A Python float for a scalar (so a default prior touches no JAX state at import), an array
    `(N,)` for one value per node; both must be in `(0, MAX_HYPERPARAMETER]` (checked when
    concrete; a traced value is checked where it is used, see `_node_value`)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not 0 < value <= MAX_HYPERPARAMETER:
            raise ValueError(_range_message(name, value))
        return float(value)
    try:
        arr = jnp.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(
            f"{name}: expected a positive number or one per node, got {value!r}."
        ) from None
    if arr.ndim > 1:
        raise ValueError(f"{name}: expected a scalar or one value per node, got shape {arr.shape}.")
    if not isinstance(arr, jax.core.Tracer) and not bool(
        jnp.all((arr > 0) & (arr <= MAX_HYPERPARAMETER))
    ):
        raise ValueError(_range_message(name, value))
    return arr


class AbstractPrior(eqx.Module):
    r"""A conjugate prior over the rates $\Lambda_n(x,x',u)$ of each node.

    Subclasses implement the four methods below for one node `node` whose statistics
    `transitions` $M$ `(configs, k, k)` and `dwell_times` $T$ `(configs, k)` are taken under a
    parent set with `num_configs` $|U|$ configurations (a traced integer is fine; padded
    configurations carry zero statistics and must contribute nothing).

    `hyperparameter_names` (a class attribute) names the fields that hold the prior's positive
    hyper-parameters (scalars or one value per node); [`jaxctbn.EmpiricalBayes`][] fits them.
    """

    hyperparameter_names: ClassVar[tuple[str, ...]] = ()
    #: Whether `log_predictive` is a sum over the configurations of terms that each depend on
    #: that configuration's statistics (and `num_configs`) only and vanish where its new
    #: statistics are zero. Then the structure criteria evaluate it per configuration, once
    #: for all candidate interventions that share it (a subclass that is not sure says False).
    factorises_over_configurations: ClassVar[bool] = False

    @abc.abstractmethod
    def log_marginal_likelihood(
        self, node: NodeIndex, transitions: Array, dwell_times: Array, num_configs: ArrayLike
    ) -> Float[Array, ""]:
        r"""$\ln p(M,T\mid P)$, **with** the prior's normalising terms."""

    @abc.abstractmethod
    def log_predictive(
        self,
        node: NodeIndex,
        transitions: Array,
        dwell_times: Array,
        history_transitions: Array,
        history_dwell_times: Array,
        num_configs: ArrayLike,
    ) -> Float[Array, ""]:
        r"""$\ln p(\hat M,\hat T\mid\bar M,\bar T,P)$: new statistics given the history's."""

    @abc.abstractmethod
    def posterior_mean_rates(
        self, node: NodeIndex, transitions: Array, dwell_times: Array, num_configs: ArrayLike
    ) -> Float[Array, "configs k k"]:
        """Posterior-mean rates (off-diagonal; the diagonal is zero)."""

    @abc.abstractmethod
    def sample_rates(
        self,
        node: NodeIndex,
        transitions: Array,
        dwell_times: Array,
        num_configs: ArrayLike,
        key: PRNGKeyArray,
    ) -> Float[Array, "configs k k"]:
        """One posterior draw of the rates (off-diagonal; the diagonal is zero)."""

    @abc.abstractmethod
    def settings(self) -> dict:
        """The prior as JSON, for a run's `config.json`: `{"prior": name, "alpha": ...,
        "beta": ...}`, each hyper-parameter a float or a list of one per node."""

    @abc.abstractmethod
    def check_num_nodes(self, num_nodes: int) -> None:
        """Raise `ValueError` if per-node parameters do not match `num_nodes`."""


def check_prior(prior, num_nodes: int) -> None:
    """`ValueError` unless `prior` is a prior Module whose per-node parameters match
    `num_nodes` (every entry point that takes `prior=` calls this before using it)."""
    if not isinstance(prior, AbstractPrior):
        raise ValueError(
            "prior: expected a prior Module such as GammaPrior(alpha, beta) or "
            f"NodelmanPrior(alpha, tau), got {prior!r}."
        )
    prior.check_num_nodes(num_nodes)


def _node_value(value, node: NodeIndex, name: str) -> Array:
    """Node `node`'s value of a scalar or per-node parameter. Concrete values were checked at
    construction; a traced one (a prior built inside jit or vmap) is checked here, and every
    use of the parameter goes through this."""
    out = jnp.asarray(value, dtype=float) if jnp.ndim(value) == 0 else value[node]
    if isinstance(value, jax.core.Tracer):
        out = error_if(
            out,
            ~(out > 0) | ~jnp.isfinite(out),
            f"{name}: prior parameters must be > 0 and finite.",
        )
    return out


def _check_length(value, num_nodes: int, name: str) -> None:
    if jnp.ndim(value) == 1 and jnp.shape(value)[0] != num_nodes:
        raise ValueError(
            f"{name}: need a scalar or one value per node ({num_nodes}), got {value.shape[0]}."
        )


class GammaPrior(AbstractPrior):
    r"""Independent $\Lambda_n(x,x',u)\sim\mathrm{Gam}(\alpha,\beta)$ for every rate (the paper's
    prior). Posterior $\mathrm{Gam}(\alpha+M,\beta+T)$; log marginal likelihood
    $\sum_{u,x\ne x'}[\ln\Gamma(\alpha+M)-\ln\Gamma(\alpha)+\alpha\ln\beta-(\alpha+M)\ln(\beta+T)]$
    (maths §5; the paper writes it "$\propto$" and drops $\alpha\ln\beta-\ln\Gamma(\alpha)$, which
    changes the ranking of parent sets of different sizes).

    **Arguments:** `alpha` (shape), `beta` (rate): scalars or one value per node, $>0$.
    """

    alpha: float | Float[Array, ""] | Float[Array, " nodes"]
    beta: float | Float[Array, ""] | Float[Array, " nodes"]
    hyperparameter_names: ClassVar[tuple[str, ...]] = ("alpha", "beta")
    factorises_over_configurations: ClassVar[bool] = True

    def __init__(self, alpha: ArrayLike = 1.0, beta: ArrayLike = 1.0):
        self.alpha = _positive_per_node(alpha, "alpha")
        self.beta = _positive_per_node(beta, "beta")

    def check_num_nodes(self, num_nodes: int) -> None:
        _check_length(self.alpha, num_nodes, "alpha")
        _check_length(self.beta, num_nodes, "beta")

    def settings(self) -> dict:
        return {"prior": "gamma", "alpha": json_value(self.alpha), "beta": json_value(self.beta)}

    def node_parameters(self, node: NodeIndex) -> tuple[Array, Array]:
        """$(\\alpha, \\beta)$ of `node`."""
        return _node_value(self.alpha, node, "alpha"), _node_value(self.beta, node, "beta")

    def log_marginal_likelihood(self, node, transitions, dwell_times, num_configs):
        alpha, beta = self.node_parameters(node)
        return gamma_poisson_log_marginal(alpha, beta, transitions, dwell_times)

    def log_predictive(
        self,
        node,
        transitions,
        dwell_times,
        history_transitions,
        history_dwell_times,
        num_configs,
    ):
        # conjugacy: the predictive is the marginal under the posterior Gam(alpha + M, beta + T)
        alpha, beta = self.node_parameters(node)
        k = transitions.shape[-1]
        a_bar = jnp.where(off_diagonal(k), alpha + history_transitions, 1.0)
        return gamma_poisson_log_marginal(
            a_bar, beta + history_dwell_times, transitions, dwell_times
        )

    def _posterior(self, node, transitions, dwell_times):
        alpha, beta = self.node_parameters(node)
        k = transitions.shape[-1]
        off = off_diagonal(k)
        a_bar = jnp.where(off, alpha + jnp.where(off, transitions, 0.0), 1.0)
        return a_bar, (beta + dwell_times)[..., None], off

    def posterior_mean_rates(self, node, transitions, dwell_times, num_configs):
        a_bar, b_bar, off = self._posterior(node, transitions, dwell_times)
        return jnp.where(off, a_bar / b_bar, 0.0)

    def sample_rates(self, node, transitions, dwell_times, num_configs, key):
        a_bar, b_bar, _ = self._posterior(node, transitions, dwell_times)
        rates = gamma_variates(key, off_diagonal_entries(a_bar), dtype=b_bar.dtype)
        return with_zero_diagonal(rates) / b_bar


class NodelmanPrior(AbstractPrior):
    r"""The Nodelman et al. (2003) family score, as CTBN-RLE computes it: exit rate
    $q_{xu}\sim\mathrm{Gam}(\alpha_{xu}+1,\tau_{xu})$ and next state
    $\sim\mathrm{Dir}(\alpha_{xx'u})$, with the imaginary counts spread evenly over the
    configurations: $\alpha_{xx'u}=\alpha/((k-1)k|U|)$, $\alpha_{xu}=(k-1)\alpha_{xx'u}$,
    $\tau_{xu}=\tau/(k|U|)$.

    **Arguments:** `alpha`, the total imaginary transition count, and `tau`, the total imaginary
    time: scalars or one value per node, $>0$.
    """

    alpha: float | Float[Array, ""] | Float[Array, " nodes"]
    tau: float | Float[Array, ""] | Float[Array, " nodes"]
    hyperparameter_names: ClassVar[tuple[str, ...]] = ("alpha", "tau")
    factorises_over_configurations: ClassVar[bool] = True

    def __init__(self, alpha: ArrayLike = 1.0, tau: ArrayLike = 1.0):
        self.alpha = _positive_per_node(alpha, "alpha")
        self.tau = _positive_per_node(tau, "tau")

    def check_num_nodes(self, num_nodes: int) -> None:
        _check_length(self.alpha, num_nodes, "alpha")
        _check_length(self.tau, num_nodes, "tau")

    def settings(self) -> dict:
        # `beta` is the total imaginary time `tau`, as `--beta` on the command line
        return {"prior": "nodelman", "alpha": json_value(self.alpha), "beta": json_value(self.tau)}

    def hyperparameters(self, node: NodeIndex, k: int, num_configs: ArrayLike, dtype) -> tuple:
        r"""$(\alpha_{xx'u}, \tau_{xu})$ of `node` with `k` states and `num_configs` parent
        configurations."""
        U = jnp.asarray(num_configs, dtype)
        a_xx = _node_value(self.alpha, node, "alpha") / ((k - 1) * k * U)
        tau = _node_value(self.tau, node, "tau") / (k * U)
        return a_xx, tau

    def log_marginal_likelihood(self, node, transitions, dwell_times, num_configs):
        k = transitions.shape[-1]
        a_xx, tau = self.hyperparameters(node, k, num_configs, dwell_times.dtype)
        return dirichlet_gamma_log_marginal(a_xx, tau, transitions, dwell_times)

    def log_predictive(
        self,
        node,
        transitions,
        dwell_times,
        history_transitions,
        history_dwell_times,
        num_configs,
    ):
        # conjugacy: p(new | old) = p(old + new) / p(old)
        both = self.log_marginal_likelihood(
            node,
            history_transitions + transitions,
            history_dwell_times + dwell_times,
            num_configs,
        )
        old = self.log_marginal_likelihood(
            node, history_transitions, history_dwell_times, num_configs
        )
        return both - old

    def _posterior(self, node, transitions, dwell_times, num_configs):
        k = transitions.shape[-1]
        off = off_diagonal(k)
        a_xx, tau = self.hyperparameters(node, k, num_configs, dwell_times.dtype)
        M = jnp.where(off, transitions, 0.0)
        shape = (k - 1) * a_xx + M.sum(-1) + 1
        rate = tau + dwell_times
        concentration = jnp.where(off, a_xx + M, 1.0)
        return shape, rate, concentration, off

    def posterior_mean_rates(self, node, transitions, dwell_times, num_configs):
        shape, rate, conc, off = self._posterior(node, transitions, dwell_times, num_configs)
        conc = jnp.where(off, conc, 0.0)
        return (shape / rate)[..., None] * conc / conc.sum(-1, keepdims=True)

    def sample_rates(self, node, transitions, dwell_times, num_configs, key):
        shape, rate, conc, off = self._posterior(node, transitions, dwell_times, num_configs)
        # the exit rates' and the next states' Gamma variates from one sampler call (one
        # rejection loop in the program, not two)
        entries = off_diagonal_entries(conc)
        both = jnp.concatenate([shape.reshape(-1), entries.reshape(-1)])
        variates = gamma_variates(key, both, dtype=rate.dtype)
        q = variates[: shape.size].reshape(shape.shape) / rate
        g = with_zero_diagonal(variates[shape.size :].reshape(entries.shape))
        return q[..., None] * g / g.sum(-1, keepdims=True)
