"""The durable-session rule (pure): which save is usable, when to restore, when a restore counts,
and the causes the cache-loss rule names for them."""

from __future__ import annotations

import errno
from dataclasses import replace
from pathlib import Path

import pytest

from loopcommon.slotfiles import belongs_to, fingerprint_of, is_slot_file_name
from loopd.engine.cacheloss import Circumstances, LossCause, PrevRequest, cache_loss
from loopd.engine.durable import (
    DurableMode,
    RestoreOutcome,
    Saved,
    after_restore,
    decide_durable,
    last_run_slot,
    moved,
    probe_name,
    restore_target,
    save_name,
    usable,
    worth_restoring,
)
from loopd.turn.saves import SaveBook

TOOLS = '[{"type":"function","function":{"name":"read_file"}}]'
TURN = ['{"role":"system","content":"s"}', '{"role":"user","content":"hi"}']
REPLY = '{"role":"assistant","content":"hello"}'
MODEL = "0123456789ab"  # the fingerprint of the weights the server runs


def saved_after(messages: list[str], n_saved: int = 300, slot: int = 0) -> Saved:
    return Saved(
        save_name("t-1", TOOLS, messages, MODEL), len(messages), n_saved, slot, None, MODEL
    )


@pytest.mark.parametrize(
    ("mode", "selftest", "recorded", "on"),
    [
        (DurableMode.AUTO, True, None, True),
        (DurableMode.AUTO, False, True, False),  # this process's self-test wins
        (DurableMode.AUTO, None, True, True),  # loopd chat: what `selftest --record` stored
        (DurableMode.AUTO, None, False, False),
        (DurableMode.AUTO, None, None, False),
        (DurableMode.ON, None, None, True),
        (DurableMode.OFF, True, True, False),
    ],
)
def test_auto_goes_by_the_self_test_else_the_recorded_answer(
    mode: DurableMode, selftest: bool | None, recorded: bool | None, on: bool
) -> None:
    assert decide_durable(mode, selftest=selftest, recorded=recorded).on is on


def test_a_save_is_usable_for_a_request_that_extends_its_exact_prefix() -> None:
    held = [*TURN, REPLY]
    saved = saved_after(held)
    assert is_slot_file_name(saved.file)
    assert belongs_to(saved.file, "t-1")
    after = [*held, '{"role":"user","content":"and now?"}']
    assert (
        usable(saved, session="t-1", tools_text=TOOLS, messages=after, slot=0, fingerprint=MODEL)
        == saved
    )


@pytest.mark.parametrize(
    ("session", "tools", "messages", "slot"),
    [
        ("t-2", TOOLS, [*TURN, REPLY, "{}"], 0),  # another session's file
        ("t-1", "[]", [*TURN, REPLY, "{}"], 0),  # another epoch's tools
        ("t-1", TOOLS, [*TURN, '{"role":"assistant","content":"hello!"}', "{}"], 0),  # rewritten
        ("t-1", TOOLS, TURN, 0),  # shorter than the state
        ("t-1", TOOLS, [*TURN, REPLY, "{}"], 1),  # another slot
    ],
)
def test_a_save_is_never_used_for_another_prefix(
    session: str, tools: str, messages: list[str], slot: int
) -> None:
    saved = saved_after([*TURN, REPLY])
    assert (
        usable(
            saved,
            session=session,
            tools_text=tools,
            messages=messages,
            slot=slot,
            fingerprint=MODEL,
        )
        is None
    )


def test_a_save_is_never_restored_into_other_weights() -> None:
    held = [*TURN, REPLY]
    saved = saved_after(held)
    after = [*held, "{}"]
    for now in ("ba9876543210", None):
        assert (
            usable(saved, session="t-1", tools_text=TOOLS, messages=after, slot=0, fingerprint=now)
            is None
        )
    unbound = Saved(saved.file, saved.message_count, saved.n_saved, 0)  # recorded before binding
    assert (
        usable(unbound, session="t-1", tools_text=TOOLS, messages=after, slot=0, fingerprint=MODEL)
        is None
    )
    assert fingerprint_of(saved.file) == MODEL


