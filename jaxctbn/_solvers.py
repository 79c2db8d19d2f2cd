r"""Master-equation solvers: each computes, for one amalgamated generator $W$ and initial
distribution $p_0$, the final marginal $p_\tau=p_0e^{\tau W}$ and the integrated marginal
$\int_0^\tau p_t\,dt$ (maths §1); the backward (adjoint) equation $-\dot\beta_t=W\beta_t$;
and the forward-backward interval integrals $\int_0^\tau\alpha_t(s)\beta_t(s')\,dt$ that smoothing
of partially observed paths needs.

- [`jaxctbn.Uniformisation`][] (default): exact, matrix-free, $\approx\lambda\tau+O(\sqrt{\lambda\tau})$
  products with $W$, $\lambda=\max_s -W(s,s)$.
- [`jaxctbn.DiffraxSolver`][]: any diffrax ODE solver on the augmented system
  $\dot p = pW,\ \dot I = p$, matrix-free; `solve_batch` runs one solve over a whole batch with
  shared step sizes.
- [`jaxctbn.MatrixExponential`][]: the dense block exponential
  $\exp(\tau[[W, I],[0, 0]])$, the exact reference for small networks.
"""

from __future__ import annotations

import abc
from typing import Any

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
from jaxtyping import Array

from ._generator import AbstractGenerator, _shift_indices, batch_last


