import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import network_dict, random_model

import jaxctbn as jc


def test_json_round_trip_and_extra_keys(tmp_path, getkey):
    model = random_model(getkey(), (2, 3, 2), ((2,), (0,), (1, 0)))
    model = jc.CTBN(cims=model.cims, parents=model.parents, names=("a", "b", "c"))
    path = tmp_path / "net.json"
    model.to_json(path)
    data = json.loads(path.read_text())
    assert [n["name"] for n in data["nodes"]] == ["a", "b", "c"]
    assert data["nodes"][2]["parents"] == ["b", "a"]
    # itertools.product order over the listed parents: first parent most significant
    assert [e["parent_states"] for e in data["cims"]["c"]][:3] == [
        {"b": 0, "a": 0},
        {"b": 0, "a": 1},
        {"b": 1, "a": 0},
    ]
    data["name"] = "my network"
    data["description"] = "extra keys are fine"
    data["edges"] = [["a", "b"]]
    path.write_text(json.dumps(data))
    back = jc.CTBN.from_json(path)
    assert back.parents == model.parents and back.names == model.names
    for a, b in zip(back.cims, model.cims):
        np.testing.assert_allclose(a, b, rtol=1e-15)


def test_dict_parents_by_name_and_diagonals_recomputed():
    model = jc.CTBN(
        cims=[jnp.array([[[5.0, 1.0], [2.0, 7.0]]]), jnp.ones((2, 2, 2))],
        parents={"A": [], "B": ["A"]},
        names=["A", "B"],
    )
    np.testing.assert_allclose(model.cims[0], [[[-1.0, 1.0], [2.0, -2.0]]])
    assert model.parents == ((), (0,))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(cims=[jnp.ones((1, 2, 2))], parents=[[0]]), "self-loops"),
        (dict(cims=[jnp.ones((1, 2, 2)), jnp.ones((2, 2, 2))], parents=[[], [5]]), "not a node"),
        (
            dict(cims=[jnp.ones((1, 2, 2)), jnp.ones((2, 2, 2))], parents=[[], ["Z"]]),
            "unknown parent",
        ),
        (dict(cims=[jnp.ones((1, 2, 3))], parents=[[]]), "expected shape"),
        (
            dict(cims=[jnp.ones((1, 2, 2)), jnp.ones((3, 2, 2))], parents=[[], [0]]),
            "parent configurations",
        ),
        (dict(cims=[jnp.ones((1, 1, 1))], parents=[[]]), "must be >= 2"),
        (dict(cims=[jnp.ones((1, 2, 2)), jnp.ones((4, 2, 2))], parents=[[], [0, 0]]), "duplicate"),
        (dict(cims=[jnp.ones((1, 2, 2))], parents=[[]], names=["A", "B"]), "names"),
    ],
)
def test_bad_structure_raises(kwargs, message):
    with pytest.raises(ValueError, match=message):
        jc.CTBN(**kwargs)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.pop("cims"), "missing key"),
        (lambda d: d["cims"]["B"].pop(), "must list 2 parent configurations"),
        (lambda d: d["cims"]["A"][0].update(Q=[[-1, 1], [2, -1]]), "rows must sum to 0"),
        (lambda d: d["cims"]["A"][0].update(Q=[[1, -1], [2, -2]]), "negative off-diagonal"),
        (lambda d: d["cims"]["A"][0].update(Q=[[-1, 1, 0], [2, -2, 0]]), "must be 2x2"),
        (lambda d: d["cims"]["B"][0].update(parent_states={"A": 1}), "parent_states"),
        (lambda d: d["nodes"][1].update(parents=["B"]), "self-loops"),
        (lambda d: d["nodes"][1].update(parents=["Q"]), "unknown parent"),
        (lambda d: d["cims"].update(C=[]), "unknown node names"),
        (lambda d: d["nodes"][0].update(cardinality="two"), "must be an integer"),
    ],
)
def test_bad_network_dict_raises(mutate, message):
    data = network_dict()
    mutate(data)
    with pytest.raises(ValueError, match=message):
        jc.CTBN.from_dict(data)


def test_cycles_allowed_and_padded_conversion_checks(getkey):
    model = random_model(getkey(), (2, 2, 2), ((2,), (0,), (1,)))
    assert model.parents == ((2,), (0,), (1,))
    with pytest.raises(ValueError, match="smaller than"):
        model.padded(max_parents=0)
    with pytest.raises(ValueError, match="max_parents must be between"):
        model.padded(max_parents=3)
    padded = model.padded(max_parents=2)
    assert [c.shape for c in padded.cims] == [(4, 2, 2)] * 3
    np.testing.assert_array_equal(padded.parent_index[0], [2, -1])


