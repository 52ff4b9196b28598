"""brokerd's command line: ``brokerd serve [--only infer|chat|broker]``, ``brokerd tools list``
(see ``brokerd.mcp.listing``), ``brokerd --version``.

Exit status of ``serve``:

- 0: stopped by SIGINT or SIGTERM after serving.
- 1: brokerd could not start serving: a socket folder it cannot make or write, a socket path
  taken by something that is not a socket, a bind failure, an app that failed to start.
- 2: bad configuration: an unknown ``BROKERD_*`` variable, a bad value, a setting a requested
  socket needs, a secret file it cannot read.
- 130: interrupted before serving began.

A failure is one line on stderr, ``brokerd: ...``; never a traceback.
"""

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Final

import anyio

from brokerd.config import ConfigError, load_settings, read_secrets
from brokerd.mcp.listing import register as register_tools
from brokerd.observe.server import metrics_service
from brokerd.proxy.logs import configure_logging
from brokerd.serve import SERVICES, ServeError, build_endpoints, run
from loopd import anyio_unix_connect
from loopd.version import package_version

EXIT_CANNOT_SERVE: Final = 1
EXIT_CONFIG: Final = 2
EXIT_INTERRUPTED: Final = 130


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="brokerd",
        description="Host-side broker for loopd: inference proxy, chat proxy, tool broker.",
        epilog="Configured by BROKERD_* environment variables and the TOML file in BROKERD_CONFIG. "
        "Exit status: 0 stopped by a signal; 1 could not start serving; 2 bad configuration; "
        "130 interrupted.",
    )
    root.add_argument("--version", action="version", version=package_version("brokerd"))
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
    anyio_unix_connect.apply()
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
        anyio.run(run, endpoints, settings.socket_dir, metrics_service(settings))
    except ConfigError as exc:
        print(f"brokerd: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except ServeError as exc:
        print(f"brokerd: {exc}", file=sys.stderr)
        return EXIT_CANNOT_SERVE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return 0
