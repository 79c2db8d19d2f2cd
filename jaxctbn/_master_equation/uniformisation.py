r"""[`jaxctbn.Uniformisation`][] (the default exact solver): matrix-free, about $\lambda\tau$
products with $W$ ($\lambda=\max_s -W(s,s)$; up to 1.22 $\lambda\tau$ when split into steps),
accurate in float32 and float64 for any $\lambda\tau$ up to a cost limit (`max_terms`) that
raises."""

from __future__ import annotations

import functools
import math

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
from jaxtyping import Array

from .._errors import error_if
from .dense_linalg import poisson_pmf
from .flows import error_free_increment, flow_product, pull_shifts, two_sum
from .generator import AbstractGenerator, batch_last
from .solver import AbstractMasterEquationSolver


@functools.cache
def _poisson_num_terms(mean: float, tol: float) -> int:
    """The smallest `K` with Pr(N >= K) < `tol` for N ~ Poisson(`mean`): a static length,
    computed once in float64 at trace time (the tail summed from the top: no cancellation)."""
    top = int(mean + 40.0 * math.sqrt(mean) + 200)
    log_mean = math.log(mean)
    tails = [0.0] * (top + 1)
    for k in range(top - 1, -1, -1):
        tails[k] = tails[k + 1] + math.exp(-mean + k * log_mean - math.lgamma(k + 1))
    return next((k for k in range(top + 1) if tails[k] < tol), top)


def _reverse_cumsum(x: Array) -> Array:
    """`out[k] = sum(x[k:])`, summed from the small end (the tail keeps its relative accuracy)."""
    return jnp.flip(jnp.cumsum(jnp.flip(x)))


def _order_by_rate(rates: Array) -> Array:
    r"""A permutation that sorts the `rates` (>= 0, one dimension) ascending, for cutting a batch
    into groups of similar rate; non-finite rates last. The rates are compared in float32 with
    their lowest $b=\lceil\log_2 n\rceil$ bits replaced by the member's index (distinct keys,
    ties broken by index): a sort of one int32 array, several times faster on a CPU than
    `argsort` (a two-array sort with a float comparator), and only rates within a relative
    $2^{b-23}$ of each other may come out of order, which no grouping notices."""
    num = rates.shape[0]
    bits = max(1, (num - 1).bit_length())
    if bits > 24:  # past float32's mantissa: the index would overwrite the exponent
        return jnp.argsort(rates).astype(jnp.int32)
    magnitude = jax.lax.bitcast_convert_type(jnp.abs(rates).astype(jnp.float32), jnp.int32)
    index = jnp.arange(num, dtype=jnp.int32)
    # for floats >= 0 (inf and NaN included) the int32 bit patterns sort as the values
    shift = jnp.asarray(bits, jnp.int32)
    keys = jax.lax.shift_left(jax.lax.shift_right_logical(magnitude, shift), shift) | index
    return jax.lax.sort(keys) & jnp.asarray((1 << bits) - 1, jnp.int32)


