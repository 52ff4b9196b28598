"""The bounds on what one audit row holds (pure)."""

import hashlib

from brokerd.tools.auditbounds import WriteBudget, excerpt, reduced


def test_an_excerpt_keeps_the_first_bytes_the_length_and_the_hash_of_the_whole() -> None:
    whole = "é" * 10  # two bytes each: the cut falls inside one and drops it
    cut = excerpt(whole, 5)
    assert cut.text == "éé"
    assert cut.size == 20
    assert cut.sha256 == hashlib.sha256(whole.encode()).hexdigest()
    assert cut.dropped == 16
    assert excerpt("short", 5).text == "short"
    assert reduced(cut).text == ""
    assert reduced(cut).dropped == 20


def test_the_budget_is_per_session_and_in_all_per_minute() -> None:
    budget = WriteBudget(per_session=10, total=15)
    assert budget.allow("a", 10, minute=1)
    assert not budget.allow("a", 1, minute=1)
    assert budget.allow("b", 5, minute=1)
    assert not budget.allow("c", 1, minute=1)  # all sessions together are at 15
    assert budget.allow("a", 10, minute=2)  # a new minute starts from nothing
