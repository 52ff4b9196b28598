"""One ``call_tool`` request as operators see it: a log line (with loopd's request id, from the
request's context) and its metrics, by tool and status, with its duration.
"""

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from brokerd.observe.metrics import BROKERD_METRICS, BrokerdMetrics

if TYPE_CHECKING:
    from brokerd.tools.catalogue import Catalogue
    from brokerd.tools.service import CallAnswer

logger = logging.getLogger("brokerd.tools.calls")


@dataclass
class CallSeen:
    status: str = "unfinished"
    recorded_status: str | None = None

    def answered(self, answer: "CallAnswer") -> "CallAnswer":
        self.status, self.recorded_status = answer.status, answer.recorded_status
        return answer


@contextmanager
def tool_call(
    session: str,
    call_id: str,
    name: str,
    catalogue: "Catalogue",
    metrics: BrokerdMetrics = BROKERD_METRICS,
) -> Iterator[CallSeen]:
    """Around one call: a call that raises (a conflicting call id, an audit log that cannot be
    written, brokerd stopping) is counted as ``failed``."""
    started = time.monotonic()
    seen = CallSeen()
    try:
        yield seen
    except BaseException:
        seen.status = "failed"
        raise
    finally:
        seconds = time.monotonic() - started
        tool = name if catalogue.get(name) is not None else "unknown"
        metrics.tool_called(tool, seen.status, seconds)
        fields: dict[str, object] = {
            "session": session[:200],
            "tool": tool,
            "call_id": call_id[:64],
            "status": seen.status,
            "duration_ms": round(seconds * 1000, 1),
        }
        if seen.recorded_status is not None:
            fields["recorded_status"] = seen.recorded_status
        logger.info("tool call %s: %s", tool, seen.status, extra={"fields": fields})
