"""Panel observations (issue 12, exact inference): the scaled forward-backward filter against
independent routes: a dense scipy product of matrix exponentials with observation masks (the
log-likelihood), Van Loan block exponentials per interval (smoothed statistics), rejection
sampling of Gillespie paths (z-scores), the complete-path statistics of a densely observed path,
and finite differences (the gradient).

Compilation dominates, so each problem's library calls run in one compiled program (a fixture
shared by the tests of the three-node panel)."""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from helpers import brute_force_generator, random_model, state_at

import jaxctbn as jc
from jaxctbn._panel.inference import panel_marginals

CARDS = (2, 3, 2)
PARENTS = ((2,), (0,), (1, 0))
STATES = np.array(list(itertools.product(*(range(k) for k in CARDS))))
INDEX = {tuple(s): i for i, s in enumerate(STATES)}
SHIFTS = [(n, j) for n, k in enumerate(CARDS) for j in range(1, k)]
# global state reached from s by shift r
DESTINATION = np.array(
    [
        [INDEX[tuple(np.where(np.arange(3) == n, (s + j) % np.array(CARDS), s))] for s in STATES]
        for n, j in SHIFTS
    ]
)
MISSING = -1


def _model(key):
    return random_model(key, CARDS, PARENTS)


def _panel():
    """Five trajectories covering missing values, a perfect intervention, exact entry times (in
    the middle and last) and a single observation; padded to five observations."""
    X = MISSING
    times = [
        [0.0, 0.4, 0.9, 1.7, 2.2],
        [0.0, 0.5, 1.1, 1.6],
        [0.2, 0.7, 1.0, 1.4, 2.1],
        [0.0],
        [0.0, 0.3, 0.8],
    ]
    states = [
        [[0, 1, 1], [X, 2, X], [1, X, 0], [X, X, X], [0, 0, X]],
        [[1, 0, 0], [X, 2, 1], [1, X, X], [1, 1, 0]],  # do(X0 = 1)
        [[0, 0, 1], [X, 1, X], [X, X, 0], [X, 2, X], [1, X, X]],  # exact entry at 1.4
        [[1, 2, 0]],
        [[0, 0, 0], [X, X, X], [X, 2, 1]],  # exact entry (two nodes) at 0.8
    ]
    exact = [
        [False] * 5,
        [False] * 4,
        [False, False, False, True, False],
        [False],
        [False, False, True],
    ]
    targets = np.zeros((5, 3), bool)
    targets[1, 0] = True
    clamped = np.zeros((5, 3), np.int32)
    clamped[1, 0] = 1
    intervention = jc.Intervention(targets=jnp.asarray(targets), states=jnp.asarray(clamped))
    return times, states, exact, intervention


EMISSIONS = [
    None,
    np.array([[0.8, 0.15, 0.05], [0.1, 0.85, 0.05], [0.05, 0.15, 0.8]]),
    np.array([[0.9, 0.1], [0.25, 0.75]]),
]


# --------------------------------------------------------------------------- dense reference
def _evidence(y, matrices):
    e = np.ones(len(STATES))
    for n, m in enumerate(matrices):
        if y[n] >= 0:
            e = e * (m[STATES[:, n], y[n]] if m is not None else (STATES[:, n] == y[n]))
    return e


