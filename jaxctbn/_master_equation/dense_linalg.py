r"""Dense matrix functions for small matrices: the matrix exponential $e^A$ (scaling and
squaring with the [13/13] Padé approximant) and the linear solve it needs, written so that no
compiled program ever calls a **batched** LAPACK kernel.

Why. jaxlib 0.10's CPU LAPACK kernels split a batch into chunks on XLA's intra-op thread pool
and block the calling pool thread until the chunks are done (`ParallelBatchMap`). XLA's CPU
runtime runs independent operations of one program concurrently on that same pool, so when as
many batched factorisations as the pool has threads start together (two on a 2-core machine),
every pool thread waits for chunks that no thread is left to run: the program never returns,
using no CPU. (Observed: `fit_rates` on the PBC panel hung in the LU of two concurrent batched
Padé solves; `gdb` showed both pool threads in `LuDecomposition` → `ParallelBatchMap` →
`BlockingCounter::Wait`. Upstream jax later compiled this parallel path out of open-source
builds.) A kernel called on **one** matrix runs inline and cannot wait on the pool.

So [`solve_batched`][jaxctbn._master_equation.dense_linalg.solve_batched] solves small systems
($n\le8$) by Gauss–Jordan elimination with partial pivoting in plain XLA operations (faster than
LAPACK for such sizes), and larger ones one matrix at a time (`jax.lax.map` of an unbatched LAPACK
solve on the CPU; batched on other platforms), with a custom `vmap` rule so that a caller's
`jax.vmap` keeps it one matrix at a time. `tests/master_equation/test_dense_linalg.py` checks the compiled programs of the
library's dense routes for batched LAPACK calls.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap
from jaxtyping import Array

from .._errors import registered_trace_state

_MAX_SQUARINGS = 32

# Higham (2005): the [13/13] Pade approximant is accurate to double precision for ||A||_1 <= 5.37
_PADE13 = (
    64764752532480000.0, 32382376266240000.0, 7771770303897600.0, 1187353796428800.0,
    129060195264000.0, 10559470521600.0, 670442572800.0, 33522128640.0, 1323241920.0,
    40840800.0, 960960.0, 16380.0, 182.0, 1.0,
)  # fmt: skip
_THETA13 = 5.371920351148152

# up to this order, Gauss-Jordan in XLA operations (measured faster than LAPACK for n <= 8 on
# the CPU, for batches of 1 to 2000); above it, LAPACK one matrix at a time
_ELIMINATION_MAX_ORDER = 8


# reductions over an axis at most this long are written as sums of slices (see `short_sum`)
_UNROLLED_MAX_LENGTH = 16
# matrix products with a contraction at most this long are unrolled (see `matmul`)
_UNROLLED_MATMUL_MAX = 4


def short_sum(x: Array, axis: int = -1) -> Array:
    """`x.sum(axis)`, written as a chain of additions of slices when the axis is short.

    jaxlib 0.10's CPU backend hands reductions to YNNPACK fusions, which for short axes inside a
    loop cost several times a fused elementwise loop (the panel filter's 4-state sums: measured
    in `benchmarks/panel/bench_msm.py`; results in `benchmarks/results/msm.md`); the sum of slices
    fuses into its neighbours instead. Longer axes keep `jnp.sum`."""
    n = x.shape[axis]
    if n > _UNROLLED_MAX_LENGTH or n == 0:
        return jnp.sum(x, axis=axis)
    total = jax.lax.index_in_dim(x, 0, axis, keepdims=False)
    for k in range(1, n):
        total = total + jax.lax.index_in_dim(x, k, axis, keepdims=False)
    return total


@jax.custom_vjp
def vector_matrix(v: Array, M: Array) -> Array:
    """`v @ M` for a vector `(n,)` and a matrix `(n, m)`, by `short_sum` over `n` (its VJP
    too: the transpose of a broadcast would be a reduction again)."""
    return short_sum(v[:, None] * M, axis=0)


@jax.custom_vjp
def matrix_vector(M: Array, v: Array) -> Array:
    """`M @ v` for a matrix `(m, n)` and a vector `(n,)`, by `short_sum` over `n` (and its
    VJP)."""
    return short_sum(M * v[None, :], axis=1)


def _vector_matrix_forward(v, M):
    return vector_matrix(v, M), (v, M)


def _vector_matrix_backward(residuals, cotangent):
    v, M = residuals
    return matrix_vector(M, cotangent), v[:, None] * cotangent[None, :]


def _matrix_vector_forward(M, v):
    return matrix_vector(M, v), (M, v)


def _matrix_vector_backward(residuals, cotangent):
    M, v = residuals
    return cotangent[:, None] * v[None, :], vector_matrix(cotangent, M)


vector_matrix.defvjp(_vector_matrix_forward, _vector_matrix_backward)
matrix_vector.defvjp(_matrix_vector_forward, _matrix_vector_backward)


def matmul(A: Array, B: Array) -> Array:
    """`A @ B` for batches of matrices `(..., m, n)`, `(..., n, p)`: for a contraction of at most
    `_UNROLLED_MATMUL_MAX` terms, a sum of broadcast products that XLA fuses into a loop (jaxlib
    0.10's CPU `dot` on a batch of 4 x 4 matrices costs several times that); otherwise
    `jnp.matmul`. (Longer unrolled contractions lose: XLA fuses a chain of them into one loop
    that recomputes the inner products.)"""
    n = A.shape[-1]
    if n > _UNROLLED_MATMUL_MAX:
        return jnp.matmul(A, B)
    # column-times-row products added directly (not `short_sum` of the 4-D broadcast product,
    # which is slower for a batch of 4 x 4 exponentials)
    total = A[..., :, 0:1] * B[..., 0:1, :]
    for k in range(1, n):
        total = total + A[..., :, k : k + 1] * B[..., k : k + 1, :]
    return total


def _gauss_jordan(M: Array, B: Array) -> Array:
    """`M^{-1} B` for a batch `(..., n, n)`, `(..., n, m)` by Gauss-Jordan elimination with
    partial pivoting (the pivot of column k is the largest remaining entry; rows are not swapped,
    the pivot rows are gathered at the end). A singular `M` gives non-finite entries."""
    n = M.shape[-1]
    X = jnp.concatenate([M, B], -1)
    rows = jnp.arange(n)

    def step(k, carry):
        X, used, order = carry
        column = jax.lax.dynamic_index_in_dim(X, k, axis=-1, keepdims=False)
        pivot = jnp.argmax(jnp.where(used, -1, jnp.abs(column)), axis=-1)
        pivot_row = jnp.take_along_axis(X, pivot[..., None, None], axis=-2)
        pivot_value = jnp.take_along_axis(column, pivot[..., None], axis=-1)
        is_pivot = rows == pivot[..., None]
        factor = jnp.where(is_pivot, 0, column / pivot_value)
        X = X - factor[..., :, None] * pivot_row
        order = jax.lax.dynamic_update_index_in_dim(order, pivot.astype(order.dtype), k, axis=-1)
        return X, used | is_pivot, order

    used = jnp.zeros(M.shape[:-1], bool)
    order = jnp.zeros(M.shape[:-1], jnp.int32)
    # unrolled only for the smallest matrices: unrolling made every program holding
    # exponentials larger and slower to compile (a panel fit 4.45 -> 3.8 s of compilation with
    # the loop) and its exponentials no faster beyond 4 x 4 (100 32 x 32 matrices: 4.8-5.6 ms
    # unrolled, 3.6-3.8 ms as a loop)
    X, _, order = jax.lax.fori_loop(0, n, step, (X, used, order), unroll=n <= 4)
    X = jnp.take_along_axis(X, order[..., :, None], axis=-2)  # row k: the pivot row of column k
    diagonal = jnp.diagonal(X[..., :n], axis1=-2, axis2=-1)
    return X[..., n:] / diagonal[..., None]


@custom_vmap
def _lapack_solve_one(M: Array, B: Array) -> Array:
    return jnp.linalg.solve(M, B)


@_lapack_solve_one.def_vmap
def _lapack_solve_one_vmap(axis_size, in_batched, M, B):
    M = M if in_batched[0] else jnp.broadcast_to(M, (axis_size,) + M.shape)
    B = B if in_batched[1] else jnp.broadcast_to(B, (axis_size,) + B.shape)
    solved = jax.lax.platform_dependent(
        M,
        B,
        cpu=lambda M, B: jax.lax.map(lambda mb: _lapack_solve_one(*mb), (M, B)),
        default=jnp.linalg.solve,
    )
    return solved, True


def solve_batched(M: Array, B: Array) -> Array:
    r"""$M^{-1}B$ for a batch: `M` of shape `(..., n, n)`, `B` of shape `(..., n, m)`, without a
    batched LAPACK call on the CPU (see the module docstring). Not differentiable (used inside
    the custom VJP of [`expm_batched`][jaxctbn._master_equation.dense_linalg.expm_batched]); a
    singular `M` gives non-finite entries, the caller's to check."""
    if M.shape[-1] <= _ELIMINATION_MAX_ORDER:
        return _gauss_jordan(M, B)
    batch = M.shape[:-2]
    flat = jax.vmap(_lapack_solve_one)(
        jnp.reshape(M, (-1,) + M.shape[-2:]), jnp.reshape(B, (-1,) + B.shape[-2:])
    )
    return jnp.reshape(flat, batch + B.shape[-2:])


@jax.custom_vjp
def expm_batched(matrices: Array) -> Array:
    r"""$e^{A}$ for a batch of matrices `(B, n, n)` by scaling and squaring with the [13/13]
    Padé approximant (Higham 2005), written for a batch: one approximant for all, then
    $\max_b s_b$ squarings, each matrix squared only while it needs to be ($s_b$ from its own
    1-norm, at most 32, so $\|A\|_1$ up to about $2\cdot10^{10}$). `jax.scipy.linalg.expm` under
    `jax.vmap` instead evaluates every Padé order and all squarings for every matrix, and calls
    batched LAPACK. Non-finite results are the caller's to check.

    Reverse-mode differentiable (a custom VJP: the adjoint of the Fréchet derivative
    $L(A,\cdot)$ is $L(A^\top,\cdot)$, the upper-right block of
    $\exp\begin{bmatrix}A^\top&\bar G\\0&A^\top\end{bmatrix}$); not forward-mode."""
    return _expm_batched(matrices)


def _expm_batched(matrices: Array, stochastic: bool = False) -> Array:
    A = jnp.asarray(matrices)
    norm = jnp.abs(A).sum(-2).max(-1)
    s = jnp.clip(jnp.ceil(jnp.log2(jnp.maximum(norm, 1e-300) / _THETA13)), 0, _MAX_SQUARINGS)
    s = s.astype(jnp.int32)
    A = A / (2.0 ** s.astype(A.dtype))[:, None, None]
    b = _PADE13
    eye = jnp.eye(A.shape[-1], dtype=A.dtype)
    A2 = matmul(A, A)
    A4 = matmul(A2, A2)
    A6 = matmul(A4, A2)
    U = matmul(
        A,
        matmul(A6, b[13] * A6 + b[11] * A4 + b[9] * A2)
        + b[7] * A6 + b[5] * A4 + b[3] * A2 + b[1] * eye,
    )  # fmt: skip
    V = (
        matmul(A6, b[12] * A6 + b[10] * A4 + b[8] * A2)
        + b[6] * A6 + b[4] * A4 + b[2] * A2 + b[0] * eye
    )  # fmt: skip
    R = solve_batched(V - U, V + U)

    def renormalised(R):  # a transition matrix: rows >= 0 summing to one, kept so
        R = jnp.maximum(R, 0.0)
        return R / R.sum(-1, keepdims=True)

    def square(R):
        R = matmul(R, R)
        return renormalised(R) if stochastic else R

    if stochastic:
        R = renormalised(R)
    return jax.lax.fori_loop(
        0, jnp.max(s, initial=0), lambda k, R: jnp.where((k < s)[:, None, None], square(R), R), R
    )


# The forward rules call the custom-VJP functions themselves (the same values): differentiated
# again from outside (reverse over reverse), the primal then follows its own rule, not the
# scaling and squaring's loop of dynamic length, which reverse mode cannot differentiate. The
# residual is a new value (`+ 0`), not the input itself: jax 0.10 forwards an input returned as
# a residual, and inside `lax.scan` differentiated twice that forwarded residual reached the
# backward rule without its shape (an IndexError in `_expm_batched_backward`).
def _expm_batched_forward(matrices):
    return expm_batched(matrices), matrices + 0


def _expm_batched_backward(matrices, cotangent):
    A = jnp.swapaxes(jnp.asarray(matrices), -1, -2)
    n = A.shape[-1]
    zero = jnp.zeros_like(A)
    block = jnp.concatenate(
        [jnp.concatenate([A, cotangent], -1), jnp.concatenate([zero, A], -1)], -2
    )
    # `expm_batched`, not the raw scaling and squaring (whose loop has a dynamic length): the
    # VJP is then reverse-differentiable again, by the same rule on a block twice the size
    # (exact second derivatives: the observed information of a panel fit)
    return (expm_batched(block)[..., :n, n:],)


expm_batched.defvjp(_expm_batched_forward, _expm_batched_backward)


@jax.custom_vjp
def transition_matrices(generators: Array) -> Array:
    r"""$e^{hW}$ for a batch of scaled generators $hW$ `(B, S, S)` (rows summing to zero,
    off-diagonal entries $\ge0$): transition matrices, by
    [`expm_batched`][jaxctbn._master_equation.dense_linalg.expm_batched]'s scaling and squaring
    with every squared matrix made a transition matrix again (negative rounding clipped, rows
    rescaled to sum to one).

    Exactly $e^{hW}$ in exact arithmetic. In floating point, plain squaring lets a row sum's
    rounding error double with every squaring, and a long gap needs many: in float32, at
    $h\lambda=3.5\cdot10^7$ (25 squarings) a plain exponential gave "probabilities" of 1.11
    and a positive log-likelihood; renormalised, the result stays a transition matrix whose
    rows converge to the stationary law as they should. Differentiable like `expm_batched`
    (the derivative of the exact exponential)."""
    return _expm_batched(generators, stochastic=True)


def _transition_matrices_forward(generators):
    return transition_matrices(generators), generators + 0


transition_matrices.defvjp(_transition_matrices_forward, _expm_batched_backward)


def poisson_pmf(mean: Array, length: int) -> Array:
    r"""$\mathrm{Pois}(k;\mu)$ for $k<$ `length`, normalised to sum to one over that range.

    Ratio products out from the mode $m=\lfloor\mu\rfloor$: $w_k/w_m=\prod_{j=m+1}^k\mu/j$ above it
    and $\prod_{j=k+1}^{m}j/\mu$ below it. Every factor is at most one (no overflow), no $e^{-\mu}$
    is formed (no underflow of the bulk), and $w_k$ carries a relative error of about $|k-m|$
    roundings, against $\mu\cdot\mathrm{eps}$ for $\exp(k\log\mu-\mu-\log k!)$."""
    k = jnp.arange(length, dtype=mean.dtype)
    mode = jnp.floor(mean)
    up = jnp.where(k > mode, mean / jnp.maximum(k, 1), 1)
    down = jnp.where(k < mode, (k + 1) / mean, 1)
    w = jnp.cumprod(up) * jnp.flip(jnp.cumprod(jnp.flip(down)))
    return w / jnp.sum(w)


#: `gap_transition_matrices` sums the uniformisation series over shared powers for at least
#: this many gaps (fewer: one exponential each, about as fast)
_SERIES_MIN_GAPS = 8
#: the series' number of terms (powers of the uniformised chain), and the largest mean number
#: of uniformised jumps $\Omega h$ it covers: Poisson(17) puts less than 1e-17 beyond 63 jumps
#: (tested); longer gaps are exponentiated one by one
_SERIES_TERMS = 64
_SERIES_MAX_MEAN = 17.0


def _series_covers(generator: Array, gaps: Array) -> Array:
    """Whether the shared series covers every gap (non-negative, within `_SERIES_MAX_MEAN`)."""
    rate = _per_generator(lambda W, _: _uniformisation_rate(W), generator)(generator, gaps)
    return jnp.all((gaps >= 0) & (jnp.max(rate) * gaps <= _SERIES_MAX_MEAN))


def uniformisation_rate(A: Array) -> Array:
    r"""$\Omega=\max_x(-A(x,x))$, 1 when no state has a positive exit rate."""
    omega = jnp.max(-jnp.diagonal(A))
    return jnp.where(omega > 0, omega, jnp.ones_like(omega))


def _uniformisation_rate(generator: Array) -> Array:
    r"""`uniformisation_rate`, held constant under differentiation: $e^{hW}$ is the same for
    every $\Omega$ at least the largest exit rate."""
    return jax.lax.stop_gradient(uniformisation_rate(generator))


def uniformised_powers(A: Array, count: int) -> tuple[Array, Array, Array]:
    r"""For a matrix `A` with nonnegative off-diagonal entries (a generator, or a node's
    sub-generator): $\Omega$ (`uniformisation_rate`, held constant under differentiation),
    $U=I+A/\Omega$ (nonnegative) and its powers $U^0..U^{\text{count}-1}$ `(count, K, K)`.
    The uniformisation series of the gap tables and the endpoint-conditioned bridges of the
    importance sampler both sum over them."""
    K = A.shape[-1]
    omega = _uniformisation_rate(A)
    U = jnp.eye(K, dtype=A.dtype) + A / omega
    _, powers = jax.lax.scan(
        lambda P, _: (matmul(P, U), P), jnp.eye(K, dtype=A.dtype), None, length=count
    )
    return omega, U, powers


def _uniformised_series(generator: Array, gaps: Array) -> Array:
    r"""$e^{h_kW}=\sum_{n<N}\mathrm{Pois}(n;\Omega h_k)\,U^n$ with $U=I+W/\Omega$, for every gap
    at once: $N$ powers of $U$ (shared) and one matrix product with the gaps' Poisson weights.
    Every term is non-negative (no cancellation; rows sum to one: the weights are normalised over
    the $N$ terms, whose tail the caller bounds). Differentiable in $W$ by autodiff ($\Omega$
    held constant)."""
    S = generator.shape[-1]
    rate, _, powers = uniformised_powers(generator, _SERIES_TERMS)
    weights = jax.vmap(lambda h: poisson_pmf(rate * h, _SERIES_TERMS))(gaps)
    return (weights @ powers.reshape(_SERIES_TERMS, S * S)).reshape(gaps.shape[0], S, S)


def _each_exponential(generator: Array, gaps: Array) -> Array:
    return transition_matrices(gaps[:, None, None] * generator)


def _halved_series(generator: Array, gaps: Array) -> tuple[Array, Array]:
    """`(P, k)`: per gap, the series at $h/2^k$ (`_squared_series`) and its halvings $k$."""
    omega = _per_generator(lambda W, _: _uniformisation_rate(W), generator)(generator, gaps)
    mean = jnp.expand_dims(omega, -1) * gaps  # (G,) or (C, G)
    halvings = jnp.ceil(jnp.log2(jnp.maximum(mean, _SERIES_MAX_MEAN) / _SERIES_MAX_MEAN))
    halvings = jax.lax.stop_gradient(jnp.clip(halvings, 0, _MAX_SQUARINGS))
    short = gaps / 2.0**halvings
    if generator.ndim == 2:
        return _uniformised_series(generator, short), halvings
    return jax.vmap(_uniformised_series)(generator, short), halvings


def _squaring(P: Array, k: Array, halvings: Array) -> Array:
    """Squaring `k` of `_squared_series`: the gaps with more than `k` halvings squared."""
    Q = matmul(P, P)
    Q = Q / jax.lax.stop_gradient(Q.sum(-1, keepdims=True))
    return jnp.where((k < halvings)[..., None, None], Q, P)


def _squared_series(generator: Array, gaps: Array) -> Array:
    r"""$e^{hW}$ for gaps the shared series does not cover, of one generator `(S, S)` or a
    stack `(C, S, S)`: per gap, the series at $h/2^k$ (the fewest halvings $k$ that bring
    $\Omega h/2^k$ within `_SERIES_MAX_MEAN`, held constant under differentiation), squared $k$
    times, each square's rows rescaled to sum to one (the powers of $U$ are non-negative, so
    the squares are: no entry is clipped), the rescaling held constant under differentiation
    (the derivative is that of the exact squares, in every direction, not only along
    generators: as `transition_matrices`' rule). The squarings are a `lax.scan` of
    `_MAX_SQUARINGS` steps, each skipped (`lax.cond`, one predicate for every gap) once every
    gap has had its own, so that it is reverse-differentiable twice by autodiff (the observed
    information) with no matrix exponential's rule in the program; the values alone
    (`_squared_series_values`) loop over the longest gap's squarings only, also under `vmap`
    (where the skipped steps of the scan would be computed and discarded)."""
    P, halvings = _halved_series(generator, gaps)
    return _squarings(P, halvings)


def _squarings(P: Array, halvings: Array) -> Array:
    """The squarings of `_squared_series`: a `lax.scan` of `_MAX_SQUARINGS` steps, each
    skipped (`lax.cond`) once every gap has had its own."""
    most = jnp.max(halvings)

    def step(P, k):
        return jax.lax.cond(k < most, lambda P: _squaring(P, k, halvings), lambda P: P, P), None

    P, _ = jax.lax.scan(step, P, jnp.arange(_MAX_SQUARINGS, dtype=halvings.dtype))
    return P


def _series_squared_where_needed(generator: Array, gaps: Array) -> Array:
    """`_squared_series` with its squarings skipped as a whole (one `lax.cond`) where no gap
    needs one: the shared series' values then, and its derivatives (the one route of the gap
    tables' derivative under `gap_tables_twice_differentiated`). The squarings are recomputed
    where they are differentiated (`jax.checkpoint`), so that a derivative keeps their input
    only, not the `_MAX_SQUARINGS` steps' intermediates, which the skipped branch would fill
    with zeros (cav's intervals: 54 MB at run time instead of 430 MB, and of 152 MB with the
    usual rule)."""
    P, halvings = _halved_series(generator, gaps)
    squarings = jax.checkpoint(lambda P: _squarings(P, halvings))
    return jax.lax.cond(jnp.max(halvings) > 0, squarings, lambda P: P, P)


def _squared_series_values(generator: Array, gaps: Array) -> Array:
    """`_squared_series`' values (the same operations), not differentiable: a loop of as
    many squarings as the longest gap needs."""
    P, halvings = _halved_series(generator, gaps)
    most = jnp.max(halvings).astype(jnp.int32)
    return jax.lax.fori_loop(0, most, lambda k, P: _squaring(P, k.astype(gaps.dtype), halvings), P)


def _per_generator(fn, generator: Array):
    """`fn(W, gaps)` of one generator `(S, S)`, or of each of a stack `(K, S, S)` (vmapped;
    the caller's `lax.cond` on all of them stays one branch, not a select of both)."""
    return fn if generator.ndim == 2 else jax.vmap(fn, in_axes=(0, None))


def _gap_transition_values(generator: Array, gaps: Array) -> Array:
    each = _per_generator(_each_exponential, generator)
    if gaps.shape[0] < _SERIES_MIN_GAPS:
        return each(generator, gaps)
    return jax.lax.cond(
        _series_covers(generator, gaps),
        _per_generator(_uniformised_series, generator),
        _squared_series_values,
        generator,
        gaps,
    )


@jax.custom_vjp
def gap_transition_matrices(generator: Array, gaps: Array) -> Array:
    r"""$P_k=e^{h_kW}$ `(K, S, S)` of one generator $W$ `(S, S)` over the gaps $h_k$ `(K,)` (of
    each of a stack of generators `(C, S, S)`: `(C, K, S, S)`, one branch for all), as
    [`transition_matrices`][jaxctbn._master_equation.dense_linalg.transition_matrices]. The
    derivative in the gaps is $\partial P_k/\partial h_k=WP_k$ (a matrix product, where the
    generic rule differentiates the exponential of $h_kW$ in every direction: a $2S\times2S$
    exponential per gap); that in $W$ is the generic one (dropped by the compiler when only
    the gaps are differentiated, as in a visit-time search).

    With at least `_SERIES_MIN_GAPS` gaps, all within `_SERIES_MAX_MEAN` mean uniformised
    jumps, the matrices are the uniformisation series summed over **shared** powers
    $U^n$, $U=I+W/\Omega$: $P_k=\sum_{n<64}\mathrm{Pois}(n;\Omega h_k)U^n$ (truncated beyond a
    Poisson tail of 1e-17), and the derivative in $W$ is that of the series. One gap table of
    1,536 gaps of a 4-state generator: 0.8 ms and 0.7 ms for its gradient against 2.9 ms and
    7.6 ms one exponential each; of a 32-state one 4.6 ms and 14 ms against 188 ms and 1.2 s.
    Otherwise (a longer gap: `lax.cond` on the values) each gap's series is taken at a
    fraction $h/2^k$ of it and squared $k$ times (`_squared_series`); with fewer gaps than
    `_SERIES_MIN_GAPS`, each gap has its own exponential. Where the derivative is to be
    differentiated again (`gap_tables_twice_differentiated`), it is taken by one route for
    every gap, the squared series with its squarings skipped where none is needed."""
    return _gap_transition_values(generator, gaps)


# The forward rule calls the custom-VJP function itself (the same values): differentiated
# again from outside (reverse over reverse), the tables then follow this rule, not the loop of
# `_squared_series_values`, which reverse mode cannot differentiate.
def _gap_transition_matrices_forward(generator, gaps):
    P = gap_transition_matrices(generator, gaps)
    return P, (generator, gaps, P)


def _gap_transition_matrices_backward(residuals, cotangent):
    generator, gaps, P = residuals
    W = jnp.broadcast_to(jnp.expand_dims(generator, -3), P.shape)
    d_gaps = jnp.sum(cotangent * matmul(W, P), axis=(-2, -1)).reshape(-1, gaps.shape[0]).sum(0)

    def each(generator):
        (d_scaled,) = _expm_batched_backward(
            (gaps[:, None, None] * jnp.expand_dims(generator, -3)).reshape(-1, *P.shape[-2:]),
            cotangent.reshape(-1, *P.shape[-2:]),
        )
        d_scaled = d_scaled.reshape(P.shape)
        return jnp.sum(gaps[:, None, None] * d_scaled, axis=-3)

    def by_autodiff(fn):
        def pulled_back(generator):
            _, pullback = jax.vjp(lambda W: fn(W, gaps), generator)
            return pullback(cotangent)[0]

        return pulled_back

    if gaps.shape[0] < _SERIES_MIN_GAPS:
        return each(generator), d_gaps
    if _twice_differentiated():
        return by_autodiff(_series_squared_where_needed)(generator), d_gaps
    shared = by_autodiff(_per_generator(_uniformised_series, generator))
    return jax.lax.cond(
        _series_covers(generator, gaps), shared, by_autodiff(_squared_series), generator
    ), d_gaps


gap_transition_matrices.defvjp(_gap_transition_matrices_forward, _gap_transition_matrices_backward)


#: Whether the gap tables' derivative rule is being traced to be differentiated again
#: (`gap_tables_twice_differentiated`), registered when this module is imported (registered
#: later, it would change the jit key of the functions compiled before it); None where JAX's
#: private names differ (then the usual rule, the same values)
_TWICE_STATE = registered_trace_state(
    "jaxctbn_gap_tables_twice_differentiated",
    "jaxctbn: the gap tables' derivative by one route (second derivatives).",
)


def _twice_differentiated() -> bool:
    return _TWICE_STATE is not None and bool(_TWICE_STATE.value)


@contextlib.contextmanager
def gap_tables_twice_differentiated():
    r"""Within (this thread): the derivative in $W$ of
    [`gap_transition_matrices`][jaxctbn._master_equation.dense_linalg.gap_transition_matrices]
    is traced by one route for every gap (`_series_squared_where_needed`: the series at
    $h/2^k$, its squarings skipped as a whole where no gap needs one), not a `lax.cond`
    between the shared series and the squared one, for a caller that differentiates it again
    (reverse over reverse: the observed information of a panel fit). The same derivative (the
    command line's panel intervals bit for bit on psor, cav, cav ~ sex and a cav ~ sex data set
    beyond the series); its own derivative is then traced once, not for both branches (the
    Hessian of a 16-gap table of a 4-state generator: 1,805 operations in place of 2,196,
    traced in 0.47 s instead of 0.67 s, run in 0.60 ms instead of 0.65 ms). A first derivative
    keeps the `lax.cond`, which runs the shared series alone where it covers every gap (the
    16-gap table's gradient: 70 us, against 94 us by this route)."""
    if _TWICE_STATE is None:
        yield
        return
    with _TWICE_STATE(True):
        yield


def expm(matrix: Array) -> Array:
    """$e^{A}$ of one matrix `(n, n)`
    ([`expm_batched`][jaxctbn._master_equation.dense_linalg.expm_batched] on a batch of one;
    under `jax.vmap` a batch of many)."""
    return expm_batched(matrix[None])[0]
