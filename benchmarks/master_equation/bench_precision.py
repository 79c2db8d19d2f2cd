"""Precision of the exact solver (`Uniformisation`) in float32 and float64, before and after
issue 10, against an extended-precision dense reference.

Three parts:

1. **Random sweep** (seeded numpy, like `tests/master_equation/test_properties.py` but larger): random cCTBNs
   with 1-5 nodes of cardinality 2-3 (S <= 48), random graphs, rates log-uniform over up to four
   decades, horizons 1e-2..1e3, lambda * tau up to 1e5, none / perfect / imperfect interventions.
   Max and median errors of p_tau (absolute: p sums to 1) and of the dwell times (relative to
   tau), per precision, for the new solver and the previous one (`legacy`).
2. **lambda * tau ladder** 1e2 ... 1e7: error and run time per precision for a 1-node model and
   two stiff few-node models (rates 1e-2 and 1e2), new and legacy, plus the dense
   `MatrixExponential` for comparison.
3. **Step size L** (`max_step_mean`): products, run time (10 binary nodes, S = 1024) and worst
   error (the stiff models) for L in 64 ... 4096, the measurement behind the default.

`legacy` is `jaxctbn/_solvers.py` at commit 8603385 (the last one before the stepped solver),
loaded from git into a temporary module. The reference, in numpy longdouble (64-bit mantissa): the
Taylor series of the block matrix exponential with scaling and squaring
(`tests/master_equation/test_solver_precision.py::reference_moments`, ~1e-12 at lambda * tau = 1e5, 6e-12 at
1e6), and from lambda * tau = 1e6, once the chain has mixed (exp(-gap * tau) < 1e-25), the
stationary distribution and the deviation matrix (`stationary_moments`, error independent of
tau).

Run: `python benchmarks/master_equation/bench_precision.py [--quick]`. Writes
`benchmarks/results/precision.{json,md}`.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc  # noqa: E402
from jaxctbn._master_equation.generator import amalgamate  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # benchmarks/
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "master_equation"))  # the reference
from _common import (  # noqa: E402
    argument_parser,
    environment,
    fmt,
    repeat_time,
    stopwatch,
    write_results,
)
from helpers import brute_force_generator, one_hot_state  # noqa: E402
from test_solver_precision import reference_moments  # noqa: E402

LEGACY_COMMIT = "8603385"
DTYPES = {"float32": np.float32, "float64": np.float64}


def load_legacy():
    """The previous `Uniformisation`, from git, as a module."""
    src = subprocess.run(
        ["git", "show", f"{LEGACY_COMMIT}:jaxctbn/_solvers.py"],
        cwd=HERE,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.replace(  # the flat module of then, at its place (and name) of now
        "from ._generator import AbstractGenerator, _shift_indices, batch_last",
        "from jaxctbn._master_equation.generator import AbstractGenerator, batch_last\n"
        "from jaxctbn._master_equation.generator import shift_indices as _shift_indices",
    )
    path = os.path.join(tempfile.mkdtemp(), "legacy_solvers.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("legacy_solvers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["legacy_solvers"] = module  # dataclasses look the module up while building
    spec.loader.exec_module(module)
    return module


def cast(model, dtype):
    return jc.CTBN(cims=[jnp.asarray(c, dtype) for c in model.cims], parents=model.parents)


def _solve_ld(A, B):
    """A X = B by Gauss-Jordan elimination with partial pivoting in longdouble."""
    n = A.shape[0]
    M = np.concatenate([np.asarray(A, np.longdouble), np.asarray(B, np.longdouble)], axis=1)
    for i in range(n):
        piv = i + int(np.argmax(np.abs(M[i:, i])))
        M[[i, piv]] = M[[piv, i]]
        M[i] /= M[i, i]
        for r in range(n):
            if r != i:
                M[r] -= M[r, i] * M[i]
    return M[:, n:]


def stationary_moments(W, p0, tau):
    """`(p_tau, int p)` once the chain has mixed (exp(-gap tau) < 1e-25): p_tau = pi and
    int_0^tau p_t dt = tau pi + p0 D, D = (Pi - W)^-1 - Pi the deviation matrix, Pi = 1 pi;
    in longdouble. Errors of order eps_ld * condition, not growing with tau (the squaring
    reference loses about 2^squarings * eps_ld: 6e-12 at lambda tau = 1e6, 6e-11 at 1e7)."""
    S = W.shape[0]
    W = np.asarray(W, np.longdouble)
    A = W.T.copy()
    A[-1, :] = 1  # pi W = 0 and sum(pi) = 1
    b = np.zeros((S, 1), np.longdouble)
    b[-1] = 1
    pi = _solve_ld(A, b)[:, 0]
    Pi = np.ones((S, 1), np.longdouble) * pi[None, :]
    D = _solve_ld(Pi - W, np.eye(S, dtype=np.longdouble)) - Pi
    p0 = np.asarray(p0, np.longdouble)
    return np.asarray(pi, np.float64), np.asarray(np.longdouble(tau) * pi + p0 @ D, np.float64)


def reference(W, p0, tau):
    """Taylor series and squaring, or for lambda tau >= 1e6 (where the squarings cost it 6e-12
    and more) the stationary form once the chain has mixed. (The stationary form's error grows
    with the condition of Pi - W instead: 1e-11 for short horizons with lambda tau ~ 1e4.)"""
    rates = np.sort(-np.real(np.linalg.eigvals(np.asarray(W, np.float64))))
    gap = rates[1] if len(rates) > 1 else np.inf
    irreducible = np.sum(rates < 1e-12 * max(rates[-1], 1e-300)) == 1
    lam_tau = float(np.max(-np.diag(np.asarray(W, np.float64)))) * tau
    if irreducible and gap * tau > 60 and lam_tau >= 1e6:
        return stationary_moments(W, p0, tau)
    return reference_moments(W, p0, tau)


def errors(p, dwell, W, p0, tau):
    """(max |p - p_ref|, max |dwell - dwell_ref| / tau); inf if not finite."""
    p, dwell = np.asarray(p, np.float64), np.asarray(dwell, np.float64)
    if not (np.all(np.isfinite(p)) and np.all(np.isfinite(dwell))):
        return float("inf"), float("inf")
    p_ref, d_ref = reference(W, p0, tau)
    return float(np.abs(p - p_ref).max()), float(np.abs(dwell - d_ref).max() / tau)


# ----------------------------------------------------------------------------- 1. sweep
def random_problem(rng):
    while True:
        N = int(rng.integers(1, 6))
        cards = tuple(int(k) for k in rng.integers(2, 4, N))
        if np.prod(cards) <= 48:
            break
    parents = []
    for n in range(N):
        others = [m for m in range(N) if m != n]
        count = int(rng.integers(0, min(2, N - 1) + 1))
        parents.append(tuple(sorted(rng.choice(others, size=count, replace=False).tolist())))
    tau = 10.0 ** rng.uniform(-2, 3)
    rmax = 10.0 ** rng.uniform(-1, 5) / tau / sum(k - 1 for k in cards)
    rmin = rmax / 10.0 ** rng.uniform(0, 4)
    kind = ["none", "perfect", "imperfect"][int(rng.integers(0, 3))]
    cims = []
    for n, k in enumerate(cards):
        configs = int(np.prod([cards[p] for p in parents[n]]))
        r = np.exp(rng.uniform(np.log(rmin), np.log(rmax), (configs, k, k)))
        r[:, np.arange(k), np.arange(k)] = 0
        r[:, np.arange(k), np.arange(k)] = -r.sum(-1)
        if kind == "imperfect":
            r = r * 10.0 ** rng.uniform(-1, 1)
        cims.append(r)
    state = [int(rng.integers(0, k)) for k in cards]
    if kind == "perfect":  # clamp one node: no rates, start in the clamped state
        n = int(rng.integers(0, N))
        cims[n] = np.zeros_like(cims[n])
        state[n] = int(rng.integers(0, cards[n]))
    return jc.CTBN(cims=[jnp.asarray(c) for c in cims], parents=parents), state, tau, kind


def sweep(solvers, count, seed=0):
    rng = np.random.default_rng(seed)
    problems = [random_problem(rng) for _ in range(count)]
    out = {}
    for dname, dtype in DTYPES.items():
        for sname, solver in solvers.items():
            ep, ei, bad = [], [], 0
            for model, state, tau, _ in problems:
                m = cast(model, dtype)
                W = brute_force_generator(cast(m, jnp.float64))
                try:
                    st = jc.expected_statistics(m, jnp.asarray(state), tau, solver=solver)
                    e = errors(st.final_marginal, st.dwell_times, W, one_hot_state(m, state), tau)
                except Exception:  # an error raised is not a silent wrong answer
                    bad += 1
                    continue
                ep.append(e[0])
                ei.append(e[1])
            out[(dname, sname)] = {
                "problems": count,
                "raised": bad,
                "p_max": float(np.max(ep)),
                "p_median": float(np.median(ep)),
                "dwell_max": float(np.max(ei)),
                "dwell_median": float(np.median(ei)),
                "non_finite": int(np.sum(~np.isfinite(ep))),
            }
            print(dname, sname, out[(dname, sname)], flush=True)
    return out


# ----------------------------------------------------------------------------- 2. ladder
def ladder_models():
    from helpers import random_model

    key = jax.random.key(1)
    return {
        "1 node (rate 600)": jc.CTBN(
            cims=[jnp.array([[[-600.0, 600.0], [600.0, -600.0]]])], parents=[[]]
        ),
        "3 nodes (2,3,2), stiff": random_model(key, (2, 3, 2), ((2,), (0,), (1, 0)), stiff=True),
        "4 binary nodes, stiff": random_model(
            key, (2, 2, 2, 2), ((), (0,), (1,), (2, 0)), stiff=True
        ),
    }


def timed(fn, *args):
    jax.block_until_ready(fn(*args))  # compile
    out, t = repeat_time(fn, *args)  # one timed call
    return out, t.min


def ladder(solvers, lam_taus, time_limit):
    rows = []
    for mname, model in ladder_models().items():
        init = jnp.zeros(model.num_nodes, int)
        for dname, dtype in DTYPES.items():
            m = cast(model, dtype)
            W = brute_force_generator(cast(m, jnp.float64))
            lam = float(np.max(-np.diag(W)))
            for sname, solver in solvers.items():
                fn = jax.jit(lambda m, t, solver=solver: _stats(m, init, t, solver))
                for lt in lam_taus:
                    tau = lt / lam
                    row = {"model": mname, "dtype": dname, "solver": sname, "lam_tau": lt}
                    try:
                        (p, d), t = timed(fn, m, jnp.asarray(tau, dtype))
                        row["time"] = t
                        row["p_err"], row["dwell_err"] = errors(
                            p, d, W, one_hot_state(m, [0] * m.num_nodes), tau
                        )
                    except Exception as e:  # noqa: BLE001
                        row["raised"] = error_message(e)
                    rows.append(row)
                    print(row, flush=True)
                    if row.get("time", 0) > time_limit or "raised" in row:
                        break  # larger lambda tau: impractical or refused
    return rows


def error_message(e):
    """The solver's own message out of a runtime error's text (first sentence)."""
    for line in str(e).splitlines():
        for key in ("Uniformisation", "MatrixExponential"):
            if key in line:
                return line[line.index(key) :].split(";")[0][:120]
    return str(e).splitlines()[0][:120]


def _stats(m, init, tau, solver):
    st = jc.expected_statistics(m, init, tau, solver=solver)
    return st.final_marginal, st.dwell_times


# ----------------------------------------------------------------------------- 3. step size
def step_size(Ls, quick):
    rows = []
    parents = jc.experiments.random_graph(jax.random.key(10), 10, max_parents=2)
    big = jc.random_ctbn(jax.random.key(1), parents)
    gen = amalgamate(big)
    lam = float(gen.max_exit_rate())
    lt = 1e3 if quick else 1e4
    p0 = jnp.zeros(gen.num_states).at[0].set(1.0)
    stiff = list(ladder_models().items())[1:]
    for L in Ls:
        solver = jc.Uniformisation(max_step_mean=L, max_terms=10**8)
        row = {"L": L, "products": int(solver.num_products(gen, lt / lam)), "lam_tau": lt}
        for dname, dtype in DTYPES.items():
            g = amalgamate(cast(big, dtype))
            _, t = timed(jax.jit(solver.solve), g, p0.astype(dtype), jnp.asarray(lt / lam, dtype))
            row[f"time_{dname}"] = t
            worst = 0.0
            for _, model in stiff:
                m = cast(model, dtype)
                W = brute_force_generator(cast(m, jnp.float64))
                lam_m = float(np.max(-np.diag(W)))
                init = jnp.zeros(m.num_nodes, int)
                fn = jax.jit(lambda m, t, solver=solver: _stats(m, init, t, solver))
                for lt_m in [1e3, 1e5]:
                    p, d = fn(m, jnp.asarray(lt_m / lam_m, dtype))
                    e = errors(p, d, W, one_hot_state(m, [0] * m.num_nodes), lt_m / lam_m)
                    worst = max(worst, *e)
            row[f"err_{dname}"] = worst
        rows.append(row)
        print(row, flush=True)
    return rows


def main():
    ap = argument_parser(__doc__, quick="fewer problems, shorter ladder", name="precision")
    args = ap.parse_args()
    legacy = load_legacy()
    solvers = {
        "new": jc.Uniformisation(),
        "legacy": legacy.Uniformisation(max_terms=10**7),
    }
    count = 40 if args.quick else 200
    lam_taus = [1e2, 1e4, 1e5] if args.quick else [1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8]
    total = stopwatch()
    swept = sweep(solvers, count)
    # the ladder lifts the cost limits to see how far each route goes; the new solver's
    # default limit (max_terms = 2e6 products) is shown once at the top of the ladder
    ladder_solvers = {
        "new": jc.Uniformisation(max_terms=2 * 10**8),
        "legacy": legacy.Uniformisation(max_terms=2 * 10**8),
        "expm": jc.MatrixExponential(),
    }
    laddered = ladder(ladder_solvers, lam_taus, time_limit=30.0)
    limit_model = ladder_models()["1 node (rate 600)"]
    try:
        jax.block_until_ready(_stats(limit_model, jnp.array([0]), 1e7 / 600, jc.Uniformisation()))
        default_limit = "no error"
    except Exception as e:  # noqa: BLE001
        default_limit = error_message(e)
    steps = step_size([64.0, 256.0, 1024.0, 4096.0], args.quick)
    elapsed = total.elapsed

    lines = [
        "# Precision of the exact solver (Uniformisation), float32 and float64",
        "",
        f"Machine: {environment()['device']}, {environment()['cpu_count']} cores; "
        f"jax {jax.__version__}. Benchmark time {elapsed:.0f} s.",
        "Reference, in numpy longdouble: the block matrix exponential by Taylor series and "
        "squaring (~1e-12 at λτ = 1e5, 6e-12 at 1e6: the squarings), and from λτ = 1e6, once "
        "the chain has mixed (e^(-gap τ) < 1e-25), the stationary distribution and deviation "
        "matrix (error independent of τ). Errors: p_τ "
        "absolute (p sums to 1), dwell times "
        "relative to τ. 'legacy' = the solver before issue 10 (commit "
        f"{LEGACY_COMMIT}: one Poisson series over [0, τ], log-space weights); "
        "'new' = steps of Poisson mean ≤ L = 1024, stable weights, difference form; "
        "'expm' = `MatrixExponential` (jax's Padé scaling and squaring, 32 squarings).",
        "",
        f"## 1. Random sweep ({count} problems: 1-5 nodes, k = 2-3, S ≤ 48, rate ratios to "
        "1e4, τ in 1e-2..1e3, λτ up to 1e5, none/perfect/imperfect interventions)",
        "",
        "| dtype | solver | p_τ max | p_τ median | dwell max | dwell median | non-finite | raised |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (dname, sname), r in swept.items():
        lines.append(
            f"| {dname} | {sname} | {r['p_max']:.1e} | {r['p_median']:.1e} | "
            f"{r['dwell_max']:.1e} | {r['dwell_median']:.1e} | {r['non_finite']} | "
            f"{r['raised']} |"
        )
    lines += [
        "",
        "## 2. λτ ladder (time: steady state, after compilation; stops after an error or a run "
        "over 30 s)",
        "",
        "Cost limits lifted here (`max_terms=2e8` for both uniformisations). With the default "
        f"`max_terms` (2e6 products), the new solver at λτ = 1e7 raises: *{default_limit}*.",
        "",
        "| model | dtype | solver | λτ | time | p_τ err | dwell err |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in laddered:
        if "raised" in r:
            lines.append(
                f"| {r['model']} | {r['dtype']} | {r['solver']} | {r['lam_tau']:.0e} | "
                f"raised: {r['raised']} | | |"
            )
        else:
            lines.append(
                f"| {r['model']} | {r['dtype']} | {r['solver']} | {r['lam_tau']:.0e} | "
                f"{fmt(r['time'])} | {r['p_err']:.1e} | {r['dwell_err']:.1e} |"
            )
    lines += [
        "",
        "## 3. Step size L = `max_step_mean` (time: 10 binary nodes, S = 1024; error: worst over "
        "the two stiff models at λτ = 1e3 and 1e5)",
        "",
        "| L | products | time float32 | time float64 | worst err float32 | worst err float64 |",
        "|---|---|---|---|---|---|",
    ]
    for r in steps:
        lines.append(
            f"| {r['L']:.0f} | {r['products']} (λτ = {r['lam_tau']:.0e}) | "
            f"{fmt(r['time_float32'])} | {fmt(r['time_float64'])} | {r['err_float32']:.1e} | "
            f"{r['err_float64']:.1e} |"
        )
    payload = {
        "environment": environment(),
        "default_limit_at_1e7": default_limit,
        "sweep": {f"{d}/{s}": r for (d, s), r in swept.items()},
        "ladder": laddered,
        "step_size": steps,
    }
    write_results(args.name, payload, lines)


if __name__ == "__main__":
    main()
