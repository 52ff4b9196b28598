"""The garbage collector around a program's imports (``loopcommon.entry.Importing``): what the
imports made is out of its reach in a program, and it collects again once they are done."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from loopcommon.entry import Importing

PROBE = """
import gc
import weakref

from loopcommon.entry import Importing


class Cycle:
    pass


def main() -> int:
    with Importing():
        import json  # a command's imports
    frozen = gc.get_freeze_count()
    cycle = Cycle()
    cycle.itself = cycle
    gone = weakref.ref(cycle)
    del cycle
    gc.collect()
    print(gc.isenabled(), frozen > 0, gone() is None)
    return 0
"""


def test_a_program_freezes_its_imports_and_collects_after_them(tmp_path: Path) -> None:
    (tmp_path / "collectprobe.py").write_text(textwrap.dedent(PROBE))
    code = "import sys, loopcommon.entry as e; sys.exit(e.run_program('p', 'collectprobe'))"
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    # The collector is on (a daemon that left it off would keep every cycle it made), the
    # imports were frozen, and a cycle made afterwards was collected.
    assert result.stdout.split() == ["True", "True", "True"]


def test_elsewhere_the_collector_only_waits() -> None:
    # A test calling a command's ``main`` in its own process: nothing of it is frozen.
    frozen = gc.get_freeze_count()
    with Importing():
        assert not gc.isenabled()
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen
