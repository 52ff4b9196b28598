"""The runaway-thinking cap. Pure: no I/O.

Thinking is counted from the server's own per-token counter, ``timings.predicted_n``
(``StreamAssembler.thinking_tokens`` holds the counting rule; the counter is measured by
``tests/contract/test_contract_stream.py::test_m_per_token_predicted_n_counts_real_tokens``). At
the cap the engine sends the control call ``reasoning_end``, which ends the reasoning and keeps
the turn (measured by ``test_k_control_call_ends_thinking_and_costs_one_turn`` there). A
``success: false`` answer means nothing was armed: the stream is then closed once thinking passes
a grace, and so it is if thinking goes on regardless. The stream is read while the call is in
flight, and the grace counts from the thinking read when its answer arrived (or from the cap, if
later): the tokens the server wrote before the call reached it are the call's round trip, not a
runaway, and on a loaded machine that trip is long. A thought the repetition watch finds looping
(``loopd.engine.loops``) is ended the same way, before the cap.
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
class ControlCall:
    """The control call, once sent: its answer in a word (``control_answer``), None while it is
    in flight, and the thinking tokens read when that answer arrived."""

    answer: str | None = None
    answered_at: int = 0


@dataclass(frozen=True)
class ThinkCap:
    cap: int  # thinking tokens before the control call
    grace: int  # tokens past the cap, or past the control call's answer if later, before closing

    def decide(
        self,
        thinking_tokens: int,
        *,
        answering: bool,
        control: ControlCall | None,
        looping: bool = False,
    ) -> CapDecision:
        """What to do after the events read so far. ``answering``: content or a tool call has
        begun, so thinking is over; ``control``: the control call, None when it was not sent;
        ``looping``: the thought goes round in circles."""
        if answering:
            return Continue()
        if control is None:
            return SendControl() if looping or thinking_tokens >= self.cap else Continue()
        if control.answer is None:
            return Continue()  # what is read meanwhile was written before the call arrived
        if thinking_tokens < max(self.cap, control.answered_at) + self.grace:
            return Continue()
        if control.answer == SUCCESS:
            return Close("the server accepted the control call but thinking went on")
        return Close(f"the server could not end it ({control.answer})")


def control_answer(answer: Mapping[str, Any]) -> str:
    """The control call's answer in a word: ``SUCCESS`` when armed, else the server's message."""
    if answer.get("success") is True:
        return SUCCESS
    return str(answer.get("message") or "success: false")
