"""The self-test of every endpoint at start, and the background re-check of those found down.

``loopd serve`` tests each endpoint against its own recorded expectations (``expected.py``), all
at once. An endpoint that fails is marked down with one line saying why (``down_line``) and is
re-checked in the background (``recheck_down``, on ``loopd.endpoints.health``'s schedule); the
others serve. With no endpoint up there is nothing to serve with, and loopd refuses to start, as
it does for the one server of the shorthand.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

from loopd.config import EndpointSettings, Settings
from loopd.endpoints.health import EndpointHealth
from loopd.engine.quiet import Purpose
from loopd.selftest.expected import DEFAULT_DIR, ExpectationsError
from loopd.selftest.run import SelftestReport, format_result, run_selftest

log = logging.getLogger(__name__)


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


async def check_all(endpoints: Sequence[EndpointSettings], check: Checker) -> list[EndpointCheck]:
    """Every endpoint's self-test, run at once; in the configured order."""
    results: dict[str, EndpointCheck] = {}

    async def one(endpoint: EndpointSettings) -> None:
        results[endpoint.name] = await check(endpoint)

    async with anyio.create_task_group() as tg:
        for endpoint in endpoints:
            tg.start_soon(one, endpoint)
    return [results[endpoint.name] for endpoint in endpoints]


def health_after(checks: Sequence[EndpointCheck], now: float) -> EndpointHealth:
    """The endpoints' health as the start's checks found it; each one down is logged."""
    health = EndpointHealth(check.endpoint.name for check in checks)
    for check in checks:
        if check.ok:
            log.info(
                "%s for endpoint %s: %s at %s (%s)",
                "self-test passed" if check.report else "/health answered",
                check.endpoint.name,
                check.endpoint.model,
                check.endpoint.url,
                f"expectations {check.report.expectations}" if check.report else "reachable",
            )
        else:
            health.mark_down(check.endpoint.name, check.reason, now)
            log.warning("%s", down_line(check))
    return health


async def recheck_down(
    health: EndpointHealth,
    endpoints: Sequence[EndpointSettings],
    check: Checker,
    *,
    clock: Callable[[], float] = time.monotonic,
    on_up: Callable[[str], None] = lambda name: None,
) -> None:
    """Re-check each down endpoint when due, until cancelled (an endpoint marked down meanwhile,
    by a request that found it dead, wakes it); ``on_up`` is told of an endpoint that passed
    again."""
    by_name = {endpoint.name: endpoint for endpoint in endpoints}
    woken = anyio.Event()

    def marked_down(name: str) -> None:
        woken.set()

    health.on_down(marked_down)
    while True:
        woken = anyio.Event()
        for name in health.due(clock()):
            result = await check(by_name[name])
            if result.ok:
                health.mark_up(name)
                log.info("endpoint %s is up again: its self-test passed", name)
                on_up(name)
            else:
                health.check_failed(name, result.reason, clock())
        due = health.next_check()
        with anyio.move_on_after(max(due - clock(), 0.0) if due is not None else float("inf")):
            await woken.wait()