def test_a_placed_request_may_take_a_restore_into_any_slot() -> None:
    """Where the server places requests, the slot the save came from does not matter (a
    restore goes into an idle one); the prefix still does."""
    held = [*TURN, REPLY]
    saved = saved_after(held, slot=3)
    after = [*held, "{}"]
    assert (
        usable(saved, session="t-1", tools_text=TOOLS, messages=after, slot=None, fingerprint=MODEL)
        == saved
    )
    assert (
        usable(saved, session="t-2", tools_text=TOOLS, messages=after, slot=None, fingerprint=MODEL)
        is None
    )


def test_a_moved_session_takes_its_save_to_a_server_of_the_same_model() -> None:
    """A save made on endpoint ``a`` (slot 0 there) is usable on ``b``, where the session has
    slot 1, for the same weights only; on ``a`` it is still bound to its own slot."""
    held = [*TURN, REPLY]
    saved = replace(saved_after(held), endpoint="a")
    after = [*held, "{}"]

    def on(endpoint: str, fingerprint: str) -> Saved | None:
        return usable(
            saved,
            session="t-1",
            tools_text=TOOLS,
            messages=after,
            slot=1,
            fingerprint=fingerprint,
            endpoint=endpoint,
        )

    assert moved(saved, "b")
    assert on("b", MODEL) == saved
    assert on("b", "ba9876543210") is None  # other weights there
    assert not moved(saved, "a")
    assert on("a", MODEL) is None  # its own server: its own slot only


# A /slots answer: slot 0 ran task 7, slot 1 task 12, slot 2 none yet, slot 3 runs task 15.
SLOTS = [
    {"id": 0, "id_task": 7, "is_processing": False},
    {"id": 1, "id_task": 12, "is_processing": False},
    {"id": 2, "is_processing": False},
    {"id": 3, "id_task": 15, "is_processing": True},
]


def test_the_saved_slot_is_the_idle_one_that_ran_the_newest_task() -> None:
    assert last_run_slot(SLOTS) == 1
    assert last_run_slot([{"id": 0, "is_processing": False}]) is None


def test_a_restore_goes_into_loopds_idle_slot_used_longest_ago_and_not_claimed() -> None:
    assert restore_target(SLOTS, allowed=(0, 1, 2, 3), claimed=()) == 2  # never used
    assert restore_target(SLOTS, allowed=(0, 1), claimed=()) == 0
    assert restore_target(SLOTS, allowed=(0, 1), claimed={0}) == 1
    assert restore_target(SLOTS, allowed=(3,), claimed=()) is None  # busy: none idle


def test_restore_only_when_the_server_lost_enough() -> None:
    saved = saved_after([*TURN, REPLY], n_saved=300)
    assert worth_restoring(saved, 0)  # a restarted server
    assert worth_restoring(saved, 100)  # less than half kept
    assert not worth_restoring(saved, 250)  # a hybrid checkpoint before a short reply
    assert not worth_restoring(saved, 299)
    big = saved_after([*TURN, REPLY], n_saved=30_000)
    assert worth_restoring(big, 29_000)  # a thousand tokens to re-read: worth a restore
    assert not worth_restoring(big, 29_800)


def test_a_restore_counts_only_when_the_next_request_reused_it() -> None:
    assert after_restore(None, 0, 0) is RestoreOutcome.REFUSED
    assert after_restore(300, 0, 299) is RestoreOutcome.RESTORED
    # The known trap: a success answer, then nothing reused.
    assert after_restore(300, 0, 0) is RestoreOutcome.UNCONFIRMED
    assert after_restore(300, 0, 100) is RestoreOutcome.UNCONFIRMED
    # It put back nothing the server did not already hold.
    assert after_restore(300, 290, 292) is RestoreOutcome.UNCONFIRMED


