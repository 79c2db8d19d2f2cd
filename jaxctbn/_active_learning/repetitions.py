"""Repetitions of the active-learning loop as one compiled computation: vmapped or chunked over
keys within the memory budget, with the failing repetitions told apart
([`jaxctbn.run_repetitions`][])."""

from __future__ import annotations

import dataclasses
import math

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Key, UInt32

from .._batching import AbstractBatching, Chunked, Sharded, Vmap
from .._criteria.costs import AbstractRanking, ByScore, Costs
from .._errors import error_message
from .._model.interventions import Intervention
from .._paths.sampling import check_count
from .designs import AbstractDesign
from .initial_states import PAPER_INITIAL_STATE, AbstractInitialStatePolicy
from .loop import (
    ActiveLearningResult,
    check_batches,
    resolve_max_events,
    run_active_learning,
)
from .tasks import AbstractLearningTask


def _one_repetition(
    task, design, num_experiments, horizon, candidates, max_events, policy, rounds, key
):
    batch_size, costs, budget, ranking = rounds
    return run_active_learning(
        task,
        design,
        key=key,
        num_experiments=num_experiments,
        horizon=horizon,
        candidates=candidates,
        max_events=max_events,
        initial_state_policy=policy,
        batch_size=batch_size,
        costs=costs,
        budget=budget,
        ranking=ranking,
    )


@eqx.filter_jit
def _map_batch(batching, fn, keys):
    return batching.map(fn, keys)


def _run_batch(batching, task, design, keys, *settings):
    # `fn` is a pytree (the task's arrays are traced), so every batch reuses one program
    fn = eqx.Partial(_one_repetition, task, design, *settings)
    if isinstance(batching, Sharded):
        # Called from the host, Sharded compiles its own program without communication between
        # devices, so a failing repetition raises instead of stalling the other devices.
        return batching.map(fn, keys)
    return _map_batch(batching, fn, keys)


@dataclasses.dataclass(frozen=True)
class RepetitionStatus:
    """Which repetitions of a [`jaxctbn.run_repetitions`][] batch failed, and why (host-side).

    - `ok[r]`: whether repetition `r` finished;
    - `messages[r]`: the first line of its error (`""` when it finished). Rerun
      `run_active_learning(..., key=keys[r])` to see the whole error.
    """

    ok: np.ndarray
    messages: tuple[str, ...]

    @property
    def num_failed(self) -> int:
        return int((~self.ok).sum())


def _failed_like(shapes) -> ActiveLearningResult:
    """A result with the structure of `shapes` (from `eqx.filter_eval_shape`) with NaN in every
    float, False in every boolean and -1 in every integer array."""

    def fill(a):
        if not isinstance(a, jax.ShapeDtypeStruct):
            return a
        if np.issubdtype(a.dtype, np.inexact):
            return np.full(a.shape, np.nan, a.dtype)
        if np.issubdtype(a.dtype, np.bool_):
            return np.zeros(a.shape, a.dtype)
        return np.full(a.shape, -1, a.dtype)

    return jax.tree_util.tree_map(fill, shapes)


def _repetition_settings(
    task,
    keys,
    *,
    num_experiments: int,
    horizon: ArrayLike = 3.0,
    candidates: Intervention | None = None,
    max_events: int | None = None,
    initial_state_policy: AbstractInitialStatePolicy = PAPER_INITIAL_STATE,
    batch_size: int = 1,
    costs: Costs | None = None,
    budget: ArrayLike | None = None,
    ranking: AbstractRanking = ByScore(),
) -> tuple:
    """The checked settings every repetition of a batch shares (after the keys); the defaults
    are [`jaxctbn.run_repetitions`][]'s. A concrete horizon is checked here, before anything is
    compiled (a traced one inside the loop)."""
    check_count(num_experiments, "num_experiments")
    if not isinstance(horizon, jax.core.Tracer) and np.ndim(horizon) == 0:
        value = float(np.asarray(horizon))
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"horizon: must be positive and finite, got {value}.")
    max_events = resolve_max_events(task, horizon, max_events)
    if jnp.ndim(keys) < 1 or jnp.shape(keys)[0] == 0:
        raise ValueError(
            f"keys: need one key per repetition (a batch of at least one), got shape "
            f"{jnp.shape(keys)}."
        )
    # a Python-float horizon made an array: traced, not baked into the compiled batch
    check_batches(batch_size, num_experiments, costs, budget, ranking)
    rounds = (
        batch_size,
        costs,
        None if budget is None else jnp.asarray(budget, jnp.result_type(float)),
        ranking,
    )
    return (
        num_experiments,
        jnp.asarray(horizon),
        candidates,
        max_events,
        initial_state_policy,
        rounds,
    )


