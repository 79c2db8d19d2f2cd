"""Sufficient statistics of cCTBN paths, and the long-format CSV / DataFrame route."""

from __future__ import annotations

import os
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from jaxtyping import Array, Bool, Float, Int

from ._ctbn import CTBN, AbstractCTBN
from ._layout import config_index, static_config_count
from ._sampling import Trajectories


class NodeStatistics(eqx.Module):
    r"""Sufficient statistics of one node under one parent set:
    `transitions` $M_n(x,x',u)$, shape `(*batch, configs, k, k)` (zero diagonal), and
    `dwell_times` $T_n(x,u)$, shape `(*batch, configs, k)`. Statistics are additive: `a + b`."""

    transitions: Float[Array, "*batch configs states states"]
    dwell_times: Float[Array, "*batch configs states"]

    def __add__(self, other: "NodeStatistics") -> "NodeStatistics":
        return NodeStatistics(
            transitions=self.transitions + other.transitions,
            dwell_times=self.dwell_times + other.dwell_times,
        )

    def sum(self, where: Bool[Array, " batch"] | None = None) -> "NodeStatistics":
        """Sum over a leading trajectory axis, optionally only where `where` is True."""
        if where is None:
            where = jnp.ones(self.dwell_times.shape[:1], bool)
        w = where.astype(self.dwell_times.dtype)
        return NodeStatistics(
            transitions=jnp.einsum("r,r...->...", w, self.transitions),
            dwell_times=jnp.einsum("r,r...->...", w, self.dwell_times),
        )


def _check_complete(trajectories: Trajectories) -> Trajectories:
    return eqx.error_if(
        trajectories,
        jnp.any(trajectories.truncated),
        "trajectories: a path was truncated because max_events was too small; resample with a "
        "larger max_events (statistics of a cut path would be wrong).",
    )


def node_statistics(
    trajectory: Trajectories,
    node: int,
    parents,
    cardinalities: tuple[int, ...],
    *,
    num_configs: int | None = None,
) -> NodeStatistics:
    r"""$M_n(x,x',u)$ and $T_n(x,u)$ of **one** trajectory for node `node` and any parent set
    (a static tuple, or an integer array padded with `-1`, then give `num_configs`).
    Use `jax.vmap` over a batch of trajectories."""
    trajectory = _check_complete(trajectory)
    k = cardinalities[node]
    if isinstance(parents, tuple | list):
        parents = tuple(int(p) for p in parents)
        if node in parents:
            raise ValueError(f"parents: node {node} cannot be its own parent.")
        configs = static_config_count(parents, cardinalities)
    else:
        if num_configs is None:
            raise ValueError("num_configs: required when parents is a padded array.")
        configs = num_configs
    seg_states = jnp.concatenate([trajectory.initial_states[None], trajectory.states])
    E = trajectory.jump_times.shape[0]
    idx = jnp.arange(E + 1)
    dtype = trajectory.jump_times.dtype
    starts = jnp.concatenate([jnp.zeros((1,), dtype), trajectory.jump_times])
    ends = jnp.concatenate([trajectory.jump_times, trajectory.durations[None]])
    ends = jnp.where(idx < trajectory.num_events, ends, trajectory.durations)
    dwell = jnp.where(idx <= trajectory.num_events, ends - starts, 0.0)
    c = config_index(seg_states, parents, cardinalities)
    x = seg_states[:, node]
    dwell_times = jax.ops.segment_sum(dwell, c * k + x, num_segments=configs * k)
    src, dst = seg_states[:-1], seg_states[1:]
    moved = (jnp.arange(E) < trajectory.num_events) & (src[:, node] != dst[:, node])
    bins = (c[:-1] * k + src[:, node]) * k + dst[:, node]
    transitions = jax.ops.segment_sum(moved.astype(dtype), bins, num_segments=configs * k * k)
    return NodeStatistics(
        transitions=transitions.reshape(configs, k, k), dwell_times=dwell_times.reshape(configs, k)
    )


