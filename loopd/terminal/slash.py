"""The chat's ``/`` commands: which text is one, and the help. Pure.

A line is a command when its first word is ``/`` and letters (``/new``, ``/perf``). Anything else
starting with a slash, a path such as ``/etc/hosts is what?``, is a message like any other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Final

COMMANDS: Final = {
    "new": "/new [NAME]    start a new session (default name: terminal-<date>-<time>)",
    "sessions": "/sessions      list the sessions, with what each waits for",
    "perf": "/perf          this session's requests: prompt cache reuse, recompute, losses",
    "help": "/help          this list",
    "quit": "/quit          leave (so do Ctrl-D and Ctrl-C at the prompt)",
}

HELP: Final = "\n".join(
    [
        *COMMANDS.values(),
        "Ctrl-C during a turn stops it (the model's request is closed at once, and the turn is",
        "recorded as stopped, so it is not answered when the chat starts again).",
        "A message may span lines: paste it (a paste is one message).",
    ]
)

_COMMAND = re.compile(r"/([A-Za-z]+)(?:\s+(.*))?", re.DOTALL)


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
