"""The peers' side of jaxctbn's format converters (the networks in `jaxctbn/_model/`:
`causal_hub_network.py`, `pyagrum_network.py`, `pyctbn_network.py`; the trajectories in
`jaxctbn/_paths/`: `pyagrum_csv.py`, `causal_hub_frames.py`, `pyctbn_samples.py`), run with the
peers' own code in their own environment (no jax):

    python3 -m venv /tmp/peers && /tmp/peers/bin/pip install pyagrum causal-hub "pandas<3"
    /tmp/peers/bin/python make_fixtures.py generate tests/model/peer_files

writes the fixtures of `tests/model/peer_files/` with pyAgrum's and causal-hub's own writers,
and next to each a `*.view.json`: what the peer's own reader makes of it (pyAgrum's sufficient
statistics, causal-hub's parsed trajectories, CIMs and fitted statistics), which the tests
compare with jaxctbn's reading of the same file.

PyCTBN is not on PyPI and needs numpy < 1.24 and pandas < 2 (`np.float`, `DataFrame.append`):

    python3 -m venv /tmp/pyctbn && /tmp/pyctbn/bin/pip install numpy==1.23.5 pandas==1.5.3 \\
        networkx "scipy<1.12" tqdm "matplotlib<3.9"
    /tmp/pyctbn/bin/python make_fixtures.py generate-pyctbn tests/model/peer_files --pyctbn-src SRC

with SRC a folder holding PyCTBN's package (`SRC/PyCTBN/PyCTBN/...`, from
github.com/madlabunimib/PyCTBN). Its network comes from PyCTBN's `NetworkGenerator` and its
file from PyCTBN's `JsonExporter`; the samples are drawn here (PyCTBN's `TrajectoryGenerator`
writes through chained pandas assignments that no pandas for Python 3.11 honours: all its
times come out 0), in PyCTBN's layout.

The reverse check reads files that jaxctbn wrote (`write_ours.py` in this folder, run in
jaxctbn's environment, writes them with an `expected.json`) with each peer's own reader and
prints one JSON object comparing what the peer parsed with what jaxctbn meant:

    /tmp/peers/bin/python make_fixtures.py check OURS_DIR
    /tmp/pyctbn/bin/python make_fixtures.py check-pyctbn OURS_DIR --pyctbn-src SRC
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

#: pyAgrum's fixture network: labelled states, a cycle A -> B -> C -> A
PYAGRUM_LABELS = {"A": ["lo", "hi"], "B": ["x", "y", "z"], "C": ["no", "yes"]}
PYAGRUM_ARCS = [("A", "B"), ("B", "C"), ("C", "A")]
#: rows per causal-hub sample in the fixture (its sampler's max_len: the initial state and
#: MAX_LEN - 1 jumps; the observation ends at the last jump)
MAX_LEN = 8


def _key(context: dict, *states: str) -> str:
    """`"P=label,Q=label|x"` or `"...|x->y"`: one entry of a node's statistics."""
    ctx = ",".join(f"{p}={context[p]}" for p in sorted(context))
    return f"{ctx}|{'->'.join(states)}"


def _pyagrum_network():
    import pyagrum
    import pyagrum.ctbn as ct

    model = ct.CTBN()
    for name, labels in PYAGRUM_LABELS.items():
        model.add(pyagrum.LabelizedVariable(name, name, labels))
    for a, b in PYAGRUM_ARCS:
        model.addArc(a, b)
    rng = np.random.default_rng(3)
    for name, labels in PYAGRUM_LABELS.items():
        parents = model.parentNames(name)
        k = len(labels)
        configs = [{}]
        for p in parents:
            configs = [{**c, p: s} for c in configs for s in range(len(PYAGRUM_LABELS[p]))]
        for context in configs:
            q = np.round(rng.uniform(0.3, 3.0, (k, k)), 3)
            np.fill_diagonal(q, 0.0)
            np.fill_diagonal(q, -q.sum(1))
            for a in range(k):
                for b in range(k):
                    model.CIM(name)[{**context, f"{name}#i": a, f"{name}#j": b}] = float(q[a, b])
    return model


