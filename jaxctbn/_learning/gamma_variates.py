r"""Gamma variates for posterior rate draws, vectorised over a whole array of shape parameters.

`jax.random.gamma` draws each variate by its own rejection loop; vectorised over an array it
runs as one loop whose random bits are split per element and per round, slow on a CPU for the
~20,000 variates that the rate draws of a structure design step need (the step is timed in
`benchmarks/criteria/bench_design_step.py`; results in `benchmarks/results/design_step.md`).
Here Marsaglia and Tsang's method (2000) runs on the whole array at once: every element gets
one proposal (one normal and one uniform, from one key), accepted with probability $\ge0.95$
for shape $\ge1$. The rejected ones are then gathered into a buffer (`jnp.nonzero` with a fixed
size), redrawn, and scattered back, round after round until every element has an accepted
proposal: about 1.05 proposals per variate, where a fixed number of proposals per element
would need 3 or more. Element $j$'s $t$-th redraw comes from a key folded from the row's key,
$j$ and $t$ alone, so the variates do not depend on the buffer sizes nor on which elements
share a round. The result has exactly the $\mathrm{Gam}(a,1)$ distribution (each element
takes the first accepted of its own sequence of independent proposals); it is a different
stream from `jax.random.gamma`.

Under `vmap` (the draws of a design step call this once per node and model, under several
`vmap`s), the batch's rows become one array of rows (`jax.custom_batching.custom_vmap`):
one rejection loop for all of them rather than a batched loop that runs every row's body
until the slowest row is done. Row $r$'s variates come from its own key alone, so the
batched result equals the rows drawn one by one.

For $a<1$ the sample is $G\,U^{1/a}$ with $G\sim\mathrm{Gam}(a+1,1)$ and $U\sim\mathcal U(0,1)$
(Marsaglia and Tsang's boost). Derivatives with respect to $a$ are the implicit
reparameterisation gradient $\partial x/\partial a=-\partial_aF(x;a)/f(x;a)$ (as
`jax.random.gamma`'s), so a draw is differentiable in its shape.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, ArrayLike, Float, Key, PRNGKeyArray

from .._errors import error_if

#: Each redraw round takes the rejected elements (about 5% of the array, then about 5% of those)
#: in a buffer of 1/`_REDRAW` of the array, at least `_MIN_REDRAW` slots; elements left over
#: wait for the next round. One buffer size, so one round in the compiled program (a round per
#: size would double the sampler's part of every program that draws rates: ~1.4 s more to
#: compile a panel VBHC), at the cost of a few percent more proposals in the rare second round.
_REDRAW = 16
_MIN_REDRAW = 16


def _accept(d: Array, c: Array, x: Array, u: Array) -> tuple[Array, Array]:
    """The Marsaglia-Tsang proposal `d v` from a normal `x`, and whether the uniform `u`
    accepts it."""
    t = 1 + c * x
    v = t * t * t
    positive = v > 0
    log_v = jnp.log(jnp.where(positive, v, 1))
    accept = positive & (jnp.log(u) < 0.5 * x * x + d - d * v + d * log_v)
    return d * v, accept


def _not_a_shape(a: Array) -> Array:
    """Where `a` is not a finite positive number (no Gamma distribution)."""
    return ~(a > 0) | ~jnp.isfinite(a)


def _uniform_open(key: PRNGKeyArray, shape, dtype) -> Array:
    return jr.uniform(key, shape, dtype, minval=jnp.finfo(dtype).tiny)


@jax.custom_batching.custom_vmap
def _gamma_rows(keys: Key[Array, " rows"], a: Float[Array, "rows n"]) -> Float[Array, "rows n"]:
    """`Gam(a, 1)` variates for `a` `(rows, n)`, row r from `keys[r]` alone."""
    R, n = a.shape
    boost = a < 1
    d = jnp.where(boost, a + 1, a) - 1 / 3
    c = 1 / jnp.sqrt(9 * d)
    k_normal, k_uniform, k_redraw, k_boost = jnp.moveaxis(
        jax.vmap(lambda k: jr.split(k, 4))(keys), 1, 0
    )
    x = jax.vmap(lambda k: jr.normal(k, (n,), a.dtype))(k_normal)
    u = jax.vmap(lambda k: _uniform_open(k, (n,), a.dtype))(k_uniform)
    value, done = _accept(d, c, x, u)
    # a shape that is not a positive number never accepts: left out of the redraws (its
    # variate is NaN, and `gamma_variates` raises)
    invalid = _not_a_shape(a)
    value, done, invalid = value.reshape(-1), (done | invalid).reshape(-1), invalid.reshape(-1)
    d, c = d.reshape(-1), c.reshape(-1)

    # the rejected elements (about 5% or fewer) redrawn, a buffer of them at a time, until
    # each has an accepted proposal; element j's t-th redraw comes from its row's key, j and t
    # alone, so the variates do not depend on how the redraws are scheduled (nor on the
    # other rows: a batch of rows is one array)
    def redraw(carry, slots):
        value, done, tries = carry
        (index,) = jnp.nonzero(~done, size=slots, fill_value=R * n)  # R n: empty, dropped
        safe = jnp.minimum(index, R * n - 1)

        def proposal(k, j, t, d, c):
            k_x, k_u = jr.split(jr.fold_in(jr.fold_in(k, j), t))
            return _accept(d, c, jr.normal(k_x, (), d.dtype), _uniform_open(k_u, (), d.dtype))

        v, ok = jax.vmap(proposal)(k_redraw[safe // n], safe % n, tries[safe], d[safe], c[safe])
        return (
            value.at[index].set(v, mode="drop"),
            done.at[index].set(ok, mode="drop"),
            tries.at[index].add(1, mode="drop"),
        )

    slots = min(R * n, max(_MIN_REDRAW, R * n // _REDRAW))

    carry = (value, done, jnp.zeros(R * n, jnp.uint32))
    value, _, _ = jax.lax.while_loop(
        lambda carry: ~carry[1].all(),
        lambda carry: redraw(carry, slots),
        carry,
    )
    value = jnp.where(invalid, jnp.nan, value).reshape(R, n)

    def boosted(value):  # shapes below 1: G U^(1/a), G ~ Gam(a + 1)
        u = jax.vmap(lambda k: _uniform_open(k, (n,), a.dtype))(k_boost)
        return jnp.where(boost, value * jnp.exp(jnp.log(u) / jnp.where(boost, a, 1)), value)

    return jax.lax.cond(boost.any(), boosted, lambda v: v, value)


@_gamma_rows.def_vmap
def _gamma_rows_vmap(axis_size, in_batched, keys, a):
    """Under `vmap`, the batch's rows are one array of rows (one rejection loop for all)."""
    keys_batched, a_batched = in_batched
    R, n = a.shape[-2:]
    keys = keys if keys_batched else jnp.broadcast_to(keys, (axis_size, R))
    a = a if a_batched else jnp.broadcast_to(a, (axis_size, R, n))
    out = _gamma_rows(keys.reshape(axis_size * R), a.reshape(axis_size * R, n))
    return out.reshape(axis_size, R, n), True


