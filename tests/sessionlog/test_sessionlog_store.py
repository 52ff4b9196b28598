"""The store: exact storage, idempotent intake, epochs, append-only rows, requests."""

import re
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from loopd.sessionlog import (
    AppendOnlyError,
    EntryKind,
    InvalidMessageError,
    NoEpochError,
    Perf,
    RequestKind,
    SessionLog,
    SlotMismatchError,
    ToolCallError,
    UnknownSessionError,
    fresh_external_key,
)
from loopd.sessionlog.chain import sha256_text
from loopd.sessionlog.records import REPLAYED_KINDS
from tests.sessionlog.sessionlog_support import SYSTEM, TOOLS, assistant_text, request_for

S = "thread-1"


def test_first_request_is_the_system_message(log: SessionLog) -> None:
    assert log.replay_messages(S) == [f'{{"role":"system","content":"{SYSTEM}"}}']


def test_session_keeps_its_slot_for_life(log: SessionLog) -> None:
    assert log.ensure_session(S, 0).slot == 0
    with pytest.raises(SlotMismatchError, match="slot 0 for life"):
        log.ensure_session(S, 1)


def test_unknown_session_is_named(log: SessionLog) -> None:
    with pytest.raises(UnknownSessionError, match="'nope'"):
        log.replay_messages("nope")


def test_append_before_an_epoch_is_refused(log: SessionLog) -> None:
    log.ensure_session("fresh", 1)
    with pytest.raises(NoEpochError):
        log.append_user("fresh", "hello", external_key="p1")
    assert log.entries("fresh") == []


def test_same_external_key_appends_once(log: SessionLog) -> None:
    first = log.append_user(S, "hello", external_key="post-1")
    again = log.append_user(S, "hello (edited)", external_key="post-1")
    assert first.is_new
    assert not again.is_new
    assert again.entry == first.entry
    assert log.replay_messages(S)[1:] == ['{"role":"user","content":"hello"}']


def test_fresh_external_keys_differ() -> None:
    assert fresh_external_key() != fresh_external_key()


def test_assistant_text_is_stored_exactly_as_received(log: SessionLog) -> None:
    log.append_user(S, "read it", external_key="p1")
    odd = (
        '{"role":"assistant", "content":"ok \\u00e9 é","reasoning_content":"think\\n",'
        '"tool_calls":[{"id":"c1","type":"function","function":{"name":"read_file",'
        '"arguments":"{ \\"z\\":1,\\"a\\" :  [ ] }"}}]}'
    )
    log.append_assistant(S, odd, request=request_for(log, S))
    assert log.replay_messages(S)[-1] == odd
    assert log.entries(S)[-1].fields.request_id == log.requests(S)[0].id


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"role":"user","content":"x"}',
        '{"role":"assistant","content":"","tool_calls":[{"id":"c1","function":'
        '{"name":"f","arguments":{"parsed":true}}}]}',
        '{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":""}}]}',
    ],
)
def test_malformed_assistant_message_is_refused_without_writing(log: SessionLog, text: str) -> None:
    before = log.entries(S)
    with pytest.raises(InvalidMessageError, match="assistant message refused"):
        log.append_assistant(S, text, request=request_for(log, S))
    assert log.entries(S) == before
    assert log.requests(S) == []


def test_text_that_is_not_utf8_is_refused(log: SessionLog) -> None:
    with pytest.raises(InvalidMessageError, match="UTF-8"):
        log.append_user(S, "half a pair \ud800", external_key="p1")
    assert len(log.entries(S)) == 1


def test_tool_result_must_answer_an_open_call(log: SessionLog) -> None:
    log.append_user(S, "go", external_key="p1")
    calls = [("c1", "read_file", '{"path":"a"}'), ("c2", "read_file", '{"path":"b"}')]
    log.append_assistant(S, assistant_text(calls=calls), request=request_for(log, S))
    with pytest.raises(ToolCallError, match="'c9'"):
        log.append_tool_result(S, tool_call_id="c9", content="?")
    log.append_tool_result(S, tool_call_id="c2", content="B")
    with pytest.raises(ToolCallError, match="'c2'"):
        log.append_tool_result(S, tool_call_id="c2", content="B again")
    assert [call.call_id for call in log.state(S).interrupted_calls] == ["c1"]


