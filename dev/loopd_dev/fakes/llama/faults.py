"""Fault switches, settable in-process or over ``POST /_fake/faults``.

Boolean switches and counts hold until cleared. Stream faults are :class:`Trigger` s: they fire
after a number of ``data:`` events and hit a number of streams (or all of them). A stall lasts
until its switch is cleared or the client hangs up.
"""

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import anyio


@dataclass
class Trigger:
    """Fire after ``after`` data events, on the next ``count`` streams (None: every stream)."""

    after: int = 0
    count: int | None = None

    def take(self) -> bool:
        """Arm for one more stream, using up one of ``count``."""
        if self.count is None:
            return True
        if self.count <= 0:
            return False
        self.count -= 1
        return True


@dataclass
class Faults:
    """Every switch, off by default."""

    loading: bool = False  # 503 "Loading model" on every route (caches are lost)
    sleeping: bool = False  # model asleep: most routes block until cleared (caches are lost)
    hang_all: bool = False  # a hung process: every route accepts and never answers
    stall_before_first_byte: bool = False  # the task holds its slot and sends nothing
    slots_hang: bool = False  # GET /slots blocks too (the main loop is stuck)
    byte_while_queued: bool = False  # WRONG on purpose: headers and a ping while queued
    http_500: Trigger | None = None  # chat requests answer 500 (``after`` unused)
    stall_mid_stream: Trigger | None = None  # silence after N events, until cleared
    drop_mid_stream: Trigger | None = None  # the connection closes after N events
    malformed_chunk: Trigger | None = None  # one broken JSON event after N events
    error_mid_stream: Trigger | None = None  # an error event after N events, no [DONE]
    # The control call reaches its completion (and is answered) only after the completion wrote
    # this many more tokens: a loaded machine's round trip, counted in tokens.
    control_round_trip: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_TRIGGERS = {
    "http_500",
    "stall_mid_stream",
    "drop_mid_stream",
    "malformed_chunk",
    "error_mid_stream",
}
_COUNTS = {"control_round_trip"}
_SWITCHES = {f.name for f in fields(Faults)} - _TRIGGERS - _COUNTS


@dataclass(frozen=True)
class StreamFaults:
    """The stream faults one stream was armed with when it started."""

    stall: Trigger | None = None
    drop: Trigger | None = None
    malformed: Trigger | None = None
    error: Trigger | None = None


@dataclass
class FaultBoard:
    """The live switches, plus a way to wait until they change."""

    faults: Faults = field(default_factory=Faults)
    _changed: anyio.Event = field(default_factory=anyio.Event)
    on_cold: Callable[[], None] | None = None

    def set(self, **changes: Any) -> Faults:
        """Change some switches; a stream fault may be a Trigger, a dict, True, or None."""
        updates: dict[str, Any] = {}
        for name, value in changes.items():
            if name in _TRIGGERS:
                updates[name] = _trigger(name, value)
            elif name in _SWITCHES:
                if not isinstance(value, bool):
                    raise ValueError(f"fault {name!r} takes true or false, got {value!r}")
                updates[name] = value
            elif name in _COUNTS:
                if type(value) is not int or value < 0:
                    raise ValueError(f"fault {name!r} takes a count of tokens, got {value!r}")
                updates[name] = value
            else:
                raise ValueError(f"unknown fault {name!r}")
        goes_cold = any(
            updates.get(k) and not getattr(self.faults, k) for k in ("loading", "sleeping")
        )
        self.faults = replace(self.faults, **updates)
        if goes_cold and self.on_cold is not None:
            self.on_cold()
        self._notify()
        return self.faults

    def clear(self) -> None:
        self.faults = Faults()
        self._notify()

    async def wait_until(self, ready: Callable[[Faults], bool]) -> None:
        """Block until ``ready(faults)`` holds."""
        while not ready(self.faults):
            await self._changed.wait()

    def arm_stream(self) -> StreamFaults:
        """Pick the stream faults for a stream that starts now."""
        f = self.faults
        return StreamFaults(
            stall=_arm(f.stall_mid_stream),
            drop=_arm(f.drop_mid_stream),
            malformed=_arm(f.malformed_chunk),
            error=_arm(f.error_mid_stream),
        )

    def take_http_500(self) -> bool:
        trigger = self.faults.http_500
        return trigger is not None and trigger.take()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()


def _arm(trigger: Trigger | None) -> Trigger | None:
    if trigger is None or not trigger.take():
        return None
    return Trigger(trigger.after, 1)


def _trigger(name: str, value: Any) -> Trigger | None:
    if value is None or value is False:
        return None
    if value is True:
        return Trigger()
    if isinstance(value, Trigger):
        return value
    if isinstance(value, dict) and set(value) <= {"after", "count"}:
        return Trigger(int(value.get("after", 0)), value.get("count"))
    raise ValueError(
        f"fault {name!r} takes null, true or {{'after': N, 'count': M}}, got {value!r}"
    )
