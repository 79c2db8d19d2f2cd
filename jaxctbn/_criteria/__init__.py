"""Design criteria: the criterion Modules, parameter and structure criteria, KL estimators and
batching."""