def test_broken_stream_and_notes_are_kept_but_never_replayed(log: SessionLog) -> None:
    log.append_user(S, "go", external_key="p1")
    replay_before = log.replay_messages(S)
    broken = log.append_broken(
        S, partial_text='{"content":"half', reason="stream ended", request=request_for(log, S)
    )
    note = log.append_note(S, "operator: ignore the broken turn", refers_to=broken.seq)
    assert log.replay_messages(S) == replay_before
    assert [e.kind for e in log.entries(S)][-2:] == [EntryKind.BROKEN, EntryKind.NOTE]
    assert note.fields.refers_to == broken.seq
    state = log.state(S)
    assert state.pending_turn
    assert [e.seq for e in state.broken_since] == [broken.seq]


def test_a_new_epoch_fixes_new_tools_and_records_its_reason(log: SessionLog) -> None:
    log.append_user(S, "first", external_key="p1")
    tools = '[ {"type": "function"} ]'
    epoch = log.start_epoch(S, reason="tool set changed", tools_text=tools, system_text="v2")
    assert (epoch.number, epoch.reason, epoch.tools_text) == (2, "tool set changed", tools)
    assert epoch.tools_sha256 == sha256_text(tools)
    assert log.current_epoch(S) == epoch
    assert log.replay_messages(S) == ['{"role":"system","content":"v2"}']
    assert [e.number for e in log.epochs(S)] == [1, 2]


def test_carry_over_copies_the_conversation_text_for_text(log: SessionLog) -> None:
    log.append_user(S, "first", external_key="p1")
    log.append_assistant(S, assistant_text("hi", reasoning="r"), request=request_for(log, S))
    before = log.replay_messages(S)
    log.start_epoch(S, reason="operator", tools_text=TOOLS, system_text="v2", carry_over=True)
    assert log.replay_messages(S) == ['{"role":"system","content":"v2"}', *before[1:]]
    # The intake key still deduplicates across epochs.
    assert not log.append_user(S, "first", external_key="p1").is_new


def test_tools_text_must_be_a_json_array(log: SessionLog) -> None:
    with pytest.raises(InvalidMessageError, match="tools"):
        log.start_epoch(S, reason="x", tools_text='{"not":"array"}', system_text="s")
    assert log.current_epoch(S).number == 1


def test_requests_keep_their_perf_record(log: SessionLog) -> None:
    perf = Perf(
        outcome="ok",
        cache_n=591,
        prompt_n=29,
        predicted_n=61,
        ttfb_ms=227.2,
        queue_wait_ms=0.0,
        prompt_per_second=127.66,
        predicted_per_second=34.05,
        thinking_tokens=40,
        capped=True,
        cache_loss=12,
        cache_loss_cause="reasoning capped",
        extra={"draft_n": 3},
    )
    record = request_for(log, S, RequestKind.PREWARM)
    record = type(record)(
        record.kind, record.slot, record.epoch, record.message_count, record.messages_sha256, perf
    )
    stored = log.record_request(S, record)
    assert log.requests(S) == [stored]
    assert stored.record == record


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE entries SET text = 'x'",
        "DELETE FROM entries",
        "UPDATE epochs SET tools_text = '[]'",
        "DELETE FROM requests",
        "UPDATE sessions SET slot = 3",
    ],
)
def test_rows_are_append_only(db_path: Path, log: SessionLog, statement: str) -> None:
    log.record_request(S, request_for(log, S))
    conn = sqlite3.connect(db_path)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute(statement)
    conn.close()


def _listed_kinds(db_path: Path, table: str, before: str = "CHECK ") -> set[str]:
    """The kinds a ``kind IN (...)`` of the table's CHECKs lists, read from the migrated schema."""
    conn = sqlite3.connect(db_path)
    try:
        [(sql,)] = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,))
    finally:
        conn.close()
    listed = re.search(re.escape(before) + r"\(kind IN \(([^)]*)\)\)", sql)
    assert listed is not None, sql
    return {value.strip().strip("'") for value in listed.group(1).split(",")}


