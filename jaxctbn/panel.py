"""Incompletely observed (panel) data: observations, forward-backward inference, rate fits and
structure learning from panels."""

# ruff: noqa: I001  (grouped as in the package, not alphabetically)

from ._panel.datasets import dataset_path as dataset_path
from ._panel.observations import Emissions as Emissions
from ._panel.expected_statistics import PanelExpectedStatistics as PanelExpectedStatistics
from ._panel.observations import PanelObservations as PanelObservations
from ._panel.buckets import PanelBuckets as PanelBuckets
from ._panel.inference import panel_expected_statistics as panel_expected_statistics
from ._panel.inference import panel_log_likelihood as panel_log_likelihood
from ._panel.fit_methods import AbstractRateFitMethod as AbstractRateFitMethod
from ._panel.fit_methods import EMFit as EMFit
from ._panel.fit_methods import GradientFit as GradientFit
from ._panel.fit_methods import SquaremFit as SquaremFit
from ._panel.rate_fit import RateFit as RateFit
from ._panel.fit import fit_rates as fit_rates
from ._panel.covariates import Covariates as Covariates
from ._panel.prevalence import Prevalence as Prevalence
from ._panel.comparison import LikelihoodRatioTest as LikelihoodRatioTest
from ._panel.uncertainty import RateUncertainty as RateUncertainty
from ._panel.structural_em import PanelStructureFit as PanelStructureFit
from ._panel.structure import learn_structure_from_panels as learn_structure_from_panels
from ._panel.structure_posterior import panel_structure_posterior as panel_structure_posterior
from ._panel.structure_posterior import AbstractPanelStructureFamily as AbstractPanelStructureFamily
from ._panel.structure_posterior import SampledStructure as SampledStructure
from ._panel.structure_posterior import StructuralEM as StructuralEM
from ._panel.structure_posterior import StructureParticleFilter as StructureParticleFilter
from ._panel.rate_posterior import panel_rate_posterior as panel_rate_posterior
from ._panel.rate_families import AbstractPanelRateFamily as AbstractPanelRateFamily
from ._panel.rate_families import SampledGammaMixture as SampledGammaMixture
from ._panel.rate_families import MomentMatchedGamma as MomentMatchedGamma
from ._panel.rate_families import ParticleFilter as ParticleFilter
from ._panel.strength import StrengthProfile as StrengthProfile
from ._panel.strength import learn_strength_from_panels as learn_strength_from_panels
from ._panel.exact_e_step import ForwardBackward as ForwardBackward
from ._panel.gibbs import GibbsSampler as GibbsSampler
from ._panel.importance import PanelImportanceSampler as PanelImportanceSampler
from ._panel.mean_field import PanelMeanField as PanelMeanField
from ._panel.sampled_em import MonteCarloEMFit as MonteCarloEMFit
