"""The runaway-thinking cap. Pure: no I/O.

Thinking is counted from the server's own per-token counter, ``timings.predicted_n``
(``StreamAssembler.thinking_tokens`` holds the counting rule; the counter is measured by
``tests/contract/test_contract_stream.py::test_m_per_token_predicted_n_counts_real_tokens``). At
the cap the engine sends the control call ``reasoning_end``, which ends the reasoning and keeps
the turn (measured by ``test_k_control_call_ends_thinking_and_costs_one_turn`` there). A
``success: false`` answer means nothing was armed: the stream is then closed once thinking passes
the cap plus a grace, and so it is if thinking goes on regardless. A thought the repetition watch
finds looping (``loopd.engine.loops``) is ended the same way, before the cap.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SUCCESS = "success"  # the control call's answer when the server armed it


@dataclass(frozen=True)
class Continue:
    """Read on."""


@dataclass(frozen=True)
class SendControl:
    """Send ``reasoning_end`` now (once per request)."""


@dataclass(frozen=True)
class Close:
    """Close the stream: thinking ran away."""

    why: str


CapDecision = Continue | SendControl | Close


@dataclass(frozen=True)
class ThinkCap:
    cap: int  # thinking tokens before the control call
    grace: int  # tokens past the cap before a stream still thinking is closed

    def decide(
        self,
        thinking_tokens: int,
        *,
        answering: bool,
        control_answer: str | None,
        looping: bool = False,
    ) -> CapDecision:
        """What to do after the events read so far. ``answering``: content or a tool call has
        begun, so thinking is over; ``control_answer``: what the control call got, None when it
        was not sent; ``looping``: the thought goes round in circles."""
        if answering:
            return Continue()
        if looping and control_answer is None:
            return SendControl()
        if thinking_tokens < self.cap:
            return Continue()
        if control_answer is None:
            return SendControl()
        if thinking_tokens < self.cap + self.grace:
            return Continue()
        if control_answer == SUCCESS:
            return Close("the server accepted the control call but thinking went on")
        return Close(f"the server could not end it ({control_answer})")


def control_answer(answer: Mapping[str, Any]) -> str:
    """The control call's answer in a word: ``SUCCESS`` when armed, else the server's message."""
    if answer.get("success") is True:
        return SUCCESS
    return str(answer.get("message") or "success: false")
