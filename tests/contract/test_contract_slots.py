"""Finding (d): slot pinning, the host prompt cache, and a model unload that empties the cache."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loopd_dev import devserver
from loopd_dev.fakes.llama import serve_fake_llama
from tests.contract.conftest import (
    FAKE_DROP,
    FAKE_PLAIN,
    HYBRID_DROP,
    HYBRID_KEEP,
    REAL_KINDS,
    Record,
    fake_llama,
    start_hybrid_server,
    start_own_server,
)
from tests.contract.contract_kit import (
    CHECKPOINT_BEFORE_END,
    Endpoint,
    Message,
    Target,
    carried_forward,
    complete,
    cost,
)

pytestmark = pytest.mark.anyio


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def notes(name: str, n: int = 120) -> str:
    return f"Session {name} notes. " + " ".join(f"{name}{i}" for i in range(n))


async def test_d_two_sessions_on_two_slots_do_not_disturb_each_other(
    target: Target, record: Record
) -> None:
    endpoint = target.plain
    a: list[Message] = [user(notes("alpha"))]
    b: list[Message] = [user(notes("beta"))]
    a1 = await complete(endpoint, a, id_slot=0, max_tokens=4)
    b1 = await complete(endpoint, b, id_slot=1, max_tokens=4)
    a += [a1.replay(), user("Next.")]
    b += [b1.replay(), user("Next.")]
    a2 = await complete(endpoint, a, id_slot=0, max_tokens=4)
    b2 = await complete(endpoint, b, id_slot=1, max_tokens=4)
    if target.hybrid:
        # One pool, --cache-idle-slots on (the default): each launch saved the other, idle slot
        # to the host cache and cleared it, and a pinned request is never restored from there.
        assert (a2.timings.cache_n, b2.timings.cache_n) == (0, 0), (cost(a2), cost(b2))
    else:
        assert a2.timings.cache_n == carried_forward(a1)
        assert b2.timings.cache_n == carried_forward(b1)
    record(
        "d-pin",
        target.kind,
        f"A turn 2 cache_n {a2.timings.cache_n} prompt_n {a2.timings.prompt_n}; "
        f"B turn 2 cache_n {b2.timings.cache_n} prompt_n {b2.timings.prompt_n}",
        a2=cost(a2),
        b2=cost(b2),
    )


async def test_d_evicted_session_returns_cheaply_on_its_slot_only(
    target: Target, record: Record
) -> None:
    """Others' prompts on its slot push a session out; the host prompt cache brings it back on
    the same slot. On another slot it is read again in full."""
    endpoint = target.plain
    session = [user(notes("gamma"))]
    first = await complete(endpoint, session, id_slot=0, max_tokens=4)
    for other in ("delta", "epsilon"):
        await complete(endpoint, [user(notes(other, 150))], id_slot=0, max_tokens=4)
    back = await complete(endpoint, session, id_slot=0, max_tokens=4)
    moved = await complete(endpoint, session, id_slot=1, max_tokens=4)
    length = first.timings.cache_n + first.timings.prompt_n
    assert back.timings.cache_n >= target.resend_floor(length), f"not restored: {cost(back)}"
    assert moved.timings.cache_n < 0.1 * length, f"restored on another slot: {cost(moved)}"
    record(
        "d-evict",
        target.kind,
        f"same slot: cache_n {back.timings.cache_n} prompt_n {back.timings.prompt_n}; "
        f"other slot: cache_n {moved.timings.cache_n} prompt_n {moved.timings.prompt_n}",
        back=cost(back),
        moved=cost(moved),
    )


@pytest.fixture(params=[*REAL_KINDS, "fake"])
async def one_model_router(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[str, Endpoint, Endpoint]]:
    """A router with --models-max 1: (kind, first model, second model)."""
    with tempfile.TemporaryDirectory(prefix="lm") as tmp:
        if request.param == "hybrid":
            hybrid = start_hybrid_server(Path(tmp), models_max=1)
            try:
                yield (
                    "hybrid",
                    Endpoint(hybrid.url, HYBRID_KEEP),
                    Endpoint(hybrid.url, HYBRID_DROP),
                )
            finally:
                hybrid.stop()
            return
        if request.param == "real":
            server = start_own_server(Path(tmp), models_max=1)
            try:
                yield (
                    "real",
                    Endpoint(server.url, devserver.PLAIN_MODEL),
                    Endpoint(server.url, devserver.THINKING_MODEL),
                )
            finally:
                server.stop()
            return
        uds = Path(tmp) / "llama.sock"
        async with serve_fake_llama(fake_llama(models_max=1), uds=uds):
            url = f"unix:{uds}"
            yield "fake", Endpoint(url, FAKE_PLAIN), Endpoint(url, FAKE_DROP)


async def test_d_loading_a_second_model_drops_the_first_ones_cache(
    one_model_router: tuple[str, Endpoint, Endpoint], record: Record
) -> None:
    kind, first, second = one_model_router
    session = [user(notes("zeta"))]
    warm = await complete(first, session, id_slot=0, max_tokens=4)
    again = await complete(first, session, id_slot=0, max_tokens=4)
    await complete(second, [user("Hello.")], id_slot=0, max_tokens=4)
    cold = await complete(first, session, id_slot=0, max_tokens=4)
    length = warm.timings.cache_n + warm.timings.prompt_n
    back = CHECKPOINT_BEFORE_END if kind == "hybrid" else 1
    assert again.timings.cache_n >= length - back
    assert cold.timings.cache_n < 0.1 * length, f"the cache survived the unload: {cost(cold)}"
    record(
        "d-unload",
        kind,
        f"warm cache_n {again.timings.cache_n}; after the other model loaded: "
        f"cache_n {cold.timings.cache_n} prompt_n {cold.timings.prompt_n}",
        warm=cost(again),
        cold=cost(cold),
    )
