"""brokerd's log output: JSON lines (or plain text on a terminal), with secrets redacted.

Redaction happens on the final formatted text, tracebacks included, so no code path (ours or a
library's debug output, which for the WebSocket client lists the upgrade request's headers) can
write the bot token or the upstream key to the log.
"""

import json
import logging
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Final, TextIO

REDACTED: Final = "[redacted]"
PLAIN_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonLineFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and the traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, str] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class RedactingFormatter(logging.Formatter):
    """Wraps another formatter and replaces every secret in its output."""

    def __init__(self, inner: logging.Formatter, secrets: Iterable[str]) -> None:
        super().__init__()
        self.inner = inner
        # Longest first, so a secret that contains another is replaced whole.
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def format(self, record: logging.LogRecord) -> str:
        text = self.inner.format(record)
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text


def make_handler(stream: TextIO, *, json_lines: bool, secrets: Iterable[str]) -> logging.Handler:
    inner = JsonLineFormatter() if json_lines else logging.Formatter(PLAIN_FORMAT)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(RedactingFormatter(inner, secrets))
    return handler


def configure_logging(
    *, secrets: Iterable[str] = (), level: int = logging.INFO, stream: TextIO | None = None
) -> None:
    """Route all logging to ``stream`` (stderr): JSON lines unless it is a terminal."""
    out = stream or sys.stderr
    handler = make_handler(out, json_lines=not out.isatty(), secrets=secrets)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # One line per proxied request is logged by brokerd itself; httpx would add a second one.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
