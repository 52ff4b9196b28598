"""A daemon's stop signals (SIGINT, SIGTERM), recorded from before its event loop starts.

Until a daemon's signal receiver is in place, asyncio's runner turns a SIGINT into a cancellation
of the main task, and a cancellation that lands in a library's start-up (a server binding its
socket, an app's lifespan) can be absorbed there: the daemon then serves on, deaf to that Ctrl-C.
So the daemon records both signals with a plain handler from the moment it decides to serve (the
runner leaves a handler it did not install alone), and its receiver, once open, acts first on any
signal that came before it.
"""

from __future__ import annotations

import signal
from types import FrameType, TracebackType
from typing import Final

import anyio

STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """``with StopSignals() as signals: anyio.run(...)``; inside the loop, ``await signals.wait()``.

    The handlers it replaces are put back when the ``with`` ends."""

    def __init__(self) -> None:
        self._early: list[signal.Signals] = []
        self._before: dict[signal.Signals, object] = {}

    def __enter__(self) -> StopSignals:
        self._before = {sig: signal.signal(sig, self._record) for sig in STOP_SIGNALS}
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        for sig, handler in self._before.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]  # what signal.signal returned

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self._early.append(signal.Signals(signum))

    def received(self) -> signal.Signals | None:
        """The first stop signal that came while no receiver was open, if one did."""
        return self._early[0] if self._early else None

    async def wait(self) -> signal.Signals:
        """The first stop signal: one that came before this receiver opened, or the next one."""
        with anyio.open_signal_receiver(*STOP_SIGNALS) as received:
            if (early := self.received()) is not None:
                return early
            async for signum in received:
                return signal.Signals(signum)
        raise AssertionError("a signal receiver does not end")  # pragma: no cover
