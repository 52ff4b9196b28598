"""The liveness rules of a request waiting for its first byte. Pure: no I/O, no clock.

A request pinned to a busy slot is queued by the server, which sends nothing at all meanwhile, not
even a status line (measured in tests/contract/test_contract_stream.py by
``test_j_pinned_request_to_a_busy_slot_gets_no_bytes_until_it_frees``). Silence before the first
byte says nothing by itself, so the engine polls ``/slots`` (and ``/health`` when ``/slots`` tells
nothing) and asks these rules what each poll means:

- the slot busy (for a request the server places, every slot busy): queued behind another task;
  keep waiting, up to the first-byte limit;
- ``/slots`` and ``/health`` both failing: the server is gone; fail now;
- ``/slots`` hanging while ``/health`` answers: stuck (a sleeping model reloading blocks ``/slots``
  too); keep waiting, and say so;
- any answer from ``/health`` counts as alive: a router loading a model answers 503. A 503 to the
  request itself is waited out the same way (``worth_waiting_out``).

After the first byte every event but a keep-alive ping is life; the silence limit alone rules
then (``loopd.engine.stream``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from loopd.errors import ServerRejected

# -- what one poll of /slots gave -------------------------------------------------------------


@dataclass(frozen=True)
class SlotsListed:
    slots: Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class SlotsRefused:
    """``/slots`` answered an HTTP error."""

    status: int

    @property
    def problem(self) -> str:
        return f"answers {self.status}"

    @property
    def for_good(self) -> bool:
        """A 4xx (the model unknown) or a 501 (the endpoint disabled) will not change by asking
        again; a 503 (a router loading the model) or a 500 may."""
        return self.status == 501 or 400 <= self.status < 500


@dataclass(frozen=True)
class SlotsFailed:
    """The call failed (no connection, a broken answer)."""

    reason: str

    @property
    def problem(self) -> str:
        return f"fails ({self.reason})"


@dataclass(frozen=True)
class SlotsHung:
    """No answer within the poll's own timeout."""

    timeout_s: float

    @property
    def problem(self) -> str:
        return f"does not answer within {self.timeout_s:g} s"


@dataclass(frozen=True)
class SlotsNotAsked:
    """Not polled: it refused for good before."""

    @property
    def problem(self) -> str:
        return "was refused before"


Unlisted = SlotsRefused | SlotsFailed | SlotsHung | SlotsNotAsked
SlotsAnswer = SlotsListed | Unlisted

# -- verdicts -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Waiting:
    """No byte yet and the slot not seen busy: keep waiting."""


@dataclass(frozen=True)
class Queued:
    """The slot is busy with another task: keep waiting."""


@dataclass(frozen=True)
class Stuck:
    """``/slots`` hangs while ``/health`` answers: keep waiting, and say so."""


@dataclass(frozen=True)
class Gone:
    """The server is gone: fail now."""

    reason: str


@dataclass(frozen=True)
class TimedOut:
    """The first-byte limit passed while the server was alive."""

    why: str


LivenessVerdict = Waiting | Queued | Stuck | Gone


def slot_busy(slots: Sequence[Mapping[str, Any]], slot: int) -> bool:
    """Whether ``/slots`` shows ``slot`` processing a request (anyone's)."""
    return any(s.get("id") == slot and s.get("is_processing") for s in slots)


def every_slot_busy(slots: Sequence[Mapping[str, Any]]) -> bool:
    """Whether ``/slots`` shows every slot processing a request (and lists at least one)."""
    return bool(slots) and all(s.get("is_processing") for s in slots)


def slots_verdict(slots: Sequence[Mapping[str, Any]], slot: int | None) -> Queued | Waiting:
    """What a listed ``/slots`` means for a request pinned to ``slot``, or, for None, one the
    server places: that waits only while every slot is busy (build 11434 defers it then, as it
    defers a pinned one behind its busy slot; docs/production-shape.md, item 2)."""
    busy = every_slot_busy(slots) if slot is None else slot_busy(slots, slot)
    return Queued() if busy else Waiting()


def health_verdict(slots: Unlisted, health_answers: bool) -> Waiting | Stuck | Gone:
    """What ``/health`` means when ``/slots`` told nothing (``health_answers``: any answer, a
    503 included, came back in time)."""
    if not health_answers:
        return Gone(f"/slots {slots.problem} and /health does not answer")
    return Stuck() if isinstance(slots, SlotsHung) else Waiting()


def worth_waiting_out(exc: BaseException) -> bool:
    """Whether a request refused before its first byte is sent again at once: only a router
    still loading the model (503), as nothing reached a slot. A 4xx or a dead server never
    improves by retrying at once."""
    return isinstance(exc, ServerRejected) and exc.status == 503


@dataclass(frozen=True)
class FirstByteWait:
    """What the polls have shown while a request waits for its first byte. ``now`` is a
    monotonic clock reading the caller passes in."""

    busy_since: float | None = None
    queued_s: float = 0.0  # time the slot was seen busy, in closed stretches
    stuck: bool = False  # /slots was seen hanging while /health answered
    slots_refused: bool = False  # /slots refused for good: it is not asked again
    gone: str | None = None

    def polled(self, slots: SlotsAnswer, verdict: LivenessVerdict, now: float) -> FirstByteWait:
        wait = replace(
            self,
            stuck=self.stuck or isinstance(verdict, Stuck),
            slots_refused=self.slots_refused
            or (isinstance(slots, SlotsRefused) and slots.for_good),
            gone=verdict.reason if isinstance(verdict, Gone) else self.gone,
        )
        return wait if isinstance(verdict, Gone) else wait._queue(isinstance(verdict, Queued), now)

    def ended(self, now: float) -> FirstByteWait:
        """The wait is over (a first byte, an error or a limit): close the stretch in progress."""
        return self._queue(False, now)

    def _queue(self, busy: bool, now: float) -> FirstByteWait:
        if busy:
            return self if self.busy_since is not None else replace(self, busy_since=now)
        if self.busy_since is None:
            return self
        return replace(self, busy_since=None, queued_s=self.queued_s + now - self.busy_since)


def no_first_byte(wait: FirstByteWait, *, timed_out: bool) -> Gone | TimedOut | None:
    """Why a request got no first byte: the server gone, the limit passed, or neither (it was
    cancelled from outside)."""
    if wait.gone is not None:
        return Gone(wait.gone)
    if not timed_out:
        return None
    why = (
        f"queued {wait.queued_s:.0f} s behind another task"
        if wait.queued_s
        else "the slot was not seen busy"
    )
    if wait.stuck:
        why += "; the server looks stuck: /slots did not answer while /health did"
    return TimedOut(why)
