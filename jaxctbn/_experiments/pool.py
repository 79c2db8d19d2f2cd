r"""The paper's real-data experiment (§6, "British Household Data-set"; appendix C.2–C.3): active
structure learning by drawing **subjects from a pool** of recorded panel trajectories, where the
only possible "interventions" are on a **root node** that some subjects kept constant.

**The setting.** Real panel data cannot be intervened on after the fact. The paper picks a node
with no parents in the network learned from all the data (a *root*), and reads a subject whose
observed root state is $r$ at every visit as an experiment under $\mathrm{do}(\text{root}=r)$:
conditioning on a root is the same as intervening on it. The options of each experiment are then

- option 0, the **full pool** (no intervention): any remaining subject;
- option $1+r$, the **sub-pool** $\mathrm{do}(\text{root}=r)$: the remaining subjects whose root
  is observed in state $r$ at every visit where it is observed (visits with the root missing
  do not exclude a subject, but at least one visit must observe it).

A design picks an option, a subject is drawn uniformly from it **without replacement**, and the
subject's statistics update the structure posterior. The designs are those of the synthetic
experiments ([`jaxctbn.AbstractDesign.choose_option`][]): [`jaxctbn.PassiveDesign`][] (always
the full pool), [`jaxctbn.RandomDesign`][] (an option with subjects left, uniformly) and
[`jaxctbn.CriterionDesign`][] (the best or, for the paper's "negative VBHC" control, the worst
option by a design criterion under the current posterior; the criteria assume each subject's
whole path is seen, as the paper's, and score a particle filter's mixture through its
moment-matched posterior).

**How a subject is learnt from** (the default, `panel_posterior=`
[`jaxctbn.panel.StructureParticleFilter`][]`()`; `run pool`): the posterior learns from the
drawn subject's panel itself. The structure particle filter draws the subject's hidden path
given each particle's graph and rates and weights the particle by the subject's exact panel
likelihood, so the posterior after the drawn subjects is exact in the limit of its particles
and uses nothing but those subjects. A subject drawn from a sub-pool is an interventional
experiment (the root clamped at $r$), so by the pooling rule (§4) the root's own transitions
are not learnt from it. On real panels with long gaps (years between visits) a path draw can
need more uniformisation times than the filter's `max_candidates`:
`run_pool_experiment` (`run pool`) then redoes the chunk with the bound
doubled.

**The paper's approximation** (`panel_posterior=None`; `run pool --panel-posterior moment`):
a subject's panel gives no counts, so the posterior is updated with the subject's **expected
family statistics** $\mathsf E_m[M_n\mid Y]$, $\mathsf E_m[T_n\mid Y]$ under one fixed network
$m$ learned from **all** the data ([`jaxctbn.panel.learn_structure_from_panels`][]),
precomputed once per subject ([`jaxctbn.panel.panel_expected_statistics`][]). The statistics
therefore already carry information from the whole data set through $m$, and imputed counts
are treated as observed (overconfident where the visits are sparse); the experiment then
measures how fast the *choice of subjects* recovers $m$'s graph, not an independent
re-learning. The root's statistics of a subject drawn from a sub-pool are left out likewise.
Much faster: no path draws.

**Scoring.** [`jaxctbn.CriterionDesign`][] scores each option's intervention (none, or
$\mathrm{do}(\text{root}=r)$) with [`jaxctbn.score_interventions`][] from the option's own
initial state and horizon ([`jaxctbn.experiments.PoolExperiment`][]: the most common complete first
observation of its subjects, and the median follow-up of its subjects with at least two visits),
with common posterior draws for all options.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, Float, Int, Key, PRNGKeyArray

from .._active_learning.designs import AbstractDesign, CriterionDesign, PassiveDesign, RandomDesign
from .._active_learning.metrics import edge_aupr, edge_auroc
from .._criteria.box_hill import VBHC
from .._learning.family_statistics import FamilyStatistics
from .._learning.structure_mixture import StructureMixturePosterior
from .._learning.structure_posterior import StructurePosterior
from .._panel.structure_posterior import StructureParticleFilter, panel_structure_posterior
from .config import METRICS
from .pool_subjects import PoolExperiment

#: Design names understood by `pool_design_from_name` and `jaxctbn run pool`.
POOL_DESIGN_NAMES = ("passive", "random", "vbhc", "negative-vbhc")
#: The metrics recorded after every experiment: name -> (label, better is "higher"/"lower").
POOL_METRICS = METRICS["pool"]


# --------------------------------------------------------------------------- designs
def pool_design_from_name(name: str, *, num_samples: int = 40) -> AbstractDesign:
    """`"passive"`, `"random"`, `"vbhc"` or `"negative-vbhc"` as a design of the pool
    experiment (`num_samples` posterior draws for the VBHC)."""
    if name == "passive":
        return PassiveDesign()
    if name == "random":
        return RandomDesign()
    if name in ("vbhc", "negative-vbhc"):
        # the paper's: each option scored as if the subject's whole path were seen (a particle
        # filter's mixture through its moment-matched posterior)
        return CriterionDesign(
            VBHC(),
            num_samples=num_samples,
            worst=name == "negative-vbhc",
            assume_complete_path=True,
        )
    raise ValueError(
        f"design: unknown pool design {name!r}; valid: {', '.join(POOL_DESIGN_NAMES)}."
    )


# --------------------------------------------------------------------------- one repetition
class PoolResult(eqx.Module):
    """One repetition (or a batch, with leading axes): `entropy`, `auroc`, `aupr` per experiment
    `(K + 1,)` (entry 0 before any subject), the chosen `option` and `subject` indices `(K,)`,
    and the final posterior's `statistics` (the particle filter's: the weighted mean of its
    particles', [`jaxctbn.StructureMixturePosterior.moment_matched`][])."""

    entropy: Float[Array, "*batch experiments_plus_one"]
    auroc: Float[Array, "*batch experiments_plus_one"]
    aupr: Float[Array, "*batch experiments_plus_one"]
    option: Int[Array, "*batch experiments"]
    subject: Int[Array, "*batch experiments"]
    statistics: FamilyStatistics


