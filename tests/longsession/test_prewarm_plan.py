"""The pure rules of which session to prewarm when a slot falls idle."""

from __future__ import annotations

from loopd.prewarm.plan import PrewarmPlan, restart_wants


def test_a_compacted_session_is_prewarmed_only_once_another_has_used_its_slot() -> None:
    plan = PrewarmPlan()
    plan.used("a", 0)
    plan.want("a", 0)
    assert plan.next_for(0) is None  # the slot still holds a's new epoch
    plan.used("b", 0)
    assert plan.next_for(0) == "a"
    assert plan.next_for(1) is None
    plan.warmed("a", 0)
    assert plan.next_for(0) is None
    assert plan.wanted() == {}


def test_the_latest_wanted_session_of_a_slot_comes_first() -> None:
    plan = PrewarmPlan()
    plan.want("a", 0)
    plan.want("b", 0)
    plan.want("c", 1)
    assert plan.next_for(0) == "b"
    plan.want("a", 0)  # wanted again: now the latest
    assert plan.next_for(0) == "a"
    assert plan.next_for(1) == "c"


def test_a_real_turn_or_a_failed_prewarm_drops_the_want() -> None:
    plan = PrewarmPlan()
    plan.want("a", 0)
    plan.drop("a")
    assert plan.next_for(0) is None
    plan.drop("never-wanted")  # harmless
    assert plan.wanted() == {}


def test_after_a_restart_each_idle_slot_reads_back_its_latest_session() -> None:
    slots = {"a": 0, "b": 0, "c": 1, "d": 2, "e": 2, "new": 3}
    last_active = {"a": 40, "b": 12, "c": 7, "d": 50, "e": 60}
    wants = restart_wants(slots, last_active, busy=["d"])
    # slot 0: a (latest); slot 1: c; slot 2: a turn of d is pending, so nothing; slot 3: "new"
    # has never been answered, so there is nothing to read back.
    assert wants == [("a", 0), ("c", 1)]


def test_after_a_restart_with_no_sessions_nothing_is_wanted() -> None:
    assert restart_wants({}, {}, busy=[]) == []
