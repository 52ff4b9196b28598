"""web_fetch and a compressed answer: what is decoded is bounded, not only what is returned.

A page of a few hundred bytes can name several stacked ``Content-Encoding`` layers that inflate
to a gibibyte. The page here is served by a local server on 127.0.0.1 (on web_fetch's allowlist
for the test); brokerd runs as its own process, so its peak resident memory (``VmHWM``) is what
the fetch cost it.
"""

import http.server
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.security.broker_api import BrokerClient
from tests.security.brokerd_run import RunningBrokerd, brokerd

MIB = 1024 * 1024
INFLATED = 1024 * MIB  # what the innermost layer holds: zeros
LAYERS = 3
MAX_GROWTH = 100 * MIB
WEB_FETCH_CAP = 200_000  # web_fetch's output_cap_bytes in the shipped catalogue


def gzip_stream(chunks: Iterable[bytes]) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip header and trailer
    return b"".join(compressor.compress(chunk) for chunk in chunks) + compressor.flush()


@pytest.fixture(scope="module")
def layers() -> list[bytes]:
    """``INFLATED`` zero bytes in one gzip layer (about 1 MiB), in two, ... up to ``LAYERS``
    (a few hundred bytes)."""
    zeros = bytes(MIB)
    bodies = [gzip_stream(zeros for _ in range(INFLATED // MIB))]
    while len(bodies) < LAYERS:
        bodies.append(gzip_stream([bodies[-1]]))
    return bodies


@contextmanager
def page_server(body: bytes, encoding: str) -> Iterator[str]:
    """A server on 127.0.0.1 answering every GET with ``body`` under ``encoding``, whatever
    the request's Accept-Encoding says."""

    class Bomb(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Encoding", encoding)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Bomb)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/page.txt"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def peak_rss(running: RunningBrokerd) -> int:
    """The brokerd process's peak resident memory so far (VmHWM)."""
    for line in Path(f"/proc/{running.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM line")


def health_while(running: RunningBrokerd, busy: threading.Event) -> list[float]:
    """Seconds each GET /v1/health on broker.sock took while ``busy`` was set (one at least,
    however soon it is cleared)."""
    took: list[float] = []
    transport = httpx.HTTPTransport(uds=str(running.socket("broker")))
    with httpx.Client(transport=transport, base_url="http://broker", timeout=60) as client:
        while True:
            started = time.monotonic()
            assert client.get("/v1/health").status_code == 200
            took.append(time.monotonic() - started)
            if not busy.is_set():
                return took


def fetch_bomb(
    short_dir: Path, bomb: bytes, encoding: str, observed: Callable[[str], None]
) -> dict[str, object]:
    """web_fetch of ``bomb`` through a brokerd of its own, with broker.sock probed meanwhile;
    the call's answer, once brokerd's memory and broker.sock's answers have been checked."""
    with page_server(bomb, encoding) as url:
        variables = {
            "BROKERD_INFERENCE_URL": f"unix:{short_dir}/no-llama.sock",
            "BROKERD_BROKER__AUDIT_DB": str(short_dir / "audit.db"),
            "BROKERD_BROKER__WEB_FETCH_ALLOWLIST": '["127.0.0.1"]',
        }
        with brokerd(short_dir, variables, only=["broker"]) as running:
            box = BrokerClient(running.socket("broker"))
            before = peak_rss(running)
            busy = threading.Event()
            busy.set()
            health: list[float] = []
            prober = threading.Thread(target=lambda: health.extend(health_while(running, busy)))
            prober.start()
            try:
                answer = box.call("web_fetch", {"url": url})
            finally:
                busy.clear()
                prober.join()
                box.close()
            grown = peak_rss(running) - before
    slowest = max(health, default=0.0)
    result = str(answer["result"])
    observed(
        f"{len(bomb)} B page: peak memory +{grown // MIB} MiB; {len(health)} health checks "
        f"meanwhile, slowest {slowest:.2f} s; {answer['status']}, {len(result)} characters: "
        f"{result.splitlines()[0][:100]}"
    )
    assert grown < MAX_GROWTH, f"brokerd's peak memory grew by {grown // MIB} MiB"
    assert health, "broker.sock answered nothing while the page was fetched"
    assert slowest < 2.0, f"broker.sock stalled {slowest:.2f} s while the page was decoded"
    return answer


@pytest.mark.attack(
    attack="A compressed page inflates in brokerd's memory before the output cap applies",
    input="web_fetch of a 265-byte page under `Content-Encoding: gzip, gzip, gzip` "
    "(1 GiB of zeros inside)",
    expected="refused with one line naming the encodings; brokerd's peak memory grows under "
    "100 MiB; broker.sock keeps answering",
)
def test_stacked_encodings_do_not_inflate_in_brokerd(
    short_dir: Path, layers: list[bytes], observed: Callable[[str], None]
) -> None:
    encoding = ", ".join(["gzip"] * LAYERS)
    answer = fetch_bomb(short_dir, layers[-1], encoding, observed)
    assert answer["status"] == "error"
    assert f"encoded {LAYERS} times ({encoding})" in str(answer["result"])
    assert "\n" not in str(answer["result"]).strip()


@pytest.mark.attack(
    attack="One gzip layer of a gibibyte inflates whole before the output cap applies",
    input="web_fetch of a 1 MiB page under `Content-Encoding: gzip` (1 GiB of zeros inside)",
    expected="the page's first 200,000 bytes (web_fetch's output cap); peak memory grows under "
    "100 MiB; broker.sock keeps answering",
)
def test_one_layer_inflates_only_up_to_the_cap(
    short_dir: Path, layers: list[bytes], observed: Callable[[str], None]
) -> None:
    answer = fetch_bomb(short_dir, layers[0], "gzip", observed)
    result = str(answer["result"])
    assert answer["status"] == "ok"
    assert "\0" * 1000 in result
    assert len(result) < WEB_FETCH_CAP + 1000  # the cap, and brokerd's line saying it cut
