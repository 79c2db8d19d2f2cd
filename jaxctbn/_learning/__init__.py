"""Priors and posteriors: conjugate formulas, rate posteriors, exact structure learning and
empirical Bayes."""