#: what sizes one repetition's program, named when even one repetition is over the budget
_REPETITION_SIZES = (
    "lower the design's num_samples or num_paths, the panel outcome's visits, "
    "num_experiments or max_events (jaxctbn run: --samples, --paths, --visits, --experiments, "
    "--max-events)"
)


def _batching_within_memory(task, design, keys, settings) -> AbstractBatching:
    """All repetitions in one vmap when XLA's account of that program (arguments, outputs and
    temporaries) fits the memory budget (`JAXCTBN_MEMORY_BUDGET`, default 4 GiB); otherwise
    [`jaxctbn.Chunked`][] of the largest size that fits, with a warning (each repetition depends
    on its key only, so the numbers are the same); a `ValueError` naming what to lower when one
    repetition does not fit. The compiled program is cached: the batch then runs it."""
    import warnings

    from .._learning.memory import compiled_bytes, format_bytes, memory_budget_bytes

    budget = memory_budget_bytes()
    fn = eqx.Partial(_one_repetition, task, design, *settings)
    num = int(jnp.shape(keys)[0])
    needed = compiled_bytes(_map_batch.lower(Vmap(), fn, keys).compile())
    if needed <= budget:
        return Vmap()

    def refuse(size):
        raise ValueError(
            f"run_repetitions: one repetition needs about {format_bytes(size)}, more than the "
            f"memory budget of {format_bytes(budget)}; {_REPETITION_SIZES}, or raise the budget "
            "with JAXCTBN_MEMORY_BUDGET (e.g. JAXCTBN_MEMORY_BUDGET=16G) if the machine has "
            "the memory."
        )

    if num == 1:
        refuse(needed)
    size, part = num, needed
    while True:
        # memory grows about linearly with the repetitions at once: the next guess from this one
        size = max(1, min(size - 1, math.floor(size * budget / part)))
        part = compiled_bytes(_map_batch.lower(Chunked(size), fn, keys).compile())
        if part <= budget:
            break
        if size == 1:
            refuse(part)
    warnings.warn(
        f"run_repetitions: about {format_bytes(needed)} for all {num} repetitions at once, "
        f"more than the memory budget of {format_bytes(budget)}; running them {size} at a time "
        f"(about {format_bytes(part)}; JAXCTBN_MEMORY_BUDGET raises the budget).",
        RuntimeWarning,
        stacklevel=3,
    )
    return Chunked(size)


def batching_within_memory(
    task: AbstractLearningTask,
    design: AbstractDesign,
    keys: Key[Array, " repetitions"] | UInt32[Array, "repetitions 2"],
    **settings,
) -> AbstractBatching:
    """The batching [`jaxctbn.run_repetitions`][] uses by default for these repetitions
    (`settings`: its keyword arguments, `batching` and `throw` excepted): one vmap when it fits
    the memory budget, else the largest [`jaxctbn.Chunked`][] that does; a `ValueError` before
    anything runs when one repetition does not fit. The compiled program is cached, so running
    the batch afterwards does not compile it again."""
    design = design.observing(task.outcome)
    return _batching_within_memory(task, design, keys, _repetition_settings(task, keys, **settings))


