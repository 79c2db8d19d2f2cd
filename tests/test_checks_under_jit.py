"""Every value check inside jit guards every output it is about (issue 10).

An `eqx.error_if` whose result is not used is compiled away, so a check attached to one output
only is silently dropped when the caller selects another. Each test below compiles the public
function once per selected output (under `jax.jit`, and under `jax.vmap` with one bad batch
member) and feeds it bad values one at a time: the same compiled program must raise each
check's own message. Removing a check, or attaching it to fewer outputs, fails these tests.
"""

import re

import jax
import jax.numpy as jnp
import pytest

import jaxctbn as jc
from jaxctbn._learning.candidates import candidate_parent_sets
from jaxctbn._learning.scores import score_parent_sets
from jaxctbn._master_equation.preparation import initial_distribution
from jaxctbn._paths.sampling import Trajectories
from jaxctbn._paths.sufficient_statistics import node_statistics


def _raises(fn, args, match):
    with pytest.raises(Exception, match=re.escape(match)):
        jax.block_until_ready(fn(*args))


def _batch(good, bad):
    """A batch of two: a good member, then a bad one (for `jax.vmap`)."""
    return jax.tree_util.tree_map(
        lambda g, b: jnp.stack([jnp.asarray(g), jnp.asarray(b)]), good, bad
    )


def _check_outputs(program, outputs, good, cases, *, vmap=True):
    """For each output: compile `program(output)` under jit, run the good input (must not
    raise), then every bad case (must raise its message); the first output also under
    `jax.vmap` with one bad member in a batch of two. `cases` lists `(message, bad arguments,
    names of the outputs it guards or None for all)`. (Compilation dominates the time, hence
    one vmapped program per test.)"""
    for i, (name, select) in enumerate(outputs.items()):
        f = program(select)
        jitted = jax.jit(f)
        vmapped = jax.jit(jax.vmap(f)) if vmap and i == 0 else None
        jax.block_until_ready(jitted(*good))
        for match, bad, guarded in cases:
            if guarded is not None and name not in guarded:
                continue
            _raises(jitted, bad, match)
            if vmapped is not None:
                _raises(vmapped, _batch(good, bad), match)


# ----------------------------------------------------------------------- master equation
CIM_A = jnp.array([[[-1.0, 1.0], [2.0, -2.0]]])
CIM_B = jnp.array([[[-0.5, 0.5], [1.0, -1.0]], [[-3.0, 3.0], [0.2, -0.2]]])


def _model(cim_a):
    return jc.CTBN(cims=[cim_a, CIM_B], parents=[(), (0,)], names=("A", "B"))


def _intervention(states, scale):
    iv = jc.Intervention(targets=jnp.array([False, True]), states=states)
    return iv.with_rate_scales([scale, jnp.ones(())])


GOOD = (CIM_A, jnp.array([0, 0]), jnp.asarray(1.0), jnp.asarray(1.0), jnp.array([0, 1]))
NEG_RATE = CIM_A.at[0, 0, 1].set(-1.0)
NAN_RATE = CIM_A.at[0, 1, 0].set(jnp.nan)


def _bad(**changes):
    names = ("cim_a", "s0", "horizon", "scale", "states")
    return tuple(changes.get(n, g) for n, g in zip(names, GOOD))


SOLVE_OUTPUTS = ("dwell_times", "final_marginal", "node_transitions")
ALL_OUTPUTS = SOLVE_OUTPUTS + ("model",)
ES_CASES = [
    ("negative off-diagonal rates", _bad(cim_a=NEG_RATE), ALL_OUTPUTS),
    ("cims['A']: conditional intensity matrices contain NaN", _bad(cim_a=NAN_RATE), ALL_OUTPUTS),
    ("cims under the intervention['A']", _bad(scale=jnp.asarray(-1.0)), ALL_OUTPUTS),
    (
        "initial_state: node states must be in 0..k-1; node 'A'",
        _bad(s0=jnp.array([2, 0])),
        SOLVE_OUTPUTS,
    ),
    (
        "intervention: clamped state of node 'B' must be in 0..1",
        _bad(states=jnp.array([0, 2])),
        SOLVE_OUTPUTS,
    ),
    ("horizon: must be a positive finite", _bad(horizon=jnp.asarray(-1.0)), SOLVE_OUTPUTS),
    ("horizon: must be a positive finite", _bad(horizon=jnp.asarray(jnp.nan)), SOLVE_OUTPUTS),
]
ES_SELECT = {
    "dwell_times": lambda r: r.dwell_times,
    "final_marginal": lambda r: r.final_marginal,
    # derived statistics: projected from the dwell times and the generator's rates
    "node_transitions": lambda r: r.node_transitions("A", ("B",)),
    "model": lambda r: r.model.cims[0],
}


