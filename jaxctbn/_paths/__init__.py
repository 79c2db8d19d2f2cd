"""Complete paths: exact sampling, their sufficient statistics, and the trajectory CSV route."""
