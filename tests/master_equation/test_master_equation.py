import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import brute_force_generator, one_hot_state, random_model, scipy_moments

import jaxctbn as jc
from jaxctbn._learning.candidates import candidate_parent_sets
from jaxctbn._master_equation.generator import amalgamate
from jaxctbn._paths.sampling import sample_trajectory

SOLVERS = [jc.Uniformisation(), jc.DiffraxSolver(), jc.MatrixExponential()]
SOLVER_IDS = ["uniformisation", "diffrax", "expm"]

CASES = {
    "binary-chain": ((2, 2, 2), ((), (0,), (1,))),
    "mixed-cycle": ((2, 3, 2), ((2,), (0,), (1, 0))),
    "ternary-fanin": ((3, 3, 2), ((), (0, 2), (1,))),
}


@eqx.filter_jit
def _generator_maps(model, p, *, expanded):
    """The dense generator and its products with `p`, in one compiled program."""
    gen = amalgamate(model, expanded=expanded)
    return gen.dense(), gen.apply(p), gen.apply_transpose(p)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("expanded", [False, True], ids=["factored", "expanded"])
def test_generator_matches_brute_force(case, expanded, getkey):
    cards, parents = CASES[case]
    model = random_model(getkey(), cards, parents)
    W = brute_force_generator(model)
    p = np.random.default_rng(len(W)).uniform(size=len(W))
    dense, pW, Wp = _generator_maps(model, jnp.asarray(p), expanded=expanded)
    np.testing.assert_allclose(np.asarray(dense), W, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(np.asarray(pW), p @ W, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(np.asarray(Wp), W @ p, rtol=1e-12, atol=1e-13)


# Every solver on the mixed-cycle case (mixed cardinalities, a cycle, a node with two parents;
# the gradient tests below reuse these programs), and the default solver (automatic: exact
# uniformisation) on the other two cases; the generator of every case is checked against brute
# force above, and the solvers act on it alone. One compiled program per pair: the mild and
# stiff rates share it.
SOLVER_CASES = [
    *((solver, "mixed-cycle") for solver in SOLVERS),
    (None, "binary-chain"),
    (None, "ternary-fanin"),
]
SOLVER_CASE_IDS = [f"{name}-mixed-cycle" for name in SOLVER_IDS] + [
    "automatic-binary-chain",
    "automatic-ternary-fanin",
]


@pytest.mark.parametrize("stiff", [False, True], ids=["mild", "stiff1e4"])
@pytest.mark.parametrize("solver, case", SOLVER_CASES, ids=SOLVER_CASE_IDS)
def test_solvers_agree_with_scipy_block_expm(solver, case, stiff, getkey):
    cards, parents = CASES[case]
    model = random_model(getkey(), cards, parents, stiff=stiff)
    tau = 1.5
    init = jnp.array([1, 0, 1])
    if solver is None:
        stats = jc.expected_statistics(model, init, tau)
    else:
        stats = jc.expected_statistics(model, init, tau, solver=solver)
    p_ref, dwell_ref = scipy_moments(
        brute_force_generator(model), one_hot_state(model, [1, 0, 1]), tau
    )
    np.testing.assert_allclose(np.asarray(stats.final_marginal), p_ref, rtol=1e-6, atol=1e-11)
    np.testing.assert_allclose(np.asarray(stats.dwell_times), dwell_ref, rtol=1e-6, atol=1e-11)
    assert abs(float(stats.dwell_times.sum()) - tau) < 1e-9
    assert abs(float(stats.final_marginal.sum()) - 1.0) < 1e-9
    assert float(stats.final_marginal.min()) > -1e-12


def test_node_projections_against_brute_force(getkey):
    cards, parents = CASES["mixed-cycle"]
    model = random_model(getkey(), cards, parents)
    stats = jc.expected_statistics(model, jnp.array([0, 2, 1]), 2.0)
    W = brute_force_generator(model)
    dwell = np.asarray(stats.dwell_times)
    states = list(itertools.product(*(range(k) for k in cards)))
    # every parent set of every node, true or not, in both orders
    orders = []
    for n in range(len(cards)):
        others = [m for m in range(len(cards)) if m != n]
        for r in range(len(others) + 1):
            for P in itertools.combinations(others, r):
                orders += [(n, P), (n, P[::-1])]
    sets = candidate_parent_sets(len(cards), len(cards) - 1)

    @eqx.filter_jit
    def projections(stats):  # every projection below, in one compiled program
        on_orders = [
            (stats.node_transitions(n, P), stats.node_dwell_times(n, P)) for n, P in orders
        ]
        on_sets = [stats.node_statistics_on_sets(n, sets[n]) for n in range(len(cards))]
        own = [(stats.node_transitions(n), stats.node_dwell_times(n)) for n in range(len(cards))]
        return on_orders, on_sets, own

    on_orders, on_sets, own = projections(stats)
    projected = dict(zip(orders, on_orders))
    for (n, order), (M_ours, T_ours) in projected.items():
        k = cards[n]
        C = int(np.prod([cards[p] for p in order]))
        T = np.zeros((C, k))
        M = np.zeros((C, k, k))
        for i, s in enumerate(states):
            u = 0
            for p in order:
                u = u * cards[p] + s[p]
            T[u, s[n]] += dwell[i]
            for j, t in enumerate(states):
                diff = [a for a in range(len(cards)) if s[a] != t[a]]
                if diff == [n]:
                    M[u, s[n], t[n]] += W[i, j] * dwell[i]
        np.testing.assert_allclose(np.asarray(T_ours), T, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(np.asarray(M_ours), M, rtol=1e-12, atol=1e-14)
    for n, k in enumerate(cards):
        # all candidate sets in one projection = the per-set projections checked above
        M_all, T_all = (np.asarray(a) for a in on_sets[n])
        for i, row in enumerate(np.asarray(sets[n])):
            P = tuple(int(p) for p in row if p >= 0)
            C = int(np.prod([cards[p] for p in P]))
            M_P, T_P = projected[(n, P)]
            np.testing.assert_allclose(M_all[i, :C], M_P, rtol=1e-12)
            np.testing.assert_allclose(T_all[i, :C], T_P, rtol=1e-12)
            assert np.abs(M_all[i, C:]).sum() + np.abs(T_all[i, C:]).sum() == 0.0
        # with the true parents, E[M] = Lambda * E[T] (MATH §1)
        lam = np.asarray(model.cims[n]) * (1 - np.eye(k))
        M_own, T_own = own[n]
        np.testing.assert_allclose(
            np.asarray(M_own), lam * np.asarray(T_own)[..., None], rtol=1e-12, atol=1e-14
        )


def test_perfect_intervention_clamps_node(getkey):
    cards, parents = CASES["mixed-cycle"]
    model = random_model(getkey(), cards, parents)
    iv = jc.Intervention.perfect(model, {"X1": 2})
    stats = jc.expected_statistics(model, jnp.array([0, 0, 0]), 2.0, intervention=iv)
    T1 = np.asarray(stats.node_dwell_times(1))
    assert np.all(T1[:, :2] == 0) and abs(T1[:, 2].sum() - 2.0) < 1e-12
    assert np.all(np.asarray(stats.node_transitions(1)) == 0)
    # the other nodes keep their conditional rates, which read the clamped state
    clamped = jc.CTBN(
        cims=[model.cims[0], jnp.zeros_like(model.cims[1]), model.cims[2]], parents=model.parents
    )
    ref = jc.expected_statistics(clamped, jnp.array([0, 2, 0]), 2.0)
    np.testing.assert_allclose(stats.dwell_times, ref.dwell_times, rtol=1e-12, atol=1e-14)
    # a distribution as initial condition: clamped node's mass is moved, the rest is kept
    p0 = jax.random.dirichlet(getkey(), jnp.ones(model.num_global_states))
    st = jc.expected_statistics(model, p0, 2.0, intervention=iv)
    assert np.all(np.asarray(st.node_dwell_times(1))[:, :2] == 0)


def test_imperfect_intervention_scales_rates(getkey):
    cards, parents = CASES["binary-chain"]
    model = random_model(getkey(), cards, parents)
    iv = jc.Intervention.none(3).with_rate_scales([1.0, 3.0, 0.5])
    stats = jc.expected_statistics(model, jnp.array([0, 0, 0]), 1.0, intervention=iv)
    scaled = jc.CTBN(
        cims=[model.cims[0], 3 * model.cims[1], 0.5 * model.cims[2]], parents=model.parents
    )
    ref = jc.expected_statistics(scaled, jnp.array([0, 0, 0]), 1.0)
    np.testing.assert_allclose(stats.dwell_times, ref.dwell_times, rtol=1e-12)
    new = jnp.full_like(model.cims[2], 0.7)
    iv2 = jc.Intervention.none(3).replace_cims([None, None, new])
    st2 = jc.expected_statistics(model, jnp.array([0, 0, 0]), 1.0, intervention=iv2)
    ref2 = jc.expected_statistics(
        jc.CTBN(cims=[model.cims[0], model.cims[1], new], parents=model.parents),
        jnp.array([0, 0, 0]),
        1.0,
    )
    np.testing.assert_allclose(st2.dwell_times, ref2.dwell_times, rtol=1e-12)


@eqx.filter_jit
def _dwell_under(model, initial_state, intervention):
    return jc.expected_statistics(model, initial_state, 1.0, intervention=intervention).dwell_times


@eqx.filter_jit
def _jump_times_under(model, initial_state, intervention, key):
    return sample_trajectory(
        model, initial_state, 1.0, key=key, intervention=intervention
    ).jump_times


@pytest.mark.parametrize(
    "make",
    [
        lambda m: jc.Intervention.none(3).with_rate_scales([1.0, -1.0, 1.0]),
        lambda m: jc.Intervention.none(3).with_rate_scales([1.0, 1.0, jnp.nan]),
        lambda m: jc.Intervention.none(3).replace_cims([None, None, -jnp.abs(m.cims[2])]),
    ],
    ids=["negative-scale", "nan-scale", "negative-replacement"],
)
def test_imperfect_intervention_rates_are_checked(make, getkey):
    # the intervened model is checked, not only the model before the intervention
    model = random_model(getkey(), *CASES["binary-chain"])
    iv = make(model)
    s0 = jnp.array([0, 0, 0])
    match = r"cims under the intervention\['X[12]'\]"
    # under jit (module-level programs: the two kinds of rate scales share theirs)
    with pytest.raises(eqx.EquinoxRuntimeError, match=match):
        _dwell_under(model, s0, iv)
    with pytest.raises(eqx.EquinoxRuntimeError, match=match):
        _jump_times_under(model, s0, iv, getkey())


def test_intervention_space_vmaps(getkey):
    cards, parents = CASES["mixed-cycle"]
    model = random_model(getkey(), cards, parents)
    space = jc.intervention_space(cards)
    assert space.targets.shape == (3 * 4 * 3, 3)
    assert not bool(space.targets[0].any())
    combos = {
        tuple(int(s) if t else -1 for t, s in zip(tt, ss))
        for tt, ss in zip(np.asarray(space.targets), np.asarray(space.states))
    }
    assert len(combos) == 36
    init = jnp.array([1, 1, 1])
    batched = jax.jit(
        jax.vmap(lambda iv: jc.expected_statistics(model, init, 1.0, intervention=iv).dwell_times)
    )(space)
    for i in [0, 5, 17, 35]:
        iv = jax.tree_util.tree_map(lambda a: a[i], space)
        single = jc.expected_statistics(model, init, 1.0, intervention=iv).dwell_times
        np.testing.assert_allclose(batched[i], single, rtol=1e-12, atol=1e-15)


def test_initial_distribution_is_linear(getkey):
    cards, parents = CASES["ternary-fanin"]
    model = random_model(getkey(), cards, parents)
    w = np.asarray(jax.random.dirichlet(getkey(), jnp.ones(model.num_global_states)))
    mix = jc.expected_statistics(model, jnp.asarray(w), 1.0).dwell_times
    states = list(itertools.product(*(range(k) for k in cards)))
    ref = sum(
        w[i] * np.asarray(jc.expected_statistics(model, jnp.array(s), 1.0).dwell_times)
        for i, s in enumerate(states)
    )
    np.testing.assert_allclose(mix, ref, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("solver", SOLVERS, ids=SOLVER_IDS)
def test_marginals_on_a_grid(solver, getkey):
    cards, parents = CASES["binary-chain"]
    model = random_model(getkey(), cards, parents)
    times = jnp.array([0.0, 0.3, 0.3, 1.0, 2.5])
    ps, acc = jc.marginals(model, jnp.array([0, 1, 0]), times, solver=solver)
    W = brute_force_generator(model)
    p0 = one_hot_state(model, [0, 1, 0])
    for t, p, a in zip(np.asarray(times), np.asarray(ps), np.asarray(acc)):
        p_ref, a_ref = scipy_moments(W, p0, t) if t > 0 else (p0, np.zeros_like(p0))
        np.testing.assert_allclose(p, p_ref, rtol=1e-7, atol=1e-11)
        np.testing.assert_allclose(a, a_ref, rtol=1e-7, atol=1e-11)


@pytest.mark.parametrize("solver", SOLVERS, ids=SOLVER_IDS)
def test_gradient_matches_finite_differences(solver, getkey):
    cards, parents = CASES["mixed-cycle"]
    model = random_model(getkey(), cards, parents)
    rng = np.random.default_rng(5)
    weights = rng.normal(size=model.num_global_states)

    def loss(cims):
        m = jc.CTBN(cims=cims, parents=parents)
        st = jc.expected_statistics(m, jnp.array([0, 1, 1]), 1.3, solver=solver)
        return (st.dwell_times * weights).sum() + st.node_transitions(2).sum()

    grads = jax.jit(jax.grad(loss))(model.cims)
    cims = [np.asarray(c) for c in model.cims]
    direction = [rng.normal(size=c.shape) * (1 - np.eye(c.shape[-1])) for c in cims]
    eps = 1e-5
    # the loss evaluated eagerly: the compiled verb of the solver-against-scipy test
    plus = loss([c + eps * d for c, d in zip(cims, direction)])
    minus = loss([c - eps * d for c, d in zip(cims, direction)])
    fd = (plus - minus) / (2 * eps)
    ad = sum((np.asarray(g) * d).sum() for g, d in zip(grads, direction))
    assert abs(float(ad - fd)) < 1e-6 * max(1.0, abs(float(fd)))


def test_vmap_grad_and_grad_vmap(getkey):
    cards, parents = CASES["binary-chain"]
    model = random_model(getkey(), cards, parents)
    scales = jnp.array([0.5, 1.0, 2.0])

    def f(scale):
        m = jc.CTBN(cims=[c * scale for c in model.cims], parents=parents)
        return jc.expected_statistics(m, jnp.array([0, 0, 0]), 1.0).node_transitions(1).sum()

    # each compiled whole (called eagerly, the transformed solve splits into several programs)
    vg = jax.jit(jax.vmap(jax.grad(f)))(scales)
    gv = jax.jit(jax.grad(lambda s: jax.vmap(f)(s).sum()))(scales)
    np.testing.assert_allclose(vg, gv, rtol=1e-10)
    eps = 1e-6
    batch_f = jax.jit(jax.vmap(f))
    fd = (batch_f(scales + eps) - batch_f(scales - eps)) / (2 * eps)
    np.testing.assert_allclose(vg, fd, rtol=1e-6)


def test_diffrax_shared_step_batch_matches_single(getkey):
    cards, parents = CASES["mixed-cycle"]
    models = jax.vmap(lambda k: random_model(k, cards, parents))(jax.random.split(getkey(), 4))
    init = jnp.array([[0, 1, 0], [1, 2, 1], [0, 0, 1], [1, 1, 0]])  # a different start each
    batch = jc.expected_statistics_batch(models, init, 1.0, solver=jc.DiffraxSolver())
    unif = jc.expected_statistics_batch(models, init, 1.0, solver=jc.Uniformisation())
    expm = jc.expected_statistics_batch(models, init, 1.0, solver=jc.MatrixExponential())
    np.testing.assert_allclose(batch.dwell_times, unif.dwell_times, rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(expm.dwell_times, unif.dwell_times, rtol=1e-9, atol=1e-12)
    # the shared-step batched ODE (solve_batch, run by the batched verb above) against one
    # adaptive solve per member (solve), and both against exact uniformisation (the batch above)
    solver = jc.DiffraxSolver()
    member = [jax.tree_util.tree_map(lambda x: x[i], models) for i in range(4)]
    p0 = jnp.stack([one_hot_state(m, s) for m, s in zip(member, np.asarray(init))])
    p_batch, dwell_batch = np.asarray(batch.final_marginal), np.asarray(batch.dwell_times)
    p_exact, dwell_exact = np.asarray(unif.final_marginal), np.asarray(unif.dwell_times)
    solve = jax.jit(solver.solve)  # one program, 4 calls
    for i in range(4):
        gen = jax.tree_util.tree_map(lambda x: x[i], batch.generator)
        p_single, dwell_single = solve(gen, p0[i], 1.0)
        np.testing.assert_allclose(p_batch[i], p_single, rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(dwell_batch[i], dwell_single, rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(p_single, p_exact[i], rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(dwell_single, dwell_exact[i], rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(dwell_batch[i], dwell_exact[i], rtol=1e-7, atol=1e-12)


def test_padded_models_with_different_graphs_share_one_compilation(getkey):
    cards = (2, 3, 2)
    graphs = [((), (0,), (1,)), ((1, 2), (), (0,)), ((2,), (0, 2), ())]
    models = [random_model(getkey(), cards, g) for g in graphs]
    padded = [m.padded(max_parents=2) for m in models]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *padded)
    init = jnp.array([1, 2, 0])

    @eqx.debug.assert_max_traces(max_traces=1)
    def dwell(m):
        return jc.expected_statistics(m, init, 1.0).dwell_times

    @eqx.filter_jit
    def own_statistics(m):  # the dwell times and every node's transitions on its parents
        st = jc.expected_statistics(m, init, 1.0)
        return st.dwell_times, [st.node_transitions(n) for n in range(3)]

    out = jax.jit(jax.vmap(dwell))(stacked)
    for i, m in enumerate(models):
        ref, M_ref = own_statistics(m)  # one program per graph
        np.testing.assert_allclose(out[i], ref, rtol=1e-12, atol=1e-15)
        # projection onto the padded (traced) parent list equals the static one
        _, M = own_statistics(padded[i])  # one program for the three padded models
        for n in range(3):
            C = int(np.prod([cards[p] for p in m.parents[n]]))
            np.testing.assert_allclose(M[n][:C], M_ref[n], rtol=1e-12, atol=1e-15)


def test_float32_stays_float32(getkey):
    cards, parents = CASES["binary-chain"]
    model = random_model(getkey(), cards, parents)
    m32 = jc.CTBN(cims=[c.astype(jnp.float32) for c in model.cims], parents=parents)
    for solver in [jc.Uniformisation(tolerance=1e-7), jc.DiffraxSolver(rtol=1e-5, atol=1e-7)]:
        st = jc.expected_statistics(m32, jnp.array([0, 0, 0]), 1.0, solver=solver)
        assert st.dwell_times.dtype == jnp.float32
        assert st.node_transitions(1).dtype == jnp.float32
        ref = jc.expected_statistics(model, jnp.array([0, 0, 0]), 1.0).dwell_times
        np.testing.assert_allclose(st.dwell_times, ref, rtol=1e-4, atol=1e-6)


def test_no_recompilation_with_new_values(getkey):
    cards, parents = CASES["binary-chain"]

    @jax.jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def run(model, init, tau):
        return jc.expected_statistics(model, init, tau).dwell_times

    for _ in range(3):
        run(random_model(getkey(), cards, parents), jnp.array([0, 1, 0]), jnp.asarray(1.7))
    run(random_model(getkey(), cards, parents), jnp.array([1, 1, 0]), jnp.asarray(0.4))


# ----------------------------------------------------------------------------- bad input
def _bad_model():
    return jc.CTBN(cims=[jnp.array([[[-1.0, -1.0], [2.0, -2.0]]])], parents=[[]])


def test_negative_rates_raise_inside_jit():
    with pytest.raises(jax.errors.JaxRuntimeError, match="negative off-diagonal rates"):
        jax.jit(lambda m: jc.expected_statistics(m, jnp.array([0]), 1.0).dwell_times)(_bad_model())


def test_nan_rates_raise():
    model = jc.CTBN(cims=[jnp.array([[[0.0, jnp.nan], [2.0, 0.0]]])], parents=[[]])
    with pytest.raises(eqx.EquinoxRuntimeError, match="NaN or infinite"):
        jc.expected_statistics(model, jnp.array([0]), 1.0).dwell_times.block_until_ready()


@pytest.mark.parametrize("tau", [0.0, -1.0, float("nan")])
def test_bad_horizon_raises(tau, getkey):
    model = random_model(getkey(), (2, 2), ((), (0,)))
    with pytest.raises(eqx.EquinoxRuntimeError, match="horizon: must be a positive finite number"):
        jc.expected_statistics(model, jnp.array([0, 0]), tau).dwell_times.block_until_ready()


def test_bad_initial_state_raises(getkey):
    model = random_model(getkey(), (2, 3), ((), (0,)))
    with pytest.raises(eqx.EquinoxRuntimeError, match="node states must be in 0..k-1"):
        jc.expected_statistics(model, jnp.array([0, 3]), 1.0).dwell_times.block_until_ready()
    with pytest.raises(ValueError, match="expected 2 node states"):
        jc.expected_statistics(model, jnp.array([0, 1, 1]), 1.0)
    with pytest.raises(eqx.EquinoxRuntimeError, match="sum to 1"):
        jc.expected_statistics(model, jnp.full(6, 0.5), 1.0).dwell_times.block_until_ready()
    with pytest.raises(ValueError, match="expected 6 probabilities"):
        jc.expected_statistics(model, jnp.full(5, 0.2), 1.0)


def test_bad_times_raise(getkey):
    model = random_model(getkey(), (2, 2), ((), (0,)))
    with pytest.raises(eqx.EquinoxRuntimeError, match="non-decreasing"):
        jc.marginals(model, jnp.array([0, 0]), jnp.array([0.0, 2.0, 1.0]))[0].block_until_ready()


def test_uniformisation_max_terms_is_an_error(getkey):
    model = random_model(getkey(), (2, 2), ((), (0,)), scale=100.0)
    with pytest.raises(eqx.EquinoxRuntimeError, match="max_terms reached"):
        jc.expected_statistics(
            model, jnp.array([0, 0]), 5.0, solver=jc.Uniformisation(max_terms=10)
        ).dwell_times.block_until_ready()


def test_uniformisation_batch_in_rate_groups(getkey):
    # 7 members with rates spread over two decades, in groups of at most 3 (3 groups of 3, two
    # padded): every member's forward and backward solve equals the dense exponential's, in the
    # input order, and the gradient through the sorting and regrouping equals finite differences
    cards, parents = CASES["mixed-cycle"]
    scales = jnp.array([3.0, 0.05, 1.0, 0.3, 10.0, 0.1, 2.0])
    base = jax.vmap(lambda k: random_model(k, cards, parents))(jax.random.split(getkey(), 7))

    def generators(scales):
        scaled = jax.vmap(lambda s, m: jc.CTBN(cims=[c * s for c in m.cims], parents=parents))
        return jax.vmap(amalgamate)(scaled(scales, base))

    S = int(np.prod(cards))
    rng = np.random.default_rng(7)
    p0 = jnp.asarray(rng.dirichlet(np.ones(S), 7))
    grouped = jc.Uniformisation(group_size=3)
    reference = jc.MatrixExponential()

    @jax.jit
    def three_routes(scales):  # forward and backward: grouped, in one loop, dense exponential
        gens = generators(scales)
        routes = []
        for solve, single in (("solve_batch", "solve"), ("solve_backward_batch", "solve_backward")):
            whole = jc.Uniformisation(group_size=None)
            # the dense exponential of each member (one matrix at a time under vmap)
            exact = jax.vmap(getattr(reference, single), in_axes=(0, 0, None))
            routes.append(
                (
                    getattr(grouped, solve)(gens, p0, 1.5),
                    exact(gens, p0, 1.5),
                    getattr(whole, solve)(gens, p0, 1.5),
                )
            )
        return routes

    for out, exact, whole in three_routes(scales):
        for got, want, one_loop in zip(out, exact, whole):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-13)
            np.testing.assert_allclose(got, one_loop, rtol=1e-12, atol=1e-14)

    weights = jnp.asarray(rng.normal(size=(7, S)))

    @jax.jit
    def loss(scales):
        return (grouped.solve_batch(generators(scales), p0, 1.5)[1] * weights).sum()

    grad = jax.jit(jax.grad(loss))(scales)
    eps = 1e-6
    for i in (1, 4):
        step = jnp.zeros(7).at[i].set(eps)
        fd = (loss(scales + step) - loss(scales - step)) / (2 * eps)
        np.testing.assert_allclose(grad[i], fd, rtol=1e-6)
    with pytest.raises(ValueError, match="group_size"):
        jc.Uniformisation(group_size=0)


def test_order_by_rate_is_a_sorting_permutation():
    # the packed-key sort against numpy's argsort: a permutation, finite rates ascending (equal
    # up to the keys' resolution, a relative 2^(b - 23) with b = 10 index bits here), ties and
    # repeated values kept, infinities and NaN last; under vmap the same per row
    from jaxctbn._master_equation.uniformisation import _order_by_rate

    rng = np.random.default_rng(0)
    rates = np.exp(rng.uniform(-8, 8, 1000))
    rates[::50] = 3.0  # repeated values
    rates[1::97] = rates[2::97] * (1 + 1e-12)  # near-ties
    rates[7], rates[11], rates[500], rates[3] = np.inf, np.nan, 0.0, 1e300  # 1e300: f32 inf
    order = np.asarray(jax.jit(_order_by_rate)(jnp.asarray(rates)))
    assert sorted(order.tolist()) == list(range(1000))
    got = rates[order]
    finite = np.isfinite(got) & (got < 3e38)
    assert finite[:-3].all() and not finite[-3:].any()  # inf, 1e300 (inf in f32) and NaN last
    assert np.isnan(got[-1])
    want = np.sort(rates[np.isfinite(rates) & (rates < 3e38)])
    np.testing.assert_allclose(got[:-3], want, rtol=2.0 ** (10 - 23))
    batch = jnp.asarray(np.stack([rates, rates[::-1]]))
    both = np.asarray(jax.vmap(_order_by_rate)(batch))
    np.testing.assert_array_equal(both[0], order)
    assert sorted(both[1].tolist()) == list(range(1000))


def test_statistics_grid_shares_solves_by_clamp_pattern(getkey):
    """Every (intervention, model) pair of the grid, solved once per clamp pattern, equals its
    own solve by the dense matrix exponential (the pairs solved one by one, as a batch): from a
    point mass and from a distribution; clamped states 0 and 1 and 2 of a ternary node,
    duplicates, no clamp, and an intervention clamping a node outside `clampable` (zeros);
    also its gradients with respect to the rates and to the initial distribution (one
    gradient program for both)."""
    from jaxctbn._master_equation.master_equation import clamp_pattern_statistics

    cards = (2, 3, 2)
    graphs = [((), (0,), (1,)), ((1, 2), (), (0,)), ((2,), (0, 2), ())]
    models = [random_model(getkey(), cards, g).padded(max_parents=2) for g in graphs]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *models)
    assignments = [{}, {1: 0}, {1: 2}, {1: 1}, {2: 1}, {1: 2, 2: 0}, {1: 2}, {0: 1}, {2: 0}]
    model0 = random_model(getkey(), cards, graphs[0])
    ivs = [jc.Intervention.perfect(model0, a) for a in assignments]
    batch = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *ivs)
    C, B = len(ivs), len(models)
    # the pairs intervention-major, as the grid's members: (c, b) at c * B + b
    pairs = jax.tree_util.tree_map(lambda x: jnp.repeat(x, B, axis=0), batch)
    keep = np.repeat([0 not in a for a in assignments], B)  # the rest clamp node 0: zeros
    others = [(1, 2), (0, 2), (0, 1)]

    def grid(m, p0):
        return clamp_pattern_statistics(m, p0, 0.8, batch, clampable=(1, 2)).members(batch)

    def by_pairs(m, p0):
        grid_models = jax.tree_util.tree_map(
            lambda x: jnp.broadcast_to(x, (C, *x.shape)).reshape(C * B, *x.shape[1:]), m
        )
        return jc.expected_statistics_batch(
            grid_models,
            jnp.broadcast_to(p0, (C * B, *p0.shape)),
            0.8,
            interventions=pairs,
            solver=jc.MatrixExponential(),
        )

    @eqx.filter_jit
    def both_routes(m, p0):
        def summary(st):
            return (
                st.dwell_times,
                st.final_marginal,
                [st.node_transitions(n, others[n]) for n in range(3)],
            )

        return jax.vmap(summary)(grid(m, p0)), jax.vmap(summary)(by_pairs(m, p0))

    point = jnp.array([1, 2, 0])
    distribution = jax.random.dirichlet(getkey(), jnp.ones(12))
    for init in (point, distribution):
        (dwell, final, M), (dwell_ref, final_ref, M_ref) = both_routes(stacked, init)
        assert dwell.shape == (C * B, 12)
        np.testing.assert_array_equal(np.asarray(dwell)[~keep], 0)
        np.testing.assert_array_equal(np.asarray(final)[~keep], 0)
        for got, want in [(dwell, dwell_ref), (final, final_ref), *zip(M, M_ref)]:
            got, want = np.asarray(got)[keep], np.asarray(want)[keep]
            np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-14)

    # gradient of a weighted sum of the dwell times, against the pairs solved one by one, with
    # respect to the rates and to the initial distribution
    weights = jax.random.uniform(getkey(), (C * B, 12)) * jnp.asarray(keep, float)[:, None]

    @eqx.filter_jit
    @eqx.filter_grad
    def gradient(m_and_p0, route):
        return (route(*m_and_p0).dwell_times * weights).sum()

    g_grid = gradient((stacked, distribution), grid)
    g_pairs = gradient((stacked, distribution), by_pairs)
    np.testing.assert_allclose(g_grid[1], g_pairs[1], rtol=1e-10, atol=1e-12)
    for a, b in zip(g_grid[0].cims, g_pairs[0].cims):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
        assert float(jnp.abs(a).max()) > 1e-3  # the check has something to compare


def test_statistics_grid_rejects_what_it_cannot_share(getkey):
    from jaxctbn._master_equation.master_equation import clamp_pattern_statistics

    cards, parents = CASES["binary-chain"]
    model = random_model(getkey(), cards, parents)
    stacked = jax.tree_util.tree_map(lambda x: x[None], model)
    iv = jax.tree_util.tree_map(lambda x: x[None], jc.Intervention.perfect(model, {1: 0}))
    init = jnp.array([0, 0, 0])
    with pytest.raises(ValueError, match="perfect interventions only"):
        clamp_pattern_statistics(
            stacked, init, 1.0, iv.with_rate_scales([2.0, 1.0, 1.0]), clampable=(1,)
        )
    with pytest.raises(ValueError, match="exact solver"):
        clamp_pattern_statistics(stacked, init, 1.0, iv, clampable=(1,), solver=jc.MeanField())
    with pytest.raises(ValueError, match="clampable"):
        clamp_pattern_statistics(stacked, init, 1.0, iv, clampable=(1, 1))
