"""web_fetch against a real loopback HTTP server, and its pure URL and content-type rules."""

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from brokerd.tools.builtins import BuiltinContext, host_allowed, is_text, url_problem, web_fetch
from brokerd.tools.errors import ToolFailure
from loopcommon.capture import CappedOutput
from tests.brokerd.tools.brokertools_support import loopback_socket, serving

pytestmark = pytest.mark.anyio


async def page(request: Request) -> Response:
    return PlainTextResponse("héllo from the test server", media_type="text/plain")


async def latin1(request: Request) -> Response:
    return Response("café".encode("latin-1"), media_type="text/plain; charset=iso-8859-1")


async def image(request: Request) -> Response:
    return Response(b"\x89PNG...", media_type="image/png")


async def big(request: Request) -> Response:
    return PlainTextResponse("y" * 100_000)


async def redirect_on(request: Request) -> Response:
    return RedirectResponse("/page", status_code=302)


async def redirect_off(request: Request) -> Response:
    return RedirectResponse("http://elsewhere.invalid/steal", status_code=302)


async def redirect_loop(request: Request) -> Response:
    return RedirectResponse("/loop", status_code=302)


TEST_SITE = Starlette(
    routes=[
        Route("/page", page),
        Route("/latin1", latin1),
        Route("/image", image),
        Route("/big", big),
        Route("/redirect-on", redirect_on),
        Route("/redirect-off", redirect_off),
        Route("/loop", redirect_loop),
    ]
)


@pytest.fixture
async def site() -> AsyncIterator[str]:
    sock = loopback_socket()
    port = sock.getsockname()[1]
    async with serving(TEST_SITE, sock=sock):
        yield f"http://127.0.0.1:{port}"
    sock.close()


async def fetch(url: str, cap: int = 10_000, **context: Any) -> CappedOutput:
    output = CappedOutput(cap)
    settings = BuiltinContext(web_fetch_allowlist=("127.0.0.1",), **context)
    await web_fetch({"url": url}, output, settings)
    return output


async def test_fetches_text_from_an_allowed_host(site: str) -> None:
    output = await fetch(f"{site}/page")
    assert output.text() == "HTTP 200 OK (text/plain; charset=utf-8)\n\nhéllo from the test server"


async def test_decodes_the_declared_charset(site: str) -> None:
    assert (await fetch(f"{site}/latin1")).text().endswith("café")


async def test_refuses_a_host_off_the_allowlist_without_connecting(site: str) -> None:
    port = site.rsplit(":", 1)[1]
    with pytest.raises(
        ToolFailure, match="host 'localhost' is not on brokerd's web_fetch allowlist"
    ):
        await fetch(f"http://localhost:{port}/page")


async def test_follows_a_redirect_that_stays_on_the_allowlist(site: str) -> None:
    assert (await fetch(f"{site}/redirect-on")).text().endswith("héllo from the test server")


async def test_refuses_a_redirect_off_the_allowlist(site: str) -> None:
    with pytest.raises(ToolFailure, match=r"'elsewhere\.invalid' is not on"):
        await fetch(f"{site}/redirect-off")


async def test_stops_after_too_many_redirects(site: str) -> None:
    with pytest.raises(ToolFailure, match="more than 3 redirects"):
        await fetch(f"{site}/loop", web_fetch_max_redirects=3)


async def test_refuses_binary_content(site: str) -> None:
    with pytest.raises(ToolFailure, match="answered 'image/png'; web_fetch returns text only"):
        await fetch(f"{site}/image")


async def test_caps_a_long_page(site: str) -> None:
    output = await fetch(f"{site}/big", cap=1000)
    assert output.cut
    assert output.held == 1000


async def test_a_server_that_is_down_is_a_tool_failure() -> None:
    sock = loopback_socket()
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(ToolFailure, match="could not fetch"):
        await fetch(f"http://127.0.0.1:{port}/page")


def test_allowlist_matches_host_and_subdomains_only() -> None:
    assert host_allowed("example.org", ["example.org"])
    assert host_allowed("Docs.Example.org.", ["example.org"])
    assert not host_allowed("badexample.org", ["example.org"])
    assert not host_allowed("example.org.evil.net", ["example.org"])
    assert not host_allowed("example.org", [])


def test_url_rules() -> None:
    assert url_problem(httpx.URL("https://example.org/x"), ["example.org"]) is None
    assert "only http and https" in (url_problem(httpx.URL("file:///etc/passwd"), ["x"]) or "")
    assert "only http and https" in (url_problem(httpx.URL("/relative"), ["x"]) or "")


@pytest.mark.parametrize(
    ("content_type", "text"),
    [
        ("text/html; charset=utf-8", True),
        ("application/json", True),
        ("application/ld+json", True),
        ("image/png", False),
        ("application/octet-stream", False),
        ("", False),
    ],
)
def test_text_content_types(content_type: str, text: bool) -> None:
    assert is_text(content_type) is text
