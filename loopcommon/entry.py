"""The console scripts' entry points: ``loopd`` and ``brokerd`` start here.

A Ctrl-C can come at any moment: also while the interpreter is still importing the command line
(a second or more on a cold start), and after ``main`` has returned, while the interpreter winds
down. This module imports nothing heavy, so the only window in which an interrupt is not caught
here is the interpreter's own start-up (where SIGINT still kills it quietly). From the first
import of the command line on, an interrupt that no command handled ends the program with one line
on stderr and exit status 130, never a traceback.
"""

from __future__ import annotations

import importlib
import signal
import sys

# ``typing`` takes a measurable while to import on a loaded machine, long enough for a Ctrl-C to
# land in it before any handler here runs: the annotations' names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Final, NoReturn

EXIT_INTERRUPTED: Final = 130


def run_program(program: str, module: str) -> int:
    """Import ``module`` and call its ``main``; an interrupt anywhere in it is one line."""
    try:
        main: Callable[[], int] = importlib.import_module(module).main
        return main()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while this line is written
        print(f"{program}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _exit(status: int) -> NoReturn:
    # The command has finished: a Ctrl-C now (while stdout is flushed, worker threads are
    # joined) would only print "Exception ignored" with a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(status)


def loopd() -> NoReturn:
    _exit(run_program("loopd", "loopd.cli.main"))


def brokerd() -> NoReturn:
    _exit(run_program("brokerd", "brokerd.cli"))