def test_expected_statistics_checks_guard_every_output():
    """Rates (model and intervened model), initial state, clamped states and horizon."""

    def program(select):
        def f(cim_a, s0, horizon, scale, states):
            iv = _intervention(states, scale)
            return select(jc.expected_statistics(_model(cim_a), s0, horizon, intervention=iv))

        return f

    _check_outputs(program, ES_SELECT, GOOD, ES_CASES)


def test_expected_statistics_batch_checks_guard_every_output():
    """The batched entry point is vmapped already: one bad member of the batch must raise."""

    def program(select):
        def f(cim_a, s0, scale, states):
            models = jax.vmap(_model)(cim_a)
            ivs = jax.vmap(_intervention)(states, scale)
            return select(jc.expected_statistics_batch(models, s0, 1.0, interventions=ivs))

        return f

    def drop_horizon(args):
        return args[:2] + args[3:]

    good = drop_horizon(GOOD)
    cases = [
        (match, _batch(good, drop_horizon(bad)), guarded)
        for match, bad, guarded in ES_CASES
        if not match.startswith("horizon")
    ]
    # the same checks as the unbatched route (tested output by output above), through the
    # batched solve
    select = {"dwell_times": ES_SELECT["dwell_times"]}
    _check_outputs(program, select, _batch(good, good), cases, vmap=False)


def test_marginals_checks_guard_every_output():
    def program(select):
        def f(cim_a, s0, times, states):
            iv = jc.Intervention(targets=jnp.array([False, True]), states=states)
            return select(jc.marginals(_model(cim_a), s0, times, intervention=iv))

        return f

    times = jnp.array([0.5, 1.0])
    good = (CIM_A, jnp.array([0, 0]), times, jnp.array([0, 1]))
    cases = [
        ("negative off-diagonal rates", (NEG_RATE,) + good[1:], None),
        (
            "initial_state: node states must be in 0..k-1; node 'A'",
            (CIM_A, jnp.array([5, 0]), times, good[3]),
            None,
        ),
        (
            "times: must be finite, >= 0 and non-decreasing",
            (CIM_A, good[1], jnp.array([1.0, 0.5]), good[3]),
            None,
        ),
        (
            "intervention: clamped state of node 'B' must be in 0..1",
            good[:3] + (jnp.array([0, -1]),),
            None,
        ),
    ]
    select = {"marginals": lambda r: r[0], "dwell": lambda r: r[1]}
    _check_outputs(program, select, good, cases)


def test_initial_distribution_checks_guard_every_output():
    """The public `initial_distribution` (its one output carries every check), and a float
    distribution that does not sum to 1 through the solve."""

    def p0(s0, states):
        iv = jc.Intervention(targets=jnp.array([False, True]), states=states)
        return initial_distribution(_model(CIM_A), s0, iv)

    good = (jnp.array([0, 0]), jnp.array([0, 1]))
    cases = [
        (
            "initial_state: node states must be in 0..k-1; node 'A'",
            (jnp.array([2, 0]), good[1]),
            None,
        ),
        (
            "intervention: clamped state of node 'B' must be in 0..1",
            (good[0], jnp.array([0, 3])),
            None,
        ),
    ]
    _check_outputs(lambda select: p0, {"p0": None}, good, cases)
    message = "initial distribution: probabilities must be finite, non-negative and sum to 1"
    dist = jax.jit(lambda p: initial_distribution(_model(CIM_A), p))
    _raises(dist, (jnp.full((4,), 0.5),), message)
    solve = jax.jit(lambda p: jc.expected_statistics(_model(CIM_A), p, 1.0).dwell_times)
    jax.block_until_ready(solve(jnp.full((4,), 0.25)))
    _raises(solve, (jnp.full((4,), 0.5),), message)


# ----------------------------------------------------------------------- path statistics
def _trajectories(initial, states, times, num_events, durations, truncated):
    R = initial.shape[0]
    return Trajectories(
        initial_states=initial,
        jump_times=times,
        states=states,
        num_events=num_events,
        durations=durations,
        truncated=truncated,
        intervention_targets=jnp.zeros((R, 2), bool),
        intervention_states=jnp.zeros((R, 2), jnp.int32),
    )


