"""loopd's BrokerClient against the broker served by uvicorn on a real Unix socket."""

import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from brokerd.tools.app import create_broker_app
from brokerd.tools.settings import BrokerSettings
from loopd.tools.broker_client import BrokerClient
from tests.brokerd.tools.brokertools_support import loopback_socket, serving

pytestmark = pytest.mark.anyio


async def hello(request: Request) -> Response:
    return PlainTextResponse("hello over loopback")


@pytest.fixture
async def site() -> AsyncIterator[str]:
    sock = loopback_socket()
    async with serving(Starlette(routes=[Route("/hello", hello)]), sock=sock):
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


@pytest.fixture
async def broker_socket(tmp_path: Path) -> AsyncIterator[Path]:
    # The default catalogue, as brokerd ships it, with the loopback test site allowed.
    settings = BrokerSettings(audit_db=tmp_path / "audit.db", web_fetch_allowlist=("127.0.0.1",))
    # A Unix socket path must stay under about 100 bytes; tmp_path can be longer than that.
    with tempfile.TemporaryDirectory(prefix="bt", dir="/tmp") as short:
        socket_path = Path(short) / "broker.sock"
        async with serving(create_broker_app(settings), uds=socket_path):
            yield socket_path


async def test_find_then_call_over_a_unix_socket(broker_socket: Path, site: str) -> None:
    async with BrokerClient(f"unix:{broker_socket}") as client:
        found = await client.find_tool("t1", "fetch a web page")
        assert 'call_tool(name="web_fetch"' in found
        result = await client.call_tool("t1", "call-1", "web_fetch", f'{{"url": "{site}/hello"}}')
        assert result.endswith("\n\nhello over loopback")
        off_list = await client.call_tool(
            "t1", "call-2", "web_fetch", '{"url": "https://a.invalid/"}'
        )
        assert "is not on brokerd's web_fetch allowlist" in off_list


async def test_refusal_comes_back_as_text(broker_socket: Path) -> None:
    async with BrokerClient(f"unix:{broker_socket}") as client:
        result = await client.call_tool("t2", "call-1", "web_fetch", "{}")
        assert "Call find_tool first" in result


async def test_broker_http_error_comes_back_as_text(broker_socket: Path) -> None:
    async with BrokerClient(f"unix:{broker_socket}") as client:
        result = await client.find_tool("", "anything")
        assert result.startswith("find_tool: brokerd answered HTTP 400: bad request: session")


async def test_brokerd_not_running_is_a_result_not_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "broker.sock"
    async with BrokerClient(f"unix:{missing}") as client:
        found = await client.find_tool("t1", "fetch")
        called = await client.call_tool("t1", "call-1", "web_fetch", "{}")
    assert found.startswith("find_tool is unavailable: brokerd is not running")
    assert called.startswith("call_tool 'web_fetch' is unavailable: brokerd is not running")
    assert "Nothing was run" in called


async def test_brokerd_down_over_tcp_too() -> None:
    sock = loopback_socket()
    port = sock.getsockname()[1]
    sock.close()
    async with BrokerClient(f"http://127.0.0.1:{port}") as client:
        assert "brokerd is not running" in await client.find_tool("t1", "fetch")


async def test_broker_that_stops_answering_is_a_result() -> None:
    def hang_up(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    transport = httpx.MockTransport(hang_up)
    async with BrokerClient("http://brokerd", transport=transport) as client:
        result = await client.call_tool("t1", "call-1", "web_fetch", "{}")
    assert "brokerd did not answer (ReadTimeout" in result
    assert "may or may not have taken effect" in result
