"""A move between servers is warm too, on the real router: two ``[[endpoint]]`` servers of one
model, each with ``--slot-save-path`` on one folder (brokerd copies a save between folders that
differ: ``tests/brokerd/proxy/test_slotfolder.py``). A session's server is killed; its next turn
moves to the other server, which restores the session's save first and sends the request once,
re-reading under a tenth of its prompt, and the request's perf record says it moved with its
save. Model work is bounded by ``max_tokens``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loopd.engine.cacheloss import LossCause
from loopd.sessionlog.records import RequestKind
from loopd.sessions import Runtime
from loopd.turn.saves import MOVED
from loopd_dev import devserver
from tests.durable.test_durable_endpoints_real import (
    MOST_REREAD,
    SECOND,
    endpoint_of,
    first,
    record,
    reread,
    settings_for,
)
from tests.durable.test_durable_real import Restartable, say, turn_request

pytestmark = [pytest.mark.real_server, pytest.mark.anyio]


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[dict[str, Restartable]]:
    """Endpoints ``a`` and ``b``, saving into one folder; each stopped at the end."""
    started: dict[str, Restartable] = {}
    shared = tmp_path / "saves"
    shared.mkdir()
    try:
        for name in ("a", "b"):
            server = started[name] = Restartable(tmp_path / name, devserver.PLAIN_MODEL)
            server.saves = shared
            server.start()
        yield started
    finally:
        for server in started.values():
            server.stop()


async def test_a_session_moved_off_a_killed_server_comes_back_warm_on_the_other(
    servers: dict[str, Restartable], tmp_path: Path
) -> None:
    settings = settings_for(servers, tmp_path / "state")
    await record(settings, tmp_path / "expected")
    runtime = Runtime.open(settings, expected_dir=tmp_path / "expected")
    try:
        before = await say(runtime, first("north"), "north")
        assert endpoint_of(before) == {"a"}
        assert [r.record.kind for r in before] == [RequestKind.TURN, RequestKind.PREWARM]
        servers["a"].kill()
        after = await say(runtime, SECOND, "north")
    finally:
        await runtime.aclose()
    answered = turn_request(after)
    read, prompt = reread(after)
    print(f"north moved to b: re-read {read} of {prompt} prompt tokens")
    assert answered.record.perf.extra.get("endpoint") == "b"
    assert read < MOST_REREAD * prompt, (read, prompt)
    restore = answered.record.perf.extra.get("restore")
    assert isinstance(restore, dict), answered.record.perf.extra
    assert restore.get("why") == MOVED
    assert answered.record.perf.cache_loss_cause == LossCause.RESTORED.value
    # Restored before the request, which went to b once (nothing closed at its first event).
    on_b = [r for r in after if r.record.kind is RequestKind.TURN and endpoint_of([r]) == {"b"}]
    assert [r.record.perf.outcome for r in on_b] == ["complete"]
