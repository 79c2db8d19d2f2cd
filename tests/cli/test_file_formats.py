"""Which tool's format a file is in (`jaxctbn/_cli/file_formats.py`, issue 64): the peers' own
files (`tests/model/peer_files/`) and jaxctbn's, by their content; a file of no known format is a
one-line error listing what each format looks like."""

import os
import shutil

import jax
import pytest
from helpers import peer_file, peer_format_network, peer_format_paths

from jaxctbn._cli.file_formats import network_format, trajectory_format

jax.config.update("jax_enable_x64", True)


@pytest.fixture(scope="module")
def network():
    return peer_format_network()


@pytest.fixture(scope="module")
def paths(network):
    return peer_format_paths(network)


def test_detect_formats(tmp_path, network, paths):
    assert trajectory_format(peer_file("pyagrum_trajectories.csv")) == "pyagrum"
    assert trajectory_format(peer_file("causal_hub_trajectory_0.csv")) == "causal-hub"
    assert trajectory_format(peer_file("pyctbn_network_and_samples.json")) == "pyctbn"
    paths.write_csv(tmp_path / "ours.csv", network)
    assert trajectory_format(tmp_path / "ours.csv") == "jaxctbn"
    assert network_format(peer_file("causal_hub_eating.json")) == "causal-hub"
    assert network_format(peer_file("pyctbn_network_and_samples.json")) == "pyctbn"
    assert network_format(peer_file("pyagrum_network.json")) == "jaxctbn"
    (tmp_path / "odd.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match=r"odd.csv'?: unknown format; expected one of \(jaxctbn: "):
        trajectory_format(tmp_path / "odd.csv")
    (tmp_path / "odd.json").write_text('{"x": 1}')
    with pytest.raises(ValueError, match=r"odd.json'?: unknown format"):
        network_format(tmp_path / "odd.json")


def test_a_directory_of_frames_is_causal_hubs(tmp_path):
    """causal-hub's trajectories on disk: a directory of one CSV per frame, read in the order of
    their names with numbers compared as numbers; a directory holding another CSV is refused
    with the file's name."""
    from jaxctbn._cli.file_formats import causal_hub_files

    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(3):
        shutil.copy(peer_file(f"causal_hub_trajectory_{i}.csv"), folder / f"t_{10**i}.csv")
    (folder / "README.txt").write_text("not a frame")
    assert trajectory_format(folder) == "causal-hub"
    assert [os.path.basename(f) for f in causal_hub_files(folder)] == [
        "t_1.csv",
        "t_10.csv",
        "t_100.csv",
    ]
    shutil.copy(peer_file("pyagrum_trajectories.csv"), folder / "t_2.csv")
    with pytest.raises(ValueError, match=r"'t_2.csv' is not a causal-hub trajectory frame"):
        trajectory_format(folder)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty' holds no CSV file"):
        trajectory_format(tmp_path / "empty")
