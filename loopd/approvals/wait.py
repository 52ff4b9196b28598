"""Waiting for a person's decision on a call that asks, with the session log as the record.

The question goes in the session log (``loopd.approvals.notes``) before anyone is asked, with the
people asked; the decision goes in before the call goes on: back to brokerd, which records it in
its audit log and answers with the tool result the model reads, or, for a core tool, into the
workspace. A stop or a restart while the question is open leaves the call without a result: the
session's next start sends it again (brokerd names the same approval; a core call has an id of
its own, the same each time), and the wait goes on from the question as first recorded (the same
people; the time limit is not restarted). A decision already recorded stands without asking
again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from loopcommon.approvals import decided_result
from loopd.approvals.call import AskedCall, Asker, Decision
from loopd.approvals.notes import asked_before, asked_note, decided_before, decided_note
from loopd.approvals.words import refused_here, refused_unshown, timed_out, unshowable
from loopd.sessionlog.store import SessionLog
from loopd.tools.broker_client import BrokerClient
from loopd.tools.core import ToolResult

log = logging.getLogger(__name__)

# How far back a session's log is read for an open question: a turn's own entries.
RECENT_ENTRIES = 400


async def settle(
    session_log: SessionLog,
    asker: Asker | None,
    asked: AskedCall,
    limit_s: float,
    clock: Callable[[], float] = time.time,
) -> tuple[AskedCall, Decision]:
    """The question as recorded, and its decision: one recorded before, or taken now."""
    recent = session_log.latest_entries(asked.session, RECENT_ENTRIES)
    earlier = asked_before(recent, asked.approval_id)
    decision = decided_before(recent, asked.approval_id)
    if earlier is not None:
        asked = earlier
    if decision is None:
        if earlier is None:
            people = tuple(sorted(asker.people)) if asker is not None else ()
            asked = replace(asked, people=people)
            session_log.append_note(asked.session, asked_note(asked))
        decision = await decide(asked, asker, limit_s, clock)
        session_log.append_note(asked.session, decided_note(asked, decision))
        log.info(
            "approval of %s in %s: %s by %s",
            asked.tool,
            asked.session,
            decision.verdict,
            decision.by,
        )
    if asker is not None:
        await asker.tell(asked, decision)
    return asked, decision


async def decide(
    asked: AskedCall, asker: Asker | None, limit_s: float, clock: Callable[[], float]
) -> Decision:
    if asker is None:
        return refused_here()
    if (reason := unshowable(asked)) is not None:
        return refused_unshown(reason)
    left_s = limit_s - (clock() - asked.asked_at)
    if left_s <= 0:
        return timed_out(limit_s)
    return await asker.decide(asked, left_s) or timed_out(limit_s)


async def settle_core_call(
    session_log: SessionLog,
    asker: Asker | None,
    asked: AskedCall,
    limit_s: float,
    run: Callable[[], Awaitable[ToolResult]],
) -> ToolResult:
    """The result of a core tool call that asks, once decided: the call run and who allowed
    it, or who denied it (as brokerd words it for its own tools)."""
    asked, decision = await settle(session_log, asker, asked, limit_s)
    if decision.verdict != "allow":
        return ToolResult(decided_result(asked.tool, decision.verdict, decision.by), ok=False)
    result = await run()
    return ToolResult(decided_result(asked.tool, "allow", decision.by, result.text), result.ok)


def was_allowed(session_log: SessionLog, session: str, approval_id: str) -> bool:
    """A person allowed the call of ``approval_id`` (so it may have run before a restart)."""
    recent = session_log.latest_entries(session, RECENT_ENTRIES)
    decided = decided_before(recent, approval_id)
    return decided is not None and decided.verdict == "allow"


async def settle_with_broker(
    session_log: SessionLog,
    broker: BrokerClient,
    asker: Asker | None,
    asked: AskedCall,
    limit_s: float,
) -> str:
    """The tool result of a brokerd call that asks, once decided: brokerd's answer to the call
    sent again with the decision."""
    asked, decision = await settle(session_log, asker, asked, limit_s)
    answer = await broker.call_tool_answer(
        asked.session,
        asked.call_id,
        asked.tool,
        asked.arguments,
        approval=decision.body(asked.approval_id),
    )
    return answer.text
