"""The files shipped inside the loopd package, by path.

Named here, in a module that imports nothing else, so that the command line's parser can give
them as defaults without importing what reads them (the self-test, the configuration).
"""

from pathlib import Path
from typing import Final

DATA_DIR: Final = Path(__file__).resolve().parent / "data"
EXPECTED_DIR: Final = DATA_DIR / "expected"
"""The self-test's recorded expectations, one file per model (``loopd.selftest.expected``)."""
CORE_TOOLS_FILE: Final = DATA_DIR / "tools.schema.json"
"""The core tools array sent in every request of an epoch (``LOOPD_TOOLS_FILE``'s default)."""
