"""The benchmarks' shared entry: paths, command line, environment, timing and result files.

Every script under `benchmarks/<layer>/` starts with

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from _common import ...

(`benchmarks/` on the path; the scripts are run from the repository root as `python
benchmarks/<layer>/bench_x.py`) and takes from here:

- paths: `BENCHMARKS` (this folder), `ROOT` (the repository), `RESULTS` (`benchmarks/results/`,
  or `$JAXCTBN_BENCH_RESULTS`), `MSM_DIR`, `STAN_DIR`, and `use_layer` to import another layer's
  script (`use_layer("learning")`, then `from bench_graph_search import ...`);
- the command line: `argument_parser(__doc__, quick=..., name=..., ...)`, an
  `argparse.ArgumentParser` with the flags the benchmarks share (`--quick`, `--name`, `--seed`,
  `--repetitions`, `--experiments`, `--chunk`; each script keeps its own defaults) to which the
  script adds its own flags;
- the environment: `environment()` (platform, CPU count, jax version, device, x64, date);
- timing: `timeit` (best of `repeat`, each at least `min_time` s of calls), `timings` (the same
  runs, with their min and median), `repeat_time` (one call timed `repeats` times: min and
  median), `stopwatch` (one timed block, or a span: `sw.elapsed`), `compile_time` (compilation
  alone). Scripts time through these, never with `time.perf_counter()` by hand;
- results: `write_results(name, payload, table_lines)` writes `RESULTS/<name>.json` and
  `RESULTS/<name>.md` (the table, then the machine and date) and prints the table; `fmt` formats
  seconds; `measure_process` runs a whole process (wall time, peak RSS)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar, cast

import jax
import jax.numpy as jnp
import numpy as np

#: `benchmarks/`, the repository, and the peers' folders.
BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCHMARKS)
MSM_DIR = os.path.join(BENCHMARKS, "msm")
STAN_DIR = os.path.join(BENCHMARKS, "stan")
#: The layers (folders) of the benchmark scripts.
LAYERS = ("master_equation", "paths", "learning", "criteria", "panel", "active_learning", "cli")

RESULTS = os.environ.get("JAXCTBN_BENCH_RESULTS", os.path.join(BENCHMARKS, "results"))


def use_layer(*layers: str) -> None:
    """Put `benchmarks/<layer>/` on `sys.path`, to import a script of another layer."""
    for layer in layers:
        if layer not in LAYERS:
            raise ValueError(f"unknown benchmark layer {layer!r}; one of {LAYERS}")
        path = os.path.join(BENCHMARKS, layer)
        if path not in sys.path:
            sys.path.insert(0, path)


def _description(doc: str | None) -> str | None:
    """The first paragraph of a docstring, on one line."""
    if not doc:
        return None
    return " ".join(doc.strip().split("\n\n")[0].split())


def _common_flag(ap: argparse.ArgumentParser, flag: str, value) -> None:
    if flag == "quick":
        help = value if isinstance(value, str) else "a small smoke run"
        ap.add_argument("--quick", action="store_true", help=help)
    elif flag == "name":
        ap.add_argument("--name", default=value, help="results file stem (default %(default)s)")
    elif flag == "seed":
        ap.add_argument("--seed", type=int, default=value, help="random seed (default %(default)s)")
    elif flag == "repetitions":
        ap.add_argument(
            "--repetitions", type=int, default=value, help="repetitions (default %(default)s)"
        )
    elif flag == "experiments":
        ap.add_argument(
            "--experiments",
            type=int,
            default=value,
            help="experiments per repetition (default %(default)s)",
        )
    elif flag == "chunk":
        ap.add_argument(
            "--chunk",
            type=int,
            default=value,
            help="repetitions per compiled call (default %(default)s)",
        )
    else:
        raise TypeError(f"no shared benchmark flag {flag!r}; one of {COMMON_FLAGS}")


#: The flags `argument_parser` and `BenchmarkParser.add_common` know.
COMMON_FLAGS = ("quick", "name", "seed", "repetitions", "experiments", "chunk")


class BenchmarkParser(argparse.ArgumentParser):
    """An `ArgumentParser` that also adds the benchmarks' shared flags (`add_common`)."""

    def add_common(self, **flags) -> BenchmarkParser:
        """Add shared flags, in the order given, each with the script's default:

        - `quick=True` (or its help, a string): `--quick`, a small smoke run;
        - `name="stem"`: `--name`, the results file stem (`results/<stem>.json`, `.md`);
        - `seed=0`: `--seed`; `repetitions=R`: `--repetitions`; `experiments=E`: `--experiments`;
          `chunk=C`: `--chunk`, repetitions per compiled call."""
        for flag, value in flags.items():
            if flag == "quick" and not value:
                continue
            _common_flag(self, flag, value)
        return self