class AbstractMasterEquationSolver(eqx.Module):
    r"""Solves the master equation $\dot p_t=p_tW$ of one amalgamated generator $W$ (a row
    vector $p$ over the $S$ global states), its adjoint $-\dot\beta_t=W\beta_t$ (a column vector
    $\beta$), and the forward-backward interval integrals.

    To add a solver, subclass this and implement `solve`, `solve_batch`, `solve_backward` and
    `forward_backward`; `solve_backward_batch` has a default (`jax.lax.map` over
    `solve_backward`) that a subclass may override with a faster batched form. Every method must
    be pure (work under `jax.jit` and `jax.vmap`) and should be reverse-mode differentiable with
    respect to the rates inside `generator`. Only [`jaxctbn.AbstractGenerator.apply`][]
    ($p\mapsto pW$), [`jaxctbn.AbstractGenerator.apply_transpose`][] ($v\mapsto Wv$),
    `shifts`/`shift_rates` and, for small networks, `dense()` are available from a generator.
    """

    @abc.abstractmethod
    def solve(self, generator: AbstractGenerator, p0: Array, horizon: Array) -> tuple[Array, Array]:
        r"""The forward (master) equation $\dot p_t=p_tW$ on $[0,\tau]$ from $p_0$.

        **Arguments:**

        - `generator`: the amalgamated generator $W$ (one network, `batch_shape == ()`).
        - `p0`: the initial row vector $p_0$, shape `(S,)` (a distribution, or any vector).
        - `horizon`: $\tau>0$, a scalar (already validated by the caller).

        **Returns:** `(final_marginal, integrated_marginal)`: $p_\tau=p_0e^{\tau W}$ and
        $\int_0^\tau p_t\,dt$, both of shape `(S,)` and the dtype of `p0`.
        """

    @abc.abstractmethod
    def solve_batch(
        self, generators: AbstractGenerator, p0: Array, horizon: Array
    ) -> tuple[Array, Array]:
        r"""`solve` for a batch of problems sharing one $\tau$.

        **Arguments:**

        - `generators`: a batch of generators, every array with a leading batch axis `B`
          (e.g. from `jax.vmap(amalgamate)`); see [`jaxctbn.batch_last`][] for a vectorised
          product over the batch.
        - `p0`: initial row vectors, shape `(B, S)`.
        - `horizon`: $\tau>0$, one scalar shared by the batch.

        **Returns:** `(final_marginal, integrated_marginal)`, each of shape `(B, S)`.
        """

    @abc.abstractmethod
    def solve_backward(
        self, generator: AbstractGenerator, beta_end: Array, horizon: Array
    ) -> tuple[Array, Array]:
        r"""The backward (adjoint) equation $-\dot\beta_t=W\beta_t$ on $[0,\tau]$ with final
        condition $\beta_\tau$.

        **Arguments:**

        - `generator`: the amalgamated generator $W$ (one network).
        - `beta_end`: the final column vector $\beta_\tau$, shape `(S,)` (e.g. the likelihood of
          an observation at $\tau$ as a function of the global state).
        - `horizon`: $\tau>0$, a scalar.

        **Returns:** `(beta_start, integrated_beta)`: $\beta_0=e^{\tau W}\beta_\tau$ and
        $\int_0^\tau\beta_t\,dt=\int_0^\tau e^{tW}\beta_\tau\,dt$, both of shape `(S,)`.
        With $\beta_\tau=\mathbf 1$, $\beta_0=\mathbf 1$ (the rows of $e^{\tau W}$ sum to one).
        """

    def solve_backward_batch(
        self, generators: AbstractGenerator, beta_end: Array, horizon: Array
    ) -> tuple[Array, Array]:
        r"""`solve_backward` for a batch sharing one $\tau$ (leading batch axis `B` on
        `generators` and on `beta_end`, shape `(B, S)`).

        **Returns:** `(beta_start, integrated_beta)`, each of shape `(B, S)`. The default runs
        `solve_backward` once per member with `jax.lax.map`; override it for a vectorised form.
        """
        return jax.lax.map(
            lambda gb: self.solve_backward(gb[0], gb[1], horizon), (generators, beta_end)
        )

    @abc.abstractmethod
    def forward_backward(
        self, generator: AbstractGenerator, alpha_start: Array, beta_end: Array, horizon: Array
    ) -> tuple[Array, Array]:
        r"""Interval integrals of forward times backward solution, for forward-backward smoothing.

        With $\alpha_t=\alpha_0e^{tW}$ (row vector) and $\beta_t=e^{(\tau-t)W}\beta_\tau$ (column
        vector), and for shift $r=(n,j)$ of `generator.shifts`, $s_r'$ the global state reached
        from $s$ by moving node $n$ forward by $j$ (mod $k_n$):

        $$\mathrm{dwell}(s)=\int_0^\tau\alpha_t(s)\,\beta_t(s)\,dt,\qquad
        \mathrm{flux}_r(s)=\int_0^\tau\alpha_t(s)\,\beta_t(s_r')\,dt .$$

        Conditioned on the evidence summarised by $\alpha_0$ and $\beta_\tau$, the expected dwell
        time in $s$ is $\mathrm{dwell}(s)/Z$ and the expected number of $s\to s_r'$ transitions
        is $R_r(s)\,\mathrm{flux}_r(s)/Z$ (`generator.shift_rates(r)`), with
        $Z=\alpha_0\beta_0=\alpha_t\beta_t$ for every $t$; that normalisation is the caller's.
        Since $\alpha_t\beta_t$ is constant, $\sum_s\mathrm{dwell}(s)=\tau\,\alpha_0\beta_0$.

        **Arguments:**

        - `generator`: the amalgamated generator $W$ (one network).
        - `alpha_start`: the row vector $\alpha_0$, shape `(S,)`.
        - `beta_end`: the column vector $\beta_\tau$, shape `(S,)`.
        - `horizon`: $\tau>0$, a scalar.

        **Returns:** `(dwell, flux)` of shapes `(S,)` and `(len(generator.shifts), S)`.
        """


def _poisson_tail_not_small(k, log_pmf, mean, tol):
    """Whether Pr(N >= k) may still exceed `tol`, N ~ Poisson(mean), given log Pr(N = k).

    For k + 1 > mean the tail is bounded by Pr(N=k) / (1 - mean/(k+1)) (geometric bound)."""
    bound = jnp.exp(log_pmf) / jnp.maximum(1 - mean / (k + 1), 1e-3)
    return (k < mean + 1) | (bound >= tol)


def _pull_shifts(generator: AbstractGenerator, v: Array) -> Array:
    """`out[r, s] = v[s_r']` for every shift r = (n, j): node n of s moved forward by j.

    `v` has shape `(S,)`; returns `(len(shifts), S)`."""
    cards = generator.cardinalities
    vt = v.reshape(cards)
    rows = [
        (jnp.flip(vt, axis=n) if cards[n] == 2 else jnp.roll(vt, -j, axis=n)).reshape(-1)
        for n, j in generator.shifts
    ]
    return jnp.stack(rows) if rows else jnp.zeros((0,) + v.shape, v.dtype)