def _pyagrum_network_json(model) -> dict:
    """The pyAgrum model in jaxctbn's network JSON (parents in pyAgrum's order, configurations
    in itertools.product order), with its labels, read through pyAgrum's own API."""
    import itertools

    nodes, cims = [], {}
    for name, labels in PYAGRUM_LABELS.items():
        parents = sorted(model.parentNames(name), key=list(PYAGRUM_LABELS).index)
        nodes.append({"name": name, "cardinality": len(labels), "parents": parents})
        k = len(labels)
        entries = []
        for config in itertools.product(*(range(len(PYAGRUM_LABELS[p])) for p in parents)):
            context = dict(zip(parents, config))
            q = [
                [model.CIM(name)[{**context, f"{name}#i": a, f"{name}#j": b}] for b in range(k)]
                for a in range(k)
            ]
            entries.append({"parent_states": context, "Q": q})
        cims[name] = entries
    return {"nodes": nodes, "cims": cims, "labels": PYAGRUM_LABELS}


def pyagrum_statistics(csv_path: str, labels: dict, parents: dict) -> dict:
    """pyAgrum's own sufficient statistics of a trajectory CSV (`Trajectory.computeStats`,
    which divides by the number of samples: multiplied back here): per node, the time spent
    `T` and the transitions `M` per parent configuration, keyed by labels."""
    import pyagrum
    import pyagrum.ctbn as ct

    template = ct.CTBN()
    for name, ls in labels.items():
        template.add(pyagrum.LabelizedVariable(name, name, list(ls)))
    trajectory = ct.Trajectory(csv_path, template)
    n = len(trajectory.data)
    out = {}
    for name, ps in parents.items():
        T, M = trajectory.computeStats(name, list(ps))
        stats = {}
        for tensor, kind in ((T, "T"), (M, "M")):
            inst = pyagrum.Instantiation(tensor)
            inst.setFirst()
            while not inst.end():
                d = inst.todict(withLabels=True)
                context = {p: d[p] for p in ps}
                states = [d[f"{name}#i"]] + ([d[f"{name}#j"]] if kind == "M" else [])
                value = tensor.get(inst) * n
                if value:
                    stats[f"{kind}:{_key(context, *states)}"] = value
                inst.inc()
        out[name] = stats
    return {"samples": n, "time_horizon": trajectory.timeHorizon, "statistics": out}


def _causal_hub_view(trajectories) -> list:
    """causal-hub's own parse of trajectories: times, integer values, states."""
    return [
        {
            "labels": list(t.labels()),
            "states": {k: list(v) for k, v in t.states().items()},
            "times": t.times().tolist(),
            "values": t.values().astype(int).tolist(),
        }
        for t in trajectories.values()
    ]


def _causal_hub_cims(model) -> dict:
    return {
        name: {
            "states": {k: list(v) for k, v in cim.states().items()},
            "conditioning_states": {k: list(v) for k, v in cim.conditioning_states().items()},
            "parameters": cim.parameters().tolist(),
        }
        for name, cim in model.cims().items()
    }


def generate(out: str) -> None:
    import pandas as pd
    import pyagrum.ctbn as ct
    from causal_hub import assets
    from causal_hub.datasets import CatTrjs
    from causal_hub.models import CatCTBN

    os.makedirs(out, exist_ok=True)
    # pyAgrum: its sampler's CSV, its network, and its statistics of the CSV
    model = _pyagrum_network()
    network = _pyagrum_network_json(model)
    with open(os.path.join(out, "pyagrum_network.json"), "w") as f:
        json.dump(network, f, indent=1)
    path = os.path.join(out, "pyagrum_trajectories.csv")
    ct.ForwardSamplingInference(model).writeTrajectoryCSV(path, n=3, timeHorizon=2.0, burnIn=5)
    parents = {node["name"]: node["parents"] for node in network["nodes"]}
    with open(os.path.join(out, "pyagrum_trajectories.view.json"), "w") as f:
        json.dump(pyagrum_statistics(path, PYAGRUM_LABELS, parents), f, indent=1)

    # causal-hub: its EATING network, three of its samples as CSVs of its frames
    eating = assets.load_eating()
    eating.to_json_file(os.path.join(out, "causal_hub_eating.json"))
    data = eating.sample(3, max_len=MAX_LEN, seed=7, parallel=False)
    for i, frame in enumerate(data.to_pandas()):
        frame.to_csv(os.path.join(out, f"causal_hub_trajectory_{i}.csv"), index=False)
    # the peer's view: its parse of the CSVs read back (as a user would), the model, its fit
    frames = []
    for i in range(3):
        frame = pd.read_csv(os.path.join(out, f"causal_hub_trajectory_{i}.csv"), dtype=str)
        frame["time"] = frame["time"].astype(float)
        for c in frame.columns[1:]:  # the states as the model lists them
            frame[c] = pd.Categorical(frame[c], categories=list(eating.cims()[c].states()[c]))
        frames.append(frame)
    parsed = CatTrjs.from_pandas(frames)
    read_model = CatCTBN.from_json_file(os.path.join(out, "causal_hub_eating.json"))
    # (maximum likelihood panics on a configuration never visited; the Bayesian estimate's
    # statistics are the same counts and times)
    fitted = CatCTBN.fit(parsed, read_model.graph(), "be", parallel=False)
    view = {
        "trajectories": _causal_hub_view(parsed),
        "cims": _causal_hub_cims(read_model),
        "fitted_statistics": {
            name: {k: np.asarray(v).tolist() for k, v in cim.sample_statistics().items()}
            for name, cim in fitted.cims().items()
        },
    }
    with open(os.path.join(out, "causal_hub_view.json"), "w") as f:
        json.dump(view, f, indent=1)
    print(json.dumps({"generated": sorted(os.listdir(out))}))