def _dense(model, intervention, times, states, exact, matrices=(None,) * 3, p0=None):
    """Scaled forward-backward with dense scipy matrix exponentials; statistics from Van Loan's
    block exponential per interval. Returns a dict."""
    if intervention is not None:
        model = intervention.apply(model)
    W = brute_force_generator(model)
    S = W.shape[0]
    targets = np.zeros(3, bool) if intervention is None else np.asarray(intervention.targets)
    clamp = np.zeros(3, int) if intervention is None else np.asarray(intervention.states)
    if p0 is None:
        prior = np.all((STATES == clamp) | ~targets, axis=1).astype(float)
        prior /= prior.sum()
    else:
        prior = np.asarray(p0, float).reshape(CARDS)
        for n in range(3):
            if targets[n]:
                summed = prior.sum(axis=n, keepdims=True)
                prior = np.zeros_like(prior)
                np.put_along_axis(prior, np.full(summed.shape, clamp[n]), summed, axis=n)
        prior = prior.reshape(-1)
    m = len(times)
    inside = [_evidence(y, (None,) * 3) for y in states]
    ev = [inside[i] if exact[i] else _evidence(states[i], matrices) for i in range(m)]
    jump = [W * (1 - o)[:, None] * o[None, :] for o in inside]
    a = prior * ev[0]
    norms = [a.sum()]
    alphas, predicted = [a / a.sum()], [prior]
    for i in range(1, m):
        pred = alphas[-1] @ scipy.linalg.expm(W * (times[i] - times[i - 1]))
        a = pred @ jump[i] if exact[i] else pred * ev[i]
        norms.append(a.sum())
        alphas.append(a / a.sum())
        predicted.append(pred)
    betas, ends = [np.ones(S)] * m, [np.ones(S)] * m
    for i in range(m - 1, 0, -1):
        end = (jump[i] @ betas[i] if exact[i] else ev[i] * betas[i]) / norms[i]
        ends[i - 1] = end
        betas[i - 1] = scipy.linalg.expm(W * (times[i] - times[i - 1])) @ end
    dwell, moves = np.zeros(S), np.zeros((S, S))
    for i in range(1, m):
        h = times[i] - times[i - 1]
        A = np.block([[W.T, np.outer(alphas[i - 1], ends[i - 1])], [np.zeros((S, S)), W.T]])
        C = scipy.linalg.expm(h * A)[:S, S:]
        Z = alphas[i - 1] @ scipy.linalg.expm(W * h) @ ends[i - 1]
        dwell += np.diag(C) / Z
        moves += (W - np.diag(np.diag(W))) * C / Z
        if exact[i]:
            jm = predicted[i][:, None] * jump[i] * betas[i][None, :]
            moves += jm / jm.sum()

    def marginal(t):
        j = max(k for k in range(m) if times[k] <= t)
        f = alphas[j] @ scipy.linalg.expm(W * (t - times[j]))
        b = scipy.linalg.expm(W * (times[j + 1] - t)) @ ends[j] if j < m - 1 else np.ones(S)
        return f * b / (f * b).sum()

    logs = np.log(norms)
    return dict(
        conditional=logs[1:].sum(),
        full=logs.sum(),
        dwell=dwell,
        moves=moves,
        marginal=marginal,
    )


def _as_dense(transitions):
    """(J, S) per-shift transitions -> (S, S)."""
    out = np.zeros((len(STATES), len(STATES)))
    for r in range(len(SHIFTS)):
        out[np.arange(len(STATES)), DESTINATION[r]] += np.asarray(transitions[r])
    return out


def _node_projection(moves, dwell, node, parents):
    """Dense (S, S) transitions and (S,) dwell projected onto a node and parent set."""
    k = CARDS[node]
    configs = int(np.prod([CARDS[p] for p in parents]))
    u = np.zeros(len(STATES), int)
    for p in parents:
        u = u * CARDS[p] + STATES[:, p]
    T = np.zeros((configs, k))
    M = np.zeros((configs, k, k))
    for s in range(len(STATES)):
        T[u[s], STATES[s, node]] += dwell[s]
        for t in range(len(STATES)):
            diff = STATES[s] != STATES[t]
            if diff.sum() == 1 and diff[node]:
                M[u[s], STATES[s, node], STATES[t, node]] += moves[s, t]
    return M, T


def _trajectory(r, times, states, exact, intervention):
    one = jax.tree_util.tree_map(lambda x: x[r], intervention)
    targets = np.asarray(one.targets)
    return (
        None if not targets.any() else one,
        np.asarray(times[r]),
        np.asarray(states[r]),
        np.asarray(exact[r]),
    )


# --------------------------------------------------------------------------- tests
FAMILIES = [(1, (0,)), (2, (1, 0)), (0, ())]  # node projections: the model's and other sets
GRID = np.array([0.2, 0.45, 0.8, 1.4, 1.5, 2.1, 2.6])


