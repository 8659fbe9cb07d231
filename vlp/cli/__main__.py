"""``python -m vlp.cli``: the ``vlp`` command, as ``accelerate launch -m vlp.cli`` and ``torchrun -m vlp.cli`` run it."""

import sys

from vlp.cli import main

sys.exit(main())
