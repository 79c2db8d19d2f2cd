"""Conditional continuous-time Bayesian networks as Equinox modules."""

from __future__ import annotations

import abc
import json
import math
import numbers
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._errors import branched_error_if
from .._files import write_json
from .frames import optional_import
from .layout import config_index, max_configs, num_configurations, parent_configurations

if TYPE_CHECKING:
    import networkx


def _zero_diagonal_rates(cim: Array) -> Array:
    """Off-diagonal rates of a CIM table, with the diagonal set to zero."""
    k = cim.shape[-1]
    return jnp.where(jnp.eye(k, dtype=bool), jnp.zeros((), cim.dtype), cim)


def with_diagonal(rates: Array) -> Array:
    """Intensity matrices (rows sum to zero) from off-diagonal rates."""
    off = _zero_diagonal_rates(rates)
    k = rates.shape[-1]
    return off - jnp.eye(k, dtype=rates.dtype) * off.sum(-1, keepdims=True)


@eqx.filter_jit
def _with_diagonals(cims: tuple[Array, ...], dtype) -> tuple[Array, ...]:
    """`with_diagonal` of every table as one program (eagerly, each op would compile)."""
    return tuple(with_diagonal(c.astype(dtype)) for c in cims)


class AbstractCTBN(eqx.Module):
    r"""A conditional CTBN: $N$ nodes with cardinalities $k_n$ and, for every node $n$, one
    conditional intensity matrix (CIM) $\Lambda_n(\cdot,\cdot,u)$ per configuration $u$ of its
    parents. Subclasses differ only in how the parent sets are stored.

    Only the off-diagonal entries of the CIMs are rates; diagonals are always
    $-\sum_{x'\neq x}\Lambda_n(x,x',u)$.
    """

    names: eqx.AbstractVar[tuple[str, ...]]
    cardinalities: eqx.AbstractVar[tuple[int, ...]]
    cims: eqx.AbstractVar[tuple[Array, ...]]

    @abc.abstractmethod
    def parent_list(
        self, node: int
    ) -> tuple[int, ...] | Int[Array | np.ndarray, "*batch max_parents"]:
        """Parents of `node`: a static tuple, or an integer array padded with `-1`."""

    @property
    def num_nodes(self) -> int:
        return len(self.cardinalities)

    @property
    def num_global_states(self) -> int:
        return math.prod(self.cardinalities)

    def node_index(self, node: int | str) -> int:
        if isinstance(node, str):
            if node not in self.names:
                raise ValueError(
                    f"node: unknown node name {node!r}; the nodes are {list(self.names)}."
                )
            return self.names.index(node)
        if not 0 <= int(node) < self.num_nodes:
            raise ValueError(f"node: index {node} out of range for {self.num_nodes} nodes.")
        return int(node)

    def node_rates(self, node: int, states: Int[Array, "... nodes"]) -> Float[Array, "... k"]:
        """Rates $\\Lambda_n(x_n, x', u)$ out of each given global state, one row per state,
        with zero at the current state of the node."""
        cim = self.cims[node]
        k = self.cardinalities[node]
        c = config_index(states, self.parent_list(node), self.cardinalities)
        rows = cim[c, states[..., node]]
        own = jnp.arange(k) == states[..., node, None]
        return jnp.where(own, jnp.zeros((), cim.dtype), rows)

    @eqx.filter_jit  # one program when called eagerly (inlined under an outer jit)
    def checked(self, source: str = "cims") -> "AbstractCTBN":
        """The same model, with `eqx.error_if` guards on negative or NaN rates; error messages
        name the rates as `source[node name]`."""
        # one guard for all nodes (a branched error: its message names the first bad node),
        # not two per node: fewer host callbacks to trace and compile in every program
        bad = []
        for c in self.cims:
            off = _zero_diagonal_rates(c)
            bad += [jnp.any(~jnp.isfinite(off)), jnp.any(off < 0)]
        bad = jnp.stack(bad)
        messages = []
        for n in range(len(self.cims)):
            name = f"{source}[{self.names[n]!r}]"
            messages += [
                f"{name}: conditional intensity matrices contain NaN or infinite rates.",
                f"{name}: conditional intensity matrices have negative off-diagonal rates; "
                "transition rates must be >= 0.",
            ]
        cims = branched_error_if(self.cims, jnp.any(bad), jnp.argmax(bad), messages)
        return eqx.tree_at(lambda m: m.cims, self, tuple(cims))


