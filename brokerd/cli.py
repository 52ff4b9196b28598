"""brokerd's command line: ``brokerd serve [--only infer|chat|broker]``, ``brokerd tools list``
(see ``brokerd.mcp.listing``), ``brokerd audit prune [--older-than-days N]``, ``brokerd --version``.

``audit prune`` deletes the audit rows older than the retention (``broker.audit_retention_days``,
or ``--older-than-days``), after recording the cutoff in the log itself, and prints one line;
exit status 2 when neither is given or the settings are bad, 1 when the database cannot be
pruned.

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

from brokerd.config import load_settings, read_secrets, setting_name
from brokerd.errors import ServeError
from brokerd.mcp.listing import register as register_tools
from brokerd.observe.server import metrics_service
from brokerd.proxy.logs import configure_logging
from brokerd.serve import SERVICES, build_endpoints, run
from brokerd.tools.audit import AuditLogError, open_audit_log, prune_audit_log
from brokerd.tools.settings import BrokerSettings
from loopcommon import anyio_unix_connect
from loopcommon.errors import ConfigError
from loopcommon.stopsignals import StopSignals
from loopcommon.version import package_version

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
    audit = commands.add_parser("audit", help="the tool broker's audit log")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True)
    prune = audit_commands.add_parser(
        "prune", help="delete the rows older than the retention (the cutoff is recorded)"
    )
    prune.add_argument(
        "--older-than-days",
        type=float,
        metavar="DAYS",
        help="instead of broker.audit_retention_days",
    )
    return root


def _fail(exc: Exception, status: int) -> int:
    """One line on stderr for what stopped brokerd, and the status that says which kind."""
    print(f"brokerd: {exc}", file=sys.stderr)
    return status


def prune_audit(days: float | None) -> int:
    try:
        broker, days = _prune_settings(days)
        audit = open_audit_log(broker)
    except ConfigError as exc:
        return _fail(exc, EXIT_CONFIG)
    except AuditLogError as exc:
        return _fail(exc, EXIT_CANNOT_SERVE)
    try:
        rows = prune_audit_log(audit, days)
    except AuditLogError as exc:
        return _fail(exc, EXIT_CANNOT_SERVE)
    finally:
        audit.close()
    print(f"brokerd: pruned {rows} audit rows older than {days:g} days from {broker.audit_db}")
    return 0


def _prune_settings(days: float | None) -> tuple[BrokerSettings, float]:
    broker = load_settings().broker
    if broker is None:
        raise ConfigError(f"{setting_name('broker', 'audit_db')}: required to prune")
    days = days if days is not None else broker.audit_retention_days
    if days is None or days <= 0:
        raise ConfigError(
            f"{setting_name('broker', 'audit_retention_days')} or --older-than-days: "
            "a number of days above 0 is required to prune"
        )
    return broker, days


def main(argv: Sequence[str] | None = None) -> int:
    anyio_unix_connect.apply()
    args = parser().parse_args(argv)
    if args.command == "tools":
        code: int = args.handler(args)
        return code
    if args.command == "audit":
        return prune_audit(args.older_than_days)
    services = tuple(dict.fromkeys(args.only)) if args.only else SERVICES
    try:
        settings = load_settings()
        secrets = read_secrets(settings)
        configure_logging(
            secrets=secrets.values(),
            level=logging.getLevelNamesMapping()[settings.log_level.upper()],
        )
        endpoints = build_endpoints(settings, secrets, services)
        with StopSignals() as signals:
            anyio.run(run, endpoints, settings.socket_dir, signals, metrics_service(settings))
    except ConfigError as exc:
        return _fail(exc, EXIT_CONFIG)
    except ServeError as exc:
        return _fail(exc, EXIT_CANNOT_SERVE)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return 0
