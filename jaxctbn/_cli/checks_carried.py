"""Checkify's pass over a program exported with checks as values (`exported._export`),
carrying the error only through the operations that hold a check."""

from __future__ import annotations

import contextlib


def _has_check(jaxpr, known: dict) -> bool:
    """Whether `jaxpr` (or any jaxpr inside it) holds a checkify check (`known`: the answers
    found so far, by jaxpr identity, each with its jaxpr kept alive so that its id stays its
    own)."""
    from jax._src import checkify as checkify_internals
    from jax._src import core

    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    if id(jaxpr) not in known:
        found = any(
            eqn.primitive is checkify_internals.check_p
            or any(_has_check(sub, known) for sub in core.jaxprs_in_params(eqn.params))
            for eqn in jaxpr.eqns
        )
        known[id(jaxpr)] = (jaxpr, found)
    return known[id(jaxpr)][1]


@contextlib.contextmanager
def checks_carried_only_where_they_are():
    """Within: checkify passes an operation that holds jaxprs (a loop, a branch, an inner
    `jit`, a custom derivative) through unchanged, bound as it was traced, when no check is
    inside it, rather than tracing every operation inside it again to carry an error that
    cannot arise there (with the user's checks only, as `_export` enables them, the program
    computes the same values). Most of a program holds no check. psor's two programs with an
    empty cache: checkify 0.57 s -> 0.12 s of the export; whole processes, paired: psor 0.92x
    (8 pairs), cav ~ sex 0.93x (5), the same output bytes. A batched while loop (a `vmap` of a
    loop, which checkify refuses) without a check is then exported too. (Private JAX names,
    checked: where they differ, nothing changes, and a program with such a loop is not
    exported.)"""
    try:
        from jax._src import checkify as checkify_internals
        from jax._src import core

        rules = checkify_internals.error_checks
        usual = dict(rules)
        core.jaxprs_in_params  # noqa: B018 (present)
    except (ImportError, AttributeError):
        yield
        return
    known: dict = {}

    def passing(primitive, rule):
        def checked(error, enabled_errors, *in_flat, **params):
            jaxprs = list(core.jaxprs_in_params(params))
            if not jaxprs or any(_has_check(j, known) for j in jaxprs):
                return rule(error, enabled_errors, *in_flat, **params)
            bind_params = primitive.get_bind_params(params)  # (as `core.eval_jaxpr` binds it)
            subfuns = ()
            if isinstance(bind_params, tuple):  # (an older JAX: its sub-functions apart)
                subfuns, bind_params = bind_params
            return error, primitive.bind(*subfuns, *in_flat, **bind_params)

        return checked

    for primitive, rule in usual.items():
        if primitive is not checkify_internals.check_p:
            rules[primitive] = passing(primitive, rule)
    try:
        yield
    finally:
        rules.clear()
        rules.update(usual)
