"""Who may decide on a turn's calls and stop it: one rule, for the approval question's reaction
and for the stop word or reaction."""

from __future__ import annotations

from loopd.approvals.deciders import Deciders, may_decide

DECIDERS = Deciders.of({"Alice"}, {"carol", "dave-id"})


def test_the_people_the_turn_answers_may_decide_whatever_the_case() -> None:
    assert may_decide(DECIDERS, "alice")
    assert may_decide(DECIDERS, "ALICE", "alice-id")


def test_an_admin_may_decide_by_name_or_by_user_id() -> None:
    assert may_decide(DECIDERS, "carol", "carol-id")
    assert may_decide(DECIDERS, "dave", "dave-id")


def test_anyone_else_may_not() -> None:
    assert not may_decide(DECIDERS, "bob", "bob-id")
    assert not may_decide(DECIDERS, "", "")
    assert not may_decide(Deciders.of(()), "alice", "alice-id")
