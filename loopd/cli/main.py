"""The ``loopd`` command line. Each subcommand is a thin shell over a module that does the work.

Every subcommand is declared in ``loopd.cli.parser`` with a ``Command`` as its ``handler``: the
module and function that run it, imported once the arguments are parsed, the settings loaded
and logging set up; it returns the exit status. Until then nothing but the standard library and
the parser is imported, so ``--version`` and ``--help`` answer at once.

Exit status:

- 0: done.
- 1: a check found a problem: ``log verify`` (a broken hash chain or replay identity, a damaged,
  foreign or unreadable log file), ``selftest`` and ``serve``'s self-test (a server that differs
  from the recorded expectations).
- 2: loopd could not do what was asked: bad configuration (an unknown ``LOOPD_*`` variable, a bad
  value, settings that contradict each other), a state folder it cannot use, a log file that is
  not a loopd log, a session that does not exist, a server it cannot reach, a bad tools file.
- 130: interrupted (Ctrl-C).
- 141: stdout was closed before loopd finished writing (``loopd sessions | head -1``): loopd stops
  quietly, as a tool killed by SIGPIPE does.

A failure is one line on stderr, ``loopd: ...``; a user's mistake never prints a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from loopcommon.entry import Importing
from loopcommon.errors import DaemonError
from loopcommon.sanitize import for_terminal
from loopd.cli.base import Handler
from loopd.cli.parser import build_parser

if TYPE_CHECKING:
    from loopd.config import Settings

EXIT_FAILED: Final = 2
EXIT_INTERRUPTED: Final = 130
EXIT_STDOUT_CLOSED: Final = 128 + 13  # SIGPIPE


def config(args: argparse.Namespace, settings: Settings) -> int:
    from loopd.config import settings_table

    if args.table:
        print(settings_table())
    else:
        print(settings.model_dump_json(indent=2))
    return 0


def completion(args: argparse.Namespace, settings: Settings) -> int:
    from loopd.terminal.completion import completion_script

    print(completion_script(build_parser(), args.shell), end="")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with Importing():  # pydantic's core is a Rust extension (see ``Importing``)
        from loopcommon.logsetup import configure_logging
        from loopd.config import load_settings
    try:
        settings = load_settings()
    except DaemonError as exc:
        return _fail(exc)
    configure_logging(settings.log_format, settings.log_level)
    handler: Handler = args.handler
    try:
        status = handler(args, settings)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
    except DaemonError as exc:
        return _fail(exc)
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_STDOUT_CLOSED
    except KeyboardInterrupt:
        print("loopd: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return status


def _fail(exc: DaemonError) -> int:
    # The message may quote what a server, the model or the box sent: shown, never obeyed.
    print(f"loopd: {for_terminal(str(exc))}", file=sys.stderr)
    return EXIT_FAILED


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that what is still buffered for the closed pipe is dropped
    without the interpreter reporting a second BrokenPipeError at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
