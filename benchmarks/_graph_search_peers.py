"""The peers of `bench_graph_search.py`, run as external programs in their own environment
(numpy, pandas < 3, causal-hub, pyAgrum; no jax): `python _graph_search_peers.py PEER DATA K`
reads the trajectories that the benchmark sampled (an `.npz` of `jaxctbn.Trajectories`), runs
one peer's structure learning on them and prints one JSON line: the learned parents of each node
and the time of the learning call alone (the data conversion excluded). `python
_graph_search_peers.py self-check` runs each peer on a network and data of its own instead (so
that what the table shows is not an artefact of our conversion).

- `causal-hub-cthc`, `causal-hub-ctpc`: causal-hub's continuous-time hill climbing and CTPC.
  Its Python package (0.0.4) learns structure only through structural EM on evidence
  (`causal_hub.estimators.sem`): the complete paths are passed as certain evidence (each node's
  state known on every interval), so the E-step returns the paths themselves.
- `pyagrum-ctpc`: pyAgrum's CTPC (`pyagrum.ctbn.Learner.learnCTBN`, chi-square and F tests) on
  its own trajectory format (a row per jump with the state left, the initial states at time 0
  and the last ones at the horizon).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def _paths(path: str):
    """Per trajectory: (initial states (N,), jump times (E,), states after each jump (E, N),
    duration)."""
    with np.load(path) as f:
        init, times, states = f["initial_states"], f["jump_times"], f["states"]
        counts, durations = f["num_events"], f["durations"]
    return [
        (init[r], times[r, : counts[r]], states[r, : counts[r]], float(durations[r]))
        for r in range(len(counts))
    ]


def _node_intervals(init, times, states, duration, n):
    """The intervals on which node n keeps one state: (state, start, end) triples."""
    values = np.concatenate([[init[n]], states[:, n]])
    starts = np.concatenate([[0.0], times])
    change = np.concatenate([[True], values[1:] != values[:-1]])
    v, s = values[change], starts[change]
    ends = np.append(s[1:], duration)
    return list(zip(v.tolist(), s.tolist(), ends.tolist()))


def causal_hub(paths, N: int, algorithm: str, K: int):
    import pandas as pd
    from causal_hub.datasets import CatTrjsEv
    from causal_hub.estimators import PK, sem

    names = [f"X{i}" for i in range(N)]
    frames = []
    for init, times, states, duration in paths:
        rows = [
            (names[n], str(v), a, b)
            for n in range(N)
            for v, a, b in _node_intervals(init, times, states, duration, n)
        ]
        frames.append(pd.DataFrame(rows, columns=["event", "state", "start_time", "end_time"]))
    evidence = CatTrjsEv.from_pandas(frames, with_states={name: ["0", "1"] for name in names})
    knowledge = PK(names, [], [], [])
    t0 = time.perf_counter()
    out = sem(evidence, knowledge, algorithm, max_iter=1, seed=0, max_parents=K)
    elapsed = time.perf_counter() - t0
    graph = out["last_model"].graph()
    vertices = graph.vertices()
    parents = [[] for _ in range(N)]
    for name in vertices:
        for p in graph.parents(name):
            parents[names.index(name)].append(names.index(p))
    return parents, elapsed


def pyagrum_ctpc(paths, N: int):
    import pyagrum.ctbn as ct

    names = [f"X{i}" for i in range(N)]
    # pyAgrum's rows: (time, var, state) is the state var holds until that time; the initial
    # states at time 0 and every node's last state at the horizon (the same for every path)
    data = {}
    for r, (init, times, states, duration) in enumerate(paths):
        events = [(0.0, names[n], f"s{int(init[n])}") for n in range(N)]
        previous = init
        for t, s in zip(times.tolist(), states):
            (n,) = np.nonzero(s != previous)[0]
            events.append((t, names[n], f"s{int(previous[n])}"))
            previous = s
        events += [(duration, names[n], f"s{int(previous[n])}") for n in range(N)]
        data[r] = events
    template = ct.CTBN()
    for name in names:
        import pyagrum

        template.add(pyagrum.LabelizedVariable(name, name, ["s0", "s1"]))
    t0 = time.perf_counter()
    learned = ct.Learner(data).learnCTBN(template)
    elapsed = time.perf_counter() - t0
    parents = [[] for _ in range(N)]
    for a, b in learned.arcs():
        parents[names.index(learned.name(b))].append(names.index(learned.name(a)))
    return parents, elapsed


def self_check() -> dict:
    """Each peer on a network and data of its own (not converted by us): causal-hub's EATING
    CTBN (3 nodes, a cycle) sampled by causal-hub, 100 paths of length 10, through the same
    structural EM on certain evidence; pyAgrum's CTPC on a random 4-node CTBN of its own
    generator sampled by its own forward sampler (30 paths of horizon 20)."""
    import numpy as np
    import pandas as pd

    out = {}
    from causal_hub import assets
    from causal_hub.datasets import CatTrjsEv
    from causal_hub.estimators import PK, sem

    model = assets.load_eating()
    truth = model.graph()
    out["causal-hub truth"] = {v: truth.parents(v) for v in truth.vertices()}
    data = model.sample(100, max_time=10.0, seed=1)
    labels, frames = data.labels(), []
    for path in data.values():
        df = path.to_pandas()
        t = df["time"].to_numpy(float)
        rows = []
        for label in labels:
            v = df[label].astype(str).to_numpy()
            change = np.concatenate([[True], v[1:] != v[:-1]])
            starts, ends = t[change], np.append(t[change][1:], t[-1])
            rows += [(label, a, b, c) for a, b, c in zip(v[change], starts, ends) if c > b]
        frame = pd.DataFrame(rows, columns=["event", "state", "start_time", "end_time"])
        frames.append(frame.astype({"start_time": float, "end_time": float}))
    evidence = CatTrjsEv.from_pandas(frames, with_states=data.states())
    learned = sem(evidence, PK(labels, [], [], []), "cthc", max_iter=1, seed=0)["last_model"]
    graph = learned.graph()
    out["causal-hub-cthc"] = {v: graph.parents(v) for v in graph.vertices()}

    import pyagrum.ctbn as ct

    np.random.seed(0)
    ctbn = ct.randomCTBN((3, 5), 4, 2)
    out["pyagrum truth"] = sorted((ctbn.name(a), ctbn.name(b)) for a, b in ctbn.arcs())
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".csv") as f:
        ct.ForwardSamplingInference(ctbn).writeTrajectoryCSV(
            f.name, n=30, timeHorizon=20, burnIn=10
        )
        found = ct.Learner(f.name).learnCTBN(ctbn)
    out["pyagrum-ctpc"] = sorted((found.name(a), found.name(b)) for a, b in found.arcs())
    return out


def main():
    if sys.argv[1] == "self-check":
        print(json.dumps(self_check()))
        return
    peer, data, K = sys.argv[1], sys.argv[2], int(sys.argv[3])
    paths = _paths(data)
    N = len(paths[0][0])
    if peer == "causal-hub-cthc":
        parents, elapsed = causal_hub(paths, N, "cthc", K)
    elif peer == "causal-hub-ctpc":
        parents, elapsed = causal_hub(paths, N, "ctpc", K)
    elif peer == "pyagrum-ctpc":
        parents, elapsed = pyagrum_ctpc(paths, N)
    else:
        raise SystemExit(f"unknown peer {peer!r}")
    print(json.dumps({"peer": peer, "parents": parents, "learn_s": elapsed}))


if __name__ == "__main__":
    main()