def _pyctbn(src: str):
    import warnings

    warnings.simplefilter("ignore")
    sys.path.insert(0, src)
    from PyCTBN.PyCTBN.structure_graph.network_generator import NetworkGenerator
    from PyCTBN.PyCTBN.structure_graph.sample_path import SamplePath
    from PyCTBN.PyCTBN.utility.json_exporter import JsonExporter
    from PyCTBN.PyCTBN.utility.json_importer import JsonImporter

    return NetworkGenerator, SamplePath, JsonExporter, JsonImporter


def pyctbn_view(path: str, src: str) -> dict:
    """PyCTBN's own parse of a JSON file: `JsonImporter` + `SamplePath` (its rows: the stay,
    the state, the next state; the `-1` next states of end rows included) and its CIMs."""
    _, SamplePath, _, JsonImporter = _pyctbn(src)
    importer = JsonImporter(path, "samples", "dyn.str", "variables", "Time", "Name", "dyn.cims")
    importer.import_data(0)
    cims = importer.import_sampled_cims(importer._raw_data, 0, "dyn.cims")
    sample_path = SamplePath(importer)
    sample_path.build_trajectories()
    sample_path.build_structure()
    trajectory = sample_path.trajectories
    return {
        "variables": importer.variables.to_dict(orient="list"),
        "edges": [list(map(str, e)) for e in sample_path.structure.edges],
        "sorter": list(importer.sorter),
        "stays": trajectory.times.astype(float).tolist(),
        "rows": trajectory.complete_trajectory.astype(int).tolist(),
        "cims": {
            v: {
                "configurations": list(importer._raw_data[0]["dyn.cims"][v]),
                "matrices": [np.asarray(m, float).tolist() for m in cims[v]],
            }
            for v in cims
        },
    }


def generate_pyctbn(out: str, src: str) -> None:
    import random

    import pandas as pd

    NetworkGenerator, _, JsonExporter, _ = _pyctbn(src)
    for seed in range(100):  # a graph where no node has two parents (see the module docstring)
        random.seed(seed)
        np.random.seed(seed)
        generator = NetworkGenerator(["X", "Y", "Z"], [3, 2, 3])
        generator.generate_graph(0.4)
        if len(generator.dyn_str) >= 2 and generator.dyn_str["To"].value_counts().max() == 1:
            break
    generator.generate_cims(1, 3)
    exporter = JsonExporter(generator.variables, generator.dyn_str, generator.cims)
    names = list(generator.variables["Name"])
    parents = {v: list(generator.dyn_str[generator.dyn_str["To"] == v]["From"]) for v in names}
    rng = np.random.default_rng(seed)
    for _ in range(3):
        state, t, rows = {v: 0 for v in names}, 0.0, []
        rows.append([0.0] + [state[v] for v in names])
        while True:
            rates = []
            for v in names:
                cims = generator.cims[v].actual_cims
                c = state[parents[v][0]] if parents[v] else 0
                rates.append(np.asarray(cims[c].cim[state[v]], float))
            totals = np.array([-r[state[v]] for r, v in zip(rates, names)])
            t += rng.exponential(1 / totals.sum())
            if t >= 1.5:
                break
            n = rng.choice(len(names), p=totals / totals.sum())
            p = np.clip(rates[n], 0, None)
            state[names[n]] = int(rng.choice(len(p), p=p / p.sum()))
            rows.append([round(t, 4)] + [state[v] for v in names])
        rows.append([1.5] + [-1] * len(names))
        exporter.add_trajectory(pd.DataFrame(rows, columns=["Time", *names]))
    cwd = os.getcwd()
    os.makedirs(out, exist_ok=True)
    os.chdir(out)  # JsonExporter.out_file writes into the working directory
    try:
        exporter.out_file("pyctbn_network_and_samples.json")
    finally:
        os.chdir(cwd)
    path = os.path.join(out, "pyctbn_network_and_samples.json")
    with open(os.path.join(out, "pyctbn_view.json"), "w") as f:
        json.dump(pyctbn_view(path, src), f, indent=1)
    print(json.dumps({"generated": path, "seed": seed}))


