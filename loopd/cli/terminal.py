"""The terminal's subcommands: ``chat`` and ``run``.

Each imports its front end when it runs (``loopd run`` never loads the chat's line editor and
log search), with SIGINT deferred meanwhile as for every command's imports (``loopd.cli.base``).
"""

from __future__ import annotations

import argparse

from loopcommon.entry import Importing
from loopd.config import Settings
from loopd.statedir import check_state_dir


def chat(args: argparse.Namespace, settings: Settings) -> int:
    with Importing():
        from loopd.terminal.chat import ChatOptions, run_chat

    check_state_dir(settings.state_dir, create=True)
    options = ChatOptions(args.session, args.show_thinking, args.log_stderr, args.expected_dir)
    return run_chat(settings, options)


def run(args: argparse.Namespace, settings: Settings) -> int:
    with Importing():
        from loopd.terminal.oneshot import RunOptions, run_once

    check_state_dir(settings.state_dir, create=True)
    options = RunOptions(
        args.prompt,
        args.session,
        args.json,
        args.show_thinking,
        args.log_stderr,
        args.expected_dir,
    )
    return run_once(settings, options)
