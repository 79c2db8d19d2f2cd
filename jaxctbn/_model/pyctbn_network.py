"""PyCTBN's JSON file (`PyCTBN.utility.json_exporter.JsonExporter.out_file`, read by
`json_importer.JsonImporter(path, "samples", "dyn.str", "variables", "Time", "Name",
"dyn.cims")`) and its network part; the samples are read and written by
`_paths/pyctbn_samples.py`. The file is a list of data sets (a single object is read as a list
of one), each

```
{"dyn.str": [{"From": parent, "To": child}, ...],
 "variables": [{"Name": name, "Value": cardinality}, ...],
 "dyn.cims": {name: {"P=0,Q=1": [{"0": rate, "1": rate, ...}, ...rows], ...}, ...},
 "samples": [[{"Time": t, name: state, ...}, ...], ...]}
```

A CIM's key names its parent configuration as `parent=state` pairs joined by `,` in the order
of the parents in `dyn.str` (a node without parents: its own name); `dyn.cims` is optional. A
sample's rows hold the time first and the states (integers) in the order of `variables`; each
row is the state from its time on, and the last row, with every state `-1`, marks the end of
observation. PyCTBN's importer takes each row's stay as the time to the next row and its
transition as the change to the next row's states, skipping changes to `-1`; a last row with
real states is a jump at the end of observation (a stay of length zero follows).

A network written alone (`CTBN.to_pyctbn_json`) is one data set with an empty `samples` list
(PyCTBN's `JsonImporter` reads its `variables`, `dyn.str` and `dyn.cims`; its `import_data`
takes the node order from the first sample, so it needs the samples too); trajectories are
written with the network's `variables`, `dyn.str` and `dyn.cims` (`Trajectories.write_pyctbn_json`
with a CTBN), or with the `variables` alone (with a dict of cardinalities or labels).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._files import write_json
from .ctbn import CTBN, AbstractCTBN
from .json_documents import is_integer, is_number, read_json
from .node_labels import check_names, model_nodes


def read_data_set(path: Any, index: int) -> tuple[dict, str]:
    """Data set `index` of the file and the prefix of its errors (the file and the index)."""
    source = f"PyCTBN file {os.fspath(path)!r}"
    data = read_json(path, "PyCTBN")
    sets = data if isinstance(data, list) else [data]
    if not isinstance(index, int) or not 0 <= index < len(sets):
        raise ValueError(
            f"{source}: index {index!r} out of range; the file holds {len(sets)} data set(s)."
        )
    chosen = sets[index]
    where = f"{source}: [{index}]"
    if not isinstance(chosen, Mapping) or "variables" not in chosen:
        raise ValueError(
            f"{where} must be an object with 'variables', 'dyn.str', 'samples' (and 'dyn.cims')."
        )
    return dict(chosen), where


def read_variables(data: dict, where: str) -> dict[str, int]:
    """The data set's `variables`: `{name: cardinality}` in file order."""
    variables = data["variables"]
    if not isinstance(variables, list) or not variables:
        raise ValueError(
            f"{where}.variables must be a non-empty list of {{'Name': name, 'Value': cardinality}}."
        )
    out: dict[str, int] = {}
    for j, v in enumerate(variables):
        if (
            not isinstance(v, Mapping)
            or not isinstance(v.get("Name"), str)
            or not v["Name"]
            or not is_integer(v.get("Value"))
            or v["Value"] < 2
        ):
            raise ValueError(
                f"{where}.variables[{j}] must be {{'Name': a name, 'Value': a cardinality >= 2}}, got {v!r}."
            )
        if v["Name"] in out:
            raise ValueError(f"{where}.variables[{j}]: {v['Name']!r} is listed twice.")
        out[v["Name"]] = int(v["Value"])
    check_names(list(out), where)
    return out


def _parents(data: dict, names: list[str], where: str) -> dict[str, list[str]]:
    edges = data.get("dyn.str", [])
    if not isinstance(edges, list):
        raise ValueError(f"{where}['dyn.str'] must be a list of {{'From': parent, 'To': child}}.")
    parents: dict[str, list[str]] = {n: [] for n in names}
    for j, e in enumerate(edges):
        if not isinstance(e, Mapping) or e.get("From") not in names or e.get("To") not in names:
            raise ValueError(
                f"{where}['dyn.str'][{j}] must be {{'From': a variable, 'To': a variable}}, got {e!r}."
            )
        if e["From"] == e["To"] or e["From"] in parents[e["To"]]:
            raise ValueError(f"{where}['dyn.str'][{j}]: a self-loop or a repeated arc {e!r}.")
        parents[e["To"]].append(e["From"])
    return parents


