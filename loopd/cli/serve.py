"""``loopd serve``: the self-test first (every endpoint's, at once, where there are several), then
the daemon (``loopd.serve``)."""

from __future__ import annotations

import argparse
import functools
import logging
from pathlib import Path

import anyio

from loopd.config import Settings
from loopd.selftest.expected import DEFAULT_DIR
from loopd.serve import serve, startup_endpoints, startup_selftest
from loopd.statedir import check_state_dir

log = logging.getLogger("loopd.serve")


def handler(args: argparse.Namespace, settings: Settings) -> int:
    check_state_dir(settings.state_dir, create=True)
    report = None
    down: dict[str, str] = {}
    if args.skip_selftest:
        log.warning("the self-test was skipped (--skip-selftest): the server is not checked")
    elif settings.has_endpoint_tables:
        status, down = anyio.run(startup_endpoints, settings, args.expected_dir)
        if status != 0:
            return status
    else:
        report = anyio.run(startup_selftest, settings, args.expected_dir)
        if report.unreachable:
            return report.exit_status
    return anyio.run(
        functools.partial(serve, settings, report, expected_dir=args.expected_dir, down=down)
    )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the daemon: Mattermost threads drive sessions (LOOPD_MM_* settings)"
    )
    parser.add_argument(
        "--skip-selftest",
        action="store_true",
        help="start without checking the server (development only)",
    )
    # Recorded on the host for the operator's own server, so the image needs no rebuild.
    parser.add_argument(
        "--expected-dir",
        type=Path,
        default=DEFAULT_DIR,
        help="folder of the self-test's expectations files (default: the one in the package)",
    )
    parser.set_defaults(handler=handler)
