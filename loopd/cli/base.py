"""What every subcommand module shares: the handler's type, and the handler of a command that
reads the session log."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO, TypeAlias

from loopd.config import Settings
from loopd.selftest.expected import DEFAULT_DIR
from loopd.statedir import check_state_dir

Handler = Callable[[argparse.Namespace, Settings], int]
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
# A command that reads the log: the parsed arguments, the log's path, stdout and stderr.
LogCommand = Callable[[argparse.Namespace, Path, TextIO, TextIO], int]


def log_handler(command: LogCommand) -> Handler:
    """The handler of a command that reads the session log: the state folder is checked (one
    line naming LOOPD_STATE_DIR if loopd cannot use it), then ``command`` runs on the log's path
    with the process's stdout and stderr."""

    def handler(args: argparse.Namespace, settings: Settings) -> int:
        check_state_dir(settings.state_dir, create=False)
        return command(args, settings.db_path, sys.stdout, sys.stderr)

    return handler


def add_expected_dir(parser: argparse.ArgumentParser) -> None:
    """``--expected-dir``, for ``selftest``, ``serve``, ``chat`` and ``run``: expectations
    recorded on the host for the operator's own server, so the image needs no rebuild (``chat``
    and ``run`` go by what they record of durable sessions and the slot pool)."""
    parser.add_argument(
        "--expected-dir",
        type=Path,
        default=DEFAULT_DIR,
        help="folder of the self-test's expectations files (default: the one in the package)",
    )
