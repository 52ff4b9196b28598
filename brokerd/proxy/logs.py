"""brokerd's log output: loopd's formatters (JSON lines, or plain text on a terminal; see
``loopcommon.logsetup``), with secrets redacted.

Redaction happens on the final formatted text, tracebacks included, so no code path (ours or a
library's debug output, which for the WebSocket client lists the upgrade request's headers) can
write the bot token or the upstream key to the log.
"""

import logging
import sys
import time
from collections.abc import Callable, Iterable
from typing import Final, TextIO

from loopcommon.context import ContextFields
from loopcommon.logsetup import formatter

REDACTED: Final = "[redacted]"
# Warnings of one kind (logger and message template) logged per window; the rest are counted.
WARNINGS_PER_WINDOW: Final = 20
WINDOW_S: Final = 10.0


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


class ThrottleRepeats(logging.Filter):
    """Lets through at most ``limit`` warnings of one kind per window, so a client that provokes
    a warning per request (a malformed request, a refused path) cannot fill the disk; the first
    warning of the next window says how many were dropped. Info lines are not touched."""

    def __init__(
        self,
        limit: int = WARNINGS_PER_WINDOW,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.limit, self.window_s, self.clock = limit, window_s, clock
        # (logger, template) -> [window start, let through, dropped]
        self._kinds: dict[tuple[str, str], list[float]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        now = self.clock()
        kind = (record.name, str(record.msg))
        window = self._kinds.get(kind)
        if window is None or now - window[0] >= self.window_s:
            dropped = int(window[2]) if window is not None else 0
            if dropped:
                record.msg = f"{record.msg} ({dropped} more like it were not logged)"
            self._kinds[kind] = [now, 1, 0]
            return True
        if window[1] < self.limit:
            window[1] += 1
            return True
        window[2] += 1
        return False


def make_handler(stream: TextIO, *, json_lines: bool, secrets: Iterable[str]) -> logging.Handler:
    inner = formatter("json" if json_lines else "human", stream)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(RedactingFormatter(inner, secrets))
    handler.addFilter(ContextFields())  # loopd's session and request id, with the socket
    handler.addFilter(ThrottleRepeats())
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
