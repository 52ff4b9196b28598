"""Serving: one uvicorn server per Unix socket, all in one anyio task group in one process.

The sockets are bound here, not by uvicorn, so their modes are brokerd's (0660 in a 0750 folder;
uvicorn would make them 0666) and a stale socket left by a crash is removed first. They are
accepted from here too (``brokerd.listen``): each socket holds a bounded number of connections,
each of which must send its request head in time, so one socket cannot starve the others.
"""

import asyncio
import contextlib
import logging
import os
import resource
import socket
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

import anyio
import uvicorn
from anyio.abc import TaskStatus
from starlette.types import ASGIApp

if TYPE_CHECKING:
    from brokerd.observe.server import MetricsService

from brokerd.bodies import BodyBudget, BodyRules
from brokerd.config import (
    CONFIG_FILE_VARIABLE,
    BrokerdSettings,
    InferenceEndpoint,
    Secrets,
    setting_name,
)
from brokerd.errors import ServeError
from brokerd.listen import (
    ConnectionLimits,
    GuardedListener,
    WatchedConnections,
    head_deadline_protocol,
)
from brokerd.observe.middleware import instrument
from brokerd.proxy.chat import create_chat_app
from brokerd.proxy.chatpolicy import ChatPolicy
from brokerd.proxy.inference import InferencePolicy, create_inference_app
from brokerd.proxy.slotfolder import SlotFolder, link_peers
from brokerd.proxy.upstream import parse_upstream
from brokerd.sdnotify import notify
from loopcommon.errors import ConfigError
from loopcommon.exceptiongroups import sole_kind
from loopcommon.stopsignals import StopSignals

logger = logging.getLogger(__name__)

Service = Literal["infer", "chat", "broker"]
SERVICES: Final[tuple[Service, ...]] = ("infer", "chat", "broker")
SOCKET_DIR_MODE: Final = 0o750
SOCKET_MODE: Final = 0o660
LISTEN_BACKLOG: Final = 2048  # uvicorn's own default
# Open streams (a long generation, a WebSocket) get this long to finish after a stop signal.
GRACEFUL_SHUTDOWN_S: Final = 5
# Open files a connection may need besides its own: the upstream connection it is relayed to.
FILES_PER_CONNECTION: Final = 2
# Open files besides connections: listening sockets, the audit database, tool pipes, logs.
SPARE_FILES: Final = 64


@dataclass(frozen=True)
class Endpoint:
    """An app and the socket it is served on; ``name`` is for the log."""

    name: str
    path: Path
    app: ASGIApp
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)


def socket_path(settings: BrokerdSettings, service: Service) -> Path:
    return settings.socket_dir / f"{service}.sock"


def build_endpoints(
    settings: BrokerdSettings, secrets: Secrets, services: Sequence[Service] = SERVICES
) -> list[Endpoint]:
    """The apps to serve; ``ConfigError`` naming the field a requested service is missing.
    ``infer`` is one socket per inference endpoint (``infer.sock`` for the single form)."""
    limits = ConnectionLimits(settings.max_connections_per_socket, settings.header_timeout_s)
    # One budget for the bodies of every socket: they share one process's memory.
    bodies = BodyRules(BodyBudget(settings.body_memory_bytes), settings.body_timeout_s)
    endpoints: list[Endpoint] = []
    for service in services:
        if service == "infer":
            folders: list[SlotFolder] = []  # a moved session's save follows it among these
            endpoints.extend(
                _inference_endpoint(settings, secrets, upstream, bodies, limits, folders)
                for upstream in settings.inference_endpoints()
            )
            link_peers(folders)
        else:
            path = socket_path(settings, service)
            app = instrument(service, _build_app(settings, secrets, service, bodies))
            endpoints.append(Endpoint(service, path, app, limits))
    return endpoints


def _inference_endpoint(
    settings: BrokerdSettings,
    secrets: Secrets,
    server: InferenceEndpoint | None,
    bodies: BodyRules,
    limits: ConnectionLimits,
    folders: list[SlotFolder],
) -> Endpoint:
    """One inference socket: for an ``[[endpoint]]`` table, or (None) for ``inference_url``.
    Each socket reaches its own server only, under that server's slot and model rules. Its save
    folder, if any, is appended to ``folders``."""
    if server is None:
        name, url, key = "infer", settings.inference_url, secrets.inference_key
        policy = InferencePolicy(
            frozenset(settings.inference_slots), frozenset(settings.inference_models)
        )
        saves = settings.slot_save_dirs, settings.slot_save_max_bytes
        path = socket_path(settings, "infer")
    else:
        name, url, key = f"infer-{server.name}", server.url, secrets.endpoint_keys.get(server.name)
        policy = InferencePolicy(
            frozenset(server.inference_slots),
            frozenset(server.inference_models),
            endpoint=server.name,
        )
        saves = server.slot_save_dirs, server.slot_save_max_bytes
        path = settings.socket_dir / server.socket_name
    folder = SlotFolder(*saves, client=slot_client(path)) if saves[0] else None
    if folder is not None:
        folders.append(folder)
    app = create_inference_app(
        parse_upstream(url),
        api_key=key,
        policy=policy,
        body_cap=settings.body_cap_bytes,
        bodies=bodies,
        slot_folder=folder,
    )
    return Endpoint(name, path, instrument(name, app), limits)


