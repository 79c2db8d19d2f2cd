r"""The checks of [`jaxctbn.panel.fit_rates`][]'s arguments, shared with the rates' standard
errors (`uncertainty.py`), and what both pass to the compiled fit: the prior as arrays, the
intervals grouped by length and the method with its tolerance as data."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from .._learning.priors import GammaPrior, check_prior
from .._master_equation import AbstractMasterEquationSolver
from .._model.ctbn import CTBN
from .._model.interventions import is_concrete
from .buckets import PanelBuckets, as_flat_buckets
from .covariates import Covariates
from .e_step import DENSE_SOLVER
from .fit_methods import AbstractRateFitMethod, GradientFit, SquaremFit
from .gap_groups import gap_groups
from .observations import Emissions, PanelObservations

DEFAULT_METHOD = SquaremFit()
DEFAULT_PANEL_SOLVER = DENSE_SOLVER


def check_fit_covariates(covariates, observations, method) -> None:
    if not isinstance(covariates, Covariates):
        raise ValueError(
            f"covariates: expected a jaxctbn.panel.Covariates or None, got "
            f"{type(covariates).__name__}."
        )
    if not isinstance(method, GradientFit):
        raise ValueError(
            f"method: covariate effects have no closed-form EM update; fit them with "
            f"GradientFit() (the default with covariates), got {type(method).__name__}."
        )
    batch = (
        (observations.num_trajectories,)
        if isinstance(observations, PanelBuckets)
        else observations.batch_shape
    )
    leading = covariates.values.shape[:-1]
    if covariates.per_observation:
        slots = max(b.times.shape[-1] for b in as_flat_buckets(observations))
        if leading[:-1] != batch or leading[-1] < slots:
            raise ValueError(
                f"covariates: per_observation values need leading axes {batch + (slots,)} (one "
                f"row per observation slot of each trajectory), got {covariates.values.shape}."
            )
    elif leading != batch:
        raise ValueError(
            f"covariates: expected one row per trajectory, leading axes {batch}, got values of "
            f"shape {covariates.values.shape}."
        )
    check_identifiable(covariates)


def check_identifiable(covariates: Covariates) -> None:
    """A one-line `ValueError` when the effects on some rate are not identifiable: covariates
    whose values are linearly dependent once centred (their effects trade against one another;
    a constant covariate is refused by `Covariates` itself). Checked per rate over the
    covariates acting on it (concrete values only; the rows of per-observation values include
    padding slots, which repeat a trajectory's last row)."""
    if not is_concrete(covariates.values):
        return
    values = np.asarray(covariates.values, float)
    rows = values.reshape(-1, values.shape[-1])
    names = list(covariates.names) if covariates.names else [f"#{c}" for c in range(rows.shape[1])]
    centred = rows - rows.mean(0)
    if covariates.acts_on is None:
        patterns = {tuple(range(rows.shape[1]))}
    else:
        acts = [np.asarray(a, bool).reshape(a.shape[0], -1) for a in covariates.acts_on]
        patterns = {
            tuple(int(c) for c in np.nonzero(a[:, j])[0]) for a in acts for j in range(a.shape[1])
        }
    for pattern in sorted(patterns, key=len, reverse=True):
        if len(pattern) < 2:
            continue
        block = centred[:, list(pattern)] / np.abs(centred[:, list(pattern)]).max(0)
        _, sing, vt = np.linalg.svd(block, full_matrices=False)
        if sing[-1] <= 1e-8 * sing[0]:
            involved = [names[pattern[i]] for i in np.nonzero(np.abs(vt[-1]) > 1e-6)[0]]
            raise ValueError(
                f"covariates: {involved} are collinear (one is a linear function of the others "
                "over the data): their effects on a rate they act on together cannot be told "
                "apart; drop one."
            )


def tolerance_as_data(method, dtype):
    """`method` with its `tolerance` an array of `dtype`: data, so that a new tolerance does not
    recompile the fit (a Python float in a Module is static under `eqx.filter_jit`)."""
    tolerance = method.tolerance
    tolerance = np.asarray(tolerance, dtype) if is_concrete(tolerance) else tolerance
    return eqx.tree_at(lambda m: m.tolerance, method, jnp.asarray(tolerance, dtype))


def checked_fit_arguments(model, observations, method, prior, emissions, solver, verb: str):
    """The checks shared by `fit_rates` and `rate_uncertainty`, and what both pass to the
    compiled program: the prior as arrays, the intervals grouped by length (or `None`) and
    `method` with its tolerance as data."""
    if not isinstance(model, CTBN):
        raise ValueError(f"model: {verb} needs a CTBN (a fixed graph), got {type(model).__name__}.")
    if not isinstance(observations, PanelObservations | PanelBuckets):
        raise ValueError(
            f"observations: expected a PanelObservations or PanelBuckets, got "
            f"{type(observations).__name__}."
        )
    if observations.num_nodes != model.num_nodes:
        raise ValueError(
            f"observations: have {observations.num_nodes} nodes, the model has {model.num_nodes}."
        )
    if not isinstance(method, AbstractRateFitMethod):
        raise ValueError(
            f"method: expected SquaremFit(), EMFit() or GradientFit(), got {type(method).__name__}."
        )
    if prior is not None:
        if not isinstance(prior, GammaPrior):
            raise ValueError(
                f"prior: {verb} needs a GammaPrior (one Gamma per rate) or None, got "
                f"{type(prior).__name__}."
            )
        check_prior(prior, model.num_nodes)
    if emissions is not None and not isinstance(emissions, Emissions):
        raise ValueError(f"emissions: expected an Emissions, got {type(emissions).__name__}.")
    if not isinstance(solver, AbstractMasterEquationSolver):
        raise ValueError(f"solver: expected a master-equation solver, got {type(solver).__name__}.")
    if is_concrete(*model.cims):
        for name, c in zip(model.names, model.cims):
            c = np.asarray(c)
            off = c[..., ~np.eye(c.shape[-1], dtype=bool)]
            if not np.all(np.isfinite(off)) or np.any(off < 0):
                raise ValueError(
                    f"model: the starting rates of node {name!r} must be finite and >= 0."
                )
    observations.checked(model, emissions)  # a ValueError now for concrete states
    counts = [b.num_observations for b in as_flat_buckets(observations)]
    if is_concrete(*counts) and not any(np.any(np.asarray(m) >= 2) for m in counts):
        raise ValueError(
            "observations: every trajectory has a single observation time, so there is no "
            "interval to fit rates from; each subject needs at least two visits."
        )
    # host-side (numpy) arrays where possible: each eager jax operation costs a dispatch
    dtype = np.dtype(jnp.result_type(*model.cims))
    method = tolerance_as_data(method, dtype)
    # the prior as arrays: one compiled fit serves every prior, and none
    N = model.num_nodes
    if prior is None:
        parameters = (np.ones(N, dtype), np.zeros(N, dtype), np.asarray(False))
    else:
        pairs = [prior.node_parameters(n) for n in range(N)]
        parameters = (
            jnp.stack([jnp.asarray(a, dtype) for a, _ in pairs]),
            jnp.stack([jnp.asarray(b, dtype) for _, b in pairs]),
            jnp.asarray(True),
        )
    # intervals of equal length share their dense exponentials (see `pooled_by_gaps`): only
    # for concrete data without interventions and the dense solver
    groups = None
    no_intervention = as_flat_buckets(observations)[0].intervention is None
    if no_intervention and solver.tabulates_gaps:
        groups = gap_groups(observations)
    return parameters, groups, method