def _compare(got, expected, tol: float = 1e-9) -> list[str]:
    """Differences between two JSON-like values (numbers to `tol`, relative)."""
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return [f"expected an object, got {type(got).__name__}"]
        out = []
        for k in sorted(set(expected) | set(got)):
            a, b = got.get(k, 0.0), expected.get(k, 0.0)
            out += [f"{k}: {d}" for d in _compare(a, b, tol)]
        return out
    if isinstance(expected, list):
        if not isinstance(got, list) or len(got) != len(expected):
            return [
                f"expected a list of {len(expected)}, got {got if not isinstance(got, list) else len(got)}"
            ]
        return [
            f"[{i}]: {d}"
            for i, (a, b) in enumerate(zip(got, expected))
            for d in _compare(a, b, tol)
        ]
    if isinstance(expected, float | int) and not isinstance(expected, bool):
        ok = isinstance(got, float | int) and abs(got - expected) <= tol * max(1.0, abs(expected))
        return [] if ok else [f"{got!r} != {expected!r}"]
    return [] if got == expected else [f"{got!r} != {expected!r}"]


def check(ours: str) -> None:
    """Read the files jaxctbn wrote (see `write_ours.py`) with pyAgrum's and causal-hub's readers."""
    import pandas as pd
    from causal_hub.datasets import CatTrjs
    from causal_hub.models import CatCTBN

    with open(os.path.join(ours, "expected.json")) as f:
        expected = json.load(f)
    report = {}
    # pyAgrum: its statistics of our CSV against ours
    e = expected["pyagrum"]
    got = pyagrum_statistics(os.path.join(ours, e["file"]), e["labels"], e["parents"])
    diff = _compare(got["statistics"], e["statistics"])
    report["pyagrum trajectory CSV"] = {
        "samples": got["samples"],
        "match": not diff,
        "differences": diff[:5],
    }
    # causal-hub: its reading of our network JSON, its CIMs against ours
    e = expected["causal-hub network"]
    model = CatCTBN.from_json_file(os.path.join(ours, e["file"]))
    diff = _compare(_causal_hub_cims(model), e["cims"], tol=1e-12)
    report["causal-hub network JSON"] = {"match": not diff, "differences": diff[:5]}
    # causal-hub: its parse of our frames (written to CSV, read back as categories)
    e = expected["causal-hub frames"]
    frames = []
    for name in e["files"]:
        frame = pd.read_csv(os.path.join(ours, name), dtype=str)
        frame["time"] = frame["time"].astype(float)
        for c in frame.columns[1:]:
            frame[c] = pd.Categorical(frame[c], categories=e["labels"][c])
        frames.append(frame)
    parsed = CatTrjs.from_pandas(frames)
    diff = _compare(_causal_hub_view(parsed), e["trajectories"], tol=0.0)
    report["causal-hub frames"] = {
        "trajectories": len(frames),
        "match": not diff,
        "differences": diff[:5],
    }
    print(json.dumps(report))


def check_pyctbn(ours: str, src: str) -> None:
    with open(os.path.join(ours, "expected.json")) as f:
        e = json.load(f)["pyctbn"]
    got = pyctbn_view(os.path.join(ours, e["file"]), src)
    diff = _compare(
        {k: got[k] for k in ("edges", "sorter", "stays", "rows")},
        {k: e[k] for k in ("edges", "sorter", "stays", "rows")},
        tol=1e-12,
    )
    cims = _compare(got["cims"], e["cims"], tol=1e-12)
    print(
        json.dumps(
            {"pyctbn JSON": {"match": not diff and not cims, "differences": (diff + cims)[:5]}}
        )
    )


def main() -> None:
    args = sys.argv[1:]
    src = None
    if "--pyctbn-src" in args:
        i = args.index("--pyctbn-src")
        src = args[i + 1]
        del args[i : i + 2]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
    elif args[0] == "generate":
        generate(args[1])
    elif args[0] == "generate-pyctbn" and src:
        generate_pyctbn(args[1], src)
    elif args[0] == "check":
        check(args[1])
    elif args[0] == "check-pyctbn" and src:
        check_pyctbn(args[1], src)
    else:
        raise SystemExit(f"unknown command {args}; see --help")


if __name__ == "__main__":
    main()
