"""Defects the soak found in loopd, each reproduced on its own, small and fast.

A full disk while a message was taken in (``SQLITE_FULL`` when the session log stored it) ended
``loopd serve`` with a traceback: the error left the adapter's connection loop, which handled
only socket and Mattermost errors. The supervisor restarted it, and the catch-up found the
message again, but a disk that stays full would have made that a crash loop. The message must
wait for room instead: not taken in, so its channel's cursor stays before it, and the next
catch-up takes it in.

A full disk under a turn (the chat state or the session log refusing a write while the turn
posted or stored its answer) ended that thread's work for good: the failure was logged, and the
thread's waiting messages waited for ever. The thread's work is now tried again after a pause
while it fails for a reason that passes, and the writes that make a draft post the answer stand
or fall together (recorded as the answer but not closed as a draft, the tidy-up deleted the
answer).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from loopd.chat import threads
from loopd.chat.cursor import ChatState, ChatStateError
from loopd.chat.rest import MattermostError
from loopd.contextwindow.compaction import INSTRUCTION, instruction_key
from loopd.serve import Daemon
from loopd.sessionlog.errors import CorruptLogError, DiskFullError
from loopd.sessionlog.records import RequestKind
from loopd_dev.fakes.llama import FakeLlama, ModelSpec, ScriptedReply, serve_fake_llama
from tests.chat.chat_support import (
    Env,
    chat_settings_for,
    daemon,
    fake_mattermost,
    settings_for,
    until,
)
from tests.engine.engine_support import SESSION, open_log, say
from tests.sessionlog.sessionlog_support import assistant_text, request_for

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

MODEL = "fake-model"


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "STEP_RETRY", threads.STEP_RETRY.capped_at(0.05))


@pytest.fixture
def sockets() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="lk") as tmp:
        yield Path(tmp)


async def test_a_full_disk_while_a_message_is_taken_in_does_not_end_the_daemon(
    tmp_path: Path, sockets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeLlama([ModelSpec(MODEL, n_slots=2, n_ctx=8192)])
    fake.push(ScriptedReply(content="Answered once there was room."), model=MODEL)
    async with serve_fake_llama(fake) as llama, fake_mattermost(sockets) as mm:
        env = Env(
            mm,
            settings_for(tmp_path / "state", llama.base_url, MODEL),
            chat_settings_for(mm, tmp_path),
        )
        async with daemon(env) as running:
            log = running.runtime.log
            store = log.append_user
            refused: list[str] = []

            def full_once(session: str, text: str, *, external_key: str) -> Any:
                if not refused:
                    refused.append(external_key)
                    raise DiskFullError(env.settings.db_path, "disk full (SQLITE_FULL)")
                return store(session, text, external_key=external_key)

            monkeypatch.setattr(log, "append_user", full_once)
            post = env.fake.post_as("alice", env.dm(), "Are you there?")
            await until(lambda: len(env.answers(post.id)) == 1, "the answer, once there was room")
            assert refused == [post.id]
        [answer] = env.answers(post.id)
        assert answer.message == "Answered once there was room."


def _env(tmp_path: Path, mm: Any, llama: Any) -> Env:
    return Env(
        mm,
        settings_for(tmp_path / "state", llama.base_url, MODEL),
        chat_settings_for(mm, tmp_path),
    )


def _full(path: Path) -> ChatStateError:
    return ChatStateError(f"chat state {path}: database or disk is full", passing=True)


Inject = Callable[[Daemon, Env], list[str]]


def fail_once(
    monkeypatch: pytest.MonkeyPatch,
    target: object,
    method: str,
    when: Callable[..., bool],
    error: Callable[[], Exception],
    times: int = 1,
) -> list[str]:
    """``target.method`` raises ``error()`` the first ``times`` times ``when`` holds for its
    arguments; the list it returns records those calls."""
    original = getattr(target, method)
    refused: list[str] = []

    def failing(*args: Any, **kwargs: Any) -> Any:
        if len(refused) < times and when(*args, **kwargs):
            refused.append(repr(args))
            raise error()
        return original(*args, **kwargs)

    monkeypatch.setattr(target, method, failing)
    return refused


async def one_answer(tmp_path: Path, sockets: Path, replies: list[str], inject: Inject) -> Any:
    """Run one message through the daemon with ``inject``'s fault: the one answer post left
    in the thread once the turn is over (its status post taken away)."""
    fake = FakeLlama([ModelSpec(MODEL, n_slots=2, n_ctx=8192)])
    for reply in replies:
        fake.push(ScriptedReply(content=reply), model=MODEL)
    async with serve_fake_llama(fake) as llama, fake_mattermost(sockets) as mm:
        env = _env(tmp_path, mm, llama)
        async with daemon(env) as running:
            refused = inject(running, env)
            post = env.fake.post_as("alice", env.dm(), "Are you there?")
            await until(lambda: len(env.answers(post.id)) == 1, "the answer")
            await until(lambda: not env.status_posts_left(post.id), "the status post taken away")
            assert refused, "the fault never fired"
        [answer] = env.answers(post.id)
        assert not env.fake.world.posts[answer.post_id].delete_at
        return answer


async def test_a_full_chat_state_when_the_answer_is_posted_delays_it_and_posts_it_once(
    tmp_path: Path,
    sockets: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def inject(running: Daemon, env: Env) -> list[str]:
        def the_answer(key: str, parts: int) -> bool:
            return ":" not in key.split("#")[-1]  # not a draft, not a status post

        full = partial(_full, running.state.path)
        return fail_once(monkeypatch, running.state, "record_intent", the_answer, full)

    answer = await one_answer(tmp_path, sockets, ["Posted once there was room."], inject)
    assert answer.message == "Posted once there was room."
    [waited] = [r.getMessage() for r in caplog.records if " waits (" in r.getMessage()]
    assert waited.endswith("database or disk is full); trying again in 0 s"), waited


async def test_a_full_session_log_when_the_answer_is_stored_runs_the_turn_again(
    tmp_path: Path, sockets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def inject(running: Daemon, env: Env) -> list[str]:
        full = partial(DiskFullError, env.settings.db_path, "disk full (SQLITE_FULL)")
        log = running.runtime.log
        return fail_once(monkeypatch, log, "append_assistant", lambda *a, **k: True, full)

    replies = ["Lost to the full disk.", "Stored once there was room."]
    answer = await one_answer(tmp_path, sockets, replies, inject)
    assert answer.message == "Stored once there was room."


async def test_an_answer_post_recorded_but_not_closed_is_never_deleted(
    tmp_path: Path, sockets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The draft became the answer: recording it as the answer and closing it as a draft is one
    write, so a full disk between the two cannot leave the answer looking like a draft (which
    the tidy-up deletes)."""

    def inject(running: Daemon, env: Env) -> list[str]:
        def closing_the_answer(post_id: str, decision: str) -> bool:
            return post_id.startswith("closed:") and decision == "answer"

        full = partial(_full, running.state.path)
        return fail_once(monkeypatch, running.state, "mark_seen", closing_the_answer, full)

    answer = await one_answer(tmp_path, sockets, ["Still here after the tidy-up."], inject)
    assert answer.message == "Still here after the tidy-up."


