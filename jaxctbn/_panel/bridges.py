r"""Endpoint-conditioned paths of a finite Markov chain by uniformisation (Hobolth and Stone
2009, "Simulation from endpoint-conditioned, continuous-time Markov chains on a finite state
space", §2.3), shared by the importance sampler's node processes and the exact path sampler of
small networks.

With $\Omega\ge\max_x(-A(x,x))$ and $B=I+A/\Omega$ (nonnegative),
$e^{A\Delta}=\sum_ce^{-\Omega\Delta}(\Omega\Delta)^c/c!\,B^c$. Given the states $a$ at the
start and $b$ at the end of a step of length $\Delta$, the number of candidate times $c$ has
probability $e^{-\Omega\Delta}(\Omega\Delta)^c/c!\,B^c(a,b)/e^{A\Delta}(a,b)$, the times are
uniform on the step, and the states after them a chain with weights $B(x,y)B^{c-i}(y,b)$; the
path jumps where its state changes (the other candidates are virtual).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, PRNGKeyArray


def draw_index(weights: Array, u: Array) -> Array:
    """The first index whose cumulative weight exceeds `u` times the total (`u` uniform on
    [0, 1): an index drawn with probability proportional to `weights`)."""
    cumulative = jnp.cumsum(weights)
    return jnp.argmax(cumulative > u * cumulative[-1]).astype(jnp.int32)


def log_poisson_weights(mean: Array, max_candidates: int) -> Array:
    r"""$\ln[e^{-\mu}\mu^c/c!]$ for $c=0..$`max_candidates` (a point mass at 0 for $\mu=0$)."""
    n = jnp.arange(max_candidates + 1)
    positive = mean > 0
    safe = jnp.where(positive, mean, 1.0)
    return jnp.where(
        positive,
        -mean + n * jnp.log(safe) - jax.lax.lgamma(n + 1.0),
        jnp.where(n == 0, 0.0, -jnp.inf),
    )


def bridge(
    B: Array,
    columns: Array,
    through: Array,
    omega: Array,
    dt: Array,
    start: Array,
    a: Array,
    key: PRNGKeyArray,
) -> tuple[Array, Array, Array, Array]:
    r"""A path on `[start, start + dt]` from state `a` to state `b` (module docstring):
    `columns` `(c + 1, K)` are $B^m e_b$ for $m=0..c$ (`c` = the most candidate times),
    `through` is $e^{A\Delta}(a,b)$. Returns `(times, states after, jumped, overflow)`, each of
    `c` slots (time `inf` past the candidates); `overflow`: the drawn count needed more than `c`
    candidates (the path is then cut: the caller raises)."""
    max_candidates = columns.shape[0] - 1
    dtype = B.dtype
    key_count, key_times, key_states = jr.split(key, 3)
    log_poisson = log_poisson_weights(omega * dt, max_candidates)
    probability = jnp.exp(log_poisson) * columns[:, a] / jnp.where(through > 0, through, 1.0)
    cumulative = jnp.cumsum(probability)
    u = jr.uniform(key_count, (), dtype)
    overflow = cumulative[-1] <= u * (1.0 - 1e-12)
    count = jnp.where(overflow, max_candidates, jnp.argmax(cumulative > u))
    slot = jnp.arange(1, max_candidates + 1)
    used = slot <= count
    times = jnp.sort(
        jnp.where(used, start + dt * jr.uniform(key_times, (max_candidates,), dtype), jnp.inf)
    )

    def move(x, inputs):
        i, v = inputs
        y = draw_index(B[x] * columns[jnp.clip(count - i, 0, max_candidates)], v)
        y = jnp.where(i <= count, y, x)
        return y, y

    uniforms = jr.uniform(key_states, (max_candidates,), dtype)
    _, states = jax.lax.scan(move, a, (slot, uniforms))
    before = jnp.concatenate([a[None], states[:-1]])
    jumped = used & (states != before)
    return times, states, jumped, overflow
