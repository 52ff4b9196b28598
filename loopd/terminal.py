"""``loopd chat``: a terminal thread on the same engine as the Mattermost threads.

One turn per input line. With a terminal on stdin it prompts and keeps going after a failed turn;
with piped input a failed turn ends the chat with exit status 2 (its message on stderr), so a
script can tell. Answers go to stdout, everything else to stderr.
"""

from __future__ import annotations

import sys
from typing import TextIO

import anyio

from loopd.chat.status import phase_words
from loopd.config import Settings
from loopd.engine.stream import Status
from loopd.engine.turn import TurnOutcome
from loopd.errors import LoopdError, ServerRejected
from loopd.sessionlog.records import Session, fresh_external_key
from loopd.sessions import Runtime


def run_chat(settings: Settings, session_name: str) -> int:
    return anyio.run(_chat, settings, session_name)


class StatusLine:
    """A one-line status on stderr while a turn works (only on a terminal)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.enabled = stream.isatty()
        self.shown = ""

    def __call__(self, status: Status) -> None:
        if not self.enabled:
            return
        text = phase_words(status)
        if text != self.shown:
            self.stream.write(f"\r\x1b[2K[{text}]")
            self.stream.flush()
            self.shown = text

    def clear(self) -> None:
        if self.enabled and self.shown:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            self.shown = ""


async def _chat(settings: Settings, session_name: str) -> int:
    runtime = Runtime.open(settings)
    try:
        if not await runtime.client.health():
            raise ServerRejected(settings.infer_url, 503, "/health is not ok")
        session = runtime.ensure_session(session_name)
        failure: LoopdError | None = None
        async with anyio.create_task_group() as tg:
            # While the user types, the session's prompt is read back into its slot after a
            # restart or a compaction (LOOPD_PREWARM); a turn cancels a prewarm at once.
            tg.start_soon(runtime.keep_warm, [session.name])
            try:
                status = await _converse(runtime, session)
            except LoopdError as exc:
                # Raised outside the task group, so the CLI sees the error itself (one line,
                # exit 2), not an exception group.
                failure = exc
            tg.cancel_scope.cancel()
        if failure is not None:
            raise failure
        return status
    finally:
        await runtime.aclose()


async def _converse(runtime: Runtime, session: Session) -> int:
    status = StatusLine(sys.stderr)
    interactive = sys.stdin.isatty()
    pending = await runtime.resume(session, status)
    if pending is not None and not _show(pending, status) and not interactive:
        return 2
    while (line := await _read_line(interactive)) is not None:
        text = line.strip()
        if not text:
            continue
        await runtime.append_user(session.name, text, external_key=fresh_external_key())
        outcome = await runtime.run_turn(session, status)
        if not _show(outcome, status) and not interactive:
            return 2
    return 0


def _show(outcome: TurnOutcome, status: StatusLine) -> bool:
    status.clear()
    for notice in outcome.notices:
        print(f"[loopd] {notice}", flush=True)
    if outcome.failure is not None:
        print(f"loopd: {outcome.failure}", file=sys.stderr)
        return False
    print(outcome.answer or "(no answer)", flush=True)
    return True


async def _read_line(interactive: bool) -> str | None:
    def read() -> str | None:
        try:
            return input("you> ") if interactive else (sys.stdin.readline() or None)
        except EOFError:
            return None

    return await anyio.to_thread.run_sync(read, abandon_on_cancel=True)
