"""A stop signal is acted on whenever it comes: before the event loop runs, or once it serves."""

from __future__ import annotations

import signal

import anyio
import pytest

from loopcommon.stopsignals import StopSignals


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_before_the_loop_starts_is_the_first_one_the_receiver_reports(
    sig: signal.Signals,
) -> None:
    with StopSignals() as signals:
        signal.raise_signal(sig)  # no KeyboardInterrupt, no death: recorded
        assert anyio.run(signals.wait) is sig


def test_a_signal_once_the_receiver_waits_is_reported() -> None:
    async def main(signals: StopSignals) -> signal.Signals:
        async with anyio.create_task_group() as tg:
            received: list[signal.Signals] = []

            async def receive() -> None:
                received.append(await signals.wait())

            tg.start_soon(receive)
            await anyio.wait_all_tasks_blocked()  # the receiver is open and waiting
            signal.raise_signal(signal.SIGINT)
        return received[0]

    with StopSignals() as signals:
        assert anyio.run(main, signals) is signal.SIGINT


def test_the_handlers_before_it_are_put_back() -> None:
    before = signal.getsignal(signal.SIGINT)
    with StopSignals():
        assert signal.getsignal(signal.SIGINT) is not before
    assert signal.getsignal(signal.SIGINT) is before