# two trajectories of two binary nodes, two jump slots each
T_GOOD = (
    jnp.array([[0, 0], [1, 0]]),
    jnp.array([[[1, 0], [1, 1]], [[1, 1], [1, 1]]]),
    jnp.array([[1.0, 2.0], [0.5, 3.0]]),
    jnp.array([2, 1]),
    jnp.array([3.0, 3.0]),
    jnp.array([False, False]),
)


def _t_bad(index, value):
    return T_GOOD[:index] + (value,) + T_GOOD[index + 1 :]


BAD_STATE = _t_bad(1, T_GOOD[1].at[0, 1, 1].set(2))  # node 1 in state 2 after a real jump
TRUNCATED = _t_bad(5, jnp.array([True, False]))
BAD_TIMES = _t_bad(2, jnp.array([[2.0, 1.0], [0.5, 3.0]]))
T_CASES = [
    ("trajectories: states of node 1 must be in 0..1", BAD_STATE, None),
    ("trajectories: states of node 0 must be in 0..1", _t_bad(0, T_GOOD[0].at[1, 0].set(-1)), None),
    ("truncated because max_events was too small", TRUNCATED, None),
    ("trajectories: num_events must be in 0..2", _t_bad(3, jnp.array([3, 1])), None),
    ("trajectories: durations must be finite and >= 0", _t_bad(4, jnp.array([3.0, jnp.nan])), None),
    ("jump times of real events must be finite, non-decreasing", BAD_TIMES, None),
]


def test_sufficient_statistics_checks_guard_every_output():
    """The array route: hand-built trajectories, states >= k, truncation, bad times."""
    outputs = {
        "dwell_times": lambda s: s.nodes[1].dwell_times,
        "transitions": lambda s: s.nodes[0].transitions,
        "targets": lambda s: s.intervention_targets,
    }

    def program(select):
        def f(*arrays):
            t = _trajectories(*arrays)
            return select(jc.SufficientStatistics.from_trajectories(t, (2, 2), ((), (0,))))

        return f

    _check_outputs(program, outputs, T_GOOD, T_CASES)


def test_node_statistics_checks_guard_every_output():
    outputs = {"transitions": lambda s: s.transitions, "dwell_times": lambda s: s.dwell_times}

    def program(select):
        def f(*arrays):
            t = jax.tree_util.tree_map(lambda x: x[0], _trajectories(*arrays))
            return select(node_statistics(t, 1, (0,), (2, 2)))

        return f

    cases = [
        ("trajectories: states of node 1 must be in 0..1", BAD_STATE, None),
        ("truncated because max_events was too small", TRUNCATED, None),
    ]
    _check_outputs(program, outputs, T_GOOD, cases)


def test_learn_structure_checks_guard_every_output():
    outputs = {
        "scores": lambda p: p.log_marginal_likelihoods[0],
        "dwell_times": lambda p: p.statistics.dwell_times[1],
    }

    def program(select):
        def f(*arrays):
            t = _trajectories(*arrays)
            return select(jc.learn_structure(t, ("A", "B"), (2, 2), max_parents=1))

        return f

    cases = [
        ("trajectories: states of node 'B' must be in 0..1", BAD_STATE, None),
        ("truncated because max_events was too small", TRUNCATED, None),
    ]
    _check_outputs(program, outputs, T_GOOD, cases)


def test_family_statistics_scatter_checks_guard_every_output():
    outputs = {"transitions": lambda s: s.transitions[1], "dwell_times": lambda s: s.dwell_times[0]}
    sets = candidate_parent_sets(2, 1)

    def program(select):
        def f(*arrays):
            t = _trajectories(*arrays)
            return select(jc.internal.family_statistics(t, (2, 2), sets, method="scatter"))

        return f

    cases = [
        ("trajectories: states of node 1 must be in 0..1", BAD_STATE, None),
        ("jump times of real events", BAD_TIMES, None),
    ]
    _check_outputs(program, outputs, T_GOOD, cases)


# ----------------------------------------------------------------------- posteriors
def _family(T0, M1):
    """Family statistics of two binary nodes with max_parents=1 (sets: {}, {other})."""
    sets = candidate_parent_sets(2, 1)
    return jc.internal.FamilyStatistics(
        transitions=(jnp.ones((2, 2, 2, 2)), M1),
        dwell_times=(T0, jnp.ones((2, 2, 2))),
        parent_sets=sets,
        cardinalities=(2, 2),
    )


