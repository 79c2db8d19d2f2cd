r"""What an experiment costs, and how candidates are ranked when they cost different amounts.

A lab pays for what it does: a knockout more than a drug, a drug more than watching, every visit
of a panel, and a fixed price per experiment (a plate, a cohort slot). [`jaxctbn.Costs`][]
prices a candidate intervention; a ranking Module ([`jaxctbn.criteria.ByScore`][] or
[`jaxctbn.criteria.ByScorePerCost`][]) says how a design trades information against cost, and a
budget ([`jaxctbn.Batch`][]) bounds what a batch may spend (maths §8).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._errors import error_if
from .._model.interventions import Intervention, is_concrete


def _check_non_negative(name: str, value) -> None:
    """A concrete cost array must be finite and >= 0 (a traced one is checked by `error_if`)."""
    if is_concrete(value):
        array = np.asarray(value, float)
        if not np.all(np.isfinite(array)) or np.any(array < 0):
            bad = array[~(np.isfinite(array) & (array >= 0))].ravel()[0]
            raise ValueError(f"Costs: {name} must be finite and >= 0, got {bad}.")


class Costs(eqx.Module):
    r"""The price of an experiment:

    $$c(i)=c_\text{experiment}+\sum_{n\,\text{clamped}}c_\text{clamp}(n,x_n)
    +\sum_{n\,\text{scaled}}c_\text{scale}(n)+K\,c_\text{visit},$$

    with $x_n$ the state node $n$ is clamped to, "scaled" the nodes an imperfect intervention
    changes (a rate scale $\ne1$ on a node it does not clamp) and $K$ the visits of a panel
    outcome ($0$ for a complete path).

    **Fields** (arrays, so a design can be differentiated or vmapped over prices):
    `clamp` `(nodes, max_states)`, `scale` `(nodes,)`, `visit` and `experiment` (scalars), all
    finite and $\ge0$ (checked at construction when concrete). Build with
    [`jaxctbn.Costs.of_nodes`][] from names."""

    clamp: Float[Array, "nodes states"]
    scale: Float[Array, " nodes"]
    visit: Float[Array, ""]
    experiment: Float[Array, ""]

    def __init__(self, clamp, scale=None, visit=0.0, experiment=0.0):
        clamp = jnp.asarray(clamp, float)
        if clamp.ndim != 2:
            raise ValueError(
                f"Costs: clamp must be (nodes, max_states), one cost per node and state; got "
                f"shape {clamp.shape}."
            )
        self.clamp = clamp
        self.scale = (
            jnp.zeros(clamp.shape[:1], clamp.dtype) if scale is None else jnp.asarray(scale, float)
        )
        if self.scale.shape != clamp.shape[:1]:
            raise ValueError(
                f"Costs: scale must have one cost per node ({clamp.shape[0]}), got shape "
                f"{self.scale.shape}."
            )
        self.visit = jnp.asarray(visit, float)
        self.experiment = jnp.asarray(experiment, float)
        for name in ("clamp", "scale", "visit", "experiment"):
            value = getattr(self, name)
            if name in ("visit", "experiment") and jnp.ndim(value) != 0:
                raise ValueError(f"Costs: {name} must be a number, got shape {jnp.shape(value)}.")
            _check_non_negative(name, value)

    @classmethod
    def of_nodes(
        cls,
        names: Sequence[str],
        cardinalities: Sequence[int],
        *,
        clamp: Mapping[str, float] | None = None,
        clamp_state: Mapping[tuple[str, int], float] | None = None,
        scale: Mapping[str, float] | None = None,
        visit: float = 0.0,
        experiment: float = 0.0,
        default_clamp: float = 0.0,
    ) -> "Costs":
        """Costs from names: `clamp={node: c}` (clamping the node to any state),
        `clamp_state={(node, state): c}` (one state; overrides `clamp`), `scale={node: c}` (an
        imperfect intervention on the node), `visit`, `experiment`; nodes not named cost
        `default_clamp` to clamp and nothing to scale. Unknown names or states raise a
        `ValueError` naming them."""
        names = list(names)
        cards = [int(k) for k in cardinalities]
        table = np.full((len(names), max(cards)), float(default_clamp))

        def index(node):
            if node not in names:
                raise ValueError(f"Costs: unknown node {node!r}; the nodes are {names}.")
            return names.index(node)

        for node, cost in (clamp or {}).items():
            table[index(node), :] = cost
        for (node, state), cost in (clamp_state or {}).items():
            n = index(node)
            if not 0 <= int(state) < cards[n]:
                raise ValueError(
                    f"Costs: state {state} of node {node!r} must be in 0..{cards[n] - 1}."
                )
            table[n, int(state)] = cost
        scales = np.zeros(len(names))
        for node, cost in (scale or {}).items():
            scales[index(node)] = cost
        return cls(table, scales, visit, experiment)

    def of(self, candidates: Intervention, *, num_visits: int = 0) -> Float[Array, "*batch"]:
        """The cost of every candidate (any leading axes), with `num_visits` visits each."""
        targets = jnp.asarray(candidates.targets)
        states = jnp.asarray(candidates.states)
        if targets.shape[-1] != self.clamp.shape[0]:
            raise ValueError(
                f"candidates: have {targets.shape[-1]} nodes, the costs {self.clamp.shape[0]}."
            )
        clamp = _checked(self.clamp, "clamp")
        per_node = jnp.take_along_axis(
            jnp.broadcast_to(clamp, (*targets.shape, clamp.shape[1])),
            jnp.clip(states, 0, clamp.shape[1] - 1)[..., None],
            axis=-1,
        )[..., 0]
        total = (jnp.where(targets, per_node, 0.0)).sum(-1)
        if candidates.rate_scales is not None:
            scale = _checked(self.scale, "scale")
            batch = targets.shape[:-1]
            for n, s in enumerate(candidates.rate_scales):
                s = jnp.asarray(s)
                # a node's scale may be a scalar per candidate or a whole (configs, k, k) table
                changed = (s != 1).reshape(*batch, -1).any(-1) if s.ndim > len(batch) else s != 1
                changed = jnp.broadcast_to(changed, batch)
                total = total + jnp.where(changed & ~targets[..., n], scale[n], 0.0)
        return (
            total
            + _checked(self.experiment, "experiment")
            + num_visits * _checked(self.visit, "visit")
        )


def _checked(value, name):
    """`value` guarded against negative or NaN costs inside jit."""
    return error_if(
        value,
        ~jnp.all(jnp.isfinite(value) & (value >= 0)),
        f"Costs: {name} must be finite and >= 0.",
    )


def uniform_costs(num_nodes: int, max_states: int) -> Costs:
    """Every experiment costs 1 (only the fixed cost): ranking by score per cost is ranking by
    score."""
    return Costs(jnp.zeros((num_nodes, max_states)), experiment=1.0)


class AbstractRanking(eqx.Module):
    """How candidates are ranked once their value (a score, or a batch's gain) and cost are
    known: the design picks the largest rank among the affordable candidates."""

    @abc.abstractmethod
    def rank(self, values: Array, costs: Array) -> Array:
        """One rank per candidate (larger is better)."""


class ByScore(AbstractRanking):
    """The value alone; costs only decide what is affordable (`--rank-by score`)."""

    def rank(self, values, costs):
        return values


class ByScorePerCost(AbstractRanking):
    r"""Value per unit cost, $v(i)/c(i)$ (`--rank-by score-per-cost`): every candidate's cost
    must be $>0$ (a free experiment would have infinite rank; give an experiment cost)."""

    def rank(self, values, costs):
        costs = error_if(
            costs,
            jnp.any(costs <= 0),
            "ranking: ByScorePerCost needs every candidate's cost > 0; give an experiment cost.",
        )
        return values / costs


def affordable(costs: Array, remaining: ArrayLike) -> Array:
    """Which candidates fit in the `remaining` budget (a tolerance of 1e-9 relative forgives
    the rounding of sums of prices)."""
    remaining = jnp.asarray(remaining, costs.dtype)
    return costs <= remaining + 1e-9 * jnp.maximum(jnp.abs(remaining), 1.0)


def check_budget(budget) -> None:
    """A concrete budget must be a finite number >= 0."""
    if budget is not None and is_concrete(budget):
        value = np.asarray(budget, float)
        if value.shape != () or not np.isfinite(value) or value < 0:
            raise ValueError(f"budget: must be a finite number >= 0, got {budget!r}.")


def check_pricing(costs, budget, ranking, *, error: type[Exception]) -> None:
    """The pricing of a batch or a loop, one line each: `costs` a `Costs` or `None` (`error`),
    `budget` as `check_budget`, `ranking` a ranking Module (`error`)."""
    if costs is not None and not isinstance(costs, Costs):
        raise error(f"costs: expected a jaxctbn.Costs or None, got {costs!r}.")
    check_budget(budget)
    if not isinstance(ranking, AbstractRanking):
        raise error(f"ranking: expected ByScore() or ByScorePerCost(), got {ranking!r}.")
