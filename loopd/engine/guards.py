"""The loop guards: one rule that tells, before each tool call runs, whether the turn's calls show
the model going round instead of getting on, and what loopd does then. Pure: no I/O.

Small models loop in a few ways, and each has a guard here, asked in this order:

- too many calls: more calls in one message than ``calls_per_message`` (a model once wrote 40 in
  one message), more in the turn than ``calls_per_turn``, or tool time past ``tool_s_per_turn``;
- a run of failures: the last ``failures`` calls that ran all failed (files that do not exist,
  refused calls), with no success between them;
- a cycle: the turn's calls end in the same 2 to ``MAX_PERIOD`` different calls made again, in the
  same order (A, B, A, B), ``cycle`` times;
- the same call again: the same tool with the same arguments once whitespace inside strings and
  the order of keys are folded (``call_key``), with no other call between them that may have
  changed what it would see (a write, an edit, a command, a catalogue tool). Such a repeat is
  not run, and its result points the model back to the earlier one; the turn's repeat (of any
  call) that reaches ``repeat`` ends the turn: a model paging back and forth through a file
  repeats one call after another, each only once.

Every other guard ends the turn at once. A guard set to 0 is off. The turn (``loopd.turn.loop``)
asks ``judge`` before each call of a message and once more before its next request (``call``
None), with the turn's calls so far (``made``: read from the session log, with what this process
saw of how each one went), and does what the verdict says: run the call, answer it with the
pointer, or end the turn with the verdict's one line (in the thread, a note in the log, and
``loopd_guard_firings`` in the metrics).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from loopd.sessionlog.assistant import tool_calls_of
from loopd.wire.assemble import ToolCall

# Tools that only look: a call of one of these between two identical calls changes nothing the
# second one would see. Any other tool (a write, an edit, a command, a catalogue tool) may.
READ_ONLY = frozenset({"read_file", "list_dir", "search_files", "find_tool"})
# The longest cycle looked for: longer ones are left to the other guards.
MAX_PERIOD = 4

CallKey = tuple[str, str]


class Guard(StrEnum):
    """Which guard answered a call (the metrics' ``guard`` label)."""

    REPEAT = "repeat"
    CYCLE = "cycle"
    FAILURES = "failures"
    CALLS_PER_MESSAGE = "calls_per_message"
    CALLS_PER_TURN = "calls_per_turn"
    TOOL_TIME = "tool_time"


@dataclass(frozen=True)
class GuardLimits:
    """The guards' settings (``LOOPD_REPEAT_LIMIT`` and its neighbours); 0 turns one off."""

    repeat: int = 2
    cycle: int = 1
    failures: int = 4
    calls_per_message: int = 16
    calls_per_turn: int = 64
    tool_s_per_turn: float = 1800.0


@dataclass(frozen=True)
class Made:
    """A call the model made earlier in the turn, and how it went: ``ran`` False when a guard
    answered it; ``failed`` None when it did not run, or this process did not see it run (a
    call made before a restart); ``result`` the text the model read for it."""

    call: ToolCall
    ran: bool = True
    failed: bool | None = False
    result: str = ""

    @property
    def key(self) -> CallKey:
        return call_key(self.call)


@dataclass(frozen=True)
class Run:
    """Run the call."""


@dataclass(frozen=True)
class Point:
    """Do not run the call: ``text`` is its result, pointing the model back."""

    guard: Guard
    text: str


@dataclass(frozen=True)
class Stop:
    """End the turn: ``line`` says why, in one line (the thread's, the log's note)."""

    guard: Guard
    line: str


Verdict = Run | Point | Stop


def fold(value: Any) -> Any:
    """``value`` with every string's whitespace folded (runs made one space, the ends cut)."""
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, dict):
        return {fold(key): fold(item) for key, item in value.items()}
    if isinstance(value, list):
        return [fold(item) for item in value]
    return value


def call_key(call: ToolCall) -> CallKey:
    """What makes two calls the same: the name and the arguments as canonical JSON, whitespace
    in strings folded (arguments that are not JSON compare as folded text)."""
    name = call.name.strip()
    try:
        arguments = fold(json.loads(call.arguments))
        canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, RecursionError):  # not JSON, or nested past what Python recurses into
        return name, fold(call.arguments)
    return name, canonical


def judge(
    limits: GuardLimits,
    made: Sequence[Made],
    call: ToolCall | None,
    *,
    in_message: int = 1,
    tool_s: float = 0.0,
) -> Verdict:
    """What to do with ``call``, the ``in_message``-th call of the model's latest message, after
    the turn's calls ``made`` and ``tool_s`` seconds of tool time; with ``call`` None, whether
    the turn may send its next request."""
    if limits.tool_s_per_turn and tool_s >= limits.tool_s_per_turn:
        return Stop(
            Guard.TOOL_TIME,
            f"the turn's tool calls ran for {tool_s:,.0f} s, the most a turn may take is "
            f"{limits.tool_s_per_turn:,.0f} s; stopped",
        )
    if (failing := _failing_run(limits.failures, made)) is not None:
        return failing
    if call is None:
        return Run()
    if limits.calls_per_message and in_message > limits.calls_per_message:
        return Stop(
            Guard.CALLS_PER_MESSAGE,
            f"the model made more than {limits.calls_per_message} tool calls in one message; "
            "stopped",
        )
    if limits.calls_per_turn and len(made) >= limits.calls_per_turn:
        return Stop(
            Guard.CALLS_PER_TURN,
            f"the model made more than {limits.calls_per_turn} tool calls in one turn; stopped",
        )
    key = call_key(call)
    if (cycle := _cycle(limits.cycle, [m.key for m in made], key)) is not None:
        return cycle
    return _repeat(limits.repeat, made, call, key)


