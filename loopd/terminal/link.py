"""The terminal's two threads: the main one reads the keyboard, the event loop runs the session.

readline belongs in the main thread: that is where Python delivers Ctrl-C (SIGINT), and where
readline puts the terminal back as it was when a read is interrupted. So the event loop runs in a
thread of its own (an anyio blocking portal) and the main thread hands it each turn. Ctrl-C while
a turn runs interrupts the main thread's wait; the turn is stopped on the event loop and waited
for, and the chat goes on. Ctrl-C anywhere else is the caller's to handle.
"""

from __future__ import annotations

import contextlib
import getpass
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from anyio.from_thread import BlockingPortal, start_blocking_portal

from loopd.chat.status import InLine
from loopd.config import Settings
from loopd.engine.progress import Status
from loopd.selftest.expected import DEFAULT_DIR
from loopd.terminal.core import ChatCore, TurnEnd, Watcher
from loopd.terminal.render import TurnView
from loopd.wire.assemble import ToolCall


def local_user() -> str:
    """Who a stop is recorded for (``stopped by @<user>``)."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no name for this uid (a container without a passwd entry)
        return "terminal"


@dataclass
class ScreenWatch:
    """A turn's watcher: renders it as it goes (``TurnView``) and keeps its tool calls."""

    view: TurnView
    out: TextIO
    tool_calls: list[dict[str, str]] = field(default_factory=list)

    def write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.out.flush()

    def status(self, status: Status) -> None:
        self.write(self.view.status(status))

    def in_line(self, in_line: InLine) -> None:
        self.write(self.view.in_line(in_line))

    def tool_started(self, call: ToolCall) -> None:
        self.write(self.view.tool_started(call.name, call.arguments))

    def tool_finished(self, call: ToolCall, result: str) -> None:
        self.tool_calls.append(
            {"id": call.id, "name": call.name, "arguments": call.arguments, "result": result}
        )
        self.write(self.view.tool_finished(result))


@dataclass
class Link:
    portal: BlockingPortal
    core: ChatCore

    def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """Run ``function`` on the event loop and wait for it."""
        return self.portal.call(function, *args)

    def turn(self, start: Callable[[Watcher], Any], watcher: Watcher) -> TurnEnd | None:
        """Run a turn (``start(watcher)``, a coroutine function of the core) and wait for its
        end; Ctrl-C meanwhile stops it and keeps waiting for it to end (in milliseconds)."""
        future: Future[TurnEnd | None] | None = None
        while True:
            try:
                if future is None:
                    # A Ctrl-C while the turn is being started (held since the caller began it,
                    # or from here) waits until the turn runs, and then stops it: the turn is
                    # never left running unstoppable, nor the chat ended by that Ctrl-C.
                    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
                    future = self.portal.start_task_soon(start, watcher)
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
                return future.result()
            except KeyboardInterrupt:
                if future is not None:
                    self._stop()

    def _stop(self) -> None:
        while True:
            try:
                self.portal.call(self.core.stop)
            except KeyboardInterrupt:  # pressed again: the stop is asked for all the same
                continue
            else:
                return


@contextlib.contextmanager
def sigint_held() -> Iterator[None]:
    """Ctrl-C waits while the block runs (the signal stays pending, delivered after it)."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def drop_pending_sigint() -> None:
    """Forget a Ctrl-C that came while it was held (the work it would have stopped is done)."""
    if signal.SIGINT in signal.sigpending():
        signal.sigwait({signal.SIGINT})


@contextlib.contextmanager
def connected(settings: Settings, session: str, expected_dir: Path = DEFAULT_DIR) -> Iterator[Link]:
    """The event loop in its thread, the session opened on it (the server's health checked,
    the session created on first use), and its background work running until the block ends.
    ``expected_dir``: the servers' recorded expectations (``ChatCore.open``)."""
    with _event_loop_thread() as portal:
        core: ChatCore = portal.call(ChatCore.open, settings, session, local_user(), expected_dir)
        service = portal.start_task_soon(core.serve)
        try:
            yield Link(portal, core)
        finally:
            with contextlib.suppress(KeyboardInterrupt):
                portal.call(core.close)
                service.result()


@contextlib.contextmanager
def _event_loop_thread() -> Iterator[BlockingPortal]:
    """The portal, its thread started with SIGINT and SIGTSTP blocked (and so every thread it
    starts).

    A signal goes to any one thread that does not block it. Were it the event loop's, the main
    thread would go on waiting in readline's ``select`` until the next key, since only the thread
    that takes a signal sees its call interrupted; and Ctrl-Z is acted on by the main thread
    (``loopd.terminal.suspend``).
    """
    with contextlib.ExitStack() as stack:
        before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTSTP})
        try:
            portal = stack.enter_context(start_blocking_portal(backend="asyncio"))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
        yield portal
