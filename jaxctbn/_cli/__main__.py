"""`python -m jaxctbn._cli`."""

import sys

from .main import main

sys.exit(main())
