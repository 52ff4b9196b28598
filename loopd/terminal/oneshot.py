"""``loopd run "PROMPT"``: one turn, not interactive, the answer on stdout.

The turn is the chat's (same engine, session log and tools); on a terminal it is shown the same
way as it runs. ``--json`` writes one JSON object instead: the session, the answer, how the turn
ended, its tool calls with their results, and the perf record of each request it made. Without
``--session`` each run is a session of its own (``run-<date>-<time>-<4 hex>``); ``PROMPT`` ``-``
reads the prompt from stdin.

Exit status (``EXIT_*``): 0 answered; 1 the turn ended without an answer (a request failed, or the
model kept calling tools), one line on stderr says why; 2 loopd could not run the turn (bad
configuration or usage, the server unreachable, the session log unusable); 130 stopped by Ctrl-C
(recorded as stopped, so it is not answered later).
"""

from __future__ import annotations

import json
import secrets
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final, TextIO

from loopcommon.errors import ConfigError
from loopd.config import Settings
from loopd.engine.outcome import TurnOutcome
from loopd.selftest.expected import DEFAULT_DIR
from loopd.terminal.core import Stopped, TurnEnd, Watcher
from loopd.terminal.lineinput import checked_text, read_all
from loopd.terminal.link import ScreenWatch, connected
from loopd.terminal.logfile import logs_out_of_the_way
from loopd.terminal.render import Style, TurnView

EXIT_ANSWERED: Final = 0
EXIT_NO_ANSWER: Final = 1
EXIT_CANNOT: Final = 2
EXIT_STOPPED: Final = 130


@dataclass(frozen=True)
class RunOptions:
    prompt: str
    session: str | None = None
    json: bool = False
    show_thinking: bool = False
    log_stderr: bool = False
    expected_dir: Path = DEFAULT_DIR  # the servers' recorded expectations


def fresh_session_name(now: datetime, suffix: str) -> str:
    return f"run-{now:%Y%m%d-%H%M%S}-{suffix}"


def read_prompt(prompt: str, stdin: TextIO) -> str:
    """The prompt, read from stdin for ``-``; an empty one is refused, and one that is not
    text (``NotText``: bytes that are not UTF-8)."""
    text = checked_text(read_all(stdin) if prompt == "-" else prompt, "run: the message")
    if not text.strip():
        raise ConfigError("run: the prompt is empty; give the message to send (or - for stdin)")
    return text.strip()


def run_once(settings: Settings, options: RunOptions) -> int:
    prompt = read_prompt(options.prompt, sys.stdin)
    name = options.session or fresh_session_name(datetime.now(), secrets.token_hex(2))
    out = sys.stdout
    style = Style.TERMINAL if out.isatty() and not options.json else Style.PLAIN
    size = shutil.get_terminal_size()
    view = TurnView(
        style,
        show_thinking=options.show_thinking,
        width=size.columns,
        height=size.lines,
        markdown=True,
    )
    watch = ScreenWatch(view, out)
    with (
        logs_out_of_the_way(settings, on_stderr=options.log_stderr),
        connected(settings, name, options.expected_dir) as link,
    ):
        # A turn an earlier run left pending is finished first, unseen (the chat shows it).
        link.turn(link.core.resume, ScreenWatch(TurnView(Style.PLAIN), out))
        before: int = link.call(link.core.last_request_row)
        end = link.turn(_say(link.core.say, prompt), watch)
        perf: list[dict[str, Any]] = link.call(link.core.perf_since, before)
    assert end is not None  # a turn that was asked for has an end
    if options.json:
        out.write(json.dumps(run_record(name, end, watch.tool_calls, perf), ensure_ascii=False))
        out.write("\n")
    else:
        _show(view, end, out)
    return exit_status(end)


def _say(say: Callable[[str, Watcher], Any], prompt: str) -> Callable[[Watcher], Any]:
    async def start(watcher: Watcher) -> TurnEnd:
        result: TurnEnd = await say(prompt, watcher)
        return result

    return start


def _show(view: TurnView, end: TurnEnd, out: TextIO) -> None:
    if isinstance(end, Stopped):
        if view.style is Style.TERMINAL:
            out.write(view.stopped())
        else:
            sys.stderr.write("loopd: run: stopped (Ctrl-C); the turn is recorded as stopped\n")
        return
    shown = view.finished(end)
    out.write(shown.out)
    sys.stderr.write(shown.err)


def exit_status(end: TurnEnd) -> int:
    if isinstance(end, Stopped):
        return EXIT_STOPPED
    return EXIT_ANSWERED if end.failure is None else EXIT_NO_ANSWER


def run_record(
    session: str,
    end: TurnEnd,
    tool_calls: list[dict[str, str]],
    perf: list[dict[str, Any]],
) -> dict[str, Any]:
    """The ``--json`` object."""
    outcome = end if isinstance(end, TurnOutcome) else None
    ended = "stopped" if outcome is None else "answered" if outcome.failure is None else "failed"
    return {
        "session": session,
        "ended": ended,
        "answer": outcome.answer if outcome is not None and outcome.failure is None else None,
        "failure": outcome.failure if outcome is not None else None,
        "guard": outcome.guard if outcome is not None else None,
        "notices": list(outcome.notices) if outcome is not None else [],
        "cut_at_tokens": outcome.cut_at if outcome is not None else None,
        "tool_calls": tool_calls,
        "perf": perf,
    }
