"""The console scripts' entry points: ``loopd`` and ``brokerd`` start here.

A Ctrl-C can come at any moment: also while the interpreter is still importing the command line
(a second or more on a cold start), and after ``main`` has returned, while the interpreter winds
down. This module imports nothing heavy, so the only window in which an interrupt is not caught
here is the interpreter's own start-up (where SIGINT still kills it quietly). From the first
import of the command line on, an interrupt that no command handled ends the program with one line
on stderr and exit status 130, never a traceback.
"""

from __future__ import annotations

import gc as _gc
import sys

# Only modules built into the interpreter at run time: importing them runs no Python code, so no
# Ctrl-C can land in them before ``run_program``'s handler is in place. ``typing`` and ``signal``
# (the Python module, which turns its constants into enums on import) take a measurable while on
# a loaded machine; the type checker reads ``signal``, the program runs its built-in ``_signal``.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal
    from collections.abc import Callable
    from typing import Final, NoReturn
else:
    import _signal

EXIT_INTERRUPTED: Final = 130


class Importing:
    """``with Importing():`` around a program's imports: SIGINT waits while the block runs and
    comes right after it, and the cyclic garbage collector waits too.

    SIGINT: an interrupt inside an extension module's import (a Rust one panics when its own
    imports fail) would otherwise be that module's error with its traceback, not a
    ``KeyboardInterrupt``. The command line imports what a command needs only once it knows
    the command (``loopd.cli``), so each of those imports is made in such a block too.

    The collector: what imports make (modules, classes, functions) lives as long as the process,
    and the collector walked it over and over for nothing, about 130 passes and a tenth of
    ``loopd run``'s CPU before its request (``make bench``). In a program started by
    ``run_program`` it is moved out of the collector's reach after the block (``gc.freeze``);
    elsewhere (a test calling a ``main`` in its own process) the collector only waits.
    """

    def __enter__(self) -> None:
        _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT})
        self._collecting = _gc.isenabled()
        _gc.disable()

    def __exit__(self, *exc_info: object) -> None:
        if _program_started:
            _gc.freeze()
        if self._collecting:
            _gc.enable()
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {_signal.SIGINT})


_program_started = False
"""Set by ``run_program``: this process is a program of its own, not a test's."""


# httpx imports its own command line (click, rich's console, pygments: a tenth of ``loopd run``'s
# start) whenever those are installed, and loopd's dependencies install them; neither program
# runs it. An entry of None makes that import fail, which httpx expects where they are missing.
_UNUSED_MODULES = ("httpx._main",)


def run_program(program: str, module: str) -> int:
    """Import ``module`` and call its ``main``; an interrupt anywhere in it is one line."""
    global _program_started
    _program_started = True
    for unused in _UNUSED_MODULES:
        sys.modules.setdefault(unused, None)  # type: ignore[arg-type]
    try:
        import importlib

        with Importing():
            main: Callable[[], int] = importlib.import_module(module).main
        return main()
    except KeyboardInterrupt:
        _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # a second Ctrl-C while this is written
        print(f"{program}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _exit(status: int) -> NoReturn:
    # The command has finished: a Ctrl-C now (while stdout is flushed, worker threads are
    # joined) would only print "Exception ignored" with a traceback.
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    sys.exit(status)


def loopd() -> NoReturn:
    _exit(run_program("loopd", "loopd.cli.main"))


def brokerd() -> NoReturn:
    _exit(run_program("brokerd", "brokerd.cli"))
