"""Pure hashing: the per-session entry chain and the digest of a request's messages."""

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from loopcommon import jsonbytes
from loopd.sessionlog.records import EntryFields

_CHAIN_TAG = "loopd-session-log/1"


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def genesis_hash(session_name: str, slot: int) -> str:
    """The 'previous hash' of a session's first entry; binds the chain to the session and slot."""
    return sha256_text(jsonbytes.dumps([_CHAIN_TAG, session_name, slot]))


def entry_hash(prev_hash: str, fields: EntryFields) -> str:
    """The hash of an entry, chained to the previous entry of the same session."""
    content = [prev_hash, *fields.values()]
    return sha256_text(jsonbytes.dumps(content))


def messages_digest(messages: Sequence[str]) -> str:
    """sha256 of a request's ``messages`` array bytes: ``[`` + messages joined by ``,`` + ``]``.

    The turn engine computes it over the messages it sent; ``verify`` over the stored ones.
    """
    return prefix_digests(messages, [len(messages)])[len(messages)]


def running_digest() -> Any:
    """The digest of a messages array as it is read: its opening bracket only."""
    return hashlib.sha256(b"[")


def extended(running: Any, message: str, first: bool) -> Any:
    """A copy of ``running`` with one more message of the array."""
    grown = running.copy()
    if not first:
        grown.update(b",")
    grown.update(message.encode("utf-8"))
    return grown


def closed_digest(running: Any) -> str:
    """The digest of the array read so far, closed (``running`` itself is left open)."""
    closed = running.copy()
    closed.update(b"]")
    return str(closed.hexdigest())


def prefix_digests(messages: Sequence[str], counts: Iterable[int]) -> dict[int, str]:
    """``messages_digest(messages[:n])`` for each wanted ``n``, in one pass over the bytes."""
    wanted = sorted(set(counts))
    digests: dict[int, str] = {}
    running = hashlib.sha256(b"[")
    position = 0
    for count in wanted:
        if count > len(messages):
            break
        while position < count:
            if position:
                running.update(b",")
            running.update(messages[position].encode("utf-8"))
            position += 1
        closed = running.copy()
        closed.update(b"]")
        digests[count] = closed.hexdigest()
    return digests
