"""The ``loopd`` command line. Each subcommand is a thin shell over a module that does the work.

Exit status: 0 success; 1 a check failed (``log verify``, ``selftest``); 2 loopd could not do what
was asked (bad configuration, server unreachable): one line on stderr, no traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from loopd.config import Settings, load_settings, settings_table
from loopd.errors import LoopdError
from loopd.logsetup import configure_logging

Handler = Callable[[argparse.Namespace, Settings], int]


def _cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    if args.table:
        print(settings_table())
    else:
        print(settings.model_dump_json(indent=2))
    return 0


def _cmd_chat(args: argparse.Namespace, settings: Settings) -> int:
    from loopd.terminal import run_chat

    return run_chat(settings, args.session)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loopd", description="Agent sessions on llama-server.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    chat = sub.add_parser("chat", help="talk to the model in this terminal (one thread)")
    chat.add_argument("--session", default="terminal", help="session name (default: terminal)")
    chat.set_defaults(handler=_cmd_chat)

    config = sub.add_parser("config", help="print the effective configuration")
    config.add_argument("--table", action="store_true", help="print the README's tables of knobs")
    config.set_defaults(handler=_cmd_config)

    _register_optional(sub)
    return parser


def _register_optional(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Subcommands owned by other modules register themselves here."""
    from loopd.perfreport import register as register_perf
    from loopd.selftest.commands import register as register_selftest
    from loopd.serve import register as register_serve
    from loopd.sessionlog.commands import register as register_log
    from loopd.tools.commands import register as register_tools

    register_serve(sub)
    register_log(sub)
    register_perf(sub)
    register_selftest(sub)
    register_tools(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = load_settings()
    except LoopdError as exc:
        print(f"loopd: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_format, settings.log_level)
    try:
        if hasattr(args, "run"):  # subcommands that only need the log's path
            code: int = args.run(args, settings.db_path, sys.stdout, sys.stderr)
            return code
        handler: Handler = args.handler
        return handler(args, settings)
    except LoopdError as exc:
        print(f"loopd: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