def _validate_structure(names, cardinalities, parents):
    n = len(cardinalities)
    if len(names) != n:
        raise ValueError(f"names: got {len(names)} names for {n} nodes.")
    if len(set(names)) != n:
        raise ValueError(f"names: node names must be unique, got {list(names)}.")
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"names: node names must be non-empty strings, got {name!r}.")
    for name, k in zip(names, cardinalities):
        if int(k) < 2:
            raise ValueError(f"cardinality of node {name!r} must be >= 2, got {k}.")
    if len(parents) != n:
        raise ValueError(f"parents: got parent lists for {len(parents)} nodes, expected {n}.")
    for i, ps in enumerate(parents):
        for p in ps:
            if not 0 <= p < n:
                raise ValueError(f"parents of node {names[i]!r}: index {p} is not a node.")
            if p == i:
                raise ValueError(f"parents of node {names[i]!r}: self-loops are not allowed.")
        if len(set(ps)) != len(ps):
            raise ValueError(f"parents of node {names[i]!r}: duplicate parent in {list(ps)}.")


def _resolve_parents(parents, names) -> tuple[tuple[int, ...], ...]:
    if isinstance(parents, Mapping):
        unknown = set(parents) - set(names)
        if unknown:
            raise ValueError(
                f"parents: unknown node names {sorted(unknown)}; nodes are {list(names)}."
            )
        parents = [parents.get(name, ()) for name in names]
    out = []
    for i, ps in enumerate(parents):
        resolved = []
        for p in ps:
            if isinstance(p, str):
                if p not in names:
                    raise ValueError(
                        f"parents of node {names[i]!r}: unknown parent {p!r}; nodes are {list(names)}."
                    )
                resolved.append(names.index(p))
            else:
                resolved.append(int(p))
        out.append(tuple(resolved))
    return tuple(out)


