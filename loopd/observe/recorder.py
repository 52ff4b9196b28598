"""A model request's record: the one place that builds it and appends it to the session log.

Every request loopd sends for a session is recorded here, whoever sent it (a turn's, a
compaction's, a prewarm's, the prefix read before a save): what it sent (``Sent``: its kind, slot,
epoch, and the count and digest of its messages) and how it went (the ``Perf`` the sender
measured). A request that produced a message appends it with its record (the assistant entry as
streamed, or a broken one, never replayed); one that produced none (a prewarm) appends the record
alone. Each is logged as one ``model request`` line and counted in the metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from loopd.observe.metrics import METRICS
from loopd.sessionlog.chain import messages_digest
from loopd.sessionlog.records import Perf, RequestKind, RequestRecord
from loopd.sessionlog.store import SessionLog

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sent:
    """What a request sent: its kind, the session's slot, the epoch and the messages' count and
    digest (``chain.messages_digest``: the sha256 of the ``messages`` array as sent)."""

    kind: RequestKind
    slot: int
    epoch: int
    message_count: int
    digest: str

    @classmethod
    def of(cls, kind: RequestKind, slot: int, epoch: int, messages: Sequence[str]) -> Sent:
        return cls(kind, slot, epoch, len(messages), messages_digest(messages))


@dataclass(frozen=True)
class Reply:
    """The message a request produced, as assembled from its stream: ``complete``, or cut (the
    ``reason``), then appended as broken and never replayed."""

    message: str
    complete: bool
    reason: str = ""


def record(
    session_log: SessionLog, session: str, sent: Sent, perf: Perf, reply: Reply | None = None
) -> RequestRecord:
    """Append the request's record (with ``reply``'s entry, when it produced one), log it and
    count it; synchronous, so a cancellation going on cannot interrupt it."""
    record = RequestRecord(
        kind=sent.kind,
        slot=sent.slot,
        epoch=sent.epoch,
        message_count=sent.message_count,
        messages_sha256=sent.digest,
        perf=perf,
    )
    if reply is None:
        session_log.record_request(session, record)
    elif reply.complete:
        session_log.append_assistant(session, reply.message, request=record)
    else:
        session_log.append_broken(
            session, partial_text=reply.message, reason=reply.reason, request=record
        )
    _log_request(session, record)
    METRICS.request_recorded(record)
    return record


def _log_request(session: str, record: RequestRecord) -> None:
    perf = record.perf
    fields: dict[str, Any] = {
        "session": session,
        "slot": record.slot,
        "kind": record.kind.value,
        "outcome": perf.outcome,
        "cache_n": perf.cache_n,
        "prompt_n": perf.prompt_n,
        "predicted_n": perf.predicted_n,
        "ttfb_ms": perf.ttfb_ms,
        "cache_loss": perf.cache_loss,
    }
    if perf.cache_loss_cause:
        fields["loss_cause"] = perf.cache_loss_cause
    if perf.capped:
        fields["capped"] = True
    if perf.outcome == "complete":
        log.info("model request", extra={"fields": fields})
    else:
        detail = perf.extra.get("detail", "")
        log.warning("model request broke: %s", detail, extra={"fields": fields})
