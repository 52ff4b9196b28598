"""Deciding what a ``call_tool`` request gets, before anything runs (pure).

Two decisions live here. ``plan_call`` gates a new call: the tool must exist, this session's
``find_tool`` must have shown it (docs/design, invariant 3), and its arguments must be a JSON object
matching the schema. ``decide`` applies idempotency: a call is keyed by (session, call id), and a
key seen before is answered from the audit log (its recorded result, or "interrupted" when it was
started and never finished) instead of being run again.
"""

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brokerd.tools import wording
from brokerd.tools.arguments import (
    ArgumentProblems,
    object_or_problem,
    parse_arguments,
    schema_problems,
)
from brokerd.tools.argv import build_argv
from brokerd.tools.auditbounds import sha256
from brokerd.tools.catalogue import Catalogue, CommandRun, ToolSpec
from brokerd.tools.errors import ArgvError
from brokerd.tools.paths import place_paths
from loopcommon.callstatus import CallStatus


@dataclass(frozen=True)
class CallRequest:
    """One ``call_tool`` request; ``arguments`` is the model's text as received."""

    session: str
    call_id: str
    name: str
    arguments: str

    @property
    def sha256(self) -> str:
        """What identifies the call for idempotency (the audit log keeps only excerpts)."""
        return sha256(json.dumps([self.name, self.arguments], ensure_ascii=False))


@dataclass(frozen=True)
class Rejected:
    """Answered without running anything."""

    status: CallStatus
    result: str


@dataclass(frozen=True)
class Ready:
    """Checked and ready to run."""

    spec: ToolSpec
    arguments: dict[str, Any]
    argv: tuple[str, ...] | None = None
    roots: tuple[Path, ...] = ()  # the allowed folders holding the call's path arguments


def plan_call(
    catalogue: Catalogue,
    shown: Collection[str],
    name: str,
    arguments: str | object,
    roots: Sequence[Path] = (),
) -> Rejected | Ready:
    """Gate a call: unknown tool, not shown by find_tool, bad arguments, or a host path outside
    the allowed folders ``roots`` are rejected.

    ``arguments`` is normally the model's text; a client that already parsed it may pass the
    JSON value instead, which is checked the same way.
    """
    spec = catalogue.get(name)
    if spec is None:
        return Rejected("invalid", wording.unknown_tool(name))
    if name not in shown:
        return Rejected("refused", wording.not_found_first(name))
    parsed = (
        parse_arguments(arguments) if isinstance(arguments, str) else object_or_problem(arguments)
    )
    if not isinstance(parsed, dict):
        return Rejected("invalid", wording.bad_arguments(spec, parsed))
    problems = schema_problems(spec.parameters, parsed)
    if problems is not None:
        return Rejected("invalid", wording.bad_arguments(spec, problems))
    if not isinstance(spec.run, CommandRun):
        return Ready(spec, parsed)
    placed = place_paths(spec.confine.path_arguments, parsed, roots)
    if isinstance(placed, str):
        return Rejected("refused", wording.path_refused(spec.name, placed))
    try:
        argv = build_argv(spec.run.argv, placed.arguments, spec.parameters)
    except ArgvError as exc:
        problems = ArgumentProblems("cannot go on its command line", (str(exc),))
        return Rejected("invalid", wording.bad_arguments(spec, problems))
    return Ready(spec, placed.arguments, argv, placed.roots)


@dataclass(frozen=True)
class RecordedCall:
    """A call as the audit log has it; ``status`` is None while it has no end row."""

    session: str
    call_id: str
    tool: str
    arguments: str
    started_at: str
    status: CallStatus | None = None
    result: str | None = None
    ended_at: str | None = None
    call_sha256: str | None = None  # None: a row from before excerpts (its arguments whole)
    result_bytes: int | None = None  # the whole result's length, when it was recorded


@dataclass(frozen=True)
class Run:
    """A new key: run the call."""


@dataclass(frozen=True)
class Wait:
    """The same key is running in this process right now: wait for it, then replay."""


@dataclass(frozen=True)
class Replay:
    """A finished key: answer with the recorded result, run nothing."""

    result: str
    recorded_status: CallStatus


@dataclass(frozen=True)
class Interrupted:
    """Started, never finished, and not running here: brokerd stopped mid-call."""

    result: str


@dataclass(frozen=True)
class Conflict:
    """The key was used for a different call: a client bug, refused rather than guessed at."""

    message: str


CallDecision = Run | Wait | Replay | Interrupted | Conflict


def decide(recorded: RecordedCall | None, request: CallRequest, running_here: bool) -> CallDecision:
    if recorded is None:
        return Run()
    same = (
        recorded.call_sha256 == request.sha256
        if recorded.call_sha256 is not None
        else (recorded.tool, recorded.arguments) == (request.name, request.arguments)
    )
    if not same:
        # Only that the id was used: quoting the earlier call would show its tool and arguments
        # to anyone who guesses a session's call id.
        return Conflict(
            f"call id {request.call_id!r} of session {request.session!r} was already used for "
            "another call; a retry must repeat the same call, and a new call needs a new call id"
        )
    if recorded.status is not None and recorded.result is not None:
        return Replay(
            wording.recorded_result(recorded.result, recorded.result_bytes), recorded.status
        )
    if running_here:
        return Wait()
    return Interrupted(wording.interrupted(recorded.tool, recorded.call_id))
