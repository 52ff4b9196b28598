"""The turns of the Mattermost threads: one worker per session, its posts, stop, delivery.

A session is ``mm:<root post id>``. What to do is always derived from the session log: a worker
runs a turn while the session has one pending; an answer is the latest assistant entry without
tool calls, delivered under the key ``<session>#<its seq>`` (so a restart that finds it already
delivered, or half delivered, does not post it again).

A turn is keyed ``<session>#<seq of the last replayed entry when it began>``: its status post
(``:status``) and its answer post (``:draft``, written as the answer streams) carry that key, so
the same pending turn after a restart finds them again. When the turn ends the draft becomes the
answer's first part and the status post is taken away, so nothing but the answer (or one closing
line) stays in the thread.

A message that comes while its thread's turn runs is held (``ChatState.hold``) and goes into the
log when the turn is over: appended mid-turn it would sit before an answer that never saw it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from enum import StrEnum

import anyio
from anyio.abc import TaskGroup
from tenacity import RetryCallState, retry_if_exception

from loopcommon.backoff import Backoff
from loopcommon.errors import DaemonError
from loopcommon.retry import retrying
from loopcommon.sanitize import visible
from loopd.approvals.call import Asker
from loopd.approvals.deciders import Deciders, may_decide
from loopd.chat.approvals import Questions
from loopd.chat.cursor import ChatState, ChatStateError
from loopd.chat.labels import AUTHOR
from loopd.chat.mentions import named
from loopd.chat.outbox import PART_PROP, TURN_PROP, Outbox
from loopd.chat.rest import MattermostError
from loopd.chat.status import DRAFT_MARK, Finished, InLine
from loopd.chat.turnposts import DRAFT, STATUS, TurnPosts, close, draft_post
from loopd.chatsettings import ChatSettings
from loopd.contextwindow.compaction import is_compaction_instruction
from loopd.engine.notes import cut_note
from loopd.engine.outcome import TurnOutcome
from loopd.sessionlog.errors import DiskFullError, LockedError, UnknownSessionError
from loopd.sessionlog.records import REPLAYED_KINDS, Entry, EntryKind
from loopd.sessionlog.state import ends_turn, is_stop, is_take_back, taken_back
from loopd.sessionlog.store import SessionLog
from loopd.sessions import Runtime
from loopd.turnstop import NothingToRetry, record_stop, retry_target, take_back, was_stopped

log = logging.getLogger("loopd.chat.threads")

PREFIX = "mm:"
CONTEXT_KEY = "ctx:"  # external key prefix of a thread's earlier posts, stored as context
# A thread's work that failed for a passing reason is tried again after 1, 2, 4 ... s, at most
# a minute apart: soon enough once the disk has room, rare enough not to flood the log.
STEP_RETRY = Backoff(first_s=1.0, cap_s=60.0)


def session_name(root_id: str) -> str:
    return f"{PREFIX}{root_id}"


def root_of(session: str) -> str:
    return session[len(PREFIX) :]


def is_answer(entry: Entry) -> bool:
    """An assistant entry that answers (no tool calls)."""
    if entry.kind is not EntryKind.ASSISTANT or entry.message is None:
        return False
    return not json.loads(entry.message).get("tool_calls")


def latest_answer(entries: list[Entry]) -> Entry | None:
    """The latest answer to the thread, even when a message came after it (it waits for the
    next turn); never a copy a compaction carried into a new epoch (that one was delivered
    before), nor the summary a compaction asked for (it answers loopd's instruction), nor an
    answer taken back to be generated again (a regenerate)."""
    latest: Entry | None = None
    summary_asked = False  # the next assistant entry is the summary (messages may come between)
    taken = taken_back(entries)
    for entry in entries:
        if is_compaction_instruction(entry):
            summary_asked = True
        elif entry.kind is EntryKind.EPOCH:
            # The compaction is over, its summary written or not (its request may have broken
            # and an excerpt stand in): what the new epoch's model writes answers the thread.
            summary_asked = False
        elif entry.kind is EntryKind.ASSISTANT:
            kept = entry.fields.refers_to is None and entry.seq not in taken
            if is_answer(entry) and kept and not summary_asked:
                latest = entry
            summary_asked = False
    return latest


def ends_a_turn(entry: Entry, taken: frozenset[int] = frozenset()) -> bool:
    """An answer, a stop or a turn's end without an answer, unless it was taken back since
    (``taken``: ``loopd.sessionlog.state.taken_back`` of the entries read)."""
    return entry.seq not in taken and (is_answer(entry) or ends_turn(entry))


def since_last_turn(entries: list[Entry], before_seq: int | None = None) -> list[Entry]:
    """The entries after the last ended turn (an answer or a stop), up to ``before_seq``."""
    upto = [e for e in entries if before_seq is None or e.seq < before_seq]
    taken = taken_back(entries)
    start = max((i + 1 for i, e in enumerate(upto) if ends_a_turn(e, taken)), default=0)
    return upto[start:]


def recent_turns(entries: list[Entry]) -> list[Entry]:
    """The entries of the last ended turn and of any turn after it."""
    taken = taken_back(entries)
    ends = [i for i, e in enumerate(entries) if ends_a_turn(e, taken)]
    start = ends[-2] + 1 if len(ends) >= 2 else 0
    return entries[start:]


RECENT_ENTRIES = 16  # the first read of ``thread_entries``: a turn with a tool round or two


def thread_entries(log: SessionLog, name: str) -> list[Entry]:
    """The session's recent entries, as many as the derivations above need: from just after an
    assistant entry (where no summary is asked for) to the end, holding the latest answer and
    the turn that ended before it. Read by index from the end, twice as many each time, so a
    turn costs what the thread's last turns hold, not everything it ever logged."""
    count = RECENT_ENTRIES
    while True:
        entries = log.latest_entries(name, count)
        if len(entries) < count:
            return entries  # the whole session
        first = next((i for i, e in enumerate(entries) if e.kind is EntryKind.ASSISTANT), None)
        if first is not None:
            tail = entries[first + 1 :]
            answer = latest_answer(tail)
            taken = taken_back(tail)
            if answer is not None and any(
                ends_a_turn(e, taken) for e in tail if e.seq < answer.seq
            ):
                return tail
        count *= 2


def passes_on_its_own(exc: BaseException) -> bool:
    """A failure the same work survives when tried again later: the session log or the chat
    state full or locked, Mattermost unreachable or overloaded past its own retries. Anything
    else (a damaged file, a post Mattermost refuses) would fail the same way again."""
    if isinstance(exc, BaseExceptionGroup):
        return all(passes_on_its_own(leaf) for leaf in leaves(exc))
    if isinstance(exc, DiskFullError | LockedError):
        return True
    if isinstance(exc, ChatStateError):
        return exc.passing
    if isinstance(exc, MattermostError):
        return exc.status is None or exc.status == 429 or exc.status >= 500
    return False


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside a group (a task group's), or the one exception."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def requesters(entries: list[Entry]) -> frozenset[str]:
    """The people whose messages the pending turn answers (not the thread's earlier posts, read
    as context): they may stop it."""
    names = set()
    for entry in since_last_turn(entries):
        key = entry.fields.external_key or ""
        if entry.kind is not EntryKind.USER or entry.message is None or key.startswith(CONTEXT_KEY):
            continue
        content = json.loads(entry.message).get("content")
        match = AUTHOR.match(content) if isinstance(content, str) else None
        if match:
            names.add(match.group(1))
    return frozenset(names)


def thread_people(entries: list[Entry]) -> frozenset[str]:
    """Whom the thread's posts may mention: the people who wrote in it, and the names they
    mentioned themselves (lower case; ``loopd.chat.mentions``)."""
    names: set[str] = set()
    for entry in entries:
        if entry.kind is not EntryKind.USER or entry.message is None:
            continue
        content = json.loads(entry.message).get("content")
        match = AUTHOR.match(content) if isinstance(content, str) else None
        if match:
            names.add(match.group(1).lower())
            names |= named(content[match.end() :])
    return frozenset(names)


class StopResult(StrEnum):
    STOPPED = "stopped"
    NOTHING_RUNNING = "nothing running"
    NOT_ALLOWED = "not allowed"


class RetryResult(StrEnum):
    """What a retry reaction did; each but ``RUNS`` and ``NOT_AN_ANSWER`` is said in the
    thread (``RETRY_WORDS``)."""

    RUNS = "runs again"
    NOT_AN_ANSWER = "not one of loopd's answers"
    NOT_LATEST = "not the latest answer"
    BUSY = "a turn is under way"
    NOT_ALLOWED = "not allowed"


RETRY_WORDS = {
    RetryResult.NOT_LATEST: "🔁 Only a thread's latest answer can be generated again.",
    RetryResult.BUSY: "🔁 A turn is under way in this thread; react again once it has ended.",
    RetryResult.NOT_ALLOWED: "🔁 Only the people whose messages it answered (or an admin) can "
    "have this answer generated again.",
}


def _keyed(key: str) -> tuple[str, int | None]:
    """(the session, the seq) of an outbox key ``<session>#<seq>[:<what>]``."""
    name, _, rest = key.partition("#")
    seq = rest.split(":", 1)[0]
    return name, int(seq) if seq.isdigit() else None


def turn_anchor(entries: list[Entry]) -> int:
    """The seq a turn's posts are keyed by: its last replayed entry, or the take-back after it
    that runs the turn again (a new key: the posts of the turn it runs again stay as they are)."""
    last = max(e.seq for e in entries if e.kind in REPLAYED_KINDS)
    again = [e.seq for e in entries if e.seq > last and is_take_back(e)]
    return again[-1] if again else last


def answering_seq(entries: list[Entry]) -> int:
    """The seq of the newest user message: the one a pending turn answers (tool rounds after it
    belong to the same turn; a message that comes during the turn is held, not logged)."""
    return max((e.seq for e in entries if e.kind is EntryKind.USER), default=0)


@dataclass
class _Running:
    posts: TurnPosts
    deciders: Deciders  # who may stop it and decide on its calls
    answering_seq: int
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    stopped_by: str | None = None
    ended: bool = False  # the model's part is over; only posting remains


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
        self.questions = Questions(settings)  # tools' approval questions (loopd.chat.approvals)
        self._dirty: set[str] = set()
        self._workers: set[str] = set()
        self._running: dict[str, _Running] = {}
        # Who waits in which thread: authors of messages held, or stored for a turn that has
        # not got its slot yet (kept in memory: after a restart the caps start afresh).
        self._waiting: dict[str, set[str]] = {}

    def known(self, root_id: str) -> bool:
        """loopd is in this thread (it has a session for it)."""
        return self.state.thread_channel(root_id) is not None

    def running(self, session: str) -> bool:
        return session in self._running

    def holds(self, session: str) -> bool:
        """A new message for ``session`` waits (``ChatState.hold``) instead of going into the
        log: its turn runs, or its log ends in tool calls without their results."""
        if self.running(session):
            return True
        try:
            return bool(self.runtime.log.state(session).interrupted_calls)
        except UnknownSessionError:  # its first message: nothing to hold it for
            return False

    def session_names(self) -> list[str]:
        """The sessions of Mattermost threads in the log."""
        return [s.name for s in self.runtime.log.sessions() if s.name.startswith(PREFIX)]

    # -- admission -------------------------------------------------------------------------------

    def admission(self, session: str, username: str) -> str | None:
        """Why a new message by ``username`` for ``session`` is not taken, or None."""
        limit = self.settings.max_waiting_per_thread
        if self.holds(session) and len(self.state.held(session)) >= limit:
            return (
                f"⏳ {limit} messages are already waiting in this thread, so I did not take "
                "this one. Post it again once I have answered."
            )
        if username in self._waiting.get(session, set()):
            return None  # no new turn: it joins one this person already waits for
        waiting_in = sum(username in people for people in self._waiting.values())
        if waiting_in >= self.settings.max_waiting_per_user:
            return (
                f"⏳ You already have {waiting_in} threads waiting for an answer, so I did not "
                "take this one. Post it again once one is answered."
            )
        return None

    def waiting(self, session: str, username: str) -> None:
        """``username``'s message for ``session`` was stored or held."""
        self._waiting.setdefault(session, set()).add(username)

    # -- startup ---------------------------------------------------------------------------------

    async def resume_all(self) -> None:
        """After a start: deliver answers a crash left unposted, take in held messages, and run
        pending turns (not those a user stopped)."""
        for name in self.session_names():
            await self.deliver(name)
            state = self.runtime.log.state(name)
            if not state.idle and not was_stopped(state) and await self._stopped_before(name):
                state = self.runtime.log.state(name)
            held = bool(self.state.held(name))
            if held or (not state.idle and not was_stopped(state)):
                log.info("resuming the pending turn of %s", name)
                self.wake(name)  # its posts are found again, and tidied when it ends
            else:
                await self.tidy(name)

    # -- turns -----------------------------------------------------------------------------------

    def wake(self, session: str) -> None:
        """A new message was stored (or held) for ``session``: run a turn unless one is under
        way (that worker then runs another for what arrived meanwhile)."""
        self._dirty.add(session)
        if session not in self._workers:
            self._workers.add(session)
            self.task_group.start_soon(self._work, session)

    async def _work(self, session: str) -> None:
        try:
            while session in self._dirty:
                self._dirty.discard(session)
                try:
                    await self._step_until_done(session)
                except* DaemonError as failed:
                    # One thread's failure (a damaged log, a post Mattermost refuses, a thread
                    # Mattermost no longer has) must not end the daemon; the next message wakes
                    # the session again. loopd's errors say what failed in one line each.
                    # except*: the turn runs in a task group, which wraps what it raises.
                    said = "; ".join(dict.fromkeys(str(leaf) for leaf in leaves(failed)))
                    log.error("the turn of %s failed: %s", session, said)  # noqa: TRY400
        finally:
            self._workers.discard(session)
            self._waiting.pop(session, None)  # nothing of this thread waits any more

    async def _step_until_done(self, session: str) -> None:
        """``_step``, again after a pause while it fails for a reason that passes (the disk
        full, the log locked, Mattermost away): the thread's messages wait, never dropped."""

        def tell(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            wait_s = state.next_action.sleep if state.next_action else 0.0
            log.warning("the turn of %s waits (%s); trying again in %.0f s", session, exc, wait_s)

        async for attempt in retrying(
            STEP_RETRY, retry_if_exception(passes_on_its_own), before_sleep=tell
        ):
            with attempt:
                await self._step(session)

    async def _step(self, session: str) -> None:
        """What the session needs now: its held messages into the log, then its pending turn,
        or (nothing pending) the delivery and tidy-up an earlier try did not finish. A turn cut
        between a tool call and its result (a restart) is finished first, its messages still
        held: released now, they would stand between the call and its result, and their
        authors would count among the turn's people."""
        if not self.holds(session):
            await self._release_held(session)
        state = self.runtime.log.state(session)
        if state.pending_turn or state.interrupted_calls:
            if (change := self.runtime.server_change) is not None:
                # The turn waits for the server to pass the self-test (loopd.serve); the
                # thread hears so once per change.
                await self._tell(session, change.key, change.thread_line)
            else:
                await self._turn(session)
        else:
            await self.deliver(session)
        if left := await self.tidy(session):
            # Mattermost away: tried again after a pause (``_step_until_done``).
            what = "DELETE /posts/{id}"
            raise MattermostError(what, None, f"{left} post(s) of earlier turns still up")
        if self.state.held(session):
            self._dirty.add(session)  # what came meanwhile gets its own turn

    async def _tell(self, name: str, key: str, line: str) -> None:
        channel = self.state.thread_channel(root_of(name))
        if channel is not None:
            key = f"{name}#server-changed:{key}"
            await self.outbox.post_once(key, channel, root_of(name), line)

    async def _release_held(self, session: str) -> None:
        """Held messages into the log, in arrival order (no turn runs now)."""
        for key, text in self.state.held(session):
            taken = await self.runtime.append_user(session, text, external_key=key)
            channel = self.state.thread_channel(root_of(session))
            if taken.notice is not None and channel is not None:  # too long: said in the thread
                line = f"✂️ {taken.notice}"
                await self.outbox.post_once(f"long:{key}", channel, root_of(session), line)
            self.state.release(key)

    async def _turn(self, name: str) -> None:
        channel = self.state.thread_channel(root_of(name))
        if channel is None:
            log.error("no channel recorded for %s; its turn cannot be answered", name)
            return
        entries = thread_entries(self.runtime.log, name)
        self.outbox.client.mentionable[root_of(name)] = thread_people(entries)
        posts = TurnPosts(
            self.outbox,
            f"{name}#{turn_anchor(entries)}",
            channel,
            root_of(name),
            interval_s=self.settings.status_interval_s,
            typing_interval_s=self.settings.typing_interval_s,
            stop_hint=self._stop_hint(),
        )
        await posts.open()
        deciders = Deciders.of(requesters(entries), self.settings.admins)
        running = _Running(posts, deciders, answering_seq(entries))
        self._running[name] = running
        # A call that waits for a person's approval asks in this thread (loopd.approvals).
        asker = self.questions.asker(
            self.outbox, name, channel, root_of(name), deciders, posts.show
        )
        outcome: TurnOutcome | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(posts.follow)
                with running.scope:
                    outcome = await self._run(name, posts, asker)
                running.ended = True
                tg.cancel_scope.cancel()
            # Still "running" while it concludes: a message now is held until the answer is out.
            await self._conclude(name, channel, running, outcome)
        except anyio.get_cancelled_exc_class():
            with anyio.move_on_after(2.0, shield=True):
                await posts.status.finish(
                    Finished("interrupted", "(loopd stopped; it resumes on restart)")
                )
            raise
        finally:
            del self._running[name]

    async def _run(self, name: str, posts: TurnPosts, asker: Asker) -> TurnOutcome | None:
        session = self.runtime.log.get_session(name)

        def on_position(ahead: int) -> None:
            if ahead:
                posts.show(InLine(session.slot, ahead))
            else:  # the slot is ours: what waited is now being answered
                self._waiting.pop(name, None)

        if self.runtime.log.state(name).interrupted_calls:
            self._waiting.pop(name, None)
            return await self.runtime.resume(session, posts.show, asker=asker)
        return await self.runtime.run_turn(session, posts.show, on_position, asker=asker)

    async def _conclude(
        self, name: str, channel: str, running: _Running, outcome: TurnOutcome | None
    ) -> None:
        if outcome is None or running.stopped_by is not None:
            who = running.stopped_by or "someone"
            stop = self._record_stop(name, who)
            draft = running.posts.draft
            await self._close_stopped(name, channel, draft.post_id, draft.written, stop, who)
        elif outcome.failure is not None:
            broken = self.runtime.log.latest_entries(name, 1)[-1].seq
            await self.outbox.post_once(
                f"{name}#{broken}:failed",
                channel,
                root_of(name),
                f"⚠️ I could not answer: {outcome.failure}\nReply to try again.",
            )
        else:
            cut = [cut_note(outcome.cut_at)] if outcome.cut_at is not None else []
            await self.deliver(name, notices=[*cut, *outcome.notices])
        await running.posts.status.remove()

    async def _stopped_before(self, name: str) -> bool:
        """A stop asked for the pending turn before loopd ended, the turn cut before it could
        record it (a kill): recorded now, and closed in the thread as a live stop is."""
        entries = thread_entries(self.runtime.log, name)
        asked = self.state.stop_asked(name)
        if asked is None or asked.answering_seq != answering_seq(entries):
            return False  # no stop, or one of an earlier turn
        last = max(e.seq for e in entries if e.kind in REPLAYED_KINDS)
        if any(is_stop(e) for e in entries if e.seq > last):
            return False  # recorded already: this turn runs again since (a retry)
        stop = self._record_stop(name, asked.who)
        if (channel := self.state.thread_channel(root_of(name))) is not None:
            draft, written = await self._left_draft(name, entries)
            await self._close_stopped(name, channel, draft, written, stop, asked.who)
        return True

    async def _left_draft(self, name: str, entries: list[Entry]) -> tuple[str | None, str]:
        """The cut turn's answer post and what it shows, if it has one."""
        for entry in reversed(since_last_turn(entries)):
            if (draft := draft_post(self.outbox, f"{name}#{entry.seq}{DRAFT}")) is None:
                continue
            try:
                posts = await self.outbox.client.thread(root_of(name))
            except MattermostError as exc:
                log.warning("could not read the answer post of %s (%s)", name, exc)
                return None, ""
            shown = next((p.message for p in posts if p.id == draft), "")
            return draft, shown.removesuffix(DRAFT_MARK)
        return None, ""

    async def _close_stopped(
        self, name: str, channel: str, draft: str | None, written: str, stop: Entry, who: str
    ) -> None:
        """One closing line: in the answer post ``draft``, after what was ``written`` before the
        stop, or alone when nothing was."""
        key = f"{name}#{stop.seq}:stopped"
        line = f"⏹️ Stopped by @{who}."
        # Who stopped it is one of the thread's people (a stop word in it, a reaction on it).
        people = self.outbox.client.mentionable
        people[root_of(name)] = people.get(root_of(name), frozenset()) | {who.lower()}
        if draft is not None and not self.outbox.delivered(key):
            room = self.outbox.max_post_size - len(line) - 2
            written = visible(written)[:room].rstrip()  # as the post shows it, within the limit
            text = f"{written}\n\n{line}" if written else line
            try:
                await self.outbox.client.patch_message(
                    draft, text, root_id=root_of(name), props={TURN_PROP: key, PART_PROP: 0}
                )
            except MattermostError as exc:
                log.warning("the answer post of %s could not show the stop (%s)", name, exc)
            else:
                with self.outbox.state.together():
                    self.outbox.state.record_intent(key, 1)
                    self.outbox.state.record_posted(key, 0, draft)
                    close(self.outbox, draft, "stopped")
        await self.outbox.post_once(key, channel, root_of(name), line)

    def _record_stop(self, name: str, who: str) -> Entry:
        """A stopped turn, in the log (``loopd.turnstop``, as the terminal's Ctrl-C writes it)."""
        entry = record_stop(self.runtime.log, name, who)
        log.info("turn of %s stopped by @%s", name, who)
        return entry

    def _stop_hint(self) -> str:
        return (
            f"\n(reply `{self.settings.stop_word}` or react :{self.settings.stop_reaction}: "
            "to stop)"
        )

    # -- stop ------------------------------------------------------------------------------------

    def stop(self, session: str, who: str, who_id: str = "") -> StopResult:
        """Cancel the running turn of ``session`` if ``who`` may: its stream closes, which
        frees the slot on the server. The turn belongs to the people whose messages it answers,
        and the configured admins."""
        running = self._running.get(session)
        if running is None or running.ended:
            return StopResult.NOTHING_RUNNING
        if not may_decide(running.deciders, who, who_id):
            return StopResult.NOT_ALLOWED
        # Durable before the cancel: killed before the turn records the stop, loopd still knows
        # on its next start that this turn must not run again (``resume_all``).
        self.state.ask_stop(session, running.answering_seq, who)
        running.stopped_by = who
        running.scope.cancel()
        return StopResult.STOPPED

    def retry_by_post(self, post_id: str, who: str, who_id: str = "") -> RetryResult:
        """A retry reaction on ``post_id``: when it is the thread's latest answer (or the
        closing line of a turn that ended without one), that turn runs again: its answer is
        taken out of the replay and generated anew from the same messages (the earlier one
        stays in the log and the thread), or its end is undone (``loopd.turnstop``). The
        turn's people and the admins may ask it."""
        posted = [_keyed(key) for key in self.state.post_keys(post_id)]
        names = {name for name, _ in posted if name.startswith(PREFIX)}
        if len(names) != 1:
            return RetryResult.NOT_AN_ANSWER
        (name,) = names
        if self.running(name) or self.state.held(name):
            return RetryResult.BUSY
        log_ = self.runtime.log
        try:
            target = retry_target(log_.state(name))
        except NothingToRetry:
            return RetryResult.BUSY
        if target not in {seq for _, seq in posted}:
            return RetryResult.NOT_LATEST
        entries = thread_entries(log_, name)
        asked_by = requesters([e for e in entries if e.seq < target])
        if who not in asked_by and not ({who, who_id} & set(self.settings.admins)):
            return RetryResult.NOT_ALLOWED
        take_back(log_, name, who)
        log.info("the latest turn of %s runs again, asked by @%s", name, who)
        self.wake(name)
        return RetryResult.RUNS

    def owners(self, session: str) -> frozenset[str]:
        running = self._running.get(session)
        return running.deciders.people if running is not None else frozenset()

    def stop_by_post(self, post_id: str, who: str, who_id: str = "") -> StopResult:
        """A stop reaction on a turn's status post or answer post."""
        for session, running in self._running.items():
            if running.posts.owns(post_id):
                return self.stop(session, who, who_id)
        return StopResult.NOTHING_RUNNING

    # -- delivery --------------------------------------------------------------------------------

    async def deliver(self, name: str, notices: list[str] | None = None) -> None:
        """Post the session's latest answer unless it is already in the thread: into the turn's
        answer post, written as it streamed, with any further parts as new posts."""
        entries = thread_entries(self.runtime.log, name)
        self.outbox.client.mentionable[root_of(name)] = thread_people(entries)
        last = latest_answer(entries)
        if last is None or last.message is None:
            return
        key = f"{name}#{last.seq}"
        channel = self.state.thread_channel(root_of(name))
        if channel is None or self.outbox.delivered(key):
            return
        answer = json.loads(last.message).get("content") or "(the model gave an empty answer)"
        if notices:
            answer += "\n\n" + "\n".join(f"_{notice}_" for notice in notices)
        parts = self.outbox.parts(answer)
        if self.state.planned_parts(key) is None:
            self.state.record_intent(key, len(parts))
        if 0 not in self.state.posted_parts(key):
            await self._into_draft(name, entries, last.seq, key, parts[0])
        await self.outbox.post_once(key, channel, root_of(name), answer)

    async def _into_draft(
        self, name: str, entries: list[Entry], answer_seq: int, key: str, first: str
    ) -> None:
        """The answer's first part into the turn's answer post, if it has one."""
        for entry in reversed(since_last_turn(entries, answer_seq)):
            draft = draft_post(self.outbox, f"{name}#{entry.seq}{DRAFT}")
            if draft is None:
                continue
            try:
                await self.outbox.client.patch_message(
                    draft, first, root_id=root_of(name), props={TURN_PROP: key, PART_PROP: 0}
                )
            except MattermostError as exc:
                # Deleted by someone, or past the edit time limit: the answer goes out as new
                # posts, and the draft is taken away by the tidy-up.
                log.warning("the answer post %s could not take the answer (%s)", draft, exc)
                return
            with self.state.together():  # an answer post recorded is never a draft to remove
                self.state.record_posted(key, 0, draft)
                close(self.outbox, draft, "answer")
            return

    async def tidy(self, name: str) -> int:
        """Take away what earlier turns (and runs of them cut short) left: status posts, and
        answer posts that became nothing (the turn failed, or the answer went out as new posts).
        How many are still up (Mattermost away): every later tidy-up tries them again."""
        for entry in recent_turns(thread_entries(self.runtime.log, name)):
            for suffix in (STATUS, DRAFT):
                # A post whose create was cut short (a kill, a stop) is found by its key.
                try:
                    await self.outbox.recover(f"{name}#{entry.seq}{suffix}", root_of(name))
                except MattermostError as exc:
                    log.warning("could not look for the posts of %s (%s)", name, exc)
        left = 0
        for key, post_id in self.state.turn_posts_left(name):
            if not await self.outbox.remove(post_id):
                left += 1
            elif key.endswith(DRAFT):
                close(self.outbox, post_id, "removed")
        return left