def test_the_schema_allows_exactly_the_kinds_the_enums_name(db_path: Path, log: SessionLog) -> None:
    """The migrations' SQL stays literal (a shipped migration is never edited), so this holds the
    CHECK lists and the enums equal: a new kind needs a migration as well as a member."""
    assert _listed_kinds(db_path, "requests") == {kind.value for kind in RequestKind}
    assert _listed_kinds(db_path, "entries") == {kind.value for kind in EntryKind}
    # The kinds that must carry a message are the replayed ones.
    assert _listed_kinds(db_path, "entries", before="= ") == {k.value for k in REPLAYED_KINDS}


def test_append_only_violation_through_the_store_is_an_owned_error(log: SessionLog) -> None:
    with pytest.raises(AppendOnlyError), log.transaction():
        log._conn.execute("DELETE FROM entries")  # the only way in: a private handle
    assert len(log.entries(S)) == 1


def _two_appends_then_a_fault(log: SessionLog) -> None:
    with log.transaction():
        log.append_user(S, "a", external_key="p1")
        log.append_user(S, "b", external_key="p2")
        raise RuntimeError("fault between appends")


def test_transaction_keeps_all_or_nothing(log: SessionLog) -> None:
    with pytest.raises(RuntimeError, match="fault between appends"):
        _two_appends_then_a_fault(log)
    assert len(log.entries(S)) == 1


def test_reopening_keeps_everything(db_path: Path, log: SessionLog) -> None:
    log.append_user(S, "ünïcode ✓", external_key="p1")
    replay = log.replay_messages(S)
    log.close()
    with SessionLog.open(db_path) as reopened:
        assert reopened.replay_messages(S) == replay


def test_what_else_ran_on_a_slot_since_a_request(log: SessionLog) -> None:
    for name, slot in (("thread-2", 0), ("thread-3", 1)):
        log.ensure_session(name, slot)
        log.start_epoch(name, reason="start", tools_text=TOOLS, system_text=SYSTEM)
    mine = log.record_request(S, request_for(log, S))
    assert not log.slot_used_since(0, mine.id, besides=S)
    log.record_request("thread-3", request_for(log, "thread-3"))  # another slot
    log.record_request(S, request_for(log, S))  # the same session
    assert not log.slot_used_since(0, mine.id, besides=S)
    other = log.record_request("thread-2", request_for(log, "thread-2"))
    assert log.slot_used_since(0, mine.id, besides=S)
    assert not log.slot_used_since(0, other.id, besides="thread-2")  # nothing after it


def test_another_servers_slot_of_the_same_number_is_another_slot(log: SessionLog) -> None:
    log.ensure_session("thread-2", 0)
    log.start_epoch("thread-2", reason="start", tools_text=TOOLS, system_text=SYSTEM)

    def on(session: str, endpoint: str) -> int:
        record = request_for(log, session)
        extra = {"endpoint": endpoint}
        return log.record_request(session, replace(record, perf=Perf(outcome="ok", extra=extra))).id

    mine = on(S, "b")
    on("thread-2", "a")  # slot 0 of server a
    assert not log.slot_used_since(0, mine, besides=S, endpoint="b")
    assert not log.slot_used_since(None, mine, besides=S, endpoint="b")
    assert log.slot_used_since(0, mine, besides=S, endpoint="a")
    assert not log.slot_used_since(0, mine, besides=S)  # the shorthand's: requests naming none
    on("thread-2", "b")
    assert log.slot_used_since(0, mine, besides=S, endpoint="b")


def test_each_sessions_last_endpoint_is_its_latest_request_naming_one(log: SessionLog) -> None:
    log.ensure_session("thread-2", 0)
    log.start_epoch("thread-2", reason="start", tools_text=TOOLS, system_text=SYSTEM)

    def on(session: str, endpoint: object) -> None:
        record = request_for(log, session)
        extra = {} if endpoint is None else {"endpoint": endpoint}
        log.record_request(session, replace(record, perf=Perf(outcome="ok", extra=extra)))

    assert log.last_endpoints() == {}
    on(S, None)  # one server, nothing named
    on(S, "gpu1")
    on("thread-2", "gpu1")
    on(S, "gpu2")  # moved
    on(S, None)
    on("thread-2", 7)  # not a name
    found = log.last_endpoints()
    assert {name: endpoint for name, (endpoint, _) in found.items()} == {
        S: "gpu2",
        "thread-2": "gpu1",
    }
    assert all(created for _, created in found.values())
