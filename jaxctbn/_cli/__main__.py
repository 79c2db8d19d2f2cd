"""`python -m jaxctbn._cli`."""

from . import console

console()
