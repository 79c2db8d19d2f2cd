r"""Master-equation solvers: each computes, for one amalgamated generator $W$ and initial
distribution $p_0$, the final marginal $p_\tau=p_0e^{\tau W}$ and the integrated marginal
$\int_0^\tau p_t\,dt$ (`MATH.md` §1).

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

from ._generator import AbstractGenerator, batch_last


class AbstractMasterEquationSolver(eqx.Module):
    """Computes $p_\\tau$ and $\\int_0^\\tau p_t\\,dt$ for one generator and initial distribution."""

    @abc.abstractmethod
    def solve(self, generator: AbstractGenerator, p0: Array, horizon: Array) -> tuple[Array, Array]:
        """Returns `(final_marginal, integrated_marginal)` for one problem."""

    @abc.abstractmethod
    def solve_batch(
        self, generators: AbstractGenerator, p0: Array, horizon: Array
    ) -> tuple[Array, Array]:
        """The same for a batch (leading axis on `generators` and `p0`, one scalar `horizon`)."""


def _poisson_tail_not_small(k, log_pmf, mean, tol):
    """Whether Pr(N >= k) may still exceed `tol`, N ~ Poisson(mean), given log Pr(N = k).

    For k + 1 > mean the tail is bounded by Pr(N=k) / (1 - mean/(k+1)) (geometric bound)."""
    bound = jnp.exp(log_pmf) / jnp.maximum(1 - mean / (k + 1), 1e-3)
    return (k < mean + 1) | (bound >= tol)


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
    $\lambda\ge\max d$, so this is the exact gradient).

    **Arguments (keyword-only):**

    - `tolerance`: Poisson tail mass at which to stop (default `1e-13`; use ~`1e-7` in float32).
    - `max_terms`: hard limit on the number of products; reaching it raises an error.
    """

    tolerance: float = eqx.field(default=1e-13, static=True)
    max_terms: int = eqx.field(default=1_000_000, static=True)

    def _uniformise(self, generator, p0, horizon):
        # p0: (S, *batch) with the generator's batch axes trailing; scalars have shape batch.
        dtype = p0.dtype
        horizon = jnp.asarray(horizon, dtype)
        lam = jax.lax.stop_gradient(
            jnp.maximum(generator.max_exit_rate(), 1.0 / horizon) * 1.0000001
        ).astype(dtype)
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
            v = v + generator.apply(v) / lam
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

    **Arguments (keyword-only):** `solver` (default `diffrax.Tsit5()`), `rtol`, `atol`,
    `max_steps`.
    """

    solver: Any = None  # a diffrax.AbstractSolver; None = diffrax.Tsit5() (diffrax loads lazily)
    rtol: float = 1e-10
    atol: float = 1e-12
    max_steps: int = eqx.field(default=100_000, static=True)

    def diffeqsolve(self, apply, p0, horizon) -> Any:
        """The underlying `diffrax.diffeqsolve` call (its `stats` count the steps taken)."""
        import diffrax

        term = diffrax.ODETerm(lambda t, y, args: (apply(y[0]), y[0]))
        controller = diffrax.PIDController(rtol=self.rtol, atol=self.atol, norm=_max_norm)
        sol = diffrax.diffeqsolve(
            term,
            diffrax.Tsit5() if self.solver is None else self.solver,
            t0=jnp.zeros((), p0.dtype),
            t1=jnp.asarray(horizon, p0.dtype),
            dt0=None,
            y0=(p0, jnp.zeros_like(p0)),
            stepsize_controller=controller,
            saveat=diffrax.SaveAt(t1=True),
            max_steps=self.max_steps,
        )
        return sol

    def _solve(self, apply, p0, horizon):
        p, integral = self.diffeqsolve(apply, p0, horizon).ys
        return p[0], integral[0]

    def solve(self, generator, p0, horizon):
        return self._solve(generator.apply, p0, horizon)

    def solve_batch(self, generators, p0, horizon):
        # one ODE for the whole batch (shared steps), batch axis last for vectorised products
        p, integral = self._solve(batch_last(generators).apply, p0.T, horizon)
        return p.T, integral.T


class MatrixExponential(AbstractMasterEquationSolver):
    r"""Dense block matrix exponential: $[p_\tau, \int_0^\tau p_t dt] = [p_0, 0]\,
    \exp\big(\tau\begin{bmatrix}W & I\\ 0 & 0\end{bmatrix}\big)$.

    Exact up to Padé/scaling-and-squaring accuracy; forms a $2S\times 2S$ matrix, so only for small
    networks. `solve_batch` uses `lax.map` (vmapping `expm` would evaluate every Padé branch).
    """

    def solve(self, generator, p0, horizon):
        S = p0.shape[0]
        W = generator.dense()
        eye = jnp.eye(S, dtype=W.dtype)
        A = jnp.block([[W, eye], [jnp.zeros_like(W), jnp.zeros_like(W)]])
        E = jax.scipy.linalg.expm(jnp.asarray(horizon, W.dtype) * A)
        z = jnp.concatenate([p0, jnp.zeros_like(p0)]) @ E
        return z[:S], z[S:]

    def solve_batch(self, generators, p0, horizon):
        return jax.lax.map(lambda gp: self.solve(gp[0], gp[1], horizon), (generators, p0))


DEFAULT_SOLVER = Uniformisation()
