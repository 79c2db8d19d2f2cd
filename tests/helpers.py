"""Independent reference implementations used only by the tests (plain numpy / scipy)."""

import itertools
import os

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

import jaxctbn as jc
from jaxctbn._paths.sampling import sample_trajectory


def brute_force_generator(model: jc.CTBN) -> np.ndarray:
    """Dense W from the definition: loop over pairs of global states differing in one node."""
    cards = model.cardinalities
    states = list(itertools.product(*(range(k) for k in cards)))
    index = {s: i for i, s in enumerate(states)}
    S = len(states)
    W = np.zeros((S, S))
    cims = [np.asarray(c) for c in model.cims]
    for s in states:
        for n, k in enumerate(cards):
            u = 0
            for p in model.parents[n]:
                u = u * cards[p] + s[p]
            for x in range(k):
                if x == s[n]:
                    continue
                t = list(s)
                t[n] = x
                W[index[s], index[tuple(t)]] += cims[n][u, s[n], x]
    W -= np.diag(W.sum(1))
    return W


def scipy_moments(W: np.ndarray, p0: np.ndarray, tau: float):
    """[p_tau, int_0^tau p_t dt] by scipy's expm of the block matrix."""
    S = W.shape[0]
    A = np.block([[W, np.eye(S)], [np.zeros((S, S)), np.zeros((S, S))]])
    z = np.concatenate([p0, np.zeros(S)]) @ scipy.linalg.expm(tau * A)
    return z[:S], z[S:]


def random_model(key, cardinalities, parents, *, scale=1.0, stiff=False):
    """Random rates; `stiff` mixes rates 1e-2 and 1e2 (ratio 1e4)."""
    cims = []
    keys = jax.random.split(key, len(cardinalities))
    for n, k in enumerate(cardinalities):
        configs = int(np.prod([cardinalities[p] for p in parents[n]]))
        r = jax.random.uniform(keys[n], (configs, k, k), minval=0.2, maxval=2.0) * scale
        if stiff:
            r = r * (1e-2 if n % 2 == 0 else 1e2)
        cims.append(r)
    return jc.CTBN(cims=cims, parents=parents)


def one_hot_state(model, state):
    p = np.zeros(model.num_global_states)
    idx = 0
    for s, k in zip(state, model.cardinalities):
        idx = idx * k + s
    p[idx] = 1.0
    return p


def state_at(paths, t):
    """States `(R, N)` of sampled paths (`jaxctbn.Trajectories`) at time t."""
    passed = (np.asarray(paths.jump_times) <= t) & (
        np.arange(paths.jump_times.shape[-1]) < np.asarray(paths.num_events)[:, None]
    )
    count = passed.sum(-1)
    after = np.asarray(paths.states)[np.arange(len(count)), np.maximum(count - 1, 0)]
    return np.where((count > 0)[:, None], after, np.asarray(paths.initial_states))


__all__ = ["brute_force_generator", "scipy_moments", "random_model", "state_at", "jnp"]


def network_dict():
    """A 2-node network JSON document (A -> B, binary), for tests that mutate one field."""
    return {
        "nodes": [
            {"name": "A", "cardinality": 2, "parents": []},
            {"name": "B", "cardinality": 2, "parents": ["A"]},
        ],
        "cims": {
            "A": [{"parent_states": {}, "Q": [[-1, 1], [2, -2]]}],
            "B": [
                {"parent_states": {"A": 0}, "Q": [[-1, 1], [2, -2]]},
                {"parent_states": {"A": 1}, "Q": [[-3, 3], [1, -1]]},
            ],
        },
    }


def flaky_design_scores(posterior, candidates, initial_state, horizon, key):
    """A `jaxctbn.CallableDesign` function whose check fails in about 30% of the design steps,
    depending on the key only (zero scores otherwise): a repetition of an active-learning loop
    that fails for reasons of its own. One function object, shared by the tests of
    `throw=False` on one device and on eight, so that they share the compiled loops."""
    scores = jnp.zeros(candidates.targets.shape[0])
    return eqx.error_if(scores, jax.random.uniform(key) < 0.3, "flaky design: failed")