@eqx.filter_jit
def _panel_results(model, obs, emissions, p0, grid):
    """Everything the two tests below compare, in one compiled program: the conditional
    log-likelihood (error-free), and with emissions and an initial distribution the smoothed
    statistics, the marginals at `grid` and node projections of the pooled statistics."""
    conditional = jc.panel.panel_log_likelihood(model, obs)
    options = dict(emissions=emissions, initial_distribution=p0)
    stats = jc.panel.panel_expected_statistics(model, obs, **options)
    marg = panel_marginals(model, obs, grid, **options)
    pooled = stats.sum()
    per_family = [
        (pooled.node_transitions(n, u), pooled.node_dwell_times(n, u)) for n, u in FAMILIES
    ]
    on_sets = pooled.node_statistics_on_sets(2, jnp.array([[-1, -1], [0, -1], [1, 0]]))
    projections = per_family, on_sets, pooled.log_likelihood, stats.node_transitions(0, ())
    return conditional, stats, marg, projections


@pytest.fixture(scope="module")
def panel_case():
    model = _model(jax.random.key(0))
    times, states, exact, intervention = _panel()
    obs = jc.panel.PanelObservations.from_sequences(
        times, states, exact_entry=exact, intervention=intervention
    )
    p0 = np.random.default_rng(0).dirichlet(np.ones(len(STATES)))
    results = _panel_results(model, obs, jc.panel.Emissions(EMISSIONS), p0, GRID)
    return model, (times, states, exact, intervention), p0, results


def test_log_likelihood_matches_dense_expm_product(panel_case):
    # conditional on the first observation (msm's convention), error-free observations; the
    # version with an initial distribution and emission matrices is checked with the statistics
    model, (times, states, exact, intervention), _, (conditional, *_) = panel_case
    assert conditional.shape == (5,)
    worst = 0.0
    for r in range(5):
        ref = _dense(model, *_trajectory(r, times, states, exact, intervention))["conditional"]
        np.testing.assert_allclose(conditional[r], ref, rtol=1e-10, atol=1e-12)
        worst = max(worst, abs(float(conditional[r]) - ref))
    # a trajectory with one observation contributes nothing to the conditional likelihood
    assert float(conditional[3]) == 0.0
    print(f"log-likelihood: max abs error {worst:.1e}")


def test_smoothed_statistics_and_marginals_match_van_loan(panel_case):
    # emission matrices and an initial distribution; the batch covers missing values, an
    # intervention and exact entry times
    model, (times, states, exact, intervention), p0, results = panel_case
    _, stats, marg, (per_family, (Ms, Ts), pooled_log_likelihood, clamped) = results
    assert stats.dwell_times.shape == (5, len(STATES))
    assert stats.transitions.shape == (5, len(SHIFTS), len(STATES))
    assert marg.shape == (5, len(GRID), len(STATES))
    errors = {"log-likelihood": 0.0, "dwell": 0.0, "transitions": 0.0, "marginals": 0.0}
    ref_moves = 0.0
    for r in range(5):
        args = _trajectory(r, times, states, exact, intervention)
        ref = _dense(model, *args, EMISSIONS, p0)
        ref_moves = ref_moves + ref["moves"]
        moves = _as_dense(stats.transitions[r])
        np.testing.assert_allclose(stats.log_likelihood[r], ref["full"], rtol=1e-10)
        np.testing.assert_allclose(stats.dwell_times[r], ref["dwell"], rtol=1e-8, atol=1e-12)
        np.testing.assert_allclose(moves, ref["moves"], rtol=1e-8, atol=1e-12)
        errors["log-likelihood"] = max(
            errors["log-likelihood"], abs(float(stats.log_likelihood[r]) - ref["full"])
        )
        errors["dwell"] = max(errors["dwell"], np.abs(stats.dwell_times[r] - ref["dwell"]).max())
        errors["transitions"] = max(errors["transitions"], np.abs(moves - ref["moves"]).max())
        # dwell times fill the observed span
        span = args[1][-1] - args[1][0]
        np.testing.assert_allclose(stats.dwell_times[r].sum(), span, rtol=1e-12, atol=1e-14)
        for g, t in enumerate(GRID):
            if t >= args[1][0]:
                np.testing.assert_allclose(marg[r, g], ref["marginal"](t), atol=1e-9)
                errors["marginals"] = max(
                    errors["marginals"], np.abs(marg[r, g] - ref["marginal"](t)).max()
                )
    # node projections (model's and other parent sets), pooled over the batch with `sum`
    ref_dwell = np.asarray(stats.dwell_times).sum(0)
    for (node, parents), (M, T) in zip(FAMILIES, per_family):
        M_ref, T_ref = _node_projection(ref_moves, ref_dwell, node, parents)
        np.testing.assert_allclose(M, M_ref, rtol=1e-8)
        np.testing.assert_allclose(T, T_ref, rtol=1e-12)
    np.testing.assert_allclose(Ms[2, :6], per_family[1][0], rtol=1e-12)
    np.testing.assert_allclose(Ts[1, :2], _node_projection(ref_moves, ref_dwell, 2, (0,))[1])
    np.testing.assert_allclose(pooled_log_likelihood, stats.log_likelihood.sum())
    # the intervened node of trajectory 1 never moves
    assert float(clamped[1].sum()) == 0.0
    # an exact entry time records one sure jump into the observed state (X1 = 2 at 1.4)
    exact_moves = _node_projection(_as_dense(stats.transitions[2]), ref_dwell, 1, ())[0]
    assert exact_moves[0, :, 2].sum() >= 1.0
    print("max abs errors:", {k: f"{float(v):.1e}" for k, v in errors.items()})


