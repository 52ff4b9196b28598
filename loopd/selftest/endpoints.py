"""The self-test of one endpoint, as a check: its report, or why it could not run.

``loopd serve`` tests each endpoint against its own recorded expectations (``expected.py``), all
at once, at start and again while one is down (``loopd.endpoints.start``). An endpoint that fails
is marked down with one line saying why (``down_line``); the others serve.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from loopd.config import EndpointSettings, Settings
from loopd.engine.quiet import Purpose
from loopd.selftest.expected import DEFAULT_DIR, ExpectationsError

if TYPE_CHECKING:
    from loopd.selftest.run import SelftestReport


@dataclass(frozen=True)
class EndpointCheck:
    """One endpoint's check: its self-test's report, or what stopped it (``error``). A check
    that is no self-test (a terminal's ``/health``: ``loopd.endpoints.start``) has no report,
    and passed unless it has an error."""

    endpoint: EndpointSettings
    report: SelftestReport | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        if self.error is not None:
            return False
        return self.report is None or self.report.exit_status == 0

    @property
    def reason(self) -> str:
        """Why it is down, in one line ("" when it passed)."""
        if self.error is not None:
            return self.error
        if self.report is None or self.ok:
            return ""
        return failure_summary(self.report)


def failure_summary(report: SelftestReport) -> str:
    """A failed report in one line: unreachable and why, or the first failing check."""
    from loopd.selftest.run import format_result

    if report.unreachable:
        return f"unreachable ({report.facts.health.detail})"
    failed = [r for r in report.results if not r.ok and not r.informational]
    if not failed:
        return "failed"
    first = " ".join(format_result(failed[0]).split()[1:])  # without the FAIL mark
    more = f" (and {len(failed) - 1} more failing checks)" if len(failed) > 1 else ""
    return f"self-test failed: {first}{more}"


def down_line(check: EndpointCheck) -> str:
    """The one line that says an endpoint is down, and that it will be checked again."""
    endpoint = check.endpoint
    return (
        f"endpoint {endpoint.name} ({endpoint.model} at {endpoint.url}) is down: {check.reason}; "
        "re-checked in the background, the other endpoints serve"
    )


Checker = Callable[[EndpointSettings], Awaitable[EndpointCheck]]


def endpoint_checker(
    settings: Settings, tools_text: str, expected_dir: Path = DEFAULT_DIR
) -> Checker:
    """A function that self-tests one endpoint of ``settings``."""

    async def check(endpoint: EndpointSettings) -> EndpointCheck:
        # The self-test's probes are imported by the first check, not by every command that
        # builds a runtime (``loopd run`` checks nothing before its request).
        from loopd.selftest.run import run_selftest

        name = endpoint.name if settings.has_endpoint_tables else None
        try:
            report = await run_selftest(
                settings.for_endpoint(endpoint),
                tools_text=tools_text,
                expected_dir=expected_dir,
                endpoint=name,
                purpose=Purpose.WORK,  # nobody waits: it neither wakes nor loads the model
            )
        except ExpectationsError as exc:
            return EndpointCheck(endpoint, None, str(exc))
        return EndpointCheck(endpoint, report)

    return check