def slot_client(socket_path: Path) -> str:
    """What tells this brokerd's saves from other clients' in a shared save folder: its host, its
    account and the socket the box reaches the server by (two deployments differ in one)."""
    return f"{socket.gethostname()}:{os.getuid()}:{socket_path.resolve()}"


def _build_app(
    settings: BrokerdSettings, secrets: Secrets, service: Service, bodies: BodyRules
) -> ASGIApp:
    if service == "chat":
        if settings.mattermost_url is None:
            raise ConfigError(f"{setting_name('mattermost_url')}: required to serve chat.sock")
        if secrets.bot_token is None:
            raise ConfigError(
                f"{setting_name('mattermost_token_file')}: required to serve chat.sock"
            )
        return create_chat_app(
            parse_upstream(settings.mattermost_url),
            bot_token=secrets.bot_token,
            policy=ChatPolicy.of(
                settings.chat_allowed_teams,
                settings.chat_allowed_channels,
                settings.chat_allowed_users,
            ),
            body_cap=settings.chat_body_cap_bytes,
            bodies=bodies,
        )
    if settings.broker is None:
        raise ConfigError(f"{setting_name('broker', 'audit_db')}: required to serve broker.sock")
    # Imported here so that `serve --only infer|chat` does not load the tool broker at all.
    from brokerd.confine import ConfinementError
    from brokerd.tools.app import create_broker_app
    from brokerd.tools.errors import CatalogueError

    try:
        return create_broker_app(
            settings.broker, hidden=own_paths(settings), bodies=bodies, mcp=settings.mcp
        )
    except CatalogueError as exc:
        raise ConfigError(f"{setting_name('broker', 'catalogue_dir')}: {exc}") from None
    except ConfinementError as exc:
        raise ConfigError(f"broker: command tools cannot run confined: {exc}") from None


def own_paths(settings: BrokerdSettings) -> list[Path]:
    """brokerd's state and secrets, which no tool may see: its sockets, key and token files,
    and its config file (the audit log is added by the broker itself)."""
    paths = [settings.socket_dir]
    paths += [p for p in (settings.inference_key_file, settings.mattermost_token_file) if p]
    paths += [endpoint.key_file for endpoint in settings.endpoint if endpoint.key_file]
    if config_file := os.environ.get(CONFIG_FILE_VARIABLE):
        paths.append(Path(config_file))
    return paths


def prepare_socket_dir(path: Path) -> None:
    """The socket folder, made if absent, mode 0750; ``ServeError`` naming it if brokerd cannot
    make it, or it is not a folder brokerd owns and may write in."""
    try:
        path.mkdir(mode=SOCKET_DIR_MODE, parents=True, exist_ok=True)
        path.chmod(SOCKET_DIR_MODE)  # mkdir's mode is filtered by the umask; the folder may exist
    except (FileExistsError, NotADirectoryError):
        raise ServeError(f"socket folder {path} is not a folder") from None
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
        raise ServeError(f"cannot use {path} as the socket folder: {reason}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ServeError(f"cannot use {path} as the socket folder: permission denied")


def remove_stale_socket(path: Path) -> None:
    """Remove a socket file left by an earlier run; refuse to touch anything else at the path."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ServeError(f"{path} exists and is not a socket; not removing it")
    path.unlink()


def bind_unix_socket(path: Path) -> socket.socket:
    """Bind and listen at once: whoever sees the socket file (a start script, a container
    waiting for it) can connect from that moment; connections queue until serving begins."""
    remove_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fspath(path))
        path.chmod(SOCKET_MODE)
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise ServeError(f"cannot bind {path}: {exc}") from exc
    return sock


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals alone (brokerd handles them once for all servers),
    accepts through a ``GuardedListener``, and says when it has started or ended (``settled``).
    """

    def __init__(self, config: uvicorn.Config, endpoint: Endpoint) -> None:
        super().__init__(config)
        self.endpoint = endpoint
        self.settled = anyio.Event()
        self.connections = WatchedConnections()
        self.server_state.connections = self.connections
        self.listeners: list[GuardedListener] = []

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # An empty list: uvicorn runs the lifespan and makes no server of its own.
        await super().startup(sockets=[])
        for sock in sockets or []:
            listener = GuardedListener(
                self.endpoint.name,
                sock,
                self._protocol,
                self.connections,
                self.endpoint.limits.max_connections,
            )
            listener.start()
            self.listeners.append(listener)
        self.settled.set()

    def _protocol(self) -> asyncio.Protocol:
        # What uvicorn's own startup would hand to loop.create_server.
        protocol: asyncio.Protocol = self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )
        return protocol

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for listener in self.listeners:
            await listener.stop()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _uvicorn_server(endpoint: Endpoint, graceful_shutdown_s: int) -> _Server:
    config = uvicorn.Config(
        endpoint.app,
        http=head_deadline_protocol(endpoint.name, endpoint.limits.header_timeout_s),
        lifespan="on",
        log_config=None,  # brokerd configures logging once; uvicorn's loggers propagate to it
        access_log=False,  # the proxies log one line per request themselves
        proxy_headers=False,
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=graceful_shutdown_s,
    )
    return _Server(config, endpoint)