def _path_node_statistics(initial, jump_times, states, num_events, horizon, cards, node, parents):
    """Per path, M_n(x, x', u) and T_n(x, u) cut from padded jump arrays (plain numpy)."""
    R, E = jump_times.shape
    seg = np.concatenate([initial[:, None], states], 1)  # (R, E + 1, N)
    slot = np.arange(E + 1)
    starts = np.concatenate([np.zeros((R, 1)), jump_times], 1)
    ends = np.concatenate([jump_times, np.full((R, 1), horizon)], 1)
    ends = np.where(slot < num_events[:, None], ends, horizon)
    dwell = np.where(slot <= num_events[:, None], ends - starts, 0.0)
    u = np.zeros(seg.shape[:2], int)
    for p in parents:
        u = u * cards[p] + seg[..., p]
    k, configs = cards[node], int(np.prod([cards[p] for p in parents]))
    rows = np.broadcast_to(np.arange(R)[:, None], seg.shape[:2])
    T = np.zeros((R, configs, k))
    np.add.at(T, (rows, u, seg[..., node]), dwell)
    moved = (slot[:-1] < num_events[:, None]) & (seg[:, :-1, node] != seg[:, 1:, node])
    M = np.zeros((R, configs, k, k))
    np.add.at(M, (rows[:, :-1], u[:, :-1], seg[:, :-1, node], seg[:, 1:, node]), moved)
    return M, T


PAIR = [(0, (1,)), (1, (0,))]  # the two nodes' families in a two-node cycle


def _node_statistics(stats):
    return [(stats.node_dwell_times(n, u), stats.node_transitions(n, u)) for n, u in PAIR]


@eqx.filter_jit
def _sampled_and_smoothed(model, obs, key, num_trajectories):
    """Library-sampled paths and the smoothed node statistics of `obs`, in one program."""
    paths = jc.sample_trajectories(
        model, jnp.array([0, 0]), 1.2, key=key, num_trajectories=num_trajectories, max_events=64
    )
    return paths, _node_statistics(jc.panel.panel_expected_statistics(model, obs))


def test_statistics_match_rejection_sampling(getkey):
    # 2 binary nodes; library-sampled paths from a known start, kept when they match two
    # partial observations; z-scores of the smoothed statistics against the kept paths'
    model = random_model(getkey(), (2, 2), ((1,), (0,)), scale=1.5)
    times = np.array([0.0, 0.6, 1.2])
    states = np.array([[0, 0], [MISSING, 1], [1, MISSING]])
    n = 20_000
    paths, smoothed = _sampled_and_smoothed(
        model, jc.panel.PanelObservations(times, states), getkey(), n
    )
    assert not np.any(paths.truncated)
    keep = np.ones(n, bool)
    for t, y in zip(times[1:], states[1:]):
        keep &= np.all((y < 0) | (state_at(paths, t) == y), axis=1)
    arrays = [
        np.asarray(x)[keep]
        for x in (paths.initial_states, paths.jump_times, paths.states, paths.num_events)
    ]
    n_kept = int(keep.sum())
    assert n_kept > 2000
    zs = []
    for (node, parents), (T_exact, M_exact) in zip(PAIR, smoothed):
        M, T = _path_node_statistics(*arrays, 1.2, (2, 2), node, parents)
        for mc, exact in [(T, T_exact), (M, M_exact)]:
            se = mc.std(0) / np.sqrt(n_kept)
            mask = se > 0
            zs.append(np.abs(mc.mean(0) - np.asarray(exact))[mask] / se[mask])
    z = np.concatenate(zs)
    assert len(z) == 16 and np.max(z) < 4.0, z


