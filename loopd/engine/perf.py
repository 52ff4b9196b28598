"""Per-request performance records and the cache-loss rule. Pure.

The server reports ``cache_n`` (prompt tokens reused) and ``prompt_n`` (prompt tokens evaluated).
After an exact replay the next request on the same slot should reuse the whole previous prompt and
everything generated after it, less the one token the server always re-evaluates:
``cache_n(k) = cache_n(k-1) + prompt_n(k-1) + predicted_n(k-1) - 1`` (measured by
``tests/contract/test_contract_cache.py::test_b_cache_reuse_over_three_turns_with_tools``; see
docs/contract.md). The gap between that expectation and the real ``cache_n`` is the cache loss; a
known cause is named, and a cold cache is a normal, recorded event, never an error
(``tests/engine/test_turn_fake.py::test_a_cold_server_labels_its_loss``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# The server may re-evaluate a token or two at the boundary (a forced re-evaluation of the last
# prompt token, a template joining differently at the end of a turn); losses up to this are noise.
LOSS_TOLERANCE = 2


class LossCause(StrEnum):
    NONE = ""
    FIRST = "first request of the session"
    NEW_EPOCH = "new epoch"
    CAPPED_TURN = "previous turn was capped"
    BROKEN_TURN = "previous request broke"
    TEMPLATE_DROPS_REASONING = "template drops reasoning"
    COLD = "cold server or eviction"
    OTHER_SLOT = "slot changed"
    SHARED_SLOT = "another session used the slot"
    ENDPOINT_LOST = "endpoint lost"  # its server died; the session moved (loopd.endpoints)
    UNEXPLAINED = "unexplained"


@dataclass(frozen=True)
class PrevRequest:
    """What the cache-loss rule needs from the session's previous request."""

    epoch_id: int
    slot: int
    cache_n: int
    prompt_n: int
    predicted_n: int
    complete: bool
    capped: bool
    had_reasoning: bool
    request_id: int = 0  # its row in the log, to ask what else ran on the slot since


@dataclass(frozen=True)
class Loss:
    expected: int
    lost: int
    cause: LossCause


def cache_loss(
    prev: PrevRequest | None,
    *,
    epoch_id: int,
    slot: int,
    cache_n: int,
    template_drops_reasoning: bool = False,
    slot_shared: bool = False,
) -> Loss:
    """Expected reuse minus the real ``cache_n``, with the most likely cause.

    The expectation is the same whatever happened in between: the previous request's prompt and
    what it generated, as the server last held them. The cause is what best explains a
    shortfall, the most certain first. ``slot_shared``: another session's request (loopd's
    own, as its log shows) ran on the slot since the previous request, so the slot held another
    prompt and only the host prompt cache could have kept this one.
    """
    if prev is None:
        return Loss(0, 0, LossCause.FIRST)
    expected = prev.cache_n + prev.prompt_n + (prev.predicted_n if prev.complete else 0) - 1
    expected = max(expected, 0)
    lost = max(expected - cache_n, 0)
    if lost <= LOSS_TOLERANCE:
        return Loss(expected, lost, LossCause.NONE)
    cause = _cause(prev, epoch_id, slot, cache_n, template_drops_reasoning, slot_shared)
    return Loss(expected, lost, cause)


def _cause(
    prev: PrevRequest,
    epoch_id: int,
    slot: int,
    cache_n: int,
    template_drops_reasoning: bool,
    slot_shared: bool,
) -> LossCause:
    if prev.epoch_id != epoch_id:
        return LossCause.NEW_EPOCH
    if prev.slot != slot:
        return LossCause.OTHER_SLOT
    if slot_shared:
        return LossCause.SHARED_SLOT
    # Nothing reused at all: the server lost the slot's cache (a model unload, a restart, an
    # eviction). A broken or capped turn costs only what follows the previous prompt.
    if cache_n <= LOSS_TOLERANCE:
        return LossCause.COLD
    if not prev.complete:
        return LossCause.BROKEN_TURN
    if prev.capped:
        return LossCause.CAPPED_TURN
    if template_drops_reasoning and prev.had_reasoning:
        return LossCause.TEMPLATE_DROPS_REASONING
    return LossCause.UNEXPLAINED
