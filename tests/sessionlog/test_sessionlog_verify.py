"""``log verify`` and the other commands: chain, replay identity, exit codes, output."""

import io
import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from loopd.cli.log import EXPORT_FIELDS, export_log, show_log, verify_log
from loopd.cli.parser import build_parser
from loopd.config import Settings
from loopd.logviews import list_sessions
from loopd.sessionlog import RequestKind, RequestRecord, SessionLog, messages_digest
from loopd.sessionlog.errors import InvalidAppendError
from loopd.sessionlog.records import NoteReason, Perf
from loopd.sessionlog.verify import verify
from loopd.turnstop import record_end, record_stop
from tests.sessionlog.sessionlog_support import assistant_text, request_for

S = "thread-1"


def _turn(log: SessionLog) -> None:
    log.append_user(S, "list files", external_key="p1")
    calls = [("c1", "read_file", '{"path": "a"}')]
    log.append_assistant(S, assistant_text(calls=calls), request=request_for(log, S))
    log.append_tool_result(S, tool_call_id="c1", content="a.txt")
    request = request_for(log, S, RequestKind.TOOL_FOLLOWUP)
    log.append_assistant(S, assistant_text("one file"), request=request)


def _tamper(db_path: Path, statement: str) -> None:
    conn = sqlite3.connect(db_path)
    conn.executescript(f"DROP TRIGGER entries_no_update; {statement};")
    conn.close()