def _gillespie(W, start, horizon, rng):
    """One path of the dense generator W (plain numpy): jump times and global states."""
    s, t, times, states = start, 0.0, [], []
    while True:
        t += rng.exponential(1 / -W[s, s])
        if t >= horizon:
            return np.array(times), np.array(states, int)
        rates = np.where(np.arange(len(W)) == s, 0.0, W[s])
        s = int(rng.choice(len(W), p=rates / rates.sum()))
        times.append(t)
        states.append(s)


def test_dense_observation_grid_recovers_path_statistics(getkey):
    cards = (2, 3)
    model = random_model(getkey(), cards, ((1,), (0,)))
    states = np.array(list(itertools.product(range(2), range(3))))
    jumps, visited = _gillespie(brute_force_generator(model), 1, 4.0, np.random.default_rng(1))
    assert len(jumps) >= 4
    grid = np.linspace(0.0, 4.0, 801)
    at = np.concatenate([[1], visited])[np.searchsorted(jumps, grid, side="right")]
    smoothed = eqx.filter_jit(
        lambda m, o: _node_statistics(jc.panel.panel_expected_statistics(m, o))
    )(model, jc.panel.PanelObservations(grid, states[at]))
    path = (states[1][None], jumps[None], states[visited][None], np.array([len(jumps)]))
    for (node, parents), (T_smoothed, M_smoothed) in zip(PAIR, smoothed):
        M, T = _path_node_statistics(*path, 4.0, cards, node, parents)
        # errors of order the grid step (0.01) per jump: when a jump happened within its
        # interval, and the small chance of an unseen return trip
        np.testing.assert_allclose(T_smoothed, T[0], atol=0.02)
        np.testing.assert_allclose(M_smoothed, M[0], atol=0.05)
        print(
            f"node {node}: max |dT| {np.abs(T_smoothed - T[0]).max():.3f}"
            f", max |dM| {np.abs(M_smoothed - M[0]).max():.3f}"
        )


def test_gradient_matches_finite_differences(getkey):
    # one trajectory (no batch axis) with missing values, noisy observations and an exact entry
    model = random_model(getkey(), (2, 3), ((1,), (0,)))
    X = MISSING
    obs = jc.panel.PanelObservations(
        [0.0, 0.4, 1.1, 1.5],
        [[0, 1], [1, X], [X, 2], [0, 0]],
        exact_entry=[False, False, True, False],
    )
    emissions = jc.panel.Emissions([np.array([[0.9, 0.1], [0.2, 0.8]]), None])

    def loss(cims):
        m = jc.CTBN(cims=cims, parents=model.parents)
        return jc.panel.panel_log_likelihood(m, obs, emissions=emissions)

    value_and_grad = jax.jit(jax.value_and_grad(loss))  # one program for the three calls
    rng = np.random.default_rng(3)
    direction = [rng.normal(size=c.shape) * (1 - np.eye(c.shape[-1])) for c in model.cims]
    _, grads = value_and_grad(model.cims)
    ad = float(sum((np.asarray(g) * d).sum() for g, d in zip(grads, direction)))
    eps = 1e-5
    plus, _ = value_and_grad([c + eps * d for c, d in zip(model.cims, direction)])
    minus, _ = value_and_grad([c - eps * d for c, d in zip(model.cims, direction)])
    fd = float((plus - minus) / (2 * eps))
    assert abs(ad - fd) < 1e-7 * max(1.0, abs(fd))


