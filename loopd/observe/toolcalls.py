"""One tool call as operators see it: its own request id, one log line, and its metrics.

``SessionTools.run`` runs every call inside ``tool_call``; a call that goes to brokerd carries the
id in its headers, so brokerd's line for it joins loopd's. The outcome is the core tool's own
(``ok`` or ``error``) or, for ``find_tool`` and ``call_tool``, what brokerd answered: its
``status`` (``ok``, ``error``, ``timeout``, ``invalid``, ``refused``, ``replayed``, ...),
``unreachable`` when it did not answer, ``http_error`` for an error status, and ``invalid`` when
loopd turned the call down before sending it (arguments that are not an object).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from loopcommon.callstatus import CALL_STATUSES
from loopd.observe.metrics import METRICS, LoopdMetrics, tool_label
from loopd.requestscope import Scope, request_scope
from loopd.tools.core import ToolResult
from loopd.wire.assemble import ToolCall

log = logging.getLogger("loopd.tools.calls")


@dataclass
class ToolCallSeen:
    scope: Scope
    outcome: str = "unfinished"

    def result(self, answer: str | ToolResult) -> str:
        """The call's text for the log; records its outcome on the way."""
        if isinstance(answer, ToolResult):
            self.outcome = "ok" if answer.ok else "error"
            return answer.text
        self.outcome = broker_outcome(self.scope)
        return answer


def broker_outcome(scope: Scope) -> str:
    if not scope.sent:
        return "invalid"
    if scope.http_status is None:
        return "unreachable"
    if not 200 <= scope.http_status < 300:
        return "http_error"
    status = scope.answer_status or "ok"
    return status if status in CALL_STATUSES else "other"


@contextmanager
def tool_call(
    session: str, call: ToolCall, known: Collection[str], metrics: LoopdMetrics = METRICS
) -> Iterator[ToolCallSeen]:
    """The scope of one tool call; logs its line and counts it when the block ends (a call cut
    short by a stop or a shutdown counts as ``cancelled``)."""
    started = time.monotonic()
    with request_scope(session) as scope:
        seen = ToolCallSeen(scope)
        try:
            yield seen
        except BaseException:
            seen.outcome = "cancelled" if seen.outcome == "unfinished" else seen.outcome
            raise
        finally:
            seconds = time.monotonic() - started
            tool = tool_label(call.name, known)
            metrics.tool_called(tool, seen.outcome, seconds)
            fields = {
                "tool": tool,
                "call_id": call.id,
                "outcome": seen.outcome,
                "duration_ms": round(seconds * 1000, 1),
            }
            log.info("tool call %s: %s", tool, seen.outcome, extra={"fields": fields})