def argument_parser(doc: str | None = None, **flags) -> BenchmarkParser:
    """The benchmarks' command line: a `BenchmarkParser` described by the first paragraph of
    `doc` (the script's docstring), with the shared `flags` (see `BenchmarkParser.add_common`)
    added in the order given. The script adds its own flags (`add_argument`; `add_common` for
    more shared ones after its own, which keeps the order of `vars(args)`) and calls
    `parse_args()`. A script without flags of its own still takes `--help`."""
    return BenchmarkParser(description=_description(doc)).add_common(**flags)


T = TypeVar("T")


def block(x):
    return jax.tree_util.tree_map(
        lambda a: a.block_until_ready() if hasattr(a, "block_until_ready") else a, x
    )


@dataclass
class Timing:
    """Seconds of repeated runs of one thing: `times`, their `min` and `median`."""

    times: list[float] = field(default_factory=list)

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    def as_dict(self) -> dict:
        return {"min_s": self.min, "median_s": self.median, "repeats": len(self.times)}


def timings(fn, *args, repeat=5, min_time=0.2) -> Timing:
    """Per-call wall time of `fn(*args)` (blocked until ready) in each of `repeat` repeats, each
    repeat at least `min_time` s of calls: `.min` (what `timeit` returns) and `.median`."""
    out = Timing()
    for _ in range(repeat):
        n, t0 = 0, time.perf_counter()
        while True:
            block(fn(*args))
            n += 1
            el = time.perf_counter() - t0
            if el >= min_time:
                break
        out.times.append(el / n)
    return out


def timeit(fn, *args, repeat=5, min_time=0.2):
    """Best-of-`repeat` wall time of `fn(*args)` (each repeat at least `min_time` s of calls)."""
    return timings(fn, *args, repeat=repeat, min_time=min_time).min


def repeat_time(fn: Callable[..., T], *args, repeats: int = 1) -> tuple[T, Timing]:
    """`fn(*args)` called `repeats` times, each call timed alone (blocked until ready): the last
    result and the `Timing` (min, median). One repeat (the default) is one timed call."""
    out, result = Timing(), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = block(fn(*args))
        out.times.append(time.perf_counter() - t0)
    return cast(T, result), out


class stopwatch:
    """`with stopwatch() as sw: ...` times the block (wall clock); `sw.seconds` after it. Nothing
    is blocked: block the block's results inside it where they are asynchronous. A stopwatch also
    runs from its creation: `sw = stopwatch()`, then `sw.elapsed` (seconds so far) times a span
    that is not one block (a whole run, with progress lines on the way)."""

    seconds: float

    def __init__(self):
        self._t0 = time.perf_counter()

    @property
    def elapsed(self) -> float:
        """Seconds since the start (creation, or entering the `with` block)."""
        return time.perf_counter() - self._t0

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self._t0
        return False


def compile_time(jitted, *args):
    t0 = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    return time.perf_counter() - t0, compiled