def test_what_passes_and_what_does_not(tmp_path: Path) -> None:
    passing = [
        DiskFullError(tmp_path, "full"),
        _full(tmp_path),
        MattermostError("POST /posts", None, "still failing after retries"),
        MattermostError("POST /posts", 503, "unavailable"),
        ExceptionGroup("turn", [DiskFullError(tmp_path, "full")]),
    ]
    lasting = [
        CorruptLogError(tmp_path, "damaged"),
        ChatStateError("chat state: file is not a database"),
        MattermostError("POST /posts", 403, "no permission"),
        ExceptionGroup("turn", [DiskFullError(tmp_path, "full"), ValueError("bug")]),
    ]
    assert [threads.passes_on_its_own(e) for e in passing] == [True] * len(passing)
    assert [threads.passes_on_its_own(e) for e in lasting] == [False] * len(lasting)
    inner, outer = ValueError("inner"), KeyError("outer")
    group = ExceptionGroup("turn", [ExceptionGroup("posts", [inner]), outer])
    assert threads.leaves(group) == [inner, outer]


def fill(state: ChatState) -> None:
    for n in range(10_000):
        state.mark_seen(f"post-{n:05d}-" + "x" * 200, "stored")


def test_a_full_file_makes_a_passing_chat_state_error(tmp_path: Path) -> None:
    state = ChatState.open(tmp_path / "chat.db")
    try:
        pages = state._conn.execute("PRAGMA page_count").fetchone()[0]
        state._conn.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(ChatStateError) as caught:
            fill(state)
        assert caught.value.passing
        assert "full" in str(caught.value)
    finally:
        state.close()