class Uniformisation(AbstractMasterEquationSolver):
    r"""Exact uniformisation (Jensen's method), matrix-free.

    With $\lambda\ge\max_s d(s)$ and $P=I+W/\lambda$, and $N\sim\mathrm{Poisson}(\lambda\tau)$,

    $$p_\tau=\sum_{k\ge0}\Pr(N=k)\,p_0P^k,\qquad
    \int_0^\tau p_t\,dt=\frac1\lambda\sum_{k\ge0}\Pr(N>k)\,p_0P^k .$$

    The series stops once $\Pr(N>k)$ < `tolerance`; all weights are non-negative, so there is no
    cancellation and the result is accurate to about `tolerance` (relative to $\tau$ for the
    integral). Poisson weights are computed in log space (no underflow for large $\lambda\tau$).
    The loop is an `equinox.internal.while_loop(kind="checkpointed")`, so reverse-mode autodiff
    works; $\lambda$ is held constant under differentiation (the result is exact for every
    $\lambda\ge\max d$, so this is the exact gradient). `solve_backward` is the same series with
    $P\beta$ in place of $pP$.

    `forward_backward` uses, with $a_k=\alpha_0P^k$, $b_j=P^j\beta_\tau$ and the Beta integral
    $\int_0^\tau\mathrm{Pois}(k;\lambda t)\,\mathrm{Pois}(j;\lambda(\tau-t))\,dt
    =\mathrm{Pois}(k+j+1;\lambda\tau)/\lambda$,

    $$\int_0^\tau\alpha_t(s)\beta_t(s')\,dt=\frac1\lambda\sum_{k,j\ge0}
    \mathrm{Pois}(k+j+1;\lambda\tau)\,a_k(s)\,b_j(s')
    =\frac1\lambda\sum_k a_k(s)\,c_k(s'),\quad c_k=\sum_j\mathrm{Pois}(k+j+1;\lambda\tau)\,b_j,$$

    truncated at $K$ terms, the first $K$ with $\Pr(N\ge K)$ < `tolerance` (so the neglected part
    of $\sum_s\mathrm{dwell}(s)$ is below `tolerance` $\cdot\,\tau\,\|\alpha_0\|_1
    \|\beta_\tau\|_\infty$). For non-negative $\alpha_0,\beta_\tau$ every term is
    non-negative (no cancellation). Cost, with $K_{\max}$ = `fb_max_terms` and $J$ shifts:
    $2K$ products with $W$; $K$ products of the $K_{\max}\times S$ buffer of the $b_j$ with a
    window of Poisson weights, $O(K\,K_{\max}\,S)$ flops (the dominant term unless $J$ is
    large); $O(K\,J\,S)$ for the shifted products. Memory $K_{\max}S$ plus $O(JS)$ (reverse
    mode adds the checkpoints of two loops). Meant for moderate $S$ and $\lambda\tau$; if
    $K>K_{\max}$ an error is raised (never a silent truncation).

    **Arguments (keyword-only):**

    - `tolerance`: Poisson tail mass at which to stop (default `1e-13`; use ~`1e-7` in float32).
    - `max_terms`: hard limit on the number of products; reaching it raises an error.
    - `fb_max_terms`: static size of the buffer of backward vectors in `forward_backward`
      (default 512); more terms needed raises an error.
    """

    tolerance: float = eqx.field(default=1e-13, static=True)
    max_terms: int = eqx.field(default=1_000_000, static=True)
    fb_max_terms: int = eqx.field(default=512, static=True)

    @staticmethod
    def _rate(generator, horizon, dtype):
        return jax.lax.stop_gradient(
            jnp.maximum(generator.max_exit_rate(), 1.0 / horizon) * 1.0000001
        ).astype(dtype)

    def _uniformise(self, generator, p0, horizon, transpose=False):
        # p0: (S, *batch) with the generator's batch axes trailing; scalars have shape batch.
        # transpose=False: row vectors, p -> pW; transpose=True: column vectors, v -> Wv.
        apply = generator.apply_transpose if transpose else generator.apply
        dtype = p0.dtype
        horizon = jnp.asarray(horizon, dtype)
        lam = self._rate(generator, horizon, dtype)
        mean = lam * horizon
        log_mean = jnp.log(mean)
        tol = jnp.asarray(self.tolerance, dtype)
        one = jnp.ones((), dtype)

        # Scalar recursions (cheap next to a product with W): log Pr(N=k) by
        # log p_{k+1} = log p_k + log(mean) - log(k+1), and Pr(N>k) = 1 - sum_{j<=k} p_j with
        # Kahan-compensated summation so the small tail keeps its relative accuracy.
        def cond(carry):
            k, _, _, _, log_pmf, _, _ = carry
            return jnp.any(_poisson_tail_not_small(k.astype(dtype), log_pmf, mean, tol))

        def body(carry):
            k, v, acc_p, acc_i, log_pmf, csum, comp = carry
            kf = k.astype(dtype)
            pmf = jnp.exp(log_pmf)
            y = pmf - comp
            t_sum = csum + y
            comp = (t_sum - csum) - y
            csum = t_sum
            tail = jnp.clip((one - csum) + comp, 0.0, 1.0)  # Pr(N > k)
            acc_p = acc_p + pmf * v
            acc_i = acc_i + (tail / lam) * v
            v = v + apply(v) / lam
            log_pmf = log_pmf + log_mean - jnp.log(kf + 1)
            return k + 1, v, acc_p, acc_i, log_pmf, csum, comp

        zero = jnp.zeros_like(p0)
        zero_s = jnp.zeros_like(mean)
        init = (jnp.asarray(0, jnp.int32), p0, zero, zero, -mean, zero_s, zero_s)
        k, _, acc_p, acc_i, log_pmf, _, _ = eqxi.while_loop(
            cond, body, init, max_steps=self.max_terms, kind="checkpointed"
        )
        acc_p = eqx.error_if(
            acc_p,
            cond((k, None, None, None, log_pmf, None, None)),
            "Uniformisation: max_terms reached before the Poisson tail fell below tolerance; "
            "increase max_terms (the rates times the horizon are very large).",
        )
        return acc_p, acc_i

    def solve(self, generator, p0, horizon):
        return self._uniformise(generator, p0, horizon)

    def solve_batch(self, generators, p0, horizon):
        # one loop for the whole batch, batch axis last so every product vectorises over it
        p, integral = self._uniformise(batch_last(generators), p0.T, horizon)
        return p.T, integral.T

    def solve_backward(self, generator, beta_end, horizon):
        return self._uniformise(generator, beta_end, horizon, transpose=True)

    def solve_backward_batch(self, generators, beta_end, horizon):
        beta, integral = self._uniformise(
            batch_last(generators), beta_end.T, horizon, transpose=True
        )
        return beta.T, integral.T

    def forward_backward(self, generator, alpha_start, beta_end, horizon):
        dtype = alpha_start.dtype
        beta_end = jnp.asarray(beta_end, dtype)
        horizon = jnp.asarray(horizon, dtype)
        lam = self._rate(generator, horizon, dtype)
        mean = lam * horizon
        log_mean = jnp.log(mean)
        tol = jnp.asarray(self.tolerance, dtype)
        K_max = self.fb_max_terms

        # Number of terms K: the first k with Pr(N >= k) < tolerance (at most K_max + 1 here).
        # An integer, so no derivative: computed from stopped values with a plain while loop.
        mean_c, log_mean_c = jax.lax.stop_gradient((mean, log_mean))

        def k_cond(c):
            k, log_pmf = c
            return (k <= K_max) & _poisson_tail_not_small(k.astype(dtype), log_pmf, mean_c, tol)

        def k_body(c):
            k, log_pmf = c
            return k + 1, log_pmf + log_mean_c - jnp.log((k + 1).astype(dtype))

        K, _ = jax.lax.while_loop(k_cond, k_body, (jnp.asarray(0, jnp.int32), -mean_c))

        # Poisson weights w[m] = Pois(m; mean) for 1 <= m <= K, else 0, in log space.
        m = jnp.arange(2 * K_max, dtype=dtype)
        log_w = -mean + m * log_mean - jax.scipy.special.gammaln(m + 1)
        w = jnp.where((m >= 1) & (m <= K.astype(dtype)), jnp.exp(log_w), 0.0)

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
            flux = flux + a[None] * _pull_shifts(generator, ck)
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
        too_many = K > K_max
        msg = (
            "Uniformisation.forward_backward: more than fb_max_terms terms needed for the "
            "Poisson tail to fall below tolerance; increase fb_max_terms (the rates times the "
            "horizon are large)."
        )
        dwell = eqx.error_if(dwell / lam, too_many, msg)
        flux = eqx.error_if(flux / lam, too_many, msg)
        return dwell, flux

    def num_products(self, generator: AbstractGenerator, horizon) -> Array:
        """How many products with $W$ `solve` takes for this generator and horizon."""
        dtype = generator.exit_rates.dtype
        horizon = jnp.asarray(horizon, dtype)
        lam = jnp.maximum(generator.max_exit_rate(), 1.0 / horizon) * 1.0000001
        mean = lam * horizon
        tol = jnp.asarray(self.tolerance, dtype)

        def cond(c):
            return _poisson_tail_not_small(c[0], c[1], mean, tol)

        def body(c):
            k, log_pmf = c
            return k + 1, log_pmf + jnp.log(mean) - jnp.log(k + 1)

        k, _ = jax.lax.while_loop(cond, body, (jnp.zeros((), dtype), -mean))
        return k.astype(jnp.int32)


