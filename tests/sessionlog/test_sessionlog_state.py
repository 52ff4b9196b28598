"""Pure derivation of a session's pending state from its rows."""

from loopd.sessionlog.records import Entry, EntryFields, EntryKind, NoteReason
from loopd.sessionlog.replay import system_message, tool_message, user_message
from loopd.sessionlog.state import derive_state, taken_back
from loopd.wire.assemble import ToolCall
from tests.sessionlog.sessionlog_support import assistant_text


def _entries(*specs: tuple[EntryKind, str | None, str | None]) -> list[Entry]:
    entries = []
    for seq, (kind, message, call_id) in enumerate(specs, start=1):
        fields = EntryFields(
            seq, 1, kind, message, None, None, None, call_id, None, None, None, "t"
        )
        entries.append(Entry(seq, 1, fields, "p", "h"))
    return entries


OPEN = (EntryKind.EPOCH, system_message("s"), None)
USER = (EntryKind.USER, user_message("hi"), None)
CALLS = (
    EntryKind.ASSISTANT,
    assistant_text(calls=[("a", "read_file", "{}"), ("b", "write_file", "{}")]),
    None,
)


def test_a_new_epoch_waits_for_nothing() -> None:
    assert derive_state("t", _entries(OPEN)).idle


def test_last_user_message_means_a_pending_turn() -> None:
    state = derive_state("t", _entries(OPEN, USER))
    assert state.pending_turn
    assert state.interrupted_calls == ()


def test_unanswered_calls_are_interrupted_and_keyed_by_id() -> None:
    result = (EntryKind.TOOL, tool_message("a", "done"), "a")
    state = derive_state("t", _entries(OPEN, USER, CALLS, result))
    assert state.pending_turn  # the last entry is a tool result
    assert [(c.call_id, c.name, c.assistant_seq) for c in state.interrupted_calls] == [
        ("b", "write_file", 3)
    ]


def test_an_interrupted_call_is_the_call_as_streamed() -> None:
    # Spacing, key order and number spelling are the model's: a resume sends them unchanged.
    arguments = '{"path": "a b.txt",  "n":1.50}'
    calls = (EntryKind.ASSISTANT, assistant_text(calls=[("c9", "call_tool", arguments)]), None)
    state = derive_state("t", _entries(OPEN, USER, calls))
    assert [c.call for c in state.interrupted_calls] == [ToolCall("c9", "call_tool", arguments)]


def test_answered_calls_leave_a_follow_up_pending() -> None:
    results = [(EntryKind.TOOL, tool_message(i, "ok"), i) for i in ("b", "a")]
    state = derive_state("t", _entries(OPEN, USER, CALLS, *results))
    assert state.pending_turn
    assert state.interrupted_calls == ()


def test_a_final_answer_is_idle_and_broken_records_do_not_count() -> None:
    answer = (EntryKind.ASSISTANT, assistant_text("done"), None)
    broken = (EntryKind.BROKEN, None, None)
    assert derive_state("t", _entries(OPEN, USER, answer)).idle
    state = derive_state("t", _entries(OPEN, USER, broken))
    assert state.pending_turn
    assert [e.seq for e in state.broken_since] == [3]


Spec = tuple[EntryKind, str | None, str | None]
# (kind, message, call id, reason, refers_to)
Marked = tuple[EntryKind, str | None, str | None, str | None, int | None]


def _marked(spec: Spec) -> Marked:
    return (*spec, None, None)


def _log(*specs: Spec | Marked) -> list[Entry]:
    entries = []
    for seq, spec in enumerate(specs, start=1):
        kind, message, call_id, reason, refers_to = spec if len(spec) == 5 else _marked(spec)
        fields = EntryFields(
            seq, 1, kind, message, None, reason, None, call_id, None, refers_to, None, "t"
        )
        entries.append(Entry(seq, 1, fields, "p", "h"))
    return entries


