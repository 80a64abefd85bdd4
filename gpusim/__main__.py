"""``python -m gpusim``: the command line, where the ``gpusim`` script is not installed."""

import sys

from gpusim.cli import main

sys.exit(main())
