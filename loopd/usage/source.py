"""The usage ledger of a session log: each session read, and counted in its channel.

A Mattermost thread (``mm:<root post>``) is counted in the channel its label names (the chat
state keeps one for each thread loopd took, ``loopd.chat.labels``); any other session is a
terminal's, counted in ``terminal`` for the local user.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from loopcommon.statuspage import ThreadView
from loopd.chat.cursor import ChatState
from loopd.chat.threads import PREFIX, session_name
from loopd.sessionlog.records import Request, Session
from loopd.sessionlog.store import SessionLog
from loopd.usage.ledger import TERMINAL_CHANNEL, Ledger, merged, session_ledger

CHAT_STATE_FILE: Final = "chat.db"
UNLABELLED: Final = "(unknown channel)"  # a thread the chat state has no label for

# The requests of a session to count (all of them, or those of a span).
RequestFilter = Callable[[list[Request]], list[Request]]


def thread_labels(state_dir: Path) -> dict[str, ThreadView]:
    """The Mattermost threads' labels by session name; none where loopd never served one."""
    path = state_dir / CHAT_STATE_FILE
    if not path.exists():
        return {}
    state = ChatState.open(path)
    try:
        return {session_name(root): label for root, label in state.thread_labels().items()}
    finally:
        state.close()


def channel_and_person(
    session: str, labels: Mapping[str, ThreadView], local_person: str
) -> tuple[str, str | None]:
    """The session's channel, and its one person when it is a terminal's (None: a thread's
    people are read from its messages)."""
    if session.startswith(PREFIX):
        label = labels.get(session)
        return (label.channel if label is not None else UNLABELLED), None
    return TERMINAL_CHANNEL, local_person


def one_session(
    log: SessionLog,
    session: Session,
    labels: Mapping[str, ThreadView],
    local_person: str,
    keep: RequestFilter | None = None,
) -> Ledger:
    requests = log.requests(session.name)
    if keep is not None:
        requests = keep(requests)
    if not requests:
        return {}
    channel, person = channel_and_person(session.name, labels, local_person)
    return session_ledger(log.entries(session.name), requests, channel=channel, local_person=person)


def log_ledger(
    log: SessionLog,
    labels: Mapping[str, ThreadView],
    local_person: str,
    keep: RequestFilter | None = None,
) -> Ledger:
    """Every session's usage, summed by day, person and channel."""
    return merged(one_session(log, s, labels, local_person, keep) for s in log.sessions())
