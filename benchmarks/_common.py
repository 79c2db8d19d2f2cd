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
