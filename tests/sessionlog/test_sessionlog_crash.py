"""A process killed (SIGKILL) between any two writes of a turn leaves a log that verifies,
holds whole appends only, and says what the session was waiting for."""

import io
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from loopd.cli.log import verify_log
from loopd.sessionlog import EntryKind, SessionLog

HELPER = Path(__file__).with_name("crash_turn.py")
S = "thread-1"


def _start(db_path: Path, stop_at: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.sessionlog.crash_turn", str(db_path), str(stop_at)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=HELPER.parents[2],
    )


def _complete_run(tmp_path: Path) -> tuple[int, list[tuple[EntryKind, str | None]]]:
    db_path = tmp_path / "complete.db"
    with _start(db_path, 0) as process:
        out, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    with SessionLog.open(db_path) as log:
        entries = [(e.kind, e.message) for e in log.entries(S)]
    return int(out.split()[-1]), entries


@pytest.mark.slow
def test_sigkill_between_every_pair_of_writes(tmp_path: Path) -> None:
    write_points, complete = _complete_run(tmp_path)
    assert write_points > 20  # every statement and commit of the turn is a stopping point
    seen_labels = set()
    for stop_at in range(1, write_points + 1):
        db_path = tmp_path / f"crash-{stop_at}.db"
        with _start(db_path, stop_at) as process:
            assert process.stdout is not None
            line = process.stdout.readline()
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
        assert line.startswith("STOPPED "), line
        assert process.returncode == -signal.SIGKILL
        seen_labels.add(line.split()[1])
        _check_after_crash(db_path, complete)
    assert {"commit", "requests:insert", "entries:insert:assistant"} <= seen_labels


def _check_after_crash(db_path: Path, complete: list[tuple[EntryKind, str | None]]) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert verify_log(db_path, None, out, err) == 0, err.getvalue()
    with SessionLog.open(db_path) as log:
        if not log.sessions():
            return
        entries = log.entries(S)
        kept = [(e.kind, e.message) for e in entries]
        assert kept == complete[: len(kept)]  # whole appends, in order, nothing else
        with_request = [e.fields.request_id for e in entries if e.fields.request_id is not None]
        assert with_request == [r.id for r in log.requests(S)]  # no request without its entry
        if not entries:
            return
        state = log.state(S)
        last_replayed = [e for e in entries if e.message is not None][-1]
        assert state.pending_turn == (last_replayed.kind in (EntryKind.USER, EntryKind.TOOL))
        answered = {e.fields.tool_call_id for e in entries if e.kind is EntryKind.TOOL}
        answers = sum(kind is EntryKind.ASSISTANT for kind, _ in kept)
        expected = [call for call in ("c1", "c2") if call not in answered] if answers == 1 else []
        assert [call.call_id for call in state.interrupted_calls] == expected