class SufficientStatistics(eqx.Module):
    """Per-trajectory statistics of every node under fixed parent sets, together with the perfect
    intervention each trajectory was recorded under (for pooling across interventions).

    - `nodes[n]`: [`jaxctbn.NodeStatistics`][] with a leading trajectory axis.
    - `intervention_targets`, `intervention_states`: `(trajectories, N)`.
    """

    nodes: tuple[NodeStatistics, ...]
    intervention_targets: Bool[Array, "trajectories nodes"]
    intervention_states: Int[Array, "trajectories nodes"]
    parents: tuple[tuple[int, ...], ...] = eqx.field(static=True)
    cardinalities: tuple[int, ...] = eqx.field(static=True)

    @classmethod
    def from_trajectories(
        cls,
        trajectories: Trajectories,
        cardinalities: tuple[int, ...],
        parents: Sequence[Sequence[int]],
    ) -> "SufficientStatistics":
        """Statistics of a batch of trajectories (one leading axis) for the given parent sets."""
        parents = tuple(tuple(int(p) for p in ps) for ps in parents)
        if len(parents) != len(cardinalities):
            raise ValueError(f"parents: need one parent list per node ({len(cardinalities)}).")
        if trajectories.num_events.ndim != 1:
            raise ValueError("trajectories: expected one leading batch axis of trajectories.")
        nodes = tuple(
            jax.vmap(lambda t, n=n: node_statistics(t, n, parents[n], cardinalities))(trajectories)
            for n in range(len(cardinalities))
        )
        return cls(
            nodes=nodes,
            intervention_targets=trajectories.intervention_targets,
            intervention_states=trajectories.intervention_states,
            parents=parents,
            cardinalities=tuple(cardinalities),
        )

    def pooled(self) -> tuple[NodeStatistics, ...]:
        """Per node, the sum over trajectories in which that node was **not** perfectly
        intervened on (the pooling rule of the paper's §4)."""
        return tuple(
            stats.sum(~self.intervention_targets[:, n]) for n, stats in enumerate(self.nodes)
        )

    def total(self) -> tuple[NodeStatistics, ...]:
        """Per node, the plain sum over all trajectories."""
        return tuple(stats.sum() for stats in self.nodes)

    def concatenate(self, other: "SufficientStatistics") -> "SufficientStatistics":
        """Statistics of both sets of trajectories (keeps the per-trajectory interventions)."""
        if other.parents != self.parents or other.cardinalities != self.cardinalities:
            raise ValueError("concatenate: statistics were computed for different graphs.")
        return jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b]), self, other)


# --------------------------------------------------------------------------- DataFrame / CSV
RESERVED_COLUMNS = ("trajectory_id", "time", "intervention")


def format_intervention(targets, states, names) -> str:
    return ";".join(f"{names[n]}={int(states[n])}" for n in range(len(names)) if targets[n])


def trajectories_to_dataframe(trajectories: Trajectories, model: AbstractCTBN) -> pd.DataFrame:
    """Long format: `trajectory_id, time, <node columns>, intervention`. Each row is the state
    from that time on; the first row of a trajectory is its initial state at time 0, then one row
    per jump, and a last row at the end of observation."""
    t = jax.tree_util.tree_map(np.asarray, trajectories)
    if t.num_events.ndim == 0:
        t = jax.tree_util.tree_map(lambda a: a[None], t)
    if np.any(t.truncated):
        raise ValueError("trajectories: some paths are truncated (max_events too small).")
    ids, times, states, interventions = [], [], [], []
    for r in range(t.num_events.shape[0]):
        m = int(t.num_events[r])
        rows_t = np.concatenate([[0.0], t.jump_times[r, :m], [t.durations[r]]])
        last = t.states[r, m - 1] if m > 0 else t.initial_states[r]
        rows_s = np.concatenate([t.initial_states[r][None], t.states[r, :m], last[None]])
        ids.append(np.full(m + 2, r))
        times.append(rows_t)
        states.append(rows_s)
        label = format_intervention(
            t.intervention_targets[r], t.intervention_states[r], model.names
        )
        interventions += [label] * (m + 2)
    states = np.concatenate(states)
    df = pd.DataFrame({"trajectory_id": np.concatenate(ids), "time": np.concatenate(times)})
    for n, name in enumerate(model.names):
        df[name] = states[:, n].astype(int)
    df["intervention"] = interventions
    return df


def write_trajectories_csv(trajectories: Trajectories, model: AbstractCTBN, path) -> None:
    trajectories_to_dataframe(trajectories, model).to_csv(path, index=False)


def _parse_intervention_label(label, names, cards, tid) -> tuple[np.ndarray, np.ndarray]:
    targets = np.zeros(len(names), bool)
    states = np.zeros(len(names), np.int32)
    if label is None or (isinstance(label, float) and np.isnan(label)) or str(label).strip() == "":
        return targets, states
    for part in str(label).split(";"):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise ValueError(
                f"data: trajectory {tid!r}: intervention entry {part!r} is not NAME=STATE."
            )
        name, value = (p.strip() for p in part.split("=", 1))
        if name not in names:
            raise ValueError(f"data: trajectory {tid!r}: intervention names unknown node {name!r}.")
        n = names.index(name)
        try:
            v = int(value)
        except ValueError:
            raise ValueError(
                f"data: trajectory {tid!r}: intervention state {value!r} is not an integer."
            ) from None
        if not 0 <= v < cards[n]:
            raise ValueError(
                f"data: trajectory {tid!r}: intervention state {v} of {name!r} not in 0..{cards[n] - 1}."
            )
        targets[n], states[n] = True, v
    return targets, states


