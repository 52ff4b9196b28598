"""Prewarm: read a session's prompt into its idle slot before its next turn needs it.

After a compaction or a restart a session's slot may not hold its prompt (another session on the
same slot ran since, or the server lost its cache), and its next turn would begin with a full
read. A prewarm sends the session's messages as they stand, ``max_tokens: 1``, so the server
reads them now; the next real request then extends that prompt and reads only its own tokens.

It is sent as a stream, although only its final ``timings`` are read: through the router, closing
a non-streamed request did not stop it (measured on build 11434: a turn queued behind a cancelled
non-streamed prewarm waited for the whole prompt to be read, 5.7 s for 1,062 tokens), while
closing a stream stops the server after its current batch.

The stored messages end with the model's last answer, which the server takes as a message to
continue: it renders that answer without its end-of-turn marker, which is a prefix of how the
next request renders it. Everything up to the answer's last token is reused.

A prewarm only ever uses idle time, of the whole engine and of the whole server: it is a task
launch like any other, which on a unified pool saves and clears every idle slot, and a second
active slot roughly halves generation for everyone (docs/production-shape.md, item 6):

- it starts only when no turn of loopd's runs or waits on any slot (the scheduler), the model
  is awake (read without waking it: background work never wakes a sleeping model or loads an
  unloaded one, ``loopd.engine.quiet``), the server shows no slot busy (another client's
  request), and never for a session with a turn pending;
- it holds the slot through the scheduler, so a turn of any session on the slot waits for it, and
  ``preempt`` cancels it at once (a turn on any slot preempts every prewarm): closing the
  connection frees the slot on the server (measured by
  ``test_l_closing_the_stream_frees_the_slot_within_a_second`` in tests/contract/), so the turn
  waits only for that.

Where requests are placed by the server (``id_slot`` -1, ``loopd.engine.pinning``) the prewarm
is too: the session's prompt then lives in the host prompt cache between its turns, and a prewarm
helps only when the host cache lost it (a restart, a model unload).

With durable sessions (``loopd.engine.durable``), a session whose last answered turn was saved
is not read at all: its save is restored into the slot instead (the slot's own where requests
are pinned, else an idle one of loopd's, where the server then places the session's request, the
slot holding most of its prompt), and that is the prewarm. No read follows it: the save holds
exactly the prompt a prewarm would send, and a hybrid model cannot resume a prompt equal to what
it holds without a checkpoint before its end, which a restored slot does not carry (measured on
the ``qwen35moe`` preset: the read after the restore began again from 0). The session's next
request confirms the restore, as after a turn's own: its first progress event shows what the
server holds, and a restore that did not take is made again there and then, or the save
dropped. A save the server refuses to restore is dropped, and the prompt read as without one.

It is recorded as a ``prewarm`` request (message count and digest of what it sent, the server's
counts), never as an entry: its one generated token is not part of the conversation.

Where loopd has several servers, a session moved off a dead one is prewarmed on its new endpoint
(``loopd.endpoints.warm``); that prewarm names its endpoint and, as the move's one re-read,
carries the ``endpoint lost`` loss, so the session's next turn starts warm.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Protocol

import anyio

from loopd.engine.cacheloss import Circumstances, PrevRequest, cache_loss
from loopd.engine.client import InferenceClient
from loopd.engine.quiet import Call, Purpose, may_send
from loopd.engine.request import RequestSettings, build_body
from loopd.errors import InferenceError, StreamBroken
from loopd.observe import recorder
from loopd.observe.recorder import Sent
from loopd.scheduler import Scheduler
from loopd.sessionlog.records import Perf, RequestKind, RequestRecord, Session
from loopd.sessionlog.store import SessionLog
from loopd.wire.sse import SSEData, SSEDecoder

log = logging.getLogger(__name__)


class PrewarmOutcome(StrEnum):
    DONE = "complete"
    SKIPPED = "skipped"  # disabled, the slot in use, a turn pending: nothing was sent
    CANCELLED = "cancelled"  # real work needed the slot
    FAILED = "failed"


@dataclass(frozen=True)
class PrewarmResult:
    outcome: PrewarmOutcome
    detail: str = ""
    record: RequestRecord | None = None


@dataclass(frozen=True)
class StateBack:
    """A session's saved state, put back into a slot by a prewarm."""

    n_restored: int  # the server's count of the tokens it restored
    restore: dict[str, object]  # what the prewarm's record says of the restore


