"""Pure derivation of a session's pending state from its rows."""

from loopd.sessionlog.records import Entry, EntryFields, EntryKind
from loopd.sessionlog.replay import system_message, tool_message, user_message
from loopd.sessionlog.state import derive_state
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