S_GOOD = (jnp.ones((2, 2, 2)), jnp.ones((2, 2, 2, 2)))
S_CASES = [
    ("statistics: dwell times must be finite and >= 0", (-S_GOOD[0], S_GOOD[1]), None),
    (
        "statistics: transition counts must be finite and >= 0",
        (S_GOOD[0], S_GOOD[1].at[0, 0, 0, 1].set(jnp.nan)),
        None,
    ),
]


def test_structure_posterior_statistics_checks_guard_every_output():
    """`score_parent_sets`, `StructurePosterior.from_statistics` and `.update`."""
    outputs = {
        "score_parent_sets": lambda T0, M1: score_parent_sets(_family(T0, M1))[1],
        "stored_statistics": lambda T0, M1: jc.StructurePosterior.from_statistics(
            _family(T0, M1), ("A", "B")
        ).statistics.dwell_times[1],
        "update": lambda T0, M1: (
            jc.StructurePosterior.from_prior(("A", "B"), (2, 2), max_parents=1)
            .update(_family(T0, M1))
            .edge_marginals()
        ),
        "update_statistics": lambda T0, M1: (
            jc.StructurePosterior.from_prior(("A", "B"), (2, 2), max_parents=1)
            .update(_family(T0, M1))
            .statistics.transitions[0]
        ),
    }
    _check_outputs(lambda select: select, outputs, S_GOOD, S_CASES)


def test_edge_prior_check_guards_every_output():
    outputs = {"log_prior": lambda p: p.log_prior[0]}  # the check's only output

    def program(select):
        def f(edge_prior):
            post = jc.StructurePosterior.from_statistics(
                _family(*S_GOOD), ("A", "B"), edge_prior=edge_prior
            )
            return select(post)

        return f

    good = (jnp.full((2, 2), 0.5),)
    cases = [
        ("edge_prior: off-diagonal edge probabilities must be in (0, 1)", (jnp.ones((2, 2)),), None)
    ]
    _check_outputs(program, outputs, good, cases)


def test_rate_posterior_update_checks_guard_every_output():
    """A bad statistic of one node guards the alpha and beta of every node."""
    model = _model(CIM_A)
    # each case hits one node's one statistic; the other node and the other kind are guarded
    outputs = {"alpha0": lambda p: p.alpha[0], "beta1": lambda p: p.beta[1]}

    def program(select):
        def f(T0, M1):
            stats = [
                jc.internal.NodeStatistics(transitions=jnp.ones((1, 2, 2)), dwell_times=T0),
                jc.internal.NodeStatistics(transitions=M1, dwell_times=jnp.ones((2, 2))),
            ]
            return select(jc.RatePosterior.for_model(model).update(stats))

        return f

    good = (jnp.ones((1, 2)), jnp.ones((2, 2, 2)))
    cases = [
        ("statistics of node 'A': dwell times must be finite and >= 0", (-good[0], good[1]), None),
        (
            "statistics of node 'B': transition counts must be finite and >= 0",
            (good[0], -good[1]),
            None,
        ),
    ]
    _check_outputs(program, outputs, good, cases)


def test_traced_prior_parameters_are_checked():
    """A prior built inside jit (traced parameters) is checked where its parameters are used."""
    outputs = {
        "score0": lambda a: score_parent_sets(_family(*S_GOOD), prior=jc.GammaPrior(a, 1.0))[0],
        "score1": lambda a: score_parent_sets(_family(*S_GOOD), prior=jc.NodelmanPrior(1.0, a))[1],
    }
    good = (jnp.asarray(1.0),)
    cases = [
        ("alpha: prior parameters must be > 0", (jnp.asarray(-1.0),), ("score0",)),
        ("tau: prior parameters must be > 0", (jnp.asarray(0.0),), ("score1",)),
    ]
    _check_outputs(lambda select: select, outputs, good, cases)


def test_path_log_likelihood_checks_the_rates():
    stats = jc.SufficientStatistics.from_trajectories(_trajectories(*T_GOOD), (2, 2), ((), (0,)))

    def f(cim_a):
        return jc.path_log_likelihood(_model(cim_a), stats)

    cases = [("cims['A']: conditional intensity matrices have negative", (NEG_RATE,), None)]
    _check_outputs(lambda select: f, {"loglik": None}, (CIM_A,), cases)
