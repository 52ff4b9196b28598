"""The soak's end-of-run checks on made-up runs: each way a message can be lost or answered
twice is seen, and a clean run is clean."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from soak.checks import (
    Row,
    Session,
    Verdict,
    check_messages,
    latencies,
    percentile,
    slot_waits,
    tools_twice,
)
from soak.mattermost import LogEntry
from soak.users import Ledger, UserEdit, UserPost

BOT = "bot"
ROOT = "r1"
NAME = f"mm:{ROOT}"


@dataclass
class Run:
    """A made-up run: what users posted, what the fake logged, what loopd stored."""

    ledger: Ledger = field(default_factory=Ledger)
    entries: list[LogEntry] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)

    def user_post(self, post_id: str, at: float, kind: str = "message") -> None:
        self.ledger.posts.append(UserPost(post_id, "t00", ROOT, "u00", kind, "hi", at))
        self.entries.append(LogEntry("created", post_id, "u00", "c", ROOT, "hi", {}, at))

    def bot(self, action: str, post_id: str, key: str, at: float, part: int = 0) -> None:
        props: dict[str, Any] = {"loopd_turn": key, "loopd_part": part}
        self.entries.append(LogEntry(action, post_id, BOT, "c", ROOT, "text", props, at))

    def stored(self, seq: int, key: str, content: str = "@u00: hi") -> None:
        message = {"role": "user", "content": content}
        self.rows.append(Row(seq, "user", message, key, None, None))

    def answer(self, seq: int, tool_calls: bool = False) -> None:
        message: dict[str, Any] = {"role": "assistant", "content": "ok"}
        if tool_calls:
            message["tool_calls"] = [{"id": "x"}]
        self.rows.append(Row(seq, "assistant", message, None, None, None))

    def broken(self, seq: int, reason: str) -> None:
        self.rows.append(Row(seq, "broken", None, None, reason, None))

    def check(self) -> Verdict:
        return check_messages(self.ledger, self.entries, BOT, [Session(NAME, 0, tuple(self.rows))])


def answered_turn(run: Run) -> None:
    """p1 posted at 1, stored, answered: status post, draft, draft becomes the answer at 4."""
    run.user_post("p1", 1.0)
    run.stored(1, "p1")
    run.answer(2)
    run.bot("created", "s1", f"{NAME}#1:status", 2.0)
    run.bot("created", "d1", f"{NAME}#1:draft", 3.0)
    run.bot("edited", "d1", f"{NAME}#2", 4.0)
    run.bot("deleted", "s1", f"{NAME}#1:status", 4.5)


def test_a_clean_run_is_clean() -> None:
    run = Run()
    answered_turn(run)
    verdict = run.check()
    assert (verdict.lost, verdict.answered_twice, verdict.stored_twice) == ([], [], [])
    assert (verdict.answers, verdict.turns) == (1, 1)
    [cover] = verdict.coverage
    assert (cover.how, cover.key, cover.at) == ("answer", f"{NAME}#2", 4.0)
    assert [lat.seconds for lat in latencies(verdict.coverage, [])] == [3.0]


def test_a_message_stored_and_never_answered_is_lost() -> None:
    run = Run()
    run.user_post("p1", 1.0)
    run.stored(1, "p1")
    assert run.check().lost == ["p1 (t00): stored as mm:r1#1, never answered"]


def test_an_answer_in_the_log_that_never_reached_the_thread_loses_the_message() -> None:
    run = Run()
    run.user_post("p1", 1.0)
    run.stored(1, "p1")
    run.answer(2)
    assert run.check().lost == ["p1 (t00): covered by mm:r1#2 in the log, never posted"]


def test_a_message_never_stored_is_lost_unless_a_notice_said_why() -> None:
    run = Run()
    run.user_post("p1", 1.0)
    assert len(run.check().lost) == 1
    run.bot("created", "n1", "full:p1", 2.0)
    verdict = run.check()
    assert verdict.lost == []
    assert verdict.coverage[0].how == "notice"


def test_an_error_post_covers_the_message_of_a_failed_turn() -> None:
    run = Run()
    run.user_post("p1", 1.0)
    run.stored(1, "p1")
    run.broken(2, "request failed")
    run.bot("created", "e1", f"{NAME}#2:failed", 3.0)
    verdict = run.check()
    assert verdict.lost == []
    assert (verdict.coverage[0].how, verdict.errors) == ("error", 1)


def test_an_error_then_an_answer_is_counted_but_not_twice() -> None:
    run = Run()
    run.user_post("p1", 1.0)
    run.stored(1, "p1")
    run.broken(2, "request failed")
    run.bot("created", "e1", f"{NAME}#2:failed", 3.0)
    run.answer(3)
    run.bot("created", "a1", f"{NAME}#3", 5.0)
    verdict = run.check()
    assert (verdict.lost, verdict.answered_twice, verdict.error_then_answered) == ([], [], 1)


def test_a_reply_key_posted_twice_is_answered_twice() -> None:
    run = Run()
    answered_turn(run)
    run.bot("created", "d2", f"{NAME}#2", 6.0)
    assert run.check().answered_twice == [f"{NAME}#2 part 0 posted 2 times"]


def test_an_answer_with_no_new_message_is_answered_twice() -> None:
    run = Run()
    answered_turn(run)
    run.answer(3)  # the same turn run again after its answer
    run.bot("created", "a2", f"{NAME}#3", 8.0)
    assert run.check().answered_twice == [f"{NAME}#3: an answer with no new message before it"]


def test_a_bot_answer_the_log_does_not_hold_is_answered_twice() -> None:
    run = Run()
    answered_turn(run)
    run.bot("created", "a9", f"{NAME}#9", 8.0)
    assert run.check().answered_twice == [f"{NAME}#9: posted, but no such answer in the log"]


def test_a_message_stored_twice_is_reported() -> None:
    run = Run()
    answered_turn(run)
    run.stored(3, "p1")
    run.answer(4)
    run.bot("created", "a2", f"{NAME}#4", 8.0)
    assert run.check().stored_twice == ["p1 (t00) stored 2 times"]


def test_messages_of_one_turn_are_answered_together() -> None:
    run = Run()
    run.user_post("p1", 1.0)
    run.user_post("p2", 2.0)
    run.stored(1, "p1")
    run.stored(2, "p2")
    run.answer(3, tool_calls=True)  # a tool round does not end the turn
    run.answer(5)
    run.bot("created", "a1", f"{NAME}#5", 9.0)
    verdict = run.check()
    assert verdict.lost == []
    assert {c.key for c in verdict.coverage} == {f"{NAME}#5"}
    assert [lat.seconds for lat in latencies(verdict.coverage, [7.5])] == [8.0]
    assert latencies(verdict.coverage, [7.5])[0].with_fault


def test_a_compaction_summary_does_not_end_a_turn() -> None:
    run = Run()
    answered_turn(run)
    run.user_post("p2", 10.0)
    run.stored(3, "p2")
    run.stored(4, "loopd-compaction:mm:r1:1", "[loopd] compact")
    run.answer(5)  # the summary
    run.stored(6, "loopd-summary:mm:r1:2", "summary")
    run.stored(7, "loopd-carry:mm:r1:2:0", "@u00: hi")
    run.answer(8)
    run.bot("created", "a2", f"{NAME}#8", 12.0)
    verdict = run.check()
    assert (verdict.lost, verdict.answered_twice) == ([], [])
    assert verdict.answers == 2
    assert verdict.coverage[1].key == f"{NAME}#8"


def test_a_summary_finished_after_messages_came_is_still_the_summary() -> None:
    """A kill cut the compaction short after its instruction; messages stored meanwhile come
    between the instruction and the summary the next turn finishes it with."""
    run = Run()
    answered_turn(run)
    run.user_post("p2", 10.0)
    run.stored(3, "loopd-compaction:mm:r1:1", "[loopd] compact")
    run.stored(4, "p2")
    run.answer(5)  # the summary
    run.stored(6, "loopd-summary:mm:r1:2", "summary")
    run.stored(7, "loopd-carry:mm:r1:2:0", "@u00: hi")
    run.answer(8)
    run.bot("created", "a2", f"{NAME}#8", 12.0)
    verdict = run.check()
    assert (verdict.lost, verdict.answered_twice) == ([], [])
    assert verdict.coverage[1].key == f"{NAME}#8"


def test_an_answer_after_a_compaction_whose_summary_broke_ends_the_turn() -> None:
    """Seen in ``make soak``: the server killed under the summary request, the compaction went on
    with an excerpt and a new epoch, and the model's next answer was posted (loopd's rule,
    ``loopd.chat.threads.latest_answer``); the check took it for the summary still awaited."""
    run = Run()
    answered_turn(run)
    run.user_post("p2", 10.0)
    run.stored(3, "p2")
    run.stored(4, "loopd-compaction:mm:r1:1", "[loopd] compact")
    run.broken(5, "llama-server broke off the stream")  # the summary request
    run.rows.append(Row(6, "epoch", None, None, "compaction", None))
    run.stored(7, "loopd-summary:mm:r1:2", "excerpt")
    run.stored(8, "loopd-carry:mm:r1:2:0", "@u00: hi")
    run.answer(9)
    run.bot("created", "a2", f"{NAME}#9", 12.0)
    verdict = run.check()
    assert (verdict.lost, verdict.answered_twice) == ([], [])
    assert verdict.answers == 2
    assert verdict.coverage[1].key == f"{NAME}#9"


def test_a_stop_is_covered_by_the_stop_or_a_notice() -> None:
    run = Run()
    run.user_post("p1", 1.0)
    run.stored(1, "p1")
    run.user_post("s1", 2.0, kind="stop")
    run.broken(2, "stopped by @u00")
    run.bot("created", "x1", f"{NAME}#2:stopped", 3.0)
    verdict = run.check()
    assert verdict.lost == []
    assert [c.how for c in verdict.coverage] == ["stopped", "stopped"]
    assert verdict.stops == 1
    run.user_post("s2", 5.0, kind="stop")
    assert run.check().lost == ["s2 (t00): a stop with neither a stop nor a notice"]
    run.bot("created", "x2", "stop:s2", 6.0)
    assert run.check().lost == []


def test_an_edit_of_a_message_already_read_needs_its_notice() -> None:
    run = Run()
    answered_turn(run)
    run.ledger.edits.append(UserEdit("p1", "t00", 5.0))
    assert run.check().lost == ["p1: edited after it was read, and no edit notice came"]
    run.bot("created", "n1", "edit:p1", 6.0)
    verdict = run.check()
    assert (verdict.lost, verdict.edits_acknowledged) == ([], 1)


def test_a_message_first_read_after_its_edit_needs_no_notice() -> None:
    run = Run()
    run.user_post("p1", 1.0)
    run.stored(1, "p1", "@u00: hi (edited)")
    run.answer(2)
    run.bot("created", "a1", f"{NAME}#2", 4.0)
    run.ledger.edits.append(UserEdit("p1", "t00", 0.5))
    assert run.check().lost == []


def test_slot_waits_run_from_the_status_post_to_the_slot() -> None:
    run = Run()
    run.bot("created", "s1", f"{NAME}#1:status", 10.0)
    run.entries.append(
        LogEntry("edited", "s1", BOT, "c", ROOT, "⏳ waiting for its turn (behind 1)", {}, 11.0)
    )
    run.entries.append(LogEntry("edited", "s1", BOT, "c", ROOT, "📖 reading", {}, 15.0))
    run.bot("created", "s2", f"{NAME}#3:status", 20.0)
    run.bot("deleted", "s2", f"{NAME}#3:status", 21.0)
    [slot] = slot_waits(run.entries, BOT, {NAME: 1})
    assert (slot.slot, slot.waits, slot.longest, slot.mean) == (1, (5.0, 1.0), 5.0, 3.0)


def test_tools_twice_and_percentiles() -> None:
    assert tools_twice(["a-1", "a-2", "a-1", "b-1", "b-1", "b-1"]) == ["a-1", "b-1"]
    assert tools_twice(["a-1", "a-2"]) == []
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 0.5), percentile(values, 0.95), percentile(values, 0.99)) == (
        50.0,
        95.0,
        99.0,
    )
    assert percentile([], 0.5) is None
    assert json.dumps(percentile([3.0], 0.99)) == "3.0"


def test_a_run_that_did_not_settle_leaves_pending_what_loopd_still_holds() -> None:
    run = Run()
    run.user_post("p1", 1.0)
    run.stored(1, "p1")  # its turn was still to come when loopd was stopped
    run.user_post("p2", 2.0)  # held while a turn ran
    run.user_post("p3", 3.0)  # nowhere: lost, settled or not
    verdict = check_messages(
        run.ledger,
        run.entries,
        BOT,
        [Session(NAME, 0, tuple(run.rows))],
        settled=False,
        held=frozenset({"p2"}),
    )
    assert [line.split(" ")[0] for line in verdict.pending] == ["p1", "p2"]
    assert verdict.lost == ["p3 (t00): never stored, and no notice said why"]
    settled = check_messages(
        run.ledger, run.entries, BOT, [Session(NAME, 0, tuple(run.rows))], held=frozenset({"p2"})
    )
    assert settled.pending == []
    assert len(settled.lost) == 3
    assert "p2 (t00): held by loopd, never taken in" in settled.lost