def _verify(db_path: Path, session: str | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = verify_log(db_path, session, out, err)
    return status, out.getvalue(), err.getvalue()


def test_verify_passes_on_a_sound_log(db_path: Path, log: SessionLog) -> None:
    _turn(log)
    assert verify(log) == []
    status, out, _ = _verify(db_path, S)
    assert (status, out.startswith("ok:")) == (0, True)


def test_verify_names_the_first_changed_entry(db_path: Path, log: SessionLog) -> None:
    _turn(log)
    log.close()
    _tamper(
        db_path, "UPDATE entries SET message = replace(message, 'list', 'delete') WHERE seq = 2"
    )
    status, _, err = _verify(db_path)
    assert status == 1
    assert "first problem: session 'thread-1' entry 2: content does not match its hash" in err
    assert "append-only triggers missing: ['entries_no_update']" in err


def test_verify_notices_a_request_that_did_not_replay_the_log(
    db_path: Path, log: SessionLog
) -> None:
    log.append_user(S, "hello", external_key="p1")
    sent = log.replay_messages(S)
    rerendered = [*sent[:-1], '{"role": "user", "content": "hello"}']  # re-dumped: spacing differs
    record = RequestRecord(RequestKind.TURN, 0, 1, len(sent), messages_digest(rerendered))
    log.append_assistant(S, assistant_text("hi"), request=record)
    problems = verify(log)
    assert [p.where for p in problems] == ["request 1"]
    assert "not, byte for byte" in str(problems[0])


def test_verify_notices_a_request_that_dropped_messages(log: SessionLog) -> None:
    _turn(log)
    shorter = RequestRecord(RequestKind.TURN, 0, 1, 1, messages_digest(log.replay_messages(S)[:1]))
    log.record_request(S, shorter)
    assert "did not extend it" in str(verify(log)[0])


def test_verify_notices_a_request_on_another_slot(log: SessionLog) -> None:
    record = request_for(log, S)
    log.record_request(S, RequestRecord(record.kind, 3, 1, 1, record.messages_sha256))
    assert "slot 3; the session's slot is 0" in str(verify(log)[0])


def test_selftest_requests_are_not_replay_checked(log: SessionLog) -> None:
    log.record_request(S, RequestRecord(RequestKind.SELFTEST, 2, 1, 5, "0" * 64))
    assert verify(log) == []


def test_verify_of_a_damaged_file_fails_naming_it(db_path: Path) -> None:
    db_path.write_bytes(b"garbage" * 1000)
    status, _, err = _verify(db_path)
    assert status == 1
    assert str(db_path) in err


def test_sessions_lists_state(db_path: Path, log: SessionLog) -> None:
    log.append_user(S, "hello", external_key="p1")
    log.ensure_session("thread-2", 1)
    log.start_epoch("thread-2", reason="start", tools_text="[]", system_text="s")
    log.append_user("thread-2", "go", external_key="q1")
    calls = [("call-7", "read_file", "{}")]
    log.append_assistant(
        "thread-2", assistant_text(calls=calls), request=request_for(log, "thread-2")
    )
    out = io.StringIO()
    assert list_sessions(db_path, out) == 0
    lines = out.getvalue().splitlines()
    assert lines[1].split()[:4] == ["thread-1", "0", "1", "2"]
    assert lines[1].endswith("pending turn")
    assert lines[2].endswith("interrupted tool calls: call-7")


def test_show_prints_every_entry(db_path: Path, log: SessionLog) -> None:
    _turn(log)
    out = io.StringIO()
    assert show_log(db_path, S, out) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 + len(log.entries(S))
    assert "key=p1" in lines[2]
    assert "call=c1" in lines[4]


def test_show_of_an_unknown_session_fails(db_path: Path, log: SessionLog) -> None:
    err = io.StringIO()
    assert show_log(db_path, "ghost", io.StringIO(), err) == 2
    assert "no session 'ghost'" in err.getvalue()


def test_export_is_one_entry_a_line_with_the_stored_text(db_path: Path, log: SessionLog) -> None:
    _turn(log)
    out = io.StringIO()
    assert export_log(db_path, S, out) == 0
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [tuple(record) for record in records] == [EXPORT_FIELDS] * len(log.entries(S))
    messages = [r["message"] for r in records if r["message"] is not None]
    assert messages == log.replay_messages(S)


def test_the_parser_wires_the_commands(
    db_path: Path, log: SessionLog, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = build_parser()
    settings = Settings(state_dir=db_path.parent)
    for argv in (["sessions"], ["log", "show", S], ["log", "export", S], ["log", "verify"]):
        args = parser.parse_args(argv)
        assert args.handler(args, settings) == 0, argv
        assert capsys.readouterr().err == "", argv
    with pytest.raises(SystemExit):
        parser.parse_args(["log"])


def _answered_on(log: SessionLog, text: str, endpoint: str, slot: int) -> None:
    """One turn whose request ran on ``endpoint``'s ``slot`` (loopd with [[endpoint]] tables)."""
    log.append_user(S, text, external_key=f"key-{text}")
    record = replace(request_for(log, S), slot=slot, perf=Perf(extra={"endpoint": endpoint}))
    log.append_assistant(S, assistant_text(f"re {text}"), request=record)


def test_a_session_keeps_one_slot_on_each_endpoint(db_path: Path, log: SessionLog) -> None:
    _answered_on(log, "one", "a", 1)
    _answered_on(log, "two", "b", 0)  # moved: another endpoint, its own slot there
    _answered_on(log, "three", "b", 0)
    assert verify(log) == []
    out = io.StringIO()
    assert list_sessions(db_path, out) == 0
    header, row = out.getvalue().splitlines()
    assert header.split()[:3] == ["SESSION", "ENDPOINT", "SLOT"]
    assert row.split()[:3] == [S, "b", "0"]

    _answered_on(log, "four", "b", 1)
    [problem] = verify(log)
    assert problem.detail == "sent to slot 1 on endpoint b; the session's slot there is 0"
    assert log.endpoint_slots() == {(S, "a"): 1, (S, "b"): 1}


def _regenerate(log: SessionLog) -> tuple[int, int]:
    """A turn answered, a save's read of the answer, the answer taken back and answered again,
    then a next turn: the seqs of the first and of the second answer."""
    _turn(log)
    first = log.entries(S)[-1].seq
    log.record_request(S, request_for(log, S, RequestKind.PREWARM))  # it read the first answer
    log.append_note(S, "run again by @alice", reason=NoteReason.TAKEN_BACK, refers_to=first)
    log.append_assistant(S, assistant_text("two files"), request=request_for(log, S))
    second = log.entries(S)[-1].seq
    log.append_user(S, "thanks", external_key="p2")
    log.append_assistant(S, assistant_text("welcome"), request=request_for(log, S))
    return first, second


def test_a_taken_back_answer_leaves_the_replay_and_the_log_verifies(log: SessionLog) -> None:
    first, second = _regenerate(log)
    replayed = log.replay_messages(S)
    stored = {e.seq: e.message for e in log.entries(S)}
    assert stored[first] not in replayed, "the first answer stays in the log, not in the replay"
    assert stored[first] is not None
    assert stored[second] in replayed
    assert verify(log) == []


def test_a_request_that_drops_an_answer_not_taken_back_fails_verify(log: SessionLog) -> None:
    _turn(log)
    log.record_request(S, request_for(log, S, RequestKind.PREWARM))  # it read the answer
    before_answer = log.replay_messages(S)[:-1]
    epoch = log.current_epoch(S).number
    record = RequestRecord(
        RequestKind.TURN, 0, epoch, len(before_answer), messages_digest(before_answer)
    )
    log.record_request(S, record)
    problems = [str(p) for p in verify(log)]
    assert any("did not extend it" in p for p in problems), problems


def test_the_replay_held_during_a_turn_honours_a_take_back(log: SessionLog) -> None:
    _turn(log)
    with log.holding_replay(S):
        held = log.replay_messages(S)
        answer = log.entries(S)[-1].seq
        log.append_note(S, "again", reason=NoteReason.TAKEN_BACK, refers_to=answer)
        assert log.replay_messages(S) == held[:-1]


def test_a_take_back_names_an_entry_of_the_current_epoch(log: SessionLog) -> None:
    with pytest.raises(InvalidAppendError):
        log.append_note(S, "again", reason=NoteReason.TAKEN_BACK)
    with pytest.raises(InvalidAppendError):
        log.append_note(S, "again", reason=NoteReason.TAKEN_BACK, refers_to=99)


def test_sessions_shows_how_each_turn_ended(db_path: Path, log: SessionLog) -> None:
    _turn(log)
    for name, ending in (("stopped", "stop"), ("failed", "end"), ("cut", None)):
        log.ensure_session(name, 0)
        log.start_epoch(name, reason="start", tools_text="[]", system_text="s")
        log.append_user(name, "go", external_key=f"k-{name}")
        log.append_broken(name, partial_text="", reason="the connection broke")
        if ending == "stop":
            record_stop(log, name, "alice")
        elif ending == "end":
            record_end(log, name, "no first byte within 900 s")
    out = io.StringIO()
    assert list_sessions(db_path, out) == 0
    states = {line.split()[0]: line for line in out.getvalue().splitlines()[1:]}
    assert states[S].endswith("  answered")
    assert states["stopped"].endswith("  stopped by @alice")
    assert states["failed"].endswith("  ended: no first byte within 900 s")
    assert states["cut"].endswith("  pending turn")


def test_sessions_names_the_folder_when_there_is_no_log(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert list_sessions(tmp_path / "typo" / "loopd.db", out, err) == 0
    assert out.getvalue().startswith("SESSION")
    assert err.getvalue() == (
        f"loopd: no sessions: the state folder {tmp_path / 'typo'} does not exist "
        "(LOOPD_STATE_DIR)\n"
    )
    out, err = io.StringIO(), io.StringIO()
    assert list_sessions(tmp_path / "loopd.db", out, err) == 0
    assert f"no sessions yet: no session log in {tmp_path}" in err.getvalue()
