"""Logging: human-readable on a terminal, JSON lines otherwise (what a service manager collects).

The formatters here are loopd's and brokerd's both (brokerd wraps them to redact its secrets), so
the two daemons' lines read alike: ``ts`` is RFC 3339 in UTC with milliseconds
(``2026-11-30T14:03:07.215Z``), then ``level``, ``logger`` (the module's name), ``msg``.

Structured fields travel in ``extra={"fields": {...}}`` so both formats show them: the human format
appends ``key=value`` pairs, the JSON format merges them into the object. Logs go to stderr; stdout
belongs to the conversation (``loopd chat``) and to machine output (``--json``).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import UTC, datetime
from typing import Any, TextIO

from loopcommon.context import ContextFields
from loopcommon.sanitize import for_terminal

_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "fields", None)
    return dict(fields) if isinstance(fields, dict) else {}


def rfc3339_utc(created: float) -> str:
    """A record's time as RFC 3339 in UTC with milliseconds: ``2026-11-30T14:03:07.215Z``."""
    stamp = datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")
    return stamp.removesuffix("+00:00") + "Z"


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then the record's structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "ts": rfc3339_utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        obj.update(_fields(record))
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info)
        return json.dumps(obj, ensure_ascii=False, default=str)


class HumanFormatter(logging.Formatter):
    """``HH:MM:SS level logger: message key=value ...``, shown as text: a message quoting what
    the model or the box sent is never obeyed by the terminal it lands on
    (``loopcommon.sanitize``)."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{stamp} {record.levelname.lower():<7} {record.name}: {record.getMessage()}"
        if extra:
            line = f"{line}  {extra}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return for_terminal(line)


def formatter(fmt: str, stream: TextIO) -> logging.Formatter:
    """The formatter for ``fmt`` (auto, human or json): auto is human on a terminal."""
    use_json = fmt == "json" or (fmt == "auto" and not stream.isatty())
    return JsonLinesFormatter() if use_json else HumanFormatter()


def configure_logging(fmt: str = "auto", level: str = "INFO", stream: TextIO | None = None) -> None:
    """Install one handler on the root logger; ``fmt`` is auto, human or json."""
    out = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter(fmt, out))
    handler.addFilter(ContextFields())  # the session and request id of the work under way
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # httpx logs every request at INFO; loopd logs its own one line per model request instead.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
