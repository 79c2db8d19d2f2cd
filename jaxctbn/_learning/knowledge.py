r"""What is known about the graph before any data, as one Module passed as `knowledge=` to the
structure learners ([`jaxctbn.learn_structure`][],
[`jaxctbn.panel.learn_structure_from_panels`][], [`jaxctbn.StructurePosterior.from_prior`][]).

Hard knowledge removes candidate parent sets (a set that breaks it has posterior 0): required
and forbidden edges and tiers. Soft knowledge reweighs them: an edge prior, the probability of
each edge (maths: the structure prior $\prod_{a\to b}\pi_{ab}\prod_{a\not\to b}(1-\pi_{ab})$ over
the candidate sets). The in-degree bound `max_parents` stays the learners' own keyword: it is
the size of the search, not a belief about the graph.
"""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from .candidates import edges_by_index


def _edges(edges, flag: str) -> tuple:
    if isinstance(edges, str) or not isinstance(edges, Sequence | set | frozenset):
        raise ValueError(
            f"{flag}: expected a sequence of (parent, child) pairs (indices or names), got "
            f"{edges!r}."
        )
    return tuple(tuple(e) if isinstance(e, list | tuple) else e for e in edges)


class PriorKnowledge(eqx.Module):
    r"""Prior knowledge of the graph (module docstring).

    **Arguments (keyword-only):**

    - `required_edges`, `forbidden_edges`: `(parent, child)` pairs, as node indices or names;
    - `tiers`: one integer per node; a node's parents come from its own tier or earlier ones;
    - `edge_prior`: `(N, N)` probabilities $\pi_{ab}$ of the edge $a\to b$, in $(0,1)$ off the
      diagonal (default: none, every candidate set equally likely a priori).

    The pairs and tiers are checked against the network when a learner resolves them (one line
    naming the edge or the node); the edge prior inside the learner."""

    required_edges: tuple = eqx.field(default=(), static=True, kw_only=True)
    forbidden_edges: tuple = eqx.field(default=(), static=True, kw_only=True)
    tiers: tuple[int, ...] | None = eqx.field(default=None, static=True, kw_only=True)
    edge_prior: Float[Array, "nodes nodes"] | None = eqx.field(default=None, kw_only=True)

    def __init__(
        self,
        *,
        required_edges: Sequence = (),
        forbidden_edges: Sequence = (),
        tiers: Sequence[int] | None = None,
        edge_prior: ArrayLike | None = None,
    ):
        self.required_edges = _edges(required_edges, "required_edges")
        self.forbidden_edges = _edges(forbidden_edges, "forbidden_edges")
        self.tiers = None if tiers is None else tuple(tiers)
        self.edge_prior = None if edge_prior is None else jnp.asarray(edge_prior, float)

    def constraints(self, names: Sequence[str]) -> dict:
        """The hard knowledge with edges as node indices: the keywords `required_edges`,
        `forbidden_edges` and `tiers` of the candidate-set builders."""
        return dict(
            required_edges=edges_by_index(self.required_edges, names, "required_edges"),
            forbidden_edges=edges_by_index(self.forbidden_edges, names, "forbidden_edges"),
            tiers=self.tiers,
        )


#: No prior knowledge: every graph within the in-degree bound, equally likely a priori.
NO_KNOWLEDGE = PriorKnowledge()


def check_knowledge(knowledge) -> None:
    """A one-line `TypeError` unless `knowledge` is a `PriorKnowledge`."""
    if not isinstance(knowledge, PriorKnowledge):
        raise TypeError(
            f"knowledge: expected a jaxctbn.PriorKnowledge(...), got {knowledge!r} (the edges, "
            "tiers and edge prior are its keywords)."
        )
