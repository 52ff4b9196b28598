"""The time limit counts from the question's first asking: a restart does not extend it."""

from __future__ import annotations

import pytest

from loopd.approvals.call import AskedCall, Decision
from loopd.approvals.wait import decide

pytestmark = pytest.mark.anyio
CALL = AskedCall("s", "c1", "t", "{}", "id", asked_at=1000.0)


class Recorded:
    people = frozenset({"me"})

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def decide(self, call: AskedCall, wait_s: float) -> Decision | None:
        self.waits.append(wait_s)
        return None

    async def tell(self, call: AskedCall, decision: Decision) -> None:
        pass


async def test_the_wait_is_what_is_left_of_the_limit() -> None:
    asker = Recorded()
    decision = await decide(CALL, asker, 600.0, clock=lambda: 1400.0)
    assert asker.waits == [200.0]
    assert decision == Decision("timeout", "no answer within 10 minutes")


async def test_a_limit_already_past_denies_without_asking() -> None:
    asker = Recorded()
    assert await decide(CALL, asker, 600.0, clock=lambda: 1700.0) == Decision(
        "timeout", "no answer within 10 minutes"
    )
    assert asker.waits == []


async def test_with_nobody_to_ask_the_call_is_denied() -> None:
    decision = await decide(CALL, None, 600.0, clock=lambda: 1000.0)
    assert decision.verdict == "deny"
    assert "no person can be asked here" in decision.by
