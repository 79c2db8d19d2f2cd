"""The memory of a design request, bounded before anything runs: each scoring program of `design`
is compiled first, XLA's own account of its buffers (arguments, outputs and temporaries) is
compared with the memory budget (`JAXCTBN_MEMORY_BUDGET`, default 4 GiB, as for structure
learning), and a program over the budget is run over chunks of the candidates (the criteria
score every candidate with the same posterior draws and paths, so the numbers are the same) or,
where even one candidate is too large or the request cannot be split, refused with one line
naming what is large and the flags that bound it."""

from __future__ import annotations

import math

#: the flags that size a design's scoring programs, named in the refusal
SIZE_FLAGS = "--samples (posterior draws), --paths (the EIG's paths) or --visits"


def _rows(tree, index):
    import jax
    import numpy as np

    return jax.tree_util.tree_map(lambda a: a[np.asarray(index)], tree)


def _with_keywords(fn):
    """`fn` called as `fn(args, keywords)`: the keywords (criterion, key, settings) become
    arguments of the exported program, part of its key like every other argument."""

    def call(args, keywords):
        return fn(*args, **keywords)

    return call


def within_memory(what: str, fn, posterior, candidates, *args, splittable=True, **kwargs):
    """`fn(posterior, candidates, *args, **kwargs)` (an `eqx.filter_jit` function whose outputs
    all have one row per candidate) within the memory budget: compiled once and run whole when
    XLA's account fits; otherwise over chunks of the candidates, the largest that fits (one
    compiled program, the last chunk padded by repeating its last candidate), outputs
    concatenated; `splittable=False` (a batch, whose members interact) or a single candidate
    over the budget: a one-line `ValueError`. `what` names the request in the message."""
    import jax
    import numpy as np

    from .._learning.memory import compiled_bytes, format_bytes, memory_budget_bytes
    from .exported import compiled_route

    budget = memory_budget_bytes()
    # a warm call: the program exported before, loaded and compiled without tracing
    route = compiled_route(what, _with_keywords(fn), (posterior, candidates, *args), kwargs)
    if route is not None and compiled_bytes(route.compiled) <= budget:
        return route()
    compiled = fn.lower(posterior, candidates, *args, **kwargs).compile()
    needed = compiled_bytes(compiled)
    if needed <= budget:
        return compiled(posterior, candidates, *args, **kwargs)
    C = int(jax.tree_util.tree_leaves(candidates)[0].shape[0])

    def refuse(size, scope):
        raise ValueError(
            f"{what}: needs about {format_bytes(size)} {scope}, more than the memory budget of "
            f"{format_bytes(budget)}; lower {SIZE_FLAGS}, or raise the budget with "
            "JAXCTBN_MEMORY_BUDGET (e.g. JAXCTBN_MEMORY_BUDGET=16G) if the machine has the memory."
        )

    if not splittable or C == 1:
        refuse(needed, "for one candidate" if splittable else "for the whole batch")
    chunk = max(1, min(C - 1, math.floor(C * budget / needed)))
    while True:
        part = _rows(candidates, np.arange(chunk))
        compiled = fn.lower(posterior, part, *args, **kwargs).compile()
        part_needed = compiled_bytes(compiled)
        if part_needed <= budget:
            break
        if chunk == 1:
            refuse(part_needed, "for one candidate")
        # memory grows about linearly with the candidates: the next guess from this one
        chunk = max(1, min(chunk - 1, math.floor(chunk * budget / part_needed)))
    import sys

    print(
        f"note: {what}: about {format_bytes(needed)} for all {C} candidates at once, more than "
        f"the memory budget of {format_bytes(budget)}; scoring them {chunk} at a time (about "
        f"{format_bytes(part_needed)} each; JAXCTBN_MEMORY_BUDGET raises the budget).",
        file=sys.stderr,
    )
    outputs = []
    for start in range(0, C, chunk):
        index = np.minimum(np.arange(start, start + chunk), C - 1)
        out = compiled(posterior, _rows(candidates, index), *args, **kwargs)
        keep = min(chunk, C - start)
        outputs.append(jax.tree_util.tree_map(lambda a, k=keep: np.asarray(a)[:k], out))
    return jax.tree_util.tree_map(lambda *parts: np.concatenate(parts), *outputs)