class CTBN(AbstractCTBN):
    r"""A conditional CTBN with a fixed graph (cycles allowed, self-loops rejected).

    **Arguments:**

    - `cims`: one array per node of shape `(configs, k_n, k_n)`: the conditional intensity
      matrices, one per parent configuration in `itertools.product` order over the listed
      parents. Diagonals are ignored and recomputed as minus the row sums of the off-diagonals.
    - `parents`: one list of parents per node (indices or names), or a dict `{name: [names]}`.
    - `names`: node names (default `"X0", "X1", ...`).

    Structure and shapes are checked here (`ValueError`); rate values are checked inside jit by the
    numerical entry points (`eqx.error_if`).

    **Example:**

    ```python
    model = CTBN(
        cims=[jnp.array([[[-1.0, 1.0], [2.0, -2.0]]]),
              jnp.array([[[-0.1, 0.1], [3.0, -3.0]], [[-5.0, 5.0], [0.2, -0.2]]])],
        parents={"A": [], "B": ["A"]},
        names=("A", "B"),
    )
    ```

    Batches of models that share a graph are pytrees with a leading batch axis on every CIM
    (use `jax.vmap`). Batches over *different graphs* use [`jaxctbn.PaddedCTBN`][].
    """

    cims: tuple[Array, ...]
    names: tuple[str, ...] = eqx.field(static=True)
    cardinalities: tuple[int, ...] = eqx.field(static=True)
    parents: tuple[tuple[int, ...], ...] = eqx.field(static=True)

    def __init__(
        self,
        cims: Sequence[Any],
        parents: Sequence[Sequence[int | str]] | Mapping[str, Sequence[str]],
        names: Sequence[str] | None = None,
    ):
        # host tables are copied to the device as they are (jnp.asarray compiles a program each)
        cims = [c if isinstance(c, jax.Array) else jax.device_put(np.asarray(c)) for c in cims]
        if names is None:
            names = tuple(f"X{i}" for i in range(len(cims)))
        names = tuple(names)
        for name, c in zip(names, cims):
            if c.ndim != 3 or c.shape[-1] != c.shape[-2]:
                raise ValueError(
                    f"cims[{name!r}]: expected shape (configs, k, k), got {tuple(c.shape)}."
                )
        cardinalities = tuple(int(c.shape[-1]) for c in cims)
        parents = _resolve_parents(parents, names)
        _validate_structure(names, cardinalities, parents)
        for i, (name, c) in enumerate(zip(names, cims)):
            expected = num_configurations(parents[i], cardinalities)
            if c.shape[0] != expected:
                raise ValueError(
                    f"cims[{name!r}]: {c.shape[0]} parent configurations given, but parents "
                    f"{[names[p] for p in parents[i]]} have {expected}."
                )
        dtype = jnp.result_type(*cims, float)
        self.cims = _with_diagonals(tuple(cims), dtype)
        self.names = names
        self.cardinalities = cardinalities
        self.parents = parents

    def parent_list(self, node: int) -> tuple[int, ...]:
        return self.parents[node]

    # ------------------------------------------------------------------ conversions
    def padded(self, max_parents: int | None = None) -> "PaddedCTBN":
        """The same model as a [`jaxctbn.PaddedCTBN`][] (graph stored as traced arrays)."""
        if max_parents is None:
            max_parents = max((len(p) for p in self.parents), default=0)
        return PaddedCTBN.from_ctbn(self, max_parents=max_parents)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CTBN":
        """Build from the [network JSON](../formats.md#network-json) schema (extra keys are
        ignored)."""

        def rate_matrix(rows: Any, k: int, where: str) -> np.ndarray:
            """`Q` as a `k x k` float matrix (a list of `k` lists of `k` numbers, or an array),
            with errors naming the row and entry: numpy alone reports a ragged list or a string
            without saying where."""
            if isinstance(rows, np.ndarray) or hasattr(rows, "__array__"):  # the Python route
                q = np.asarray(rows)
                if q.shape != (k, k) or q.dtype == bool or not np.issubdtype(q.dtype, np.number):
                    raise ValueError(
                        f"{where} must be a {k}x{k} array of numbers, got {q.dtype} {q.shape}."
                    )
                return q.astype(float)
            if not isinstance(rows, list | tuple) or len(rows) != k:
                got = f"{len(rows)} rows" if isinstance(rows, list | tuple) else repr(rows)
                raise ValueError(f"{where} must be {k}x{k} (a list of {k} rows), got {got}.")
            for r, row in enumerate(rows):
                if not isinstance(row, list | tuple):
                    raise ValueError(f"{where} must be {k}x{k}: row {r} is {row!r}, not a list.")
                if len(row) != k:
                    raise ValueError(f"{where} must be {k}x{k}: row {r} has {len(row)} entries.")
                for c, v in enumerate(row):
                    # json gives int or float; NaN and Infinity are floats, checked below
                    if not isinstance(v, numbers.Real) or isinstance(v, bool | np.bool_):
                        raise ValueError(f"{where}[{r}][{c}] must be a number, got {v!r}.")
            return np.asarray(rows, dtype=float)

        if not isinstance(data, Mapping):
            raise ValueError("network: expected a JSON object with keys 'nodes' and 'cims'.")
        if "nodes" not in data or "cims" not in data:
            missing = [k for k in ("nodes", "cims") if k not in data]
            raise ValueError(f"network: missing key(s) {missing}; expected 'nodes' and 'cims'.")
        nodes = data["nodes"]
        if not isinstance(nodes, list) or not nodes:
            raise ValueError("network: 'nodes' must be a non-empty list of node objects.")
        names, cards, parents = [], [], []
        for j, node in enumerate(nodes):
            if not isinstance(node, Mapping) or "name" not in node or "cardinality" not in node:
                raise ValueError(
                    f"network: nodes[{j}] must be an object with 'name', 'cardinality', 'parents'."
                )
            names.append(str(node["name"]))
            card = node["cardinality"]
            if not isinstance(card, int) or isinstance(card, bool):
                raise ValueError(
                    f"network: cardinality of node {node['name']!r} must be an integer."
                )
            cards.append(card)
            ps = node.get("parents", [])
            if not isinstance(ps, list) or not all(isinstance(p, str) for p in ps):
                # an index (or 1.5, or null) would be read as some other node: names only
                raise ValueError(
                    f"network: nodes[{j}].parents of node {node['name']!r} must be a list of "
                    f"node names, got {ps!r}."
                )
            parents.append(ps)
        names = tuple(names)
        parent_idx = _resolve_parents(parents, names)
        _validate_structure(names, tuple(cards), parent_idx)
        cims_in = data["cims"]
        if not isinstance(cims_in, Mapping):
            raise ValueError("network: 'cims' must be an object {node name: [entries]}.")
        unknown = set(cims_in) - set(names)
        if unknown:
            raise ValueError(f"network: 'cims' has unknown node names {sorted(unknown)}.")
        cims = []
        for i, name in enumerate(names):
            if name not in cims_in:
                raise ValueError(f"network: 'cims' has no entry for node {name!r}.")
            entries = cims_in[name]
            configs = parent_configurations(parent_idx[i], tuple(cards))
            if not isinstance(entries, list) or len(entries) != len(configs):
                raise ValueError(
                    f"network: cims[{name!r}] must list {len(configs)} parent configurations, "
                    f"got {len(entries) if isinstance(entries, list) else type(entries).__name__}."
                )
            table = []
            pnames = [names[p] for p in parent_idx[i]]
            for j, (entry, config) in enumerate(zip(entries, configs)):
                if not isinstance(entry, Mapping) or "Q" not in entry:
                    raise ValueError(
                        f"network: cims[{name!r}][{j}] must be an object with 'Q' and "
                        "'parent_states'."
                    )
                where = f"network: cims[{name!r}][{j}]"
                expected = dict(zip(pnames, config))
                got = entry.get("parent_states", {})
                if not isinstance(got, Mapping):
                    raise ValueError(
                        f"{where}.parent_states must be an object {{parent name: state}}, "
                        f"got {got!r}."
                    )
                for parent, state in got.items():
                    if not isinstance(state, numbers.Integral) or isinstance(
                        state, bool | np.bool_
                    ):
                        raise ValueError(
                            f"{where}.parent_states[{parent!r}] must be an integer state, "
                            f"got {state!r}."
                        )
                if {p: int(v) for p, v in got.items()} != expected:
                    raise ValueError(
                        f"{where}.parent_states is {dict(got)}, expected "
                        f"{expected} (itertools.product order over the parents {pnames})."
                    )
                k = cards[i]
                q = rate_matrix(entry["Q"], k, f"{where}.Q")
                off = q[~np.eye(k, dtype=bool)]
                if not np.all(np.isfinite(q)):
                    raise ValueError(f"{where}.Q has non-finite entries.")
                if np.any(off < 0):
                    raise ValueError(f"{where}.Q has negative off-diagonal rates.")
                if not np.allclose(q.sum(1), 0.0, atol=1e-8 * max(1.0, np.abs(q).max())):
                    raise ValueError(f"{where}.Q rows must sum to 0.")
                table.append(q)
            cims.append(np.stack(table))
        return cls(cims=cims, parents=parent_idx, names=names)

    def to_dict(self) -> dict[str, Any]:
        """The network JSON schema as a dict (parents by name, CIMs per parent configuration)."""
        nodes, cims = [], {}
        for i, name in enumerate(self.names):
            pnames = [self.names[p] for p in self.parents[i]]
            nodes.append({"name": name, "cardinality": self.cardinalities[i], "parents": pnames})
            table = np.asarray(self.cims[i])
            cims[name] = [
                {"parent_states": dict(zip(pnames, map(int, config))), "Q": table[j].tolist()}
                for j, config in enumerate(
                    parent_configurations(self.parents[i], self.cardinalities)
                )
            ]
        return {"nodes": nodes, "cims": cims}

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "CTBN":
        """Read a network JSON file (the schema of `from_dict`); a directory or a file
        that is not UTF-8 JSON raises a `ValueError` naming the file."""
        if os.path.isdir(path):
            raise ValueError(
                f"network file {os.fspath(path)!r} is a directory; give a network JSON file."
            )
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"network file {os.fspath(path)!r} is not valid JSON: {e}") from None
        return cls.from_dict(data)

    def to_json(self, path: str | os.PathLike) -> None:
        """Write the network JSON file (`to_dict`), atomically: a failed write leaves no
        partial file and names `path`."""
        write_json(path, self.to_dict())

    def to_networkx(self) -> networkx.DiGraph:
        """The graph as a `networkx.DiGraph` (needs `pip install networkx`): every node, with
        its number of states as the attribute `cardinality`, and an edge from each parent to
        its child (cycles included). Eager, on the host."""
        nx = optional_import("networkx", "CTBN.to_networkx")
        graph = nx.DiGraph()
        for name, k in zip(self.names, self.cardinalities):
            graph.add_node(name, cardinality=k)
        for n, parents in enumerate(self.parents):
            graph.add_edges_from((self.names[p], self.names[n]) for p in parents)
        return graph

    # ------------------------------------------------------------------ other tools' formats
    @classmethod
    def from_causal_hub_json(cls, path: str | os.PathLike) -> "CTBN":
        """Read causal-hub's CTBN JSON (`CatCTBN.to_json_file`), in causal-hub's sorted order of
        nodes, parents and states (the format: `jaxctbn/_model/causal_hub_network.py`)."""
        from .causal_hub_network import read_ctbn_json

        return read_ctbn_json(path)

    def to_causal_hub_json(
        self, path: str | os.PathLike, *, labels: Mapping[str, Sequence[str]] | None = None
    ) -> None:
        """Write causal-hub's CTBN JSON (for `CatCTBN.from_json_file`), atomically, the states
        named by `labels` (`{name: [labels]}`, default the state numbers; the format:
        `jaxctbn/_model/causal_hub_network.py`)."""
        from .causal_hub_network import write_ctbn_json

        write_ctbn_json(self, path, labels)

    @classmethod
    def from_pyagrum(cls, obj: Any) -> "CTBN":
        """The model of a `pyagrum.ctbn.CTBN` (needs `pip install pyagrum`), states in the order
        of each variable's labels (the conversion: `jaxctbn/_model/pyagrum_network.py`)."""
        from .pyagrum_network import ctbn_from_pyagrum

        return ctbn_from_pyagrum(obj)[0]

    def to_pyagrum(self, *, labels: Mapping[str, Sequence[str]] | None = None) -> Any:
        """This model as a `pyagrum.ctbn.CTBN` (needs `pip install pyagrum`), its states named by
        `labels` (`{name: [labels]}`, default the state numbers; the conversion:
        `jaxctbn/_model/pyagrum_network.py`)."""
        from .pyagrum_network import ctbn_to_pyagrum

        return ctbn_to_pyagrum(self, labels)

    @classmethod
    def from_pyctbn_json(cls, path: str | os.PathLike, *, index: int = 0) -> "CTBN":
        """Read the network of data set `index` of a PyCTBN JSON file (`variables`, `dyn.str`,
        `dyn.cims`; the format: `jaxctbn/_model/pyctbn_network.py`)."""
        from .pyctbn_network import read_network

        return read_network(path, index)

    def to_pyctbn_json(self, path: str | os.PathLike) -> None:
        """Write this network as a PyCTBN JSON file (as `JsonExporter.out_file`, no samples),
        atomically; [`jaxctbn.Trajectories.write_pyctbn_json`][] writes samples with it (the
        format: `jaxctbn/_model/pyctbn_network.py`)."""
        from .pyctbn_network import write_network

        write_network(self, path)