def test_long_gaps_and_many_observations_stay_stable(getkey):
    model = random_model(getkey(), (2, 3), ((1,), (0,)), scale=3.0)
    rng = np.random.default_rng(0)
    # 300 observations, one gap of 2000 time units (about 10^4 jumps), partly missing
    gaps = np.concatenate([rng.uniform(0.05, 1.0, 299)])
    gaps[150] = 2000.0
    times = np.concatenate([[0.0], np.cumsum(gaps)])
    states = np.stack([rng.integers(0, 2, 300), rng.integers(0, 3, 300)], axis=1)
    states[rng.uniform(size=(300, 2)) < 0.3] = MISSING
    states[0] = [0, 1]
    obs = jc.panel.PanelObservations(times, states)
    ll64 = jax.jit(jc.panel.panel_log_likelihood)(model, obs)
    model32 = jc.CTBN(cims=[c.astype(jnp.float32) for c in model.cims], parents=model.parents)
    ll32 = jax.jit(jc.panel.panel_log_likelihood)(model32, obs)
    # dense reference in log space (scaled product of expm's)
    W = brute_force_generator(model)
    cards_states = np.array(list(itertools.product(range(2), range(3))))
    a = np.all(cards_states == states[0], axis=1).astype(float)
    ref = 0.0
    for i in range(1, 300):
        a = a @ scipy.linalg.expm(W * (times[i] - times[i - 1]))
        a = a * np.all((states[i] < 0) | (cards_states == states[i]), axis=1)
        ref += np.log(a.sum())
        a /= a.sum()
    assert np.isfinite(float(ll64)) and ref < -100
    np.testing.assert_allclose(float(ll64), ref, rtol=1e-10)
    assert ll32.dtype == jnp.float32
    np.testing.assert_allclose(float(ll32), ref, rtol=1e-4)


def test_bad_inputs_are_clear_errors(getkey):
    X = MISSING
    with pytest.raises(ValueError, match="conflicting states at the same time"):
        jc.panel.PanelObservations([0.0, 1.0, 1.0], [[0, 1], [1, X], [0, 2]])
    with pytest.raises(ValueError, match="observed twice"):
        jc.panel.PanelObservations([0.0, 1.0, 1.0], [[0, 1], [1, X], [X, 2]])
    with pytest.raises(ValueError, match="not sorted"):
        jc.panel.PanelObservations([0.0, 2.0, 1.0], [[0, 1], [1, X], [0, 2]])
    with pytest.raises(ValueError, match="states: unknown state -3"):
        jc.panel.PanelObservations([0.0, 1.0], [[0, 1], [-3, 0]])
    with pytest.raises(ValueError, match="exact_entry: the first observation"):
        jc.panel.PanelObservations([0.0, 1.0], [[0, 1], [1, 0]], exact_entry=[True, False])
    with pytest.raises(ValueError, match="num_observations"):
        jc.panel.PanelObservations([[0.0, 1.0]], [[[0, 1], [1, 0]]], num_observations=[0])

    model = random_model(getkey(), (2, 3), ((1,), (0,)))
    with pytest.raises(ValueError, match=r"state 3 for node 'X1', which has states 0..2"):
        jc.panel.panel_log_likelihood(
            model, jc.panel.PanelObservations([0.0, 1.0], [[0, 1], [1, 3]])
        )
    with pytest.raises(ValueError, match="emissions: the matrix of node 'X0' has 3 rows"):
        jc.panel.panel_log_likelihood(
            model,
            jc.panel.PanelObservations([0.0, 1.0], [[0, 1], [1, 2]]),
            emissions=jc.panel.Emissions([np.eye(3), None]),
        )

    # structural zeros: X1 can never leave state 0 (its rates out of 0 are exactly zero)
    cims = [np.array(c) for c in model.cims]
    cims[1][:, 0, 1:] = 0.0
    blocked = jc.CTBN(cims=cims, parents=model.parents)
    obs = jc.panel.PanelObservations.from_sequences(
        [[0.0, 1.0], [0.0, 0.5, 1.5]], [[[0, 0], [1, 0]], [[1, 0], [X, 0], [X, 2]]]
    )
    with pytest.raises(ValueError, match=r"trajectory 1 at time 1.5 \(observation 2\) is imposs"):
        jax.block_until_ready(jc.panel.panel_log_likelihood(blocked, obs))
