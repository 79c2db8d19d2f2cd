import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import brute_force_generator, one_hot_state, random_model, scipy_moments

import jaxctbn as jc

SOLVERS = [jc.Uniformisation(), jc.DiffraxSolver(), jc.MatrixExponential()]
SOLVER_IDS = ["uniformisation", "diffrax", "expm"]

CASES = {
    "binary-chain": ((2, 2, 2), ((), (0,), (1,))),
    "mixed-cycle": ((2, 3, 2), ((2,), (0,), (1, 0))),
    "ternary-fanin": ((3, 3, 2), ((), (0, 2), (1,))),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("expanded", [False, True], ids=["factored", "expanded"])
def test_generator_matches_brute_force(case, expanded, getkey):
    cards, parents = CASES[case]
    model = random_model(getkey(), cards, parents)
    gen = jc.amalgamate(model, expanded=expanded)
    W = brute_force_generator(model)
    np.testing.assert_allclose(np.asarray(gen.dense()), W, rtol=1e-13, atol=1e-13)
    p = np.asarray(jax.random.uniform(getkey(), (W.shape[0],)))
    np.testing.assert_allclose(np.asarray(gen.apply(jnp.asarray(p))), p @ W, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(
        np.asarray(gen.apply_transpose(jnp.asarray(p))), W @ p, rtol=1e-12, atol=1e-13
    )


@pytest.mark.parametrize("stiff", [False, True], ids=["mild", "stiff1e4"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("solver", SOLVERS, ids=SOLVER_IDS)
def test_solvers_agree_with_scipy_block_expm(solver, case, stiff, getkey):
    cards, parents = CASES[case]
    model = random_model(getkey(), cards, parents, stiff=stiff)
    tau = 1.5
    init = jnp.array([1, 0, 1])
    stats = jax.jit(lambda m: jc.expected_statistics(m, init, tau, solver=solver))(model)
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
    # project onto every parent set of every node, true or not
    for n, k in enumerate(cards):
        others = [m for m in range(len(cards)) if m != n]
        for r in range(len(others) + 1):
            for P in itertools.combinations(others, r):
                for order in (P, P[::-1]):
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
                    np.testing.assert_allclose(
                        np.asarray(stats.node_dwell_times(n, order)), T, rtol=1e-12, atol=1e-14
                    )
                    np.testing.assert_allclose(
                        np.asarray(stats.node_transitions(n, order)), M, rtol=1e-12, atol=1e-14
                    )
        # all candidate sets in one projection = the per-set projections checked above
        sets = jc.candidate_parent_sets(len(cards), len(cards) - 1)[n]
        M_all, T_all = eqx.filter_jit(lambda st, P, n=n: st.node_statistics_on_sets(n, P))(
            stats, sets
        )
        for i, row in enumerate(np.asarray(sets)):
            P = tuple(int(p) for p in row if p >= 0)
            C = int(np.prod([cards[p] for p in P]))
            np.testing.assert_allclose(M_all[i, :C], stats.node_transitions(n, P), rtol=1e-12)
            np.testing.assert_allclose(T_all[i, :C], stats.node_dwell_times(n, P), rtol=1e-12)
            assert float(jnp.abs(M_all[i, C:]).sum() + jnp.abs(T_all[i, C:]).sum()) == 0.0
        # with the true parents, E[M] = Lambda * E[T] (MATH §1)
        lam = np.asarray(model.cims[n]) * (1 - np.eye(k))
        np.testing.assert_allclose(
            np.asarray(stats.node_transitions(n)),
            lam * np.asarray(stats.node_dwell_times(n))[..., None],
            rtol=1e-12,
            atol=1e-14,
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
    with pytest.raises(eqx.EquinoxRuntimeError, match=match):
        eqx.filter_jit(lambda m, i: jc.expected_statistics(m, s0, 1.0, intervention=i).dwell_times)(
            model, iv
        )
    with pytest.raises(eqx.EquinoxRuntimeError, match=match):
        eqx.filter_jit(
            lambda m, i, k: jc.sample_trajectory(m, s0, 1.0, key=k, intervention=i).jump_times
        )(model, iv, getkey())


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
    weights = jax.random.normal(getkey(), (model.num_global_states,))

    def loss(cims):
        m = jc.CTBN(cims=cims, parents=parents)
        st = jc.expected_statistics(m, jnp.array([0, 1, 1]), 1.3, solver=solver)
        return (st.dwell_times * weights).sum() + st.node_transitions(2).sum()

    grads = jax.jit(jax.grad(loss))(model.cims)
    direction = [
        jax.random.normal(getkey(), c.shape) * (1 - jnp.eye(c.shape[-1])) for c in model.cims
    ]
    eps = 1e-5
    plus = loss([c + eps * d for c, d in zip(model.cims, direction)])
    minus = loss([c - eps * d for c, d in zip(model.cims, direction)])
    fd = (plus - minus) / (2 * eps)
    ad = sum((g * d).sum() for g, d in zip(grads, direction))
    assert abs(float(ad - fd)) < 1e-6 * max(1.0, abs(float(fd)))


def test_vmap_grad_and_grad_vmap(getkey):
    cards, parents = CASES["binary-chain"]
    model = random_model(getkey(), cards, parents)
    scales = jnp.array([0.5, 1.0, 2.0])

    def f(scale):
        m = jc.CTBN(cims=[c * scale for c in model.cims], parents=parents)
        return jc.expected_statistics(m, jnp.array([0, 0, 0]), 1.0).node_transitions(1).sum()

    vg = jax.vmap(jax.grad(f))(scales)
    gv = jax.grad(lambda s: jax.vmap(f)(s).sum())(scales)
    np.testing.assert_allclose(vg, gv, rtol=1e-10)
    eps = 1e-6
    fd = (jax.vmap(f)(scales + eps) - jax.vmap(f)(scales - eps)) / (2 * eps)
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
    # the shared-step batched ODE (solve_batch) against one adaptive solve per member (solve),
    # and both against exact uniformisation
    solver = jc.DiffraxSolver()
    member = [jax.tree_util.tree_map(lambda x: x[i], models) for i in range(4)]
    p0 = jnp.stack([one_hot_state(m, s) for m, s in zip(member, np.asarray(init))])
    p_batch, dwell_batch = solver.solve_batch(batch.generator, p0, 1.0)
    for i in range(4):
        gen = jax.tree_util.tree_map(lambda x: x[i], batch.generator)
        p_single, dwell_single = solver.solve(gen, p0[i], 1.0)
        p_exact, dwell_exact = jc.Uniformisation().solve(gen, p0[i], 1.0)
        np.testing.assert_allclose(p_batch[i], p_single, rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(dwell_batch[i], dwell_single, rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(p_single, p_exact, rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(dwell_single, dwell_exact, rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(dwell_batch[i], dwell_exact, rtol=1e-7, atol=1e-12)


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

    out = jax.jit(jax.vmap(dwell))(stacked)
    for i, m in enumerate(models):
        ref = jc.expected_statistics(m, init, 1.0).dwell_times
        np.testing.assert_allclose(out[i], ref, rtol=1e-12, atol=1e-15)
        # projection onto the padded (traced) parent list equals the static one
        st = jc.expected_statistics(padded[i], init, 1.0)
        st_ref = jc.expected_statistics(m, init, 1.0)
        for n in range(3):
            C = int(np.prod([cards[p] for p in m.parents[n]]))
            np.testing.assert_allclose(
                st.node_transitions(n)[:C], st_ref.node_transitions(n), rtol=1e-12, atol=1e-15
            )


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
        return jax.vmap(jc.amalgamate)(scaled(scales, base))

    gens = generators(scales)
    S = gens.exit_rates.shape[1]
    p0 = jax.random.dirichlet(getkey(), jnp.ones(S), (7,))
    grouped = jc.Uniformisation(group_size=3)
    reference = jc.MatrixExponential()
    for solve in ("solve_batch", "solve_backward_batch"):
        out = jax.jit(getattr(grouped, solve))(gens, p0, 1.5)
        whole = getattr(jc.Uniformisation(group_size=None), solve)(gens, p0, 1.5)
        single = "solve" if solve == "solve_batch" else "solve_backward"
        for i in range(7):
            g = jax.tree_util.tree_map(lambda x: x[i], gens)
            exact = getattr(reference, single)(g, p0[i], 1.5)
            for got, want, one_loop in zip(out, exact, whole):
                np.testing.assert_allclose(got[i], want, rtol=1e-10, atol=1e-13)
                np.testing.assert_allclose(got[i], one_loop[i], rtol=1e-12, atol=1e-14)

    weights = jax.random.normal(getkey(), (7, S))

    def loss(scales):
        return (grouped.solve_batch(generators(scales), p0, 1.5)[1] * weights).sum()

    grad = jax.grad(loss)(scales)
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
    from jaxctbn._master_equation.solvers import _order_by_rate

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


@pytest.mark.parametrize("distribution", [False, True])
def test_statistics_grid_shares_solves_by_clamp_pattern(distribution, getkey):
    """Every (intervention, model) pair of the grid, solved once per clamp pattern, equals its
    own solve by the dense matrix exponential: clamped states 0 and 1 and 2 of a ternary node,
    duplicates, no clamp, and an intervention clamping a node outside `clampable` (zeros);
    also its gradients with respect to the rates and to the initial distribution."""
    from jaxctbn._master_equation.master_equation import clamp_pattern_statistics

    cards = (2, 3, 2)
    graphs = [((), (0,), (1,)), ((1, 2), (), (0,)), ((2,), (0, 2), ())]
    models = [random_model(getkey(), cards, g).padded(max_parents=2) for g in graphs]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *models)
    assignments = [{}, {1: 0}, {1: 2}, {1: 1}, {2: 1}, {1: 2, 2: 0}, {1: 2}, {0: 1}, {2: 0}]
    model0 = random_model(getkey(), cards, graphs[0])
    ivs = [jc.Intervention.perfect(model0, a) for a in assignments]
    batch = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *ivs)
    if distribution:
        init = jax.random.dirichlet(getkey(), jnp.ones(12))
    else:
        init = jnp.array([1, 2, 0])
    C, B = len(ivs), len(models)

    def grid(m):
        return clamp_pattern_statistics(m, init, 0.8, batch, clampable=(1, 2)).members(batch)

    out = eqx.filter_jit(grid)(stacked)
    assert out.dwell_times.shape == (C * B, 12)
    for c, a in enumerate(assignments):
        for b, m in enumerate(models):
            got = jax.tree_util.tree_map(lambda x: x[c * B + b], out)
            if 0 in a:  # clamps a node outside `clampable`: zero statistics
                np.testing.assert_array_equal(got.dwell_times, 0)
                continue
            ref = jc.expected_statistics(
                m, init, 0.8, intervention=ivs[c], solver=jc.MatrixExponential()
            )
            np.testing.assert_allclose(got.dwell_times, ref.dwell_times, rtol=1e-11, atol=1e-14)
            np.testing.assert_allclose(
                got.final_marginal, ref.final_marginal, rtol=1e-11, atol=1e-14
            )
            for n in range(3):
                np.testing.assert_allclose(
                    got.node_transitions(n, (0, 1, 2)[:n] + (0, 1, 2)[n + 1 :]),
                    ref.node_transitions(n, (0, 1, 2)[:n] + (0, 1, 2)[n + 1 :]),
                    rtol=1e-11,
                    atol=1e-14,
                )

    # gradient of a weighted sum of the dwell times, against the pairs solved one by one: with
    # respect to the rates (from a point mass) or to the initial distribution
    weights = jax.random.uniform(getkey(), (C * B, 12))
    keep = jnp.repeat(jnp.asarray([0 not in a for a in assignments], float), B)[:, None]

    def by_grid(m, p0):
        st = clamp_pattern_statistics(m, p0, 0.8, batch, clampable=(1, 2)).members(batch)
        return (st.dwell_times * weights).sum()

    def by_pairs(m, p0):
        grid_models = jax.tree_util.tree_map(
            lambda x: jnp.broadcast_to(x, (C, *x.shape)).reshape(C * B, *x.shape[1:]), m
        )
        pairs = jax.tree_util.tree_map(lambda x: jnp.repeat(x, B, axis=0), batch)
        st = jc.expected_statistics_batch(
            grid_models,
            jnp.broadcast_to(p0, (C * B, *p0.shape)),
            0.8,
            interventions=pairs,
            solver=jc.MatrixExponential(),
        )
        return (st.dwell_times * weights * keep).sum()

    if distribution:
        g_grid = jax.jit(jax.grad(by_grid, argnums=1))(stacked, init)
        g_pairs = jax.jit(jax.grad(by_pairs, argnums=1))(stacked, init)
        np.testing.assert_allclose(g_grid, g_pairs, rtol=1e-10, atol=1e-12)
        return
    g_grid = eqx.filter_jit(eqx.filter_grad(by_grid))(stacked, init)
    g_pairs = eqx.filter_jit(eqx.filter_grad(by_pairs))(stacked, init)
    for a, b in zip(g_grid.cims, g_pairs.cims):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


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