class PaddedCTBN(AbstractCTBN):
    r"""A CTBN whose graph is data: parent lists are integer arrays padded with `-1`, and each
    node's CIM table is padded to the largest number of parent configurations allowed.

    Use this to `jax.vmap` over models with *different graphs* (e.g. posterior draws of parent
    sets): every member has the same array shapes, so one compiled function serves the batch.

    **Arguments:**

    - `cims`: per node, an array `(max_configs_n, k_n, k_n)`; rows past the number of
      configurations of the actual parent set are ignored.
    - `parent_index`: per node, an integer array `(max_parents,)` of parent indices, `-1` = empty.
    - `names`, `cardinalities`: static.

    **Scaling.** Node $n$ stores $k_n^2\,\max_{|P|\le K}\prod_{m\in P}k_m$ rates, where $K$ is the
    padding; the master equation expands them over the $S=\prod_n k_n$ global states (memory
    $O(S\sum_n k_n)$, the same for every graph).
    """

    cims: tuple[Array, ...]
    parent_index: tuple[Int[Array | np.ndarray, "*batch max_parents"], ...]
    names: tuple[str, ...] = eqx.field(static=True)
    cardinalities: tuple[int, ...] = eqx.field(static=True)

    def __check_init__(self):
        if len(self.cims) != len(self.cardinalities) or len(self.parent_index) != len(
            self.cardinalities
        ):
            raise ValueError(
                "PaddedCTBN: cims, parent_index and cardinalities need one entry per node."
            )
        N = len(self.cardinalities)
        for n, index in enumerate(self.parent_index):
            if isinstance(index, jax.core.Tracer):
                continue  # built inside jit: the index was computed, not given
            index = np.asarray(index)
            bad = (index < -1) | (index >= N) | (index == n)
            if bad.any():
                raise ValueError(
                    f"PaddedCTBN: parent_index of node {self.names[n]!r} holds "
                    f"{int(index[bad].flat[0])}; entries must be other nodes' indices in "
                    f"0..{N - 1}, or -1 for an empty slot."
                )
            present = np.sort(np.where(index >= 0, index, -1 - np.arange(index.shape[-1])), -1)
            if (np.diff(present, axis=-1) == 0).any():
                raise ValueError(
                    f"PaddedCTBN: parent_index of node {self.names[n]!r} lists a parent twice."
                )

    def parent_list(self, node: int) -> Int[Array | np.ndarray, "*batch max_parents"]:
        return self.parent_index[node]

    @classmethod
    def from_ctbn(cls, model: CTBN, *, max_parents: int) -> "PaddedCTBN":
        n = model.num_nodes
        if max_parents < 0 or max_parents > n - 1:
            raise ValueError(f"max_parents must be between 0 and {n - 1}, got {max_parents}.")
        cims, index = [], []
        for i in range(n):
            ps = model.parents[i]
            if len(ps) > max_parents:
                raise ValueError(
                    f"max_parents={max_parents} is smaller than the {len(ps)} parents of node "
                    f"{model.names[i]!r}."
                )
            cmax = max_configs(i, model.cardinalities, max_parents)
            c = model.cims[i]
            pad = jnp.zeros((cmax - c.shape[0],) + c.shape[1:], c.dtype)
            cims.append(jnp.concatenate([c, pad]))
            index.append(jnp.asarray(list(ps) + [-1] * (max_parents - len(ps)), dtype=jnp.int32))
        return cls(
            cims=tuple(cims),
            parent_index=tuple(index),
            names=model.names,
            cardinalities=model.cardinalities,
        )
