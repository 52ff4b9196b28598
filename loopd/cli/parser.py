"""The ``loopd`` command line's parser: every subcommand and its options, declared here.

Each subcommand's handler is a ``Command`` naming the module and function that run it, so the
parser is built without importing any command's module: ``loopd --version`` and ``loopd --help``
cost the interpreter's start and this file, and a command imports only what it runs
(``tests/test_architecture.py`` keeps the heavy dependencies out). The handlers live in one
module per group of subcommands (``loopd.cli.log``, ``loopd.cli.perf``, ...).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from loopd.cli.base import Command, Subparsers
from loopd.datafiles import EXPECTED_DIR

SHELLS: Final = ("bash", "zsh")
"""The shells ``loopd completion`` writes a script for."""


class _Version(argparse.Action):
    """``--version``: the installed version, looked up only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from loopcommon.version import package_version

        print(package_version(parser.prog))
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loopd",
        description="Agent sessions on llama-server.",
        epilog="Exit status: 0 done; 1 a check found a problem (log verify, selftest); 2 loopd "
        "could not do what was asked (one line on stderr says why); 130 interrupted; 141 stdout "
        "closed early.",
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _builtin(sub)
    _terminal(sub)
    _serve(sub)
    _log(sub)
    _perf(sub)
    _usage(sub)
    _selftest(sub)
    _tools(sub)
    return parser


def _builtin(sub: Subparsers) -> None:
    config = sub.add_parser("config", help="print the effective configuration")
    config.add_argument("--table", action="store_true", help="print the README's tables of knobs")
    config.set_defaults(handler=Command("loopd.cli.main", "config"))
    completion = sub.add_parser("completion", help="print a shell completion script (bash or zsh)")
    completion.add_argument("shell", choices=SHELLS)
    completion.set_defaults(handler=Command("loopd.cli.main", "completion"))


