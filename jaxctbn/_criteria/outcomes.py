r"""What the next experiment reveals, as Modules passed to [`jaxctbn.score_interventions`][]
(`outcome=`): the paper's complete path of every node, or a **panel**, the global state seen at a
few times (maths §7).
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._model.interventions import is_concrete
from .._panel.observations import Emissions
from .._panel.outcome_law import checked_observation_times


class AbstractOutcome(eqx.Module):
    """What an experiment of length $\\tau$ reveals: [`jaxctbn.criteria.CompletePath`][] or
    [`jaxctbn.criteria.Panel`][]."""


class CompletePath(AbstractOutcome):
    """Every node's whole path over $[0,\\tau]$: the paper's experiment (the default)."""


class Panel(AbstractOutcome):
    r"""The experiment's global state seen at $0<t_1<\dots<t_K\le\tau$ (maths §7): every node
    measured at each visit (without error unless `emissions` say otherwise), nothing in
    between; the state at time 0 is the experiment's initial state (set, hence known).

    **Arguments:**

    - `times`: the visit times `(K,)`, finite, $>0$, strictly increasing and at most the
      horizon (the shape is checked here, the values inside jit);
    - or `num_visits` (keyword-only): $K$ visits whose times the criterion chooses, per
      candidate, to maximise its score (maths §7): Adam ascent (`steps`, `learning_rate`, on
      the logits of the gaps) from equal spacing $t_k=\tau k/K$ with the posterior draws held
      fixed; the better of the search's best point and equal spacing is kept, so the score is
      never below the equally spaced one. The Box-Hill criteria only (the EIG's Monte Carlo
      outcomes are not differentiable in the times).
    - `emissions` (keyword-only): a [`jaxctbn.panel.Emissions`][] of per-node
      misclassification matrices $E_n(x,y)=p(y\mid x)$; a node that is not measured has the
      `(k, 1)` matrix of ones. Scored by the [`jaxctbn.EIG`][] (the recorded symbols'
      likelihoods by the forward filter, maths §7) at given times; the Box-Hill criteria and
      the active-learning loop refuse it (their panel divergences and updates assume error-free
      visits).
    """

    times: Float[Array, " visits"] | None
    num_visits: int | None = eqx.field(static=True)
    steps: int = eqx.field(static=True)
    learning_rate: float = eqx.field(static=True)
    emissions: Emissions | None

    def __init__(
        self,
        times: ArrayLike | None = None,
        *,
        num_visits: int | None = None,
        steps: int = 30,
        learning_rate: float = 0.1,
        emissions: Emissions | None = None,
    ):
        if emissions is not None and not isinstance(emissions, Emissions):
            raise ValueError(
                f"emissions: expected None or a jaxctbn.panel.Emissions, got {emissions!r}."
            )
        self.emissions = emissions
        if (times is None) == (num_visits is None):
            raise ValueError("Panel: give the visit `times` or `num_visits`, not both or neither.")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps: expected an integer >= 1, got {steps!r}.")
        if not (isinstance(learning_rate, int | float) and learning_rate > 0):
            raise ValueError(f"learning_rate: expected a number > 0, got {learning_rate!r}.")
        self.steps, self.learning_rate = int(steps), float(learning_rate)
        if num_visits is not None:
            if isinstance(num_visits, bool) or not isinstance(num_visits, int | np.integer):
                raise ValueError(f"num_visits: expected an integer >= 1, got {num_visits!r}.")
            if num_visits < 1:
                raise ValueError(f"num_visits: expected an integer >= 1, got {num_visits}.")
            self.times, self.num_visits = None, int(num_visits)
            return
        times = jnp.asarray(times)
        if times.ndim != 1 or times.shape[0] < 1:
            raise ValueError(
                f"times: expected one or more visit times, shape (K,), got {times.shape}."
            )
        if is_concrete(times):
            t = np.asarray(times, float)
            if not np.all(np.isfinite(t)) or np.any(t <= 0) or np.any(np.diff(t) <= 0):
                raise ValueError(
                    f"times: visit times must be finite, > 0 and strictly increasing, got "
                    f"{t.tolist()}."
                )
        if not jnp.issubdtype(times.dtype, jnp.floating):
            times = times.astype(float)
        self.times, self.num_visits = times, None

    @property
    def size(self) -> int:
        """The number of visits $K$."""
        if self.times is None:
            assert self.num_visits is not None
            return self.num_visits
        return int(self.times.shape[0])

    def equally_spaced(self, horizon: ArrayLike, dtype) -> Float[Array, " visits"]:
        """$t_k=\tau k/K$, $k=1..K$."""
        K = self.size
        return jnp.asarray(horizon, dtype) * jnp.arange(1, K + 1, dtype=dtype) / K

    def visit_times(self, horizon: ArrayLike, dtype) -> Float[Array, " visits"]:
        """The given visit times, checked inside jit (finite, increasing, in $(0,\tau]$); equally
        spaced ones with `num_visits`."""
        if self.times is None:
            return self.equally_spaced(horizon, dtype)
        return checked_observation_times(self.times, dtype, horizon)
