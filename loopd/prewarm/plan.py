"""Which session to prewarm when a slot falls idle: the pure rules, no I/O.

A prewarm pays off for a session whose prompt is no longer in its slot but will be needed soon:

- after a **compaction**, the session's new epoch has been read once, by the turn that compacted;
  if another session then takes the slot, the next turn of the compacted session would read the
  whole new epoch again;
- after a **restart** (of loopd, and often of the server with it), nothing is known to be in any
  slot, so the most recently active session of each slot is the one to read back.

So a session is *wanted* after either event, and a prewarm runs for it only while the slot is
idle and the slot does not already hold it (the last session that used the slot is known; after
a restart none is). A session's own real turn clears its want: that turn reads what it needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass
class PrewarmPlan:
    # session -> its slot, in the order the sessions were wanted (latest last).
    _wanted: dict[str, int] = field(default_factory=dict)
    # slot -> the session whose prompt the slot holds (after a real turn or a prewarm).
    _holds: dict[int, str] = field(default_factory=dict)

    def want(self, session: str, slot: int) -> None:
        """Prewarm ``session`` the next time its slot is idle and holds another prompt."""
        self._wanted.pop(session, None)
        self._wanted[session] = slot

    def drop(self, session: str) -> None:
        """No prewarm for ``session``: its real turn reads its own prompt (or a prewarm of it
        failed, and is not tried again until it is wanted again)."""
        self._wanted.pop(session, None)

    def used(self, session: str, slot: int) -> None:
        """``slot`` now holds ``session``'s prompt (a turn or a prewarm of it ran there)."""
        self._holds[slot] = session

    def warmed(self, session: str, slot: int) -> None:
        """A prewarm of ``session`` completed."""
        self._wanted.pop(session, None)
        self.used(session, slot)

    def next_for(self, slot: int) -> str | None:
        """The session to prewarm on idle ``slot``: the latest wanted one, unless the slot
        already holds it (then nothing: another session's prompt is not worth reading in)."""
        on_slot = [name for name, s in self._wanted.items() if s == slot]
        if not on_slot:
            return None
        latest = on_slot[-1]
        return None if self._holds.get(slot) == latest else latest

    def wanted(self) -> dict[str, int]:
        return dict(self._wanted)


def restart_wants(
    slots: Mapping[str, int], last_active: Mapping[str, int], busy: Iterable[str]
) -> list[tuple[str, int]]:
    """After a restart, per slot: the most recently active session, for a slot where no turn is
    pending (``busy``: a resumed turn reads its own prompt, and its session is then the likeliest
    to speak next, so its slot is left alone). ``slots`` maps session to slot, ``last_active``
    session to the id of its latest log entry (ids grow with time)."""
    busy_slots = {slots[name] for name in busy if name in slots}
    latest: dict[int, tuple[int, str]] = {}
    for name, slot in slots.items():
        if slot in busy_slots or name not in last_active:
            continue
        if slot not in latest or last_active[name] > latest[slot][0]:
            latest[slot] = (last_active[name], name)
    return [(name, slot) for slot, (_, name) in sorted(latest.items())]
