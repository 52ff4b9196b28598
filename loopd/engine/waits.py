"""The wait a person saw before a turn's first token, in parts that add up. Pure: the stream
reader (``loopd.engine.stream``) notes the moments as they come, on the monotonic clock, and the
request's perf record keeps the parts (``loopd.engine.outcome.request_perf``).

A turn's wait runs from the moment it asked loopd for its slot to the first token the model
generated for it (thinking, answer or tool call: what the person then sees being written). Each
part ends where the next begins, so they add up to the whole wait exactly:

- **loopd's queue** (``loopd_queue_ms``): from asking for the slot (``loopd.scheduler``: behind
  the other turns of its slot, FIFO) to sending the request, with what loopd did meanwhile
  (reading the log, building the request, a compaction, an earlier attempt that failed);
- **the server's queue** (``server_queue_ms``): from sending the request to the server starting
  on it, told by its first progress event ("0 %", sent as the slot starts: docs/design,
  behaviour (i)), else by the first byte; a request pinned to a busy slot gets no byte at all
  until the slot frees (behaviour (j));
- **the prompt read** (``prompt_read_ms``): to the progress event that says the whole prompt is
  read (``processed == total``), else none;
- **the first token** (``first_token_ms``): from then to the first generated token.

Only the request on which the person's wait ended carries ``loopd_queue_ms`` (the turn's first,
or the first attempt that got a token); the others keep the server's three parts, which add up
to their own time to first token.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

WAIT_PARTS: Final = ("loopd_queue_ms", "server_queue_ms", "prompt_read_ms", "first_token_ms")
"""The parts of the wait, in order: the names they are recorded under (``Perf.extra``)."""


@dataclass
class WaitClock:
    """The moments of one request that bound the parts of the wait; each is set once."""

    sent: float
    asked: float | None = None  # the turn asked for its slot: this request may end its wait
    first_byte: float | None = None
    started: float | None = None  # the first progress event
    read: float | None = None  # the progress event of the whole prompt
    first_token: float | None = None

    def byte(self, now: float) -> None:
        if self.first_byte is None:
            self.first_byte = now

    def progress(self, processed: int, total: int, now: float) -> None:
        if self.started is None:
            self.started = now
        if self.read is None and processed >= total:
            self.read = now

    def token(self, now: float) -> None:
        if self.first_token is None:
            self.first_token = now

    def parts(self) -> dict[str, float]:
        """The parts this request knows, in milliseconds: all four where the person's wait
        ended on it, the server's three where it got a token; none it did not reach."""
        started = self.started if self.started is not None else self.first_byte
        if started is None:
            return {}
        read = self.read if self.read is not None else started
        found = {
            "server_queue_ms": _ms(started - self.sent),
            "prompt_read_ms": _ms(read - started),
        }
        if self.first_token is None:
            return found
        found["first_token_ms"] = _ms(self.first_token - read)
        if self.asked is not None:
            found["loopd_queue_ms"] = _ms(self.sent - self.asked)
        return {name: found[name] for name in WAIT_PARTS if name in found}


def person_wait_ms(extra: Mapping[str, Any]) -> float | None:
    """The whole wait a request's perf record holds (its four parts), or None where the
    person's wait did not end on it."""
    parts = [extra.get(name) for name in WAIT_PARTS]
    if not all(isinstance(part, int | float) for part in parts):
        return None
    return round(sum(part for part in parts if isinstance(part, int | float)), 1)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)
