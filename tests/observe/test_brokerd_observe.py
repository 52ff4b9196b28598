"""brokerd's side: the socket wrapper (loopd's headers read and removed, requests and refusals
counted), its metrics address, and the relay of loopd's pages from a socket the box controls."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from anyio.abc import SocketStream
from starlette.types import Receive, Scope, Send

from brokerd.config import BrokerdSettings
from brokerd.observe.context import current
from brokerd.observe.metrics import BROKERD_METRICS
from brokerd.observe.middleware import instrument
from brokerd.observe.relay import MAX_BYTES, PAGE_POLICY, LoopdRelay
from brokerd.observe.server import create_metrics_app, metrics_service
from brokerd.proxy.inference import create_inference_app
from brokerd.proxy.upstream import parse_upstream
from loopcommon.errors import ConfigError
from loopcommon.statuspage import REFRESH_S
from loopd.config import load_settings
from loopd.sessions import Runtime
from loopd.status.server import serve_runtime
from tests.observe.observe_support import captured_logs, sample, scraped, value

pytestmark = pytest.mark.anyio


@pytest.fixture
def sockets() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ob") as tmp:
        yield Path(tmp)


def asgi_client(app: object, base_url: str = "http://brokerd") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url=base_url)  # type: ignore[arg-type]


# -- the socket wrapper --------------------------------------------------------------------------


async def test_loopds_headers_are_read_into_the_context_and_never_passed_on() -> None:
    seen: list[tuple[list[tuple[bytes, bytes]], dict[str, str]]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        context = current()
        assert context is not None
        seen.append((list(scope["headers"]), context.fields()))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"12345"})

    before = sample(
        BROKERD_METRICS.registry,
        "brokerd_requests_total",
        socket="broker",
        route="/v1/health",
        status="200",
    )
    async with asgi_client(instrument("broker", app)) as client:
        await client.get(
            "/v1/health", headers={"X-Loopd-Request": "0123abcd", "X-Loopd-Session": "mm:abc"}
        )
        await client.get(
            "/v1/health", headers={"X-Loopd-Request": "no spaces allowed", "X-Loopd-Session": "x"}
        )
    (first_headers, first), (_, second) = seen
    assert first == {"socket": "broker", "request_id": "0123abcd", "session": "mm:abc"}
    assert not [name for name, _ in first_headers if name.startswith(b"x-loopd")]
    assert second == {"socket": "broker", "session": "x"}, "a malformed id is not believed"
    after = sample(
        BROKERD_METRICS.registry,
        "brokerd_requests_total",
        socket="broker",
        route="/v1/health",
        status="200",
    )
    assert after - before == 2


async def test_refusals_are_counted_by_reason_and_logged_with_the_request_id() -> None:
    app = instrument("infer", create_inference_app(parse_upstream("http://127.0.0.1:9")))
    registry = BROKERD_METRICS.registry

    def counts() -> tuple[float, float, float]:
        return (
            sample(registry, "brokerd_refused_requests_total", socket="infer", reason="route"),
            sample(registry, "brokerd_refused_requests_total", socket="infer", reason="policy"),
            sample(registry, "brokerd_requests_total", socket="infer", route="other", status="403"),
        )

    before = counts()
    with captured_logs() as logs:
        async with asgi_client(app) as client:
            refused = await client.post(
                "/models/load", content=b"{}", headers={"X-Loopd-Request": "feedbeef"}
            )
            not_json = await client.post("/v1/chat/completions", content=b"[1")
    assert refused.status_code == 403
    assert not_json.status_code == 400
    assert [a - b for a, b in zip(counts(), before, strict=True)] == [1, 1, 1]
    [line] = [line for line in logs.of("brokerd.") if line["msg"] == "refused POST /models/load"]
    assert line["request_id"] == "feedbeef"
    assert line["socket"] == "infer"


async def test_slot_actions_share_one_route_label() -> None:
    app = instrument("infer", create_inference_app(parse_upstream("http://127.0.0.1:9")))

    def erased() -> float:
        labels = {"socket": "infer", "route": "/slots/{id}", "status": "403"}
        return sample(BROKERD_METRICS.registry, "brokerd_requests_total", **labels)

    before = erased()
    async with asgi_client(app) as client:
        for slot in (0, 7):
            refused = await client.post(f"/slots/{slot}?action=erase", content=b"{}")
            assert refused.status_code == 403
    assert erased() - before == 2


# -- the metrics address -------------------------------------------------------------------------


def broker_settings(**values: object) -> BrokerdSettings:
    return BrokerdSettings(**values)  # type: ignore[arg-type]


def test_the_metrics_address_must_be_out_of_the_boxs_reach(tmp_path: Path) -> None:
    assert metrics_service(broker_settings(socket_dir=tmp_path)) is None
    inside = broker_settings(socket_dir=tmp_path, metrics_addr=f"unix:{tmp_path}/metrics.sock")
    with pytest.raises(ConfigError, match="in socket_dir, which the box mounts"):
        metrics_service(inside)
    lonely = broker_settings(socket_dir=tmp_path, metrics_relay=tmp_path / "m.sock")
    with pytest.raises(ConfigError, match="metrics_relay: needs metrics_addr"):
        metrics_service(lonely)
    with pytest.raises(ValueError, match="not a loopback address"):
        broker_settings(metrics_addr="0.0.0.0:9464")
    assert metrics_service(broker_settings(metrics_addr="127.0.0.1:9464")) is not None


async def test_brokerds_metrics_page_parses() -> None:
    async with asgi_client(create_metrics_app(None)) as client:
        page = await client.get("/metrics")
        no_relay = await client.get("/loopd/metrics")
    assert page.status_code == 200
    assert value(scraped(page.text), "brokerd_requests_in_flight", socket="broker") >= 0
    assert any(name == "brokerd_requests_total" for name, _ in scraped(page.text))
    assert no_relay.status_code == 404


# -- the relay -----------------------------------------------------------------------------------


async def test_loopds_pages_are_relayed_from_its_socket(tmp_path: Path, sockets: Path) -> None:
    runtime = Runtime.open(load_settings(state_dir=tmp_path / "state", model="m"))
    loopd_socket = sockets / "metrics.sock"
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(serve_runtime, runtime, f"unix:{loopd_socket}")
            async with asgi_client(create_metrics_app(LoopdRelay(loopd_socket))) as client:
                metrics = await client.get("/loopd/metrics")
                page = await client.get("/loopd/")
                data = await client.get("/loopd/status.json")
                folder = await client.get("/loopd", follow_redirects=False)
            tg.cancel_scope.cancel()
    finally:
        await runtime.aclose()
    assert metrics.status_code == 200
    assert ("loopd_turns_total", (("outcome", "answered"),)) in scraped(metrics.text)
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["content-security-policy"] == PAGE_POLICY
    assert page.headers["refresh"] == str(REFRESH_S)  # the sandbox stops a meta refresh
    assert "<h1>loopd</h1>" in page.text
    assert data.json()["model"] == "m"
    assert folder.status_code == 308
    assert folder.headers["location"] == "/loopd/"


Handler = Callable[[SocketStream], Awaitable[None]]


@asynccontextmanager
async def hostile_loopd(path: Path, handler: Handler) -> AsyncIterator[list[bytes]]:
    """A socket at ``path`` that answers as ``handler`` says; yields the request heads read."""
    heads: list[bytes] = []

    async def serve(stream: SocketStream) -> None:
        async with stream:
            head = b""
            while b"\r\n\r\n" not in head:
                head += await stream.receive()
            heads.append(head)
            await handler(stream)

    listener = await anyio.create_unix_listener(path)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        yield heads
        tg.cancel_scope.cancel()


def answering(raw: bytes) -> Handler:
    async def handler(stream: SocketStream) -> None:
        await stream.send(raw)

    return handler


async def huge(stream: SocketStream) -> None:
    await stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (MAX_BYTES * 4))
    chunk = b"a" * 65536
    for _ in range(MAX_BYTES * 4 // len(chunk)):
        await stream.send(chunk)


async def endless_head(stream: SocketStream) -> None:
    await stream.send(b"HTTP/1.1 200 OK\r\nX-Pad: ")
    for _ in range(64):  # 4 MiB of one header, never ended
        await stream.send(b"a" * 65536)
    await anyio.sleep_forever()


async def silent(stream: SocketStream) -> None:
    await anyio.sleep_forever()


@pytest.mark.parametrize(
    ("handler", "status", "says"),
    [
        (huge, 502, f"over {MAX_BYTES} bytes"),
        (silent, 502, "did not answer in 0.5 s"),
        (answering(b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n"), 502, "answered 500"),
        (
            answering(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc"),
            502,
            "relays plain bodies only",
        ),
        (endless_head, 502, "loopd's metrics socket"),
        (answering(b"SSH-2.0-OpenSSH\r\n\r\n"), 502, "loopd's metrics socket"),
    ],
    ids=["huge", "silent", "500", "encoded", "huge head", "not http"],
)
async def test_a_hostile_answer_is_not_relayed(
    sockets: Path, handler: Handler, status: int, says: str
) -> None:
    path = sockets / "metrics.sock"
    async with hostile_loopd(path, handler):
        app = create_metrics_app(LoopdRelay(path, timeout_s=0.5))
        async with asgi_client(app) as client:
            answer = await client.get("/loopd/metrics")
    assert answer.status_code == status
    assert says in answer.text


async def test_only_fixed_paths_are_asked_for_and_the_page_runs_no_script(sockets: Path) -> None:
    path = sockets / "metrics.sock"
    body = b"<script>alert(1)</script>"
    raw = b"HTTP/1.1 200 OK\r\nContent-Type: application/javascript\r\nSet-Cookie: a=b\r\n"
    raw += b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    async with (
        hostile_loopd(path, answering(raw)) as heads,
        asgi_client(create_metrics_app(LoopdRelay(path))) as client,
    ):
        data = await client.get(
            "/loopd/status.json?next=/etc/passwd", headers={"Authorization": "Bearer operator"}
        )
        page = await client.get("/loopd/?next=/etc/passwd")
    assert data.status_code == 200
    assert data.headers["content-type"] == "application/json"  # brokerd's, not loopd's
    assert "script-src" not in PAGE_POLICY
    assert "default-src 'none'" in PAGE_POLICY
    assert "sandbox" in PAGE_POLICY.split("; ")
    assert data.headers["content-security-policy"] == PAGE_POLICY
    assert data.headers["x-content-type-options"] == "nosniff"
    assert "set-cookie" not in data.headers
    # The page is rendered from loopd's status data, never relayed as markup.
    assert page.status_code == 502
    assert "is not a status" in page.text
    assert "<script>" not in page.text
    assert len(heads) == 2
    for head in heads:
        assert head.startswith(b"GET /status.json HTTP/1.1\r\n")
        assert b"passwd" not in head
        assert b"operator" not in head


async def test_a_link_or_a_file_in_place_of_the_socket_is_not_followed(sockets: Path) -> None:
    real = sockets / "brokerd-own.sock"
    link = sockets / "metrics.sock"
    plain = sockets / "plain"
    plain.write_text("x")
    async with hostile_loopd(
        real, answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    ) as heads:
        link.symlink_to(real)
        async with asgi_client(create_metrics_app(LoopdRelay(link))) as client:
            through_link = await client.get("/loopd/metrics")
        async with asgi_client(create_metrics_app(LoopdRelay(plain))) as client:
            through_file = await client.get("/loopd/metrics")
        async with asgi_client(create_metrics_app(LoopdRelay(sockets / "none"))) as client:
            missing = await client.get("/loopd/metrics")
        async with asgi_client(create_metrics_app(LoopdRelay(real))) as client:
            direct = await client.get("/loopd/metrics")
    assert through_link.status_code == 502
    assert "not a socket" in through_link.text
    assert through_file.status_code == 502
    assert missing.status_code == 502
    assert "No such file" in missing.text
    assert direct.status_code == 200, "the control: the socket itself is relayed"
    assert len(heads) == 1, "nothing connected through the link"


async def test_stalled_relays_do_not_pile_up(sockets: Path) -> None:
    path = sockets / "metrics.sock"
    results: list[int] = []
    async with hostile_loopd(path, silent):
        app = create_metrics_app(LoopdRelay(path, timeout_s=2.0))
        async with asgi_client(app) as client, anyio.create_task_group() as tg:

            async def scrape() -> None:
                results.append((await client.get("/loopd/metrics")).status_code)

            for _ in range(2):
                tg.start_soon(scrape)
            await anyio.wait_all_tasks_blocked()
            third = await client.get("/loopd/metrics")
    assert third.status_code == 503
    assert sorted(results) == [502, 502]


class FakeServer:
    def __init__(self, state: str, tools: int, attempts: int) -> None:
        self.state, self.tools, self.attempts = state, [object()] * tools, attempts


class FakeServers:
    def __init__(self, **servers: FakeServer) -> None:
        self.servers = servers


def test_mcp_servers_state_is_read_at_each_scrape() -> None:
    from brokerd.observe.metrics import BrokerdMetrics

    metrics = BrokerdMetrics()
    servers = FakeServers(files=FakeServer("up", 3, 1), web=FakeServer("starting", 0, 0))
    metrics.watch_mcp(servers)  # type: ignore[arg-type]

    def state(server: str, value: str) -> float | None:
        return metrics.registry.get_sample_value(
            "brokerd_mcp_server_state", {"server": server, "state": value}
        )

    assert (state("files", "up"), state("files", "down"), state("web", "starting")) == (1, 0, 1)
    tools = metrics.registry.get_sample_value("brokerd_mcp_server_tools", {"server": "files"})
    assert tools == 3
    servers.servers["files"].state, servers.servers["files"].attempts = "down", 2
    assert (state("files", "up"), state("files", "down")) == (0, 1)
    connects = {"server": "files"}
    assert metrics.registry.get_sample_value("brokerd_mcp_server_connects_total", connects) == 2
    del servers
    assert state("files", "down") is None, "servers that are gone are forgotten"
