"""Durable sessions with ``[[endpoint]]`` tables, on the real router with ``--slot-save-path``:
each server's answers recorded as ``loopd selftest --record --endpoint NAME`` records them (its
own ``expected/endpoints/NAME.json``), loopd then run with the default settings
(``LOOPD_DURABLE=auto`` goes by that record, as ``loopd chat`` does). Three sessions on one
endpoint, the server killed and started again: each session's next turn re-reads under a tenth of
its prompt (its save restored). The same with two endpoints, one of them restarted: its sessions
come back from disk, the other's never left, and nobody moves. Model work is bounded by
``max_tokens``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loopd.config import CORE_TOOLS_FILE, Settings, load_settings
from loopd.engine.cacheloss import LossCause
from loopd.selftest.expected import endpoint_expectation_path, recorded_answers
from loopd.selftest.run import run_selftest
from loopd.sessionlog.records import Request, RequestKind
from loopd.sessions import Runtime
from loopd.tools.spec import load_tools_spec
from loopd_dev import devserver
from tests.durable.test_durable_real import Restartable, say, turn_request

pytestmark = [pytest.mark.real_server, pytest.mark.anyio]

SECOND = "Message two: and tomorrow?"
MOST_REREAD = 0.10  # of the prompt, after a restart


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[dict[str, Restartable]]:
    """The servers the test starts (by endpoint name), each stopped at the end."""
    started: dict[str, Restartable] = {}
    try:
        yield started
    finally:
        for server in started.values():
            server.stop()


def first(name: str) -> str:
    """A first message long enough that the second is a small part of the prompt (the embedded
    server's template renders no tools, and its system text is short)."""
    notes = " ".join(f"{name}-note-{i}" for i in range(120))
    return f"Message one of {name}: keep these notes, then tell me the weather briefly. {notes}"


def start(started: dict[str, Restartable], root: Path, name: str) -> Restartable:
    server = started[name] = Restartable(root / name, devserver.PLAIN_MODEL)
    server.start()
    return server


def settings_for(servers: dict[str, Restartable], state: Path) -> Settings:
    """The default settings (``LOOPD_DURABLE`` and ``LOOPD_PIN_SLOTS`` ``auto``), with the model's
    work bounded."""
    tables = [
        {"name": name, "url": server.url, "model": server.model, "slots": (0, 1)}
        for name, server in servers.items()
    ]
    return load_settings(
        endpoint=tables, state_dir=state, max_tokens=16, think_cap=0, temperature=0.0
    )


async def record(settings: Settings, expected: Path) -> None:
    """``loopd selftest --record``, for each endpoint: its own expectations file."""
    tools_text = load_tools_spec(CORE_TOOLS_FILE).text
    for endpoint in settings.endpoints():
        report = await run_selftest(
            settings.for_endpoint(endpoint),
            tools_text=tools_text,
            record=True,
            expected_dir=expected,
            endpoint=endpoint.name,
        )
        assert report.ok, [r for r in report.results if not r.ok]
        assert endpoint_expectation_path(endpoint.name, expected).is_file()
        answers = recorded_answers(endpoint.model, endpoint.name, expected)
        assert answers is not None
        assert answers.durable_available is True


def reread(requests: list[Request]) -> tuple[int, int]:
    """The answered turn request's re-read and its whole prompt, in tokens."""
    perf = turn_request(requests).record.perf
    assert perf.cache_n is not None
    assert perf.prompt_n is not None
    return perf.prompt_n, perf.cache_n + perf.prompt_n


def check_rereads(after: dict[str, list[Request]], where: dict[str, str]) -> None:
    """Each session's turn after the restart re-read under ``MOST_REREAD`` of its prompt, on
    its endpoint (``where``), and says so."""
    for name, requests in after.items():
        read, prompt = reread(requests)
        print(f"{name} on {where[name]}: re-read {read} of {prompt} prompt tokens")
        assert read < MOST_REREAD * prompt, (name, read, prompt)
        assert endpoint_of(requests) == {where[name]}, "nobody moved"


def endpoint_of(requests: list[Request]) -> set[object]:
    return {r.record.perf.extra.get("endpoint") for r in requests}


async def test_three_sessions_on_one_endpoint_come_back_from_disk_after_a_restart(
    folder: dict[str, Restartable], tmp_path: Path
) -> None:
    server = start(folder, tmp_path, "gpu1")
    settings = settings_for(folder, tmp_path / "state")
    await record(settings, tmp_path / "expected")
    names = ("north", "south", "east")
    runtime = Runtime.open(settings, expected_dir=tmp_path / "expected")
    try:
        assert runtime.endpoints.servers["gpu1"].durable is not None, "auto: the record says yes"
        for name in names:
            before = await say(runtime, first(name), name)
            assert [r.record.kind for r in before] == [RequestKind.TURN, RequestKind.PREWARM]
        server.kill()
        server.start()
        after = {name: await say(runtime, SECOND, name) for name in names}
    finally:
        await runtime.aclose()
    check_rereads(after, dict.fromkeys(names, "gpu1"))
    for requests in after.values():
        answered = turn_request(requests).record.perf
        assert answered.cache_loss_cause == LossCause.RESTORED.value, answered


async def test_two_endpoints_one_restarted_its_sessions_come_back_from_disk(
    folder: dict[str, Restartable], tmp_path: Path
) -> None:
    for name in ("a", "b"):
        start(folder, tmp_path, name)
    settings = settings_for(folder, tmp_path / "state")
    await record(settings, tmp_path / "expected")
    names = ("s1", "s2", "s3", "s4")
    runtime = Runtime.open(settings, expected_dir=tmp_path / "expected")
    try:
        for name in names:
            await say(runtime, first(name), name)
        placed = {name: where for name, (where, _) in runtime.log.last_endpoints().items()}
        # Two on each (which two: the placement's tie-break, by what each server holds).
        assert sorted(placed.values()) == ["a", "a", "b", "b"], placed
        folder["a"].kill()
        folder["a"].start()
        after = {name: await say(runtime, SECOND, name) for name in names}
    finally:
        await runtime.aclose()
    check_rereads(after, placed)
    for name, requests in after.items():
        cause = turn_request(requests).record.perf.cache_loss_cause
        if placed[name] == "a":  # restarted: its save came back
            assert cause == LossCause.RESTORED.value, (name, cause)
        else:  # its server kept it
            assert cause is None, (name, cause)