def repetition_keys(seed: int, num: int):
    """The keys of repetitions 0..num-1 as `jaxctbn run --seed SEED` (and `run_experiment`)
    makes them: `fold_in(key(seed), r)`."""
    return jax.vmap(lambda r: jax.random.fold_in(jax.random.key(seed), r))(jnp.arange(num))


def structure_design_problem():
    """The structure-design problem shared by the tests of `jaxctbn design --target structure`
    and of sharded candidates (so that they compile the same programs): the chain A -> B -> C
    (binary) and 3 paths of length 2 sampled from it, all starting in state 0."""
    chain = jc.CTBN(
        cims=[
            jnp.array([[[-1.0, 1.0], [2.0, -2.0]]]),
            jnp.array([[[-0.5, 0.5], [1.0, -1.0]], [[-2.0, 2.0], [0.3, -0.3]]]),
            jnp.array([[[-0.2, 0.2], [1.5, -1.5]], [[-3.0, 3.0], [0.5, -0.5]]]),
        ],
        parents={"A": [], "B": ["A"], "C": ["B"]},
        names=("A", "B", "C"),
    )
    paths = sample_trajectories_jit(
        chain, jnp.zeros(3, jnp.int32), 2.0, key=jax.random.key(1), num_trajectories=3
    )
    return chain, paths


_sample_jit = eqx.filter_jit(jc.sample_trajectories)


def sample_trajectories_jit(model, initial_states, horizon, *, key, num_trajectories, **kwargs):
    """`jaxctbn.sample_trajectories` compiled as one program (`eqx.filter_jit`; called eagerly
    it compiles ~80 small programs, one per operation): the horizon traced, integer initial
    states as int32 (the sampler's own type: one program for lists and arrays alike). The same
    keys give the same paths."""
    initial_states = jnp.asarray(initial_states)
    if jnp.issubdtype(initial_states.dtype, jnp.integer):
        initial_states = initial_states.astype(jnp.int32)
    return _sample_jit(
        model,
        initial_states,
        jnp.asarray(horizon, float),
        key=key,
        num_trajectories=num_trajectories,
        **kwargs,
    )


def replay_experiments(truth, result, horizon, key):
    """The paths of a `jaxctbn.run_active_learning` result re-simulated from its recorded
    choices (initial states and interventions), independently of the compiled loop: each
    experiment's path sampled on its own from the key the loop gives it (one program)."""
    return eqx.filter_jit(_replay_experiments)(truth, result, horizon, key)


def _replay_experiments(truth, result, horizon, key):
    step_keys = jax.random.split(key, result.targets.shape[0])
    path_keys = jax.vmap(lambda k: jax.random.split(k, 3)[2])(step_keys)

    def one(k, s0, targets, states):
        iv = jc.Intervention(targets=targets, states=states)
        return sample_trajectory(truth, s0, horizon, key=k, intervention=iv, max_events=512)

    return jax.vmap(one)(path_keys, result.initial_states, result.targets, result.states)


def brute_force_panel_kl(model, other, initial_state, times, intervention=None) -> float:
    """KL between the laws of the state seen at `times` of two CTBNs started in the node
    states `initial_state`: the sum over every outcome sequence Y of p(Y) ln p(Y)/p'(Y), with
    scipy's expm of the dense generators of the intervened models (exponential in the number
    of visits: small cases only)."""
    import itertools

    import scipy.linalg

    if intervention is not None:
        model, other = intervention.apply(model), intervention.apply(other)
        initial_state = np.asarray(intervention.initial_states(jnp.asarray(initial_state)))
    W, V = brute_force_generator(model), brute_force_generator(other)
    s0 = int(np.ravel_multi_index(tuple(np.asarray(initial_state)), model.cardinalities))
    gaps = np.diff(np.concatenate([[0.0], np.asarray(times, float)]))
    P = [scipy.linalg.expm(h * W) for h in gaps]
    Q = [scipy.linalg.expm(h * V) for h in gaps]
    total = 0.0
    for ys in itertools.product(range(W.shape[0]), repeat=len(gaps)):
        p = q = 1.0
        prev = s0
        for k, y in enumerate(ys):
            p, q, prev = p * P[k][prev, y], q * Q[k][prev, y], y
        if p > 0:
            total += p * np.log(p / q)
    return total