class StateRestorer(Protocol):
    """Durable sessions as a prewarm uses them (``loopd.turn.saves.DurableSlots``)."""

    async def restore_for_prewarm(
        self, session: str, tools_text: str, messages: Sequence[str], slot: int
    ) -> StateBack | None:
        """Restore the session's usable save, if it has one; None: none, or the server
        refused it (then dropped): read the prompt."""


def prewarm_settings(settings: RequestSettings, max_tokens: int = 1) -> RequestSettings:
    """The session's request settings, generating one token (streamed: see the module doc)."""
    return replace(settings, max_tokens=max_tokens, stream=True)


def final_timings(stream: bytes) -> dict[str, Any] | None:
    """The last event of a streamed answer that carries ``timings`` (the server adds them to
    its final chunk), or None when no event does."""
    decoder = SSEDecoder()
    found: dict[str, Any] | None = None
    for item in [*decoder.feed(stream), *decoder.flush()]:
        if not isinstance(item, SSEData) or item.payload == "[DONE]":
            continue
        try:
            event = json.loads(item.payload)
        except ValueError:
            continue
        if isinstance(event, dict) and isinstance(event.get("timings"), dict):
            found = event
    return found


def timings_perf(answer: Any, duration_ms: float) -> Perf:
    """The perf record of an answer (the final event of a stream), from its ``timings``."""
    timings = answer.get("timings") if isinstance(answer, dict) else None
    timings = timings if isinstance(timings, dict) else {}

    def count(name: str) -> int | None:
        value = timings.get(name)
        return value if isinstance(value, int) else None

    return Perf(
        outcome="complete",
        cache_n=count("cache_n"),
        prompt_n=count("prompt_n"),
        predicted_n=count("predicted_n"),
        prompt_per_second=timings.get("prompt_per_second"),
        extra={"duration_ms": round(duration_ms, 1), "prompt_ms": timings.get("prompt_ms")},
    )


