"""The fake as a process (``python -m loopd_dev.fakes.llama --uds PATH``), driven over
``/_fake/*``."""

import sys
import tempfile
from pathlib import Path

import anyio
import httpx
import pytest
from anyio.streams.text import TextReceiveStream

from tests.fakes.llama.llama_fake_testkit import MODEL, chat_body, parse_events, user

pytestmark = pytest.mark.anyio


async def test_process_serves_on_a_socket_and_dies_on_request() -> None:
    with tempfile.TemporaryDirectory(prefix="lf") as tmp:
        uds = Path(tmp) / "fake.sock"
        command = [
            sys.executable,
            "-m",
            "loopd_dev.fakes.llama",
            "--uds",
            str(uds),
            "--model",
            MODEL,
        ]
        async with await anyio.open_process(command) as process:
            assert process.stdout is not None
            with anyio.fail_after(20):
                line = await anext(aiter(TextReceiveStream(process.stdout)))
            assert line.startswith(f"listening on {uds}")
            transport = httpx.AsyncHTTPTransport(uds=str(uds))
            async with httpx.AsyncClient(
                base_url="http://localhost", transport=transport
            ) as client:
                await client.post("/_fake/script", json={"replies": [{"content": "From afar."}]})
                async with client.stream(
                    "POST", "/v1/chat/completions", json=chat_body(user("hi"), stream=True)
                ) as response:
                    events = parse_events(await response.aread())
                await client.post("/_fake/die")
            with anyio.fail_after(10):
                assert await process.wait() == 0
    content = "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-2])
    assert content == "From afar."
