r"""The Gamma / Poisson / Dirichlet formulas of CTBN learning, written once.

A node's statistics under one parent set are transition counts $M(x,x',u)$ (shape
`(configs, k, k)`, diagonal unused) and dwell times $T(x,u)$ (shape `(configs, k)`). Every
function here sums over the off-diagonal entries only, and never evaluates anything on the
diagonal (so no NaN can leak in from it).

- [`poisson_path_log_likelihood`][]: $\sum_{u,x\ne x'}[M\ln\Lambda-T\Lambda]$, the CTBN path
  likelihood (maths §1), with $0\ln0=0$.
- [`gamma_poisson_log_marginal`][]: $\sum_{u,x\ne x'}[\ln\Gamma(\alpha+M)-\ln\Gamma(\alpha)
  +\alpha\ln\beta-(\alpha+M)\ln(\beta+T)]$, the Gamma-Poisson marginal likelihood. With the
  prior $(\alpha,\beta)$ it is the structure score (maths §5), with the posterior
  $(\bar\alpha,\bar\beta)$ and the statistics of a future path the predictive likelihood (maths
  §5), and it is the data term of the closed-form VBHC minimum (maths §3).
  [`gamma_poisson_log_gamma_table`][] tabulates its $\ln\Gamma$ terms for counts added to
  fixed ones (the structure EIG rescores many sampled paths against one history).
- [`dirichlet_gamma_log_marginal`][]: the Nodelman et al. (2003) family score (exit rate
  Gamma, next state Dirichlet), as CTBN-RLE computes it.
- [`gamma_log_density`][], [`gamma_kl`][].
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.scipy.special import digamma, gammaln
from jaxtyping import Array, ArrayLike, Float


def off_diagonal(k: int) -> Array:
    """Boolean mask of the off-diagonal entries of a $k\\times k$ table."""
    return ~jnp.eye(k, dtype=bool)


#: Up to this many states the marginal takes the off-diagonal entries as static slices (one
#: per entry, so not for large tables, whose programs would grow like k^2).
_SLICED_UP_TO = 8


def sum_of_entries(x: Float[Array, "*shape"]) -> Float[Array, ""]:
    r"""The sum of all entries of `x`, as a dot product with ones. The same number as
    `x.sum()`, but XLA computes the (expensive, element-wise) producers of a reduction inside
    the reduction's loop, and on a CPU that loop is not vectorised: for the terms of
    [`gamma_poisson_log_marginal`][] ($\ln\Gamma$, logarithms) the reduction is several
    times slower than the dot product, which takes its operand from a vectorised element-wise
    loop (the structure design step, which sums these terms, is timed in
    `benchmarks/criteria/bench_design_step.py`; results in `benchmarks/results/design_step.md`)."""
    flat = jnp.reshape(x, -1)
    return flat @ jnp.ones_like(flat)


def off_diagonal_entries(tables: Float[Array, "*batch k k"]) -> Float[Array, "*batch km1 k"]:
    r"""The $k(k-1)$ off-diagonal entries of `(..., k, k)` tables, as `(..., k - 1, k)` (a
    reshape, no gather: drop entry $(0,0)$, view the rest as rows of $k+1$, drop the last
    column, which holds the diagonal). [`with_zero_diagonal`][] puts them back."""
    k = tables.shape[-1]
    batch = tables.shape[:-2]
    flat = tables.reshape(*batch, k * k)[..., 1:]
    return flat.reshape(*batch, k - 1, k + 1)[..., :k]


def with_zero_diagonal(entries: Float[Array, "*batch km1 k"]) -> Float[Array, "*batch k k"]:
    """The `(..., k, k)` tables whose off-diagonal entries are `entries` (as
    [`off_diagonal_entries`][] lays them out) and whose diagonal is zero."""
    k = entries.shape[-1]
    batch = entries.shape[:-2]
    zero = jnp.zeros((*batch, k - 1, 1), entries.dtype)
    flat = jnp.concatenate([entries, zero], axis=-1).reshape(*batch, (k - 1) * (k + 1))
    flat = jnp.concatenate([jnp.zeros((*batch, 1), entries.dtype), flat], axis=-1)
    return flat.reshape(*batch, k, k)


#: Arguments at or above which the Stirling series of `log_gamma_positive` is used directly.
_STIRLING_FROM = 10
#: The Bernoulli terms $B_{2m}/(2m(2m-1))$, $m=1..7$, of the Stirling series.
_STIRLING = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360, 1 / 156)


def log_gamma_positive(x: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
    r"""$\ln\Gamma(x)$ for $x>0$ (every argument in this module is positive), faster than
    `jax.scipy.special.gammaln` on a CPU (no reflection branch). For $x\ge10$ the
    Stirling series with seven terms, $(x-\tfrac12)\ln x-x+\tfrac12\ln2\pi
    +\sum_{m=1}^7\frac{B_{2m}}{2m(2m-1)x^{2m-1}}$ (truncation below 1e-17 there); below, the
    same at $x+10$ less $\ln\prod_{i=0}^{9}(x+i)$. Absolute error about 1e-14 in float64
    (`tests/learning/test_conjugate.py` checks it against SciPy); differentiable."""
    x = jnp.asarray(x)
    small = x < _STIRLING_FROM
    z = jnp.where(small, x + _STIRLING_FROM, x)
    r = 1 / z
    r2 = r * r
    series = jnp.asarray(_STIRLING[-1], x.dtype)
    for b in _STIRLING[-2::-1]:
        series = b + r2 * series
    stirling = (z - 0.5) * jnp.log(z) - z + 0.5 * jnp.log(2 * jnp.pi) + r * series
    shifted = jnp.where(small, x, 1)  # bounded factors: no overflow, finite gradients
    product = shifted
    for i in range(1, _STIRLING_FROM):
        product = product * (shifted + i)
    return stirling - jnp.where(small, jnp.log(product), 0)


def poisson_path_log_likelihood(
    rates: Float[Array, "*configs k k"],
    transitions: Float[Array, "*configs k k"],
    dwell_times: Float[Array, "*configs k"],
) -> Float[Array, ""]:
    r"""$\sum_{u,x\ne x'}[M(x,x',u)\ln\Lambda(x,x',u)-T(x,u)\Lambda(x,x',u)]$ with $0\ln0=0$
    (a transition where the rate is zero gives $-\infty$). Differentiable in the rates."""
    k = rates.shape[-1]
    off = off_diagonal(k)
    M = jnp.where(off, transitions, 0.0)
    lam = jnp.where(off, rates, 0.0)
    log_lam = jnp.where(M > 0, jnp.log(jnp.where(M > 0, lam, 1.0)), 0.0)
    return (M * log_lam - dwell_times[..., None] * lam).sum()


def gamma_poisson_log_marginal(
    alpha: ArrayLike,
    beta: ArrayLike,
    transitions: Float[Array, "*configs k k"],
    dwell_times: Float[Array, "*configs k"],
    *,
    log_gamma: Float[Array, "*configs k k"] | None = None,
) -> Float[Array, ""]:
    r"""$\sum_{u,x\ne x'}[\ln\Gamma(\alpha+M)-\ln\Gamma(\alpha)+\alpha\ln\beta
    -(\alpha+M)\ln(\beta+T)]$: the log marginal likelihood of counts $M$ and dwell times $T$ under
    independent $\mathrm{Gam}(\alpha,\beta)$ rates. `alpha` broadcasts against the transitions
    `(configs, k, k)` (per rate), `beta` against the dwell times `(configs, k)` (shared over
    $x'$). Configurations with zero statistics contribute 0. `log_gamma`: $\ln\Gamma(\alpha+M)$
    when the caller has it already (looked up from [`gamma_poisson_log_gamma_table`][]; the
    same numbers, far cheaper than evaluating $\ln\Gamma$)."""
    dtype = dwell_times.dtype
    shape = jnp.broadcast_shapes(jnp.shape(transitions), jnp.shape(dwell_times)[:-1] + (1, 1))
    k = shape[-1]
    if k <= _SLICED_UP_TO:  # the k(k-1) off-diagonal entries as static slices (a reshape of
        # the flat tables, as `off_diagonal_entries` does, costs a copy here)
        pairs = [(x, y) for x in range(k) for y in range(k) if x != y]

        def entries(z):
            z = jnp.broadcast_to(z, shape)
            return jnp.stack([z[..., x, y] for x, y in pairs], axis=-1)

        keep = None
    else:  # many states: the full tables with a finite diagonal, masked (k(k-1) slices would
        # grow the program like k^2)

        def entries(z):
            return jnp.broadcast_to(z, shape)

        keep = off_diagonal(k)
    b = jnp.asarray(beta, dtype)
    a = entries(jnp.asarray(alpha, dtype))
    M = entries(transitions)
    if keep is not None:
        a, M = jnp.where(keep, a, 1.0), jnp.where(keep, M, 0.0)
    # the logarithms per (configuration, state), before spreading over the next states
    log_b = entries(jnp.log(b)[..., None])
    log_b_T = entries(jnp.log(b + dwell_times)[..., None])
    log_gamma = log_gamma_positive(a + M) if log_gamma is None else entries(log_gamma)
    terms = log_gamma - log_gamma_positive(a) + a * log_b - (a + M) * log_b_T
    if keep is not None:
        terms = jnp.where(keep, terms, 0.0)
    # summed as a dot product (`sum_of_entries` says why; the structure design step is timed
    # in `benchmarks/criteria/bench_design_step.py`, results in `benchmarks/results/design_step.md`)
    return sum_of_entries(terms)


def gamma_poisson_log_gamma_table(
    alpha: ArrayLike, transitions: Float[Array, "*configs k k"], max_count: int
) -> Float[Array, "*configs k k counts"]:
    r"""$\ln\Gamma(\alpha+M+m)$ for every entry of `transitions` $M$ and every number of new
    jumps $m=0,\dots,$`max_count` (off the diagonal; the diagonal is unused): for many sets of
    new counts $\hat M\le$ `max_count` added to the same $M$ (sampled paths), the
    $\ln\Gamma(\alpha+M+\hat M)$ of [`gamma_poisson_log_marginal`][] are lookups in this table,
    the same numbers (the sum $M+\hat M$ of whole numbers is exact)."""
    k = transitions.shape[-1]
    off = off_diagonal(k)
    dtype = transitions.dtype
    a = jnp.where(off, jnp.asarray(alpha, dtype), 1.0)
    M = jnp.where(off, transitions, 0.0)
    counts = jnp.arange(max_count + 1, dtype=dtype)
    return log_gamma_positive(a[..., None] + (M[..., None] + counts))


def dirichlet_gamma_log_marginal(
    pseudo_transitions: ArrayLike,
    pseudo_time: ArrayLike,
    transitions: Float[Array, "*configs k k"],
    dwell_times: Float[Array, "*configs k"],
) -> Float[Array, ""]:
    r"""The Nodelman et al. (2003) family score of one node's statistics: exit rate
    $q_{xu}\sim\mathrm{Gam}(\alpha_{xu}+1,\tau_{xu})$ and next state
    $\sim\mathrm{Dir}(\alpha_{xx'u})$, so

    $$\sum_{u,x}\Big[\ln\tfrac{\Gamma(\alpha_{xu}+M_{xu}+1)\,\tau_{xu}^{\alpha_{xu}+1}}
    {\Gamma(\alpha_{xu}+1)\,(\tau_{xu}+T_{xu})^{\alpha_{xu}+M_{xu}+1}}
    +\ln\tfrac{\Gamma(\alpha_{xu})}{\Gamma(\alpha_{xu}+M_{xu})}
    +\sum_{x'\ne x}\ln\tfrac{\Gamma(\alpha_{xx'u}+M_{xx'u})}{\Gamma(\alpha_{xx'u})}\Big]$$

    with $M_{xu}=\sum_{x'}M_{xx'u}$, `pseudo_transitions` $=\alpha_{xx'u}$ and `pseudo_time`
    $=\tau_{xu}$ (see [`jaxctbn.NodelmanPrior`][] for how CTBN-RLE spreads them over the
    configurations), and $\alpha_{xu}=(k-1)\alpha_{xx'u}$."""
    k = transitions.shape[-1]
    off = off_diagonal(k)
    dtype = dwell_times.dtype
    a_xx = jnp.asarray(pseudo_transitions, dtype)
    a_x = (k - 1) * a_xx
    tau = jnp.asarray(pseudo_time, dtype)
    M = jnp.where(off, transitions, 0.0)
    Mx = M.sum(-1)
    T = dwell_times
    exit_part = (
        gammaln(a_x + Mx + 1)
        + (a_x + 1) * jnp.log(tau)
        - gammaln(a_x + 1)
        - (a_x + Mx + 1) * jnp.log(tau + T)
    )
    dirichlet = gammaln(a_x) - gammaln(a_x + Mx)
    dirichlet = dirichlet + jnp.where(off, gammaln(a_xx + M) - gammaln(a_xx), 0.0).sum(-1)
    return (exit_part + dirichlet).sum()


def gamma_log_density(x: ArrayLike, a: ArrayLike, b: ArrayLike) -> Array:
    r"""$\ln\mathrm{Gam}(x\mid a,b)=a\ln b-\ln\Gamma(a)+(a-1)\ln x-bx$ (rate parametrisation),
    elementwise."""
    x, a, b = jnp.asarray(x), jnp.asarray(a), jnp.asarray(b)
    return a * jnp.log(b) - gammaln(a) + (a - 1) * jnp.log(x) - b * x


def gamma_kl(a1: ArrayLike, b1: ArrayLike, a2: ArrayLike, b2: ArrayLike) -> Array:
    r"""$\mathrm{KL}(\mathrm{Gam}(a_1,b_1)\,\|\,\mathrm{Gam}(a_2,b_2))$ (rate parametrisation),
    elementwise."""
    a1, b1, a2, b2 = jnp.asarray(a1), jnp.asarray(b1), jnp.asarray(a2), jnp.asarray(b2)
    return (
        (a1 - a2) * digamma(a1)
        - gammaln(a1)
        + gammaln(a2)
        + a2 * (jnp.log(b1) - jnp.log(b2))
        + a1 * (b2 - b1) / b1
    )
