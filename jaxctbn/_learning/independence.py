r"""Constraint-based pruning of the candidate parents (CTPC, Bregoli, Scutari & Stella 2021):
conditional independence tests on the sufficient statistics of complete paths, then the exact
posterior over the parents that survive.

For a node $X$, a candidate parent $Y$ and a conditioning set $S$ of other candidates, let
$M_{xx'|s,y}$ and $T_{x|s,y}$ be the transitions and dwell times of $X$ under the parent set
$S\cup\{Y\}$, and $M_{xx'|s,\bar y}$, $T_{x|s,\bar y}$ the same summed over the other states
of $Y$; $r_1=\sum_{x'\ne x}M_{xx'|s,y}$ and $\bar r=\sum_{x'\ne x}M_{xx'|s,\bar y}$ are the
transitions out of $x$. Two tests of $X\perp Y\mid S$, for every state $x$ and configuration
$(s, y)$ where both have transitions:

- **waiting times** (F test): under independence the rates $q_{x|s,y}$ and $q_{x|s,\bar y}$
  are equal, the dwell times are Gamma$(r, q)$, and
  $F=\hat q_{x|s,y}/\hat q_{x|s,\bar y}=\frac{T_{x|s,\bar y}/\bar r}{T_{x|s,y}/r_1}$ (with
  $\hat q = r/T$) is Fisher's $F(2\bar r, 2r_1)$;
  two-sided at level `alpha_f`;
- **where the jumps go** (nodes of three or more states; the two-sample $\chi^2$ test of
  homogeneity): $\chi^2=\sum_{x'\ne x}\frac{(K M_{xx'|s,y}-M_{xx'|s,\bar y}/K)^2}
  {M_{xx'|s,y}+M_{xx'|s,\bar y}}$ with $K=\sqrt{\bar r/r_1}$, against $\chi^2_{k-2}$ at level
  `alpha_chi2` (terms with a zero denominator left out).

(The published CTPC compares $(s, y)$ with the pooled $s$, which contains it, against
$F(r_1, r_2)$; that statistic is not $F$-distributed under independence. Comparing with the
other states of $Y$ keeps the tests' levels: checked by simulation in the tests.)

$Y$ stays a candidate while every conditioning set tried rejects independence (some test, at
some $(x, s, y)$). The sets tried grow in size: first $S=\varnothing$, then every set of one
other surviving candidate, and so on up to `max_conditioning` parents; within a size all tests
use the candidates that survived the sizes before (the order-independent, "stable" variant of
the PC algorithm). The statistics of all tests of one size come from one compiled call of the
same matrix products as the hill climber's moves
([`jaxctbn.HillClimbing`][]): for every node, every conditioning set and every $Y$ at once.

The survivors, at most `pool_size` per node (the most dependent first: the smallest p-value of
the test without conditioning), form each node's pool, and every set of at most $K$ parents from
the pool (with the prior knowledge) is scored exactly into a [`jaxctbn.StructurePosterior`][],
as after hill climbing.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import betainc, gammaincc

from .._paths.sampling import Trajectories
from .candidates import knowledge_arrays
from .moves import by_column_state, by_parent_state, move_statistics
from .search import AbstractStructureSearch
from .search_data import search_data


class CTPC(AbstractStructureSearch):
    r"""Conditional independence tests prune each node's candidate parents (see the module
    page), then the exact posterior over the sets of at most $K$ survivors.

    **Arguments** (keyword-only):

    - `alpha_f`: level of the two-sided F test on the waiting times (default 0.1: generous,
      as a pruning step loses a true parent for good while the exact posterior over the
      survivors still weighs a false one).
    - `alpha_chi2`: level of the $\chi^2$ test on where the jumps go, for nodes of three or
      more states (default 0.1).
    - `max_conditioning`: the largest conditioning set (default `None`: $K - 1$, one less than
      the largest in-degree).
    - `max_candidates`: candidates per node carried past the tests without conditioning
      (default 12; the most dependent first): the conditioning sets of size $j$ number
      $\binom{c-1}{j}$ per candidate, and their statistics are computed for all nodes at once.
    - `pool_size`: survivors kept per node for the exact posterior (default 8; the most
      dependent first).
    - `chunk`: path segments per matrix product (default 2048; fewer when the product's
      operands, N x conditioning sets x configurations per segment, would pass $2^{20}$
      floats).
    """

    alpha_f: float = eqx.field(static=True)
    alpha_chi2: float = eqx.field(static=True)
    max_conditioning: int | None = eqx.field(static=True)
    max_candidates: int = eqx.field(static=True)
    pool_size: int = eqx.field(static=True)
    chunk: int = eqx.field(static=True)

    def __init__(
        self,
        *,
        alpha_f: float = 0.1,
        alpha_chi2: float = 0.1,
        max_conditioning: int | None = None,
        max_candidates: int = 12,
        pool_size: int = 8,
        chunk: int = 2048,
    ):
        for name, value in (("alpha_f", alpha_f), ("alpha_chi2", alpha_chi2)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name}: expected a level in (0, 1), got {value!r}.")
            if not 0.0 < float(value) < 1.0:
                raise ValueError(f"{name}: expected a level in (0, 1), got {value!r}.")
        for name, value, low in (
            ("max_conditioning", max_conditioning, 0),
            ("max_candidates", max_candidates, 1),
            ("pool_size", pool_size, 1),
            ("chunk", chunk, 1),
        ):
            if name == "max_conditioning" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}.")
        self.alpha_f, self.alpha_chi2 = float(alpha_f), float(alpha_chi2)
        self.max_conditioning, self.max_candidates = max_conditioning, max_candidates
        self.pool_size, self.chunk = pool_size, chunk


def f_test_p_values(M_joint, T_joint, M_base, T_base):
    r"""Two-sided p-values of the F test, per state $x$ and configuration: `M_joint (..., k, k)`
    and `T_joint (..., k)` of the parent set $S\cup\{Y\}$, `M_base`, `T_base` of $S$ broadcast
    to them. The rate under $(s, y)$ against the rate under $(s, y' \ne y)$:
    $F = \hat q_{x|s,y}/\hat q_{x|s,\bar y} \sim F(2r_1, 2\bar r)$ under independence. NaN
    where either has no transition (no test)."""
    r1 = M_joint.sum(-1) - jnp.diagonal(M_joint, axis1=-2, axis2=-1)
    r2 = M_base.sum(-1) - jnp.diagonal(M_base, axis1=-2, axis2=-1)
    rest, T_rest = r2 - r1, T_base - T_joint
    valid = (r1 > 0) & (rest > 0) & (T_joint > 0) & (T_rest > 0)

    def safe(a):
        return jnp.where(valid, a, 1.0)

    F = (safe(r1) / safe(T_joint)) / (safe(rest) / safe(T_rest))
    # F = (T_rest / rest) / (T_joint / r1): 2 q T is chi-square with 2 r degrees of freedom
    d1, d2 = 2 * safe(rest), 2 * safe(r1)
    cdf = betainc(d1 / 2, d2 / 2, d1 * F / (d1 * F + d2))
    p = jnp.clip(2 * jnp.minimum(cdf, 1 - cdf), 0.0, 1.0)
    return jnp.where(valid, p, jnp.nan)


def chi2_test_p_values(M_joint, M_base):
    r"""p-values of the $\chi^2$ test on where the jumps out of $x$ go (nodes of $k \ge 3$
    states; counts as for [`f_test_p_values`][]): the destinations under $(s, y)$ against those
    under $(s, y' \ne y)$, $\chi^2 = \sum_{x' \ne x} (K a_{x'} - b_{x'}/K)^2/(a_{x'} + b_{x'})$
    with $K = \sqrt{\bar r / r_1}$, against $\chi^2_{k-2}$. NaN where either has no transition
    or $k < 3$."""
    k = M_joint.shape[-1]
    off = ~jnp.eye(k, dtype=bool)
    a = jnp.where(off, M_joint, 0)
    b = jnp.where(off, M_base - M_joint, 0)
    r1, rest = a.sum(-1), b.sum(-1)
    valid = (r1 > 0) & (rest > 0) & (k >= 3)
    K = jnp.sqrt(jnp.where(valid, rest, 1.0) / jnp.where(valid, r1, 1.0))[..., None]
    den = a + b
    term = jnp.where(den > 0, (K * a - b / K) ** 2 / jnp.where(den > 0, den, 1.0), 0.0)
    p = gammaincc(max(k - 2, 1) / 2, term.sum(-1) / 2)
    return jnp.where(valid, p, jnp.nan)


@eqx.filter_jit
def independence_p_values(data, bases, cards: tuple[int, ...], chunk: int, columns=None):
    """For conditioning sets `bases (N, B, width)` (padded with `-1`): the smallest p-value of
    the F test and of the $\\chi^2$ test of every node `n` against every candidate parent `m`
    given base `b`, over the states and configurations `(N, B, N)` each (1 where no test
    applies). With `columns (N, P)` (node indices, `-1` = none) only the candidates
    `columns[n]` of node n are tested: `(N, B, P)`, and the statistics span only them."""
    N, _, width = bases.shape
    kmax = max(cards)
    C = int(kmax**width)
    D, E, D_own, E_own = move_statistics(data, bases, cards, C, chunk, True, columns)
    if columns is None:
        column, D, E = by_parent_state(cards, D, E)
        column = jnp.broadcast_to(column[None], (N,) + column.shape)  # (N, N, kmax)
    else:  # slot p, state v: column p * kmax + v (the extra zero column for states not had)
        column, D, E = by_column_state(cards, columns, D, E)
    p_f = jnp.ones((N,) + bases.shape[1:2] + (column.shape[1],), D.dtype)
    p_chi2 = jnp.ones_like(p_f)
    for k in sorted(set(cards)):
        nodes = np.asarray([n for n, kn in enumerate(cards) if kn == k])
        Dk, Ek = D[nodes][:, :, :k], E[nodes][:, :, :k, :k]  # (n, B, k, C, w), (n, B, k, k, C, w)
        Dk_own, Ek_own = D_own[nodes][:, :, :k], E_own[nodes][:, :, :k, :k]

        def one(Dnb, Enb, D0, E0, col, k=k):
            T = jnp.moveaxis(Dnb[..., col], 0, -1)  # (C, kmax, k)
            M = jnp.moveaxis(Enb[..., col], (0, 1), (-2, -1))  # (C, kmax, k, k)
            T0 = jnp.moveaxis(D0, 0, -1)[:, None, :]  # (C, 1, k)
            M0 = jnp.moveaxis(E0, (0, 1), (-2, -1))[:, None]  # (C, 1, k, k)
            pf = f_test_p_values(M, T, M0, T0)
            pc = chi2_test_p_values(M, jnp.broadcast_to(M0, M.shape))
            return jnp.nanmin(jnp.append(pf.ravel(), 1.0)), jnp.nanmin(jnp.append(pc.ravel(), 1.0))

        over_m = jax.vmap(one, in_axes=(None, None, None, None, 0))
        over_b = jax.vmap(over_m, in_axes=(0, 0, 0, 0, None))
        pf, pc = jax.vmap(over_b)(Dk, Ek, Dk_own, Ek_own, column[nodes])
        p_f = p_f.at[nodes].set(pf)
        p_chi2 = p_chi2.at[nodes].set(pc)
    return p_f, p_chi2


def _on_every_node(p: np.ndarray, columns: np.ndarray, N: int) -> np.ndarray:
    """p-values `(N, B, P)` of the candidates `columns (N, P)` as `(N, B, N)`: 1 (no test)
    for the other nodes."""
    out = np.ones(p.shape[:2] + (N,), p.dtype)
    for n in range(N):
        listed = columns[n] >= 0
        out[n][:, columns[n][listed]] = p[n][:, listed]
    return out


def _padded_count(count: int) -> int:
    """Conditioning sets per node rounded up to a power of two (fewer distinct programs)."""
    return 1 << max(count - 1, 0).bit_length()


def ctpc_pools(
    trajectories: Trajectories,
    cards: tuple[int, ...],
    search: CTPC,
    *,
    max_parents: int | Sequence[int],
    required_edges: Sequence[tuple[int, int]] = (),
    forbidden_edges: Sequence[tuple[int, int]] = (),
    tiers: Sequence[int] | None = None,
    data=None,
) -> tuple[np.ndarray, dict]:
    """Run the tests of `search` on complete trajectories (see the module page): every node's
    pool of surviving candidate parents `(N, pool_size)` (padded with `-1`; required parents
    always kept), and a summary (`tests`: the number of tests made per conditioning size,
    `survivors`: candidates per node after each size)."""
    N = len(cards)
    allowed, required, per_node = knowledge_arrays(
        N, max_parents, required_edges, forbidden_edges, tiers
    )
    K = int(max(per_node))
    depth = max(K - 1, 0) if search.max_conditioning is None else search.max_conditioning
    data = search_data(trajectories, cards) if data is None else data
    candidates = allowed & ~np.eye(N, dtype=bool)  # [m, n]: m may be a parent of n
    strength = np.ones((N, N))  # [n, m]: the p-value of the unconditional tests
    summary: dict = {"tests": [], "survivors": []}
    for size in range(depth + 1):
        sets = []
        for n in range(N):
            pool = np.nonzero(candidates[:, n])[0]
            sets.append(
                list(itertools.combinations(pool.tolist(), size)) if len(pool) > size else []
            )
        if not any(sets):
            break
        B = _padded_count(max(len(s) for s in sets))
        width = max(size, 1)
        bases = np.full((N, B, width), -1, np.int32)
        valid = np.zeros((N, B), bool)
        for n, ss in enumerate(sets):
            for b, s in enumerate(ss):
                bases[n, b, :size] = s
                valid[n, b] = True
        if size == 0:  # every allowed parent: the statistics span every node
            p_f, p_chi2 = jax.device_get(
                independence_p_values(data, jnp.asarray(bases), cards, search.chunk)
            )
        else:  # only the surviving candidates: the statistics span them alone
            counts = candidates.sum(0)
            columns = np.full((N, _padded_count(int(max(counts.max(), 1)))), -1, np.int32)
            for n in range(N):
                pool = np.nonzero(candidates[:, n])[0]
                columns[n, : len(pool)] = pool
            tested = independence_p_values(
                data, jnp.asarray(bases), cards, search.chunk, jnp.asarray(columns)
            )
            p_f, p_chi2 = (_on_every_node(p, columns, N) for p in jax.device_get(tested))
        dependent = (p_f < search.alpha_f) | (p_chi2 < search.alpha_chi2)  # (N, B, N)
        in_base = (bases[:, :, :, None] == np.arange(N)).any(2)  # (N, B, N)
        tried = valid[:, :, None] & ~in_base & candidates.T[:, None, :]
        independent = (tried & ~dependent).any(1)  # (N, N): [n, m]
        if size == 0:
            strength = np.minimum(p_f[:, 0], p_chi2[:, 0])
        summary["tests"].append(int(tried.sum()))
        candidates = candidates & ~(independent.T & ~required)
        if size == 0:  # the most dependent `max_candidates` go on (and the required ones)
            for n in range(N):
                free = np.nonzero(candidates[:, n] & ~required[:, n])[0]
                weakest = free[np.argsort(strength[n, free], kind="stable")][
                    search.max_candidates :
                ]
                candidates[weakest, n] = False
        summary["survivors"].append(candidates.sum(0).tolist())
    width = max(search.pool_size, K)
    pools = np.full((N, width), -1, np.int32)
    for n in range(N):
        keep = np.nonzero(candidates[:, n])[0]
        forced = keep[required[keep, n]]
        rest = keep[~required[keep, n]]
        rest = rest[np.argsort(strength[n, rest], kind="stable")]
        chosen = np.concatenate([forced, rest])[: max(search.pool_size, len(forced))]
        chosen = np.sort(chosen)
        pools[n, : len(chosen)] = chosen
    return pools, summary
