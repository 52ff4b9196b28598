"""A shared KV pool: room beside the requests already running, and waiting for it.

On a unified pool every slot reports the whole pool as its ``n_ctx``, and the requests running at
once share it, whoever sent them. Two requests whose prompts and answers together pass the pool
both fail, with HTTP 500 ``Context size has been exceeded.`` (``engine.outcome.is_pool_full``;
measured on the hybrid preset's 16,384-token pool: docs/production-shape.md, "a full pool"). So
before a request loopd reads ``/slots`` and waits while its prompt and answer would not fit beside
what the busy slots hold, and after a pool-full failure it waits for the other slots to fall idle
before it sends again.
Neither wait is a reason to compact: the session is not too long, the pool is busy.

The rules are pure functions of a ``/slots`` listing; ``wait_for`` is the thin shell that polls.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio

from loopd.engine.client import InferenceClient
from loopd.errors import InferenceError

log = logging.getLogger(__name__)

SlotsListing = Sequence[Mapping[str, Any]]


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value > 0 else 0


def held_by_busy_slots(slots: SlotsListing) -> int:
    """Tokens the busy slots hold: each one's prompt and what it generated so far."""
    held = 0
    for slot in slots:
        if not slot.get("is_processing"):
            continue
        decoded = 0
        next_token = slot.get("next_token")
        if isinstance(next_token, list) and next_token and isinstance(next_token[0], dict):
            decoded = _count(next_token[0].get("n_decoded"))
        held += _count(slot.get("n_prompt_tokens")) + decoded
    return held


def fits_beside(needed: int, pool: int, slots: SlotsListing) -> bool:
    """``needed`` tokens (a prompt and its answer's room) fit in what the busy slots leave."""
    return needed <= pool - held_by_busy_slots(slots)


def all_idle(slots: SlotsListing) -> bool:
    """No slot is processing a request (anyone's)."""
    return not any(slot.get("is_processing") for slot in slots)


async def wait_for(
    client: InferenceClient,
    ready: Callable[[SlotsListing], bool],
    *,
    limit_s: float,
    poll_s: float,
    on_wait: Callable[[], None] = lambda: None,
) -> bool:
    """Poll ``/slots`` until ``ready``; False when ``limit_s`` passed first. A ``/slots`` that
    fails ends the wait (True): the request then meets the server and says what is wrong."""
    deadline = time.monotonic() + limit_s
    told = False
    while True:
        try:
            slots = await client.slots()
        except InferenceError as exc:
            log.info("/slots failed while waiting for room in the pool (%s); sending", exc)
            return True
        if ready(slots):
            return True
        if time.monotonic() >= deadline:
            return False
        if not told:
            on_wait()
            told = True
        await anyio.sleep(poll_s)
