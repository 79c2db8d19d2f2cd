"""Learning a drug's strength: coverage of the intervals over repetitions, from complete paths
(the exact posterior, `learn_strength`) and from the same paths seen at panel visits (profile
likelihood, `learn_strength_from_panels`), side by side in one run.

A -> B (the two-node network of the tests), the drug scales B's rates by s = 3; per
repetition 40 trajectories without the drug and 40 with it over [0, 4], and the panel sees
them at 33 (or 17) equally spaced visits. Reported per route: the coverage of the 95% interval
of the true s (with its binomial 95% interval), the mean and spread of ln(estimate / s), the
median interval width in ln s, how often an end stayed open, and the time per data set.

    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/learning/bench_strength_learning.py [--reps 100]

Writes `results/strength_learning.json` and `.md`.
"""

from __future__ import annotations

import json
import os
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import scipy.stats

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import RESULTS, argument_parser, stopwatch

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc  # noqa: E402

TRUE_STRENGTH = 3.0
NUM_EACH = 40
HORIZON = 4.0
CIMS = (
    [[[-1.0, 1.0], [2.0, -2.0]]],
    [[[-1.0, 1.0], [2.0, -2.0]], [[-3.0, 3.0], [1.0, -1.0]]],
)


def truth():
    return jc.CTBN(cims=[jnp.asarray(c) for c in CIMS], parents=((), (0,)), names=("A", "B"))


def simulate(model, key):
    init = jnp.zeros(2, jnp.int32)
    iv = jc.Intervention.none(2).with_rate_scales([1.0, TRUE_STRENGTH])
    k0, k1 = jr.split(key)
    plain = jc.sample_trajectories(model, init, HORIZON, key=k0, num_trajectories=NUM_EACH)
    under = jc.sample_trajectories(
        model, init, HORIZON, key=k1, num_trajectories=NUM_EACH, intervention=iv
    )
    return plain, under


def path_route(model, keys):
    """The exact posterior from complete paths (flat rate prior: alpha = 1, beta = 0)."""

    def one(key):
        plain, under = simulate(model, key)
        stats = [
            jc.SufficientStatistics.from_trajectories(t, (2, 2), model.parents).nodes[1].sum()
            for t in (plain, under)
        ]
        post = jc.learn_strength(
            stats[0].transitions, stats[0].dwell_times, stats[1].transitions,
            stats[1].dwell_times, alpha=1.0, beta=0.0,
        )  # fmt: skip
        return post.median(), post.interval(0.95), jnp.zeros((2,), bool)

    return eqx.filter_jit(lambda ks: jax.lax.map(one, ks))(keys)


def panel_route(model, keys, num_visits):
    """Profile likelihood from the same paths seen at `num_visits` visits (maximum
    likelihood)."""
    visits = jnp.linspace(0.0, HORIZON, num_visits)
    scaled = jnp.concatenate([jnp.zeros(NUM_EACH, bool), jnp.ones(NUM_EACH, bool)])

    def one(key):
        plain, under = simulate(model, key)
        seen = [jc.panel.PanelObservations.from_paths(p, visits) for p in (plain, under)]
        obs = jc.panel.PanelObservations(
            jnp.concatenate([s.times for s in seen]), jnp.concatenate([s.states for s in seen])
        )
        prof = jc.panel.learn_strength_from_panels(model, obs, node=1, scaled=scaled)
        return prof.estimate, prof.interval, jnp.stack([prof.open_below, prof.open_above])

    return eqx.filter_jit(lambda ks: jax.lax.map(one, ks))(keys)


def summary(estimates, intervals, open_ends, seconds):
    estimates, intervals, open_ends = (np.asarray(a) for a in (estimates, intervals, open_ends))
    covered = (intervals[:, 0] <= TRUE_STRENGTH) & (TRUE_STRENGTH <= intervals[:, 1])
    n, k = len(covered), int(covered.sum())
    lo, hi = scipy.stats.beta.ppf([0.025, 0.975], [k, k + 1], [n - k + 1, n - k])
    errors = np.log(estimates / TRUE_STRENGTH)
    return {
        "repetitions": n,
        "coverage": k / n,
        "coverage_interval": [float(0.0 if k == 0 else lo), float(1.0 if k == n else hi)],
        "mean_log_error": float(errors.mean()),
        "sd_log_error": float(errors.std(ddof=1)),
        "median_log_width": float(np.median(np.log(intervals[:, 1] / intervals[:, 0]))),
        "open_fraction": float(open_ends.any(-1).mean()),
        "seconds_per_data_set": seconds / n,
    }


def main():
    parser = argument_parser(__doc__)
    parser.add_argument("--reps", type=int, default=100)
    args = parser.parse_args()
    model = truth()
    keys = jr.split(jr.key(2026), args.reps)
    routes = {
        "complete paths (exact posterior)": lambda: path_route(model, keys),
        "panel, 33 visits (profile likelihood)": lambda: panel_route(model, keys, 33),
        "panel, 17 visits (profile likelihood)": lambda: panel_route(model, keys, 17),
    }
    out = {}
    for name, run in routes.items():
        with stopwatch() as sw:
            result = jax.block_until_ready(run())
        out[name] = summary(*result, sw.seconds)
        print(name, out[name], flush=True)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "strength_learning.json"), "w") as f:
        json.dump(out, f, indent=1)
    lines = [
        f"# Learning a drug's strength: coverage over {args.reps} repetitions",
        "",
        "Command: `OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/learning/bench_strength_learning.py"
        f" --reps {args.reps}`. A -> B, B's rates scaled by s = 3 in 40 of 80 trajectories over"
        " [0, 4]; the same simulated paths for every route. Time per data set includes"
        " compilation.",
        "",
        "| route | coverage of 95% interval | binomial 95% | mean ln(est/s) | sd | median"
        " width (ln s) | open end | s per data set |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in out.items():
        lo, hi = r["coverage_interval"]
        lines.append(
            f"| {name} | {r['coverage']:.3f} | {lo:.3f}-{hi:.3f} | {r['mean_log_error']:+.3f} | "
            f"{r['sd_log_error']:.3f} | {r['median_log_width']:.3f} | "
            f"{r['open_fraction']:.2f} | {r['seconds_per_data_set']:.2f} |"
        )
    lines.append("")
    with open(os.path.join(RESULTS, "strength_learning.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
