"""The request ids both daemons log: the two headers loopd sends, the shapes brokerd believes, and
the logging filter that adds the work's fields to every line.

loopd sends ``X-Loopd-Request`` and ``X-Loopd-Session`` with every request it makes for a model
request or a tool call (``loopd.requestscope``); brokerd reads them (``brokerd.observe.context``)
and logs them next to its own fields, so the two daemons' lines join on ``request_id``. Each daemon
enters its own scope with ``log_fields``; ``ContextFields`` reads them, so one filter serves both.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Final

REQUEST_HEADER: Final = "X-Loopd-Request"
SESSION_HEADER: Final = "X-Loopd-Session"
# The box writes these headers, so brokerd believes only these shapes (anything else is ignored,
# never logged); loopd's ids are 16 hex digits, its session names printable ASCII.
REQUEST_ID_SHAPE: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")
SESSION_SHAPE: Final = re.compile(r"[\x21-\x7e]{1,200}")  # printable ASCII, no space

_fields: ContextVar[Mapping[str, str] | None] = ContextVar("loopcommon_log_fields", default=None)


@contextmanager
def log_fields(fields: Mapping[str, str]) -> Iterator[None]:
    """Every line logged inside the block (in this task and the tasks it starts) gets ``fields``."""
    token = _fields.set(fields)
    try:
        yield
    finally:
        _fields.reset(token)


class ContextFields(logging.Filter):
    """Adds the work's fields (``session``, ``request_id``, brokerd's ``socket``) to each record's
    structured fields; the line's own fields win (a line about another session keeps its own)."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _fields.get()
        if fields is not None:
            own = getattr(record, "fields", None)
            merged: dict[str, object] = dict(fields)
            if isinstance(own, dict):
                merged.update(own)
            record.fields = merged
        return True