def _node_spec(model) -> tuple[list[str], tuple[int, ...]]:
    if isinstance(model, AbstractCTBN):
        return list(model.names), model.cardinalities
    if isinstance(model, dict):
        return list(model), tuple(int(k) for k in model.values())
    raise ValueError("model: expected a CTBN or a dict {node name: cardinality}.")


def infer_cardinalities(df: pd.DataFrame) -> dict[str, int]:
    """`{node: max observed state + 1 (at least 2)}` for the node columns of a long-format frame."""
    cols = [c for c in df.columns if c not in RESERVED_COLUMNS]
    if not cols:
        raise ValueError("data: no node columns besides trajectory_id, time and intervention.")
    out = {}
    for c in cols:
        values = pd.to_numeric(df[c], errors="coerce")
        if values.isna().any() or (values < 0).any() or (values != values.round()).any():
            raise ValueError(f"data: column {c!r} must hold non-negative integer states.")
        out[c] = max(2, int(values.max()) + 1)
    return out


def trajectories_from_dataframe(
    df: pd.DataFrame, model, *, dtype=None
) -> tuple[Trajectories, list]:
    """Parse the long format (see [`jaxctbn.trajectories_to_dataframe`][]).

    Rows of a trajectory are taken in file order; times must be non-decreasing, consecutive rows
    may share a time stamp (a zero-length stay). Consecutive rows may differ in at most one node
    (a CTBN changes one node at a time); identical rows are allowed and ignored. The last row of
    a trajectory marks the end of observation. `model` is a CTBN or a dict
    `{node name: cardinality}`. Returns the trajectories and their ids.
    """
    names, cards = _node_spec(model)
    for col in ("trajectory_id", "time"):
        if col not in df.columns:
            raise ValueError(
                f"data: missing column {col!r}; expected trajectory_id, time, <nodes>."
            )
    node_cols = [c for c in df.columns if c not in RESERVED_COLUMNS]
    unknown = [c for c in node_cols if c not in names]
    if unknown:
        raise ValueError(
            f"data: unknown node column(s) {unknown}; the network's nodes are {names}."
        )
    missing = [n for n in names if n not in node_cols]
    if missing:
        raise ValueError(f"data: missing node column(s) {missing}.")
    if len(df) == 0:
        raise ValueError("data: no rows.")
    values = df[names].to_numpy()
    if not np.issubdtype(values.dtype, np.number) or np.any(~np.isfinite(values.astype(float))):
        raise ValueError("data: node columns must hold integer states (no missing values).")
    if np.any(values != np.round(values)):
        raise ValueError("data: node states must be integers.")
    values = values.astype(np.int64)
    for n, name in enumerate(names):
        bad = (values[:, n] < 0) | (values[:, n] >= cards[n])
        if bad.any():
            raise ValueError(
                f"data: column {name!r} has state {values[bad, n][0]} outside 0..{cards[n] - 1}."
            )
    try:
        times = df["time"].to_numpy(dtype=float)
    except (TypeError, ValueError):
        raise ValueError("data: column 'time' must be numeric.") from None
    if np.any(~np.isfinite(times)):
        raise ValueError("data: column 'time' has missing or non-finite values.")
    labels = df["intervention"].to_numpy(dtype=object) if "intervention" in df.columns else None
    ids = df["trajectory_id"].to_numpy()
    order_ids = list(dict.fromkeys(ids.tolist()))
    groups: dict = {}
    for row, tid in enumerate(ids.tolist()):
        groups.setdefault(tid, []).append(row)
    parsed = []
    for tid in order_ids:
        rows = np.asarray(groups[tid])
        t, s = times[rows], values[rows]
        if len(rows) < 2:
            raise ValueError(
                f"data: trajectory {tid!r} has {len(rows)} row; need the initial state and an end row."
            )
        if np.any(np.diff(t) < 0):
            raise ValueError(
                f"data: trajectory {tid!r}: times must be non-decreasing in row order."
            )
        if not t[-1] > t[0]:
            raise ValueError(f"data: trajectory {tid!r} has zero observation time.")
        changes = (s[1:] != s[:-1]).sum(1)
        if np.any(changes > 1):
            i = int(np.argmax(changes > 1)) + 1
            raise ValueError(
                f"data: trajectory {tid!r}: row at time {t[i]} changes {int(changes[i - 1])} nodes "
                "at once; a CTBN changes one node at a time (split it into rows with the same time)."
            )
        label_values = (
            set()
            if labels is None
            else {
                str(v) if not (isinstance(v, float) and np.isnan(v)) else "" for v in labels[rows]
            }
        )
        if len(label_values) > 1:
            raise ValueError(f"data: trajectory {tid!r} has more than one intervention label.")
        label = label_values.pop() if label_values else ""
        targets, istates = _parse_intervention_label(label, names, cards, tid)
        clamped = np.nonzero(targets)[0]
        for n in clamped:
            if np.any(s[:, n] != istates[n]):
                raise ValueError(
                    f"data: trajectory {tid!r} was recorded under do({names[n]}={istates[n]}) but "
                    f"{names[n]!r} is not constantly {istates[n]}."
                )
        keep = np.nonzero(changes == 1)[0] + 1
        parsed.append((t[0], t[-1] - t[0], s[0], t[keep] - t[0], s[keep], targets, istates))
    E = max(1, max(len(p[3]) for p in parsed))
    R, N = len(parsed), len(names)
    dtype = dtype or (jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
    jump_times = np.zeros((R, E))
    states = np.zeros((R, E, N), np.int32)
    arr = {k: [] for k in ("init", "dur", "num", "tg", "ts")}
    for r, (_, dur, s0, jt, js, tg, ts) in enumerate(parsed):
        m = len(jt)
        jump_times[r, :m], jump_times[r, m:] = jt, dur
        states[r, :m] = js
        states[r, m:] = js[-1] if m else s0
        arr["init"].append(s0)
        arr["dur"].append(dur)
        arr["num"].append(m)
        arr["tg"].append(tg)
        arr["ts"].append(ts)
    traj = Trajectories(
        initial_states=jnp.asarray(np.stack(arr["init"]), jnp.int32),
        jump_times=jnp.asarray(jump_times, dtype),
        states=jnp.asarray(states),
        num_events=jnp.asarray(arr["num"], jnp.int32),
        durations=jnp.asarray(arr["dur"], dtype),
        truncated=jnp.zeros((R,), bool),
        intervention_targets=jnp.asarray(np.stack(arr["tg"])),
        intervention_states=jnp.asarray(np.stack(arr["ts"]), jnp.int32),
    )
    return traj, order_ids


def read_csv(path: str | os.PathLike) -> pd.DataFrame:
    """Read a long-format CSV with a clear error for missing or unreadable files."""
    if not os.path.exists(path):
        raise ValueError(f"data file {os.fspath(path)!r} does not exist.")
    try:
        return pd.read_csv(path, keep_default_na=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ValueError(f"data file {os.fspath(path)!r} is not a readable CSV: {e}") from None


def read_trajectories_csv(path: str | os.PathLike, model) -> tuple[Trajectories, list]:
    """Read the long-format CSV (see [`jaxctbn.trajectories_from_dataframe`][])."""
    return trajectories_from_dataframe(read_csv(path), model)


def path_log_likelihood(model: CTBN, statistics: SufficientStatistics) -> Float[Array, ""]:
    r"""The log-likelihood of the observed paths given the rates of `model` (the paper's eq. for
    the experimental sequence, without the initial-state factor):
    $\sum_{n}\sum_{u,x,x'\ne x}[M_n(x,x',u)\ln\Lambda_n(x,x',u)-T_n(x,u)\Lambda_n(x,x',u)]$ over
    the pooled statistics, so a node contributes nothing from trajectories in which it was
    perfectly intervened on (its path is then fixed by the experimenter).

    Differentiable in the rates: use it to fit rates, imperfect-intervention strengths or a
    network that outputs rates by gradient descent. A transition observed where the model's rate
    is zero gives $-\infty$."""
    if statistics.parents != model.parents or statistics.cardinalities != model.cardinalities:
        raise ValueError("statistics: computed for another graph or cardinalities than model.")
    total = 0.0
    for q, st in zip(model.cims, statistics.pooled()):
        k = q.shape[-1]
        off = ~jnp.eye(k, dtype=bool)
        lam = jnp.where(off, q, 1.0)
        M = jnp.where(off, st.transitions, 0.0)
        log_lam = jnp.where(M > 0, jnp.log(jnp.where(M > 0, lam, 1.0)), 0.0)  # 0 log 0 = 0
        terms = M * log_lam - st.dwell_times[..., None] * jnp.where(off, q, 0.0)
        total = total + terms.sum()
    return total
