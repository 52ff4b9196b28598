"""The repeat guard: a model that makes the same tool call again within a turn is answered by
loopd's rule, not by running the call again.

A small model can call the same tool with the same arguments after every result, for ever, and
burn the GPU until the round limit. Within one turn (the calls after the latest user message) a
call is a repeat when an earlier call had the same name and the same arguments, compared as
canonical JSON (key order and spacing do not matter; arguments that are not JSON compare as
text). With ``limit`` repeats allowed (``LOOPD_REPEAT_LIMIT``, 0: off):

- a repeat below the limit is not run; its result says the call was already made and which
  earlier tool result holds its answer;
- the repeat that reaches the limit ends the turn: it and the calls after it in the same message
  are not run, and the turn's outcome says, in one line, that the model repeated a call.

Pure: the turn (``loopd.turn.loop``) reads the turn's messages from the log and does what the
plan says.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from loopd.sessionlog.assistant import tool_calls_of
from loopd.wire.assemble import ToolCall

DEFAULT_LIMIT = 2


def call_key(call: ToolCall) -> tuple[str, str]:
    """What makes two calls the same: the name and the arguments as canonical JSON."""
    try:
        arguments = json.loads(call.arguments)
    except json.JSONDecodeError:
        return call.name, call.arguments
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return call.name, canonical


def calls_of_turn(messages: Sequence[str]) -> list[ToolCall]:
    """The tool calls made since the latest user message, in order (``messages``: the replayed
    messages of the session, as the log gives them)."""
    calls: list[list[ToolCall]] = []
    for text in reversed(messages):
        message = json.loads(text)
        if message.get("role") == "user":
            break
        if message.get("role") == "assistant":
            calls.append(list(tool_calls_of(text)))
    return [call for batch in reversed(calls) for call in batch]


@dataclass(frozen=True)
class Stop:
    """The turn ends: ``line`` is what its outcome says (one line, for the thread)."""

    line: str
    call: str  # the tool's name


@dataclass(frozen=True)
class Plan:
    """For each call of the latest message, in order: None (run it) or the text loopd answers
    it with; and ``stop`` when a repeat reached the limit."""

    answers: tuple[str | None, ...]
    stop: Stop | None = None

    @property
    def pointed(self) -> int:
        """How many calls were answered with a pointer to an earlier result."""
        return sum(answer is not None for answer in self.answers) - (self.stop is not None)


def pointer(call: ToolCall, first: ToolCall) -> str:
    return (
        f"not run again: this turn already called {call.name} with the same arguments "
        f"(call {first.id}); its result is the tool result for {first.id} above. "
        "Use that result, or make a different call."
    )


def plan(messages: Sequence[str], calls: Sequence[ToolCall], limit: int) -> Plan:
    """How loopd answers ``calls``, the latest assistant message's calls, the last ones of
    ``messages``."""
    if limit <= 0 or not calls:
        return Plan(tuple(None for _ in calls))
    made = calls_of_turn(messages)
    earlier = made[: len(made) - len(calls)]
    answers: list[str | None] = []
    stop: Stop | None = None
    for call in calls:
        if stop is not None:
            answers.append(f"not run: {stop.line}")
            continue
        same = [c for c in earlier if call_key(c) == call_key(call)]
        earlier.append(call)
        if not same:
            answers.append(None)
        elif len(same) < limit:
            answers.append(pointer(call, same[0]))
        else:
            times = len(same) + 1
            stop = Stop(
                f"the model repeated a call ({call.name}, same arguments) {times} times; stopped",
                call.name,
            )
            answers.append(f"not run: {stop.line}")
    return Plan(tuple(answers), stop)
