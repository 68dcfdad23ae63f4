"""``python -m soak``: see :mod:`soak`."""

import sys

from .runner import main

sys.exit(main())
