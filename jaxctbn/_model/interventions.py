"""Perfect and imperfect interventions on conditional CTBNs."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from .._errors import branched_error_if
from .ctbn import AbstractCTBN
from .frames import intervention_labels, optional_import

if TYPE_CHECKING:
    import pandas as pd


class Intervention(eqx.Module):
    r"""An intervention $i=(i_1,\dots,i_N)$ on a cCTBN, stored as arrays so that a batch of
    interventions (a leading axis on every field) can be `jax.vmap`-ed.

    - **Perfect** part, $\mathrm{do}(X_S=x_S)$: `targets[n]` says whether node $n$ is clamped and
      `states[n]` to which state. A clamped node has all rates zero and its initial state is
      fixed to `states[n]`; the other nodes keep their conditional rates, which still read the
      clamped node's state.
    - **Imperfect** part: `rate_scales[n]` multiplies node $n$'s CIM off-diagonals (a scalar or an
      array broadcastable to `(configs, k, k)`; `1.0` = untouched). A replacement of the CIMs is a
      scale of the form `new / old`, or use [`jaxctbn.Intervention.replace_cims`][].

    Build with [`jaxctbn.Intervention.none`][], [`jaxctbn.Intervention.perfect`][] or
    [`jaxctbn.intervention_space`][].
    """

    targets: Bool[Array, "*batch nodes"]
    states: Int[Array, "*batch nodes"]
    rate_scales: tuple[Float[Array, "..."], ...] | None = None
    replacement_cims: tuple[Array | None, ...] | None = None

    def __check_init__(self):
        if jnp.shape(self.targets) != jnp.shape(self.states):
            raise ValueError(
                f"Intervention: targets {jnp.shape(self.targets)} and states "
                f"{jnp.shape(self.states)} must have the same shape (one entry per node)."
            )
        # the upper bound needs the model's cardinalities: see `checked`
        if is_concrete(self.targets, self.states):
            bad = np.asarray(self.targets, bool) & (np.asarray(self.states) < 0)
            if bad.any():
                index = tuple(np.argwhere(bad)[0])
                raise ValueError(
                    f"intervention: clamped state {int(np.asarray(self.states)[index])} of node "
                    f"{index[-1]} must be >= 0."
                )

    @property
    def num_nodes(self) -> int:
        return int(jnp.shape(self.targets)[-1])

    @classmethod
    def none(cls, num_nodes: int) -> "Intervention":
        """No intervention."""
        return cls(targets=jnp.zeros((num_nodes,), bool), states=jnp.zeros((num_nodes,), jnp.int32))

    @classmethod
    def perfect(
        cls,
        model: AbstractCTBN,
        assignment: Mapping[str, int] | Mapping[int, int] | Mapping[str | int, int] | None = None,
    ) -> "Intervention":
        r"""$\mathrm{do}(X_S=x_S)$ from a mapping `{node name or index: state}`."""
        targets = np.zeros(model.num_nodes, bool)
        states = np.zeros(model.num_nodes, np.int32)
        for node, state in (assignment or {}).items():
            n = model.node_index(node)
            k = model.cardinalities[n]
            if not 0 <= int(state) < k:
                raise ValueError(
                    f"intervention: state {state} of node {model.names[n]!r} must be in 0..{k - 1}."
                )
            targets[n] = True
            states[n] = int(state)
        return cls(targets=jnp.asarray(targets), states=jnp.asarray(states))

    def with_rate_scales(self, rate_scales: Sequence[Array | float]) -> "Intervention":
        """Add an imperfect part: per-node multiplicative factors on the conditional rates."""
        scales = tuple(jnp.asarray(s) for s in rate_scales)
        if len(scales) != self.num_nodes:
            raise ValueError(
                f"rate_scales: need one entry per node ({self.num_nodes}), got {len(scales)}."
            )
        return eqx.tree_at(lambda i: i.rate_scales, self, scales, is_leaf=lambda x: x is None)

    def replace_cims(self, replacement_cims: Sequence[Array | None]) -> "Intervention":
        """Add an imperfect part: per node, a replacement CIM table (`None` = keep the model's)."""
        cims = tuple(None if c is None else jnp.asarray(c) for c in replacement_cims)
        if len(cims) != self.num_nodes:
            raise ValueError(
                f"replacement_cims: need one entry per node ({self.num_nodes}), got {len(cims)}."
            )
        return eqx.tree_at(lambda i: i.replacement_cims, self, cims, is_leaf=lambda x: x is None)

    def checked(self, model: AbstractCTBN) -> "Intervention":
        """The same intervention, with every clamped state checked against `model`'s
        cardinalities (`0..k-1`): a `ValueError` now when the states are concrete, otherwise an
        `eqx.error_if` attached to the returned states (so everything computed from them is
        guarded). Messages name the intervention, the node and its valid states."""
        if self.num_nodes != model.num_nodes:
            raise ValueError(
                f"intervention: has {self.num_nodes} nodes, the model has {model.num_nodes}."
            )
        cards = model.cardinalities
        if is_concrete(self.targets, self.states):
            states = np.asarray(self.states)
            bad = np.asarray(self.targets, bool) & ((states < 0) | (states >= np.asarray(cards)))
            if bad.any():
                index = tuple(np.argwhere(bad)[0])
                n = index[-1]
                raise ValueError(
                    f"intervention: clamped state {int(states[index])} of node "
                    f"{model.names[n]!r} must be in 0..{cards[n] - 1}."
                )
            return self
        states = jnp.asarray(self.states)
        bad = jnp.asarray(self.targets) & ((states < 0) | (states >= jnp.asarray(cards)))
        per_node = bad.reshape(-1, len(cards)).any(0)
        states = branched_error_if(
            states,
            per_node.any(),
            jnp.argmax(per_node),
            [
                f"intervention: clamped state of node {name!r} must be in 0..{k - 1}."
                for name, k in zip(model.names, cards)
            ],
        )
        return eqx.tree_at(lambda i: i.states, self, states)

    def apply(self, model: AbstractCTBN) -> AbstractCTBN:
        """The intervened model: replaced/scaled CIMs, and zero rates for clamped nodes.
        Concrete clamped states are checked against the model here (`ValueError`); inside jit
        use [`jaxctbn.Intervention.checked`][] on the intervention whose `states` you use."""
        if self.num_nodes != model.num_nodes:
            raise ValueError(
                f"intervention: has {self.num_nodes} nodes, the model has {model.num_nodes}."
            )
        if is_concrete(self.targets, self.states):
            self.checked(model)
        cims = []
        for n, cim in enumerate(model.cims):
            new = None if self.replacement_cims is None else self.replacement_cims[n]
            if new is not None:
                if new.shape != cim.shape:
                    raise ValueError(
                        f"replacement_cims[{n}]: shape {new.shape}, expected {cim.shape}."
                    )
                k = cim.shape[-1]
                off = jnp.where(jnp.eye(k, dtype=bool), 0.0, new).astype(cim.dtype)
                cim = off - jnp.eye(k, dtype=cim.dtype) * off.sum(-1, keepdims=True)
            if self.rate_scales is not None:
                cim = cim * jnp.asarray(self.rate_scales[n], cim.dtype)
            cim = jnp.where(self.targets[n], jnp.zeros((), cim.dtype), cim)
            cims.append(cim)
        return eqx.tree_at(lambda m: m.cims, model, tuple(cims))

    def initial_states(self, states: Int[Array, "... nodes"]) -> Int[Array, "... nodes"]:
        """Clamp the intervened nodes' initial states."""
        return jnp.where(self.targets, self.states, states)

    def as_dict(self, model: AbstractCTBN) -> dict[str, int]:
        """The perfect part as `{name: state}` (concrete arrays only)."""
        t, s = np.asarray(self.targets), np.asarray(self.states)
        return {model.names[n]: int(s[n]) for n in range(model.num_nodes) if t[n]}

    def to_frame(self, names: Sequence[str]) -> pd.DataFrame:
        """A batch of interventions (a leading axis, e.g. the candidates of
        [`jaxctbn.score_interventions`][]) as a pandas table, one row each.

        **Arguments:**

        - `names`: the network's node names (`model.names`).

        **Returns:** a `pandas.DataFrame` with the column `intervention`: the clamped nodes as
        metrics.csv writes them, `A=1;B=0`, and `none` for no clamp (the perfect part only).
        Scores join it as columns: `candidates.to_frame(model.names).assign(score=scores)`
        is the ranking of `jaxctbn design` ([Files](../formats.md#python-results)).
        Eager, on the host."""
        pd = optional_import("pandas", "Intervention.to_frame")
        if np.ndim(self.targets) != 2:
            raise ValueError(
                "Intervention.to_frame: expected a batch of interventions (targets of shape "
                f"(batch, nodes)), got shape {np.shape(self.targets)}."
            )
        if len(names) != self.num_nodes:
            raise ValueError(f"names: need {self.num_nodes} node names, got {len(names)}.")
        labels = intervention_labels(tuple(names), self.targets, self.states)
        return pd.DataFrame({"intervention": labels})


def is_concrete(*arrays) -> bool:
    """Whether every array is a concrete value (not a tracer inside jit / vmap / grad)."""
    return not any(isinstance(a, jax.core.Tracer) for a in arrays)


def intervention_space(cardinalities: Sequence[int]) -> Intervention:
    r"""All perfect interventions of the paper: each node is either untouched or clamped to one of
    its states. Returns one batched [`jaxctbn.Intervention`][] with $\prod_n(1+k_n)$ members in
    `itertools.product` order over the nodes, each node's options ordered (untouched, 0, ...,
    k_n-1); member 0 is "no intervention"."""
    options = [[-1, *range(int(k))] for k in cardinalities]
    combos = np.array(list(itertools.product(*options)), dtype=np.int32).reshape(-1, len(options))
    return Intervention(targets=jnp.asarray(combos >= 0), states=jnp.asarray(np.maximum(combos, 0)))


def single_node_interventions(cardinalities: Sequence[int]) -> Intervention:
    r"""No intervention and every perfect intervention on a single node: a batched
    [`jaxctbn.Intervention`][] with $1+\sum_n k_n$ members (member 0 = none, then node 0
    clamped to 0, ..., $k_0-1$, node 1 clamped to 0, ...). The design space for networks too
    large for [`jaxctbn.intervention_space`][] ($\prod_n(1+k_n)$ members)."""
    cards = [int(k) for k in cardinalities]
    rows = [[-1] * len(cards)]
    for n, k in enumerate(cards):
        for state in range(k):
            row = [-1] * len(cards)
            row[n] = state
            rows.append(row)
    combos = np.array(rows, dtype=np.int32)
    return Intervention(targets=jnp.asarray(combos >= 0), states=jnp.asarray(np.maximum(combos, 0)))


MAX_FULL_SPACE = 4096


def design_space(
    cardinalities: Sequence[int], *, max_members: int = MAX_FULL_SPACE
) -> Intervention:
    r"""The default candidate interventions of a network: the paper's whole
    [`jaxctbn.intervention_space`][] while it has at most `max_members` members
    ($\prod_n(1+k_n)\le4096$: up to 7 binary or 6 ternary nodes), else the
    [`jaxctbn.single_node_interventions`][] ($1+\sum_n k_n$ members). Member 0 is "no
    intervention" either way. The default of the active-learning loop, of `jaxctbn design` and of
    `jaxctbn run` (`--interventions all|single` there chooses yourself)."""
    cards = [int(k) for k in cardinalities]
    if not isinstance(max_members, int) or isinstance(max_members, bool) or max_members < 1:
        raise ValueError(f"max_members must be an integer >= 1, got {max_members!r}.")
    if math.prod(k + 1 for k in cards) <= max_members:
        return intervention_space(cards)
    return single_node_interventions(cards)


def exposure_scale(intervention: Intervention | None, node: int, dtype) -> Array:
    r"""The factor $s_n$ by which an imperfect intervention multiplies node `node`'s rates,
    seen as a scale of its **exposure**: under the intervention the node's transitions are
    Poisson with rate $s_n\Lambda_n$ over its dwell time $T_n$, i.e. with rate $\Lambda_n$ over
    the exposure $s_nT_n$, so a likelihood, KL or posterior in $\Lambda_n$ uses $s_nT_n$ where a
    perfect or no intervention uses $T_n$ (the transitions are unchanged). 1 without a scale.

    One scalar per node is supported (any leading batch axes); a scale per rate (a table
    `(configs, k, k)`) has no Gamma-conjugate exposure and raises a `ValueError`."""
    if intervention is None or intervention.rate_scales is None:
        return jnp.ones((), dtype)
    scale = jnp.asarray(intervention.rate_scales[node], dtype)
    batch = jnp.ndim(intervention.targets) - 1
    if jnp.ndim(scale) > batch:
        raise ValueError(
            f"rate_scales[{node}]: the design criteria and the conjugate posteriors take one "
            f"scale per node (a number), got shape {jnp.shape(scale)[batch:]}."
        )
    return scale
