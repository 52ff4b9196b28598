"""Finding (d) on the unified pool: does another slot's request clear a pinned session's cache?

Production runs four slots on one unified KV pool, with the host prompt cache and, as the server
starts by default, ``--cache-idle-slots`` (docs/production-shape.md). The contract's (d) was
measured on two slots of their own. Here the same question runs on the unified pool, for the
dense SmolLM2 and the hybrid ``qwen35moe``, with the server's default flags and with
``--no-cache-idle-slots``, for a session pinned to its slot and for one the server places
(``id_slot`` -1). Between the session's two requests runs either another session on another
slot, or another client's long, unrelated prompt.

Scripted replies with ``max_tokens`` 1: the slot then holds exactly the prompt, so what the
next request reuses is the server's doing alone. The fake has no unified pool; these run on the
real server only.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from loopd_dev import devserver
from tests.contract.conftest import Record
from tests.contract.contract_kit import CHECKPOINT_BEFORE_END, Endpoint, Message, complete, cost

pytestmark = [pytest.mark.anyio, pytest.mark.real_server]

HYBRID_DEFAULT, HYBRID_KEEP = "unified-qwen35moe", "unified-qwen35moe-no-idle-clear"
DENSE_DEFAULT, DENSE_KEEP = "unified-smollm2", "unified-smollm2-no-idle-clear"


@dataclass(frozen=True)
class Pool:
    """One model on a unified pool of four slots."""

    kind: str  # "real" (SmolLM2) or "hybrid", the contract table's columns
    endpoint: Endpoint
    clears_idle_slots: bool

    @property
    def resend_back(self) -> int:
        """Tokens a prompt sent again re-reads at least (see ``Target.resend_floor``)."""
        return CHECKPOINT_BEFORE_END if self.kind == "hybrid" else 1


def presets(prov: devserver.Provisioned) -> tuple[devserver.Preset, ...]:
    unified = devserver.SlotLayout()  # four slots, one 16,384-token pool
    dense_pool = devserver.SlotLayout(ctx_size=8192)
    chatml = (("chat-template", "chatml"),)
    keep = (*chatml, ("cache-idle-slots", "false"))
    return (
        devserver.hybrid_preset(prov, None, name=HYBRID_DEFAULT, layout=unified, extra=chatml),
        devserver.hybrid_preset(prov, None, name=HYBRID_KEEP, layout=unified, extra=keep),
        devserver.dense_preset(prov, None, name=DENSE_DEFAULT, layout=dense_pool, extra=chatml),
        devserver.dense_preset(prov, None, name=DENSE_KEEP, layout=dense_pool, extra=keep),
    )


@pytest.fixture(scope="module")
def pool_router() -> Iterator[devserver.RunningServer]:
    with tempfile.TemporaryDirectory(prefix="lp") as tmp:
        work = Path(tmp)
        prov = devserver.Provisioned.in_cache(devserver.default_cache_dir())
        names = (HYBRID_DEFAULT, HYBRID_KEEP, DENSE_DEFAULT, DENSE_KEEP)
        try:
            server = devserver.start(
                work,
                devserver.default_cache_dir(),
                socket_path=work / "llama.sock",
                layout=devserver.ServerLayout(models_max=len(names)),
                presets=presets(prov),
                load=names,
            )
        except devserver.DevServerError as exc:
            pytest.fail(f"the unified-pool llama-server could not start: {exc}")
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(
    params=[
        ("hybrid", HYBRID_DEFAULT, True),
        ("hybrid", HYBRID_KEEP, False),
        ("real", DENSE_DEFAULT, True),
        ("real", DENSE_KEEP, False),
    ],
    ids=["hybrid-default", "hybrid-no-idle-clear", "dense-default", "dense-no-idle-clear"],
)
def pool(request: pytest.FixtureRequest, pool_router: devserver.RunningServer) -> Pool:
    kind, model, clears = request.param
    return Pool(kind, Endpoint(pool_router.url, model), clears)


def opening(name: str, words: int = 40) -> list[Message]:
    text = f"Session {name} notes: " + " ".join(f"{name}{i}" for i in range(words))
    return [{"role": "user", "content": text}]


async def two_requests_with_another_between(
    pool: Pool, name: str, slot: int, other: list[Message], other_slot: int
) -> tuple[int, int]:
    """The session's prompt, then ``other`` on ``other_slot``, then the session's next prompt:
    (what the session left in the server, what its next request reused)."""
    messages = opening(name)
    first = await complete(pool.endpoint, messages, id_slot=slot, max_tokens=1)
    await complete(pool.endpoint, other, id_slot=other_slot, max_tokens=1)
    messages += [
        {"role": "assistant", "content": f"Noted, {name}."},
        {"role": "user", "content": "Next point."},
    ]
    second = await complete(pool.endpoint, messages, id_slot=slot, max_tokens=1)
    held = first.timings.cache_n + first.timings.prompt_n
    return held, second.timings.cache_n


async def test_d_unified_pool_pinned_and_unpinned_sessions(pool: Pool, record: Record) -> None:
    """Pinned: with --cache-idle-slots (the default) another slot's launch clears the session's
    slot and the pinned request is not restored; without it, the slot keeps its prompt.
    Unpinned: the server restores the session from the host cache (or finds it in its slot)."""
    tag = pool.endpoint.model
    other_session = opening(f"{tag}-other")
    held, pinned = await two_requests_with_another_between(
        pool, f"{tag}-pinned", 0, other_session, 1
    )
    long_prompt = opening(f"{tag}-client", words=80)
    held_l, pinned_l = await two_requests_with_another_between(
        pool, f"{tag}-pinned-long", 0, long_prompt, 3
    )
    held_u, unpinned = await two_requests_with_another_between(
        pool, f"{tag}-unpinned", -1, opening(f"{tag}-other-u"), -1
    )
    held_ul, unpinned_l = await two_requests_with_another_between(
        pool, f"{tag}-unpinned-long", -1, opening(f"{tag}-client-u", words=80), -1
    )

    def kept(held_tokens: int, cache_n: int) -> bool:
        return cache_n >= held_tokens - pool.resend_back

    if pool.clears_idle_slots:
        assert (pinned, pinned_l) == (0, 0), "a pinned slot kept its prompt on the unified pool"
    else:
        assert kept(held, pinned), (held, pinned)
        assert kept(held_l, pinned_l), (held_l, pinned_l)
    assert kept(held_u, unpinned), (held_u, unpinned)
    assert kept(held_ul, unpinned_l), (held_ul, unpinned_l)
    finding = "d-unified" if pool.clears_idle_slots else "d-unified-keep"
    record(
        finding,
        pool.kind,
        f"pinned: cache_n {pinned} of {held} after another session on slot 1, {pinned_l} of "
        f"{held_l} after a long prompt on slot 3; unpinned: {unpinned} of {held_u} and "
        f"{unpinned_l} of {held_ul}",
        pinned=(held, pinned),
        pinned_long=(held_l, pinned_l),
        unpinned=(held_u, unpinned),
        unpinned_long=(held_ul, unpinned_l),
    )


async def test_d_unified_pool_two_pinned_sessions_on_one_slot_restore(
    pool: Pool, record: Record
) -> None:
    """Sessions taking turns on one pinned slot: the slot holds the other session's prompt, so
    the server saves it and restores this one from the host cache."""
    tag = pool.endpoint.model
    a, b = opening(f"{tag}-share-a"), opening(f"{tag}-share-b")
    a1 = await complete(pool.endpoint, a, id_slot=0, max_tokens=1)
    await complete(pool.endpoint, b, id_slot=0, max_tokens=1)
    a += [{"role": "assistant", "content": "Noted."}, {"role": "user", "content": "Next."}]
    a2 = await complete(pool.endpoint, a, id_slot=0, max_tokens=1)
    held = a1.timings.cache_n + a1.timings.prompt_n
    assert a2.timings.cache_n >= held - pool.resend_back, (held, cost(a2))
    if pool.clears_idle_slots:
        record(
            "d-unified-one-slot",
            pool.kind,
            f"cache_n {a2.timings.cache_n} of {held} after another session on the same slot",
            held=held,
            again=cost(a2),
        )
