"""`jaxctbn convert`: networks and trajectories between jaxctbn's files and those of pyAgrum,
causal-hub and PyCTBN. What IN holds (a network, trajectories, or both in a PyCTBN file) is read
from its content; everything is read and converted before anything is written."""

from __future__ import annotations

import os
import shutil
from typing import Any

from .inputs import (
    NO_PYAGRUM_NETWORK,
    TITLES,
    Network,
    Paths,
    long_format,
    read_network,
    read_trajectories,
)


def _contents(path: str, given: str) -> tuple[str, set[str], str]:
    """IN's format, what it holds (`{"network", "trajectories"}`) and how the format was found
    (`"detected"`, `"given"`): by content, where exactly one format fits; `--from` chooses
    among several and is refused where the content shows another."""
    import json

    from .file_formats import NETWORK_FORMATS, TRAJECTORY_FORMATS, network_format, trajectory_format

    if not os.path.exists(path):
        raise ValueError(f"IN: {path!r} does not exist.")
    if os.path.isdir(path):  # causal-hub's trajectories, or what the directory lacks
        try:
            trajectory_format(path)
        except ValueError as e:
            raise ValueError(f"IN: {e}") from None
    found: dict[str, set[str]] = {}
    ambiguous = None
    for kind, detect in (("network", network_format), ("trajectories", trajectory_format)):
        try:
            found.setdefault(detect(path), set()).add(kind)
        except ValueError as e:
            if "ambiguous" in str(e):
                ambiguous = str(e)
    if "pyctbn" in found:  # PyCTBN's keys say what its first data set holds
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        first = data[0] if isinstance(data, list) else data
        if not first.get("samples"):
            found["pyctbn"].discard("trajectories")
        if not found["pyctbn"]:
            found.pop("pyctbn")
            if given in (None, "auto"):
                raise ValueError(
                    f"IN: PyCTBN file {path!r} holds neither rates ('dyn.cims') nor samples in "
                    "its first data set; nothing to convert."
                )
    if given not in (None, "auto"):
        if given in found:
            return given, found[given], "given"
        if found:
            other, kinds = next(iter(found.items()))
            raise ValueError(
                f"--from {given}: {path!r} is {TITLES[other]}'s {' and '.join(sorted(kinds))} by "
                f"its content; give --from {other}, or leave --from out to detect it."
            )
        return given, {_kind_of(path, given)}, "given"
    if len(found) > 1:
        shown = " and as ".join(
            f"{TITLES[f]}'s {' and '.join(sorted(k))}" for f, k in found.items()
        )
        raise ValueError(f"IN: {path!r} is ambiguous: it reads as {shown}; give --from FORMAT.")
    if not found:
        if ambiguous is not None:
            raise ValueError(f"IN: {ambiguous.rstrip('.')}; give --from FORMAT.")
        raise ValueError(
            f"IN: {path!r}: unknown format; a network is one of ({NETWORK_FORMATS}); "
            f"trajectories are one of ({TRAJECTORY_FORMATS})."
        )
    ((fmt, kinds),) = found.items()
    return fmt, kinds, "detected"


def _kind_of(path: str, fmt: str) -> str:
    """What a file that fits no format is read as under `--from fmt` (its reader then says what
    is wrong): a JSON document in a format with network files is a network."""
    if fmt in ("pyagrum", "pyctbn") or os.path.isdir(path):
        return "trajectories"
    with open(path, "rb") as f:
        start = f.read(256).lstrip(b"\xef\xbb\xbf \t\r\n")
    return "network" if start[:1] in (b"{", b"[") else "trajectories"


def _check_directory(path: str) -> None:
    """causal-hub's trajectories go to a directory that is new, empty, or holds only an earlier
    conversion's `trajectory_<i>.csv` files (replaced as a whole)."""
    import re

    if not os.path.isdir(path):
        return
    other = [n for n in os.listdir(path) if not re.fullmatch(r"trajectory_\d+\.csv", n)]
    if other:
        raise ValueError(
            f"OUT: directory {path!r} holds other files ({sorted(other)[:3]}); give a new or "
            "empty directory for causal-hub's trajectories (one CSV per trajectory)."
        )


def _write_directory(path: str, files: dict[str, bytes]) -> None:
    """The files in a new directory `path`, which replaces any old one only once complete."""
    path = os.path.abspath(path)
    staging, old = f"{path}.{os.getpid()}.tmp", f"{path}.{os.getpid()}.old"
    try:
        os.makedirs(staging)
        for name, blob in files.items():
            with open(os.path.join(staging, name), "wb") as f:
                f.write(blob)
        if os.path.isdir(path):
            os.replace(path, old)
        try:
            os.replace(staging, path)
        except OSError:
            if os.path.isdir(old):  # the old directory back in its place
                os.replace(old, path)
            raise
    except OSError as error:
        raise OSError(error.errno, f"cannot write {path!r}: {error.strerror or error}") from None
    finally:
        for leftover in (staging, old):
            if os.path.isdir(leftover):
                shutil.rmtree(leftover, ignore_errors=True)


