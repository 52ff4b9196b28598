"""Waiting for a person's decision on a call brokerd holds, then sending the call again with it.

The question and the decision go in the session log (``loopd.approvals.notes``) before the call
goes back to brokerd, which records the decision in its audit log and answers with the tool
result the model reads. A stop or a restart while the question is open leaves the call without
a result: the session's next start sends it again, brokerd names the same approval, and the
wait goes on from the question's first time (the time limit is not restarted).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from loopd.approvals.call import AskedCall, Asker, Decision
from loopd.approvals.notes import asked_before, asked_note, decided_note
from loopd.approvals.words import refused_here, timed_out
from loopd.sessionlog.store import SessionLog
from loopd.tools.broker_client import BrokerClient

log = logging.getLogger(__name__)

# How far back a session's log is read for an open question: a turn's own entries.
RECENT_ENTRIES = 400


async def settle(
    session_log: SessionLog,
    broker: BrokerClient,
    asked: AskedCall,
    limit_s: float,
    asker: Asker | None,
    clock: Callable[[], float] = time.time,
) -> str:
    """The tool result once the person ``asker`` asks (or the time limit) decided; with no
    asker (``loopd tools call``, a turn without a person) the call is denied at once."""
    recent = session_log.latest_entries(asked.session, RECENT_ENTRIES)
    earlier = asked_before(recent, asked.approval_id)
    if earlier is None:
        session_log.append_note(asked.session, asked_note(asked))
    else:
        asked = earlier
    decision = await decide(asked, limit_s, asker, clock)
    session_log.append_note(asked.session, decided_note(asked, decision))
    log.info(
        "approval of %s in %s: %s by %s", asked.tool, asked.session, decision.verdict, decision.by
    )
    answer = await broker.call_tool_answer(
        asked.session,
        asked.call_id,
        asked.tool,
        asked.arguments,
        approval=decision.body(asked.approval_id),
    )
    return answer.text


async def decide(
    asked: AskedCall, limit_s: float, asker: Asker | None, clock: Callable[[], float]
) -> Decision:
    if asker is None:
        return refused_here()
    left_s = limit_s - (clock() - asked.asked_at)
    if left_s <= 0:
        return timed_out(limit_s)
    return await asker.decide(asked, left_s) or timed_out(limit_s)