class Uniformisation(AbstractMasterEquationSolver):
    r"""Exact uniformisation (Jensen's method), matrix-free, in steps of bounded Poisson mean.

    With $\lambda\ge\max_s d(s)$, $P=I+W/\lambda$ and $N\sim\mathrm{Poisson}(\lambda h)$, over a
    step of length $h$

    $$p_h=\sum_{k\ge0}\Pr(N=k)\,p_0P^k,\qquad
    \int_0^h p_t\,dt=\frac1\lambda\sum_{k\ge0}\Pr(N>k)\,p_0P^k .$$

    **Steps.** $[0,\tau]$ is split into $n=\lceil\lambda\tau/L\rceil$ equal steps of length
    $h=\tau/n$ ($L$ = `max_step_mean`), so that every step has Poisson mean $\mu=\lambda h\le L$;
    step $i+1$ starts from $p_{ih}$ and the step integrals are summed (compensated). All steps
    share $h$, so the weights are computed **once** per solve, in arrays of static length (the
    terms Poisson($L$) needs): ratio products out from the mode (every factor $\le1$; no
    $e^{-\mu}$, no log-space cancellation), truncated where $\Pr(N\ge k)$ < `tolerance` and
    normalised to sum to one; the integral weights $\Pr(N>k)$ are a reversed cumulative sum of
    those (no $1-\sum$ cancellation), scaled to sum to $h$.

    **Rounding.** A chain of $\approx\lambda\tau$ products commits a rounding error of about
    eps$\cdot\|p\|$ per product; near equilibrium it is the same at every product, and along the
    slow directions of the chain nothing damps it, so done directly it grows like $\lambda\tau$
    (to 1e-4 in float32 at $\lambda\tau=10^6$ with rates 1e-2 and 1e2). So every step after the
    first is summed as a difference from its start vector $v$: with $c=v(P-I)$, computed
    error-free once per step (TwoSum; each flow $q_r(s)v(s)$ rounded once, leaving $s$ and
    entering $s_r'$), $\delta_0=0$, $\delta_{k+1}=\delta_kP+c$,
    $\sum_k\Pr(N=k)vP^k=v+\sum_k\Pr(N=k)\delta_k$: the products act on $\delta$, which is small
    near equilibrium, and $v$ gets weight exactly one; $v$ is carried as an unevaluated sum of two
    floats. The first step, where $p_0$ relaxes and $c$ is not small, is summed directly. In
    float32 the products themselves are sums of flows ($\sum_r(\mathrm{push}_r(q_rv)-q_rv)$),
    unbiased where `generator.apply` (which subtracts a once-rounded exit rate) is biased by
    about eps per product; in float64 that bias is negligible and `apply` (half the flops) is
    used. Measured against an extended-precision dense reference
    (`benchmarks/master_equation/bench_precision.py`, `tests/master_equation/test_properties.py`): errors of $p_\tau$ and of the
    dwell times (relative to $\tau$) below 4e-6 in float32 (mostly from rounding in the first,
    direct step: about $\sqrt{K}\,$eps) and 1e-12 in float64, for $\lambda\tau$ up to $10^8$
    and rate ratios up to $10^4$; the tests assert 1e-5 and 1e-10.

    **Cost.** $K_\mu$ products with $W$ per step, $K_\mu\approx\mu+c\sqrt\mu$ ($c\approx7$ at
    `tolerance=1e-13`): the single series ($\approx\lambda\tau+c\sqrt{\lambda\tau}$ products) up
    to $\lambda\tau=L$, and about $\lambda\tau\,(1+c/\sqrt L)$ beyond (1.22 $\lambda\tau$ at the
    default $L=1024$; smaller $L$ costs more products, larger $L$ more float32 rounding, see
    the benchmark). Per step, one error-free $c$ (about three products' work). Float32 products
    (flows) take longer than float64 ones for large $S$ (run times of both in
    `benchmarks/results/precision.md`). Compilation: two nested loops (steps, products), longer
    to compile than a single series.

    **Limit.** The number of products, $nK_\mu$, is known before the loop starts; if it exceeds
    `max_terms` the loop does not run and an error is raised on both outputs (never a silent
    truncation; also for a non-finite $\lambda\tau$). The default allows
    $\lambda\tau\approx1.6\cdot10^6$; the cost is linear in $\lambda\tau$ (run times against
    $\lambda\tau$ measured in `benchmarks/master_equation/bench_precision.py`; results in
    `benchmarks/results/precision.md`). Beyond that, raise `max_terms`, or for small networks
    use [`jaxctbn.MatrixExponential`][], whose cost does not depend on
    $\lambda\tau$ (in float64 its error grows to 1e-9 at $\lambda\tau=10^8$; in float32 to
    1e-3 at $10^5$).

    **Autodiff.** Both loops are `equinox.internal.while_loop(kind="checkpointed")`, so
    reverse-mode autodiff works; $\lambda$ and $n$ are held constant under differentiation (the
    result is exact for every $\lambda\ge\max d$ and every $n$, so this is the exact gradient;
    the derivative of a TwoSum's error term is zero). `solve_backward` is the same with
    $P\beta$ in place of $pP$ (a constant $\beta$ is kept exactly).

    **Batches.** `solve_batch` (and `solve_backward_batch`) runs one loop per group of at most
    `group_size` members, batch axis last so every product vectorises over the group; a group
    shares one $\lambda$ (its largest exit rate), hence one schedule, and runs the products its
    fastest member needs. So the members are first sorted by their own exit rate and cut into
    groups of similar rate (results returned in the input order): each group's loop then runs
    about as many products as its members need, fewer than groups in input order would, and
    groups of a few hundred 16-state problems stay in the CPU's cache
    (`benchmarks/master_equation/bench_master_equation.py` times the batched solves against a floor of each
    problem's own products; results in `benchmarks/results/master_equation.md`). Each member's
    result is exact whatever its group (to rounding: about 1e-14 between groupings in float64).

    **Forward-backward.** `forward_backward` uses, with $a_k=\alpha_0P^k$, $b_j=P^j\beta_\tau$
    and the Beta integral
    $\int_0^\tau\mathrm{Pois}(k;\lambda t)\,\mathrm{Pois}(j;\lambda(\tau-t))\,dt
    =\mathrm{Pois}(k+j+1;\lambda\tau)/\lambda$,

    $$\int_0^\tau\alpha_t(s)\beta_t(s')\,dt=\frac1\lambda\sum_{k,j\ge0}
    \mathrm{Pois}(k+j+1;\lambda\tau)\,a_k(s)\,b_j(s')
    =\frac1\lambda\sum_k a_k(s)\,c_k(s'),\quad c_k=\sum_j\mathrm{Pois}(k+j+1;\lambda\tau)\,b_j,$$

    truncated at $K$ terms, the first $K$ with $\Pr(N\ge K)$ < `tolerance` (so the neglected part
    of $\sum_s\mathrm{dwell}(s)$ is below `tolerance` $\cdot\,\tau\,\|\alpha_0\|_1
    \|\beta_\tau\|_\infty$). The Poisson weights are computed as above (ratios out from the
    mode); this route is not split into steps. For non-negative $\alpha_0,\beta_\tau$ every term
    is non-negative (no cancellation). Cost, with $K_{\max}$ = `fb_max_terms` and $J$ shifts:
    $2K$ products with $W$; $K$ products of the $K_{\max}\times S$ buffer of the $b_j$ with a
    window of Poisson weights, $O(K\,K_{\max}\,S)$ flops (the dominant term unless $J$ is
    large); $O(K\,J\,S)$ for the shifted products. Memory $K_{\max}S$ plus $O(JS)$ (reverse
    mode adds the checkpoints of two loops). Meant for moderate $S$ and $\lambda\tau$; if
    $K>K_{\max}$ an error is raised on both outputs (never a silent truncation).

    **Arguments (keyword-only):**

    - `tolerance`: Poisson tail mass at which each series stops (default `1e-13`; ~`1e-8` is
      enough in float32, where rounding dominates).
    - `max_terms`: hard limit on the number of products with $W$ in one `solve`; more needed
      raises an error (default $2\cdot10^6$).
    - `fb_max_terms`: static size of the buffer of backward vectors in `forward_backward`
      (default 512); more terms needed raises an error.
    - `max_step_mean`: $L$, the largest Poisson mean $\lambda h$ of one step (default 1024).
    - `group_size`: the largest group of a batch solved in one loop (default 256); `None`
      solves a whole batch in one loop at its largest rate (on a GPU, where a loop's time
      hardly grows with the batch, fewer loops can be faster).
    """

    tolerance: float = eqx.field(default=1e-13, static=True)
    max_terms: int = eqx.field(default=2_000_000, static=True)
    fb_max_terms: int = eqx.field(default=512, static=True)
    max_step_mean: float = eqx.field(default=1024.0, static=True)
    group_size: int | None = eqx.field(default=256, static=True)

    def gap_rate_limit(self, default: float) -> float:
        r"""`forward_backward` needs about $\mu+7\sqrt\mu$ terms for a Poisson mean $\mu$, so
        half its buffer (`fb_max_terms / 2`)."""
        return self.fb_max_terms / 2

    def __check_init__(self):
        if self.group_size is not None and (
            not isinstance(self.group_size, int)
            or isinstance(self.group_size, bool)
            or self.group_size < 1
        ):
            raise ValueError(
                "Uniformisation: group_size must be a positive integer or None, got "
                f"{self.group_size!r}."
            )
        if not 0 < self.tolerance < 1e-2:
            raise ValueError(
                f"Uniformisation: tolerance must be in (0, 1e-2), got {self.tolerance}."
            )
        if not self.max_step_mean >= 1:
            raise ValueError(
                f"Uniformisation: max_step_mean must be >= 1, got {self.max_step_mean}."
            )

    @staticmethod
    def _rate(generator, horizon, dtype):
        # one rate for a whole batch (trailing batch axes): one schedule, one set of weights
        lam = jnp.maximum(jnp.max(generator.max_exit_rate()), 1.0 / horizon) * 1.0000001
        return jax.lax.stop_gradient(lam).astype(dtype)

    @property
    def _num_weights(self) -> int:
        # static length of the weight arrays: the terms Poisson(L) needs (margin for rounding of mu)
        return _poisson_num_terms(float(self.max_step_mean) * (1 + 1e-4), float(self.tolerance))

    def _schedule(self, lam, horizon):
        """Steps `n` (float), step length `h`, terms per step `K` and the weights of one step."""
        dtype = lam.dtype
        n = jnp.maximum(jnp.ceil(jax.lax.stop_gradient(lam * horizon) / self.max_step_mean), 1)
        h = horizon / n
        pmf = poisson_pmf(lam * h, self._num_weights)
        at_least = jax.lax.stop_gradient(_reverse_cumsum(pmf))  # Pr(N >= k)
        K = jnp.maximum(jnp.sum(at_least >= jnp.asarray(self.tolerance, dtype)), 2)
        k = jnp.arange(self._num_weights)
        pmf = jnp.where(k < K, pmf, 0)
        pmf = pmf / jnp.sum(pmf)
        more = jnp.concatenate([_reverse_cumsum(pmf)[1:], jnp.zeros((1,), dtype)])  # Pr(N > k)
        integral_weights = more * (h / jnp.sum(more))
        return n, h, K.astype(jnp.int32), pmf, integral_weights

    def _too_many(self, n, K):
        return ~(n * K.astype(n.dtype) <= self.max_terms)  # also true for NaN

    def _uniformise(self, generator, p0, horizon, transpose=False):
        # p0: (S, *batch) with the generator's batch axes trailing.
        # transpose=False: row vectors, p -> pW; transpose=True: column vectors, v -> Wv.
        dtype = p0.dtype
        horizon = jnp.asarray(horizon, dtype)
        lam = self._rate(generator, horizon, dtype)
        q = tuple(
            generator.shift_rate_tensor(r).astype(dtype) / lam for r in range(len(generator.shifts))
        )
        n, h, K, pmf, iw = self._schedule(lam, horizon)
        too_many = self._too_many(n, K)
        num_steps = jnp.where(too_many, 0, n).astype(jnp.int32)  # no loop at all on error
        apply = generator.apply_transpose if transpose else generator.apply
        inv_lam = 1 / lam

        def increment(v):  # v (P - I)
            if jnp.finfo(dtype).bits < 64:
                return flow_product(generator, q, v, transpose)
            return apply(v) * inv_lam

        def one_step(v, direct):
            # v is a pair (hi, lo), value hi + lo; the step returns (v E, v F) with
            # E = sum_k pmf[k] P^k and F = sum_k iw[k] P^k. Written as v P^k = b + delta_k with
            # a base b (b = v, or b = 0 when `direct`):
            #   delta_0 = v - b,  delta_{k+1} = delta_k P + c,  c = b (P - I)  (once per step),
            #   v E = b + sum_k pmf[k] delta_k,  v F = h b + sum_k iw[k] delta_k
            # (sum pmf = 1 and sum iw = h in exact arithmetic, so b gets total weight exactly 1
            # resp. h). With b = v the products act on delta, which is small where the chain
            # is near equilibrium, and c is computed error-free (there, a small difference of
            # large flows); done directly (b = 0), the same O(eps |v|) rounding repeats at
            # every product and step in the slow directions, where nothing damps it (1e-4 in
            # float32 at lambda tau = 1e6). But c's own rounding is repeated K times per step,
            # an error of about mu * eps * |c|: small after the first step, where |c| ~
            # (slow rates / lambda) |v|, but not in the first, where p0 relaxes and |c| ~ |v|.
            # So the first step is done directly and the others with b = v.
            keep = jnp.where(direct, 0, 1).astype(dtype)
            b = (keep * v[0], keep * v[1])
            c, _ = error_free_increment(generator, q, b[0], b[1], transpose)

            # delta_k is accumulated before the product that makes delta_{k+1}, so that XLA
            # does not fuse (and so repeat) the product into each accumulation; the last
            # product of a step is not used (K products for K - 1 needed).
            def body(carry):
                k, delta, acc_p, acc_i = carry
                acc_p = acc_p + pmf[k] * delta
                acc_i = acc_i + iw[k] * delta
                return k + 1, delta + increment(delta) + c, acc_p, acc_i

            zero = jnp.zeros_like(v[0])
            delta0 = (v[0] - b[0]) + (v[1] - b[1])
            _, _, acc_p, acc_i = eqxi.while_loop(
                lambda carry: carry[0] < K,
                body,
                (jnp.asarray(0, jnp.int32), delta0, zero, zero),
                max_steps=self._num_weights,
                kind="checkpointed",
            )
            hi, err = two_sum(b[0], acc_p)
            return two_sum(hi, b[1] + err), (h * b[0], h * b[1] + acc_i)

        def step(c):
            i, p, total = c
            p, integral = one_step(p, i == 0)
            # the step integrals are small next to the running total: compensated sum
            hi, err = two_sum(total[0], integral[0])
            return i + 1, p, (hi, total[1] + err + integral[1])

        zero = jnp.zeros_like(p0)
        max_steps = 2 * self.max_terms // max(1, int(self.max_step_mean)) + 2
        _, p, total = eqxi.while_loop(
            lambda c: c[0] < num_steps,
            step,
            (jnp.asarray(0, jnp.int32), (p0, zero), (zero, zero)),
            max_steps=max_steps,
            kind="checkpointed",
        )
        p, total = p[0] + p[1], total[0] + total[1]
        # one check guarding both outputs: using either alone keeps it
        return error_if(
            (p, total),
            too_many,
            "Uniformisation: max_terms reached: the solve needs more than max_terms products "
            "with W (lambda * horizon, the largest exit rate times the horizon, is very large, "
            "or not finite). Increase max_terms (the cost grows linearly with lambda * horizon), "
            "or use MatrixExponential (small networks; cost independent of the horizon).",
        )

    def solve(self, generator, p0, horizon):
        return self._uniformise(generator, p0, horizon)

    def _in_rate_groups(self, generators, v, horizon, transpose):
        """`_uniformise` of a batch (leading axis) in groups of similar rate: one loop per group,
        batch axis last in each, the groups one after another (`lax.map`)."""

        def one_loop(gv):
            out, integral = self._uniformise(batch_last(gv[0]), gv[1].T, horizon, transpose)
            return out.T, integral.T

        num = v.shape[0]
        if self.group_size is None or num <= self.group_size:
            return one_loop((generators, v))
        num_groups = -(-num // self.group_size)
        size = -(-num // num_groups)  # balanced groups: fewer than num_groups padded members
        rates = jax.lax.stop_gradient(jax.vmap(lambda g: g.max_exit_rate())(generators))
        order = _order_by_rate(rates)
        # padded with the fastest member (it ends in the last group, whose rate it already sets)
        order = jnp.concatenate([order, jnp.full((num_groups * size - num,), order[-1])])
        grouped = jax.tree_util.tree_map(
            lambda a: a[order].reshape(num_groups, size, *a.shape[1:]), (generators, v)
        )
        out, integral = jax.lax.map(one_loop, grouped)
        # the position of each member in the sorted order (the inverse permutation)
        back = jnp.zeros((num,), jnp.int32).at[order[:num]].set(jnp.arange(num, dtype=jnp.int32))
        return tuple(x.reshape(num_groups * size, *x.shape[2:])[back] for x in (out, integral))

    def solve_batch(self, generators, p0, horizon):
        return self._in_rate_groups(generators, p0, horizon, transpose=False)

    def solve_backward(self, generator, beta_end, horizon):
        return self._uniformise(generator, beta_end, horizon, transpose=True)

    def solve_backward_batch(self, generators, beta_end, horizon):
        return self._in_rate_groups(generators, beta_end, horizon, transpose=True)

    def forward_backward(self, generator, alpha_start, beta_end, horizon):
        dtype = alpha_start.dtype
        beta_end = jnp.asarray(beta_end, dtype)
        horizon = jnp.asarray(horizon, dtype)
        lam = self._rate(generator, horizon, dtype)
        mean = lam * horizon
        K_max = self.fb_max_terms

        # Poisson weights on 0..2 K_max - 1, stably (ratios out from the mode). K: the first k
        # with Pr(N >= k) < tolerance; an integer, so no derivative. If the mean lies beyond
        # K_max, K > K_max anyway and the error below fires.
        pmf = poisson_pmf(mean, 2 * K_max)
        at_least = jax.lax.stop_gradient(_reverse_cumsum(pmf))
        K = jnp.sum(at_least >= jnp.asarray(self.tolerance, dtype)).astype(jnp.int32)
        too_many = (K > K_max) | ~(jax.lax.stop_gradient(mean) <= K_max)
        K = jnp.where(too_many, 0, K)  # no loop on error

        # w[m] = Pois(m; mean) for 1 <= m <= K, else 0
        m = jnp.arange(2 * K_max)
        w = jnp.where((m >= 1) & (m <= K), pmf, 0.0)

        # b_j = P^j beta_end for j < K, stored (write-only buffer inside the loop).
        def b_body(c):
            j, b, B = c
            B = B.at[j].set(b)
            return j + 1, b + generator.apply_transpose(b) / lam, B

        B0 = jnp.zeros((K_max,) + beta_end.shape, dtype)
        _, _, B = eqxi.while_loop(
            lambda c: c[0] < K,
            b_body,
            (jnp.asarray(0, jnp.int32), beta_end, B0),
            max_steps=K_max,
            buffers=lambda c: c[2],
            kind="checkpointed",
        )

        # a_k = alpha_0 P^k on the fly; c_k = sum_j w[k+j+1] b_j (zero weights beyond K).
        def a_body(c):
            k, a, dwell, flux = c
            ck = jax.lax.dynamic_slice_in_dim(w, k + 1, K_max) @ B
            dwell = dwell + a * ck
            flux = flux + a[None] * pull_shifts(generator, ck)
            return k + 1, a + generator.apply(a) / lam, dwell, flux

        num_shifts = len(generator.shifts)
        init = (
            jnp.asarray(0, jnp.int32),
            alpha_start,
            jnp.zeros_like(alpha_start),
            jnp.zeros((num_shifts,) + alpha_start.shape, dtype),
        )
        _, _, dwell, flux = eqxi.while_loop(
            lambda c: c[0] < K, a_body, init, max_steps=K_max, kind="checkpointed"
        )
        # one check guarding both outputs: using either alone keeps it
        return error_if(
            (dwell / lam, flux / lam),
            too_many,
            "Uniformisation.forward_backward: more than fb_max_terms terms needed for the "
            "Poisson tail to fall below tolerance; increase fb_max_terms (the rates times the "
            "horizon are large), or use MatrixExponential (small networks).",
        )

    def num_products(self, generator: AbstractGenerator, horizon) -> Array:
        """How many products with $W$ `solve` takes for this generator and horizon."""
        dtype = generator.exit_rates.dtype
        horizon = jnp.asarray(horizon, dtype)
        n, _, K, _, _ = self._schedule(self._rate(generator, horizon, dtype), horizon)
        return (n * K).astype(jnp.int32)


#: The default exact solver.
DEFAULT_SOLVER = Uniformisation()
