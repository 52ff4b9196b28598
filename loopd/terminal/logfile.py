"""Logs out of the way of the conversation: on a terminal they go to a file in the state dir.

A log line written to a terminal would land in the middle of an answer being written, or erase
the status line. So when stderr is a terminal, ``loopd chat`` and ``loopd run`` send their logs to
``<state dir>/chat.log`` (the chat names it once at start) unless asked for them on stderr
(``--log-stderr``). The file keeps the configured format (``LOOPD_LOG_FORMAT``: JSON lines by
default, since a file is not a terminal); one past ``MAX_BYTES`` is moved to ``chat.log.1`` first.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Final, TextIO

from loopcommon.logsetup import configure_logging
from loopd.config import Settings

FILE_NAME: Final = "chat.log"
MAX_BYTES: Final = 10 * 1024 * 1024


@contextlib.contextmanager
def logs_out_of_the_way(
    settings: Settings, *, on_stderr: bool, stderr: TextIO | None = None
) -> Iterator[Path | None]:
    """Logging to the file while the block runs when ``stderr`` is a terminal and ``on_stderr``
    is not asked for; yields the file's path, or None when logs stay on stderr."""
    err = stderr if stderr is not None else sys.stderr
    if on_stderr or not err.isatty():
        yield None
        return
    path = settings.state_dir / FILE_NAME
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        if path.stat().st_size > MAX_BYTES:
            path.replace(path.with_name(FILE_NAME + ".1"))
    with path.open("a", encoding="utf-8") as file:
        configure_logging(settings.log_format, settings.log_level, stream=file)
        try:
            yield path
        finally:
            configure_logging(settings.log_format, settings.log_level, stream=err)
