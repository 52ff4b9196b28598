"""The status page brokerd relays from the box, opened in a real browser (headless Chromium).

The box writes the folder loopd's metrics socket lives in, so whatever answers there may be the
attacker's. Its page tries what a Content-Security-Policy alone does not stop: a ``<meta
http-equiv="refresh">`` to another site (Chromium follows it under ``default-src 'none'``), a
script, an image; its status data carries the same markup in a session's and the model's name.
A trap on 127.0.0.1 records any request the browser makes on the page's behalf.
"""

import http.server
import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from loopd_dev.devserver import free_port
from tests.observe.real_stack import system_tool
from tests.security.brokerd_run import brokerd
from tests.security.fake_mattermost import served

BROWSER_TIMEOUT_S = 120.0
SCRIPT_MARK = "the box's script ran"


@contextmanager
def trap() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 that records the path of every request it gets."""
    seen: list[str] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            body = b"<html><body>the trap</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def active_content(trap_url: str, where: str) -> str:
    """Markup that navigates the browser to the trap, and runs a script that marks the page."""
    return (
        f'<meta http-equiv="refresh" content="0;url={trap_url}/{where}-refresh">'
        f'<img src="{trap_url}/{where}-image">'
        f'<script>document.body.innerHTML = "{SCRIPT_MARK}";'
        f'fetch("{trap_url}/{where}-script")</script>'
    )


def hostile_loopd(trap_url: str) -> Starlette:
    """loopd's three pages as a box that wants the operator's browser would serve them."""
    markup = active_content(trap_url, "page")
    page = f"<!DOCTYPE html><html><head>{markup}</head><body><h1>loopd</h1></body></html>"
    named = active_content(trap_url, "data")
    status = {
        "generated_at": "2026-05-01T12:00:00Z",
        "model": named,
        "slots": [{"slot": 0, "holder": named, "phase": named, "in_line": 0}],
        "live": [
            {
                "session": named,
                "slot": 0,
                "phase": "reading",
                "running_s": 1.0,
                "holding": True,
                "ahead": 0,
            }
        ],
        "sessions": [],
    }

    async def index(request: Request) -> Response:
        return Response(page, media_type="text/html")

    async def status_json(request: Request) -> Response:
        return Response(json.dumps(status), media_type="application/json")

    async def metrics(request: Request) -> Response:
        return Response("loopd_up 1\n", media_type="text/plain")

    routes = [Route("/", index), Route("/status.json", status_json), Route("/metrics", metrics)]
    return Starlette(routes=routes)


def dump_dom(url: str, profile: Path) -> str:
    """The page's DOM after Chromium has loaded it and run its timers for 3 s of virtual time
    (a zero-delay refresh, a script and a fetch all happen within it)."""
    argv = [
        system_tool("chromium"),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=3000",
        "--dump-dom",
        url,
    ]
    done = subprocess.run(argv, capture_output=True, timeout=BROWSER_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout.decode(errors="replace")


@pytest.mark.attack(
    attack="The relayed status page sends the operator's browser elsewhere or runs a script",
    input="loopd's socket answers a page and status data with a meta refresh, a script and an "
    "image pointing at a trap on 127.0.0.1",
    expected="Chromium shows brokerd's page with the markup as text; the trap gets no request",
)
def test_the_status_page_neither_navigates_nor_runs_the_boxs_content(
    short_dir: Path, tmp_path: Path, observed: Callable[[str], None]
) -> None:
    port = free_port()
    with trap() as (trap_url, seen), served(hostile_loopd(trap_url), short_dir / "loopd.sock"):
        variables = {
            "BROKERD_INFERENCE_URL": f"unix:{short_dir}/no-llama.sock",
            "BROKERD_METRICS_ADDR": f"127.0.0.1:{port}",
            "BROKERD_METRICS_RELAY": str(short_dir / "loopd.sock"),
        }
        with brokerd(short_dir, variables, only=["infer"]):
            dom = dump_dom(f"http://127.0.0.1:{port}/loopd/", tmp_path / "chromium")
    observed(f"requests to the trap: {', '.join(seen) or 'none'}")
    assert seen == [], f"the browser went to the trap: {seen}"
    assert "<h1>loopd</h1>" in dom  # the script, had it run, would have replaced the body
    assert '&lt;meta http-equiv="refresh"' in dom  # the box's markup, shown as text
    assert "the trap" not in dom