def test_the_probe_name_is_loopds_shape_and_no_threads() -> None:
    name = probe_name("smollm2")
    assert is_slot_file_name(name)
    assert not belongs_to(name, "smollm2")


PREV = PrevRequest(
    epoch_id=1,
    slot=0,
    cache_n=0,
    prompt_n=300,
    predicted_n=20,
    complete=True,
    capped=False,
    had_reasoning=False,
)


@pytest.mark.parametrize(
    ("restore", "cache_n", "cause", "lost"),
    [
        (RestoreOutcome.RESTORED, 318, LossCause.RESTORED, 0),
        (RestoreOutcome.REFUSED, 0, LossCause.RESTORE_REFUSED, 319),
        (RestoreOutcome.UNCONFIRMED, 0, LossCause.RESTORE_UNCONFIRMED, 319),
        (None, 0, LossCause.SERVER_RESTARTED, 319),
        (None, 2, LossCause.COLD, 317),  # a token or two kept: not an empty slot
    ],
)
def test_the_cache_loss_rule_names_what_durable_sessions_did(
    restore: RestoreOutcome | None, cache_n: int, cause: LossCause, lost: int
) -> None:
    loss = cache_loss(
        PREV,
        epoch_id=1,
        slot=0,
        cache_n=cache_n,
        around=Circumstances(durable=True, restore=restore),
    )
    assert (loss.cause, loss.lost) == (cause, lost)
    assert loss.label == cause.value


def test_without_durable_sessions_an_empty_slot_stays_a_cold_server() -> None:
    loss = cache_loss(PREV, epoch_id=1, slot=0, cache_n=0, around=Circumstances())
    assert loss.cause is LossCause.COLD


def test_the_save_book_keeps_the_latest_save_and_forgets_it(tmp_path: Path) -> None:
    book = SaveBook(tmp_path)
    assert book.latest("t-1") is None
    saved = saved_after([*TURN, REPLY])
    book.record("t-1", saved)
    assert book.latest("t-1") == saved
    assert book.latest("t-2") is None
    book.forget("t-1")
    assert book.latest("t-1") is None


def _disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk: no new file can be written (the record's temporary file)."""

    def refuse(self: Path, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_bytes", refuse)


def test_on_a_full_disk_the_latest_save_is_recorded_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # brokerd removed the older save's file when the newer one succeeded: the record must not
    # keep naming it (make soak's disk-full fault: restores of files that were gone).
    book = SaveBook(tmp_path)
    older = saved_after(TURN, n_saved=200)
    book.record("t-1", older)
    newer = saved_after([*TURN, REPLY], n_saved=300)
    assert newer.file != older.file
    _disk_full(monkeypatch)
    book.record("t-1", newer)
    assert book.latest("t-1") == newer
    assert [p.name for p in book.folder.iterdir()] == [book._path("t-1").name]  # no .tmp left
    book.record("t-2", newer)  # a session with no record yet: none, and nothing raised
    assert book.latest("t-2") is None


def test_a_record_that_cannot_be_rewritten_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    book = SaveBook(tmp_path)
    book.record("t-1", saved_after(TURN, n_saved=200))
    _disk_full(monkeypatch)

    def refuse_open(self: Path, *args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "open", refuse_open)
    book.record("t-1", saved_after([*TURN, REPLY], n_saved=300))
    assert not book._path("t-1").exists()  # no record: no restore of a file that is gone


def test_an_unreadable_or_foreign_record_means_no_restore(tmp_path: Path) -> None:
    book = SaveBook(tmp_path)
    book.record("t-1", Saved("../etc/passwd", 2, 300, 0))
    assert book.latest("t-1") is None
    next(book.folder.iterdir()).write_text("{not json")
    assert book.latest("t-1") is None
