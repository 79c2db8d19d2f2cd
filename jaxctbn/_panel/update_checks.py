"""The checks and warnings shared by the panel posterior updates (rates and structure):
one-line errors naming an argument, and the host-side warning when sampled chains fail their
convergence thresholds."""

from __future__ import annotations

import warnings
from typing import Protocol, runtime_checkable

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Bool

from .._learning.gamma_mixture import ChainDiagnostics
from .._learning.structure_mixture import StructureChainDiagnostics
from .._model.interventions import is_concrete
from .buckets import PanelBuckets
from .observations import PanelObservations


def checked_panel_update(
    observations: PanelObservations | PanelBuckets, iterations: int, num_nodes: int
) -> Bool[Array, "trajectories nodes"] | None:
    """Check the arguments of a posterior update from panel trajectories (one-line errors
    naming them) and return which nodes each trajectory clamps (`None`: no intervention)."""
    if not isinstance(observations, PanelObservations | PanelBuckets):
        raise ValueError(
            f"observations: expected a PanelObservations or PanelBuckets, got "
            f"{type(observations).__name__}."
        )
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations: expected an integer >= 1, got {iterations!r}.")
    if len(observations.batch_shape) != 1:
        raise ValueError("observations: expected a batch with one leading axis.")
    if observations.intervention is None:
        return None
    return jnp.broadcast_to(
        jnp.asarray(observations.intervention.targets, bool),
        (observations.batch_shape[0], num_nodes),
    )


def check_integer_fields(module: eqx.Module, **least: int) -> None:
    """A one-line `ValueError` naming the first field of `module` that is not an integer at
    least its bound in `least`."""
    for name, bound in least.items():
        value = getattr(module, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < bound:
            raise ValueError(f"{name}: expected an integer >= {bound}, got {value!r}.")


@runtime_checkable
class _ConvergenceThresholds(Protocol):
    """A sampled family's convergence thresholds (`SampledGammaMixture`, `SampledStructure`)."""

    max_r_hat: float
    min_ess: float


def warn_unconverged(
    diagnostics: ChainDiagnostics | StructureChainDiagnostics | None,
    family: _ConvergenceThresholds,
) -> None:
    """A `RuntimeWarning` naming the setting to raise when concrete diagnostics fail the
    family's thresholds `max_r_hat`, `min_ess` (and, for Hamiltonian chains, any divergent
    transition); nothing under `jit`. Shared by the rate and the structure samplers."""
    if diagnostics is None:
        return
    r_hat = diagnostics.max_split_r_hat()
    ess = diagnostics.min_effective_sample_size()
    if not is_concrete(r_hat, ess):
        return
    r_hat, ess = float(r_hat), float(ess)
    hamiltonian = isinstance(diagnostics, ChainDiagnostics)
    divergent = int(diagnostics.divergent_transitions) if hamiltonian else 0
    if r_hat > family.max_r_hat or ess < family.min_ess or divergent > 0:
        if hamiltonian:
            what, of = "panel rate posterior", "R-hat"
            tail = f"; {divergent} divergent transitions); raise num_draws"
        else:
            what, of = "panel structure posterior", "R-hat of the edge marginals"
            tail = "); raise num_sweeps"
        warnings.warn(
            f"{what}: the chains may not have converged (largest split {of} {r_hat:.3f}, "
            f"limit {family.max_r_hat}; smallest effective sample size {ess:.0f}, limit "
            f"{family.min_ess:g}{tail} (and burn_in) of {type(family).__name__}.",
            RuntimeWarning,
            stacklevel=3,
        )
