"""R's msm as a side-by-side peer for panel (multi-state) data.

msm (Jackson 2011, CRAN) fits continuous-time Markov models to panel data by maximising the
likelihood conditional on each subject's first observation, with exact entry times into
absorbing states (`deathexact`). jaxctbn's `panel_log_likelihood` uses the same convention, so on
the same data and the same intensity matrix the two -2 log-likelihoods must agree. msm runs as an
external program (`Rscript benchmarks/msm/run_msm.R`); no msm code is used here.

Cases (one CTBN per case; msm sees the same data as a multi-state model):

- `cav`: msm's heart-transplant data (622 subjects, 2846 rows), 4 states, death (state 4) with
  exact entry time, the two-way illness-death intensity matrix of msm's documentation (8 allowed
  transitions, the rest structural zeros); a 1-node CTBN with one 4 x 4 CIM.
- `psor`: msm's psoriatic-arthritis data (305 subjects, 806 rows), 4 progressive states, no
  exact times, no covariates; a 1-node CTBN.
- `sim_cav`: a simulated single-variable panel from the cav-like generator (yearly visits, exact
  death times, more subjects).
- `ctbn2_cycle`, `ctbn2_chain`: two binary nodes A, B simulated with `sample_trajectories` and
  observed (both nodes) at fixed panel times; msm fits the 4 joint states with single-flip
  transitions only (double flips are structural zeros). With A <-> B every flip rate is its own
  parameter (8); with A -> B, A's rates do not depend on B, which is a `qconstraint` tie of
  (0,0)->(1,0) with (0,1)->(1,1) and of (1,0)->(0,0) with (1,1)->(0,1) (6 parameters).

For each case:

1. msm fits from the given initial intensities (optim BFGS on log-intensities, msm's default;
   `control = list(fnscale, reltol, maxit)` as listed; `hessian = FALSE`, no standard errors on
   either side); time inside R (`system.time` of `msm()`, the shortest of 3 identical fits) and
   the Rscript wall time (R start, package load, CSV read).
2. Likelihood cross-check: `jaxctbn.panel.panel_log_likelihood` (matrix exponential) at msm's fitted
   intensities, summed over subjects, times -2, against msm's `minus2loglik` (must agree to 0.01).
3. When `jaxctbn.panel.fit_rates` exists: SQUAREM (the default), EM and gradient fits from the same initial intensities; -2LL,
   |difference| to msm, converged flags, iterations, wall time of the first call (with
   compilation) and the shortest of 3 later calls (the speed ratio is msm's shortest over
   jaxctbn's shortest), and msm's -2LL evaluated at jaxctbn's estimate
   (`fixedpars = TRUE`) as an independent check of the optimum.

Run: `python benchmarks/panel/bench_msm.py [--quick]` (needs `Rscript` with the msm package: `apt-get
install r-cran-msm`). Writes `benchmarks/results/msm.{json,md}` (`msm_quick.*` with `--quick`).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

jax.config.update("jax_enable_x64", True)

import jaxctbn as jc  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import (  # noqa: E402
    MSM_DIR,
    argument_parser,
    environment,
    fmt,
    repeat_time,
    stopwatch,
    write_results,
)

DATA_DIR = os.path.join(MSM_DIR, "data")  # msm's data sets and the simulated panels (ignored)
TOL = 0.01  # required agreement of -2 log-likelihoods
REPEATS = 3  # timed fits after the first (compiling) call, and msm fits; the shortest counts
SOLVER = jc.MatrixExponential()

# msm's documented two-way illness-death initial intensities for cav (its `twoway4.q`)
CAV_Q0 = [
    [0.0, 0.25, 0.0, 0.25],
    [0.166, 0.0, 0.166, 0.166],
    [0.0, 0.25, 0.0, 0.25],
    [0.0, 0.0, 0.0, 0.0],
]
PSOR_Q0 = [[0, 0.1, 0, 0], [0, 0, 0.1, 0], [0, 0, 0, 0.1], [0, 0, 0, 0]]


# --------------------------------------------------------------------------- R side
def rscript(*args, timeout=3600):
    with stopwatch() as sw:
        p = subprocess.run(["Rscript", *args], capture_output=True, text=True, timeout=timeout)
    wall = sw.seconds
    if p.returncode != 0:
        raise RuntimeError(f"Rscript {' '.join(args)} failed:\n{p.stderr[-3000:]}")
    return wall


def run_msm(spec, workdir, tag):
    """Run `run_msm.R` on `spec` (a dict, see the R script); returns its JSON plus the wall
    time of the Rscript process."""
    spec_path = os.path.join(workdir, f"{tag}.spec.json")
    out_path = os.path.join(workdir, f"{tag}.out.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    wall = rscript(os.path.join(MSM_DIR, "run_msm.R"), spec_path, out_path)
    with open(out_path) as f:
        out = json.load(f)
    out["rscript_wall_s"] = wall
    return out


def export_msm_data():
    rscript(os.path.join(MSM_DIR, "export_data.R"), DATA_DIR)
    with open(os.path.join(DATA_DIR, "msm_version.txt")) as f:
        return f.read().strip()


# --------------------------------------------------------------------------- data
def panel_from_long(
    df, subject, time_col, state_col, *, deathexact=(), decode=None, bucketed=False
):
    """Group msm's long format into `PanelObservations`: one trajectory per subject (order of
    first appearance, rows sorted by time), states 1..k -> 0..k-1 (or `decode(state)` -> a row
    of node states), and `exact_entry` on rows in a `deathexact` state except a subject's first
    (msm ignores the obstype of the first observation). A subject with one observation
    contributes 0 here; msm drops it (none in these data sets). `bucketed`: grouped by length
    into `PanelBuckets` with rounded shapes, as the command line reads panels."""
    times, states, exact = [], [], []
    for sid, g in df.groupby(subject, sort=False):
        g = g.sort_values(time_col, kind="stable")
        s = g[state_col].to_numpy().astype(int)
        times.append(g[time_col].to_numpy(float))
        if decode is None:
            states.append((s - 1)[:, None])
        else:
            states.append(np.array([decode(v) for v in s], np.int32))
        e = np.isin(s, list(deathexact))
        e[0] = False
        if np.any(e[1:] & (s[1:] == s[:-1])):
            # an exact entry into the state the subject is already in has likelihood 0 (in msm
            # too): such rows are follow-up after absorption and must be dropped upstream
            raise ValueError(f"subject {sid}: repeated observation of a deathexact state")
        exact.append(e)
    if bucketed:
        buckets = jc.panel.PanelBuckets.from_sequences(times, states, exact_entry=exact)
        return buckets.with_rounded_shapes()
    return jc.panel.PanelObservations.from_sequences(times, states, exact_entry=exact)


def single_node(Q):
    Q = np.array(Q, float)
    np.fill_diagonal(Q, 0.0)
    np.fill_diagonal(Q, -Q.sum(1))
    return jc.CTBN(cims=[jnp.asarray(Q)[None]], parents=[[]], names=("state",))


def single_node_q(model):
    return np.asarray(model.cims[0][0])


class JointLayout:
    """The joint states of a CTBN as one multi-state variable for msm: msm state `1 + j`, `j`
    the index of the node states in `itertools.product` order; allowed transitions are single
    flips, each labelled by the CTBN parameter it is (node, parent configuration, from, to)."""

    def __init__(self, cards, parents):
        self.cards, self.parents = tuple(cards), tuple(tuple(p) for p in parents)
        self.states = list(itertools.product(*[range(k) for k in cards]))
        self.index = {s: j for j, s in enumerate(self.states)}
        S = len(self.states)
        self.allowed = []  # (j, j2, key) in msm's order: along the rows of the qmatrix
        for j, s in enumerate(self.states):
            for j2, s2 in enumerate(self.states):
                diff = [n for n in range(len(cards)) if s[n] != s2[n]]
                if len(diff) != 1:
                    continue
                n = diff[0]
                cfg = self._config(n, s)
                self.allowed.append((j, j2, (n, cfg, s[n], s2[n])))
        keys = list(dict.fromkeys(k for _, _, k in self.allowed))
        self.labels = [keys.index(k) + 1 for _, _, k in self.allowed]  # msm's qconstraint
        self.num_params = len(keys)
        self.S = S

    def _config(self, n, s):
        cfg = 0
        for p in self.parents[n]:
            cfg = cfg * self.cards[p] + s[p]
        return cfg

    def joint_q(self, model):
        cims = [np.asarray(c) for c in model.cims]
        Q = np.zeros((self.S, self.S))
        for j, j2, (n, cfg, a, b) in self.allowed:
            Q[j, j2] = cims[n][cfg, a, b]
        np.fill_diagonal(Q, -Q.sum(1))
        return Q

    def ctbn(self, Q, names):
        """The CTBN whose flip rates are the entries of the joint Q (tied entries must agree)."""
        cims = [
            np.zeros((int(np.prod([self.cards[p] for p in self.parents[n]])), k, k))
            for n, k in enumerate(self.cards)
        ]
        seen = {}
        for j, j2, key in self.allowed:
            n, cfg, a, b = key
            if key in seen and abs(seen[key] - Q[j, j2]) > 1e-9 * max(1.0, abs(Q[j, j2])):
                raise ValueError(f"tied intensities differ: {key} {seen[key]} {Q[j, j2]}")
            seen[key] = Q[j, j2]
            cims[n][cfg, a, b] = Q[j, j2]
        for c in cims:
            for cfg in range(c.shape[0]):
                np.fill_diagonal(c[cfg], 0.0)
                np.fill_diagonal(c[cfg], -c[cfg].sum(1))
        return jc.CTBN(cims=[jnp.asarray(c) for c in cims], parents=self.parents, names=names)


def states_at(traj, r, t):
    """Global state of sampled trajectory `r` at times `t` (right-continuous)."""
    n = int(traj.num_events[r])
    jt = np.asarray(traj.jump_times[r])[:n]
    idx = np.searchsorted(jt, t, side="right")
    st = np.concatenate([np.asarray(traj.initial_states[r])[None], np.asarray(traj.states[r])[:n]])
    return st[idx]


def simulate_single(Q, num_subjects, visits, death, seed):
    """A cav-like panel from the 1-node CTBN with generator Q: visits at `visits` until death,
    whose exact time is recorded (msm's `deathexact`). Long format, states 1..k."""
    model = single_node(Q)
    key = jax.random.key(seed)
    k0, k1 = jax.random.split(key)
    init = jnp.zeros((num_subjects, 1), jnp.int32)  # everybody starts healthy, like cav
    traj = jc.sample_trajectories(
        model, init, float(visits[-1]), key=k1, num_trajectories=num_subjects, max_events=128
    )
    assert not bool(jnp.any(traj.truncated))
    rows = []
    for r in range(num_subjects):
        n = int(traj.num_events[r])
        jt = np.asarray(traj.jump_times[r])[:n]
        js = np.asarray(traj.states[r])[:n, 0]
        t_death = jt[js == death][0] if np.any(js == death) else np.inf
        s = states_at(traj, r, visits)[:, 0]
        for t, v in zip(visits, s):
            if t >= t_death:
                break
            rows.append((r + 1, float(t), int(v) + 1))
        if np.isfinite(t_death):
            rows.append((r + 1, float(t_death), death + 1))
    return pd.DataFrame(rows, columns=["subject", "time", "state"])


def simulate_joint(model, layout, num_subjects, visits, seed):
    key = jax.random.key(seed)
    k0, k1 = jax.random.split(key)
    init = jax.random.randint(k0, (num_subjects, model.num_nodes), 0, 2).astype(jnp.int32)
    traj = jc.sample_trajectories(
        model, init, float(visits[-1]), key=k1, num_trajectories=num_subjects, max_events=256
    )
    assert not bool(jnp.any(traj.truncated))
    rows = []
    for r in range(num_subjects):
        for t, s in zip(visits, states_at(traj, r, visits)):
            rows.append((r + 1, float(t), layout.index[tuple(int(x) for x in s)] + 1))
    return pd.DataFrame(rows, columns=["subject", "time", "state"])


# --------------------------------------------------------------------------- jaxctbn side
def minus2ll(model, obs):
    return -2.0 * float(jnp.sum(jc.panel.panel_log_likelihood(model, obs, solver=SOLVER)))


def jax_fit(start, obs, method_name):
    method = {
        "squarem": jc.panel.SquaremFit(tolerance=1e-8, max_iterations=500),  # the default
        "em": jc.panel.EMFit(tolerance=1e-8, max_iterations=1000),
        "gradient": jc.panel.GradientFit(tolerance=1e-8, max_iterations=500),
    }[method_name]

    def call():
        return jc.panel.fit_rates(start, obs, method=method, solver=SOLVER)

    # the first call (with compilation), then REPEATS more; each blocked until ready
    fit, calls = repeat_time(call, repeats=1 + REPEATS)
    return fit, calls.times[0], calls.times[1:]


# --------------------------------------------------------------------------- cases
def make_cases(quick, workdir):
    cases = []
    control_cav = {"fnscale": 4000, "reltol": 1e-12, "maxit": 10000}
    cav = pd.read_csv(os.path.join(DATA_DIR, "cav.csv"))
    if quick:
        keep = cav.PTNUM.unique()[:150]
        cav = cav[cav.PTNUM.isin(keep)]
    cav_csv = os.path.join(workdir, "cav.csv")
    cav.to_csv(cav_csv, index=False)
    cases.append(
        dict(
            name="cav",
            description="msm cav: 4 states, two-way illness-death, death exact",
            df=cav,
            csv=cav_csv,
            cols=("PTNUM", "years", "state"),
            q0=CAV_Q0,
            deathexact=[4],
            control=control_cav,
        )
    )
    psor = pd.read_csv(os.path.join(DATA_DIR, "psor.csv"))
    if quick:
        keep = psor.ptnum.unique()[:60]
        psor = psor[psor.ptnum.isin(keep)]
    psor_csv = os.path.join(workdir, "psor.csv")
    psor.to_csv(psor_csv, index=False)
    cases.append(
        dict(
            name="psor",
            description="msm psor: 4 progressive states, panel only, no covariates",
            df=psor,
            csv=psor_csv,
            cols=("ptnum", "months", "state"),
            q0=PSOR_Q0,
            deathexact=None,
            control={"fnscale": 1000, "reltol": 1e-12, "maxit": 10000},
        )
    )
    # a cav-like generator (rates per year) for a larger simulated single-variable panel
    q_true = [[0, 0.13, 0, 0.04], [0.22, 0, 0.34, 0.04], [0, 0.13, 0, 0.31], [0, 0, 0, 0]]
    n_sim = 200 if quick else 3000
    sim = simulate_single(q_true, n_sim, np.arange(0.0, 16.0), death=3, seed=1)
    sim_csv = os.path.join(workdir, "sim_cav.csv")
    sim.to_csv(sim_csv, index=False)
    cases.append(
        dict(
            name="sim_cav",
            description=f"simulated cav-like panel, {n_sim} subjects, yearly visits, death exact",
            df=sim,
            csv=sim_csv,
            cols=("subject", "time", "state"),
            q0=CAV_Q0,
            deathexact=[4],
            control={"fnscale": 10000, "reltol": 1e-12, "maxit": 10000},
            q_true=q_true,
        )
    )
    # two binary nodes
    n2 = 100 if quick else 1000
    visits = np.arange(0.0, 11.0)
    for name, parents, cims in [
        (
            "ctbn2_cycle",
            [[1], [0]],
            [
                [[[-0.3, 0.3], [0.6, -0.6]], [[-1.2, 1.2], [0.2, -0.2]]],  # A | B
                [[[-0.5, 0.5], [0.4, -0.4]], [[-0.1, 0.1], [1.5, -1.5]]],  # B | A
            ],
        ),
        (
            "ctbn2_chain",
            [[], [0]],
            [
                [[[-0.4, 0.4], [0.7, -0.7]]],  # A
                [[[-0.5, 0.5], [0.4, -0.4]], [[-0.1, 0.1], [1.5, -1.5]]],  # B | A
            ],
        ),
    ]:
        true = jc.CTBN(cims=[jnp.asarray(c) for c in cims], parents=parents, names=("A", "B"))
        layout = JointLayout((2, 2), parents)
        df = simulate_joint(true, layout, n2, visits, seed=2 + len(cases))
        csv = os.path.join(workdir, f"{name}.csv")
        df.to_csv(csv, index=False)
        start = jc.CTBN(
            cims=[
                jnp.asarray(np.tile(np.array([[-0.3, 0.3], [0.3, -0.3]]), (len(c), 1, 1)))
                for c in cims
            ],
            parents=parents,
            names=("A", "B"),
        )
        graph = "A <-> B" if parents[0] else "A -> B"
        cases.append(
            dict(
                name=name,
                description=(
                    f"2 binary nodes, {graph}, {n2} subjects x {len(visits)} visits; msm: 4 joint "
                    f"states, single flips, {layout.num_params} parameters"
                ),
                df=df,
                csv=csv,
                cols=("subject", "time", "state"),
                q0=layout.joint_q(start).tolist(),
                deathexact=None,
                qconstraint=None if layout.num_params == len(layout.labels) else layout.labels,
                control={"fnscale": 10000, "reltol": 1e-12, "maxit": 10000},
                layout=layout,
                start=start,
                true=true,
            )
        )
    return cases


def case_models(case):
    """(observations, start model, Q -> CTBN) of a case for jaxctbn."""
    subject, tcol, scol = case["cols"]
    layout = case.get("layout")
    if layout is None:
        obs = panel_from_long(case["df"], subject, tcol, scol, deathexact=case["deathexact"] or ())
        return obs, single_node(case["q0"]), single_node, single_node_q
    obs = panel_from_long(case["df"], subject, tcol, scol, decode=lambda v: layout.states[v - 1])
    return (
        obs,
        case["start"],
        lambda Q: layout.ctbn(np.asarray(Q), ("A", "B")),
        layout.joint_q,
    )


def run_case(case, workdir, have_fit):
    subject, tcol, scol = case["cols"]
    spec = dict(
        data=case["csv"],
        subject=subject,
        time=tcol,
        state=scol,
        qmatrix=case["q0"],
        deathexact=case["deathexact"],
        qconstraint=case.get("qconstraint"),
        control=case["control"],
        hessian=False,
        repeats=REPEATS,
    )
    print(f"[{case['name']}] msm fit ...", flush=True)
    msm = run_msm(spec, workdir, case["name"])
    obs, start, to_model, to_q = case_models(case)
    at_msm = to_model(msm["Q"])
    m2_jax_at_msm = minus2ll(at_msm, obs)
    out = dict(
        name=case["name"],
        description=case["description"],
        subjects=int(np.prod(obs.batch_shape)),
        rows=len(case["df"]),
        exact_entries=int(np.asarray(obs.exact_entry).sum()),
        msm_spec={k: v for k, v in spec.items() if k != "data"},
        msm=msm,
        jax_at_msm_minus2ll=m2_jax_at_msm,
        crosscheck_diff=abs(m2_jax_at_msm - msm["minus2loglik"]),
        crosscheck_ok=abs(m2_jax_at_msm - msm["minus2loglik"]) <= TOL,
        fits={},
    )
    if "q_true" in case:
        out["q_true"] = case["q_true"]
    if "true" in case:
        out["q_true"] = case["layout"].joint_q(case["true"]).tolist()
    print(
        f"[{case['name']}] msm -2LL {msm['minus2loglik']:.6f}, jaxctbn at msm's Q "
        f"{m2_jax_at_msm:.6f} (diff {out['crosscheck_diff']:.2e})",
        flush=True,
    )
    if not have_fit:
        return out
    for method_name in ("squarem", "em", "gradient"):
        print(f"[{case['name']}] jaxctbn fit_rates ({method_name}) ...", flush=True)
        fit, first, later = jax_fit(start, obs, method_name)
        second, best = later[0], min(later)
        m2 = -2.0 * float(fit.log_likelihood)
        q = to_q(fit.model)
        check = run_msm(
            dict(spec, qmatrix=q.tolist(), fixedpars=True, repeats=1),
            workdir,
            f"{case['name']}_{method_name}",
        )
        out["fits"][method_name] = dict(
            minus2ll=m2,
            minus2ll_reevaluated=minus2ll(fit.model, obs),
            diff_to_msm=m2 - msm["minus2loglik"],
            abs_diff_ok=(abs(m2 - msm["minus2loglik"]) <= TOL) if msm["converged"] else None,
            msm_minus2ll_at_jax=check["minus2loglik"],
            converged=bool(fit.converged),
            iterations=int(fit.iterations),
            time_first_s=first,
            time_second_s=second,
            time_best_s=best,
            time_later_s=later,
            speed_ratio_msm_over_jax=msm["time_fit_s"] / best,
            Q=q.tolist(),
        )
        f = out["fits"][method_name]
        print(
            f"[{case['name']}] {method_name}: -2LL {m2:.6f} (msm {msm['minus2loglik']:.6f}, "
            f"diff {f['diff_to_msm']:+.2e}), converged {f['converged']}, {f['iterations']} it, "
            f"{fmt(first)} first / {fmt(best)} best of {REPEATS} later; msm {fmt(msm['time_fit_s'])}",
            flush=True,
        )
    return out


def table(results, msm_version, have_fit, quick):
    lines = [
        f"# R msm {msm_version} vs jaxctbn on panel data (float64, cpu{', QUICK' if quick else ''})",
        "",
        "-2LL conditional on each subject's first observation (msm's convention); exact entry "
        "times (msm `deathexact`) contribute a density. msm: `msm()` with optim BFGS on "
        "log-intensities, `hessian = FALSE`, control as in the JSON; its time is `system.time` of "
        f"`msm()` inside R, the shortest of {REPEATS} identical fits (the Rscript wall time, with R "
        "start-up, package load and CSV read, in brackets). jaxctbn: `panel_log_likelihood` with "
        f"`MatrixExponential`; `fit_rates` timed as the shortest of {REPEATS} calls after the "
        "first (compiling) one; the speed ratio compares the two shortest times.",
        "",
        "## Likelihood cross-check: jaxctbn at msm's fitted intensities (tolerance 0.01)",
        "",
        "| case | subjects | rows | exact entries | msm -2LL | jaxctbn -2LL at msm's Q | "
        "abs diff | ok | msm converged | msm fn/grad evals | msm time |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r["msm"]
        counts = m["counts"] or {}
        lines.append(
            f"| {r['name']} | {r['subjects']} | {r['rows']} | {r['exact_entries']} | "
            f"{m['minus2loglik']:.4f} | {r['jax_at_msm_minus2ll']:.4f} | "
            f"{r['crosscheck_diff']:.1e} | {'yes' if r['crosscheck_ok'] else 'NO'} | "
            f"{m['converged']} | {counts.get('function')}/{counts.get('gradient')} | "
            f"{fmt(m['time_fit_s'])} ({fmt(m['rscript_wall_s'])}) |"
        )
    lines += ["", "Cases:", ""]
    lines += [f"- `{r['name']}`: {r['description']}." for r in results]
    lines += ["", "## Maximum-likelihood fits from the same initial intensities", ""]
    if not have_fit:
        lines.append(
            "`jaxctbn.panel.fit_rates` does not exist in this version of jaxctbn: the fit comparison "
            "was skipped (only the likelihood cross-check above ran)."
        )
        return lines
    lines += [
        "| case | method | -2LL | msm -2LL | jaxctbn - msm | msm -2LL at jaxctbn's Q | "
        "converged | iterations | first call (compile) | best later call | msm time | msm / jaxctbn |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for name, f in r["fits"].items():
            lines.append(
                f"| {r['name']} | {name} | {f['minus2ll']:.4f} | {r['msm']['minus2loglik']:.4f} | "
                f"{f['diff_to_msm']:+.1e} | {f['msm_minus2ll_at_jax']:.4f} | {f['converged']} | "
                f"{f['iterations']} | {fmt(f['time_first_s'])} | {fmt(f['time_best_s'])} | "
                f"{fmt(r['msm']['time_fit_s'])} | {f['speed_ratio_msm_over_jax']:.2f}× |"
            )
    return lines


def main():
    ap = argument_parser(__doc__, quick="small subsets (a smoke test)")
    ap.add_argument("--name", default=None, help="results file stem (default msm / msm_quick)")
    ap.add_argument("--cases", default=None, help="comma-separated subset of the cases")
    args = ap.parse_args()
    if shutil.which("Rscript") is None:
        sys.exit("Rscript not found: install R and msm (apt-get install r-cran-msm).")
    have_fit = hasattr(jc.panel, "fit_rates")
    if not have_fit:
        print(
            "jaxctbn.panel.fit_rates does not exist yet: running the likelihood cross-check only."
        )
    msm_version = export_msm_data()
    workdir = tempfile.mkdtemp(prefix="bench_msm_")
    cases = make_cases(args.quick, workdir)
    if args.cases:
        wanted = args.cases.split(",")
        cases = [c for c in cases if c["name"] in wanted]
    results = [run_case(c, workdir, have_fit) for c in cases]
    shutil.rmtree(workdir, ignore_errors=True)
    payload = dict(
        environment=environment(),
        msm_version=msm_version,
        quick=args.quick,
        tolerance=TOL,
        fit_rates_available=have_fit,
        cases=results,
    )
    name = args.name or ("msm_quick" if args.quick else "msm")
    write_results(name, payload, table(results, msm_version, have_fit, args.quick))
    if not all(r["crosscheck_ok"] for r in results):
        sys.exit("likelihood cross-check FAILED (see the table)")


if __name__ == "__main__":
    main()
