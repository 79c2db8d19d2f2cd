r"""Numerical minimisers of the VBHC, as Modules passed to [`jaxctbn.VBHC`][] (`optimiser=`).

The VBHC has a closed-form minimum for both targets (maths §3, §4), which is the default; an
optimiser computes the same minimum with optax and autodiff gradients (useful to check the closed
form, and for variational families without one). Configuration is data: the learning rate is an
array field fed to `optax.inject_hyperparams`, so changing it does not recompile; the number of
steps is static.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike


class AbstractVBHCOptimiser(eqx.Module):
    """Minimises a scalar loss over a pytree of unconstrained parameters."""

    @abc.abstractmethod
    def minimise(self, loss: Callable[[Any], Array], init: Any) -> tuple[Array, Any]:
        """Returns `(loss at the final parameters, final parameters)`, starting from `init`."""


class LBFGS(AbstractVBHCOptimiser):
    """`optax.lbfgs()` (with its zoom line search) for `steps` iterations (static)."""

    steps: int = eqx.field(default=200, static=True)

    def __check_init__(self):
        if self.steps < 1:
            raise ValueError(f"LBFGS: steps must be >= 1, got {self.steps}.")

    def minimise(self, loss, init):
        import optax

        opt = optax.lbfgs()
        value_and_grad = optax.value_and_grad_from_state(loss)

        def step(carry, _):
            p, state = carry
            value, grad = value_and_grad(p, state=state)
            updates, new_state = opt.update(grad, state, p, value=value, grad=grad, value_fn=loss)
            new_p = optax.apply_updates(p, updates)
            # an iteration past convergence (zero step: s.y = 0 in the curvature pair) can
            # return NaN; keep the last point of finite loss that did not increase it, which
            # then stays put for the remaining steps (a NaN point has a NaN loss)
            new_value = optax.tree.get(new_state, "value")
            ok = jnp.isfinite(new_value) & (new_value <= value)

            def keep(new, old):
                return jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)

            return (keep(new_p, p), keep(new_state, state)), None

        (p, _), _ = jax.lax.scan(step, (init, opt.init(init)), None, length=self.steps)
        return loss(p), p


class Adam(AbstractVBHCOptimiser):
    """`optax.adam(learning_rate)` for `steps` iterations; `learning_rate` is data (no
    recompilation when it changes), `steps` is static."""

    learning_rate: float | ArrayLike = 0.05
    steps: int = eqx.field(default=200, static=True)

    def __check_init__(self):
        if self.steps < 1:
            raise ValueError(f"Adam: steps must be >= 1, got {self.steps}.")

    def minimise(self, loss, init):
        import optax

        opt = optax.inject_hyperparams(optax.adam)(learning_rate=self.learning_rate)
        grad_fn = jax.grad(loss)

        def step(carry, _):
            p, state = carry
            updates, state = opt.update(grad_fn(p), state, p)
            return (optax.apply_updates(p, updates), state), None

        (p, _), _ = jax.lax.scan(step, (init, opt.init(init)), None, length=self.steps)
        return loss(p), p
