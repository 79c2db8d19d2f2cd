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

    def minimise_from_start(
        self, loss: Callable[[Any], Array], init: Any
    ) -> tuple[Array, Array, Any]:
        """Returns `(loss at the final parameters, loss at init, final parameters)`: the same
        minimisation as `minimise`, with the start's loss too. An optimiser may override it to
        evaluate the loss in fewer places of the compiled program (the numbers are the same)."""
        start = loss(init)
        value, p = self.minimise(loss, init)
        return value, start, p


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
        value, _, p = self.minimise_from_start(loss, init)
        return value, p

    def minimise_from_start(self, loss, init):
        # `steps + 1` evaluations of the loss and its gradient in one loop: the first is the
        # start's loss, the last the end's (its update is not applied), so the loss appears
        # once in the compiled program instead of three times (smaller and faster to compile;
        # one more gradient at run time than a separate final loss)
        import optax

        opt = optax.inject_hyperparams(optax.adam)(learning_rate=self.learning_rate)
        value_and_grad = jax.value_and_grad(loss)

        def step(carry, _):
            p, state, _ = carry
            value, grad = value_and_grad(p)
            updates, state = opt.update(grad, state, p)
            return (optax.apply_updates(p, updates), state, p), value

        carry = (init, opt.init(init), init)
        (_, _, p), values = jax.lax.scan(step, carry, None, length=self.steps + 1)
        return values[-1], values[0], p
