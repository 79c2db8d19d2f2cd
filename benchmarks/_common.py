"""Shared helpers for the benchmark scripts: timing, machine rates, result files."""

from __future__ import annotations

import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

RESULTS = os.environ.get(
    "JAXCTBN_BENCH_RESULTS", os.path.join(os.path.dirname(__file__), "results")
)


def block(x):
    return jax.tree_util.tree_map(
        lambda a: a.block_until_ready() if hasattr(a, "block_until_ready") else a, x
    )


def timeit(fn, *args, repeat=5, min_time=0.2):
    """Best-of-`repeat` wall time of `fn(*args)` (each repeat at least `min_time` s of calls)."""
    best = float("inf")
    for _ in range(repeat):
        n, t0 = 0, time.perf_counter()
        while True:
            block(fn(*args))
            n += 1
            el = time.perf_counter() - t0
            if el >= min_time:
                break
        best = min(best, el / n)
    return best


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
