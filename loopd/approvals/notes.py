"""The question and the decision as notes in the session log (pure; never replayed to the model).

A restart finds the question asked (``asked_before``), so it asks on from it: the same people,
the same post, and the time limit counted from the first asking; and a decision already taken
(``decided_before``) stands without asking again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any, Final

from loopd.approvals.call import AskedCall, Decision
from loopd.sessionlog.records import Entry, EntryKind

ASKED_NOTE: Final = "approval asked: "
DECIDED_NOTE: Final = "approval decided: "


def asked_note(call: AskedCall) -> str:
    return ASKED_NOTE + json.dumps(asdict(call), ensure_ascii=False)


def decided_note(call: AskedCall, decision: Decision) -> str:
    return DECIDED_NOTE + json.dumps(
        {"approval_id": call.approval_id, "tool": call.tool, **asdict(decision)},
        ensure_ascii=False,
    )


def asked_before(entries: Sequence[Entry], approval_id: str) -> AskedCall | None:
    """The question as first recorded for ``approval_id`` (a restart asks on from it)."""
    for raw in _notes(entries, ASKED_NOTE):
        try:
            raw["people"] = tuple(raw.get("people", ()))
            call = AskedCall(**raw)
        except TypeError:
            continue
        if call.approval_id == approval_id:
            return call
    return None


def decided_before(entries: Sequence[Entry], approval_id: str) -> Decision | None:
    """The decision recorded for ``approval_id``, if one was."""
    for raw in _notes(entries, DECIDED_NOTE):
        if raw.get("approval_id") != approval_id:
            continue
        verdict, by = raw.get("verdict"), raw.get("by")
        if verdict in ("allow", "deny", "timeout") and isinstance(by, str):
            return Decision(verdict, by)
    return None


def _notes(entries: Sequence[Entry], prefix: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of the notes that start with ``prefix``, oldest first."""
    for entry in entries:
        text = entry.fields.text or ""
        if entry.kind is not EntryKind.NOTE or not text.startswith(prefix):
            continue
        try:
            raw = json.loads(text[len(prefix) :])
        except ValueError:
            continue
        if isinstance(raw, dict):
            yield raw
