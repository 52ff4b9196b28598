"""``loopd_server_changed``: an operator's alert on a server that is not the one recorded, read
from the runtime at each scrape (``loopd serve`` sets and clears the change; loopd.serverchange)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from loopd.config import load_settings
from loopd.selftest.checks import CheckResult
from loopd.serverchange import server_change
from loopd.sessions import Runtime
from loopd.status.server import create_app
from tests.observe.observe_support import scraped, value

pytestmark = pytest.mark.anyio


async def test_the_gauge_follows_the_server_change(tmp_path: Path) -> None:
    runtime = Runtime.open(load_settings(state_dir=tmp_path / "state", model="fake-model"))
    transport = httpx.ASGITransport(create_app(runtime))
    seen: list[float] = []
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://loopd") as page:

            async def gauge() -> float:
                return value(scraped((await page.get("/metrics")).text), "loopd_server_changed")

            seen.append(await gauge())
            runtime.server_change = server_change(
                [CheckResult("build", False, expected="11434", actual="11500")]
            )
            seen.append(await gauge())
            runtime.server_change = None  # the self-test passed again
            seen.append(await gauge())
    finally:
        await runtime.aclose()
    assert seen == [0.0, 1.0, 0.0]
