"""The terminal's subcommands: ``chat`` and ``run``."""

from __future__ import annotations

import argparse

from loopd.cli.base import add_expected_dir
from loopd.config import Settings
from loopd.statedir import check_state_dir


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    chat = subparsers.add_parser("chat", help="talk to the model in this terminal (one thread)")
    chat.add_argument("--session", default="terminal", help="session name (default: terminal)")
    _turn_options(chat)
    chat.set_defaults(handler=_chat)

    run = subparsers.add_parser(
        "run",
        help="one turn, not interactive: the answer on stdout",
        epilog="Exit status: 0 answered; 1 the turn ended without an answer (one line on "
        "stderr says why); 2 loopd could not run it (configuration, server, log); 130 stopped "
        "by Ctrl-C.",
    )
    run.add_argument("prompt", metavar="PROMPT", help="the message (- reads it from stdin)")
    run.add_argument("--session", help="session name (default: a new session for this run)")
    run.add_argument(
        "--json",
        action="store_true",
        help="one JSON object: the answer, the tool calls and the perf records",
    )
    _turn_options(run)
    run.set_defaults(handler=_run)


def _turn_options(parser: argparse.ArgumentParser) -> None:
    add_expected_dir(parser)
    parser.add_argument(
        "--show-thinking",
        action="store_true",
        help="show the model's thinking whole (default: folded to one line)",
    )
    parser.add_argument(
        "--log-stderr",
        action="store_true",
        help="logs on stderr even on a terminal (default there: a file in the state dir)",
    )


def _chat(args: argparse.Namespace, settings: Settings) -> int:
    from loopd.terminal.chat import ChatOptions, run_chat

    check_state_dir(settings.state_dir, create=True)
    options = ChatOptions(args.session, args.show_thinking, args.log_stderr, args.expected_dir)
    return run_chat(settings, options)


def _run(args: argparse.Namespace, settings: Settings) -> int:
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
