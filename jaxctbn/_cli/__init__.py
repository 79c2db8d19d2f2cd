"""The `jaxctbn` command line, one file per command, and the JAX process setup."""

from .main import main as main
