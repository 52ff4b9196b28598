"""``python -m brokerd``."""

import sys

from brokerd.cli import main

sys.exit(main())
