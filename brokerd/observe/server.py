"""brokerd's metrics address (``metrics_addr``): ``/metrics``, and loopd's pages under ``/loopd/``.

``/loopd/metrics``, ``/loopd/`` (the status page) and ``/loopd/status.json`` are relayed from
loopd's socket in the folder the box mounts for it when ``metrics_relay`` names it
(``brokerd.observe.relay`` says how safely). The address is the host's only: ``unix:/path``
outside brokerd's socket folder (which the box mounts) or a loopback port, which the box, having
no network, cannot reach.
"""

import logging
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, Final

import anyio
from anyio.abc import TaskStatus
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from brokerd.config import BrokerdSettings
from brokerd.errors import ServeError
from brokerd.observe.metrics import BROKERD_METRICS, BrokerdMetrics
from brokerd.observe.relay import PAGES, LoopdRelay, RelayBusy, RelayError
from loopcommon.address import Address, UnixAddress, parse_address
from loopcommon.errors import ConfigError
from loopcommon.httpserve import MetricsServeError, serve_http

logger = logging.getLogger(__name__)

MetricsService = Callable[..., Coroutine[Any, Any, None]]
NO_RELAY: Final = "brokerd relays no loopd metrics here (metrics_relay is not set)\n"


def create_metrics_app(
    relay: LoopdRelay | None, metrics: BrokerdMetrics = BROKERD_METRICS
) -> Starlette:
    async def metrics_page(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def loopd_page(request: Request) -> Response:
        if relay is None:
            return PlainTextResponse(NO_RELAY, status_code=404)
        try:
            page = await relay.fetch(request.url.path)
        except RelayError as exc:
            logger.warning("relaying loopd's %s failed: %s", request.url.path, exc)
            status = 503 if isinstance(exc, RelayBusy) else 502
            return PlainTextResponse(f"{exc}\n", status_code=status)
        return Response(page.body, headers=page.headers(), media_type=page.content_type)

    async def to_loopd_folder(request: Request) -> Response:
        return RedirectResponse("/loopd/", status_code=308)

    routes = [Route("/metrics", metrics_page, methods=["GET"])]
    routes += [Route(path, loopd_page, methods=["GET"]) for path in PAGES]
    routes.append(Route("/loopd", to_loopd_folder, methods=["GET"]))
    return Starlette(routes=routes)


def metrics_service(settings: BrokerdSettings) -> MetricsService | None:
    """The metrics server's task, or None when ``metrics_addr`` is not set; ``ConfigError`` for
    an address the box could reach."""
    if settings.metrics_addr is None:
        if settings.metrics_relay is not None:
            raise ConfigError("metrics_relay: needs metrics_addr, where the relay is served")
        return None
    address = parse_address(settings.metrics_addr)
    check_outside(address, settings)
    relay = (
        LoopdRelay(settings.metrics_relay, thread_url=settings.mattermost_url)
        if settings.metrics_relay is not None
        else None
    )
    return partial(_serve, create_metrics_app(relay), address)


def check_outside(address: Address, settings: BrokerdSettings) -> None:
    if (
        isinstance(address, UnixAddress)
        and address.path.parent.resolve() == settings.socket_dir.resolve()
    ):
        raise ConfigError(
            f"metrics_addr: {address.path} is in socket_dir, which the box mounts; "
            "put it in another folder"
        )


async def _serve(
    app: Starlette, address: Address, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    try:
        await serve_http(app, address, "brokerd metrics", task_status)
    except MetricsServeError as exc:
        raise ServeError(str(exc)) from None
