"""Slots: per-slot prompt cache, one task per slot, and the queue of tasks waiting for one.

The cache arithmetic is the real server's: a new prompt reuses the longest common token prefix
with what the slot holds (prompt plus generated tokens, less the last sampled one, which was never
evaluated), and at least one prompt token is always evaluated.

The host prompt cache (``--cache-ram``) is modelled as the real one was measured: a state that
other prompts pushed out of a slot comes back when a matching prompt returns to the same slot;
the same prompt sent to another slot is read again in full.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

_UNSIGNED_INT = 2**32
_SIMILARITY_THRESHOLD = 0.10


def common_prefix_len(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def reusable_prefix(prompt: Sequence[str], cached: Sequence[str], *, cache_prompt: bool) -> int:
    """``cache_n`` for ``prompt`` on a slot holding ``cached``."""
    if not cache_prompt or not prompt:
        return 0
    return min(common_prefix_len(prompt, cached), len(prompt) - 1)


@dataclass
class TaskInfo:
    """What ``/slots`` shows about the slot's current (or last) task."""

    id_task: int
    n_prompt_tokens: int = 0
    n_prompt_tokens_processed: int = 0
    n_prompt_tokens_cache: int = 0
    n_decoded: int = 0
    n_remain: int = -1
    has_next_token: bool = True
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Slot:
    id: int
    n_ctx: int
    cached: list[str] = field(default_factory=list)
    is_processing: bool = False
    last_used: int = 0
    task: TaskInfo | None = None
    host_cache_tokens: int = 0  # the host prompt cache's room for this slot; 0 turns it off
    saved: list[list[str]] = field(default_factory=list)  # oldest first

    def take_prompt(self, prompt: Sequence[str], *, cache_prompt: bool) -> int:
        """Keep the reusable prefix for ``prompt`` and return ``cache_n``.

        A saved state that matches better is swapped in; a state about to lose more than half
        of its tokens is saved first.
        """
        cache_n = reusable_prefix(prompt, self.cached, cache_prompt=cache_prompt)
        if self.host_cache_tokens and cache_prompt:
            best = max(self.saved, key=lambda s: common_prefix_len(prompt, s), default=None)
            if best is not None and reusable_prefix(prompt, best, cache_prompt=True) > cache_n:
                self.saved.remove(best)
                self._save()
                self.cached[:] = best
                cache_n = reusable_prefix(prompt, self.cached, cache_prompt=True)
            elif cache_n < len(self.cached) / 2:
                self._save()
        del self.cached[cache_n:]
        return cache_n

    def forget(self) -> None:
        """What an unload or a sleep does: the slot and its saved states are gone."""
        self.cached.clear()
        self.saved.clear()

    def _save(self) -> None:
        if not self.cached or len(self.cached) > self.host_cache_tokens:
            return
        self.saved.append(list(self.cached))
        while sum(len(s) for s in self.saved) > self.host_cache_tokens:
            self.saved.pop(0)

    def to_json(self) -> dict[str, Any]:
        """One entry of ``GET /slots``; task fields appear once the slot has run a task."""
        out: dict[str, Any] = {
            "id": self.id,
            "n_ctx": self.n_ctx,
            "speculative": False,
            "is_processing": self.is_processing,
        }
        task = self.task
        if task is None:
            return out
        active = self.is_processing
        out["id_task"] = task.id_task
        out["n_prompt_tokens"] = task.n_prompt_tokens if active else len(self.cached)
        out["n_prompt_tokens_processed"] = task.n_prompt_tokens_processed if active else 0
        out["n_prompt_tokens_cache"] = task.n_prompt_tokens_cache if active else 0
        out["params"] = task.params
        out["next_token"] = [
            {
                "has_next_token": task.has_next_token if active else False,
                "has_new_line": False,
                "n_remain": task.n_remain if active else 0,
                "n_decoded": task.n_decoded if active else 0,
            }
        ]
        return out


@dataclass(eq=False)
class _Waiter:
    pin: int | None
    prompt: tuple[str, ...]
    event: anyio.Event = field(default_factory=anyio.Event)
    slot: Slot | None = None


class SlotPool:
    """The slots of one model and the deferred queue in front of them."""

    def __init__(self, n_slots: int, n_ctx: int, host_cache_tokens: int = 0) -> None:
        if n_slots < 1:
            raise ValueError("a model needs at least one slot")
        self.slots = [Slot(i, n_ctx, host_cache_tokens=host_cache_tokens) for i in range(n_slots)]
        self._waiters: list[_Waiter] = []
        self._clock = 0

    def resolve_pin(self, id_slot: int) -> int | None:
        """-1 lets the pool choose; any other id wraps as the server's unsigned modulo does."""
        if id_slot == -1:
            return None
        return (id_slot % _UNSIGNED_INT) % len(self.slots)

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def acquire(self, pin: int | None, prompt: Sequence[str]) -> Slot:
        """Take a slot, waiting (silently, without limit) while it or all slots are busy."""
        waiter = _Waiter(pin, tuple(prompt))
        self._waiters.append(waiter)
        self._dispatch()
        taken = False
        try:
            await waiter.event.wait()
            taken = True
        finally:
            if not taken:
                self._abandon(waiter)
        assert waiter.slot is not None
        return waiter.slot

    def release(self, slot: Slot) -> None:
        """Free the slot, keeping its cache, and hand it to the next waiter that can use it."""
        slot.is_processing = False
        self._dispatch()

    def clear_caches(self) -> None:
        """What an unload or a sleep does: every slot forgets its tokens."""
        for slot in self.slots:
            slot.forget()

    def _abandon(self, waiter: _Waiter) -> None:
        if waiter.slot is not None:
            self.release(waiter.slot)
        elif waiter in self._waiters:
            self._waiters.remove(waiter)

    def _idle_slot(self, pin: int | None, prompt: Sequence[str]) -> Slot | None:
        if pin is not None:
            slot = self.slots[pin]
            return None if slot.is_processing else slot
        idle = [s for s in self.slots if not s.is_processing]
        if not idle:
            return None
        best = max(idle, key=lambda s: common_prefix_len(prompt, s.cached))
        similarity = common_prefix_len(prompt, best.cached) / max(len(prompt), 1)
        if similarity > _SIMILARITY_THRESHOLD:
            return best
        return min(idle, key=lambda s: s.last_used)

    def _take(self, slot: Slot) -> Slot:
        self._clock += 1
        slot.is_processing = True
        slot.last_used = self._clock
        return slot

    def _dispatch(self) -> None:
        """Serve waiters oldest first; one pinned to a busy slot keeps waiting for that slot."""
        for waiter in list(self._waiters):
            slot = self._idle_slot(waiter.pin, waiter.prompt)
            if slot is not None:
                self._waiters.remove(waiter)
                waiter.slot = self._take(slot)
                waiter.event.set()
