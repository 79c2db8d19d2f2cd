"""The generator, the master equation and the expected statistics it yields: exact solvers
and the approximate ones (mean field, Monte Carlo) side by side."""
