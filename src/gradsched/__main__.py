"""``python -m gradsched``: the command line (:mod:`gradsched.cli`)."""

import sys

from .cli import main

sys.exit(main())
