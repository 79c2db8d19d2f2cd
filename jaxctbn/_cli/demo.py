"""`jaxctbn demo`: the paper's 4-node fast/slow network, sampled and solved exactly.

A quick check of sampling against the master equation; the main job is `jaxctbn run`.
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from .._files import write_atomically, write_json
from .._master_equation import expected_statistics, marginals
from .._model.interventions import Intervention
from .._model.random_networks import paper_network
from .._paths.csv import write_trajectories_csv
from .._paths.sampling import sample_trajectories
from .._paths.sufficient_statistics import SufficientStatistics


def run_demo(out_dir: str = "demo_output", seed: int = 0, trajectories: int = 2000) -> dict:
    """Sample `trajectories` paths (>= 2: the z-scores need a standard error) per intervention
    of the network drawn from `seed`, compare with the master equation, write to `out_dir`."""
    if int(trajectories) != trajectories or trajectories < 2:
        raise ValueError(f"trajectories: must be an integer >= 2, got {trajectories!r}.")
    jax.config.update("jax_enable_x64", True)
    os.makedirs(out_dir, exist_ok=True)
    key_model, key_paths = jax.random.split(jax.random.key(seed))
    model = paper_network(key_model)
    model.to_json(os.path.join(out_dir, "network.json"))
    duration = 3.0
    initial = jnp.zeros(model.num_nodes, jnp.int32)
    report = {"seed": seed, "duration": duration, "trajectories": trajectories, "designs": {}}
    lines = [
        f"# jaxctbn demo: 4-node fast/slow network (seed {seed}), tau = {duration}, "
        f"{trajectories} Gillespie paths per intervention",
        "",
        "| intervention | node | E[T(x=0)] exact | MC | E[T(x=1)] exact | MC | "
        "E[M] exact | MC | max abs z |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    interventions = {"none": {}, "do(X1=1)": {"X1": 1}}
    t0 = time.perf_counter()
    for label, assignment in interventions.items():
        iv = Intervention.perfect(model, assignment)
        exact = expected_statistics(model, initial, duration, intervention=iv)
        paths = sample_trajectories(
            model,
            initial,
            duration,
            key=key_paths,
            num_trajectories=trajectories,
            intervention=iv,
            max_events=512,
        )
        if label == "none":
            write_trajectories_csv(paths, model, os.path.join(out_dir, "trajectories.csv"))
        stats = SufficientStatistics.from_trajectories(paths, model.cardinalities, model.parents)
        for n, name in enumerate(model.names):
            # marginalise over parent configurations for a compact table
            T_mc = np.asarray(stats.nodes[n].dwell_times.sum(1))  # (R, k)
            M_mc = np.asarray(stats.nodes[n].transitions.sum((1, 2, 3)))  # (R,)
            T_ex = np.asarray(exact.node_dwell_times(n).sum(0))
            M_ex = float(exact.node_transitions(n).sum())
            se_T = T_mc.std(0, ddof=1) / np.sqrt(trajectories) + 1e-12
            se_M = M_mc.std(ddof=1) / np.sqrt(trajectories) + 1e-12
            z = max(np.max(np.abs(T_mc.mean(0) - T_ex) / se_T), abs(M_mc.mean() - M_ex) / se_M)
            lines.append(
                f"| {label} | {name} | {T_ex[0]:.4f} | {T_mc.mean(0)[0]:.4f} | {T_ex[1]:.4f} | "
                f"{T_mc.mean(0)[1]:.4f} | {M_ex:.4f} | {M_mc.mean():.4f} | {z:.2f} |"
            )
            report["designs"].setdefault(label, {})[name] = {
                "expected_dwell": T_ex.tolist(),
                "sampled_dwell": T_mc.mean(0).tolist(),
                "expected_transitions": M_ex,
                "sampled_transitions": float(M_mc.mean()),
                "max_abs_z": float(z),
            }
    report["seconds"] = time.perf_counter() - t0
    times = jnp.linspace(0.0, duration, 61)
    ps, _ = marginals(model, initial, times)
    ps = np.asarray(ps).reshape((len(times), *model.cardinalities))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        for n, name in enumerate(model.names):
            axes = tuple(a for a in range(1, model.num_nodes + 1) if a != n + 1)
            ax.plot(times, ps.sum(axes)[:, 1], label=f"P({name}=1)")
        ax.set_xlabel("t")
        ax.set_ylabel("marginal probability")
        ax.set_title("Master equation, no intervention, X(0) = 0")
        ax.legend()
        fig.tight_layout()
        write_atomically(
            os.path.join(out_dir, "marginals.png"), lambda f: fig.savefig(f, dpi=120, format="png")
        )
        plt.close(fig)
    except ImportError:  # pragma: no cover
        pass
    lines += [
        "",
        f"Files in `{out_dir}/`: network.json, trajectories.csv, marginals.png, demo.json",
    ]
    text = "\n".join(lines)
    print(text)
    write_atomically(os.path.join(out_dir, "demo.md"), lambda f: f.write((text + "\n").encode()))
    write_json(os.path.join(out_dir, "demo.json"), report)
    return report


def _cmd_demo(args):
    run_demo(out_dir=args.out, seed=args.seed, trajectories=args.trajectories)