def _max_norm(tree) -> Array:
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.max(jnp.stack([jnp.max(jnp.abs(x)) for x in leaves]))


class DiffraxSolver(AbstractMasterEquationSolver):
    r"""The master equation as an ODE, $\dot p_t = p_tW$, $\dot I_t = p_t$, solved by diffrax
    (matrix-free: only $p\mapsto pW$ is evaluated).

    `solve_batch` solves a whole batch as **one** ODE whose state is the stacked batch, so all
    members share step sizes (the error norm is the max over the batch); under `jax.vmap` of
    `solve` every member instead runs its own adaptive loop in lock-step. Differentiable by
    diffrax's `RecursiveCheckpointAdjoint`.

    `solve_backward` solves $\dot\gamma_s=W\gamma_s$, $\gamma_0=\beta_\tau$, in reversed time
    $s=\tau-t$. `forward_backward` first solves that backward equation with a dense (interpolated)
    solution, then integrates $\dot\alpha_t=\alpha_tW$ jointly with
    $\dot{\mathrm{dwell}}=\alpha_t\odot\beta_t$ and
    $\dot{\mathrm{flux}}_r=\alpha_t\odot\beta_t(\cdot_r')$, reading $\beta_t$ from the
    interpolant (accuracy set by `rtol`/`atol` and the interpolant's order, about `rtol`).

    **Arguments (keyword-only):** `solver` (default `diffrax.Tsit5()`), `rtol`, `atol`,
    `max_steps`, `dense_max_steps` (step limit of the dense backward solve in
    `forward_backward`, whose memory is proportional to it times $S$; default 4096).
    """

    solver: Any = None  # a diffrax.AbstractSolver; None = diffrax.Tsit5() (diffrax loads lazily)
    rtol: float = 1e-10
    atol: float = 1e-12
    max_steps: int = eqx.field(default=100_000, static=True)
    dense_max_steps: int = eqx.field(default=4096, static=True)

    def _diffeqsolve(self, vector_field, y0, horizon, *, dense=False) -> Any:
        import diffrax

        dtype = jax.tree_util.tree_leaves(y0)[0].dtype
        controller = diffrax.PIDController(rtol=self.rtol, atol=self.atol, norm=_max_norm)
        return diffrax.diffeqsolve(
            diffrax.ODETerm(vector_field),
            diffrax.Tsit5() if self.solver is None else self.solver,
            t0=jnp.zeros((), dtype),
            t1=jnp.asarray(horizon, dtype),
            dt0=None,
            y0=y0,
            stepsize_controller=controller,
            saveat=diffrax.SaveAt(dense=True) if dense else diffrax.SaveAt(t1=True),
            max_steps=self.dense_max_steps if dense else self.max_steps,
        )

    def diffeqsolve(self, apply, p0, horizon) -> Any:
        """The underlying `diffrax.diffeqsolve` call (its `stats` count the steps taken)."""
        return self._diffeqsolve(
            lambda t, y, args: (apply(y[0]), y[0]), (p0, jnp.zeros_like(p0)), horizon
        )

    def _solve(self, apply, p0, horizon):
        p, integral = self.diffeqsolve(apply, p0, horizon).ys
        return p[0], integral[0]

    def solve(self, generator, p0, horizon):
        return self._solve(generator.apply, p0, horizon)

    def solve_batch(self, generators, p0, horizon):
        # one ODE for the whole batch (shared steps), batch axis last for vectorised products
        p, integral = self._solve(batch_last(generators).apply, p0.T, horizon)
        return p.T, integral.T

    def solve_backward(self, generator, beta_end, horizon):
        # gamma_s = beta_{tau - s} solves gamma' = W gamma, gamma_0 = beta_end
        return self._solve(generator.apply_transpose, beta_end, horizon)

    def solve_backward_batch(self, generators, beta_end, horizon):
        beta, integral = self._solve(batch_last(generators).apply_transpose, beta_end.T, horizon)
        return beta.T, integral.T

    def forward_backward(self, generator, alpha_start, beta_end, horizon):
        dtype = alpha_start.dtype
        beta_end = jnp.asarray(beta_end, dtype)
        horizon = jnp.asarray(horizon, dtype)
        backward = self._diffeqsolve(
            lambda s, g, args: generator.apply_transpose(g), beta_end, horizon, dense=True
        )

        def vector_field(t, y, args):
            a = y[0]
            b = backward.evaluate(horizon - t)
            return generator.apply(a), a * b, a[None] * _pull_shifts(generator, b)

        y0 = (
            alpha_start,
            jnp.zeros_like(alpha_start),
            jnp.zeros((len(generator.shifts),) + alpha_start.shape, dtype),
        )
        _, dwell, flux = self._diffeqsolve(vector_field, y0, horizon).ys
        return dwell[0], flux[0]


