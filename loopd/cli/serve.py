"""``loopd serve``: the self-test first (every endpoint's, at once, where there are several), then
the daemon (``loopd.serve``)."""

from __future__ import annotations

import argparse
import functools
import logging

import anyio

from loopcommon.stopsignals import StopSignals
from loopd.config import Settings
from loopd.serve import serve, startup_endpoints, startup_selftest
from loopd.statedir import check_state_dir

log = logging.getLogger("loopd.serve")


def handler(args: argparse.Namespace, settings: Settings) -> int:
    check_state_dir(settings.state_dir, create=True)
    report = checks = None
    if args.skip_selftest:
        log.warning("the self-test was skipped (--skip-selftest): the server is not checked")
    elif settings.has_endpoint_tables:
        status, checks = anyio.run(startup_endpoints, settings, args.expected_dir)
        if status != 0:
            return status
    else:
        report = anyio.run(startup_selftest, settings, args.expected_dir)
        if report.unreachable:
            return report.exit_status
    with StopSignals() as signals:
        return anyio.run(
            functools.partial(
                serve, settings, signals, report, expected_dir=args.expected_dir, checks=checks
            )
        )
