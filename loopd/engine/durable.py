"""Durable sessions: when loopd saves a session's slot state to the server's disk, when it
restores it, and when it trusts a restore. Pure; the I/O is ``loopd.turn.saves`` (the
saves loopd recorded) and ``InferenceClient.save_slot``/``restore_slot`` (the server's
``POST /slots/{id}?action=save|restore``).

The rule, and why:

- **Save at the end of a turn** (its last request completed): the slot then holds exactly the
  prompt loopd sent and the reply it logged, the prefix the session's next request extends
  (docs/design, invariant 1). A save is recorded as usable only after the server answered it
  with success: a save cut short (the server killed mid-write, the disk full) has no answer and
  is never restored, whatever file it left behind.
- **The file's name is the prefix's**: ``loopcommon.slotfiles`` names it from the session, the
  fingerprint of the model that wrote it (``loopd.engine.modelstate``: the model id, what the
  server reports of its weights, the template's sha256) and a hash of the epoch's tools and the
  exact messages the state holds, so a save is usable only for a request whose messages begin
  with exactly those, on the same weights (``usable``): a stale file, another session's, or one
  the old weights wrote, never matches. A save under another fingerprint is forgotten, never
  restored, and brokerd removes its file at the session's next save.
- **Restore only when the server lost the session**, told by the first ``prompt_progress``
  event of the session's next request: its ``cache`` count is what the server kept, after its
  own host prompt cache was consulted, and it arrives before any prefill work, so closing the
  request then costs nothing (docs/design, behaviour (l)). A count well below what the save
  holds (``worth_restoring``) closes the request, restores, and sends it again. Asking before
  every request instead (``GET /slots``) cannot tell which session a slot holds, and the
  previous request's ``cache_n`` tells only after the re-read was paid.
- **Where the server places requests** (``id_slot`` -1, ``loopd.engine.pinning``) a session has
  no slot of its own: its save comes from the slot its prefix read ran on (``last_run_slot``,
  the idle slot with the newest task), and a restore goes into an idle slot of loopd's that no
  other restore of loopd's is filling, the one used longest ago (``restore_target``: on a pool
  that clears idle slots it holds nothing; elsewhere the least likely to be wanted next), and
  the request sent again names that slot, so the server reads on from the restored state.
- **A restore is trusted only once confirmed** by the next request's ``cache_n``
  (``confirmed``): a server can answer a restore with success and still re-read everything. A
  save that does not confirm, or that the server refused, is never tried again (the record is
  dropped) and the loss is recorded with its cause.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from loopcommon.slotfiles import FINGERPRINT_HEX, slot_file_name

# A restore is worth its round trip when the server kept less than half of the saved state, or
# when it would re-read at least this many tokens (about a micro-batch: less than that is read in
# well under a second on production, and a hybrid model's usual resume at its checkpoint, a few
# tokens before the previous prompt's end, loses only the reply).
RESTORE_GAIN_TOKENS: Final = 512
# The server re-evaluates at least the last prompt token, and a template may join a turn's end
# differently: a confirmed restore may fall short of the saved count by this much.
CONFIRM_TOLERANCE: Final = 4


class DurableMode(StrEnum):
    AUTO = "auto"  # on where the server's save and restore round-trip (the self-test's probe)
    ON = "on"
    OFF = "off"


@dataclass(frozen=True)
class Durability:
    """Whether loopd saves and restores a server's sessions, and why (one line for the log)."""

    on: bool
    why: str


def decide_durable(
    mode: DurableMode, *, selftest: bool | None, recorded: bool | None
) -> Durability:
    """Durable sessions or not. ``on`` and ``off`` are the operator's word; ``auto`` needs the
    probe's yes: the self-test's (``selftest``) where it ran in this process (``loopd serve``),
    else the answer ``loopd selftest --record`` stored (``recorded``: ``loopd chat``, ``loopd
    run``), as the pinning rule does (``loopd.engine.pinning``). None: not known."""
    if mode is not DurableMode.AUTO:
        return Durability(mode is DurableMode.ON, f"LOOPD_DURABLE={mode.value}")
    known = selftest if selftest is not None else recorded
    source = "the self-test" if selftest is not None else "the recorded expectations"
    if known is None:
        return Durability(False, "no save probe (no self-test, nothing recorded): off")
    if known:
        return Durability(True, f"{source} found a slot saved and restored")
    return Durability(False, f"{source} found no save and restore (no --slot-save-path?)")


def state_prefix(tools_text: str, messages: Sequence[str]) -> bytes:
    """The exact prefix a slot state belongs to: the epoch's tools and the messages array as
    sent (``[`` + messages joined by ``,`` + ``]``), tools first as the template renders them."""
    tools = tools_text.encode("utf-8")
    array = b"[" + b",".join(m.encode("utf-8") for m in messages) + b"]"
    return len(tools).to_bytes(8, "little") + tools + array


def save_name(session: str, tools_text: str, messages: Sequence[str], fingerprint: str) -> str:
    """The file that holds ``session``'s state after exactly ``messages``, as the model of
    ``fingerprint`` wrote it."""
    return slot_file_name(session, state_prefix(tools_text, messages), fingerprint=fingerprint)


