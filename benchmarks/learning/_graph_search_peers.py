"""The peers of `bench_graph_search.py`, run as external programs in their own environment
(numpy, pandas < 3, causal-hub, pyAgrum; no jax): `python _graph_search_peers.py PEER DATA K`
reads the trajectories that the benchmark sampled (an `.npz` of `jaxctbn.Trajectories`), runs
one peer's structure learning on them and prints one JSON line: the learned parents of each node
and the time of the learning call alone (the data conversion excluded), with a few diagnostics.
`python _graph_search_peers.py self-check` runs each peer on a network and data of its own
instead (so that what the table shows is not an artefact of our conversion).

- `causal-hub-cthc`, `causal-hub-ctpc`: causal-hub's continuous-time hill climbing and CTPC.
  Its Python package (0.0.4) learns structure only through structural EM on evidence
  (`causal_hub.estimators.sem`; there is no entry point for complete trajectories), which has
  three properties that decide how the data must be passed:

  1. The E-step imputes each evidence path by length only: every imputed path is cut after as
     many events as the largest number of intervals of one variable in one evidence path (on a
     whole path that is a fraction of its events). So each jump is passed as its own evidence
     path: the state before the jump, held for the time to the jump, then the jump; every path
     then imputes to exactly the data (one jump, its waiting time), and the sum of the paths'
     statistics is that of the data (less the censored last waiting time of each trajectory).
  2. The E-step keeps the importance weight of each imputed path in its statistics (counts,
     times and BIC's sample size are multiplied by it), and the weight includes the initial
     distribution of the model, which is always uniform: at least 2^-N per path. The other
     nodes are therefore given an (unreached) change of state just after the jump, which makes
     the other factors of the weight exactly 1, so every path weighs exactly 2^-N; each path is
     then passed 2^N times, which makes the statistics exactly those of the data. Where that is
     more than `MAX_EVIDENCE_PATHS` paths (N above ~8 here) the peer cannot be given the data
     and the driver fails with a message saying so, rather than learn from data scaled by 2^-N
     (which makes BIC's penalty a reward at N = 20: every node gets K parents, and CTPC's tests
     lose all power: an empty graph).
  3. CTPC starts from the complete graph, cut at random to `max_parents` parents per node when
     that is given; so CTPC gets no `max_parents` (K is not an in-degree bound for it). Its F
     test panics (`FisherSnedecor::new(..).unwrap()`: `Freedom2Invalid`) when some
     configuration of a conditioning set has no transitions out of a state. CTHC
     scores with BIC on the Bayesian estimate's `sample_log_likelihood`, which in 0.0.4 grows
     with the number of parent configurations (it is not the likelihood), so CTHC fills every
     node up to K parents in our runs; that is the peer's own behaviour and is left as is.

- `pyagrum-ctpc`: pyAgrum's CTPC (`pyagrum.ctbn.Learner.learnCTBN`, F and chi-square tests at
  its fixed level) on its own trajectory format: a row (time, var, state) per jump with the
  state the variable held until then, the initial states at time 0 and the last ones at the end.
  Its statistics for the tests are divided by the number of trajectories (the transition counts,
  which are the F test's degrees of freedom, included), so with 50 trajectories no test ever
  rejects and the graph is empty (its sampler writes one trajectory by default,
  `writeTrajectoryCSV(n=1)`, and on one it finds its own graphs: `self-check`). So the
  trajectories are passed as one, end to end (ordered greedily so that each starts as close as
  possible to where the previous one ended); the state differences at the joins are passed as
  simultaneous jumps, whose number is reported (`join_jumps`, against `jumps`).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

#: the most evidence paths (jumps x 2^N copies) given to causal-hub's structural EM
MAX_EVIDENCE_PATHS = 200_000


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


def _jump_evidence(paths, N: int, cards, names):
    """causal-hub evidence, one path per jump (see the module's docstring): the jumping node
    holds its state until the jump and then the new one, every other node holds its state until
    just after the jump and then (never reached: the E-step stops at the jump) another one."""
    import pandas as pd

    frames = []
    for init, times, states, _ in paths:
        prev_t, prev = 0.0, init
        for t, s in zip(times.tolist(), states):
            changed = np.nonzero(s != prev)[0]
            if len(changed) == 0:  # not a jump (a row at the end of a causal-hub sample)
                continue
            (j,) = changed
            d = t - prev_t
            e1, e2 = d * (1 + 1e-6), d * (1 + 2e-6)
            event, state, start, end = [], [], [], []
            for n in range(N):
                a = int(prev[n])
                b = int(s[n]) if n == j else (a + 1) % cards[n]
                split = d if n == j else e1
                event += [names[n], names[n]]
                state += [str(a), str(b)]
                start += [0.0, split]
                end += [split, e1 if n == j else e2]
            frames.append(
                pd.DataFrame({"event": event, "state": state, "start_time": start, "end_time": end})
            )
            prev_t, prev = t, s
    return frames


def causal_hub(paths, N: int, algorithm: str, K: int, cards=None) -> dict:
    from causal_hub.datasets import CatTrjsEv
    from causal_hub.estimators import PK, sem

    cards = [2] * N if cards is None else list(cards)
    # zero-padded names: causal-hub sorts its variables by name
    names = [f"X{i:04d}" for i in range(N)]
    frames = _jump_evidence(paths, N, cards, names)
    copies = int(np.prod(np.asarray(cards, float)))  # 1 / the weight of every path
    if len(frames) * copies > MAX_EVIDENCE_PATHS:
        size = f"2^{N}" if set(cards) == {2} else f"{copies:.3g}"
        raise RuntimeError(
            f"causal-hub 0.0.4 cannot be given these data: its structural EM weighs every "
            f"evidence path by 1/{size} (uniform initial distribution over {N} nodes), which "
            f"would take {len(frames)} jumps x {size} copies > {MAX_EVIDENCE_PATHS} paths"
        )
    evidence = CatTrjsEv.from_pandas(
        frames * copies, with_states={m: [str(v) for v in range(c)] for m, c in zip(names, cards)}
    )
    knowledge = PK(names, [], [], [])
    # CTPC: no max_parents (it would cut the complete initial graph at random)
    kwargs = {"max_parents": K} if algorithm == "cthc" else {}
    t0 = time.perf_counter()
    out = sem(evidence, knowledge, algorithm, max_iter=1, seed=0, **kwargs)
    elapsed = time.perf_counter() - t0
    imputed = out["expectations"][-1]["expectations"][-1].values()
    weights = np.array([p.weight() for p in imputed])
    exact = all(len(p.times()) == 2 for p in imputed)
    graph = out["last_model"].graph()
    parents = [sorted(names.index(p) for p in graph.parents(name)) for name in names]
    return {
        "parents": parents,
        "learn_s": elapsed,
        "evidence_paths": len(frames) * copies,
        "weight_times_copies": [float(weights.min() * copies), float(weights.max() * copies)],
        "imputation_exact": bool(exact),
    }


def _pyagrum_rows(paths, names):
    """pyAgrum's rows for the trajectories end to end, as one trajectory; (rows, join jumps)."""
    R = len(paths)
    finals = [p[2][-1] if len(p[1]) else p[0] for p in paths]
    order, left = [0], set(range(1, R))
    while left:  # greedy: next, the trajectory that starts closest to where the last one ended
        last = finals[order[-1]]
        nxt = min(left, key=lambda r: (int(np.sum(paths[r][0] != last)), r))
        order.append(nxt)
        left.remove(nxt)
    N = len(names)
    current = paths[order[0]][0]
    rows = [(0.0, names[n], f"s{int(current[n])}") for n in range(N)]
    offset, joins = 0.0, 0
    for r in order:
        init, times, states, duration = paths[r]
        for n in np.nonzero(init != current)[0]:  # the join: simultaneous jumps
            rows.append((offset, names[n], f"s{int(current[n])}"))
            joins += 1
        previous = init
        for t, s in zip(times.tolist(), states):
            (n,) = np.nonzero(s != previous)[0]
            rows.append((offset + t, names[n], f"s{int(previous[n])}"))  # the state left
            previous = s
        current = previous
        offset += duration
    rows += [(offset, names[n], f"s{int(current[n])}") for n in range(N)]
    return rows, joins


def pyagrum_ctpc(paths, N: int) -> dict:
    import pyagrum
    import pyagrum.ctbn as ct

    names = [f"X{i}" for i in range(N)]
    rows, joins = _pyagrum_rows(paths, names)
    template = ct.CTBN()
    for name in names:
        template.add(pyagrum.LabelizedVariable(name, name, ["s0", "s1"]))
    t0 = time.perf_counter()
    learned = ct.Learner({0: rows}).learnCTBN(template)
    elapsed = time.perf_counter() - t0
    parents = [[] for _ in range(N)]
    for a, b in learned.arcs():
        parents[names.index(learned.name(b))].append(names.index(learned.name(a)))
    return {
        "parents": [sorted(p) for p in parents],
        "learn_s": elapsed,
        "jumps": int(sum(len(p[1]) for p in paths)),
        "join_jumps": joins,
    }


def self_check() -> dict:
    """Each peer on a network and data of its own: causal-hub's EATING CTBN (3 binary nodes, a
    cycle) sampled by causal-hub (1,000 paths of length 10; with 100, CTPC's F test panics on a
    parent configuration without transitions), through this driver's conversion;
    pyAgrum's CTPC on a random 4-node CTBN of its own generator (rates in [0.2, 5]) sampled by
    its own forward sampler into its own CSV, one trajectory of horizon 2,000 as in pyAgrum's
    examples (and, for comparison, the same length as 200 trajectories of horizon 10, which its
    tests cannot use: they find nothing)."""
    import tempfile

    out = {}
    from causal_hub import assets

    model = assets.load_eating()
    labels = model.labels()
    truth = model.graph()
    out["causal-hub truth"] = {v: sorted(truth.parents(v)) for v in labels}
    data = model.sample(1000, max_time=10.0, seed=1)
    paths = []
    for path in data.values():
        v, t = path.values().astype(np.int64), path.times()
        paths.append((v[0], t[1:], v[1:], 10.0))
    cards = [len(data.states()[label]) for label in labels]
    for algorithm in ("cthc", "ctpc"):
        try:
            found = causal_hub(paths, len(labels), algorithm, 2, cards)["parents"]
        except BaseException as err:  # a Rust panic is a BaseException
            out[f"causal-hub-{algorithm}"] = f"{type(err).__name__}: {err}"
            continue
        out[f"causal-hub-{algorithm}"] = {
            v: sorted(labels[p] for p in ps) for v, ps in zip(labels, found)
        }

    import random

    import pyagrum.ctbn as ct

    random.seed(0)  # pyAgrum's generator draws from `random`
    np.random.seed(0)
    ctbn = ct.randomCTBN((0.2, 5.0), 4, 2)
    out["pyagrum truth"] = sorted((ctbn.name(a), ctbn.name(b)) for a, b in ctbn.arcs())
    for key, n, horizon in (
        ("pyagrum-ctpc", 1, 2000.0),
        ("pyagrum-ctpc, 200 trajectories", 200, 10.0),
    ):
        with tempfile.NamedTemporaryFile(suffix=".csv") as f:
            ct.ForwardSamplingInference(ctbn).writeTrajectoryCSV(
                f.name, n=n, timeHorizon=horizon, burnIn=10
            )
            found = ct.Learner(f.name).learnCTBN(ctbn)
        out[key] = sorted((found.name(a), found.name(b)) for a, b in found.arcs())
    out["pass"] = {
        "causal-hub-cthc": out["causal-hub-cthc"] == out["causal-hub truth"],
        "causal-hub-ctpc": out["causal-hub-ctpc"] == out["causal-hub truth"],
        "pyagrum-ctpc": out["pyagrum-ctpc"] == out["pyagrum truth"],
    }
    return out


def main():
    # no argparse and nothing of benchmarks/_common (no jax in the peers' environment)
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return
    if sys.argv[1] == "self-check":
        print(json.dumps(self_check()))
        return
    peer, data, K = sys.argv[1], sys.argv[2], int(sys.argv[3])
    paths = _paths(data)
    N = len(paths[0][0])
    if peer == "causal-hub-cthc":
        result = causal_hub(paths, N, "cthc", K)
    elif peer == "causal-hub-ctpc":
        result = causal_hub(paths, N, "ctpc", K)
    elif peer == "pyagrum-ctpc":
        result = pyagrum_ctpc(paths, N)
    else:
        raise SystemExit(f"unknown peer {peer!r}")
    print(json.dumps({"peer": peer, **result}))


if __name__ == "__main__":
    main()