def machine_rates(dtype=jnp.float64):
    """Measured dense matmul rate (FLOP/s) and streaming bandwidth (bytes/s) on this device."""
    n = 1024
    a = jnp.ones((n, n), dtype)
    mm = jax.jit(lambda x: x @ x)
    block(mm(a))
    t = timeit(mm, a, repeat=5)
    flops = 2 * n**3 / t
    m = 1 << 24  # 16M elements, well beyond cache
    x = jnp.ones((m,), dtype)
    y = jnp.ones((m,), dtype)
    axpy = jax.jit(lambda x, y: 1.5 * x + y)
    block(axpy(x, y))
    t = timeit(axpy, x, y, repeat=5)
    bandwidth = 3 * m * x.dtype.itemsize / t  # read x, y; write result
    return flops, bandwidth


def environment():
    return {
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "device": str(jax.devices()[0]),
        "x64": bool(jax.config.jax_enable_x64),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def write_results(name, payload, table_lines):
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"{name}.json"), "w") as f:
        json.dump(payload, f, indent=1, default=float)
    device = jax.devices()[0]
    table_lines = [
        *table_lines,
        "",
        f"Run on {device.device_kind} ({jax.default_backend()}, {os.cpu_count()} CPU cores), "
        f"jax {jax.__version__}, {time.strftime('%Y-%m-%d')}.",
    ]
    with open(os.path.join(RESULTS, f"{name}.md"), "w") as f:
        f.write("\n".join(table_lines) + "\n")
    print("\n".join(table_lines))


def fmt(t):
    if t is None or (isinstance(t, float) and not np.isfinite(t)):
        return "–"
    if t < 1e-3:
        return f"{t * 1e6:.0f} µs"
    if t < 1:
        return f"{t * 1e3:.1f} ms"
    return f"{t:.2f} s"


TIME = "/usr/bin/time"  # GNU time (Debian package `time`)


def measure_process(cmd, *, timeout=None, env=None):
    """Run `cmd` as its own process; returns `stdout`, `stderr`, `wall_s`, `peak_rss_bytes` (the
    process's maximum resident set) and `rss_source`. Under GNU `time -v` when it exists ("time
    -v": exact up to the ~2 MB of `time` itself); otherwise ("wait4") `ru_maxrss` of the child,
    an upper bound only (Linux carries the spawning Python process's RSS across the exec).
    Raises `subprocess.CalledProcessError` on failure, `subprocess.TimeoutExpired` after
    `timeout` seconds (the whole process group is killed). `env`: the command's environment
    (default: this process's)."""
    import re
    import signal
    import subprocess
    import tempfile

    use_time = os.path.isfile(TIME) and os.access(TIME, os.X_OK)
    full = [TIME, "-v", *cmd] if use_time else list(cmd)
    # output to files (a pipe could fill up while we block in wait4); own process group so a
    # timeout kills the command too, not only `time`
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(full, stdout=out, stderr=err, start_new_session=True, env=env)
        deadline = None if timeout is None else t0 + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, 0 if deadline is None else os.WNOHANG)
            if pid:
                break
            if deadline is not None and time.perf_counter() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                os.wait4(proc.pid, 0)
                proc.returncode = -signal.SIGKILL
                raise subprocess.TimeoutExpired(cmd, timeout)
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd, stdout, stderr)
    if use_time:
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr)
        if m is None:
            raise RuntimeError(f"no peak RSS in the output of {TIME} -v:\n{stderr}")
        rss, source = int(m.group(1)) * 1024, "time -v"
        cpu = {
            key: float(v.group(1))
            for key, label in (("user_s", "User"), ("sys_s", "System"))
            if (v := re.search(label + r" time \(seconds\): ([0-9.]+)", stderr))
        }
    else:  # ru_maxrss: KiB on Linux, bytes on macOS
        rss = usage.ru_maxrss * (1 if os.uname().sysname == "Darwin" else 1024)
        source = "wait4"
        cpu = {"user_s": usage.ru_utime, "sys_s": usage.ru_stime}
    return {
        "stdout": stdout,
        "stderr": stderr,
        "wall_s": wall,
        "peak_rss_bytes": rss,
        "rss_source": source,
        **cpu,
    }