def test_a_compactions_summary_is_never_the_threads_answer(tmp_path: Path) -> None:
    """Killed after the model wrote an epoch's summary and before the new epoch began, the
    daemon's restart delivered the latest answer in the log: the summary, posted to the thread.
    The answer is the one before it."""
    log = open_log(tmp_path)
    say(log, "hello")
    log.append_assistant(SESSION, assistant_text("Hello there."), request=request_for(log, SESSION))
    say(log, "and now?")
    log.append_user(SESSION, INSTRUCTION, external_key=instruction_key(SESSION, 1))
    summary = assistant_text("The user said hello.")
    asked = request_for(log, SESSION, RequestKind.COMPACTION)
    log.append_assistant(SESSION, summary, request=asked)
    answer = threads.latest_answer(log.entries(SESSION))
    assert answer is not None
    assert json.loads(answer.message or "")["content"] == "Hello there."


def test_a_summary_finished_after_messages_came_is_never_the_threads_answer(
    tmp_path: Path,
) -> None:
    """The compaction was cut short after its instruction; messages stored meanwhile sit
    between the instruction and the summary that finishes it."""
    log = open_log(tmp_path)
    say(log, "hello")
    log.append_assistant(SESSION, assistant_text("Hello there."), request=request_for(log, SESSION))
    log.append_user(SESSION, INSTRUCTION, external_key=instruction_key(SESSION, 1))
    say(log, "are you there?")
    summary = assistant_text("The user said hello, then asked again.")
    asked = request_for(log, SESSION, RequestKind.COMPACTION)
    log.append_assistant(SESSION, summary, request=asked)
    answer = threads.latest_answer(log.entries(SESSION))
    assert answer is not None
    assert json.loads(answer.message or "")["content"] == "Hello there."


def test_the_answer_after_a_compaction_whose_summary_broke_is_the_threads_answer(
    tmp_path: Path,
) -> None:
    """The server died under the compaction's summary request: the compaction went on with an
    excerpt and a new epoch, and the model's next answer was taken for the summary still awaited,
    so the thread never got it (its answer post was tidied away as a failed turn's)."""
    log = open_log(tmp_path)
    say(log, "hello")
    log.append_assistant(SESSION, assistant_text("Hello there."), request=request_for(log, SESSION))
    say(log, "and now?")
    log.append_user(SESSION, INSTRUCTION, external_key=instruction_key(SESSION, 1))
    asked = request_for(log, SESSION, RequestKind.COMPACTION)
    log.append_broken(SESSION, partial_text="The user", reason="the server died", request=asked)
    epoch = log.current_epoch(SESSION)
    log.start_epoch(
        SESSION, reason="compaction", tools_text=epoch.tools_text, system_text=epoch.system_text
    )
    log.append_user(SESSION, "(an excerpt of epoch 1)", external_key="summary-2")
    log.append_user(SESSION, "and now?", external_key="carry-2-0")
    log.append_assistant(SESSION, assistant_text("Now this."), request=request_for(log, SESSION))
    answer = threads.latest_answer(log.entries(SESSION))
    assert answer is not None
    assert json.loads(answer.message or "")["content"] == "Now this."


async def test_a_status_post_mattermost_would_not_delete_is_taken_away_later(
    tmp_path: Path, sockets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mattermost away when the turn ended: its status post stayed up for good (only the last
    two turns were ever tidied, and nothing tried again). Now the thread's work tries again
    after a pause until every post of its earlier turns is gone."""

    def inject(running: Daemon, env: Env) -> list[str]:
        away = partial(MattermostError, "DELETE /posts/{id}", None, "connection refused")
        client = running.client
        # Twice: when the turn takes its status post away, and at the tidy-up after it.
        always = lambda *a, **k: True  # noqa: E731
        return fail_once(monkeypatch, client, "delete_post", always, away, times=2)

    answer = await one_answer(tmp_path, sockets, ["Answered; the status post goes later."], inject)
    assert answer.message == "Answered; the status post goes later."
