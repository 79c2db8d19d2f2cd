"""Initial-state policies: how the initial state of each experiment is chosen (uniformly at random
and revealed, as in the paper; fixed; or drawn from a distribution, revealed or hidden)."""

from __future__ import annotations

import abc
import math

import equinox as eqx
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._model.layout import all_global_states


class AbstractInitialStatePolicy(eqx.Module):
    """How the initial state $s_0$ of each experiment is chosen, and what the design sees of it.

    `draw` returns the state the trajectory starts in; `revealed` what the design is given:
    the state itself, or a distribution over global states `(S,)` when $s_0$ is hidden (the
    (V)BHC then score the expected statistics under that distribution)."""

    @abc.abstractmethod
    def draw(self, key: PRNGKeyArray, cardinalities: tuple[int, ...]) -> Int[Array, " nodes"]:
        """The initial state of one experiment (jittable)."""

    def revealed(self, state: Int[Array, " nodes"], cardinalities: tuple[int, ...]) -> Array:
        """What the design sees: by default the drawn state."""
        return state

    def check(self, cardinalities: tuple[int, ...], names: tuple[str, ...]) -> None:
        """Raise `ValueError` if the policy does not fit a network with these cardinalities."""

    def settings(self):
        """The policy as JSON, for a run's `config.json` (by default its class name)."""
        return type(self).__name__


class RandomInitialState(AbstractInitialStatePolicy):
    """$s_0$ uniform over the global states, revealed to the design (the paper's choice, §6)."""

    def settings(self):
        return "random-revealed"

    def draw(self, key, cardinalities):
        return _random_state(key, cardinalities)


class FixedInitialState(AbstractInitialStatePolicy):
    """The same $s_0$ in every experiment (known to the design). **Argument:** `state`, one
    state per node."""

    state: tuple[int, ...] = eqx.field(static=True)

    def __init__(self, state):
        state = tuple(int(s) for s in np.ravel(np.asarray(state)))
        if not state or any(s < 0 for s in state):
            raise ValueError(f"state: need one non-negative state per node, got {state}.")
        self.state = state

    def check(self, cardinalities, names):
        if len(self.state) != len(cardinalities):
            raise ValueError(
                f"initial state: need {len(cardinalities)} node states, got {len(self.state)}."
            )
        for s, k, name in zip(self.state, cardinalities, names):
            if not 0 <= s < k:
                raise ValueError(f"initial state: node {name!r} has states 0..{k - 1}, got {s}.")

    def settings(self):
        return {"fixed": list(self.state)}

    def draw(self, key, cardinalities):
        return jnp.asarray(self.state, jnp.int32)


class InitialStateDistribution(AbstractInitialStatePolicy):
    r"""$s_0$ drawn from a distribution over the global states (`probabilities`, `(S,)` in
    product order or one axis per node; default uniform). With `revealed=False` (default) the
    design sees only the distribution, not the draw ("a distribution of initial states", §6); with
    `revealed=True` it sees the drawn state. With a hidden state the (V)BHC score the expected
    statistics under the distribution, and the EIG draws each sampled path's initial state from
    it."""

    probabilities: Float[Array, "..."] | None = None
    revealed_to_design: bool = eqx.field(default=False, static=True, kw_only=True)

    def __init__(self, probabilities=None, *, revealed: bool = False):
        if probabilities is not None:
            p = np.asarray(probabilities, float)
            if np.any(~np.isfinite(p)) or np.any(p < 0) or abs(p.sum() - 1) > 1e-9:
                raise ValueError(
                    "probabilities: must be finite, non-negative and sum to 1 (one per global "
                    "state)."
                )
            probabilities = jnp.asarray(p.ravel())
        self.probabilities = probabilities
        self.revealed_to_design = bool(revealed)

    def check(self, cardinalities, names):
        S = math.prod(cardinalities)
        if self.probabilities is not None and self.probabilities.shape[0] != S:
            raise ValueError(
                f"probabilities: need one per global state ({S}), got "
                f"{self.probabilities.shape[0]}."
            )

    def settings(self):
        p = self.probabilities
        return {
            "distribution": "uniform" if p is None else np.asarray(p, float).tolist(),
            "revealed": self.revealed_to_design,
        }

    def _probabilities(self, cardinalities):
        S = math.prod(cardinalities)
        if self.probabilities is None:
            return jnp.full((S,), 1.0 / S)
        return self.probabilities

    def draw(self, key, cardinalities):
        p = self._probabilities(cardinalities)
        index = jr.choice(key, p.shape[0], p=p)
        return jnp.asarray(all_global_states(tuple(cardinalities)))[index]

    def revealed(self, state, cardinalities):
        if self.revealed_to_design:
            return state
        return self._probabilities(cardinalities).astype(jnp.result_type(float))


#: The paper's initial-state policy (uniform, revealed), the default of the loop.
PAPER_INITIAL_STATE = RandomInitialState()


def _random_state(key, cardinalities):
    return jnp.stack(
        [jr.randint(k, (), 0, c) for k, c in zip(jr.split(key, len(cardinalities)), cardinalities)]
    ).astype(jnp.int32)
