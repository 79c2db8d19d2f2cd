"""A network as a networkx graph and a batch of interventions as a pandas table, against the
model's own fields (`parents`, `cardinalities`, `Intervention.as_dict`); the one-line error of
a missing package."""

import sys

import jax.numpy as jnp
import numpy as np
import pytest

import jaxctbn as jc

#: A cycle A -> B -> A and a ternary node C with both as parents.
MODEL = jc.CTBN(
    cims=[
        jnp.array([[[-1.0, 1.0], [2.0, -2.0]]] * 2),
        jnp.array([[[-1.0, 1.0], [2.0, -2.0]]] * 2),
        jnp.tile(jnp.array([[-2.0, 1.0, 1.0], [1.0, -2.0, 1.0], [1.0, 1.0, -2.0]]), (4, 1, 1)),
    ],
    parents={"A": ["B"], "B": ["A"], "C": ["A", "B"]},
    names=("A", "B", "C"),
)


def test_ctbn_as_networkx_graph():
    graph = MODEL.to_networkx()
    assert list(graph.nodes(data="cardinality")) == [("A", 2), ("B", 2), ("C", 3)]
    expected = {(MODEL.names[p], MODEL.names[n]) for n, ps in enumerate(MODEL.parents) for p in ps}
    assert set(graph.edges) == expected == {("B", "A"), ("A", "B"), ("A", "C"), ("B", "C")}
    assert [sorted(graph.predecessors(name)) for name in MODEL.names] == [
        sorted(MODEL.names[p] for p in ps) for ps in MODEL.parents
    ]
    lonely = jc.CTBN(cims=[jnp.array([[[-1.0, 1.0], [1.0, -1.0]]])], parents=[()], names=["X"])
    assert list(lonely.to_networkx().nodes) == ["X"] and not lonely.to_networkx().edges


def test_interventions_as_a_table():
    space = jc.intervention_space(MODEL.cardinalities)
    frame = space.to_frame(MODEL.names)
    assert list(frame.columns) == ["intervention"] and len(frame) == 3 * 3 * 4
    for i, label in enumerate(frame["intervention"]):
        one = jc.Intervention(targets=space.targets[i], states=space.states[i])
        clamps = one.as_dict(MODEL)
        assert label == (";".join(f"{k}={v}" for k, v in clamps.items()) or "none")
    assert frame["intervention"].iloc[-1] == "A=1;B=1;C=2"
    ranking = frame.assign(score=np.arange(36.0))  # scores join as a column
    assert ranking.loc[ranking.score.idxmax(), "intervention"] == "A=1;B=1;C=2"
    with pytest.raises(ValueError, match="names: need 3 node names, got 2"):
        space.to_frame(["A", "B"])
    with pytest.raises(ValueError, match="expected a batch of interventions"):
        jc.Intervention.none(3).to_frame(MODEL.names)


def test_a_missing_package_is_one_line(monkeypatch):
    for package, call in (
        ("networkx", MODEL.to_networkx),
        ("pandas", lambda: jc.intervention_space((2, 2)).to_frame(["A", "B"])),
    ):
        with monkeypatch.context() as patch:
            patch.setitem(sys.modules, package, None)
            with pytest.raises(ImportError) as error:
                call()
        message = str(error.value)
        assert message.endswith(f"needs {package}: pip install {package}") and "\n" not in message
