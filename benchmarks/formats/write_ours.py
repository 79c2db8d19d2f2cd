"""jaxctbn's side of the reverse check of `make_fixtures.py`: `python write_ours.py OUT` (in
jaxctbn's environment) samples a small labelled CTBN, writes it and its trajectories in each
peer's format with jaxctbn's writers, and writes `expected.json`: what each peer's own reader
should make of the files, computed here straight from the model and the trajectories (not from
the written files). Then `make_fixtures.py check OUT` (and `check-pyctbn`) reads the files with
the peers' code and prints the comparison."""

from __future__ import annotations

import itertools
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxctbn as jc
from jaxctbn._paths.path_arrays import paths_of

jax.config.update("jax_enable_x64", True)

LABELS = {"A": ["lo", "hi"], "B": ["x", "y", "z"], "C": ["no", "yes"]}


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    cims = [rng.uniform(0.3, 2.0, (c, k, k)) for c, k in ((1, 2), (2, 3), (6, 2))]
    # C's parents out of name order: causal-hub sorts them
    model = jc.CTBN(
        cims=cims, parents={"A": [], "B": ["A"], "C": ["B", "A"]}, names=("A", "B", "C")
    )
    trajectories = jc.sample_trajectories(
        model,
        jnp.array([0, 1, 0]),
        2.0,
        key=jax.random.PRNGKey(5),
        num_trajectories=3,
        max_events=64,
    )
    names, cards = list(model.names), model.cardinalities
    paths = paths_of(trajectories, 3, "ours")
    expected = {}

    # pyAgrum: statistics per node and labelled parent configuration
    trajectories.write_pyagrum_csv(os.path.join(out, "ours_pyagrum.csv"), LABELS)
    stats = {}
    for n, name in enumerate(names):
        entries: dict[str, float] = {}
        for init, times, states, duration in paths:
            state, t = init, 0.0
            for t_next, s in [*zip(times.tolist(), states), (duration, None)]:
                ctx = ",".join(
                    f"{names[p]}={LABELS[names[p]][state[p]]}"
                    for p in sorted(model.parents[n], key=lambda p: names[p])
                )
                a = LABELS[name][state[n]]
                entries[f"T:{ctx}|{a}"] = entries.get(f"T:{ctx}|{a}", 0.0) + (t_next - t)
                if s is not None and s[n] != state[n]:
                    key = f"M:{ctx}|{a}->{LABELS[name][s[n]]}"
                    entries[key] = entries.get(key, 0.0) + 1.0
                    state = s
                elif s is not None:
                    state = s
                t = t_next
        stats[name] = entries
    expected["pyagrum"] = {
        "file": "ours_pyagrum.csv",
        "labels": LABELS,
        "parents": {name: [names[p] for p in model.parents[n]] for n, name in enumerate(names)},
        "statistics": stats,
    }

    # causal-hub: the network (its sorted form, from the model's rates), the frames
    model.to_causal_hub_json(os.path.join(out, "ours_causal_hub.json"), labels=LABELS)
    ch = {}
    for n, name in enumerate(names):
        parents = sorted(model.parents[n], key=lambda p: names[p])
        own = sorted(range(cards[n]), key=lambda s: LABELS[name][s])
        table = np.asarray(model.cims[n])
        params = []
        for config in itertools.product(
            *(sorted(range(cards[p]), key=lambda s: LABELS[names[p]][s]) for p in parents)
        ):
            state = dict(zip(parents, config))
            c = 0
            for p in model.parents[n]:  # the model's own configuration order
                c = c * cards[p] + state[p]
            params.append([[float(table[c, a, b]) for b in own] for a in own])
        ch[name] = {
            "states": {name: sorted(LABELS[name])},
            "conditioning_states": {names[p]: sorted(LABELS[names[p]]) for p in parents},
            "parameters": params,
        }
    expected["causal-hub network"] = {"file": "ours_causal_hub.json", "cims": ch}
    files, views = [], []
    for i, frame in enumerate(trajectories.to_causal_hub(LABELS)):
        files.append(f"ours_causal_hub_{i}.csv")
        frame.to_csv(os.path.join(out, files[-1]), index=False)
    for init, times, states, duration in paths:
        rows = [init, *states] + (
            [] if len(times) and times[-1] >= duration else [states[-1] if len(times) else init]
        )
        code = {
            m: {s: sorted(LABELS[m]).index(LABELS[m][s]) for s in range(cards[j])}
            for j, m in enumerate(names)
        }
        order = sorted(range(3), key=lambda j: names[j])
        views.append(
            {
                "labels": sorted(names),
                "states": {m: sorted(LABELS[m]) for m in sorted(names)},
                "times": [0.0, *times.tolist(), duration],
                "values": [[code[names[j]][int(r[j])] for j in order] for r in rows],
            }
        )
    expected["causal-hub frames"] = {"files": files, "labels": LABELS, "trajectories": views}

    # PyCTBN: its importer's rows and CIMs
    trajectories.write_pyctbn_json(os.path.join(out, "ours_pyctbn.json"), model)
    stays, rows = [], []
    for init, times, states, duration in paths:
        t = [0.0, *times.tolist(), duration]
        s = [init.tolist(), *states.tolist()]
        for i in range(len(s)):
            stays.append(t[i + 1] - t[i])
            rows.append(s[i] + (s[i + 1] if i + 1 < len(s) else [-1] * 3))
    pc = {}
    for n, name in enumerate(names):
        ps = [names[p] for p in model.parents[n]]
        keys = [
            ",".join(f"{p}={v}" for p, v in zip(ps, config)) if ps else name
            for config in itertools.product(*(range(cards[names.index(p)]) for p in ps))
        ]
        pc[name] = {"configurations": keys, "matrices": np.asarray(model.cims[n]).tolist()}
    edges = [[names[p], name] for n, name in enumerate(names) for p in model.parents[n]]
    expected["pyctbn"] = {
        "file": "ours_pyctbn.json",
        "edges": edges,
        "sorter": names,
        "stays": stays,
        "rows": rows,
        "cims": pc,
    }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print(json.dumps({"written": sorted(os.listdir(out))}))


if __name__ == "__main__":
    main(sys.argv[1])
