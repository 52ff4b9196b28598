"""Durable sessions' I/O: the saves loopd may restore, and the server calls that make and use
them (the rule is ``loopd.engine.durable``).

The record of saves is one per session, in ``<state_dir>/durable/``: each session's latest
save that the server answered with success, as a small JSON file written whole (a temporary
file, then a rename), so a crash leaves the old record or the new one, never half of one. It is
a hint, not history: the session log stays the truth, a missing or unreadable record only means
no restore, and a save that failed to restore is forgotten so that it is never tried again.

On a full disk the temporary file cannot be written, and the old record must not stay: brokerd
removes a session's earlier save files once a new save succeeds, so it would name a file that is
gone (``make soak``'s disk-full fault: six returns asked for such files and read their whole
prompt again). The record is then rewritten in place, in the space its file already holds; a
crash in that write leaves an unreadable record (no restore, never a wrong one); where that
fails too, the old record is removed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from loopcommon.slotfiles import is_slot_file_name, session_tag
from loopd.engine.cacheloss import LossCause
from loopd.engine.client import InferenceClient
from loopd.engine.durable import (
    RestoreOutcome,
    Saved,
    after_restore,
    last_run_slot,
    moved,
    restore_target,
    save_name,
    usable,
    worth_restoring,
)
from loopd.engine.modelstate import Forgot, ModelMemory, ModelReading, forgot
from loopd.engine.quiet import Purpose
from loopd.engine.request import RequestSettings
from loopd.engine.saverule import SaveDecision, SaveFigures, decide
from loopd.errors import InferenceError
from loopd.prewarm.prewarmer import Prewarmer, PrewarmOutcome, StateBack
from loopd.sessionlog.records import Session

log = logging.getLogger(__name__)

FOLDER = "durable"
# Why a save made on another server is restored here: the session moved off that one (its server
# died), and its save followed it (the perf record's ``restore.why``).
MOVED = "moved with its save"


def _text(value: object) -> str | None:
    return None if value is None else str(value)


class SaveBook:
    def __init__(self, state_dir: Path) -> None:
        self.folder = state_dir / FOLDER

    def _path(self, session: str) -> Path:
        return self.folder / f"{session_tag(session)}.json"

    def latest(self, session: str) -> Saved | None:
        """The session's recorded save; None when there is none or it cannot be read."""
        try:
            data = json.loads(self._path(session).read_text("utf-8"))
            saved = Saved(
                file=str(data["file"]),
                message_count=int(data["message_count"]),
                n_saved=int(data["n_saved"]),
                slot=int(data["slot"]),
                endpoint=_text(data.get("endpoint")),
                fingerprint=_text(data.get("fingerprint")),
                instance=_text(data.get("instance")),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s: its save record cannot be read (%s); no restore", session, exc)
            return None
        return saved if is_slot_file_name(saved.file) else None

    def record(self, session: str, saved: Saved) -> None:
        """Record ``saved`` as the session's usable save (after the server's success answer);
        on a full disk, in place (see the module doc)."""
        path = self._path(session)
        text = json.dumps(asdict(saved)).encode("utf-8")
        partial = path.with_suffix(".tmp")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            partial.write_bytes(text)
            os.replace(partial, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                partial.unlink()
            self._record_in_place(session, text, exc)

    def _record_in_place(self, session: str, text: bytes, failure: OSError) -> None:
        path = self._path(session)
        try:
            with path.open("r+b") as file:  # no new file, and no space beyond what it holds
                file.write(text)
                file.truncate()
        except OSError:
            log.warning("%s: its save could not be recorded (%s); no restore", session, failure)
            self.forget(session)
            return
        log.info("%s: its save was recorded in place (%s)", session, failure)

    def forget(self, session: str) -> None:
        """Never restore the session's recorded save again."""
        try:
            self._path(session).unlink(missing_ok=True)
        except OSError as exc:
            log.warning("%s: its save record could not be removed: %s", session, exc)


@dataclass
class Probe:
    """One request's look at what the server kept: before it, whether the model forgot since
    the session's save (``forgot``), or the save was made on another server the session moved
    off (``moved``): then the save is restored first, and the request sent once; during it,
    its first progress event."""

    saved: Saved | None  # the save this request could restore
    slot: int  # the session's slot on this server (a pinned restore goes there)
    held: int | None = None  # the first progress event's ``cache`` count
    forgot: Forgot | None = None  # the model forgot since the save was made
    displaced: bool = False  # pinned, another session's request ran on the slot since
    moved: bool = False  # the save was made on another server (of the same model)

    @property
    def restore_first(self) -> bool:
        return self.saved is not None and (self.forgot is not None or self.displaced or self.moved)

    def lost(self, cache: int) -> bool:
        """``stream_into``'s ``lost``: close the request to restore first?"""
        self.held = cache
        return self.saved is not None and worth_restoring(self.saved, cache)

    @property
    def why(self) -> str:
        """Why the save is restored, for the perf record."""
        if self.moved:
            return MOVED
        if self.forgot is not None:
            return self.forgot.value
        if self.displaced:
            return LossCause.SHARED_SLOT.value
        return f"the server held {self.held} tokens (the request's first progress event)"


@dataclass(frozen=True)
class Restore:
    """A restore loopd made before sending a request again."""

    saved: Saved
    held_before: int
    n_restored: int | None  # None: the server refused it, or no slot could take it
    slot: int | None  # the slot restored into; None: no idle slot of loopd's to restore into
    ms: float = 0.0
    refusal: str = ""
    why: str = ""  # why it was restored (``Probe.why``)

    def verdict(self, cache_n: int) -> RestoreOutcome:
        return after_restore(self.n_restored, self.held_before, cache_n)

    def extra(self, cache_n: int) -> dict[str, object]:
        """What the request's perf record says of it."""
        out: dict[str, object] = {
            "file": self.saved.file,
            "outcome": self.verdict(cache_n).value,
            "held_before": self.held_before,
            "n_saved": self.saved.n_saved,
            "slot": self.slot,
        }
        if self.n_restored is not None:
            out.update(n_restored=self.n_restored, restore_ms=self.ms)
        if self.refusal:
            out["refusal"] = self.refusal
        if self.why:
            out["why"] = self.why
        return out


@dataclass
class DurableSlots:
    """Saves a session's slot at the end of a turn and restores it when the server lost it.

    ``pinned``: each session's requests name its slot, and its saves and restores use that
    slot; else the server places requests, and a restore goes into one of ``slots`` (loopd's
    own), the idle one ``restore_target`` names, held for that restore until ``release``."""

    client: InferenceClient
    book: SaveBook
    prewarmer: Prewarmer
    endpoint: str | None = None
    pinned: bool = True
    slots: Sequence[int] = (0,)
    # What the server told of the model without waking it (``loopd.engine.modelstate``): its
    # fingerprint, which a save is bound to, read before each save and before a turn of a
    # session that has one; and when each session's slot last held its state. The server's,
    # kept across what is known of it being replaced, as ``claimed`` is.
    memory: ModelMemory = field(default_factory=ModelMemory)
    # What loopd measured of saving and reading, for the rule that decides each save (the
    # server's, kept likewise).
    figures: SaveFigures = field(default_factory=SaveFigures)
    # How long a reading may wait for the model to load (the turn's first-byte limit).
    load_wait_s: float = 900.0
    # Slots a restore of loopd's is filling, until the request sent after it ended (the
    # server's, kept across what is known of it being replaced: ``loopd.endpoints.server``).
    claimed: set[int] = field(default_factory=set)

    async def look(self, purpose: Purpose = Purpose.PERSON) -> ModelReading:
        """Read the model (``InferenceClient.model_reading``: nothing that wakes it; where a
        person waits, a model not loaded is loaded, as the turn's request would) into
        ``memory``."""
        reading = await self.client.model_reading(self.load_wait_s, purpose=purpose)
        self.memory.observe(reading)
        return reading

    @property
    def fingerprint(self) -> str | None:
        """The model's fingerprint as last read (a model not loaded tells none: the one before
        it); None when never read. A restore reads it again first (``Turn.step``)."""
        known = self.memory.known
        return known.fingerprint(self.client.model) if known is not None else None

    async def before_turn(self, session: str) -> None:
        """At the start of a turn of a session that has a save, where no watch reads the model
        in the background (``loopd chat``, ``loopd run``; ``loopd serve``'s server watch does):
        read it, so that the turn knows whether it forgot since the save."""
        if not self.memory.watched and self.book.latest(session) is not None:
            await self.look()

    def probe(
        self,
        session: str,
        tools_text: str,
        messages: Sequence[str],
        slot: int,
        *,
        displaced: bool = False,
    ) -> Probe:
        latest = self.book.latest(session)
        now = self.fingerprint
        if latest is not None and now is not None and latest.fingerprint != now:
            log.warning(
                "%s: its save %s was written by another model (fingerprint %s, now %s: other "
                "weights or template behind the same model id); forgotten, never restored",
                session,
                latest.file,
                latest.fingerprint or "none",
                now,
            )
            self.book.forget(session)
            latest = None
        saved = usable(
            latest,
            session=session,
            tools_text=tools_text,
            messages=messages,
            slot=slot if self.pinned else None,
            fingerprint=now,
            endpoint=self.endpoint,
        )
        return Probe(
            saved,
            slot,
            forgot=self._forgot(session, saved),
            displaced=displaced,
            moved=saved is not None and moved(saved, self.endpoint),
        )

    def _forgot(self, session: str, saved: Saved | None) -> Forgot | None:
        """What the model lost since the session's slot last held its state, as far as loopd
        has read it (``memory``); None when nothing says so (the request's first progress
        event still can)."""
        if saved is None:
            return None
        mark = self.memory.held_at.get(session)
        if mark is not None:
            return self.memory.last_forget if self.memory.forgets > mark else None
        # Saved before loopd started: what the model is now, against what it was at the save.
        last = self.memory.last
        if last is None:
            return None
        if last.status.holds_nothing:
            return forgot(None, last)
        if saved.instance is not None and last.instance not in (None, saved.instance):
            return Forgot.RESTARTED
        return None

    def held(self, session: str) -> None:
        """The session's slot holds its state now (its turn ended there)."""
        self.memory.held_at[session] = self.memory.forgets

    def decide(self, tokens: int) -> SaveDecision:
        """Whether a state of ``tokens`` tokens is worth saving now (``loopd.engine.saverule``)."""
        return decide(tokens, self.figures)

    async def restore(self, probe: Probe) -> Restore:
        """Put the probe's save back into a slot: the session's own where pinned, else an idle
        one of loopd's, claimed until ``release``. A moved session's save is asked of this
        server by its file's name: brokerd copies it here from the server that made it."""
        assert probe.saved is not None
        held = probe.held or 0  # not asked where the model is known to have forgotten
        saved, why = probe.saved, probe.why
        slot = probe.slot if self.pinned else await self._target()
        if slot is None:
            refusal = "no idle slot to restore into"
            return Restore(saved, held, None, None, refusal=refusal, why=why)
        self.claimed.add(slot)
        try:
            answer = await self.client.restore_slot(slot, saved.file)
        except InferenceError as exc:
            return Restore(saved, held, None, slot, refusal=str(exc), why=why)
        self.figures.restored(answer.n_bytes, answer.ms)
        return Restore(saved, held, answer.n_tokens, slot, ms=answer.ms, why=why)

    def release(self, restore: Restore) -> None:
        """The request sent after ``restore`` ended: its slot may take another restore."""
        if restore.slot is not None:
            self.claimed.discard(restore.slot)

    async def _target(self) -> int | None:
        try:
            slots = await self.client.slots()
        except InferenceError as exc:
            log.warning("no restore: /slots failed: %s", exc)
            return None
        return restore_target(slots, self.slots, self.claimed)

    async def restore_for_prewarm(
        self, session: str, tools_text: str, messages: Sequence[str], slot: int
    ) -> StateBack | None:
        """For a prewarm: restore the session's usable save without asking first what the
        server holds (a restore of a state the slot already holds costs only its disk read).
        The session's next request confirms it (``loopd.prewarm.prewarmer``). None: no usable
        save, no slot to restore into, or the server refused it (then dropped)."""
        if self.book.latest(session) is None:
            return None
        await self.look(Purpose.WORK)  # what the model forgot so far, and its fingerprint now
        probe = self.probe(session, tools_text, messages, slot)
        if probe.saved is None:
            return None
        probe.held = 0  # not asked
        restore = await self.restore(probe)
        self.release(restore)  # no request of loopd's follows it: the next one is the session's
        if restore.slot is None:
            return None
        if restore.n_restored is None:
            self.settle(session, restore, 0)  # refused: dropped
            return None
        self.held(session)
        extra = restore.extra(restore.n_restored)
        extra["outcome"] = "restored, the next request confirms it"
        return StateBack(restore.n_restored, extra)

    async def _saved_slot(self, session: Session) -> int | None:
        """The slot that holds what the prefix read just read: the session's own where pinned,
        else the one the server placed it on."""
        if self.pinned:
            return session.slot
        try:
            return last_run_slot(await self.client.slots())
        except InferenceError as exc:
            log.warning("%s: its slot was not saved: /slots failed: %s", session.name, exc)
            return None

    def settle(self, session: str, restore: Restore, cache_n: int) -> RestoreOutcome:
        """The request after ``restore`` read ``cache_n`` tokens from the cache: a save that did
        not come back is never tried again."""
        verdict = restore.verdict(cache_n)
        # Kept where no slot could take it: the save itself was never tried.
        if verdict is not RestoreOutcome.RESTORED and restore.slot is not None:
            log.warning(
                "%s: %s (%s; cache_n %d after it)",
                session,
                verdict.value,
                restore.saved.file,
                cache_n,
            )
            self.book.forget(session)
        return verdict

    async def save(
        self,
        session: Session,
        settings: RequestSettings,
        tools_text: str,
        messages: Sequence[str],
    ) -> Saved | None:
        """Save the session's slot as ``messages`` (the turn's last request and its reply)
        leave it, for a caller that holds the slot.

        The slot is first made to hold exactly those messages as the next request renders them
        (the reply without its end-of-turn marker, ``Prewarmer.read_prefix``): what the server
        generated may be tokenized otherwise than the reply is read back, and a hybrid model
        cannot cut its state back to the common part. Recorded only on the server's success
        answer for as many tokens as that read left in the slot: a save cut short, or of
        something else, is never restored."""
        read = await self.prewarmer.read_prefix(session, settings)
        perf = read.record.perf if read.record is not None else None
        if read.outcome is not PrewarmOutcome.DONE or perf is None or perf.cache_n is None:
            log.warning("%s: its slot was not saved: the prefix read %s", session.name, read)
            return None
        held = perf.cache_n + (perf.prompt_n or 0)
        reading = await self.look()
        fingerprint = reading.fingerprint(self.client.model)
        if fingerprint is None:
            log.warning(
                "%s: its slot was not saved: the server does not tell which model it runs "
                "(%s), and a save is bound to it",
                session.name,
                self.memory.last.detail if self.memory.last is not None else "no reading",
            )
            return None
        name = save_name(session.name, tools_text, messages, fingerprint)
        slot = await self._saved_slot(session)
        if slot is None:
            return None
        try:
            answer = await self.client.save_slot(slot, name)
        except InferenceError as exc:
            log.warning("%s: its slot was not saved: %s", session.name, exc)
            return None
        if answer.n_tokens != held:
            log.warning(
                "%s: the save holds %d tokens, not the %d its prefix read left; not used",
                session.name,
                answer.n_tokens,
                held,
            )
            return None
        read_ms = perf.extra.get("duration_ms")
        read_ms = float(read_ms) if isinstance(read_ms, int | float) else None
        self.figures.saved(answer.n_tokens, answer.n_bytes, answer.ms, read_ms)
        saved = Saved(
            name,
            len(messages),
            answer.n_tokens,
            slot,
            self.endpoint,
            fingerprint,
            reading.instance,
        )
        self.book.record(session.name, saved)
        self.held(session.name)
        return saved
