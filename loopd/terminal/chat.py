"""``loopd chat``: a terminal thread on the same engine as the Mattermost threads.

One turn per message. On a terminal: the answer streams as it is written and tool calls show as
they run (``render``), the line can be edited and a paste is one message (``lineinput``), ``/``
commands do the common things (``slash``), keys typed while a turn runs wait for the next prompt
without being drawn inside the answer (``typeahead``), Ctrl-C stops the turn under way and the chat
goes on, and at the prompt Ctrl-C or Ctrl-D leaves. Logs go to a file in the state dir, named once
at start (``logfile``). A turn left pending by an earlier run is finished first, unless it was
stopped.

With piped input it answers each line; with stdout not a terminal, only the answers go there. A
failed turn with piped input ends the chat with exit status 2 (its message on stderr), so a script
can tell.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Final, TextIO

from loopcommon.errors import DaemonError
from loopcommon.sanitize import for_terminal
from loopd.cli.log import list_sessions, search_entries
from loopd.config import Settings
from loopd.engine.outcome import TurnOutcome
from loopd.terminal import slash
from loopd.terminal.approve import TerminalAsker
from loopd.terminal.core import ChatCore, SessionExists, Stopped, TurnEnd, Watcher
from loopd.terminal.lineinput import LineInput, PipedInput, TerminalInput
from loopd.terminal.link import Link, ScreenWatch, connected, drop_pending_sigint, sigint_held
from loopd.terminal.logfile import logs_out_of_the_way
from loopd.terminal.render import DIM, RESET, Style, TurnView
from loopd.terminal.typeahead import typed_keys_unechoed

HISTORY_FILE: Final = "chat_history"
EXIT_FAILED: Final = 2


@dataclass(frozen=True)
class ChatOptions:
    session: str = "terminal"
    show_thinking: bool = False
    log_stderr: bool = False


def run_chat(settings: Settings, options: ChatOptions) -> int:
    with logs_out_of_the_way(settings, on_stderr=options.log_stderr) as log_path:
        interactive = sys.stdin.isatty()
        lines: LineInput = (
            TerminalInput(settings.state_dir / HISTORY_FILE)
            if interactive
            else PipedInput(sys.stdin)
        )
        with connected(settings, options.session) as link:
            if isinstance(lines, TerminalInput):
                lines.complete_with(
                    lambda before: slash.completions(before, link.call(link.core.session_names))
                )
            if isinstance(link.core.asker, TerminalAsker):
                # What was typed ahead of an approval question waits at the next prompt.
                link.core.asker.give_back = lines.offer
            chat = TerminalChat(link, lines, options, interactive=interactive)
            return chat.run(settings.db_path, log_path)


class TerminalChat:
    """The conversation loop, on the main thread."""

    def __init__(
        self,
        link: Link,
        lines: LineInput,
        options: ChatOptions,
        *,
        interactive: bool,
        out: TextIO | None = None,
        err: TextIO | None = None,
    ) -> None:
        self.link = link
        self.lines = lines
        self.options = options
        self.interactive = interactive
        self.out = out if out is not None else sys.stdout
        self.err = err if err is not None else sys.stderr
        self.style = Style.TERMINAL if self.out.isatty() else Style.PLAIN

    @property
    def core(self) -> ChatCore:
        return self.link.core

    def run(self, db_path: Path, log_path: Path | None) -> int:
        self._welcome(log_path)
        if not self._turn(self.core.resume) and not self.interactive:
            return EXIT_FAILED
        while True:
            try:
                text = self.lines.read()
            except KeyboardInterrupt:  # at the prompt: leave
                self._write(self.out, "\n")
                return 0
            if text is None:
                if self.interactive:
                    self._write(self.out, "\n")
                return 0
            text = text.strip()
            if not text:
                continue
            command = slash.parse(text)
            if isinstance(command, slash.UnknownSlash):
                self._write(self.err, command.message() + "\n")
            elif isinstance(command, slash.Slash):
                if command.name == "quit":
                    return 0
                self._command(command, db_path)
            elif not self._turn(self._say(text)) and not self.interactive:
                return EXIT_FAILED

    # -- turns -----------------------------------------------------------------------------------

    def _say(self, text: str) -> Callable[[Watcher], Awaitable[TurnEnd]]:
        async def say(watcher: Watcher) -> TurnEnd:
            return await self.core.say(text, watcher)

        return say

    def _turn(self, start: Callable[[Watcher], Awaitable[TurnEnd | None]]) -> bool:
        """Run a turn and show how it ended; False when it failed."""
        # From the line's Enter on, a Ctrl-C is held until the turn runs, and then stops it
        # (``Link.turn`` lets it through once the turn has started).
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            size = shutil.get_terminal_size()
            view = TurnView(
                self.style,
                show_thinking=self.options.show_thinking,
                width=size.columns,
                height=size.lines,
                markdown=True,
            )
        except BaseException:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            raise
        # Keys typed meanwhile wait for the next prompt, unechoed: the answer is drawn whole.
        with typed_keys_unechoed(sys.stdin) if self.interactive else contextlib.nullcontext():
            end = self.link.turn(start, ScreenWatch(view, self.out))
            # The turn has ended: a Ctrl-C while its end is drawn has nothing left to stop.
            with sigint_held():
                try:
                    if isinstance(end, Stopped):
                        self._write(self.out, view.stopped())
                    elif isinstance(end, TurnOutcome):
                        shown = view.finished(end)
                        self._write(self.out, shown.out)
                        self._write(self.err, shown.err)
                        return end.failure is None
                    return True
                finally:
                    drop_pending_sigint()

    # -- the rest --------------------------------------------------------------------------------

    def _command(self, command: slash.Slash, db_path: Path) -> None:
        match command.name:
            case "help":
                self._write(self.out, slash.HELP + "\n")
            case "new":
                name = command.argument or slash.new_session_name(datetime.now())
                try:
                    session = self.link.call(self.core.new_session, name)
                except SessionExists as exc:
                    self._write(self.err, f"loopd: {for_terminal(str(exc))}\n")
                    self.lines.offer(f"/resume {exc.name}")
                    return
                except DaemonError as exc:
                    self._write(self.err, f"loopd: {for_terminal(str(exc))}\n")
                    return
                self._write(self.out, f"new session {session.name!r} (slot {session.slot})\n")
            case "resume":
                self._resume(command.argument)
            case "search":
                self._search(command.argument, db_path)
            case "sessions":
                listing, problem = io.StringIO(), io.StringIO()
                list_sessions(db_path, listing, problem)
                # Session names and what they wait for can hold anything a thread was named.
                self._write(self.out, self._shown(listing.getvalue()))
                self._write(self.err, for_terminal(problem.getvalue()))
                self._write(self.out, f"(this chat: {self.core.session.name})\n")
            case "perf":
                self._write(self.out, self.link.call(self.core.perf_text) + "\n")

    def _resume(self, name: str) -> None:
        if not name:
            self._write(self.err, "loopd: /resume takes a session's name (Tab completes it)\n")
            return
        try:
            session = self.link.call(self.core.switch_to, name)
        except DaemonError as exc:
            self._write(self.err, f"loopd: {for_terminal(str(exc))}\n")
            return
        shown = for_terminal(session.name)
        self._write(self.out, f"resumed session {shown!r} (slot {session.slot})\n")
        # A turn that session left pending is finished now, as at the chat's start.
        self._turn(self.core.resume)

    def _search(self, words: str, db_path: Path) -> None:
        if not words.strip():
            self._write(self.err, "loopd: /search takes the words to look for\n")
            return
        found, problem = io.StringIO(), io.StringIO()
        search_entries(db_path, words.split(), found, problem)
        # The lines quote what the model, a tool or a person wrote.
        self._write(self.out, self._shown(found.getvalue()))
        self._write(self.err, for_terminal(problem.getvalue()))

    def _welcome(self, log_path: Path | None) -> None:
        """One line on a terminal: the session, how to get help and leave, where the logs go."""
        if not self.interactive:
            if log_path is not None:
                self._write(self.err, f"loopd: logs go to {log_path}\n")
            return
        session = self.core.session
        line = (
            f"loopd chat: session {session.name!r} on slot {session.slot}. /help for commands; "
            "Ctrl-C stops a turn; Ctrl-D leaves."
        )
        if log_path is not None:
            line += f"\nlogs: {log_path}"
        dim, reset = (DIM, RESET) if self.err.isatty() else ("", "")
        self._write(self.err, f"{dim}{line}{reset}\n")

    def _shown(self, text: str) -> str:
        """Text from the log, made safe when stdout is a terminal (piped, it is data)."""
        return for_terminal(text) if self.style is Style.TERMINAL else text

    @staticmethod
    def _write(stream: TextIO, text: str) -> None:
        if text:
            stream.write(text)
            stream.flush()