class MatrixExponential(AbstractMasterEquationSolver):
    r"""Dense block matrix exponential: $[p_\tau, \int_0^\tau p_t dt] = [p_0, 0]\,
    \exp\big(\tau\begin{bmatrix}W & I\\ 0 & 0\end{bmatrix}\big)$.

    `solve_backward` is the same with $W^\top$ (the backward solution is
    $\beta_0^\top=\beta_\tau^\top e^{\tau W^\top}$). `forward_backward` uses Van Loan's block
    exponential: with $A=W^\top$ and $B=\alpha_0^\top\beta_\tau^\top$, the upper-right block of
    $\exp\big(\tau\begin{bmatrix}A&B\\0&A\end{bmatrix}\big)$ is
    $C=\int_0^\tau e^{tA}Be^{(\tau-t)A}dt$, $C(s,s')=\int_0^\tau\alpha_t(s)\beta_t(s')\,dt$;
    dwell and flux are read from $C$.

    Exact up to Padé/scaling-and-squaring accuracy; forms a $2S\times 2S$ matrix, so only for small
    networks. `solve_batch` uses `lax.map` (vmapping `expm` would evaluate every Padé branch).
    """

    @staticmethod
    def _moments(W, p0, horizon):
        S = p0.shape[0]
        eye = jnp.eye(S, dtype=W.dtype)
        A = jnp.block([[W, eye], [jnp.zeros_like(W), jnp.zeros_like(W)]])
        E = jax.scipy.linalg.expm(jnp.asarray(horizon, W.dtype) * A)
        z = jnp.concatenate([p0, jnp.zeros_like(p0)]) @ E
        return z[:S], z[S:]

    def solve(self, generator, p0, horizon):
        return self._moments(generator.dense(), p0, horizon)

    def solve_batch(self, generators, p0, horizon):
        return jax.lax.map(lambda gp: self.solve(gp[0], gp[1], horizon), (generators, p0))

    def solve_backward(self, generator, beta_end, horizon):
        return self._moments(generator.dense().T, beta_end, horizon)

    def forward_backward(self, generator, alpha_start, beta_end, horizon):
        S = alpha_start.shape[0]
        A = generator.dense().T
        B = jnp.outer(alpha_start, jnp.asarray(beta_end, A.dtype))
        M = jnp.block([[A, B], [jnp.zeros_like(A), A]])
        C = jax.scipy.linalg.expm(jnp.asarray(horizon, A.dtype) * M)[:S, S:]
        src, dst = _shift_indices(generator.cardinalities)
        return jnp.diagonal(C), C[src, dst]


DEFAULT_SOLVER = Uniformisation()
