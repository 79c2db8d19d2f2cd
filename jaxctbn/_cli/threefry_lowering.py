r"""How JAX compiles its random-number hash on the CPU.

Every random draw of JAX's default keys (`split`, `fold_in`, `uniform`, `normal`, ...) applies
the Threefry-2x32 hash: 20 rounds of add, rotate and xor on 32-bit words. On the CPU, JAX 0.10
lowers it as a `while` loop over five groups of four rounds (elsewhere, as straight-line code).
Each such loop is a separate program piece that XLA's CPU backend compiles on its own; the
graph and rate draws of a structure design step alone have more than a dozen of them, most of
their compile time. Upstream JAX has since changed the CPU lowering to straight-line code
(jax-ml/jax#37872: with XLA's thunk runtime the loop no longer saves compile time, and it costs
run time).

`use_unrolled_threefry_on_cpu` makes the installed JAX do the same: the same
hash, so **the same random bits** for every key, compiled faster, at about the same run time
per step (`benchmarks/active_learning/bench_active_learning.py` reports the compile and step times, with JAX's
loop under `--rolled-threefry`; results in `benchmarks/results/vbhc_run.md`).
"""

from __future__ import annotations


def use_unrolled_threefry_on_cpu() -> bool:
    r"""Compile JAX's Threefry hash on the CPU as straight-line code instead of a loop
    (what JAX does on other platforms, and what upstream JAX has since made the CPU default,
    jax-ml/jax#37872): the same random bits, compiled in less time (compile times reported by
    `benchmarks/active_learning/bench_active_learning.py`, with JAX's loop under `--rolled-threefry`; results in
    `benchmarks/results/vbhc_run.md`).

    Global and process-wide, like `jax.config.update`: it applies to every program lowered
    afterwards, jaxctbn's or not (programs already compiled keep their code). The `jaxctbn`
    command line and the benchmarks call it; call it once at the start of a script or
    notebook to get the same. Relies on a private part of JAX (checked against jax 0.10):
    returns `True` when it took effect, `False` (changing nothing) where that part is not as
    expected."""
    try:
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32 as threefry
    except ImportError:
        return False
    primitive = getattr(threefry, "threefry2x32_p", None)
    straight_line = getattr(threefry, "_threefry2x32_lowering_rule", None)
    register = getattr(mlir, "register_lowering", None)
    if primitive is None or straight_line is None or register is None:
        return False
    register(primitive, straight_line, platform="cpu")
    return True
