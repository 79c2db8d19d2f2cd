r"""Products with a generator as flows along its shifts (maths §1): moving values from a
global state $s$ to $s_r'$ (node $n$ moved forward by $j$, mod $k_n$) and back, and the
error-free and unbiased forms of $vW/\lambda$ that uniformisation sums. Panel filtering uses
`push` and `pull_shifts` for the jumps into exactly observed states."""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array

from .generator import AbstractGenerator


def pull_shifts(generator: AbstractGenerator, v: Array) -> Array:
    """`out[r, s] = v[s_r']` for every shift r = (n, j): node n of s moved forward by j.

    `v` has shape `(S,)`; returns `(len(shifts), S)`."""
    cards = generator.cardinalities
    vt = v.reshape(cards)
    rows = [
        (jnp.flip(vt, axis=n) if cards[n] == 2 else jnp.roll(vt, -j, axis=n)).reshape(-1)
        for n, j in generator.shifts
    ]
    return jnp.stack(rows) if rows else jnp.zeros((0,) + v.shape, v.dtype)


def push(x: Array, n: int, j: int, k: int) -> Array:
    """Values at `s` moved to `s_r'` (node `n` of `s` moved forward by `j`, mod `k`)."""
    return jnp.flip(x, axis=n) if k == 2 else jnp.roll(x, j, axis=n)


def pull(x: Array, n: int, j: int, k: int) -> Array:
    """`out[s] = x[s_r']`: the inverse of `push`."""
    return jnp.flip(x, axis=n) if k == 2 else jnp.roll(x, -j, axis=n)


def two_sum(a: Array, b: Array) -> tuple[Array, Array]:
    """`s = fl(a + b)` and its rounding error `e`: `a + b = s + e` exactly (Knuth's TwoSum)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def error_free_increment(
    generator: AbstractGenerator, q: tuple[Array, ...], hi: Array, lo: Array, transpose
) -> tuple[Array, Array]:
    r"""$v(P-I)=vW/\lambda$ (or $(P-I)v$ if `transpose`) for $v$ = `hi + lo`, with `q[r]` the
    rates of shift $r$ divided by $\lambda$, every addition error-free (TwoSum).

    Near equilibrium this is a small difference of large flows, and `generator.apply` would give
    it an absolute error of about eps times $\|v\|$ that is the same at every step (so it
    accumulates). Here each flow $q_r(s)v(s)$ is rounded once and the same rounded number leaves
    $s$ and enters $s_r'$ (an error along a transition, which the chain damps, and no mass
    created or lost); the transposed form sums $q_r\,(v(s_r')-v(s))$, zero for a constant $v$."""
    cards = generator.cardinalities
    shape = cards + generator.batch_shape
    h, low = hi.reshape(shape), lo.reshape(shape)
    s, e = jnp.zeros_like(h), jnp.zeros_like(h)
    for r, (n, j) in enumerate(generator.shifts):
        k = cards[n]
        if transpose:
            d, d_err = two_sum(pull(h, n, j, k), -h)
            s, err = two_sum(s, q[r] * d)
            e = e + err + q[r] * (d_err + pull(low, n, j, k) - low)
        else:
            flow = q[r] * h
            s, err_in = two_sum(s, push(flow, n, j, k))
            s, err_out = two_sum(s, -flow)
            flow_lo = q[r] * low
            e = e + (err_in + err_out) + (push(flow_lo, n, j, k) - flow_lo)
    out = s + e
    return out.reshape(hi.shape), (e - (out - s)).reshape(hi.shape)


def flow_product(generator: AbstractGenerator, q: tuple[Array, ...], v: Array, transpose) -> Array:
    r"""$vW/\lambda$ (or $Wv/\lambda$ if `transpose`) as a sum over shifts of flows, with `q[r]`
    the rates of shift $r$ divided by $\lambda$: $\sum_r(\mathrm{push}_r(q_rv)-q_rv)$, resp.
    $\sum_rq_r\,(v(s_r')-v(s))$.

    Unbiased where `generator.apply` is not: `apply` forms $-d(s)v(s)$ with the exit rate
    $d=\sum_rR_r$ rounded once, so in each state outflow and inflow differ by a fixed relative
    amount of order eps, the same at every product; over the $K$ products of a step that is an
    error of about $K\,$eps (1e-5 in float32 at $K\approx1000$). Here each flow is rounded once
    and the same number leaves $s$ and enters $s_r'$; the transposed form is zero for a constant
    $v$. About twice the flops of `apply`, so used in float32 only (in float64 the bias is
    1e-16 per product)."""
    cards = generator.cardinalities
    vt = v.reshape(cards + generator.batch_shape)
    out = jnp.zeros_like(vt)
    for r, (n, j) in enumerate(generator.shifts):
        if transpose:
            out = out + q[r] * (pull(vt, n, j, cards[n]) - vt)
        else:
            flow = q[r] * vt
            out = out + (push(flow, n, j, cards[n]) - flow)
    return out.reshape(v.shape)