def _failing_run(limit: int, made: Sequence[Made]) -> Stop | None:
    ran = [m for m in made if m.ran]
    if not limit or len(ran) < limit or not all(m.failed for m in ran[-limit:]):
        return None
    names = ", ".join(_counted([m.call.name for m in ran[-limit:]]))
    return Stop(
        Guard.FAILURES,
        f"the model's last {limit} tool calls all failed ({names}); stopped",
    )


def _cycle(limit: int, keys: list[CallKey], key: CallKey) -> Stop | None:
    """A cycle of 2 to MAX_PERIOD different calls gone round ``limit`` more times, ending with
    ``key``."""
    if not limit:
        return None
    sequence = [*keys, key]
    for period in range(2, MAX_PERIOD + 1):
        span = period * (limit + 1)
        if len(sequence) < span:
            break
        block = sequence[-period:]
        if len(set(block)) == period and sequence[-span:] == block * (limit + 1):
            names = ", ".join(name for name, _ in block)
            times = "once" if limit == 1 else f"{limit} times"
            return Stop(
                Guard.CYCLE,
                f"the model went round the same {period} calls ({names}) again {times}; stopped",
            )
    return None


def _repeat(limit: int, made: Sequence[Made], call: ToolCall, key: CallKey) -> Verdict:
    """The same call again: pointed back below the limit; the turn's repeat (of this call or
    any other) that reaches the limit ends it."""
    if not limit:
        return Run()
    keys = [m.key for m in made]
    same = _same_since_a_change(made, keys, key)
    if not same:
        return Run()
    # The turn's earlier repeats, of any call: each was the same as a call before it.
    repeats = [n for n in range(len(made)) if _same_since_a_change(made[:n], keys[:n], keys[n])]
    if len(repeats) + 1 < limit:
        return Point(Guard.REPEAT, pointer(call, made[same[0]]))
    if all(keys[n] == key for n in repeats):
        line = f"the model repeated a call ({call.name}, same arguments) {len(same) + 1} times"
    else:
        names = ", ".join(dict.fromkeys([*(made[n].call.name for n in repeats), call.name]))
        line = (
            f"the model repeated calls it had already made ({names}, same arguments) "
            f"{len(repeats) + 1} times"
        )
    return Stop(Guard.REPEAT, f"{line}; stopped")


def _same_since_a_change(made: Sequence[Made], keys: Sequence[CallKey], key: CallKey) -> list[int]:
    """Where the earlier calls the same as ``key`` are, back to the latest other call that may
    have changed what it would see (it ran, and did not fail, and is not read-only)."""
    same: list[int] = []
    for index in range(len(made) - 1, -1, -1):
        earlier = made[index]
        if keys[index] == key:
            same.append(index)
        elif earlier.ran and earlier.failed is not True and earlier.call.name not in READ_ONLY:
            break
    return same[::-1]


# How much of the earlier result a pointer repeats.
POINTER_RESULT_CHARS = 800


def pointer(call: ToolCall, first: Made) -> str:
    """The result of a repeat loopd did not run: the earlier result again (a small model reads
    what is in front of it more readily than what it is pointed to), and what to do next."""
    result = first.result
    if len(result) > POINTER_RESULT_CHARS:
        result = f"{result[:POINTER_RESULT_CHARS]}\n[cut: the whole result is above]"
    return (
        f"not run again: you already called {call.name} with these arguments in this turn "
        f"(call {first.call.id}), and nothing has changed since. Its result was:\n{result}\n"
        "If that answers the request, answer in plain text now; otherwise make a different "
        "call."
    )


def _counted(names: list[str]) -> list[str]:
    """``["read_file x3", "list_dir"]`` for three read_file calls and one list_dir."""
    order = list(dict.fromkeys(names))
    return [name if names.count(name) == 1 else f"{name} x{names.count(name)}" for name in order]


def made_of_turn(messages: Sequence[str], seen: dict[str, Made]) -> list[Made]:
    """The turn's calls so far (since the latest user message; ``messages``: the session's
    replayed messages), each as ``seen`` (by call id) records it, else as a call this process
    did not see run, with the result the log holds for it."""
    batches: list[tuple[ToolCall, ...]] = []
    results: dict[str, str] = {}
    for text in reversed(messages):
        message = json.loads(text)
        role = message.get("role")
        if role == "user":
            break
        if role == "assistant":
            batches.append(tool_calls_of(text))
        elif role == "tool":
            results[str(message.get("tool_call_id"))] = str(message.get("content") or "")
    calls = [call for batch in reversed(batches) for call in batch]
    return [
        seen.get(call.id, Made(call, ran=True, failed=None, result=results.get(call.id, "")))
        for call in calls
    ]
