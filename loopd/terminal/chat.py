"""``loopd chat``: a terminal thread on the same engine as the Mattermost threads.

One turn per message. On a terminal: the answer streams as it is written and tool calls show as
they run (``render``), the line can be edited and a paste is one message (``lineinput``, a long
one drawn as ``[pasted N lines]``: ``paste``), ``/`` commands do the common things (``slash``),
keys typed while a turn runs are not drawn inside the answer, and when it ends each line ended with
Enter is shown and sent and the line begun waits on the prompt (``typeahead``). Ctrl-C stops the
turn under way and the chat goes on, with what was typed meanwhile back on the prompt; at the
prompt Ctrl-C or Ctrl-D leaves. Ctrl-Z suspends the chat and ``fg`` brings it back (``suspend``).
A session is one terminal's at a time (``inuse``). Logs go to a file in the state dir, named once
at start (``logfile``). A turn left pending by an earlier run (cut by a crash) is finished first;
a turn that ended, however it ended, is not run again (``/retry`` runs it again).

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
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Final, TextIO

from loopcommon.errors import DaemonError
from loopcommon.sanitize import for_terminal
from loopd.config import Settings
from loopd.engine.outcome import TurnOutcome
from loopd.logviews import list_sessions, search_entries
from loopd.selftest.expected import DEFAULT_DIR
from loopd.terminal import slash
from loopd.terminal.approve import TerminalAsker
from loopd.terminal.core import ChatCore, SessionExists, Stopped, TurnEnd, Watcher
from loopd.terminal.lineinput import PROMPT, LineInput, NotText, PipedInput, TerminalInput
from loopd.terminal.link import Link, ScreenWatch, connected, drop_pending_sigint, sigint_held
from loopd.terminal.logfile import logs_out_of_the_way
from loopd.terminal.render import DIM, RESET, Style, TurnView
from loopd.terminal.suspend import Suspender
from loopd.terminal.typeahead import split_typed, take_typed, typed_keys_unechoed

HISTORY_FILE: Final = "chat_history"
EXIT_FAILED: Final = 2


@dataclass(frozen=True)
class ChatOptions:
    session: str = "terminal"
    show_thinking: bool = False
    log_stderr: bool = False
    expected_dir: Path = DEFAULT_DIR  # the servers' recorded expectations


def run_chat(settings: Settings, options: ChatOptions) -> int:
    with logs_out_of_the_way(settings, on_stderr=options.log_stderr) as log_path:
        interactive = sys.stdin.isatty()
        suspender = Suspender(sys.stdin.fileno()) if interactive else None
        lines: LineInput = (
            TerminalInput(settings.state_dir / HISTORY_FILE, suspender)
            if interactive
            else PipedInput(sys.stdin)
        )
        with (
            suspender.installed() if suspender is not None else contextlib.nullcontext(),
            connected(settings, options.session, options.expected_dir) as link,
        ):
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
        # Typed while a turn ran: the lines ended with Enter, each sent in turn, and the line
        # begun, put on the prompt once they are.
        self.typed: deque[str] = deque()
        self.begun = ""

    @property
    def core(self) -> ChatCore:
        return self.link.core

    def run(self, db_path: Path, log_path: Path | None) -> int:
        self._welcome(log_path)
        if not self._turn(self.core.resume) and not self.interactive:
            return EXIT_FAILED
        while True:
            try:
                text = self._next_message()
            except KeyboardInterrupt:  # at the prompt: leave
                self._write(self.out, "\n")
                return 0
            except NotText as exc:  # said in one line; a script is told by the exit status
                self._write(self.err, f"loopd: {exc}\n")
                if not self.interactive:
                    return EXIT_FAILED
                continue
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

    def _next_message(self) -> str | None:
        """A line typed during the last turn, shown as sent; else the prompt's line (the line
        begun then is on it)."""
        if self.typed:
            text = self.typed.popleft()
            self._write(self.out, f"{PROMPT}{text}\n")
            return text
        if self.begun:
            self.lines.offer(self.begun)
            self.begun = ""
        return self.lines.read()

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
        # Keys typed meanwhile wait, unechoed: the answer is drawn whole.
        with typed_keys_unechoed(sys.stdin) if self.interactive else contextlib.nullcontext():
            end = self.link.turn(start, ScreenWatch(view, self.out))
            # The turn has ended: a Ctrl-C while its end is drawn has nothing left to stop.
            with sigint_held():
                try:
                    self._keep_typed(stopped=isinstance(end, Stopped))
                    if isinstance(end, Stopped):
                        self._write(self.out, view.stopped() + view.notices(end.notices))
                    elif isinstance(end, TurnOutcome):
                        shown = view.finished(end)
                        self._write(self.out, shown.out)
                        self._write(self.err, shown.err)
                        return end.failure is None
                    return True
                finally:
                    drop_pending_sigint()

    def _keep_typed(self, *, stopped: bool) -> None:
        """What was typed during the turn: after a stop, all of it back on the prompt (to send
        or edit); else each line ended with Enter is sent next, and the line begun waits."""
        if not self.interactive:
            return
        # The line begun before this turn goes on with what was typed during it.
        ended, begun = split_typed(self.begun + take_typed(sys.stdin))
        if stopped:
            self.begun = "\n".join([*self.typed, *ended, *([begun] if begun else [])])
            self.typed.clear()
        else:
            self.typed.extend(ended)
            self.begun = begun

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
                self._write(self.out, f"new session {for_terminal(session.name)!r}\n")
            case "resume":
                self._resume(command.argument)
            case "retry":
                self._retry()
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
        self._write(self.out, f"resumed session {shown!r}\n")
        # A turn that session left pending is finished now, as at the chat's start.
        self._turn(self.core.resume)

    def _retry(self) -> None:
        """The latest turn again: a new answer (the one shown stays in the log), or the turn
        that ended without one; one line when there is neither."""
        try:
            self.link.call(self.core.check_retry)
        except DaemonError as exc:
            self._write(self.err, f"loopd: /retry: {for_terminal(str(exc))}\n")
            return
        self._turn(self.core.retry)

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
            f"loopd chat: session {for_terminal(session.name)!r}. /help for commands; "
            "Ctrl-C stops a turn; Ctrl-Z suspends; Ctrl-D leaves."
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