def write_network(network: Network, to: str, path: str) -> None:
    """The network in format `to` (jaxctbn's JSON keeps the labels under `"labels"`)."""
    if to == "jaxctbn":
        from .._files import write_json

        data = network.model.to_dict()
        if network.labels is not None:
            data["labels"] = network.labels
        write_json(path, data)
    elif to == "causal-hub":
        network.model.to_causal_hub_json(path, labels=network.labels)
    else:
        network.model.to_pyctbn_json(path)


def _trajectory_writer(paths: Paths, to: str, out: str, network: Network | None):
    """A function that writes the trajectories in format `to` (all conversion done first)."""
    import numpy as np

    from .._files import write_atomically

    targets = np.asarray(paths.trajectories.intervention_targets)
    if to != "jaxctbn" and targets.any():
        r = int(np.flatnonzero(targets.any(-1))[0])
        raise ValueError(
            f"IN: trajectory {paths.ids[r]!r} was recorded under an intervention, which "
            f"{TITLES[to]}'s format cannot hold; keep it in jaxctbn's CSV."
        )
    if to == "jaxctbn":
        blob = long_format(paths).encode()
        return lambda: write_atomically(out, lambda f: f.write(blob))
    if to == "pyagrum":
        from .._paths.pyagrum_csv import csv_rows

        csv_rows(paths.trajectories, paths.nodes)  # its checks, before anything is written
        return lambda: paths.trajectories.write_pyagrum_csv(out, paths.nodes)
    if to == "causal-hub":
        frames = paths.trajectories.to_causal_hub(paths.nodes)
        files = {
            f"trajectory_{i}.csv": f.to_csv(index=False).encode() for i, f in enumerate(frames)
        }
        return lambda: _write_directory(out, files)
    model: Any = {n: len(ls) for n, ls in paths.nodes.items()}
    if network is not None:
        model = network.model
    return lambda: paths.trajectories.write_pyctbn_json(out, model)


def _numbered(nodes: dict[str, list[str]]) -> str | None:
    """The states' numbering where the labels are not the numbers themselves."""
    from .._model.node_labels import default_labels

    if all(ls == default_labels(len(ls)) for ls in nodes.values()):
        return None
    return "; ".join(
        f"{n}: " + ", ".join(f"{i}={s}" for i, s in enumerate(ls)) for n, ls in nodes.items()
    )


def _cmd_convert(args) -> None:
    from .arguments import _check_out

    source, out, to = args.input, args.out, args.to
    fmt, kinds, how = _contents(source, args.from_format)
    lines = []
    if kinds == {"network"}:
        for flag, value in (("--network", args.network), ("--network-out", args.network_out)):
            if value is not None:
                raise ValueError(f"{flag}: only for trajectories; {source!r} holds a network.")
        if to == "pyagrum":
            raise ValueError(
                f"--to pyagrum: {source!r} is a network, and {NO_PYAGRUM_NETWORK}; convert it "
                "--to jaxctbn, causal-hub or pyctbn."
            )
        _check_out(out, "file")
        network = read_network(source, fmt, "IN")
        write_network(network, to, out)
        lines.append(
            f"read {source} ({TITLES[fmt]}'s network, {how}); wrote {TITLES[to]}'s network to {out}"
        )
        if to == "pyctbn" and network.labels is not None and _numbered(network.labels):
            lines.append(f"note: PyCTBN's states are numbers: {_numbered(network.labels)}")
        print("\n".join(lines))
        return
    if args.network_out is not None:
        if "network" not in kinds:
            raise ValueError(
                f"--network-out: {source!r} holds no network (only PyCTBN's files hold both)."
            )
        if to in ("pyagrum", "pyctbn"):
            why = "pyAgrum has no network file" if to == "pyagrum" else "OUT holds the network too"
            raise ValueError(f"--network-out: not with --to {to} ({why}).")
        _check_out(args.network_out, "file")
    given = None if args.network is None else read_network(args.network, "auto", "--network")
    own = read_network(source, fmt, "IN") if "network" in kinds else None
    network = given or own
    _check_out(out, "directory" if to == "causal-hub" else "file")
    if to == "causal-hub":
        _check_directory(out)
    paths = read_trajectories(source, fmt, None if network is None else network.nodes())
    write = _trajectory_writer(paths, to, out, network)
    write()
    if args.network_out is not None:
        assert own is not None
        write_network(own, to, args.network_out)
    what = f"{len(paths.ids)} trajectories" + (" and a network" if own is not None else "")
    written = (
        "trajectories and network" if to == "pyctbn" and network is not None else "trajectories"
    )
    lines.append(
        f"read {source} ({TITLES[fmt]}'s {what}, {how}); wrote {TITLES[to]}'s {written} to {out}"
        + (f" and its network to {args.network_out}" if args.network_out is not None else "")
    )
    if own is not None and args.network_out is None and to != "pyctbn":
        lines.append(
            f"note: IN's network was not converted: {TITLES[to]}'s trajectory files hold none"
            + ("" if to == "pyagrum" else "; add --network-out FILE to write it too")
        )
    if own is not None and given is not None and to == "pyctbn":
        lines.append("note: OUT holds the network of --network, not IN's own")
    numbering = _numbered(paths.nodes)
    if numbering is not None and to in ("jaxctbn", "pyctbn"):
        lines.append(f"note: {TITLES[to]}'s states are numbers, in the labels' order: {numbering}")
    print("\n".join(lines))