@dataclass
class Prewarmer:
    """Runs prewarms on idle slots and cancels them when real work arrives."""

    client: InferenceClient
    log: SessionLog
    scheduler: Scheduler
    enabled: bool = False
    timeout_s: float = 900.0
    endpoint: str | None = None  # the server's name where loopd has several (loopd.endpoints)
    _running: dict[int, anyio.CancelScope] = field(default_factory=dict)

    def preempt(self, slot: int) -> bool:
        """Cancel the prewarm running on ``slot``, if any; True when there was one."""
        scope = self._running.get(slot)
        if scope is None:
            return False
        scope.cancel()
        return True

    def preempt_all(self) -> bool:
        """Cancel every prewarm running; True when there was one."""
        return any([self.preempt(slot) for slot in list(self._running)])

    def running(self, slot: int) -> bool:
        return slot in self._running

    async def prewarm(
        self,
        session: Session,
        settings: RequestSettings,
        *,
        moved: PrevRequest | None = None,
        restorer: StateRestorer | None = None,
    ) -> PrewarmResult:
        """Read ``session``'s prompt into its slot (``session.slot``: its slot on this server),
        if the slot is idle; see the module doc. ``moved``: the session's previous request,
        where it ran on another endpoint (the session moved off a dead server): this read is
        the move's re-read, and its loss is recorded (``endpoint lost``). ``restorer``: durable
        sessions, where they are on: a usable save is restored instead of the read."""
        why_not = await self._why_not(session)
        if why_not:
            return PrewarmResult(PrewarmOutcome.SKIPPED, why_not)
        # No await between the check above (its last await is inside it) and taking the slot:
        # the scheduler hands a free slot over at once.
        if self.scheduler.holder(session.slot) is not None:
            return PrewarmResult(PrewarmOutcome.SKIPPED, "the slot is in use")
        if not self.scheduler.idle():
            return PrewarmResult(PrewarmOutcome.SKIPPED, "a turn of loopd's runs or waits")
        async with self.scheduler.slot(f"prewarm:{session.name}", session.slot):
            with anyio.CancelScope() as scope:
                self._running[session.slot] = scope
                try:
                    return await self._send(session, settings, moved, restorer=restorer)
                finally:
                    del self._running[session.slot]
        return PrewarmResult(PrewarmOutcome.CANCELLED, "real work needed the slot")

    async def read_prefix(self, session: Session, settings: RequestSettings) -> PrewarmResult:
        """Read the session's messages into its slot and generate nothing (``max_tokens`` 0),
        for a caller that holds the slot: the slot then holds exactly the prefix the session's
        next request extends, which a durable session saves (``loopd.engine.durable``; a hybrid
        model's state cannot be cut back to a prefix of what it holds)."""
        return await self._send(session, settings, None, max_tokens=0)

    async def _why_not(self, session: Session) -> str:
        if not self.enabled:
            return "prewarm is off"
        if self.scheduler.holder(session.slot) is not None:
            return "the slot is in use"
        if not self.scheduler.idle():
            return "a turn of loopd's runs or waits"
        if not self.log.state(session.name).idle:
            return "a turn is pending"
        # Background work (``loopd.engine.quiet``): never on a model asleep or not loaded.
        verdict = may_send(Call.CHAT, Purpose.WORK, (await self.client.model_reading()).status)
        if not verdict.allowed:
            return verdict.why
        try:
            slots = await self.client.slots()
        except InferenceError as exc:
            return f"/slots failed: {exc}"
        if any(slot.get("is_processing") for slot in slots):
            return "the server is busy with another client's request"
        return ""

    async def _send(
        self,
        session: Session,
        settings: RequestSettings,
        moved: PrevRequest | None,
        max_tokens: int = 1,
        restorer: StateRestorer | None = None,
    ) -> PrewarmResult:
        """Read the session's messages; with a ``restorer``, its usable save put back instead,
        where it has one (see the module doc)."""
        epoch = self.log.current_epoch(session.name)
        messages = self.log.replay_messages(session.name)
        if restorer is not None:
            back = await restorer.restore_for_prewarm(
                session.name, epoch.tools_text, messages, session.slot
            )
            if back is not None:
                return self._restored(session, epoch.number, messages, back)
        body = build_body(prewarm_settings(settings, max_tokens), epoch.tools_text, messages)
        sent = Sent.of(RequestKind.PREWARM, session.slot, epoch.number, messages)
        started = time.monotonic()
        try:
            answer = await self._post(body)
        except anyio.get_cancelled_exc_class():
            self._failed(session, sent, "cancelled", started, "real work needed the slot")
            raise
        except InferenceError as exc:
            self._failed(session, sent, "broken", started, str(exc))
            return PrewarmResult(PrewarmOutcome.FAILED, str(exc))
        if answer is None:
            self._failed(session, sent, "broken", started, "timed out")
            return PrewarmResult(PrewarmOutcome.FAILED, f"no answer in {self.timeout_s:g} s")
        perf = timings_perf(answer, (time.monotonic() - started) * 1000)
        perf = self._moved(moved, epoch.number, session.slot, perf)
        record = recorder.record(self.log, session.name, sent, perf)
        return PrewarmResult(PrewarmOutcome.DONE, record=record)

    def _restored(
        self, session: Session, epoch: int, messages: list[str], back: StateBack
    ) -> PrewarmResult:
        """Record the restore as the prewarm: the slot holds the restored tokens, as a read of
        them would have left it (what the session's next request is measured against)."""
        perf = Perf(
            outcome="complete",
            cache_n=back.n_restored,
            prompt_n=0,
            predicted_n=0,
            extra={"restore": back.restore},
        )
        sent = Sent.of(RequestKind.PREWARM, session.slot, epoch, messages)
        record = recorder.record(self.log, session.name, sent, self._named(perf))
        log.info("prewarmed %s from its save: %d tokens restored", session.name, back.n_restored)
        return PrewarmResult(PrewarmOutcome.DONE, record=record)

    def _moved(self, moved: PrevRequest | None, epoch: int, slot: int, perf: Perf) -> Perf:
        """The perf record, named with its endpoint; after a move, with the move's loss."""
        perf = self._named(perf)
        if moved is None or perf.cache_n is None:
            return perf
        around = Circumstances(endpoint_changed=True)
        loss = cache_loss(moved, epoch_id=epoch, slot=slot, cache_n=perf.cache_n, around=around)
        extra = {**perf.extra, "expected_reuse": loss.expected}
        return replace(perf, cache_loss=loss.lost, cache_loss_cause=loss.label or None, extra=extra)

    def _named(self, perf: Perf) -> Perf:
        """``perf`` naming the server it ran on, where loopd has several."""
        if self.endpoint is None:
            return perf
        return replace(perf, extra={**perf.extra, "endpoint": self.endpoint})

    async def _post(self, body: bytes) -> Any:
        with anyio.move_on_after(self.timeout_s):
            async with self.client.stream_chat(body) as response:
                answer = final_timings(await response.aread())
                if answer is None:
                    raise StreamBroken("the prewarm's stream ended without timings")
                return answer
        return None

    def _failed(
        self, session: Session, sent: Sent, outcome: str, started: float, detail: str
    ) -> None:
        duration_ms = round((time.monotonic() - started) * 1000, 1)
        perf = Perf(outcome=outcome, extra={"duration_ms": duration_ms, "detail": detail})
        recorder.record(self.log, session.name, sent, self._named(perf))
