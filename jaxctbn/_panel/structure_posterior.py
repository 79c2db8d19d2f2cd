r"""Structure posteriors from panel data, by a choice of posterior family
([`jaxctbn.panel.AbstractPanelStructureFamily`][]): exact in the limit by default, or the fast
structural-EM approximation.

With complete paths the posterior over graphs is exact and factorises over nodes
([`jaxctbn.StructurePosterior`][]). A panel hides the paths, and
$p(G\mid Y)=\int p(G\mid S)\,p(S\mid Y)\,dS$ has no closed form.

- [`jaxctbn.panel.SampledStructure`][] (the default): a blocked Gibbs sampler over the graph,
  the rates and the hidden paths, Rao-Blackwellised over its sweeps into a
  [`jaxctbn.StructureMixturePosterior`][], one exact $p(G\mid S_c)$ per retained sweep. Exact as
  the sweeps grow; its chains' split-$\hat R$ and effective sample sizes are reported with it.
- [`jaxctbn.panel.StructuralEM`][]: every candidate set scored on the expected statistics
  under the current MAP graph with posterior-mean rates, iterated (maths §7). It treats
  imputed statistics as observed, so it is **overconfident** where the visits say little
  (measured in `tests/panel/test_panel_structure_design.py`: $p(A\to B)$ 0.99 where the exact
  posterior gives 0.84).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import overload

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, Bool, PRNGKeyArray

from .._errors import error_if, error_message
from .._learning.resampling import reweighted_ancestors, systematic_indices
from .._learning.structure_mixture import StructureChainDiagnostics, StructureMixturePosterior
from .._learning.structure_posterior import StructurePosterior
from .._master_equation import AbstractMasterEquationSolver
from .._model.interventions import is_concrete
from .buckets import PanelBuckets, as_flat_buckets
from .e_step import DENSE_SOLVER
from .gap_groups import GapGroups, gap_groups
from .gibbs import GibbsSampler, PathChains
from .gibbs_kernel import candidate_sampler_bounds
from .inference import panel_expected_statistics
from .observations import Emissions, PanelObservations, per_trajectory_tables
from .panel_families import panel_family_statistics, sampled_family_statistics
from .path_statistics import with_candidate_growth
from .rate_sampling import sampled_statistics
from .update_checks import check_integer_fields, checked_panel_update, warn_unconverged

# panel gaps are long relative to the rates: the dense exponential has no limit on a gap's length


class AbstractPanelStructureFamily(eqx.Module):
    """How [`jaxctbn.panel.panel_structure_posterior`][] represents what panel data say about
    the graph: [`jaxctbn.panel.SampledStructure`][] or [`jaxctbn.panel.StructuralEM`][]."""

    def initial(self, prior: StructurePosterior) -> StructurePosterior | StructureMixturePosterior:
        """The posterior before any panel data in the representation this family's updates
        keep (the sequential loop's `scan` carries it): `prior` itself, or
        [`jaxctbn.panel.StructureParticleFilter`][]'s particles."""
        return prior

    @abc.abstractmethod
    def posterior(
        self,
        prior: StructurePosterior | StructureMixturePosterior,
        observations: PanelObservations | PanelBuckets,
        emissions: Emissions | None,
        key: PRNGKeyArray | None,
        targets: Bool[Array, "trajectories nodes"] | None,
        gaps: GapGroups | None,
    ) -> StructurePosterior | StructureMixturePosterior:
        """`prior` updated with `observations` (`targets`: which nodes each trajectory clamps;
        `gaps`: the distinct gaps when they can share transition matrices)."""


class StructuralEM(AbstractPanelStructureFamily):
    r"""Structural EM from the history: `iterations` times, the expected family statistics of
    the trajectories under the current posterior's MAP graph with posterior-mean rates are added
    to the history's statistics and every parent set rescored. The statistics of the history
    itself are kept as they are (an assumed-density filter: in the active-learning loop each
    experiment is imputed once, under what was known after it). An approximation (maths §7):
    **overconfident** where the visits are sparse. `solver` propagates the smoother (default:
    the dense matrix exponential)."""

    iterations: int = eqx.field(default=10, static=True)
    solver: AbstractMasterEquationSolver = DENSE_SOLVER

    def __check_init__(self):
        check_integer_fields(self, iterations=1)

    def posterior(self, prior, observations, emissions, key, targets, gaps):
        assert isinstance(prior, StructurePosterior)  # checked by panel_structure_posterior

        def step(current: StructurePosterior, _):
            model = current.mean_rates_given(current.map_indices())
            stats = panel_expected_statistics(
                model, observations, emissions=emissions, solver=self.solver
            )
            family = panel_family_statistics(stats, prior.parent_sets, intervention_targets=targets)
            return prior.update(family), None

        out, _ = jax.lax.scan(step, prior, None, length=self.iterations)
        return out


class SampledStructure(AbstractPanelStructureFamily):
    r"""The posterior over graphs as a mixture of exact complete-data structure posteriors,
    Rao-Blackwellised over a Gibbs sampler of the graph, the rates and the hidden paths (module
    page).

    Each of `num_chains` chains (one program, `vmap`) holds a graph $G$ (one candidate set per
    node) and its rates $\Lambda$, and sweeps:

    1. **Paths.** Every trajectory's hidden path $S\sim p(S\mid Y,G,\Lambda)$ exactly (forward
       filtering, backward sampling of the states at the visits, an endpoint-conditioned
       uniformised bridge in every interval: `sample_path_statistics`).
    2. **Graph and rates.** $(G,\Lambda)\sim p(G,\Lambda\mid S)$ jointly: each node's parent set
       from its exact complete-data posterior with the rates integrated out (the family scores
       of [`jaxctbn.StructurePosterior`][], the prior's history added), then the rates given
       that set conjugately. A CTBN's graph may have cycles, so given the paths the nodes are
       independent and this draw is exact.

    Both steps leave $p(G,\Lambda,S\mid Y)$ invariant. After `burn_in` sweeps each of
    `num_sweeps` retained sweeps contributes the component $p(G\mid S_c)$ (equal weights); since
    the $S_c$ are draws of $p(S\mid Y)$, the mixture converges to $p(G\mid Y)$, and its edge
    marginals average the exact $p(m\to n\mid S_c)$ (Rao-Blackwellised, far less noisy than
    counting the sampled graphs). Node $n$ learns only from the trajectories in which it is not
    perfectly intervened on.

    Chains start from independent draws of the structural-EM posterior
    ([`jaxctbn.panel.StructuralEM`][], `start_iterations` steps): a graph, then its rates.
    `max_candidates` bounds one bridge's uniformisation times at first: called eagerly, the verb redoes the update with it doubled when a path needs more (up to 1,024; under `jit` an error names it); `solver` propagates the filter (default: the dense matrix exponential).

    **Beyond exact forward-backward** (whose joint state space grows as $\prod_n k_n$):
    `path_sampler=`[`jaxctbn.panel.GibbsSampler`][] replaces step 1 by `path_sampler.thin`
    sweeps of node-by-node auxiliary-variable Gibbs updates of the paths given $(G,\Lambda)$
    (`sample_panel_paths`' updates, each on its node's Markov blanket), from
    the chain's current paths: each update leaves $p(S\mid Y,G,\Lambda)$ invariant, so the
    sampler still targets $p(G,\Lambda,S\mid Y)$, at a cost linear in the trajectories, the
    nodes and the blanket's size instead of the joint states. Chains then start from paths that
    jump half-way between differing visits and a graph and rates drawn given them (no exact
    inference); the sampler's buffers (`max_events`, `max_node_events`, `max_virtual`) bound
    the paths (called eagerly, the verb doubles them when a path needs more), its
    `num_samples` and `burn_in` are not used (the family's sweeps and `burn_in` are). Blankets
    are bounded from the candidate sets (`blanket_bounds`, filled in by the verb when they are
    concrete: restricted candidates, e.g. from a graph search, keep the updates small). Exact
    observations only (no emissions, no exact entry times).

    The verb warns on the host when the largest split $\hat R$ of the Rao-Blackwellised edge
    marginals exceeds `max_r_hat` or their smallest effective sample size falls below
    `min_ess`, naming the setting to raise."""

    num_sweeps: int = eqx.field(default=1000, static=True)
    num_chains: int = eqx.field(default=4, static=True)
    burn_in: int = eqx.field(default=100, static=True)
    start_iterations: int = eqx.field(default=5, static=True)
    max_candidates: int = eqx.field(default=64, static=True)
    max_r_hat: float = eqx.field(default=1.01, static=True)
    min_ess: float = eqx.field(default=100.0, static=True)
    solver: AbstractMasterEquationSolver = DENSE_SOLVER
    path_sampler: GibbsSampler | None = None
    blanket_bounds: tuple[int, int] | None = eqx.field(default=None, static=True)

    def __check_init__(self):
        check_integer_fields(
            self, num_sweeps=4, num_chains=1, burn_in=0, start_iterations=1, max_candidates=1
        )
        if self.path_sampler is not None and not isinstance(self.path_sampler, GibbsSampler):
            raise ValueError(
                "path_sampler: expected None (exact forward-backward) or a "
                f"jaxctbn.panel.GibbsSampler, got {type(self.path_sampler).__name__}."
            )

    def posterior(self, prior, observations, emissions, key, targets, gaps):
        if key is None:
            raise ValueError(
                "key: SampledStructure draws graphs, rates and paths; pass a PRNG key (or "
                "family=StructuralEM() for the deterministic approximation)."
            )
        assert isinstance(prior, StructurePosterior)  # checked by panel_structure_posterior
        if self.path_sampler is not None:
            return self._by_gibbs_paths(prior, observations, emissions, key, self.path_sampler)
        start = StructuralEM(self.start_iterations, self.solver).posterior(
            prior, observations, emissions, None, targets, gaps
        )
        adjacency = _adjacency(prior)

        def sweep(state, key):
            _, model = state
            key_paths, key_graph, key_rates = jr.split(key, 3)
            stats = sampled_statistics(
                model,
                observations,
                emissions,
                key_paths,
                self.solver,
                self.max_candidates,
                gaps,
            )
            family = panel_family_statistics(stats, prior.parent_sets, intervention_targets=targets)
            given = prior.update(family)
            indices = given.sample_parent_sets(key_graph)
            model = given.rates_given(indices, key_rates)
            return (indices, model), (given, adjacency(indices), given.edge_marginals())

        def chain(key):
            key_graph, key_rates, key_burn, key_sweeps = jr.split(key, 4)
            indices = start.sample_parent_sets(key_graph)
            state = (indices, start.rates_given(indices, key_rates))
            return self._swept(sweep, state, key_burn, key_sweeps)[1]

        return self._mixture(*jax.vmap(chain)(jr.split(key, self.num_chains)))

    def _swept(self, sweep, state, key_burn, key_sweeps):
        """`burn_in` then `num_sweeps` sweeps from `state`: the last state and the retained
        sweeps' outputs. One scan over both (one compiled sweep, not two; the burn-in's outputs
        are dropped after it)."""
        keys = jr.split(key_sweeps, self.num_sweeps)
        if self.burn_in:
            keys = jnp.concatenate([jr.split(key_burn, self.burn_in), keys])
        state, out = jax.lax.scan(sweep, state, keys)
        return state, jax.tree_util.tree_map(lambda x: x[self.burn_in :], out)

    def _mixture(self, components, edges, marginals) -> StructureMixturePosterior:
        total = self.num_chains * self.num_sweeps
        components = jax.tree_util.tree_map(lambda x: x.reshape(total, *x.shape[2:]), components)
        return StructureMixturePosterior.from_components(
            components, StructureChainDiagnostics.from_draws(edges, marginals)
        )

    def _by_gibbs_paths(self, prior, observations, emissions, key, sampler: GibbsSampler):
        """The sampler with Gibbs updates of the paths (class docstring)."""
        if emissions is not None:
            raise ValueError(
                "emissions: not supported with path_sampler= (exact observations only); use "
                "path_sampler=None (exact forward-backward)."
            )
        N = len(prior.names)
        cards = prior.statistics.cardinalities
        bounds = self.blanket_bounds or (max(1, N - 1), max(1, N - 1))
        first = prior.mean_rates_given(prior.map_indices())
        batches = tuple(
            per_trajectory_tables(first, b, lambda m: 0, "the Gibbs path sampler")[1]
            for b in as_flat_buckets(observations)
        )
        starts = tuple(PathChains.start(b, N, sampler) for b in batches)
        adjacency = _adjacency(prior)

        def given_paths(chains: tuple[PathChains, ...]):
            family, too_long = None, jnp.asarray(False)
            for c in chains:
                paths, long = c.trajectories(sampler.max_events)
                one_sample = jax.tree_util.tree_map(lambda x: x[:, None], paths)
                part = sampled_family_statistics(one_sample, cards, prior.parent_sets)
                family = part if family is None else part + family
                too_long = too_long | long
            return prior.update(family), too_long

        def sweep(state, key):
            _, model, chains, too_long = state
            key_paths, key_graph, key_rates = jr.split(key, 3)
            chains = tuple(
                c.swept(model, b, jr.fold_in(key_paths, i), sampler, bounds)
                for i, (c, b) in enumerate(zip(chains, batches))
            )
            given, long = given_paths(chains)
            indices = given.sample_parent_sets(key_graph)
            model = given.rates_given(indices, key_rates)
            state = (indices, model, chains, too_long | long)
            return state, (given, adjacency(indices), given.edge_marginals())

        def chain(key):
            key_graph, key_rates, key_burn, key_sweeps = jr.split(key, 4)
            given, too_long = given_paths(starts)
            indices = given.sample_parent_sets(key_graph)
            state = (indices, given.rates_given(indices, key_rates), starts, too_long)
            state, out = self._swept(sweep, state, key_burn, key_sweeps)
            _, _, chains, too_long = state
            overflow = jnp.stack(
                [too_long, *(jnp.any(jnp.stack([c.overflow.any(0) for c in chains]), 0))]
            )
            return out, overflow

        (components, edges, marginals), overflow = jax.vmap(chain)(jr.split(key, self.num_chains))
        components = error_if(
            components,
            jnp.any(overflow),
            f"{GIBBS_OVERFLOW}: a path needed more than max_events jumps (or a node more than "
            "max_node_events), or an update more than max_virtual virtual times; raise them "
            "(path_sampler=GibbsSampler(max_events=..., max_node_events=..., max_virtual=...)).",
        )
        return self._mixture(components, edges, marginals)


def _adjacency(prior: StructurePosterior):
    """`indices -> (N, N)`: the adjacency matrix (`[m, n]`: edge m -> n) of the graph of the
    candidate sets `indices`."""
    N = len(prior.names)

    def adjacency(indices):
        rows = [
            (prior.parent_sets[n][indices[n]][:, None] == jnp.arange(N)).any(0) for n in range(N)
        ]
        return jnp.stack(rows, axis=1).astype(prior.log_prior[0].dtype)

    return adjacency


#: how the Gibbs path sampler's overflow error begins (the verb grows its buffers on it)
GIBBS_OVERFLOW = "path_sampler"


class StructureParticleFilter(AbstractPanelStructureFamily):
    r"""Sequential Monte Carlo over the hidden paths with Rao-Blackwellised structure particles
    (Storvik's filter, as [`jaxctbn.panel.ParticleFilter`][] for rates): the posterior over
    graphs after a sequence of experiments, updated one experiment (one batch of panel
    trajectories $Y_k$) at a time, exact as `num_particles` grows. The family of the sequential
    loop ([`jaxctbn.StructureLearningTask`][] with a panel outcome).

    Particle $c$ holds the complete-path statistics of one draw of every earlier experiment's
    hidden paths, i.e. the exact complete-data posterior $p(G,\Lambda\mid S^c_{1:k-1})$ (a
    [`jaxctbn.StructurePosterior`][]), and a weight $w_c$. An update with $Y_k$, per particle:

    1. $(G^*_c,\Lambda^*_c)\sim p(G,\Lambda\mid S^c_{1:k-1})$: a parent set per node from its
       exact posterior, then the rates given it;
    2. the new paths $S^c_k\sim p(S_k\mid Y_k,G^*_c,\Lambda^*_c)$ exactly (forward filtering,
       backward sampling, bridges), their family statistics added to the particle's;
    3. $w_c\leftarrow w_c\,p(Y_k\mid G^*_c,\Lambda^*_c)$, the exact panel likelihood.

    With the extended target $p(S_{1:k}\mid Y_{1:k})\,p(G^*,\Lambda^*\mid S_{1:k-1})$ the
    incremental weight of this proposal is exactly $p(Y_k\mid G^*,\Lambda^*)$ (maths §7), so
    $\sum_cw_c\,p(G\mid S^c_{1:k})\to p(G\mid Y_{1:k})$: a
    [`jaxctbn.StructureMixturePosterior`][] of `num_particles` components. When the effective
    number of particles falls below `resample_below` $\times$ `num_particles` they are
    resampled (systematic) to equal weights. Earlier experiments' paths are not redrawn, so over
    many experiments the particles share their early paths; meant for one experiment at a time
    (use [`jaxctbn.panel.SampledStructure`][] for a whole data set). Node $n$ learns only from
    the trajectories in which it is not perfectly intervened on.

    `max_candidates` bounds one bridge's uniformisation times at first: called eagerly, the verb redoes the update with it doubled when a path needs more (up to 1,024; under `jit` an error names it); `solver`
    propagates the filter (default: the dense matrix exponential). A prior that is a mixture of
    another number of components is first resampled to `num_particles`."""

    num_particles: int = eqx.field(default=256, static=True)
    resample_below: float = eqx.field(default=0.5, static=True)
    max_candidates: int = eqx.field(default=64, static=True)
    solver: AbstractMasterEquationSolver = DENSE_SOLVER

    def __check_init__(self):
        check_integer_fields(self, num_particles=1, max_candidates=1)
        if isinstance(self.resample_below, bool) or not 0 <= self.resample_below <= 1:
            raise ValueError(
                f"resample_below: expected a fraction in [0, 1], got {self.resample_below!r}."
            )

    def initial(self, prior: StructurePosterior) -> StructureMixturePosterior:
        return StructureMixturePosterior.copies(prior, self.num_particles)

    def posterior(self, prior, observations, emissions, key, targets, gaps):
        if key is None:
            raise ValueError(
                "key: StructureParticleFilter draws graphs, rates and paths; pass a PRNG key (or "
                "family=StructuralEM() for the deterministic approximation)."
            )
        P = self.num_particles
        key_prior, key_particles, key_resample = jr.split(key, 3)
        if isinstance(prior, StructurePosterior):
            mixture = self.initial(prior)
        elif prior.num_components != P:
            mixture = prior.resampled(systematic_indices(key_prior, prior.log_weights, P))
        else:
            mixture = prior
        parent_sets = mixture.parent_sets

        def particle(c, key):
            key_graph, key_rates, key_paths = jr.split(key, 3)
            component = mixture.component(c)
            indices = component.sample_parent_sets(key_graph)
            model = component.rates_given(indices, key_rates)
            stats = sampled_statistics(
                model, observations, emissions, key_paths, self.solver, self.max_candidates, gaps
            )
            family = panel_family_statistics(stats, parent_sets, intervention_targets=targets)
            return component.update(family), stats.log_likelihood.sum()

        components, log_likelihood = jax.vmap(particle)(jnp.arange(P), jr.split(key_particles, P))
        index, log_weights = reweighted_ancestors(
            key_resample, mixture.log_weights, log_likelihood, self.resample_below
        )
        return StructureMixturePosterior(
            jax.tree_util.tree_map(lambda x: x[index], components), log_weights
        )


DEFAULT_FAMILY = SampledStructure()


@overload
def panel_structure_posterior(
    posterior: StructurePosterior,
    observations: PanelObservations | PanelBuckets,
    *,
    family: StructuralEM,
    key: PRNGKeyArray | None = None,
    emissions: Emissions | None = None,
) -> StructurePosterior: ...


@overload
def panel_structure_posterior(
    posterior: StructurePosterior,
    observations: PanelObservations | PanelBuckets,
    *,
    family: SampledStructure = DEFAULT_FAMILY,
    key: PRNGKeyArray | None = None,
    emissions: Emissions | None = None,
) -> StructureMixturePosterior: ...


@overload
def panel_structure_posterior(
    posterior: StructurePosterior | StructureMixturePosterior,
    observations: PanelObservations | PanelBuckets,
    *,
    family: StructureParticleFilter,
    key: PRNGKeyArray | None = None,
    emissions: Emissions | None = None,
) -> StructureMixturePosterior: ...


@overload
def panel_structure_posterior(
    posterior: StructurePosterior | StructureMixturePosterior,
    observations: PanelObservations | PanelBuckets,
    *,
    family: AbstractPanelStructureFamily,
    key: PRNGKeyArray | None = None,
    emissions: Emissions | None = None,
) -> StructurePosterior | StructureMixturePosterior: ...


def panel_structure_posterior(
    posterior: StructurePosterior | StructureMixturePosterior,
    observations: PanelObservations | PanelBuckets,
    *,
    family: AbstractPanelStructureFamily = DEFAULT_FAMILY,
    key: PRNGKeyArray | None = None,
    emissions: Emissions | None = None,
) -> StructurePosterior | StructureMixturePosterior:
    r"""`posterior` (the history, or the prior) updated with panel trajectories (a flat batch,
    or buckets), in the posterior `family` (module page): by default
    [`jaxctbn.panel.SampledStructure`][], exact as its sweeps grow, which needs `key`;
    [`jaxctbn.panel.StructureParticleFilter`][] for one experiment at a time (the sequential
    loop's; exact as its particles grow, needs `key`);
    [`jaxctbn.panel.StructuralEM`][] for the fast structural-EM approximation (overconfident
    where the visits are sparse).

    **Arguments:**

    - `posterior`: a [`jaxctbn.StructurePosterior`][] (its candidate sets, rate prior, structure
      prior and history of complete-data statistics), or for the particle filter the
      [`jaxctbn.StructureMixturePosterior`][] of its earlier updates.
    - `observations`: [`jaxctbn.panel.PanelObservations`][] (a flat batch) or
      [`jaxctbn.panel.PanelBuckets`][]; exact entry times, missing nodes and perfect
      interventions (node $n$ learns only from the trajectories in which it is not clamped) are
      supported by both families.
    - `family`, `key`: see above.
    - `emissions`: optional [`jaxctbn.panel.Emissions`][] (misclassification), both families.

    **Returns:** a [`jaxctbn.StructurePosterior`][] (structural EM) or a
    [`jaxctbn.StructureMixturePosterior`][] (sampled, with its chains' `diagnostics`; or the
    filter's weighted particles).

    Pure; works under `jit` (the family is static). Called eagerly with the sampled family it
    warns when the chains' diagnostics fail the family's thresholds."""
    if isinstance(posterior, StructureMixturePosterior):
        if not isinstance(family, StructureParticleFilter):
            raise ValueError(
                "posterior: a StructureMixturePosterior is updated by family="
                "StructureParticleFilter() (one experiment at a time); the other families "
                "start from a StructurePosterior (the history or the prior)."
            )
    elif not isinstance(posterior, StructurePosterior):
        raise ValueError(
            "posterior: expected a StructurePosterior (or a StructureMixturePosterior for the "
            f"particle filter), got {type(posterior).__name__}."
        )
    if not isinstance(family, AbstractPanelStructureFamily):
        raise ValueError(
            "family: expected SampledStructure(), StructureParticleFilter() or StructuralEM(), "
            f"got {type(family).__name__}."
        )
    targets = checked_panel_update(observations, 1, len(posterior.names))
    # equal gaps share one transition matrix in the path draws (host-side grouping; not with
    # interventions, whose generators differ per trajectory, nor for traced observations)
    gaps = gap_groups(observations) if observations.intervention is None else None

    def run(family):
        return _posterior(family, posterior, observations, emissions, key, targets, gaps)

    if isinstance(family, SampledStructure) and family.path_sampler is not None:
        bounds = candidate_sampler_bounds(posterior.parent_sets)
        given = family.blanket_bounds
        if given is None:
            family = dataclasses.replace(family, blanket_bounds=bounds)
        elif given[0] < bounds[0] or given[1] < bounds[1]:
            raise ValueError(
                f"blanket_bounds: {given} is below what the candidate sets allow, {bounds} "
                "(children, Markov blanket); leave it None."
            )
        out = _with_buffer_growth(run, family, inputs=(posterior, observations, key))
    elif isinstance(family, SampledStructure | StructureParticleFilter):
        out, _ = with_candidate_growth(run, family, inputs=(posterior, observations, key))
    else:
        out = run(family)
    if isinstance(out, StructureMixturePosterior) and isinstance(family, SampledStructure):
        warn_unconverged(out.diagnostics, family)
    return out


def _with_buffer_growth(run, family: SampledStructure, *, inputs):
    """`run(family)`, waited for; when a Gibbs path needed more than the path sampler's
    buffers, run again with them doubled (up to `MAX_PATH_BUFFER`; then the error stands).
    Under `jit` (traced `inputs`) `run(family)` as is."""
    if not is_concrete(*jax.tree_util.tree_leaves(inputs)):
        return run(family)
    while True:
        try:
            return jax.block_until_ready(run(family))
        except (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError) as error:
            sampler = family.path_sampler
            assert sampler is not None
            sizes = {
                n: getattr(sampler, n) for n in ("max_events", "max_node_events", "max_virtual")
            }
            if not error_message(error).startswith(GIBBS_OVERFLOW) or min(sizes.values()) >= (
                MAX_PATH_BUFFER
            ):
                raise
            grown = {n: min(2 * v, MAX_PATH_BUFFER) for n, v in sizes.items()}
            family = dataclasses.replace(family, path_sampler=dataclasses.replace(sampler, **grown))


#: the largest buffer the eager verb grows a Gibbs path sampler's to
MAX_PATH_BUFFER = 1 << 12


@eqx.filter_jit
def _posterior(family, posterior, observations, emissions, key, targets, gaps):
    return family.posterior(posterior, observations, emissions, key, targets, gaps)
