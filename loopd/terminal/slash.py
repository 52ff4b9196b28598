"""The chat's ``/`` commands: which text is one, and the help. Pure.

A line is a command when its first word is ``/`` and letters (``/new``, ``/perf``). Anything else
starting with a slash, a path such as ``/etc/hosts is what?``, is a message like any other.
``completions`` is what Tab offers: the command names, and after ``/resume`` the session names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Final

COMMANDS: Final = {
    "new": "/new [NAME]    start a new session (default name: terminal-<date>-<time>)",
    "resume": "/resume NAME   go on with an existing session (Tab completes the name)",
    "search": "/search WORDS  the messages of every session that mention all the words",
    "sessions": "/sessions      list the sessions, with what each waits for",
    "perf": "/perf          this session's requests: prompt cache reuse, recompute, losses",
    "retry": "/retry         the last answer again, generated anew (or a turn that failed, again)",
    "help": "/help          this list",
    "quit": "/quit          leave (so do Ctrl-D and Ctrl-C at the prompt)",
}

# Completed with a space after the name, ready for the argument.
TAKES_ARGUMENT: Final = frozenset({"new", "resume", "search"})

HELP: Final = "\n".join(
    [
        *COMMANDS.values(),
        "Ctrl-C during a turn stops it (the model's request is closed at once, and the turn is",
        "recorded as stopped, so it is not answered when the chat starts again); what you typed",
        "meanwhile comes back on the prompt. Ctrl-Z suspends the chat; fg brings it back.",
        "A message may span lines: paste it (a paste is one message; a long one shows as",
        "[pasted N lines]).",
    ]
)

_COMMAND = re.compile(r"/([A-Za-z]+)(?:\s+(.*))?", re.DOTALL)
_COMMAND_WORD = re.compile(r"\s*(/[A-Za-z]*)")
_RESUME_NAME = re.compile(r"\s*/resume\s+(\S*)", re.IGNORECASE)


@dataclass(frozen=True)
class Slash:
    name: str
    argument: str = ""


@dataclass(frozen=True)
class UnknownSlash:
    name: str

    def message(self) -> str:
        return f"loopd: no command /{self.name}; /help lists them"


def parse(text: str) -> Slash | UnknownSlash | None:
    """The command ``text`` is, or None when it is a message."""
    match = _COMMAND.fullmatch(text.strip())
    if match is None:
        return None
    name = match.group(1).lower()
    if name not in COMMANDS:
        return UnknownSlash(name)
    return Slash(name, (match.group(2) or "").strip())


def new_session_name(now: datetime) -> str:
    return f"terminal-{now:%Y%m%d-%H%M%S}"


def completions(before_cursor: str, session_names: Iterable[str]) -> list[str]:
    """What the word before the cursor may be completed to: a command name while the line is
    that word alone, a session's name after ``/resume``; nothing for a message."""
    command = _COMMAND_WORD.fullmatch(before_cursor)
    if command is not None:
        typed = command.group(1).lower()
        return [
            f"/{name}" + (" " if name in TAKES_ARGUMENT else "")
            for name in COMMANDS
            if f"/{name}".startswith(typed)
        ]
    resume = _RESUME_NAME.fullmatch(before_cursor)
    if resume is not None:
        typed = resume.group(1)
        return sorted(name for name in session_names if name.startswith(typed))
    return []
