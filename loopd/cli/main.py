"""The ``loopd`` command line. Each subcommand is a thin shell over a module that does the work.

Every subcommand is registered one way: its module's ``register(subparsers)`` adds a parser and
sets ``handler``, a ``Handler`` that ``main`` calls with the parsed arguments and the settings
once they are loaded and logging is set up. It returns the exit status.

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
from collections.abc import Callable, Sequence
from typing import Final

from loopcommon import anyio_unix_connect
from loopcommon.errors import DaemonError
from loopcommon.logsetup import configure_logging
from loopcommon.sanitize import for_terminal
from loopcommon.version import package_version
from loopd.cli.base import Handler, Subparsers
from loopd.config import Settings, load_settings, settings_table
from loopd.terminal.completion import SHELLS, completion_script

EXIT_FAILED: Final = 2
EXIT_INTERRUPTED: Final = 130
EXIT_STDOUT_CLOSED: Final = 128 + 13  # SIGPIPE


def _cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    if args.table:
        print(settings_table())
    else:
        print(settings.model_dump_json(indent=2))
    return 0


def _cmd_completion(args: argparse.Namespace, settings: Settings) -> int:
    print(completion_script(build_parser(), args.shell), end="")
    return 0


def _register_builtin(sub: Subparsers) -> None:
    config = sub.add_parser("config", help="print the effective configuration")
    config.add_argument("--table", action="store_true", help="print the README's tables of knobs")
    config.set_defaults(handler=_cmd_config)
    completion = sub.add_parser("completion", help="print a shell completion script (bash or zsh)")
    completion.add_argument("shell", choices=SHELLS)
    completion.set_defaults(handler=_cmd_completion)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loopd",
        description="Agent sessions on llama-server.",
        epilog="Exit status: 0 done; 1 a check found a problem (log verify, selftest); 2 loopd "
        "could not do what was asked (one line on stderr says why); 130 interrupted; 141 stdout "
        "closed early.",
    )
    parser.add_argument("--version", action="version", version=package_version("loopd"))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in _registrations():
        register(sub)
    return parser


def _registrations() -> list[Callable[[Subparsers], None]]:
    """Every module's ``register``; imported here so ``loopd --help`` needs no more than this."""
    from loopd.cli.log import register as register_log
    from loopd.cli.perf import register as register_perf
    from loopd.cli.selftest import register as register_selftest
    from loopd.cli.serve import register as register_serve
    from loopd.cli.terminal import register as register_terminal
    from loopd.cli.tools import register as register_tools
    from loopd.cli.usage import register as register_usage

    return [
        _register_builtin,
        register_terminal,
        register_serve,
        register_log,
        register_perf,
        register_usage,
        register_selftest,
        register_tools,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    anyio_unix_connect.apply()
    args = build_parser().parse_args(argv)
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