def test_random_generators(getkey):
    parents = jc.experiments.random_graph(getkey(), 6, max_parents=2, edge_probability=0.7)
    assert all(len(p) <= 2 and n not in p for n, p in enumerate(parents))
    again = jc.experiments.random_graph(jax.random.key(7), 6, max_parents=2)
    assert again == jc.experiments.random_graph(jax.random.key(7), 6, max_parents=2)
    with pytest.raises(ValueError, match="max_parents"):
        jc.experiments.random_graph(getkey(), 3, max_parents=3)
    # Gamma(5,1) fast and Gamma(1/5,1) slow rates: sample means and variances
    big = ((), (0, 2), ())
    model = jc.random_ctbn(jax.random.key(3), big, (2, 30, 30), fast=[True, True, False])
    fast = np.asarray(model.cims[1])[:, ~np.eye(30, dtype=bool)].ravel()
    slow = np.asarray(model.cims[2])[:, ~np.eye(30, dtype=bool)].ravel()
    for x, a in [(fast, 5.0), (slow, 0.2)]:
        z_mean = (x.mean() - a) / np.sqrt(a / x.size)
        assert abs(z_mean) < 4, (x.mean(), a)
        assert abs(x.var() / a - 1) < 0.25


def test_scaled_softmax_rates():
    model = jc.experiments.scaled_softmax_ctbn(
        ((), (0,), (0, 1)), fast=[False, True, True], gamma=3.0
    )
    s = np.exp(3.0) / (np.exp(3.0) + 1)
    # root slow node: uniform softmax over 2 states
    np.testing.assert_allclose(model.cims[0][0, 0, 1], 0.2 * 0.5)
    # node 1 with parent in state 1: jumps to 1 at rate 5*s, to 0 at 5*(1-s)
    np.testing.assert_allclose(model.cims[1][1, 0, 1], 5 * s)
    np.testing.assert_allclose(model.cims[1][1, 1, 0], 5 * (1 - s))
    # node 2, parents (0, 1) in states (1, 1): two votes for state 1
    s2 = np.exp(6.0) / (np.exp(6.0) + 1)
    np.testing.assert_allclose(model.cims[2][3, 0, 1], 5 * s2)
    np.testing.assert_allclose(model.cims[2][1, 0, 1], 5 * 0.5)


def test_paper_network():
    a = jc.paper_network(jax.random.key(0))
    b = jc.paper_network(jax.random.key(0))
    assert a.names == ("X1", "X2", "X3", "X4")
    for x, y in zip(a.cims, b.cims):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="rates must be"):
        jc.paper_network(jax.random.key(0), rates="bad")


def test_intervention_validation(getkey):
    model = random_model(getkey(), (2, 3), ((), (0,)))
    with pytest.raises(ValueError, match="must be in 0..2"):
        jc.Intervention.perfect(model, {"X1": 3})
    with pytest.raises(ValueError, match="unknown node name"):
        jc.Intervention.perfect(model, {"nope": 0})
    with pytest.raises(ValueError, match="has 3 nodes"):
        jc.Intervention.none(3).apply(model)
    iv = jc.Intervention.perfect(model, {"X1": 2})
    assert iv.as_dict(model) == {"X1": 2}


def test_single_node_interventions_are_the_members_of_the_space_with_at_most_one_target():
    cards = (2, 3, 2)
    single = jc.single_node_interventions(cards)
    full = jc.intervention_space(cards)
    assert single.targets.shape == (1 + sum(cards), 3)
    assert not bool(single.targets[0].any())  # member 0 = no intervention

    def rows(iv):
        t, s = np.asarray(iv.targets), np.asarray(iv.states)
        return {tuple(np.where(t[i], s[i], -1)) for i in range(t.shape[0])}

    keep = np.asarray(full.targets).sum(1) <= 1
    expected = {r for r in rows(full) if sum(x >= 0 for x in r) <= 1}
    assert rows(single) == expected and len(rows(single)) == int(keep.sum())


def test_a_node_traced_in_its_group_gives_each_nodes_values():
    """`per_node` over groups (a `lax.map` over each group, the node a `GroupNode`) gives what
    the node-by-node loop gives: tables built per node from static facts (`node_table`) and
    entries of per-node sequences (`node_entry`), looked up at the traced position."""
    from jaxctbn._model.node_groups import GroupNode, node_entry, node_index, node_table, per_node

    cards = (2, 3, 2, 2)
    rates = [jnp.arange(4.0 * k).reshape(4, k) + 10 * n for n, k in enumerate(cards)]

    def fn(n):
        others = node_table(n, lambda m: np.array([j for j in range(4) if j != m]))
        weighted = (jnp.asarray(cards)[others] * jnp.asarray([1, 10, 100])).sum()
        return node_entry(n, rates).sum(0) * node_index(n) + weighted

    by_node = [fn(n) for n in range(4)]
    grouped = jax.jit(lambda: per_node(fn, 4, [(0, 2, 3), (1,)]))()
    for a, b in zip(grouped, by_node, strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="group"):
        GroupNode((), jnp.asarray(0))
