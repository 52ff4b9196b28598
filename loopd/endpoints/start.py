"""The start of every front end on several servers: each endpoint checked at once, the ones down
marked down (one line each, re-checked in the background), and no start with none up.

``loopd serve``, ``loopd chat`` and ``loopd run`` all start here (``Endpoints.start_checked``);
they differ only in the check. The daemon self-tests each endpoint against its recorded
expectations (``selftest.endpoints.endpoint_checker``). A terminal's chat or one-shot turn asks
each server's ``/health`` (``reachability_checker``), as it does for the one server of the
shorthand: the self-test's live probes take a slot, and a ``loopd run`` in a script would then
evict the cache of the very sessions it is about to serve.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from loopcommon.errors import DaemonError
from loopd.config import EndpointSettings
from loopd.engine.client import InferenceClient
from loopd.errors import LoopdError
from loopd.selftest.endpoints import Checker, EndpointCheck, check_all, health_after

# With no endpoint up a front end cannot run a turn: the command line's "could not do what was
# asked" (loopd.cli), as for the shorthand's one unreachable server.
EXIT_NONE_UP = 2


class NoEndpointUp(LoopdError):
    """Every endpoint failed its check at start: there is nothing to run a turn on."""

    def __init__(self, down: Mapping[str, str]) -> None:
        self.down = dict(down)
        named = "; ".join(f"{name}: {why}" for name, why in down.items())
        super().__init__(f"no endpoint is up ({named})")


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
