"""brokerd's command line: ``brokerd serve [--only infer|chat|broker]``."""

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Final

import anyio

from brokerd.config import ConfigError, load_settings, read_secrets
from brokerd.mcp.listing import register as register_tools
from brokerd.proxy.logs import configure_logging
from brokerd.serve import SERVICES, ServeError, build_endpoints, run

EXIT_CONFIG: Final = 2
EXIT_INTERRUPTED: Final = 130


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="brokerd",
        description="Host-side broker for loopd: inference proxy, chat proxy, tool broker.",
        epilog="Configured by BROKERD_* environment variables and the TOML file in BROKERD_CONFIG.",
    )
    commands = root.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve infer.sock, chat.sock and broker.sock")
    serve.add_argument(
        "--only",
        choices=SERVICES,
        action="append",
        help="serve just this socket; repeat for several (default: all three)",
    )
    register_tools(commands)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "tools":
        code: int = args.handler(args)
        return code
    services = tuple(dict.fromkeys(args.only)) if args.only else SERVICES
    try:
        settings = load_settings()
        secrets = read_secrets(settings)
        configure_logging(
            secrets=secrets.values(),
            level=logging.getLevelNamesMapping()[settings.log_level.upper()],
        )
        endpoints = build_endpoints(settings, secrets, services)
        anyio.run(run, endpoints, settings.socket_dir)
    except ConfigError as exc:
        print(f"brokerd: bad config: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except ServeError as exc:
        print(f"brokerd: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return 0
