"""``loopd_mattermost_connected``: 1 while loopd's WebSocket is open and caught up, 0 once it is
closed (dropped, or the daemon stopped)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd.observe.metrics import METRICS
from loopd_dev.fakes.llama import RunningFake
from tests.chat.chat_support import daemon, environment, until


@pytest.mark.anyio
async def test_the_mattermost_gauge_follows_the_connection(
    tmp_path: Path, sockets: Path, llama: RunningFake
) -> None:
    def connected() -> float | None:
        return METRICS.registry.get_sample_value("loopd_mattermost_connected")

    async with environment(tmp_path, sockets, llama) as env:
        async with daemon(env) as running:
            await running.adapter.caught_up.wait()
            assert connected() == 1
            env.fake.drop_sockets("loopd")
            await until(lambda: running.adapter.connects >= 2, "the reconnection")
            await until(lambda: connected() == 1, "connected again")
        assert connected() == 0  # the daemon stopped: its socket is closed
