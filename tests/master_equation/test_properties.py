"""Property tests of the exact solver (issue 10): random cCTBNs with 1-5 nodes, mixed
cardinalities, random graphs (cycles allowed), rates log-uniform over up to four decades,
horizons from 1e-2 to 1e3, float32 and float64, no / perfect / imperfect interventions, against
an extended-precision dense reference.

Graphs are data (`PaddedCTBN`) and every intervention has the same pytree structure, so the
examples share one compilation per (cardinalities, dtype): few compilations, a fast suite. Each
network is drawn in one precision (`CASES`): four compilations rather than eight."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from helpers import brute_force_generator, one_hot_state
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_solver_precision import reference_moments

import jaxctbn as jc

#: (cardinalities, dtype): S = 3, 6, 24, 32 global states; each precision with a small and a
#: large state space, float32 with the largest (the hardest for its tolerance)
CASES = [
    ((3,), np.float64),
    ((3, 2), np.float32),
    ((2, 2, 3, 2), np.float64),
    ((2, 2, 2, 2, 2), np.float32),
]
# the accuracy the solver documents: absolute on p_tau, relative to tau on the dwell times
TOLERANCE = {np.float32: 1e-5, np.float64: 1e-10}


def _max_parents(cards):
    return min(2, len(cards) - 1)


@functools.cache
def _solve(cards, dtype):
    """One compiled solve per (cardinalities, dtype); graph, rates, horizon and intervention
    are arguments."""

    @jax.jit
    def run(model, init, tau, intervention):
        st = jc.expected_statistics(model, init, tau, intervention=intervention)
        return st.final_marginal, st.dwell_times

    return run


def _draw_problem(cards, dtype, kind, seed, log_tau, log_ratio, log_lam_tau):
    rng = np.random.default_rng(seed)
    N = len(cards)
    tau = 10.0**log_tau
    # rates log-uniform in [rmax / ratio, rmax], rmax set so that lambda * tau (largest exit
    # rate times horizon) is about 10**log_lam_tau
    rmax = 10.0**log_lam_tau / tau / sum(k - 1 for k in cards)
    rmin = rmax / 10.0**log_ratio
    parents = []
    for n in range(N):
        others = [m for m in range(N) if m != n]
        count = rng.integers(0, _max_parents(cards) + 1)
        parents.append(tuple(sorted(rng.choice(others, size=count, replace=False).tolist())))
    cims = []
    for n, k in enumerate(cards):
        configs = int(np.prod([cards[p] for p in parents[n]]))
        rates = np.exp(rng.uniform(np.log(rmin), np.log(rmax), (configs, k, k))).astype(dtype)
        rates[:, np.arange(k), np.arange(k)] = 0
        rates[:, np.arange(k), np.arange(k)] = -rates.sum(-1)
        cims.append(rates)
    state = np.array([rng.integers(0, k) for k in cards])
    targets, clamp, scales = np.zeros(N, bool), np.zeros(N, int), np.ones(N, dtype)
    if kind == "perfect":
        targets[rng.integers(0, N)] = True
        clamp = np.array([rng.integers(0, k) for k in cards])
    elif kind == "imperfect":
        scales = (10.0 ** rng.uniform(-1, 1, N)).astype(dtype)
    # one pytree structure for every kind: perfect part (maybe empty) plus rate scales (maybe 1)
    intervention = jc.Intervention(
        targets=jnp.asarray(targets), states=jnp.asarray(clamp, jnp.int32)
    ).with_rate_scales([jnp.asarray(s) for s in scales])
    # the reference model, built independently of jaxctbn's intervention code: clamped nodes
    # have no rates and start in their clamped state; scales multiply the rates (in `dtype`,
    # as the solver does)
    ref_cims = [np.zeros_like(c) if targets[n] else c * scales[n] for n, c in enumerate(cims)]
    ref_state = np.where(targets, clamp, state)
    model = jc.CTBN(cims=[jnp.asarray(c) for c in cims], parents=parents)
    ref = jc.CTBN(cims=[jnp.asarray(c, jnp.float64) for c in ref_cims], parents=parents)
    padded = jc.PaddedCTBN.from_ctbn(model, max_parents=_max_parents(cards))
    return padded, state, tau, intervention, ref, ref_state


@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    case=st.sampled_from(range(len(CASES))),
    kind=st.sampled_from(["none", "perfect", "imperfect"]),
    seed=st.integers(0, 2**32 - 1),
    log_tau=st.floats(-2, 3),
    log_ratio=st.floats(0, 4),
    log_lam_tau=st.floats(-1, 5),
)
# the corners: long horizons, rate ratio 1e4, lambda * tau = 1e5, both precisions
@example(3, "imperfect", 1, 3.0, 4.0, 5.0)
@example(2, "perfect", 2, 3.0, 4.0, 5.0)
@example(1, "none", 3, -2.0, 4.0, 3.0)
def test_solver_properties(case, kind, seed, log_tau, log_ratio, log_lam_tau):
    cards, dtype = CASES[case]
    padded, state, tau, intervention, ref, ref_state = _draw_problem(
        cards, dtype, kind, seed, log_tau, log_ratio, log_lam_tau
    )
    p, dwell = _solve(cards, dtype)(
        padded, jnp.asarray(state), jnp.asarray(tau, dtype), intervention
    )
    assert p.dtype == dtype and dwell.dtype == dtype
    p, dwell = np.asarray(p, np.float64), np.asarray(dwell, np.float64)
    tol = TOLERANCE[dtype]
    assert np.all(np.isfinite(p)) and np.all(np.isfinite(dwell))
    # a distribution: non-negative up to rounding, total mass 1; dwell times sum to tau
    assert p.min() >= -tol and abs(p.sum() - 1) <= tol
    assert dwell.min() >= -tol * tau and abs(dwell.sum() - tau) <= tol * tau
    # against the dense extended-precision reference
    p_ref, dwell_ref = reference_moments(
        brute_force_generator(ref), one_hot_state(ref, ref_state), tau
    )
    assert np.abs(p - p_ref).max() <= tol
    assert np.abs(dwell - dwell_ref).max() <= tol * tau
