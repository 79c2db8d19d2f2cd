"""Prior knowledge about the graph (forbidden and required edges, tiers, an in-degree per node)
in structure learning: the candidate sets against a brute-force filter of every subset, the
constrained posterior against the unconstrained one renormalised over the allowed sets by hand,
structural EM on panels, and the command line's flags and their one-line errors."""

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import state_at

import jaxctbn as jc
from jaxctbn._cli.main import main
from jaxctbn._learning.candidates import candidate_parent_sets

jax.config.update("jax_enable_x64", True)

NAMES = ("A", "B", "C", "D")
# a temporal order: A first, then B and C, then D
TIERS = (0, 1, 1, 2)
FORBIDDEN = [(2, 1)]  # C -> B
REQUIRED = [(0, 3)]  # A -> D
MAX_PARENTS = (1, 2, 2, 3)
KNOWLEDGE = dict(tiers=TIERS, forbidden=FORBIDDEN, required=REQUIRED, max_parents=MAX_PARENTS)
# the same, as the learners take it
LEARNER_KNOWLEDGE = dict(
    max_parents=MAX_PARENTS,
    knowledge=jc.PriorKnowledge(required_edges=REQUIRED, forbidden_edges=FORBIDDEN, tiers=TIERS),
)


def _allowed(n, parents, *, tiers, forbidden, required, max_parents):
    """Whether a parent set of node `n` keeps the knowledge (the brute-force rule)."""
    return (
        len(parents) <= max_parents[n]
        and all(tiers[p] <= tiers[n] for p in parents)
        and not any((p, n) in forbidden for p in parents)
        and all(a in parents for a, b in required if b == n)
    )


def test_candidate_sets_are_the_allowed_subsets():
    sets = candidate_parent_sets(
        4, MAX_PARENTS, required_edges=REQUIRED, forbidden_edges=FORBIDDEN, tiers=TIERS
    )
    assert all(s.shape[-1] == 3 for s in sets)  # padded to the largest in-degree
    for n in range(4):
        got = {tuple(int(p) for p in row if p >= 0) for row in np.asarray(sets[n])}
        others = [m for m in range(4) if m != n]
        expected = {
            c
            for size in range(4)
            for c in itertools.combinations(others, size)
            if _allowed(n, c, **KNOWLEDGE)
        }
        assert got == expected, n
    assert {tuple(r[r >= 0]) for r in np.asarray(sets[0])} == {()}  # A: first tier, alone
    with pytest.raises(ValueError, match=r"required edge \(3, 0\): node 3 is in a later tier"):
        candidate_parent_sets(4, 2, required_edges=[(3, 0)], tiers=TIERS)
    with pytest.raises(ValueError, match="tiers: expected one integer tier per node"):
        candidate_parent_sets(4, 2, tiers=(0, 1))
    with pytest.raises(ValueError, match="max_parents: expected an integer or one integer"):
        candidate_parent_sets(4, (1, 2))
    with pytest.raises(ValueError, match="max_parents must be between 0 and 3"):
        candidate_parent_sets(4, (1, 2, 4, 0))


@pytest.fixture(scope="module")
def paths():
    truth = jc.experiments.scaled_softmax_ctbn(
        ((), (0,), (1,), (2,)), (2, 2, 2, 2), rate_fast=2.0, names=NAMES
    )
    starts = jax.random.bernoulli(jax.random.key(2), 0.5, (40, 4)).astype(jnp.int32)
    traj = jc.sample_trajectories(
        truth, starts, 5.0, key=jax.random.key(3), num_trajectories=40, max_events=128
    )
    assert not np.any(traj.truncated)
    return truth, traj


def test_constrained_posterior_is_the_renormalised_unconstrained_one(paths):
    _, traj = paths
    free = jc.learn_structure(traj, NAMES, (2,) * 4, max_parents=3)
    post = jc.learn_structure(traj, NAMES, (2,) * 4, **LEARNER_KNOWLEDGE)
    edges = np.zeros((4, 4))
    for n in range(4):
        sets = [tuple(int(p) for p in r if p >= 0) for r in np.asarray(free.parent_sets[n])]
        scores = np.asarray(free.log_posterior()[n])
        keep = np.asarray([_allowed(n, s, **KNOWLEDGE) for s in sets])
        expected = np.exp(scores[keep] - np.logaddexp.reduce(scores[keep]))
        got_sets = [tuple(int(p) for p in r if p >= 0) for r in np.asarray(post.parent_sets[n])]
        assert got_sets == [s for s, k in zip(sets, keep) if k]
        np.testing.assert_allclose(post.parent_set_probabilities()[n], expected, rtol=1e-10)
        for s, p in zip(got_sets, expected):
            for m in s:
                edges[m, n] += p
    np.testing.assert_allclose(post.edge_marginals(), edges, atol=1e-12)
    marginals = np.asarray(post.edge_marginals())
    assert marginals[2, 1] == 0 and marginals[0, 3] == pytest.approx(1.0)
    tiers = np.asarray(TIERS)
    assert np.all(marginals[tiers[:, None] > tiers[None, :]] == 0)
    graph = post.map_graph()
    assert 0 in graph[3] and 2 not in graph[1] and graph[0] == ()


