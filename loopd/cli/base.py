"""What every subcommand module shares: the handler's type, the ``Command`` that names a
handler without importing it, and the handler of a command that reads the session log.

Imported by the parser (``loopd.cli.parser``) for every command, ``--help`` and ``--version``
included, so it imports nothing but the standard library at run time.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, TypeAlias

from loopcommon.entry import Importing
from loopd.statedir import check_state_dir

if TYPE_CHECKING:
    from loopd.config import Settings

Handler = Callable[[argparse.Namespace, "Settings"], int]
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
# A command that reads the log: the parsed arguments, the log's path, stdout and stderr.
LogCommand = Callable[[argparse.Namespace, Path, TextIO, TextIO], int]


@dataclass(frozen=True)
class Command:
    """A subcommand's handler, named by its module and function: the module (and all it
    imports) is imported only when the command runs, so that the parser of every command is
    built without the dependencies of any (``loopd --version`` loads none of them).

    ``event_loop``: the command runs an anyio event loop, so the fix of anyio's Unix-socket race
    (``loopcommon.anyio_unix_connect``) goes in first.
    """

    module: str
    function: str
    event_loop: bool = False

    def __call__(self, args: argparse.Namespace, settings: Settings) -> int:
        return self.handler()(args, settings)

    def handler(self) -> Handler:
        """The handler, its module imported (SIGINT waits meanwhile: see ``Importing``)."""
        with Importing():
            if self.event_loop:
                from loopcommon import anyio_unix_connect

                anyio_unix_connect.apply()
            found: Handler = getattr(importlib.import_module(self.module), self.function)
        return found


def log_handler(command: LogCommand) -> Handler:
    """The handler of a command that reads the session log: the state folder is checked (one
    line naming LOOPD_STATE_DIR if loopd cannot use it), then ``command`` runs on the log's path
    with the process's stdout and stderr."""

    def handler(args: argparse.Namespace, settings: Settings) -> int:
        check_state_dir(settings.state_dir, create=False)
        return command(args, settings.db_path, sys.stdout, sys.stderr)

    return handler
