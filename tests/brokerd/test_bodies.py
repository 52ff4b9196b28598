"""Request bodies within limits: the cap, the deadline and the shared memory budget."""

from collections.abc import Sequence

import anyio
import pytest
from starlette.types import Message, Receive, Scope

from brokerd.bodies import (
    BodiesBusy,
    BodyBudget,
    BodyRules,
    BodyTimeout,
    BodyTooLarge,
    read_body,
)

pytestmark = pytest.mark.anyio


def scope(length: int | None) -> Scope:
    headers = [] if length is None else [(b"content-length", str(length).encode())]
    return {"type": "http", "headers": headers}


def receiving(chunks: Sequence[bytes], *, then_wait: bool = False) -> Receive:
    queue = list(chunks)

    async def receive() -> Message:
        if queue:
            chunk = queue.pop(0)
            more = bool(queue) or then_wait
            return {"type": "http.request", "body": chunk, "more_body": more}
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    return receive


async def test_a_declared_length_is_reserved_before_reading_and_released_after() -> None:
    budget = BodyBudget(100)
    held = await read_body(scope(60), receiving([b"x" * 60]), 100, BodyRules(budget))
    assert (held.data, budget.held) == (b"x" * 60, 60)
    with pytest.raises(BodiesBusy):
        await read_body(scope(60), receiving([b"y" * 60]), 100, BodyRules(budget))
    held.release()
    held.release()  # a second release gives nothing back twice
    assert budget.held == 0


async def test_a_declared_length_over_the_cap_is_refused_unread() -> None:
    with pytest.raises(BodyTooLarge, match="over the 10-byte limit"):
        await read_body(scope(11), receiving([]), 10, BodyRules())


async def test_a_body_without_length_takes_from_the_budget_as_it_arrives() -> None:
    budget = BodyBudget(100)
    with pytest.raises(BodiesBusy):
        await read_body(scope(None), receiving([b"a" * 60, b"b" * 60]), 1000, BodyRules(budget))
    assert budget.held == 0, "what a refused body took is given back"
    with pytest.raises(BodyTooLarge):
        await read_body(scope(None), receiving([b"a" * 8, b"b" * 8]), 10, BodyRules(budget))


async def test_a_body_not_finished_in_time_is_refused_and_released() -> None:
    budget = BodyBudget(100)
    rules = BodyRules(budget, timeout_s=0.05)
    with pytest.raises(BodyTimeout, match=r"not received within 0\.05 s"):
        await read_body(scope(50), receiving([b"x" * 10], then_wait=True), 100, rules)
    assert budget.held == 0
