"""The turns of the Mattermost threads: one worker per session, status post, stop, delivery.

A session is ``mm:<root post id>``. What to do is always derived from the session log: a worker
runs a turn while the session has one pending; an answer is the latest assistant entry without
tool calls, delivered under the key ``<session>#<its seq>`` (so a restart that finds it already
delivered, or half delivered, does not post it again).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup

from loopd.chat.config import ChatSettings
from loopd.chat.cursor import ChatState
from loopd.chat.outbox import Outbox, StatusPost
from loopd.chat.status import Finished, InLine
from loopd.engine.turn import TurnOutcome
from loopd.errors import LoopdError
from loopd.sessionlog.records import REPLAYED_KINDS, EntryKind, SessionState
from loopd.sessions import Runtime

log = logging.getLogger("loopd.chat.threads")

PREFIX = "mm:"
STOPPED = "stopped by "


def session_name(root_id: str) -> str:
    return f"{PREFIX}{root_id}"


def root_of(session: str) -> str:
    return session[len(PREFIX) :]


def was_stopped(state: SessionState) -> bool:
    """The pending turn was stopped by a user (so a restart must not run it again)."""
    return any((entry.fields.reason or "").startswith(STOPPED) for entry in state.broken_since)


@dataclass
class _Running:
    status: StatusPost
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    stopped_by: str | None = None


class Threads:
    def __init__(
        self,
        runtime: Runtime,
        outbox: Outbox,
        state: ChatState,
        settings: ChatSettings,
        task_group: TaskGroup,
    ) -> None:
        self.runtime = runtime
        self.outbox = outbox
        self.state = state
        self.settings = settings
        self.task_group = task_group
        self._dirty: set[str] = set()
        self._workers: set[str] = set()
        self._running: dict[str, _Running] = {}

    def known(self, root_id: str) -> bool:
        """loopd is in this thread (it has a session for it)."""
        return self.state.thread_channel(root_id) is not None

    def running(self, session: str) -> bool:
        return session in self._running

    def session_names(self) -> list[str]:
        """The sessions of Mattermost threads in the log."""
        return [s.name for s in self.runtime.log.sessions() if s.name.startswith(PREFIX)]

    # -- startup ---------------------------------------------------------------------------------

    async def resume_all(self) -> None:
        """After a start: deliver answers a crash left unposted, and run pending turns (not
        those a user stopped)."""
        for name in self.session_names():
            await self.deliver(name)
            state = self.runtime.log.state(name)
            if (state.pending_turn or state.interrupted_calls) and not was_stopped(state):
                log.info("resuming the pending turn of %s", name)
                self.wake(name)

    # -- turns -----------------------------------------------------------------------------------

    def wake(self, session: str) -> None:
        """A new message was stored for ``session``: run a turn unless one is under way (that
        worker then runs another for what arrived meanwhile)."""
        self._dirty.add(session)
        if session not in self._workers:
            self._workers.add(session)
            self.task_group.start_soon(self._work, session)

    async def _work(self, session: str) -> None:
        try:
            while session in self._dirty:
                self._dirty.discard(session)
                state = self.runtime.log.state(session)
                if state.pending_turn or state.interrupted_calls:
                    try:
                        await self._turn(session)
                    except* LoopdError:
                        # One thread's failure (Mattermost down past the retries, a log error)
                        # must not end the daemon; the next message wakes the session again.
                        # except*: the turn runs in a task group, which wraps what it raises.
                        log.exception("the turn of %s failed", session)
        finally:
            self._workers.discard(session)

    async def _turn(self, name: str) -> None:
        channel = self.state.thread_channel(root_of(name))
        if channel is None:
            log.error("no channel recorded for %s; its turn cannot be answered", name)
            return
        # Keyed by the last replayed entry, so the same pending turn after a restart finds its
        # status post again instead of opening a second one.
        replayed = [e for e in self.runtime.log.entries(name) if e.kind in REPLAYED_KINDS]
        status = StatusPost(
            self.outbox,
            f"{name}#{replayed[-1].seq}:status",
            channel,
            root_of(name),
            interval_s=self.settings.status_interval_s,
            stop_hint=self._stop_hint(),
        )
        await status.open()
        running = _Running(status)
        self._running[name] = running
        outcome: TurnOutcome | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(status.follow)
                with running.scope:
                    outcome = await self._run(name, status)
                tg.cancel_scope.cancel()
        except anyio.get_cancelled_exc_class():
            with anyio.move_on_after(2.0, shield=True):
                await status.finish(
                    Finished("interrupted", "(loopd stopped; it resumes on restart)")
                )
            raise
        finally:
            del self._running[name]
        await self._conclude(name, channel, running, outcome)

    async def _run(self, name: str, status: StatusPost) -> TurnOutcome | None:
        session = self.runtime.log.get_session(name)

        def on_position(ahead: int) -> None:
            if ahead:
                status.show(InLine(session.slot, ahead))

        if self.runtime.log.state(name).interrupted_calls:
            return await self.runtime.resume(session, status.show)
        return await self.runtime.run_turn(session, status.show, on_position)

    async def _conclude(
        self, name: str, channel: str, running: _Running, outcome: TurnOutcome | None
    ) -> None:
        if outcome is None or running.stopped_by is not None:
            who = running.stopped_by or "someone"
            self._record_stop(name, who)
            await running.status.finish(Finished("stopped", f"by @{who}"))
        elif outcome.failure is not None:
            await running.status.finish(Finished("failed"))
            broken = self.runtime.log.entries(name)[-1].seq
            await self.outbox.post_once(
                f"{name}#{broken}",
                channel,
                root_of(name),
                f"⚠️ I could not answer: {outcome.failure}\nReply to try again.",
            )
        else:
            # A compaction's one-line notice ("the conversation was compacted") ends the status.
            await running.status.finish(Finished("done", " ".join(outcome.notices)))
            await self.deliver(name)

    def _record_stop(self, name: str, who: str) -> None:
        """A stopped turn, in the log: results for tool calls it cut short, then the stop."""
        session_log = self.runtime.log
        for call in session_log.state(name).interrupted_calls:
            session_log.append_tool_result(
                name,
                tool_call_id=call.call_id,
                content=f"error: stopped by @{who} while this tool call ran; it may or may not "
                "have taken effect",
            )
        session_log.append_broken(name, partial_text="", reason=f"{STOPPED}@{who}")
        log.info("turn of %s stopped by @%s", name, who)

    def _stop_hint(self) -> str:
        return (
            f"\n(reply `{self.settings.stop_word}` or react :{self.settings.stop_reaction}: "
            "to stop)"
        )

    # -- stop ------------------------------------------------------------------------------------

    def stop(self, session: str, who: str) -> bool:
        """Cancel the running turn of ``session``: its stream closes, which frees the slot on
        the server. False when nothing runs."""
        running = self._running.get(session)
        if running is None:
            return False
        running.stopped_by = who
        running.scope.cancel()
        return True

    def stop_by_status_post(self, post_id: str, who: str) -> bool:
        for session, running in self._running.items():
            if running.status.post_id == post_id:
                return self.stop(session, who)
        return False

    # -- delivery --------------------------------------------------------------------------------

    async def deliver(self, name: str) -> None:
        """Post the session's latest answer unless it is already in the thread."""
        entries = self.runtime.log.entries(name)
        replayed = [e for e in entries if e.kind in REPLAYED_KINDS]
        last = replayed[-1] if replayed else None
        if last is None or last.kind is not EntryKind.ASSISTANT or last.message is None:
            return
        message = json.loads(last.message)
        if message.get("tool_calls"):
            return
        key = f"{name}#{last.seq}"
        channel = self.state.thread_channel(root_of(name))
        if channel is None or self.outbox.delivered(key):
            return
        answer = message.get("content") or "(the model gave an empty answer)"
        await self.outbox.post_once(key, channel, root_of(name), answer)
