"""``python -m tests.soak``: see :mod:`tests.soak`."""

import sys

from .runner import main

sys.exit(main())
