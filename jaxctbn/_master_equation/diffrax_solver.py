r"""[`jaxctbn.DiffraxSolver`][]: any diffrax ODE solver on the augmented system
$\dot p = pW,\ \dot I = p$, matrix-free; `solve_batch` runs one solve over a whole batch with
shared step sizes."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

from .flows import pull_shifts
from .generator import batch_last
from .solver import AbstractMasterEquationSolver


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
            return generator.apply(a), a * b, a[None] * pull_shifts(generator, b)

        y0 = (
            alpha_start,
            jnp.zeros_like(alpha_start),
            jnp.zeros((len(generator.shifts),) + alpha_start.shape, dtype),
        )
        _, dwell, flux = self._diffeqsolve(vector_field, y0, horizon).ys
        return dwell[0], flux[0]