ANSWER = (EntryKind.ASSISTANT, assistant_text("done"), None)
STOP: Marked = (EntryKind.BROKEN, None, None, "stopped by @alice", None)
CUT: Marked = (EntryKind.BROKEN, None, None, "the connection broke", None)  # a crash, a failure
ENDED: Marked = (EntryKind.NOTE, None, None, NoteReason.TURN_ENDED, None)


def test_an_answered_turn_is_idle_and_names_its_answer() -> None:
    state = derive_state("t", _log(OPEN, USER, ANSWER))
    assert state.idle
    assert state.answer is not None
    assert state.answer.seq == 3
    assert state.ended_by is None


def test_a_stopped_turn_ended_for_good() -> None:
    state = derive_state("t", _log(OPEN, USER, CUT, STOP))
    assert state.idle
    assert not state.pending_turn
    assert state.ended_by is not None
    assert state.ended_by.seq == 4
    assert state.answer is None


def test_a_turn_ended_without_an_answer_is_not_pending() -> None:
    for ending in ((CUT, ENDED), (CUT, CUT, ENDED)):
        state = derive_state("t", _log(OPEN, USER, *ending))
        assert not state.pending_turn
        assert state.ended_by is not None
        assert state.ended_by.kind is EntryKind.NOTE


def test_a_turn_cut_by_a_crash_or_a_restart_is_pending() -> None:
    # A broken request but no end: the process died (or was stopped) before the turn ended.
    for tail in ((), (CUT,)):
        state = derive_state("t", _log(OPEN, USER, *tail))
        assert state.pending_turn
        assert state.ended_by is None


def test_the_repeat_guards_end_after_tool_results_ends_the_turn() -> None:
    result = (EntryKind.TOOL, tool_message("a", "ok"), "a")
    result_b = (EntryKind.TOOL, tool_message("b", "ok"), "b")
    state = derive_state("t", _log(OPEN, USER, CALLS, result, result_b, ENDED))
    assert state.idle
    assert state.ended_by is not None


def test_a_new_message_after_an_ended_turn_is_pending() -> None:
    state = derive_state("t", _log(OPEN, USER, CUT, ENDED, USER))
    assert state.pending_turn
    assert state.ended_by is None


def test_an_end_record_with_no_turn_under_way_ends_nothing() -> None:
    # A stop recorded just after the turn answered: the answer stands.
    state = derive_state("t", _log(OPEN, USER, ANSWER, STOP))
    assert state.idle
    assert state.ended_by is None
    assert state.answer is not None


def test_a_taken_back_answer_makes_its_turn_pending_again() -> None:
    entries = _log(OPEN, USER, ANSWER, (EntryKind.NOTE, None, None, NoteReason.TAKEN_BACK.value, 3))
    state = derive_state("t", entries)
    assert state.pending_turn
    assert state.answer is None
    assert taken_back(entries) == {3}
    # The tail a store reads starts at the latest assistant entry: the same state.
    assert derive_state("t", entries[2:]).pending_turn


def test_a_taken_back_end_runs_the_turn_again_and_a_new_answer_settles_it() -> None:
    back: Marked = (EntryKind.NOTE, None, None, NoteReason.TAKEN_BACK.value, 4)
    assert derive_state("t", _log(OPEN, USER, CUT, STOP, back)).pending_turn
    assert derive_state("t", _log(OPEN, USER, CUT, ENDED, back)).pending_turn
    settled = derive_state("t", _log(OPEN, USER, CUT, ENDED, back, ANSWER))
    assert settled.idle
    assert settled.answer is not None
    assert settled.answer.seq == 6


def test_a_plain_note_changes_nothing() -> None:
    note: Marked = (EntryKind.NOTE, None, None, None, 2)
    assert derive_state("t", _log(OPEN, USER, note)).pending_turn
    assert derive_state("t", _log(OPEN, USER, ANSWER, note)).idle
