"""The server changed under loopd: the daemon stays up, each thread that asks hears one line per
change, no turn reaches the server, and once the self-test passes again the waiting turns are
answered. The fake llama-server's expectations are recorded, then their template hash changed,
as an upgraded server's would be."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from loopcommon.backoff import RECHECK_FIRST_S
from loopd.config import Settings
from loopd.selftest.expected import expectation_path
from loopd.selftest.probe import PROBE_SYSTEM_TEXT
from loopd.selftest.run import SelftestReport, run_selftest
from loopd.serve import STATUS_FILE, Daemon, run_daemon
from loopd.sessionlog.records import RequestKind
from loopd_dev.fakes.llama import FakeLlama, RequestRecord, RunningFake
from loopd_dev.fakes.llama.faults import Trigger
from loopd_dev.fakes.mattermost import LoggedPost
from tests.chat.chat_support import (
    WAIT_S,
    Env,
    chat_settings_for,
    fake_mattermost,
    settings_for,
    until,
)
from tests.chat.conftest import FAKE_MODEL

pytestmark = pytest.mark.anyio

CHANGED = "⚠️ The model server is not the one loopd was checked against"


@asynccontextmanager
async def checked_daemon(env: Env, report: SelftestReport, expected: Path) -> AsyncIterator[Daemon]:
    async with anyio.create_task_group() as tg:
        running: Daemon = await tg.start(
            lambda task_status: run_daemon(
                env.daemon_settings,
                report=report,
                expected_dir=expected,
                task_status=task_status,
            )
        )
        with anyio.fail_after(WAIT_S):
            await running.adapter.caught_up.wait()
        yield running
        tg.cancel_scope.cancel()


@asynccontextmanager
async def recorded(
    tmp_path: Path, sockets: Path, llama: RunningFake
) -> AsyncIterator[tuple[Env, Path]]:
    """The fake Mattermost, the daemon's settings (the long re-check interval, so only a test's
    own ``check`` calls run it) and the fake server's expectations, recorded: (env, folder)."""
    expected = tmp_path / "expected"
    async with fake_mattermost(sockets) as mm:
        settings = settings_for(
            tmp_path / "state", llama.base_url, FAKE_MODEL, selftest_every_s=3600.0
        )
        report = await run_selftest(settings, record=True, expected_dir=expected)
        assert report.ok, [r for r in report.results if not r.ok]
        yield Env(mm, settings, chat_settings_for(mm, tmp_path)), expected


def _changed_lines(env: Env, root_id: str) -> list[LoggedPost]:
    return [p for p in env.live_bot_posts(root_id) if p.message.startswith(CHANGED)]


def _turn_requests(fake: FakeLlama) -> list[RequestRecord]:
    """The chat requests that were not the self-test's probes."""
    return [r for r in fake.chat_records() if r.body["messages"][0]["content"] != PROBE_SYSTEM_TEXT]


def _set_template_hash(settings: Settings, expected: Path, digest: str | None) -> str:
    """Write ``digest`` as the recorded template hash (None: leave it); return the old one."""
    path = expectation_path(settings.model, expected)
    data = json.loads(path.read_text())
    old = str(data["template_sha256"])
    if digest is not None:
        data["template_sha256"] = digest
        path.write_text(json.dumps(data))
    return old


