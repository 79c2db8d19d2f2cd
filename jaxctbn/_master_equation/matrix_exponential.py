r"""[`jaxctbn.MatrixExponential`][]: the dense block exponential
$\exp(\tau[[W, I],[0, 0]])$, the exact reference for small networks."""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array

from .._errors import error_if
from .dense_linalg import expm, expm_batched, gap_transition_matrices, transition_matrices
from .generator import AbstractGenerator, shift_indices
from .solver import AbstractMasterEquationSolver


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
    networks. `solve_batch` uses `lax.map` (memory for one $2S\times2S$ block at a time). The
    exponential is [13/13] Padé with scaling and squaring, and never calls a batched LAPACK
    kernel (`jaxctbn/_master_equation/dense_linalg.py` explains the deadlock that avoids).
    The cost does not depend on $\lambda\tau$ (up to $\log_2$ of it in squarings, at most 32:
    $\|\tau A\|_1$ up to about $10^{10}$; beyond, and for any non-finite result, an error is
    raised on every output). In float64 it stays accurate for large $\lambda\tau$ (1e-12 at
    $\lambda\tau=10^5$); in float32 the squarings lose accuracy (1e-3 at $\lambda\tau=10^5$,
    `benchmarks/results/precision.md`), where [`jaxctbn.Uniformisation`][] does not.
    """

    #: $4S\times4S$ float64 matrices for `forward_backward` (2 GiB at $S=2^{12}$)
    state_space_limit: ClassVar[int] = 2**12
    tabulates_gaps: ClassVar[bool] = True

    @staticmethod
    def _expm(M):
        # Pade 13 with up to 32 squarings (jax.scipy.linalg.expm's default of 16 silently
        # returns NaN once ||M||_1 > ~3e5) and no batched LAPACK call (see _dense_linalg)
        return expm(M)

    @staticmethod
    def _checked(outputs):
        # one check guarding every output: using either alone keeps it
        bad = ~jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in outputs]))
        return error_if(
            outputs,
            bad,
            "MatrixExponential: the matrix exponential is not finite (the horizon, or the rates "
            "times the horizon, exceed about 1e10, or the rates are not finite); use "
            "Uniformisation.",
        )

    @classmethod
    def _moments(cls, W, p0, horizon):
        S = p0.shape[0]
        eye = jnp.eye(S, dtype=W.dtype)
        A = jnp.block([[W, eye], [jnp.zeros_like(W), jnp.zeros_like(W)]])
        E = cls._expm(jnp.asarray(horizon, W.dtype) * A)
        z = jnp.concatenate([p0, jnp.zeros_like(p0)]) @ E
        return cls._checked((z[:S], z[S:]))

    def solve(self, generator, p0, horizon):
        return self._moments(generator.dense(), p0, horizon)

    def solve_batch(self, generators, p0, horizon):
        return jax.lax.map(lambda gp: self.solve(gp[0], gp[1], horizon), (generators, p0))

    def solve_backward(self, generator, beta_end, horizon):
        return self._moments(generator.dense().T, beta_end, horizon)

    def _transition(self, generator, horizon):
        W = generator.dense()
        return transition_matrices((jnp.asarray(horizon, W.dtype) * W)[None])[0]

    def propagate(self, generator, p0, horizon):
        # the transition matrix only, its rows kept summing to one through the squarings: an
        # S x S exponential instead of the 2S x 2S block of `solve`, whose end point drifts and
        # whose integral (not needed here) overflows in float32 at long horizons
        return self._checked((p0 @ self._transition(generator, horizon),))[0]

    def propagate_backward(self, generator, beta_end, horizon):
        return self._checked((self._transition(generator, horizon) @ beta_end,))[0]

    def forward_backward(self, generator, alpha_start, beta_end, horizon):
        S = alpha_start.shape[0]
        A = generator.dense().T
        B = jnp.outer(alpha_start, jnp.asarray(beta_end, A.dtype))
        M = jnp.block([[A, B], [jnp.zeros_like(A), A]])
        C = self._expm(jnp.asarray(horizon, A.dtype) * M)[:S, S:]
        src, dst = shift_indices(generator.cardinalities)
        return self._checked((jnp.diagonal(C), C[src, dst]))

    def transition_matrices(self, generator, gaps) -> Array:
        r"""$e^{hW}$ `(G, S, S)` for every gap $h$ of `gaps` `(G,)`: one dense exponential per
        distinct interval length, which every interval of that length shares (panel filtering
        of intervals grouped by their length); `(C, G, S, S)` for a stack of `C` dense
        generators `(C, S, S)` in place of `generator` (the covariate classes of a panel fit).
        An error is raised if any is not finite."""
        W = generator.dense() if isinstance(generator, AbstractGenerator) else generator
        return self._checked((gap_transition_matrices(W, jnp.asarray(gaps, W.dtype)),))[0]

    def forward_backward_by_gaps(self, generator, gaps, summed) -> tuple[Array, Array]:
        r"""`forward_backward` summed over intervals grouped by their length. The interval
        integral $\int_0^he^{tA}Be^{(h-t)A}dt$ ($A=W^\top$) is linear in
        $B=\alpha_0^\top\beta_\tau^\top$, so with `summed[g]` the sum of the $B$ of the
        intervals of length `gaps[g]`, one Van Loan exponential per gap gives
        $C=\sum_g\int_0^{h_g}e^{tA}\,\mathrm{summed}_g\,e^{(h_g-t)A}dt$.

        **Arguments:** `generator` (one network), `gaps` `(G,)`, `summed` `(G, S, S)`.

        **Returns:** `(dwell, flux)` read from $C$ as in `forward_backward`, of shapes `(S,)`
        and `(len(generator.shifts), S)`."""
        A = generator.dense().T
        S = A.shape[0]
        zero = jnp.zeros_like(A)
        gaps = jnp.asarray(gaps, A.dtype)
        # the integral is linear in B: scaled to the 1-norm of A, the block's norm (hence the
        # number of squarings) is set by h W, not by the size of the summed messages
        norm_A = jnp.abs(A).sum(0).max()
        norm_B = jnp.abs(summed).sum(-2).max(-1)
        scale = jnp.where((norm_B > 0) & (norm_A > 0), norm_B / jnp.where(norm_A > 0, norm_A, 1), 1)
        blocks = jax.vmap(lambda h, B: h * jnp.block([[A, B], [zero, A]]))(
            gaps, summed / scale[:, None, None]
        )
        upper_right = expm_batched(blocks)[:, :S, S:] * scale[:, None, None]
        C = self._checked((upper_right.sum(0),))[0]
        src, dst = shift_indices(generator.cardinalities)
        return jnp.diagonal(C), C[src, dst]