def test_structural_em_on_panels_keeps_the_knowledge(paths):
    _, traj = paths
    grid = np.linspace(0.0, 5.0, 6)
    states = np.stack([state_at(traj, t) for t in grid], axis=1)
    panel = jc.panel.PanelObservations(np.broadcast_to(grid, (len(states), len(grid))), states)
    fit = jc.panel.learn_structure_from_panels(
        panel, NAMES, (2,) * 4, **LEARNER_KNOWLEDGE, max_iterations=3
    )
    for n in range(4):
        for row in np.asarray(fit.posterior.parent_sets[n]):
            assert _allowed(n, tuple(int(p) for p in row if p >= 0), **KNOWLEDGE)
    assert all(_allowed(n, fit.posterior.map_graph()[n], **KNOWLEDGE) for n in range(4))


def test_cli_learn_with_knowledge(paths, tmp_path, capsys):
    truth, _ = paths
    net = tmp_path / "truth.json"
    truth.to_json(net)
    data = tmp_path / "paths.csv"
    sample = ["sample", "--network", str(net), "--trajectories", "30", "--duration", "5"]
    assert main([*sample, "--seed", "0", "--out", str(data)]) == 0
    out = tmp_path / "learned.json"
    learn = ["learn", "--data", str(data), "--out", str(out)]
    knowledge = ["--forbid", "C->B", "--require", "A->D", "--tiers", "A;B,C;D"]
    knowledge += ["--edge-prior", "0.2,B->D=0.7,C->D=0.6"]
    assert main([*learn, *knowledge, "--max-parents", "2,A=1,D=3"]) == 0
    res = json.loads(out.read_text())
    assert res["prior"]["forbidden"] == [["C", "B"]] and res["prior"]["required"] == [["A", "D"]]
    assert res["prior"]["edge_prior"] == {
        "default": 0.2,
        "edges": {"B->D": 0.7, "C->D": 0.6},
        "given": "0.2,B->D=0.7,C->D=0.6",
    }
    # the library's posterior with the same knowledge and edge probabilities
    pi = np.full((4, 4), 0.2)
    pi[1, 3], pi[2, 3] = 0.7, 0.6
    traj, _ = jc.Trajectories.read_csv(data, truth)
    ref = jc.learn_structure(
        traj, NAMES, (2,) * 4, max_parents=MAX_PARENTS,
        knowledge=jc.PriorKnowledge(
            required_edges=REQUIRED, forbidden_edges=FORBIDDEN, tiers=TIERS, edge_prior=pi
        ),
    )  # fmt: skip
    for n, name in enumerate(NAMES):
        got = [s["posterior"] for s in res["nodes"][name]["parent_sets"]]
        np.testing.assert_allclose(got, ref.parent_set_probabilities()[n], rtol=1e-9)
    assert res["prior"]["tiers"] == {"A": 0, "B": 1, "C": 1, "D": 2}
    assert res["prior"]["max_parents"] == {"A": 1, "B": 2, "C": 2, "D": 3}
    assert res["nodes"]["B"]["edge_marginals"]["C"] == 0.0
    assert res["nodes"]["D"]["edge_marginals"]["A"] == pytest.approx(1.0)
    for name, node in res["nodes"].items():
        for s in node["parent_sets"]:
            n = NAMES.index(name)
            parents = tuple(NAMES.index(p) for p in s["parents"])
            assert _allowed(
                n, parents, tiers=TIERS, forbidden=FORBIDDEN, required=REQUIRED,
                max_parents=(1, 2, 2, 3),
            )  # fmt: skip
    assert res["search"] == "exhaustive"  # (auto: few candidate sets)
    # the default structure prior is the edge prior 1/N (printed and written); 'uniform' is
    # the library's default (no edge prior); 1/N can head a list of edges
    for flags, pi, given in (
        ([], np.full((4, 4), 0.25), "1/N (the default)"),
        (["--edge-prior", "uniform"], None, None),
        (["--edge-prior", "1/N,A->B=0.6"], np.full((4, 4), 0.25), "1/N,A->B=0.6"),
    ):
        if given == "1/N,A->B=0.6":
            pi[0, 1] = 0.6
        capsys.readouterr()
        assert main([*learn, "--max-parents", "2", *flags]) == 0
        other = json.loads(out.read_text())
        printed = capsys.readouterr().out
        ref = jc.learn_structure(
            traj, NAMES, (2,) * 4, max_parents=2, knowledge=jc.PriorKnowledge(edge_prior=pi)
        )
        for n, name in enumerate(NAMES):
            got = [s["posterior"] for s in other["nodes"][name]["parent_sets"]]
            np.testing.assert_allclose(got, ref.parent_set_probabilities()[n], rtol=1e-9)
        if pi is None:
            assert other["prior"]["edge_prior"] is None
            assert "structure prior: uniform over the candidate parent sets" in printed
        else:
            assert other["prior"]["edge_prior"]["given"] == given
            assert other["prior"]["edge_prior"]["default"] == 0.25
            assert f"structure prior: edge probability {given} = 0.25" in printed
    # the search finds the same MAP graph, with the knowledge
    climbed = tmp_path / "climbed.json"
    climb = ["--search", "hill-climbing", "--restarts", "1", "--seed", "3", "--candidates", "2"]
    climb += ["--tabu", "2"]
    climb += ["--out", str(climbed)]
    assert main([*learn[:-2], *knowledge, "--max-parents", "2,A=1,D=3", *climb]) == 0
    found = json.loads(climbed.read_text())
    assert found["search"] == "hill-climbing" and found["map_graph"] == res["map_graph"]
    assert found["nodes"]["B"]["edge_marginals"]["C"] == 0.0
    # and CTPC's pruning, with the knowledge
    pruned = tmp_path / "pruned.json"
    ctpc = ["--search", "ctpc", "--significance", "0.2", "--out", str(pruned)]
    assert main([*learn[:-2], *knowledge, "--max-parents", "2,A=1,D=3", *ctpc]) == 0
    found = json.loads(pruned.read_text())
    assert found["search"] == "ctpc" and found["nodes"]["B"]["edge_marginals"]["C"] == 0.0
    assert found["nodes"]["D"]["edge_marginals"]["A"] == pytest.approx(1.0)
    capsys.readouterr()
    for extra, message in [
        (["--restarts", "2"], "--restarts: only with --search hill-climbing"),
        (["--candidates", "2"], "--candidates: only with --search hill-climbing"),
        (["--tabu", "2"], "--tabu: only with --search hill-climbing"),
        (["--search", "hill-climbing", "--tabu", "-1"], "--tabu: must be"),
        (["--search", "hill-climbing", "--candidates", "0"], "--candidates: must be"),
        (["--search", "bfs"], "argument --search: invalid choice"),
        (["--significance", "0.1"], "--significance: only with --search ctpc"),
        (["--search", "ctpc", "--significance", "1"], "--significance: must be in (0, 1)"),
        (["--forbid", "C->Z"], "--forbid: unknown node 'Z' in 'C->Z'"),
        (["--forbid", "C-B"], "--forbid: expected edges PARENT->CHILD"),
        (["--require", "B->B"], "--require: 'B->B' is a self-loop"),
        (["--require", "A->D", "--forbid", "A->D"], "--require: A->D is also in --forbid"),
        (["--require", "D->A", "--tiers", "A;B,C;D"], "--require: D->A goes from a later tier"),
        (["--tiers", "A;B;C"], "--tiers: node(s) ['D'] in no tier"),
        (["--tiers", "A;B,A;C,D"], "--tiers: node 'A' is in more than one tier"),
        (["--max-parents", "1,Q=2"], "--max-parents: unknown node 'Q'"),
        (["--max-parents", "x"], "--max-parents: expected K or K,NODE=K"),
        (["--require", "A->D,B->D", "--max-parents", "1"], "node 'D' has 2 required parents"),
        (["--edge-prior", "1"], "--edge-prior: P must be a probability in (0, 1), got '1'"),
        (["--edge-prior", "0.1,A->B=0"], "--edge-prior: A->B must be a probability in (0, 1)"),
        (["--edge-prior", "0.1,A->B"], "--edge-prior: expected PARENT->CHILD=Q, got 'A->B'"),
        (["--edge-prior", "0.1,A->Z=0.5"], "--edge-prior: unknown node 'Z'"),
        (["--edge-prior", "A->B=0.5"], "--edge-prior: expected P or P,PARENT->CHILD=Q"),
        (["--edge-prior", "0.1,A->B=0.2,A->B=0.3"], "--edge-prior: A->B is given twice"),
        (["--edge-prior", "1/N,1/N"], "--edge-prior: expected PARENT->CHILD=Q, got '1/N'"),
        (["--edge-prior", "uniform,A->B=0.6"], "'uniform' (no edge prior) takes no edges"),
        (["--edge-prior", "2/N"], "P must be a probability in (0, 1), got '2/N' (P may be 1/N"),
    ]:
        assert main([*learn, *extra]) == 2, extra
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (extra, lines)
