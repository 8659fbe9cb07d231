"""``python -m vlp``: the ``vlp`` command, where the console script is not installed."""

import sys

from vlp.cli import main

sys.exit(main())