def _standard_gamma_impl(key: PRNGKeyArray, a: Array) -> Array:
    return _gamma_rows(key[None], a.reshape(1, -1)).reshape(a.shape)


@jax.custom_jvp
def _standard_gamma(key: PRNGKeyArray, a: Array) -> Array:
    return _standard_gamma_impl(key, a)


@_standard_gamma.defjvp
def _standard_gamma_jvp(primals, tangents):
    key, a = primals
    _, a_dot = tangents
    x = _standard_gamma(key, a)
    # the wrapper supplies `dtype` (pyright sees the inner signature)
    return x, jax.lax.random_gamma_grad(a, x) * a_dot  # pyright: ignore[reportCallIssue]


def gamma_variates(key: PRNGKeyArray, shape_parameter: ArrayLike, dtype=None) -> Array:
    r"""One $\mathrm{Gam}(a,1)$ variate per entry of `shape_parameter` $a>0$ (any shape), in
    `dtype` (default: that of `shape_parameter`, or the default float). Divide by the rate for
    $\mathrm{Gam}(a,b)$. Pure and jittable; the same key gives the same variates."""
    if dtype is None:
        dtype = jnp.result_type(shape_parameter, float)
    a = jnp.asarray(shape_parameter, dtype)
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jr.wrap_key_data(key)  # a raw uint32 key: the same stream as its typed key
    x = _standard_gamma(key, a)
    return error_if(x, _not_a_shape(a), "shape_parameter: Gamma shapes must be finite and > 0.")
