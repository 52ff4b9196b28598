"""Test helper: perform a turn write by write, stopping (to be SIGKILLed) at one write.

Usage: python crash_turn.py DB_PATH STOP_AT. The log here (``StoppingLog``) counts every write
statement and every commit as a stopping point; at number STOP_AT (1-based) this script prints
``STOPPED <label>`` and waits to be killed. With STOP_AT 0 it runs to the end and prints
``DONE <number of stopping points>``.
"""

import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from loopd.sessionlog import SessionLog
from tests.sessionlog.sessionlog_support import SYSTEM, TOOLS, assistant_text, request_for


class StoppingLog(SessionLog):
    """The session log, calling ``stop`` after each row it inserts and each commit (the points
    where a crash must leave a consistent log), with a label: ``requests:insert``, ``commit``."""

    stop: Callable[[str], None] = staticmethod(lambda label: None)

    def _insert(self, table: str, row: Mapping[str, Any]) -> int:
        row_id = super()._insert(table, row)
        what = row.get("kind") if table == "entries" else None
        self.stop(f"{table}:insert" + (f":{what}" if what else ""))
        return row_id

    @contextmanager
    def transaction(self) -> Iterator[None]:
        outermost = not self._conn.in_transaction
        with super().transaction():
            yield
        if outermost:
            self.stop("commit")


def main(db_path: Path, stop_at: int) -> None:
    calls = 0

    def hook(label: str) -> None:
        nonlocal calls
        calls += 1
        if calls == stop_at:
            print(f"STOPPED {label}", flush=True)
            while True:  # the test kills this process here
                time.sleep(60)

    log = StoppingLog.open(db_path)
    log.stop = hook
    run_turn(log)
    print(f"DONE {calls}", flush=True)


def run_turn(log: SessionLog) -> None:
    session = "thread-1"
    log.ensure_session(session, 0)
    log.start_epoch(session, reason="start", tools_text=TOOLS, system_text=SYSTEM)
    log.append_user(session, "count the lines of a and b", external_key="post-1")
    calls = [("c1", "read_file", '{"path": "a"}'), ("c2", "read_file", '{ "path":"b" }')]
    request = request_for(log, session)
    log.append_assistant(
        session, assistant_text(reasoning="read both", calls=calls), request=request
    )
    log.append_tool_result(session, tool_call_id="c1", content="3 lines")
    log.append_tool_result(session, tool_call_id="c2", content="5 lines")
    request = request_for(log, session)
    log.append_broken(
        session, partial_text='{"content":"a has', reason="stream cut", request=request
    )
    request = request_for(log, session)
    log.append_assistant(session, assistant_text("a: 3, b: 5"), request=request)
    log.append_note(session, "answered")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