def read_network(path: Any, index: int = 0) -> CTBN:
    """The network of a PyCTBN JSON file (its `variables`, `dyn.str` and `dyn.cims`), parents in
    the order of `dyn.str`. PyCTBN's generator rounds rates to 4 decimals, so the diagonal is
    checked against the off-diagonal rates to 1e-3 (relative) and then recomputed from them."""
    data, where = read_data_set(path, index)
    cards = read_variables(data, where)
    names = list(cards)
    parents = _parents(data, names, where)
    if "dyn.cims" not in data:
        raise ValueError(
            f"{where}: no 'dyn.cims' key; this file holds no rates (only a structure and samples)."
        )
    cims_in = data["dyn.cims"]
    if not isinstance(cims_in, Mapping):
        raise ValueError(
            f"{where}['dyn.cims'] must be an object {{variable: {{configuration: rows}}}}."
        )
    missing = [n for n in names if n not in cims_in]
    unknown = [n for n in cims_in if n not in names]
    if missing or unknown:
        raise ValueError(
            f"{where}['dyn.cims']: no entry for {missing}, unknown {unknown}; one per variable."
        )
    cims = []
    for name in names:
        ps, k = parents[name], cards[name]
        entries = cims_in[name]
        at = f"{where}['dyn.cims'][{name!r}]"
        configs = list(itertools.product(*(range(cards[p]) for p in ps)))
        if not isinstance(entries, Mapping) or len(entries) != len(configs):
            raise ValueError(f"{at} must hold {len(configs)} parent configuration(s) of {ps}.")
        table = np.full((len(configs), k, k), np.nan)
        for key, rows in entries.items():
            config = _configuration(key, name, ps, cards, f"{at}[{key!r}]")
            c = configs.index(config)
            if not np.isnan(table[c, 0, 0]):
                raise ValueError(f"{at}[{key!r}]: configuration {key!r} given twice.")
            table[c] = _matrix(rows, k, f"{at}[{key!r}]")
        cims.append(table)
    return CTBN(cims=cims, parents=[parents[n] for n in names], names=names)


def _configuration(key: str, name: str, ps: list[str], cards: dict, where: str) -> tuple:
    if not ps:
        if key != name:
            raise ValueError(
                f"{where}: a node without parents keys its CIM by its own name, {name!r}."
            )
        return ()
    pairs = [part.split("=") for part in key.split(",")]
    if len(pairs) != len(ps) or any(len(p) != 2 for p in pairs) or [p[0] for p in pairs] != ps:
        raise ValueError(
            f"{where}: expected the key {','.join(f'{p}=<state>' for p in ps)} (parents in dyn.str order)."
        )
    out = []
    for (parent, value), p in zip(pairs, ps):
        if not value.isdigit() or int(value) >= cards[p]:
            raise ValueError(f"{where}: state {value!r} of {parent!r} is not in 0..{cards[p] - 1}.")
        out.append(int(value))
    return tuple(out)


def _matrix(rows: Any, k: int, where: str) -> np.ndarray:
    if not isinstance(rows, list) or len(rows) != k:
        raise ValueError(f"{where} must be {k} rows (objects {{'0': rate, ..., '{k - 1}': rate}}).")
    q = np.zeros((k, k))
    for a, row in enumerate(rows):
        if isinstance(row, Mapping):
            if sorted(row) != sorted(str(b) for b in range(k)):
                raise ValueError(
                    f"{where}[{a}] must have the keys '0'..'{k - 1}', got {sorted(row)}."
                )
            values = [row[str(b)] for b in range(k)]
        elif isinstance(row, list) and len(row) == k:
            values = row
        else:
            raise ValueError(f"{where}[{a}] must be an object {{'0': rate, ..., '{k - 1}': rate}}.")
        if not all(is_number(v) for v in values):
            raise ValueError(f"{where}[{a}] must hold numbers, got {values!r}.")
        q[a] = values
    off = q[~np.eye(k, dtype=bool)]
    if not np.all(np.isfinite(q)) or np.any(off < 0):
        raise ValueError(f"{where} must be finite with non-negative off-diagonal rates.")
    total = q.sum(1) - np.diag(q)
    if np.any(np.abs(np.diag(q) + total) > 1e-3 * np.maximum(1.0, total)):
        raise ValueError(f"{where}: the diagonal is not minus the sum of the row's other rates.")
    return q


def network_data_set(model: Any) -> dict[str, Any]:
    """A PyCTBN data set without its samples: a CTBN's `variables`, `dyn.str` and `dyn.cims`, or
    the `variables` of a dict `{name: cardinality}` or `{name: [labels]}` (an empty `dyn.str`,
    no `dyn.cims`)."""
    nodes, _ = model_nodes(model)
    names = list(nodes)
    cards = {n: len(ls) for n, ls in nodes.items()}
    data: dict[str, Any] = {
        "dyn.str": [],
        "variables": [{"Name": n, "Value": cards[n]} for n in names],
    }
    if isinstance(model, AbstractCTBN):
        if not isinstance(model, CTBN):
            raise ValueError("model: a PaddedCTBN has no fixed graph; convert it to a CTBN first.")
        cims: dict[str, dict] = {}
        for n, name in enumerate(names):
            ps = [names[p] for p in model.parents[n]]
            data["dyn.str"] += [{"From": p, "To": name} for p in ps]
            table = np.asarray(model.cims[n], dtype=float)
            cims[name] = {}
            for c, config in enumerate(itertools.product(*(range(cards[p]) for p in ps))):
                key = ",".join(f"{p}={v}" for p, v in zip(ps, config)) if ps else name
                cims[name][key] = [
                    {str(b): float(x) for b, x in enumerate(row)} for row in table[c].tolist()
                ]
        data["dyn.cims"] = cims
    return data


def write_network(model: CTBN, path: Any) -> None:
    """A PyCTBN file holding the network alone (`network_data_set`, no samples), atomically."""
    write_json(path, [{**network_data_set(model), "samples": []}], indent=None)
