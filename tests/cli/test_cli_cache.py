"""The command line's compilation cache when it cannot be used: the command compiles without it,
gives the same results, and says so in one warning line."""

import importlib
import json
import warnings

from jaxctbn._cli.main import main

#: the module (`jaxctbn._cli.main` is also the name of its function `main`)
cli = importlib.import_module("jaxctbn._cli.main")


def _moments(tmp_path, out_name, network_json):
    out = tmp_path / out_name
    args = ["moments", "--network", str(network_json), "--duration", "1.5"]
    rc = main([*args, "--initial-state", "A=0,B=1", "--out", str(out)])
    return rc, json.loads(out.read_text())


def test_an_unusable_cache_directory_warns_once_and_changes_no_result(
    tmp_path, monkeypatch, capsys
):
    network = tmp_path / "net.json"
    network.write_text(
        json.dumps(
            {
                "nodes": [
                    {"name": "A", "cardinality": 2, "parents": []},
                    {"name": "B", "cardinality": 2, "parents": ["A"]},
                ],
                "cims": {
                    "A": [{"parent_states": {}, "Q": [[-1, 1], [2, -2]]}],
                    "B": [
                        {"parent_states": {"A": 0}, "Q": [[-1, 1], [3, -3]]},
                        {"parent_states": {"A": 1}, "Q": [[-0.5, 0.5], [1, -1]]},
                    ],
                },
            }
        )
    )
    rc, usual = _moments(tmp_path, "usual.json", network)
    assert rc == 0
    capsys.readouterr()
    # a directory below a regular file cannot be created (the tests run as root, where a
    # read-only directory would still be writable)
    monkeypatch.setenv("JAXCTBN_CACHE_DIR", str(network / "cache"))
    rc, without = _moments(tmp_path, "without.json", network)
    assert rc == 0
    assert without == usual
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"jaxctbn: warning: compilation cache {network / 'cache'}: Not a directory; compiling "
        "every program without it (JAXCTBN_CACHE_DIR names another directory, or off)."
    ], err


def test_the_caches_failures_while_running_are_one_line(monkeypatch, capsys):
    """JAX warns once per program when a cache entry cannot be written (a full disk): the
    command shows the first, as one line, and no other; other warnings are all shown."""
    monkeypatch.setattr(cli, "_CACHE_WARNED", [])
    with warnings.catch_warnings():
        warnings.showwarning = cli._show_warning
        warnings.simplefilter("always")
        for program in ("jit_a", "jit_b", "jit_c"):
            warnings.warn(
                f"Error writing persistent compilation cache entry for '{program}': "
                "OSError: [Errno 28] No space left on device\nTraceback ...",
                stacklevel=2,
            )
        warnings.warn("something else", stacklevel=2)
    assert capsys.readouterr().err.splitlines() == [
        "jaxctbn: warning: Error writing persistent compilation cache entry for 'jit_a': "
        "OSError: [Errno 28] No space left on device (the compilation cache's further errors "
        "are not shown; results are the same)",
        "jaxctbn: warning: something else",
    ]