@dataclass(frozen=True)
class Saved:
    """A save the server answered with success: usable while the session's messages extend it."""

    file: str
    message_count: int  # the messages the state holds (the request's and the reply)
    n_saved: int  # tokens the server said it wrote
    slot: int
    endpoint: str | None = None
    fingerprint: str | None = None  # the model that wrote it (None: a record from before)
    instance: str | None = None  # the model's process then (``ModelReading.instance``)


def moved(saved: Saved, endpoint: str | None) -> bool:
    """``saved`` was made on another server than ``endpoint`` (the session moved since)."""
    return saved.endpoint != endpoint


def usable(
    saved: Saved | None,
    *,
    session: str,
    tools_text: str,
    messages: Sequence[str],
    slot: int | None,
    fingerprint: str | None,
    endpoint: str | None = None,
) -> Saved | None:
    """``saved`` when the request about to go out extends exactly the prefix it holds, on the
    same slot (``slot`` None: requests placed by the server, any slot may take a restore) and
    model (``fingerprint``, as the server reports it now; None: not known, so nothing is
    restored); else None (another epoch, a rewritten history, another session,
    other weights). A save another server made (``moved``: the session moved off it) is usable
    on this one where the model is the same, into whichever slot the session has here: brokerd
    copies the file between their save folders (docs/deployment.md)."""
    if saved is None:
        return None
    if fingerprint is None or saved.fingerprint != fingerprint:
        return None
    if slot is not None and saved.slot != slot and not moved(saved, endpoint):
        return None
    if saved.message_count > len(messages) or saved.n_saved <= 0:
        return None
    if save_name(session, tools_text, messages[: saved.message_count], fingerprint) != saved.file:
        return None
    return saved


def worth_restoring(saved: Saved, cache: int) -> bool:
    """The first progress event says the server kept ``cache`` tokens: restore when it lost
    enough of what the save holds to be worth a restore's round trip."""
    gain = saved.n_saved - cache
    if gain <= CONFIRM_TOLERANCE:
        return False
    return cache * 2 < saved.n_saved or gain >= RESTORE_GAIN_TOKENS


def _idle(
    slots: Sequence[Mapping[str, Any]], allowed: Collection[int] | None
) -> list[tuple[int, int]]:
    """``(slot id, its latest task id)`` of each idle slot in a ``/slots`` answer, of
    ``allowed`` only unless it is None (a slot that never ran a task: -1)."""
    found = []
    for entry in slots:
        slot, task = entry.get("id"), entry.get("id_task")
        if not isinstance(slot, int) or entry.get("is_processing"):
            continue
        if allowed is not None and slot not in allowed:
            continue
        found.append((slot, task if isinstance(task, int) else -1))
    return found


def last_run_slot(slots: Sequence[Mapping[str, Any]]) -> int | None:
    """The idle slot that ran the newest task: where a request the server
    placed, just completed, ran (task ids grow). None when no idle slot ran one. Another
    client's task launched since would be named instead; the save's token count then differs
    from the prefix read's and it is not used (``DurableSlots.save``)."""
    ran = [(task, slot) for slot, task in _idle(slots, None) if task >= 0]
    return max(ran)[1] if ran else None


def restore_target(
    slots: Sequence[Mapping[str, Any]], allowed: Collection[int], claimed: Collection[int]
) -> int | None:
    """The idle slot of ``allowed`` to restore into, outside ``claimed`` (restores of loopd's
    under way): the one whose latest task is oldest (lowest id on a tie). None: none idle."""
    free = [(task, slot) for slot, task in _idle(slots, allowed) if slot not in claimed]
    return min(free)[1] if free else None


class RestoreOutcome(StrEnum):
    """What became of a restore, as the cache-loss rule and ``loopd perf`` name it."""

    RESTORED = "restored from disk"
    REFUSED = "restore refused"  # the server answered an error (file gone, no save folder, ...)
    UNCONFIRMED = "restore unconfirmed"  # answered success, but the next request re-read


def confirmed(n_restored: int, held_before: int, cache_n: int) -> bool:
    """The request after a restore reused what the restore put back: more than the server held
    before it, and at least half of the restored tokens (the rest can be a reply the template
    re-tokenizes differently). The known trap: a success answer, then ``cache_n`` 0."""
    return cache_n > held_before + CONFIRM_TOLERANCE and cache_n * 2 >= n_restored


def after_restore(n_restored: int | None, held_before: int, cache_n: int) -> RestoreOutcome:
    """The verdict on a restore: refused (no answer of success: ``n_restored`` None), confirmed,
    or answered and not confirmed."""
    if n_restored is None:
        return RestoreOutcome.REFUSED
    if confirmed(n_restored, held_before, cache_n):
        return RestoreOutcome.RESTORED
    return RestoreOutcome.UNCONFIRMED


def probe_name(model: str) -> str:
    """The self-test's own probe file: under a session name no thread can have, bound to the
    model id alone (the probe restores it at once, into the weights that wrote it)."""
    bound = hashlib.sha256(model.encode("utf-8")).hexdigest()[:FINGERPRINT_HEX]
    return slot_file_name("\0loopd-selftest", model.encode("utf-8"), fingerprint=bound)
