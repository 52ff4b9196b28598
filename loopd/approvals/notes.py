"""The question and the decision as notes in the session log (pure; never replayed to the model).

A restart finds the question asked (``asked_before``), so it asks on from it: the same post, and
the time limit counted from the first asking.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Final

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
    for entry in entries:
        text = entry.fields.text or ""
        if entry.kind is not EntryKind.NOTE or not text.startswith(ASKED_NOTE):
            continue
        try:
            raw = json.loads(text[len(ASKED_NOTE) :])
            call = AskedCall(**raw)
        except (ValueError, TypeError):
            continue
        if call.approval_id == approval_id:
            return call
    return None
