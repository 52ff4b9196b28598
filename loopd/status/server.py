"""``/metrics`` and the status page, served by ``loopd serve`` at ``LOOPD_METRICS_ADDR``.

In the box (``--network=none``) the address is a Unix socket in a folder of the host account that
the container mounts (deploy/loopd.container): brokerd on the host relays it to a host address
(its ``metrics_relay`` setting; see docs/observability.md). ``loopcommon.httpserve`` serves it
(and brokerd's metrics address).

Routes: ``GET /metrics`` (Prometheus text format), ``GET /`` (the status page), ``GET
/status.json`` (the page's data).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Final

import anyio
from anyio.abc import TaskStatus
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from loopcommon.address import parse_address
from loopcommon.httpserve import serve_http
from loopcommon.statuspage import ThreadView, render
from loopd.observe.metrics import METRICS, LoopdMetrics
from loopd.sessions import Runtime
from loopd.status.page import snapshot
from loopd.status.usage import UsageCollector
from loopd.terminal.link import local_user

log = logging.getLogger(__name__)

# What the pages may load and run in a browser: their own inline style, nothing else.
PAGE_POLICY: Final = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


class RuntimeCollector(Collector):
    """What is read rather than counted, at scrape time: busy slots, the turns under way and the
    oldest one's age, whether the server changed, each endpoint's health, the state's disk."""

    def __init__(self, runtime: Runtime, clock: Callable[[], float] = time.time) -> None:
        self.runtime = runtime
        self.clock = clock

    def collect(self) -> Iterable[GaugeMetricFamily]:
        return [*self._turns(), *self._server(), *self._disk()]

    def _turns(self) -> list[GaugeMetricFamily]:
        busy = GaugeMetricFamily(
            "loopd_slot_busy", "1 while a slot is held.", labels=["endpoint", "slot"]
        )
        for name, server in self.runtime.endpoints.servers.items():
            for slot in server.endpoint.slots:
                held = server.scheduler.holder(slot) is not None
                busy.add_metric([name, str(slot)], 1.0 if held else 0.0)
        live = self.runtime.live.all()
        active = GaugeMetricFamily(
            "loopd_sessions_active", "Sessions with a turn under way (running or in line)."
        )
        active.add_metric([], float(len(live)))
        in_line = GaugeMetricFamily(
            "loopd_turns_in_line", "Turns waiting for their slot in loopd's line."
        )
        in_line.add_metric([], float(sum(not turn.holding for turn in live)))
        oldest = GaugeMetricFamily(
            "loopd_turn_oldest_seconds",
            "How long the oldest turn under way has run (0 with none): a stuck turn grows it.",
        )
        now = self.clock()
        oldest.add_metric([], max((now - turn.started_at for turn in live), default=0.0))
        return [busy, active, in_line, oldest]

    def _server(self) -> list[GaugeMetricFamily]:
        changed = GaugeMetricFamily(
            "loopd_server_changed",
            "1 while the server differs from the recorded expectations (threads wait).",
        )
        changed.add_metric([], 0.0 if self.runtime.server_change is None else 1.0)
        up = GaugeMetricFamily(
            "loopd_endpoint_up",
            "1 while an [[endpoint]] is up, 0 while loopd holds it down (several servers only).",
            labels=["endpoint"],
        )
        if self.runtime.endpoints.named:
            health = self.runtime.endpoints.fleet.health
            for name in self.runtime.endpoints.servers:
                up.add_metric([name], 1.0 if health.is_up(name) else 0.0)
        return [changed, up]

    def _disk(self) -> list[GaugeMetricFamily]:
        free = GaugeMetricFamily(
            "loopd_state_free_bytes",
            "Bytes free to loopd on the filesystem of its state folder (the session log's).",
        )
        size = GaugeMetricFamily(
            "loopd_state_size_bytes", "The size of the filesystem of loopd's state folder."
        )
        try:
            fs = os.statvfs(self.runtime.settings.state_dir)
        except OSError:
            return []  # no figure rather than a wrong one; the log says why it cannot write
        free.add_metric([], float(fs.f_bavail * fs.f_frsize))
        size.add_metric([], float(fs.f_blocks * fs.f_frsize))
        return [free, size]


ThreadLabels = Callable[[], Mapping[str, ThreadView]]


def _no_threads() -> Mapping[str, ThreadView]:
    return {}


def create_app(
    runtime: Runtime,
    metrics: LoopdMetrics = METRICS,
    clock: Callable[[], float] = time.time,
    threads: ThreadLabels = _no_threads,
) -> Starlette:
    """``threads``: the Mattermost threads' labels by session name, read at each page."""
    state = CollectorRegistry(auto_describe=True)
    state.register(RuntimeCollector(runtime, clock))
    channels = runtime.settings.mm.allowed_channels
    usage = UsageCollector(runtime.log, threads, local_user(), channels)
    state.register(usage)

    async def metrics_page(request: Request) -> Response:
        # The usage is read from the session log: in a worker thread, off the loop that reads
        # model streams and Mattermost's WebSocket.
        await anyio.to_thread.run_sync(usage.refresh)
        body = generate_latest(metrics.registry) + generate_latest(state)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def status_page(request: Request) -> Response:
        return HTMLResponse(render(snapshot(runtime, threads=threads())), headers=_page_headers())

    async def status_json(request: Request) -> Response:
        data = snapshot(runtime, threads=threads()).as_json()
        return JSONResponse(data, headers=_page_headers())

    return Starlette(
        routes=[
            Route("/metrics", metrics_page, methods=["GET"]),
            Route("/", status_page, methods=["GET"]),
            Route("/status.json", status_json, methods=["GET"]),
        ]
    )


def _page_headers() -> dict[str, str]:
    return {"Content-Security-Policy": PAGE_POLICY, "Cache-Control": "no-store"}


async def serve_runtime(
    runtime: Runtime,
    address: str,
    threads: ThreadLabels = _no_threads,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """``loopd serve``'s metrics and status page, until cancelled."""
    app = create_app(runtime, threads=threads)
    await serve_http(app, parse_address(address), "loopd metrics", task_status)