def _metrics(posterior: StructurePosterior | StructureMixturePosterior, reference):
    edges = posterior.edge_marginals()
    return jnp.stack(
        [posterior.entropy(), edge_auroc(edges, reference), edge_aupr(edges, reference)]
    )


#: How a drawn subject updates the posterior by default: its own panel, by the structure
#: particle filter (exact as its particles grow).
DEFAULT_POOL_FILTER = StructureParticleFilter()

#: The key stream of the particle filter's update within a step.
_UPDATE_STREAM = 0x7570


def check_pool_family(panel_posterior) -> None:
    if panel_posterior is not None and not isinstance(panel_posterior, StructureParticleFilter):
        raise ValueError(
            "panel_posterior: expected StructureParticleFilter(...) (the default) or None (the "
            f"paper's expected statistics), got {panel_posterior!r}."
        )


def run_pool(
    pool: PoolExperiment,
    design: AbstractDesign,
    key: PRNGKeyArray,
    *,
    num_experiments: int,
    panel_posterior: StructureParticleFilter | None = DEFAULT_POOL_FILTER,
) -> PoolResult:
    r"""One repetition of the pool experiment: `num_experiments` times, the design picks an
    option, a subject is drawn uniformly from the option's remaining subjects (without
    replacement) and the posterior learns from it (see the module docstring). Jittable and
    vmappable over `key` (`run_pool_repetitions` does both); the same
    key gives the same result.

    `panel_posterior` (keyword-only): how a drawn subject updates the structure posterior. By
    default a [`jaxctbn.panel.StructureParticleFilter`][]`()` learns from the subject's panel
    itself (exact in the limit of its particles; the posterior is then a
    [`jaxctbn.StructureMixturePosterior`][], and the designs, which assume complete paths,
    score its moment-matched posterior). `None`: the subject's expected statistics under the
    network learned from all the data are added (the paper's approximation: the posterior then
    borrows that network's information and is overconfident where the visits are sparse).
    Under `jit` a path that needs more uniformisation times than the filter's
    `max_candidates` raises an error naming it
    (`run_pool_experiment` grows it instead)."""
    if not 1 <= num_experiments <= pool.num_subjects:
        raise ValueError(
            f"num_experiments: must be in 1..{pool.num_subjects} (subjects are drawn without "
            f"replacement), got {num_experiments}."
        )
    check_pool_family(panel_posterior)
    start = pool.prior_posterior
    if panel_posterior is not None:
        start = panel_posterior.initial(start)

    def update(posterior, subject, option, k):
        if panel_posterior is None:
            return posterior.update(pool.subject_statistics(subject, option))
        return panel_structure_posterior(
            posterior,
            pool.subject_observations(subject, option),
            family=panel_posterior,
            key=jr.fold_in(k, _UPDATE_STREAM),
        )

    def step(carry, k):
        posterior, available = carry
        k_option, k_subject = jr.split(k)
        open_ = jnp.any(pool.membership & available[None, :], axis=1)
        option = design.choose_option(
            posterior, pool.candidates, pool.initial_states, pool.horizons, open_, k_option
        )
        weights = pool.membership[option] & available
        subject = jr.categorical(k_subject, jnp.where(weights, 0.0, -jnp.inf)).astype(jnp.int32)
        posterior = update(posterior, subject, option, k)
        available = available.at[subject].set(False)
        return (posterior, available), (option, subject, _metrics(posterior, pool.reference))

    available = jnp.ones(pool.num_subjects, bool)
    keys = jr.split(key, num_experiments)
    (posterior, _), (option, subject, metrics) = jax.lax.scan(step, (start, available), keys)
    metrics = jnp.concatenate([_metrics(start, pool.reference)[None], metrics])
    if isinstance(posterior, StructureMixturePosterior):
        posterior = posterior.moment_matched()
    return PoolResult(
        entropy=metrics[:, 0],
        auroc=metrics[:, 1],
        aupr=metrics[:, 2],
        option=option,
        subject=subject,
        statistics=posterior.statistics,
    )


@eqx.filter_jit
def run_pool_repetitions(
    pool: PoolExperiment,
    design: AbstractDesign,
    keys: Key[Array, " repetitions"],
    *,
    num_experiments: int,
    panel_posterior: StructureParticleFilter | None = DEFAULT_POOL_FILTER,
) -> PoolResult:
    """[`jaxctbn.experiments.run_pool`][] vmapped over a batch of keys, as one compiled program."""
    return jax.vmap(
        lambda k: run_pool(
            pool, design, k, num_experiments=num_experiments, panel_posterior=panel_posterior
        )
    )(keys)
