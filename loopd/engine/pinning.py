"""A session's slot (``choose_slot``), and whether its requests are pinned to it or placed by the
server (``decide_pinning``). Pure.

On a unified KV pool with ``--cache-idle-slots`` (the server's default, and production's layout)
every task launch saves each idle slot to the host prompt cache and clears it. A request pinned to
a slot is then never restored: a session pinned to a slot of its own kept 0 % of its cache as soon
as another slot ran, while the same sessions sent with ``id_slot`` -1 kept 97 to 100 %, restored
from the host cache (docs/production-shape.md, "Measured: (d) on the unified pool"). On a server
that keeps idle slots, pinning each session to a slot of its own keeps everything, young sessions
included. So loopd pins only where the self-test's *slot pool* check found idle slots kept.

``LOOPD_PIN_SLOTS`` decides: ``yes`` or ``no`` as the operator says; ``auto`` follows the
self-test's answer when it ran (``loopd serve``), else the answer recorded in the model's
expectations file (``loopd selftest --record`` writes it; production's ships with loopd), else
does not pin. Not pinning is the safe guess: on a server that keeps idle slots it costs young
sessions that share the system text their own part (the similarity rule herds them into one
slot), while pinning on a server that clears them loses everything. ``loopd chat`` does not probe
the pool itself: the probe's three requests would themselves clear a clearing pool's idle slots.

A new session gets the slot with the fewest sessions and keeps it for life, since moving a session
to another slot costs a full re-read (measured by
``test_d_evicted_session_returns_cheaply_on_its_slot_only`` in tests/contract/); where loopd has
several servers, a session has such a slot on each endpoint it ran on (``loopd.endpoints``).
A session's recorded slot stays its *lane* either way: ``LOOPD_SLOTS`` bounds how many of loopd's
turns run at once (one per lane, sessions on a lane in FIFO order; ``loopd.scheduler``).

The pool is also *shared* where idle slots are cleared (only a unified pool clears them): every
slot reports the whole pool as its context, and requests running at once share it
(``loopd.contextwindow.budget``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from loopd.engine.request import ANY_SLOT


class PinSlots(StrEnum):
    AUTO = "auto"
    YES = "yes"
    NO = "no"


@dataclass(frozen=True)
class Pinning:
    """How requests are sent, and what that rests on (one line for the log)."""

    pinned: bool
    # A unified pool that clears idle slots (the self-test's answer): None when unknown.
    idle_slots_cleared: bool | None
    why: str

    @property
    def shared_pool(self) -> bool:
        """Requests running at once share one context pool: known where idle slots are cleared
        (only a unified pool clears them)."""
        return self.idle_slots_cleared is True

    def id_slot(self, lane: int) -> int:
        """``id_slot`` for a request of a session on ``lane``."""
        return lane if self.pinned else ANY_SLOT


def decide_pinning(setting: PinSlots, *, selftest: bool | None, recorded: bool | None) -> Pinning:
    """Pin or not. ``selftest``: the self-test's pool answer (idle slots cleared) when it ran;
    ``recorded``: the answer in the model's expectations file."""
    known = selftest if selftest is not None else recorded
    source = "the self-test" if selftest is not None else "the recorded expectations"
    if setting is PinSlots.YES:
        return Pinning(True, known, "LOOPD_PIN_SLOTS=yes")
    if setting is PinSlots.NO:
        return Pinning(False, known, "LOOPD_PIN_SLOTS=no")
    if known is None:
        return Pinning(
            False, None, "the slot pool is unknown (no self-test, nothing recorded): not pinned"
        )
    if known:
        return Pinning(False, True, f"{source} found idle slots cleared: not pinned")
    return Pinning(True, False, f"{source} found idle slots kept: pinned")


def choose_slot(slots: Sequence[int], taken: Sequence[int]) -> int:
    """The one of ``slots`` the fewest sessions have (lowest id on a tie); ``taken``: the slot of
    each session there is (a slot outside ``slots`` counts for none)."""
    counts = Counter(taken)
    return min(slots, key=lambda slot: (counts[slot], slot))
