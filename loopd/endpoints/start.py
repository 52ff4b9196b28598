"""The checks of every endpoint: at the start of every front end, all at once, the ones down
marked down (one line each) and re-checked in the background (``recheck_down``, on
``loopd.endpoints.health``'s schedule), and no start with none up.

``loopd serve``, ``loopd chat`` and ``loopd run`` all start here (``Endpoints.start_checked``);
they differ only in the check. The daemon self-tests each endpoint against its recorded
expectations (``selftest.endpoints.endpoint_checker``). A terminal's chat or one-shot turn asks
each server's ``/health`` (``reachability_checker``), as it does for the one server of the
shorthand: the self-test's live probes take a slot, and a ``loopd run`` in a script would then
evict the cache of the very sessions it is about to serve.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import anyio

from loopcommon.errors import DaemonError
from loopd.config import EndpointSettings
from loopd.endpoints.health import EndpointHealth
from loopd.engine.client import InferenceClient
from loopd.errors import LoopdError
from loopd.selftest.endpoints import Checker, EndpointCheck, down_line

log = logging.getLogger(__name__)

# With no endpoint up a front end cannot run a turn: the command line's "could not do what was
# asked" (loopd.cli), as for the shorthand's one unreachable server.
EXIT_NONE_UP = 2


class NoEndpointUp(LoopdError):
    """Every endpoint failed its check at start: there is nothing to run a turn on."""

    def __init__(self, down: Mapping[str, str], *, named: bool = True) -> None:
        """``named``: the endpoints are ``[[endpoint]]`` tables; else the one server of the
        shorthand, and the line says only what is wrong with it."""
        self.down = dict(down)
        if not named and len(down) == 1:
            super().__init__(next(iter(down.values())))
            return
        listed = "; ".join(f"{name}: {why}" for name, why in down.items())
        super().__init__(f"no endpoint is up ({listed})")


@dataclass(frozen=True)
class StartChecks:
    """Every endpoint's check at start, in the configured order."""

    checks: tuple[EndpointCheck, ...]

    @property
    def down(self) -> dict[str, str]:
        """The endpoints found down, each with why."""
        return {check.endpoint.name: check.reason for check in self.checks if not check.ok}

    @property
    def none_up(self) -> bool:
        return len(self.down) == len(self.checks)


async def check_at_start(endpoints: Sequence[EndpointSettings], check: Checker) -> StartChecks:
    """Every endpoint's check, at once; while some are up, each one down is logged with its one
    line (with none up, the front end's one line names them all)."""
    checks = StartChecks(tuple(await check_all(endpoints, check)))
    if not checks.none_up:
        health_after(checks.checks, time.monotonic())
    return checks


def reachability_checker(clients: Mapping[str, InferenceClient]) -> Checker:
    """A check that asks the endpoint's ``/health`` through its own client (``clients`` by
    endpoint name): up when it answers 200."""

    async def check(endpoint: EndpointSettings) -> EndpointCheck:
        client = clients[endpoint.name]
        try:
            healthy = await client.health()
        except DaemonError as exc:
            return EndpointCheck(endpoint, None, f"unreachable ({exc})")
        return EndpointCheck(endpoint, None, None if healthy else "/health is not ok")

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
            # A self-test's pass is news; a terminal's /health answered is not.
            log.log(
                logging.INFO if check.report else logging.DEBUG,
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
    on_up: Callable[[EndpointCheck], None] = lambda check: None,
) -> None:
    """Re-check each down endpoint when due, until cancelled (an endpoint marked down meanwhile,
    by a request that found it dead, wakes it); ``on_up`` is told of an endpoint that passed
    again, with its check."""
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
                on_up(result)
            else:
                health.check_failed(name, result.reason, clock())
        due = health.next_check()
        with anyio.move_on_after(max(due - clock(), 0.0) if due is not None else float("inf")):
            await woken.wait()