def finite_difference_hessian(f, x, h=1e-3):
    """Central second differences of the scalar function `f` at `x` (error O(h^2)): the
    independent route the exact observed information is checked against."""
    import itertools

    n = len(x)
    H = np.zeros((n, n))
    for i, j in itertools.combinations_with_replacement(range(n), 2):
        e_i, e_j = h * np.eye(n)[i], h * np.eye(n)[j]
        H[i, j] = H[j, i] = (
            f(x + e_i + e_j) - f(x + e_i - e_j) - f(x - e_i + e_j) + f(x - e_i - e_j)
        ) / (4 * h * h)
    return H


def illness_death_start():
    """One node `h` with states 0, 1 and absorbing 2, every allowed rate 1 to start (0 -> 1,
    0 -> 2, 1 -> 0, 1 -> 2): the starting model of the covariate and period fits."""
    import jax.numpy as jnp

    import jaxctbn as jc

    return jc.CTBN(
        cims=[jnp.array([[[0, 1.0, 1.0], [1.0, 0, 1.0], [0, 0, 0.0]]])], parents=[()], names=("h",)
    )


#: Files written by the peers' own code (pyAgrum, causal-hub, PyCTBN; provenance in its README)
PEER_FILES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model", "peer_files")


def peer_file(name: str) -> str:
    """The path of a file in `PEER_FILES`."""
    return os.path.join(PEER_FILES, name)


def peer_format_network() -> jc.CTBN:
    """Three nodes, cardinalities 2, 3, 2; C's parents listed out of name order (B, A): the
    network of the peer-format round trips."""
    rng = np.random.default_rng(0)
    cims = [rng.uniform(0.3, 2.0, (c, k, k)) for c, k in ((1, 2), (2, 3), (6, 2))]
    return jc.CTBN(cims=cims, parents={"A": [], "B": ["A"], "C": ["B", "A"]}, names=("A", "B", "C"))


def peer_format_paths(network: jc.CTBN) -> jc.Trajectories:
    """Four trajectories of `peer_format_network()` over [0, 3], from (A, B, C) = (0, 1, 0)."""
    return sample_trajectories_jit(
        network,
        jnp.array([0, 1, 0]),
        3.0,
        key=jax.random.PRNGKey(1),
        num_trajectories=4,
        max_events=64,
    )


def pyctbn_document() -> list:
    """A small valid PyCTBN JSON document (a network X -> Y and one sample), for malformed
    variants."""
    return [
        {
            "dyn.str": [{"From": "X", "To": "Y"}],
            "variables": [{"Name": "X", "Value": 2}, {"Name": "Y", "Value": 2}],
            "dyn.cims": {
                "X": {"X": [{"0": -1.0, "1": 1.0}, {"0": 2.0, "1": -2.0}]},
                "Y": {
                    "X=0": [{"0": -1.0, "1": 1.0}, {"0": 2.0, "1": -2.0}],
                    "X=1": [[-3.0, 3.0], [4.0, -4.0]],
                },
            },
            "samples": [
                [
                    {"Time": 0, "X": 0, "Y": 0},
                    {"Time": 0.5, "X": 1, "Y": 0},
                    {"Time": 1.0, "X": -1, "Y": -1},
                ]
            ],
        }
    ]
