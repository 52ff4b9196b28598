"""``loopd selftest``: the command line over ``run_selftest``, for each endpoint in turn (or the
one ``--endpoint`` names).

Exit status: 0 every check passes; 1 a check failed; 2 the server is unreachable (or loopd could
not do what was asked: a broken tools or expectations file, an unknown endpoint). With several
endpoints, the worst of theirs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

import anyio

from loopd.config import CORE_TOOLS_FILE, EndpointSettings, Settings
from loopd.selftest.expected import DEFAULT_DIR
from loopd.selftest.run import EXIT_UNREACHABLE, SelftestReport, format_report, run_selftest
from loopd.tools.errors import ToolsSpecError
from loopd.tools.spec import load_tools_spec


def cmd_selftest(args: argparse.Namespace, settings: Settings) -> int:
    return selftest(
        settings,
        model=args.model,
        endpoint=args.endpoint,
        tools_path=args.tools or settings.tools_file,
        record=args.record,
        as_json=args.json,
        expected_dir=args.expected_dir,
    )


def selftest(
    settings: Settings,
    *,
    model: str | None = None,
    endpoint: str | None = None,
    tools_path: Path | None = None,
    record: bool = False,
    as_json: bool = False,
    expected_dir: Path = DEFAULT_DIR,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Run the self-test and print its report (one per endpoint; with ``--json`` an object, or
    a list of them for several endpoints); returns the exit status."""
    try:
        tools_text = _tools_text(tools_path)
    except ToolsSpecError as exc:
        err.write(f"loopd selftest: {exc}\n")
        return EXIT_UNREACHABLE
    endpoints = settings.endpoints()
    if endpoint is not None:
        endpoints = tuple(e for e in endpoints if e.name == endpoint)
        if not endpoints:
            known = ", ".join(e.name for e in settings.endpoints())
            err.write(f"loopd selftest: no endpoint named {endpoint!r} (endpoints: {known})\n")
            return EXIT_UNREACHABLE

    async def test(server: EndpointSettings) -> SelftestReport:
        return await run_selftest(
            settings.for_endpoint(server),
            model=model,
            tools_text=tools_text,
            record=record,
            expected_dir=expected_dir,
            endpoint=server.name if settings.has_endpoint_tables else None,
        )

    async def run() -> int:
        reports = [await test(server) for server in endpoints]
        if as_json:
            payload = [report.to_json() for report in reports]
            shown: object = payload[0] if len(payload) == 1 else payload
            out.write(json.dumps(shown, indent=2, ensure_ascii=False) + "\n")
        else:
            out.write("\n\n".join(format_report(report) for report in reports) + "\n")
        return max(report.exit_status for report in reports)

    return anyio.run(run)


def _tools_text(path: Path | None) -> str:
    return load_tools_spec(path or CORE_TOOLS_FILE).text