def ensure_file_limit(endpoints: Sequence[Endpoint]) -> None:
    """Raise the open-file limit to what the sockets' connection caps need, up to the hard
    limit; ``ServeError`` when even that is too low (the caps would not keep the sockets apart).
    """
    needed = SPARE_FILES + sum(
        endpoint.limits.max_connections * FILES_PER_CONNECTION for endpoint in endpoints
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        soft = raised
    if soft != resource.RLIM_INFINITY and soft < needed:
        raise ServeError(
            f"the open-file limit ({soft}) is below the {needed} that max_connections_per_socket "
            "needs; raise LimitNOFILE or lower max_connections_per_socket"
        )


async def serve(
    endpoints: Sequence[Endpoint],
    socket_dir: Path,
    stop: anyio.Event,
    *,
    graceful_shutdown_s: int = GRACEFUL_SHUTDOWN_S,
    metrics: "MetricsService | None" = None,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve every endpoint until ``stop`` is set (or one server ends), then remove the sockets.

    Reports started (``task_status``) once every server accepts connections.
    """
    ensure_file_limit(endpoints)
    prepare_socket_dir(socket_dir)
    bound: list[tuple[Endpoint, socket.socket]] = []
    try:
        for endpoint in endpoints:
            bound.append((endpoint, bind_unix_socket(endpoint.path)))
        servers = [_uvicorn_server(endpoint, graceful_shutdown_s) for endpoint, _ in bound]
        async with anyio.create_task_group() as tg:
            for server, (endpoint, sock) in zip(servers, bound, strict=True):
                tg.start_soon(_serve_one, server, sock, endpoint, stop)
            for server in servers:
                await server.settled.wait()
            # The metrics server serves until cancelled (it has no stop of its own): its own
            # task group, cancelled on the stop, so that it never holds brokerd up.
            async with anyio.create_task_group() as until_stop:
                if metrics is not None:
                    await until_stop.start(metrics)
                logger.info("ready: %s", ", ".join(str(endpoint.path) for endpoint, _ in bound))
                notify("READY=1")
                task_status.started()
                await stop.wait()
                until_stop.cancel_scope.cancel()
            notify("STOPPING=1")
            for server in servers:
                server.should_exit = True
    finally:
        for endpoint, sock in bound:
            sock.close()
            with contextlib.suppress(FileNotFoundError):
                endpoint.path.unlink()


async def _serve_one(
    server: _Server, sock: socket.socket, endpoint: Endpoint, stop: anyio.Event
) -> None:
    logger.info("serving %s on %s", endpoint.name, endpoint.path)
    try:
        await server.serve(sockets=[sock])
    except SystemExit as exc:  # uvicorn's answer to an app whose startup failed
        raise ServeError(f"{endpoint.name}: the app failed to start") from exc
    finally:
        server.settled.set()
        stop.set()  # one server ending stops the others


async def stop_on_signal(stop: anyio.Event, signals: StopSignals) -> None:
    """Set ``stop`` on the first SIGINT or SIGTERM (main thread only)."""
    signum = await signals.wait()
    logger.info("received %s, stopping", signum.name)
    stop.set()


async def run(
    endpoints: Sequence[Endpoint],
    socket_dir: Path,
    signals: StopSignals,
    metrics: "MetricsService | None" = None,
) -> None:
    """Serve until SIGINT or SIGTERM; the process's whole life. Raises ``ServeError`` bare
    (not inside the task groups' exception groups) when that is the only failure."""
    stop = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(stop_on_signal, stop, signals)
            await serve(endpoints, socket_dir, stop, metrics=metrics)
            tg.cancel_scope.cancel()
    except ExceptionGroup as group:
        if (error := sole_kind(group, ServeError)) is None:
            raise
        raise error from None