def run_repetitions(
    task: AbstractLearningTask,
    design: AbstractDesign,
    keys: Key[Array, " repetitions"] | UInt32[Array, "repetitions 2"],
    *,
    num_experiments: int,
    horizon: ArrayLike = 3.0,
    candidates: Intervention | None = None,
    max_events: int | None = None,
    initial_state_policy: AbstractInitialStatePolicy = PAPER_INITIAL_STATE,
    throw: bool = True,
    batching: AbstractBatching | None = None,
    batch_size: int = 1,
    costs: Costs | None = None,
    budget: ArrayLike | None = None,
    ranking: AbstractRanking = ByScore(),
) -> ActiveLearningResult | tuple[ActiveLearningResult, RepetitionStatus]:
    """[`jaxctbn.run_active_learning`][] vmapped over a batch of keys (one per repetition), as
    one compiled computation. Every result field gets a leading repetition axis.

    With `throw=True` (default) an error in any repetition (an overflowing path buffer, a
    non-finite rate, ...) raises, as everywhere in jaxctbn. With `throw=False` one failing
    repetition does not abort the batch: returns `(result, status)`, a
    [`jaxctbn.experiments.RepetitionStatus`][] saying which repetitions failed and why; a failed
    repetition's fields are NaN (floats) or -1 (integers). The batch runs as one compiled call;
    only when it fails are its repetitions rerun one at a time (one more compilation) to tell
    the failing ones from the others, so a clean batch costs nothing extra.

    `max_events=None` sizes the jump buffer from the truth's exit rates and `horizon` (see
    [`jaxctbn.run_active_learning`][]); `initial_state_policy` as there.

    `batching` says how the repetitions are executed: `None` (default), all in one vmap when XLA's
    account of that program fits the memory budget (`JAXCTBN_MEMORY_BUDGET`, default 4 GiB),
    else [`jaxctbn.Chunked`][] of the largest size that fits (a `RuntimeWarning` says so; a
    `ValueError` naming what to lower when one repetition does not fit); [`jaxctbn.Vmap`][],
    all in one vmap, unchecked; [`jaxctbn.Chunked`][], a few at a time; [`jaxctbn.Sharded`][], split across
    devices. Each repetition depends on its key only, so every choice gives the same results
    (up to rounding). With `throw=False` the reruns of a failed batch run one at a time on one
    device. `batch_size`, `costs`, `budget` and `ranking`: as for
    [`jaxctbn.run_active_learning`][]."""
    design = design.observing(task.outcome)
    if batching is not None and not isinstance(batching, AbstractBatching):
        raise ValueError(
            f"batching: expected Vmap(), Chunked(size) or Sharded(...), got {batching!r}."
        )
    settings = _repetition_settings(
        task,
        keys,
        num_experiments=num_experiments,
        horizon=horizon,
        candidates=candidates,
        max_events=max_events,
        initial_state_policy=initial_state_policy,
        batch_size=batch_size,
        costs=costs,
        budget=budget,
        ranking=ranking,
    )
    if batching is None:
        batching = _batching_within_memory(task, design, keys, settings)
    if throw:
        return _run_batch(batching, task, design, keys, *settings)
    num = int(jnp.shape(keys)[0])
    try:
        result = _run_batch(batching, task, design, keys, *settings)
        jax.block_until_ready(result)
        return result, RepetitionStatus(ok=np.ones(num, bool), messages=("",) * num)
    except (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError):
        pass
    singles, messages = [], []
    for r in range(num):
        try:
            one = _run_batch(Vmap(), task, design, keys[r : r + 1], *settings)
            singles.append(jax.device_get(one))
            messages.append("")
        except (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError) as error:
            singles.append(None)
            messages.append(error_message(error))
    fn = eqx.Partial(_one_repetition, task, design, *settings)
    filler = _failed_like(eqx.filter_eval_shape(_map_batch, Vmap(), fn, keys[:1]))
    result = jax.tree_util.tree_map(
        lambda *xs: np.concatenate(xs), *[filler if x is None else x for x in singles]
    )
    ok = np.array([m == "" for m in messages])
    return result, RepetitionStatus(ok=ok, messages=tuple(messages))
