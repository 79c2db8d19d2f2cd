r"""Intervention strengths as a design variable: a drug that scales a node's rates by $s$,
$s$ in a range $[a,b]$, chosen by gradient ascent of the criterion through the master equation
(maths §8).

A candidate that leaves node $X$ free gets a variant "scale $X$'s rates by $s$"
([`jaxctbn.Intervention.with_rate_scales`][]); its best $s$ maximises the criterion, found by
Adam (optax) on $z$ with $s=\exp(\ln a+(\ln b-\ln a)\,\sigma(z))$ from several starting points,
gradients by reverse-mode autodiff through the expected statistics. The variant's score is the
best of the ascent's end points, its starting grid and the two ends of the range (where the
optimum of a criterion that grows with the strength lies, and which the logits only approach),
so it is never below that grid's best.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._learning.strength import StrengthPosterior
from .._model.interventions import Intervention, is_concrete

if TYPE_CHECKING:
    import pandas as pd

#: Logits at which the scale is the end of its range (to rounding): sigma(40) = 1 - 4e-18.
BOUNDARY = 40.0


class AbstractStrengthQuestion(eqx.Module):
    """A question about the candidates' rate scales, passed to
    [`jaxctbn.score_interventions`][] as `strengths=`: [`jaxctbn.criteria.Strengths`][] or
    [`jaxctbn.criteria.UncertainStrength`][]."""

    @abc.abstractmethod
    def answer(self, scores: Callable[[Intervention], Array], candidates: Intervention) -> Any:
        """The answer for perfect `candidates`, from `scores(variants)`: one score per variant
        (the criterion under the arguments of `score_interventions`, the same key for all)."""


class Strengths(AbstractStrengthQuestion):
    r"""The nodes whose rates an intervention can scale, and the range of each scale: the
    `strengths=` of [`jaxctbn.score_interventions`][], which returns a
    [`jaxctbn.criteria.StrengthDesign`][]: every candidate (perfect part: which nodes it clamps)
    with the strength nodes' rates scaled by the best $s$ in their ranges, the criterion
    ascended over $s$ by Adam with gradients through the master equation from `starts`
    starting points, the same posterior draws (`key`) for every candidate and every $s$ (maths
    §8). The criterion must be deterministic in $s$ given the key (the (V)BHC; the EIG's
    sampled paths are not differentiable in the rates).

    **Arguments:** `nodes` (static, indices), `low`, `high` (arrays, $0<a\le b<\infty$; $a=b$
    is a fixed strength), and the search: `starts` starting points (relative positions in
    $[\ln a,\ln b]$, evenly spaced), `steps` Adam steps of `learning_rate` on the logits."""

    nodes: tuple[int, ...] = eqx.field(static=True)
    low: Float[Array, " strengths"]
    high: Float[Array, " strengths"]
    starts: int = eqx.field(default=5, static=True, kw_only=True)
    steps: int = eqx.field(default=40, static=True, kw_only=True)
    learning_rate: float = eqx.field(default=0.2, static=True, kw_only=True)

    def __init__(self, nodes, low, high, *, starts=5, steps=40, learning_rate=0.2):
        self.nodes = tuple(int(n) for n in nodes)
        self.low = jnp.asarray(low, float).reshape(-1)
        self.high = jnp.asarray(high, float).reshape(-1)
        self.starts, self.steps, self.learning_rate = int(starts), int(steps), float(learning_rate)
        if not self.nodes or len(set(self.nodes)) != len(self.nodes):
            raise ValueError(f"Strengths: nodes must be distinct node indices, got {nodes!r}.")
        if self.low.shape != (len(self.nodes),) or self.high.shape != (len(self.nodes),):
            raise ValueError("Strengths: give one low and one high per node.")
        if is_concrete(self.low, self.high):
            low, high = np.asarray(self.low), np.asarray(self.high)
            if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(low > 0)):
                raise ValueError(
                    f"Strengths: every range must be finite with low > 0, got {low}..{high}."
                )
            if np.any(high < low):
                raise ValueError(f"Strengths: empty range (high < low): {low}..{high}.")
        if self.starts < 1 or self.steps < 0 or not self.learning_rate > 0:
            raise ValueError("Strengths: starts >= 1, steps >= 0 and learning_rate > 0.")

    def scales(self, z: Float[Array, " strengths"]) -> Float[Array, " strengths"]:
        """The scales at logits `z`: $\\exp(\\ln a+(\\ln b-\\ln a)\\sigma(z))$."""
        la, lb = jnp.log(self.low), jnp.log(self.high)
        return jnp.exp(la + (lb - la) * jax.nn.sigmoid(z))

    def apply(self, candidate: Intervention, s: Float[Array, " strengths"]) -> Intervention:
        """`candidate` with the strength nodes' rates scaled by `s` (other nodes by 1; a node
        the candidate clamps keeps zero rates whatever its scale)."""
        num_nodes = candidate.targets.shape[-1]
        scales = [jnp.ones((), s.dtype)] * num_nodes
        for j, n in enumerate(self.nodes):
            scales[n] = s[j]
        return candidate.with_rate_scales(scales)

    def answer(self, scores, candidates) -> StrengthDesign:
        import optax

        num_nodes = candidates.targets.shape[-1]
        if any(not 0 <= n < num_nodes for n in self.nodes):
            raise ValueError(f"strengths: nodes must be in 0..{num_nodes - 1}, got {self.nodes}.")
        if candidates.rate_scales is not None:
            raise ValueError("candidates: give perfect interventions; Strengths adds the scales.")
        dtype = jnp.result_type(float)
        M = len(self.nodes)

        def value(candidate, z):
            iv = self.apply(candidate, self.scales(z))
            return scores(jax.tree_util.tree_map(lambda a: a[None], iv))[0]

        positions = (jnp.arange(self.starts, dtype=dtype) + 0.5) / self.starts
        starts = jnp.broadcast_to(jnp.log(positions / (1 - positions))[:, None], (self.starts, M))
        opt = optax.adam(self.learning_rate)

        def one(candidate):
            gradient = jax.grad(lambda z: -value(candidate, z))

            def ascend(z0):
                def step(state, _):
                    z, opt_state = state
                    g = gradient(z)
                    ok = jnp.all(jnp.isfinite(g))
                    updates, new_state = opt.update(jnp.where(ok, g, 0.0), opt_state, z)
                    moved = cast(Array, optax.apply_updates(z, updates))
                    return (jnp.where(ok, moved, z), new_state), None

                (z, _), _ = jax.lax.scan(step, (z0, opt.init(z0)), None, length=self.steps)
                return z

            grid = jax.vmap(lambda z: value(candidate, z))(starts)
            # the ascent's end points, and the ends of the range (which the logits only approach)
            ends = jnp.concatenate([jax.vmap(ascend)(starts), jnp.full((2, M), -BOUNDARY, dtype)])
            ends = ends.at[-1].set(BOUNDARY)
            end_values = jax.vmap(lambda z: value(candidate, z))(ends)
            points = jnp.concatenate([starts, ends])
            values = jnp.concatenate([grid, end_values])
            values = jnp.where(jnp.isfinite(values), values, -jnp.inf)
            best = jnp.argmax(values)
            return values[best], self.scales(points[best]), grid

        best_scores, scales, grid = jax.lax.map(one, candidates)
        free = ~candidates.targets[:, jnp.asarray(self.nodes)].all(-1)
        return StrengthDesign(scores=best_scores, rate_scales=scales, grid_scores=grid, free=free)


class StrengthDesign(eqx.Module):
    """What [`jaxctbn.criteria.Strengths`][] found for every candidate: `scores`
    `(candidates,)` the criterion at the chosen strengths, `rate_scales` `(candidates,
    strengths)` those strengths, `grid_scores` `(candidates, starts)` the criterion at the
    starting grid (its best is a lower bound on `scores`), and `free` `(candidates,)` whether
    the candidate leaves a strength node free (otherwise scaling changes nothing)."""

    scores: Float[Array, " candidates"]
    rate_scales: Float[Array, "candidates strengths"]
    grid_scores: Float[Array, "candidates starts"]
    free: Array

    def to_frame(
        self, candidates: Intervention, names: Sequence[str], *, strengths: Strengths
    ) -> pd.DataFrame:
        """Every candidate's score at its chosen strengths as a pandas table (the scaled
        variants of `jaxctbn design --strength`'s JSON, with their `rate_scales`).

        **Arguments:**

        - `candidates`: the perfect candidates that were scored (a batch of interventions).
        - `names`: the network's node names.
        - `strengths`: the [`jaxctbn.criteria.Strengths`][] that was asked (its nodes name the
          scale columns).

        **Returns:** a `pandas.DataFrame`, one row per candidate: `intervention`
        ([`Intervention.to_frame`][jaxctbn.Intervention.to_frame]'s), `score`, `free` (whether
        it leaves a strength node free), one column `rate_scale[NODE]` per strength node (NaN
        where the candidate is not free: no scale changes it) and `best_grid_score`. Eager, on
        the host."""
        frame = _candidate_frame(candidates, names, np.shape(self.scores)[0])
        if np.shape(self.rate_scales)[-1] != len(strengths.nodes):
            raise ValueError(
                f"strengths: {len(strengths.nodes)} nodes, but the design holds "
                f"{np.shape(self.rate_scales)[-1]} scales per candidate."
            )
        free = np.asarray(self.free, bool)
        scales = np.where(free[:, None], np.asarray(self.rate_scales, float), np.nan)
        frame = frame.assign(score=np.asarray(self.scores, float), free=free)
        for j, n in enumerate(strengths.nodes):
            frame[f"rate_scale[{names[n]}]"] = scales[:, j]
        return frame.assign(best_grid_score=np.asarray(self.grid_scores, float).max(-1))


class UncertainStrengthScores(eqx.Module):
    """What [`jaxctbn.criteria.UncertainStrength`][] returns: `scores` `(candidates,)`
    the criterion averaged over the strength's posterior, `strengths` `(points,)` the
    posterior quantiles it was evaluated at, and `scores_at_strengths` `(candidates, points)`
    the criterion at each."""

    scores: Float[Array, " candidates"]
    strengths: Float[Array, " points"]
    scores_at_strengths: Float[Array, "candidates points"]

    def to_frame(self, candidates: Intervention, names: Sequence[str]) -> pd.DataFrame:
        """Every candidate's score averaged over the strength's posterior, and at each
        strength it was evaluated at, as a pandas table.

        **Arguments:** `candidates`, the perfect candidates that were scored; `names`, the
        network's node names.

        **Returns:** a `pandas.DataFrame`, one row per candidate: `intervention`
        ([`Intervention.to_frame`][jaxctbn.Intervention.to_frame]'s), `score` (the average),
        and one column `score_at[s]` per strength $s$ (the posterior quantiles, in order).
        Eager, on the host."""
        frame = _candidate_frame(candidates, names, np.shape(self.scores)[0])
        frame = frame.assign(score=np.asarray(self.scores, float))
        at = np.asarray(self.scores_at_strengths, float)
        for j, s in enumerate(np.asarray(self.strengths, float)):
            frame[f"score_at[{s:.6g}]"] = at[:, j]
        return frame


def _candidate_frame(candidates: Intervention, names: Sequence[str], num_scores: int):
    frame = candidates.to_frame(names)
    if len(frame) != num_scores:
        raise ValueError(f"candidates: {len(frame)} interventions for {num_scores} scores.")
    return frame


class UncertainStrength(AbstractStrengthQuestion):
    r"""Candidates that give a drug of **uncertain** effect: the `strengths=` of
    [`jaxctbn.score_interventions`][], which returns a
    [`jaxctbn.criteria.UncertainStrengthScores`][]: every candidate with node `node`'s rates
    scaled by $s$, scored at the `num_points` quantiles $(j+\frac12)/J$ of the strength's
    posterior `posterior` (a [`jaxctbn.StrengthPosterior`][], e.g. learned by
    [`jaxctbn.learn_strength`][] from earlier experiments with the drug) and averaged: the
    expected criterion over what the drug does, with the same posterior draws (`key`) at
    every strength (maths §8). It is the criterion of an experiment whose strength will be
    known when it is analysed (what the experiment teaches about $s$ itself is not counted).
    A candidate that clamps `node` scores the same at every strength."""

    node: int = eqx.field(static=True)
    posterior: StrengthPosterior
    num_points: int = eqx.field(default=5, static=True, kw_only=True)

    def __check_init__(self):
        if not isinstance(self.posterior, StrengthPosterior):
            raise TypeError(
                f"strength: expected a jaxctbn.StrengthPosterior, got {self.posterior!r}."
            )
        if not isinstance(self.node, int) or isinstance(self.node, bool) or self.node < 0:
            raise ValueError(f"node: a node index >= 0, got {self.node!r}.")
        n = self.num_points
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"num_points: an integer >= 1, got {n!r}.")

    def answer(self, scores, candidates) -> UncertainStrengthScores:
        node, num_points = self.node, self.num_points
        num_nodes = candidates.targets.shape[-1]
        if not 0 <= node < num_nodes:
            raise ValueError(f"node: a node index in 0..{num_nodes - 1}, got {node!r}.")
        if candidates.rate_scales is not None:
            raise ValueError("candidates: give perfect interventions; the strength adds the scale.")
        dtype = jnp.result_type(float)
        quantiles = (jnp.arange(num_points, dtype=dtype) + 0.5) / num_points
        strengths = self.posterior.quantile(quantiles)
        C = candidates.targets.shape[0]
        expanded = jax.tree_util.tree_map(lambda a: jnp.repeat(a, num_points, axis=0), candidates)
        ones = jnp.ones((C * num_points,), dtype)
        scales = [ones] * num_nodes
        scales[node] = jnp.tile(strengths, C)
        values = scores(expanded.with_rate_scales(scales)).reshape(C, num_points)
        return UncertainStrengthScores(
            scores=values.mean(1), strengths=strengths, scores_at_strengths=values
        )
