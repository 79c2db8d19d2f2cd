r"""How structural EM infers the hidden paths between panel visits: the `e_step=` of
[`jaxctbn.panel.learn_structure_from_panels`][].

Four E-steps, each a Module:

- [`jaxctbn.panel.ForwardBackward`][] (the default): exact expected statistics by forward-backward
  filtering on the amalgamated state space (its cost grows with $\prod_n k_n$); the only one
  that takes `emissions`;
- [`jaxctbn.panel.PanelMeanField`][]: a product of node processes fitted to the observations,
  deterministic, its cost growing with the number of nodes;
- [`jaxctbn.panel.GibbsSampler`][]: complete paths drawn given the observations (Monte Carlo
  structural EM; needs a `key`);
- [`jaxctbn.panel.PanelImportanceSampler`][]: paths from the mean-field law weighed towards the
  exact posterior (needs a `key`).
"""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx

from .._master_equation import MatrixExponential
from .structural_em import PanelStructureFit, StructuralEMProblem

#: The default solver of exact panel inference: panel gaps are long relative to the rates, and
#: the dense exponential has no limit on a gap's length.
DENSE_SOLVER = MatrixExponential()


class AbstractPanelEStep(eqx.Module):
    """An E-step of structural EM from panel data (module docstring). `samples` says whether it
    draws paths (then the fit needs a `key` and stops by its sampling rule); `exact_observations`
    whether it takes only error-free visits (no `emissions`)."""

    samples: ClassVar[bool] = False
    exact_observations: ClassVar[bool] = True

    @abc.abstractmethod
    def structural_em(self, problem: StructuralEMProblem) -> PanelStructureFit:
        """Structural EM with this E-step (`structural_em.py`): the loop to a fixed point for
        the deterministic E-steps, Monte Carlo structural EM for the sampling ones."""

    def check_emissions(self, emissions) -> None:
        """A one-line `ValueError` if this E-step cannot take `emissions`."""
        if emissions is not None and self.exact_observations:
            raise ValueError(
                f"emissions: not supported with e_step={type(self).__name__}(...) (exact "
                "observations only); use e_step=ForwardBackward()."
            )