def _terminal(sub: Subparsers) -> None:
    chat = sub.add_parser("chat", help="talk to the model in this terminal (one thread)")
    chat.add_argument("--session", default="terminal", help="session name (default: terminal)")
    _turn_options(chat)
    chat.set_defaults(handler=Command("loopd.cli.terminal", "chat", event_loop=True))

    run = sub.add_parser(
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
    run.set_defaults(handler=Command("loopd.cli.terminal", "run", event_loop=True))


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


def _serve(sub: Subparsers) -> None:
    parser = sub.add_parser(
        "serve", help="run the daemon: Mattermost threads drive sessions (LOOPD_MM_* settings)"
    )
    parser.add_argument(
        "--skip-selftest",
        action="store_true",
        help="start without checking the server (development only)",
    )
    add_expected_dir(parser)
    parser.set_defaults(handler=Command("loopd.cli.serve", "handler", event_loop=True))


def _log(sub: Subparsers) -> None:
    sessions = sub.add_parser("sessions", help="list sessions and what each waits for")
    sessions.set_defaults(handler=Command("loopd.cli.log", "run_sessions"))
    log = sub.add_parser("log", help="read and check the session log")
    log_commands = log.add_subparsers(dest="log_command", required=True)
    show = log_commands.add_parser("show", help="print a session's entries")
    show.add_argument("session")
    show.set_defaults(handler=Command("loopd.cli.log", "run_show"))
    export = log_commands.add_parser(
        "export", help="a session as JSON lines, a markdown transcript or OpenAI messages"
    )
    export.add_argument("session", nargs="?", help="default: the session written to last")
    export.add_argument("--format", choices=("jsonl", "markdown", "openai"), default="jsonl")
    export.set_defaults(handler=Command("loopd.cli.log", "run_export"))
    check = log_commands.add_parser("verify", help="check the hash chain and replay identity")
    check.add_argument("session", nargs="?")
    check.set_defaults(handler=Command("loopd.cli.log", "run_verify"))
    search = log_commands.add_parser(
        "search",
        help="the entries of every session that mention all the words, newest first",
        epilog="Each word is searched as text (no query syntax); case and accents do not "
        "matter. Exit status: 0 found, 1 nothing found, 2 the log cannot be read.",
    )
    search.add_argument("words", nargs="+", metavar="WORD")
    search.add_argument("--session", help="only this session's entries")
    search.add_argument("--limit", type=positive, help="list at most this many entries, the newest")
    search.set_defaults(handler=Command("loopd.cli.log", "run_search"))
    backup = log_commands.add_parser(
        "backup", help="copy the session log and chat state into a new folder, and verify it"
    )
    backup.add_argument("dest", type=Path, help="a folder that does not exist yet, or is empty")
    backup.set_defaults(handler=Command("loopd.cli.log", "run_backup"))
    restore = log_commands.add_parser(
        "restore", help="replace the state with a backup (loopd serve must be stopped)"
    )
    restore.add_argument("source", type=Path, help="a folder `loopd log backup` wrote")
    restore.set_defaults(handler=Command("loopd.cli.log", "run_restore"))


def positive(text: str) -> int:
    """A whole number of 1 or more, for an option's ``type``."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return value


def _perf(sub: Subparsers) -> None:
    perf = sub.add_parser("perf", help="the wait people saw, cache reuse and times per request")
    perf.add_argument("--session", help="one session (default: every session)")
    perf.add_argument("--json", action="store_true", help="the records as a JSON list")
    perf.add_argument(
        "--since", metavar="WHEN", help="only requests since WHEN: 30m, 2h, 7d or an ISO date"
    )
    perf.add_argument(
        "--plot",
        metavar="FILE.png",
        type=Path,
        help="draw prompt_n, cache_n, the wait for the first token and tokens/s (matplotlib)",
    )
    perf.set_defaults(handler=Command("loopd.cli.perf", "handler"))


def _usage(sub: Subparsers) -> None:
    usage = sub.add_parser("usage", help="tokens and GPU seconds per person, channel and day")
    usage.add_argument("--json", action="store_true", help="the rows as a JSON list")
    usage.add_argument(
        "--since", metavar="WHEN", help="only requests since WHEN: 30m, 2h, 7d or an ISO date"
    )
    usage.add_argument("--person", help="only this person's rows (a username, without @)")
    usage.set_defaults(handler=Command("loopd.cli.usage", "handler"))


def _selftest(sub: Subparsers) -> None:
    parser = sub.add_parser(
        "selftest",
        help="check llama-server against the recorded expectations (make verify-device)",
        description="Probe llama-server: health, build, model, template hash, context and slots "
        "against the recorded values, then live cache, stream and render probes.",
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help="rewrite the model's expectations from the server as it is now, and show the diff",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--model", help="model id to test (default: LOOPD_MODEL)")
    parser.add_argument(
        "--endpoint",
        help="test only this [[endpoint]] (default: every endpoint, one report each)",
    )
    parser.add_argument(
        "--tools",
        type=Path,
        help="tools file the render probe sends (default: LOOPD_TOOLS_FILE)",
    )
    add_expected_dir(parser)
    parser.set_defaults(handler=Command("loopd.cli.selftest", "cmd_selftest", event_loop=True))


def add_expected_dir(parser: argparse.ArgumentParser) -> None:
    """``--expected-dir``, for ``selftest``, ``serve``, ``chat`` and ``run``: expectations
    recorded on the host for the operator's own server, so the image needs no rebuild (``chat``
    and ``run`` go by what they record of durable sessions and the slot pool)."""
    parser.add_argument(
        "--expected-dir",
        type=Path,
        default=EXPECTED_DIR,
        help="folder of the self-test's expectations files (default: the one in the package)",
    )


def _tools(sub: Subparsers) -> None:
    tools = sub.add_parser("tools", help="run a core tool by hand")
    actions = tools.add_subparsers(dest="tools_command", required=True, metavar="ACTION")
    call = actions.add_parser(
        "call",
        help="run a core tool in a session's workspace, as a model's call would",
        description="Run a core tool in a session's workspace exactly as a model's call would, "
        "and print what the model would read. Exit 0: the tool ran; 1: the tool reported an "
        "error; 2: bad usage.",
    )
    call.add_argument(
        "name", metavar="NAME", help="a core tool (a name it does not know lists them)"
    )
    call.add_argument("--session", required=True, help="the session whose workspace to use")
    call.add_argument(
        "arguments", metavar="JSON-ARGUMENTS", help="the tool's arguments, one JSON object"
    )
    call.set_defaults(handler=Command("loopd.cli.tools", "cmd_call", event_loop=True))