async def test_a_changed_server_is_told_once_per_thread_and_served_once_it_passes(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    async with recorded(tmp_path, sockets, llama) as (env, expected):
        settings = env.settings
        good = _set_template_hash(settings, expected, "0" * 64)
        report = await run_selftest(settings, expected_dir=expected)
        assert (report.ok, report.unreachable) == (False, False)

        async with checked_daemon(env, report, expected) as running:
            assert running.runtime.server_change is not None
            first = env.fake.post_as("alice", "dev", "@loopd what is two plus two?")
            second = env.fake.post_as("alice", env.dm(), "hello there")
            await until(lambda: len(_changed_lines(env, first.id)) == 1, "the first thread's line")
            await until(lambda: len(_changed_lines(env, second.id)) == 1, "the DM's line")
            # A second message in the thread during the same change: no second line.
            again = env.fake.post_as("bob", "dev", "and three?", root_id=first.id)
            session = f"mm:{first.id}"

            def stored_and_seen() -> bool:
                keys = [e.fields.external_key or "" for e in running.runtime.log.entries(session)]
                # Threads' worker for the session is gone once it has handled the message.
                return any(again.id in key for key in keys) and (
                    session not in running.threads._workers
                )

            await until(stored_and_seen, "the second message stored and handled")
            status = json.loads((settings.state_dir / STATUS_FILE).read_text())
            assert running.watch is not None
            await running.watch.check()  # still differs: nothing new said
            assert len(_changed_lines(env, first.id)) == 1
            assert _turn_requests(fake_llama) == [], "no turn reached the server"
            assert env.answers(first.id) == env.answers(second.id) == []

            # The operator checked the server and recorded it: the next check passes.
            _set_template_hash(settings, expected, good)
            await running.watch.check()
            assert running.runtime.server_change is None
            await until(lambda: len(env.answers(first.id)) == 1, "the first thread's answer")
            await until(lambda: len(env.answers(second.id)) == 1, "the DM's answer")
            turns = [
                r.record.kind
                for r in running.runtime.log.requests(session)
                if r.record.kind is RequestKind.TURN
            ]
            after = json.loads((settings.state_dir / STATUS_FILE).read_text())
    [line] = _changed_lines(env, first.id)
    assert "(chat template)" in line.message
    assert "`loopd selftest --record`" in line.message
    assert "\n" not in line.message, "one line"
    assert turns == [RequestKind.TURN], "one turn answered both messages"
    assert status["server"] == "changed"
    assert any(d.startswith("chat template: expected sha256 0000") for d in status["differs"])
    assert after["server"] == "ok"


async def test_a_server_that_changes_while_loopd_runs_is_found_by_the_next_check(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    async with recorded(tmp_path, sockets, llama) as (env, expected):
        settings = env.settings
        report = await run_selftest(settings, expected_dir=expected)
        assert report.ok
        async with checked_daemon(env, report, expected) as running:
            assert running.watch is not None
            sent = len(fake_llama.chat_records())
            await running.watch.check()  # the layout checks pass: nothing changes
            assert running.runtime.server_change is None
            assert len(fake_llama.chat_records()) == sent, "a matching server costs no request"
            _set_template_hash(settings, expected, "1" * 64)  # as an upgraded server's differs
            await running.watch.check()
            assert running.runtime.server_change is not None
            post = env.fake.post_as("alice", env.dm(), "hello there")
            await until(lambda: len(_changed_lines(env, post.id)) == 1, "the line")
            assert _turn_requests(fake_llama) == []


async def test_a_self_test_whose_requests_fail_on_the_way_is_no_verdict(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    """A server restarting its model answers the probes 500 (as a router does while its model
    child is reloaded): that says nothing about the server, so no thread hears it changed, the
    turn is answered, and the watch checks again soon rather than after the long interval."""
    async with recorded(tmp_path, sockets, llama) as (env, expected):
        settings = env.settings
        fake_llama.faults.set(http_500=Trigger(count=1))  # the first probe request
        report = await run_selftest(settings, expected_dir=expected)
        assert (report.ok, report.unreachable) == (False, False)
        assert report.interrupted is not None
        assert "500" in report.interrupted

        async with checked_daemon(env, report, expected) as running:
            assert running.runtime.server_change is None
            assert running.watch is not None
            assert running.watch.wait_s == RECHECK_FIRST_S  # soon, by the re-check rule
            post = env.fake.post_as("alice", env.dm(), "hello there")
            await until(lambda: len(env.answers(post.id)) == 1, "the answer")
            assert _changed_lines(env, post.id) == []
            await running.watch.check()  # the server answers again: the run completes
            assert running.watch.wait_s == 3600.0
            status = json.loads((settings.state_dir / STATUS_FILE).read_text())
    assert status["server"] == "ok"


async def test_a_self_test_that_finds_a_difference_is_a_verdict_even_when_a_probe_failed(
    tmp_path: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    """The layout differs (the template changed) and a probe failed on the way: the difference
    stands."""
    expected = tmp_path / "expected"
    settings = settings_for(tmp_path / "state", llama.base_url, FAKE_MODEL)
    recorded = await run_selftest(settings, record=True, expected_dir=expected)
    assert recorded.ok
    _set_template_hash(settings, expected, "0" * 64)
    fake_llama.faults.set(http_500=Trigger(count=1))
    report = await run_selftest(settings, expected_dir=expected)
    assert report.facts.interrupted is not None
    assert report.interrupted is None
