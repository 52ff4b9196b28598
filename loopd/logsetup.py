"""Logging: human-readable on a terminal, JSON lines otherwise (what a service manager collects).

Structured fields travel in ``extra={"fields": {...}}`` so both formats show them: the human format
appends ``key=value`` pairs, the JSON format merges them into the object. Logs go to stderr; stdout
belongs to the conversation (``loopd chat``) and to machine output (``--json``).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "fields", None)
    return dict(fields) if isinstance(fields, dict) else {}


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then the record's structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        obj.update(_fields(record))
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info)
        return json.dumps(obj, ensure_ascii=False, default=str)


class HumanFormatter(logging.Formatter):
    """``HH:MM:SS level logger: message key=value ...``"""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{stamp} {record.levelname.lower():<7} {record.name}: {record.getMessage()}"
        if extra:
            line = f"{line}  {extra}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


def configure_logging(fmt: str = "auto", level: str = "INFO", stream: TextIO | None = None) -> None:
    """Install one handler on the root logger; ``fmt`` is auto, human or json."""
    out = stream if stream is not None else sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonLinesFormatter() if use_json else HumanFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # httpx logs every request at INFO; loopd logs its own one line per model request instead.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
