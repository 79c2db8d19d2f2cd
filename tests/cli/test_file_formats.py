"""Which tool's format a file is in (`jaxctbn/_cli/file_formats.py`, issue 64): the peers' own
files (`tests/model/peer_files/`) and jaxctbn's, by their content; a file of no known format is a
one-line error listing what each format looks like."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import sample_trajectories_jit as sample

import jaxctbn as jc
from jaxctbn._cli.file_formats import network_format, trajectory_format

jax.config.update("jax_enable_x64", True)

#: The peers' files, in one place for the network, trajectory and command-line tests.
DATA = os.path.join(os.path.dirname(__file__), os.pardir, "model", "peer_files")


def data(name: str) -> str:
    return os.path.join(DATA, name)


@pytest.fixture(scope="module")
def network():
    """Three nodes, cardinalities 2, 3, 2; C's parents listed out of name order (B, A)."""
    rng = np.random.default_rng(0)
    cims = [rng.uniform(0.3, 2.0, (c, k, k)) for c, k in ((1, 2), (2, 3), (6, 2))]
    return jc.CTBN(cims=cims, parents={"A": [], "B": ["A"], "C": ["B", "A"]}, names=("A", "B", "C"))


@pytest.fixture(scope="module")
def paths(network):
    return sample(
        network,
        jnp.array([0, 1, 0]),
        3.0,
        key=jax.random.PRNGKey(1),
        num_trajectories=4,
        max_events=64,
    )


def test_detect_formats(tmp_path, network, paths):
    assert trajectory_format(data("pyagrum_trajectories.csv")) == "pyagrum"
    assert trajectory_format(data("causal_hub_trajectory_0.csv")) == "causal-hub"
    assert trajectory_format(data("pyctbn_network_and_samples.json")) == "pyctbn"
    paths.write_csv(tmp_path / "ours.csv", network)
    assert trajectory_format(tmp_path / "ours.csv") == "jaxctbn"
    assert network_format(data("causal_hub_eating.json")) == "causal-hub"
    assert network_format(data("pyctbn_network_and_samples.json")) == "pyctbn"
    assert network_format(data("pyagrum_network.json")) == "jaxctbn"
    (tmp_path / "odd.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match=r"odd.csv'?: unknown format; expected one of \(jaxctbn: "):
        trajectory_format(tmp_path / "odd.csv")
    (tmp_path / "odd.json").write_text('{"x": 1}')
    with pytest.raises(ValueError, match=r"odd.json'?: unknown format"):
        network_format(tmp_path / "odd.json")
