"""The shared pool's rules, from ``/slots`` listings as build 11434 writes them."""

from __future__ import annotations

from typing import Any

from loopd.contextwindow.pool import all_idle, fits_beside, held_by_busy_slots
from loopd.engine.outcome import is_pool_full


def _slot(slot_id: int, busy: bool, prompt: int, decoded: int) -> dict[str, Any]:
    return {
        "id": slot_id,
        "n_ctx": 16384,
        "is_processing": busy,
        "n_prompt_tokens": prompt,
        "next_token": [{"has_next_token": busy, "n_decoded": decoded}],
    }


SLOTS = [
    _slot(0, True, 5000, 700),
    _slot(1, False, 4000, 0),  # idle: what it holds is saved and cleared at the next launch
    _slot(2, True, 2000, 300),
    {"id": 3, "n_ctx": 16384, "is_processing": False},  # never ran a task
]


def test_the_busy_slots_hold_their_prompts_and_what_they_generated() -> None:
    assert held_by_busy_slots(SLOTS) == 5000 + 700 + 2000 + 300
    assert held_by_busy_slots([{"id": 0, "is_processing": True}]) == 0


def test_a_request_fits_in_what_the_busy_slots_leave() -> None:
    left = 16384 - 8000
    assert fits_beside(left, 16384, SLOTS)
    assert not fits_beside(left + 1, 16384, SLOTS)
    assert fits_beside(16384, 16384, [_slot(0, False, 9000, 0)])


def test_all_idle_and_the_pool_full_message() -> None:
    assert not all_idle(SLOTS)
    assert all_idle([_slot(0, False, 10, 0), {"id": 1, "is_processing": False}])
    assert is_pool_full("Context size has been exceeded.")
    assert not is_pool_full("the request exceeds the available context size, try increasing it")
