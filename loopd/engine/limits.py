"""A request's limits: how long it may wait, stay silent and think, and how often it is sent.

Data only, no I/O: the stream enforces them (``loopd.engine.stream``), the turn counts its
attempts by them (``loopd.turn.loop``); ``loopd.config`` supplies the operator's values, with
these defaults as its own (each written once, here).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    first_byte_s: float = 900.0  # queued behind another task, at most this
    silence_s: float = 60.0  # once streaming, no event for this long is death
    slots_poll_s: float = 2.0  # how often /slots is polled while waiting for the first byte
    probe_timeout_s: float = 5.0  # each /slots or /health poll, on its own
    think_cap: int = 6144  # LOOPD_THINK_CAP: thinking tokens before the control call
    think_grace: int = 256  # tokens past the cap (or the control call's answer) before closing
    loop_window: int = 256  # LOOPD_LOOP_WINDOW: tokens a repetition watch reads
    loading_retry_s: float = 120.0  # how long a 503 "Loading model" is waited out
    loading_wait_s: float = 0.5  # the first wait after a 503; doubles up to 10 s
    attempts: int = 3  # attempts per request of a turn, when another one is safe
    retry_wait_s: float = 1.0  # the first wait between attempts; doubles up to 30 s
    status_interval_s: float = 0.5  # the least time between two reports of the same phase
