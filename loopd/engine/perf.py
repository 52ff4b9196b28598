"""Per-request performance records and the cache-loss rule. Pure.

The server reports ``cache_n`` (prompt tokens reused) and ``prompt_n`` (prompt tokens evaluated).
After an exact replay the next request on the same slot should reuse the whole previous prompt and
everything generated after it, less the one token the server always re-evaluates
(real-server-notes: ``cache_n(k) = cache_n(k-1) + prompt_n(k-1) + predicted_n(k-1) - 1``). The gap
between that expectation and the real ``cache_n`` is the cache loss; a known cause is named, and a
cold cache is a normal, recorded event, never an error (DESIGN.md invariant 7).
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
) -> Loss:
    """Expected reuse minus the real ``cache_n``, with the most likely cause."""
    if prev is None:
        return Loss(0, 0, LossCause.FIRST)
    if prev.epoch_id != epoch_id:
        return Loss(0, 0, LossCause.NEW_EPOCH)
    if prev.slot != slot:
        return Loss(0, 0, LossCause.OTHER_SLOT)
    expected = prev.cache_n + prev.prompt_n + (prev.predicted_n if prev.complete else 0) - 1
    expected = max(expected, 0)
    lost = max(expected - cache_n, 0)
    if lost <= LOSS_TOLERANCE:
        return Loss(expected, lost, LossCause.NONE)
    if not prev.complete:
        cause = LossCause.BROKEN_TURN
    elif prev.capped:
        cause = LossCause.CAPPED_TURN
    elif cache_n <= LOSS_TOLERANCE:
        cause = LossCause.COLD
    elif template_drops_reasoning and prev.had_reasoning:
        cause = LossCause.TEMPLATE_DROPS_REASONING
    else:
        cause = LossCause.UNEXPLAINED
    return Loss(expected, lost, cause)
