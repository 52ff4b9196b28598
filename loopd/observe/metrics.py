"""loopd's Prometheus metrics: one registry, and one method per event the engine reports.

The hooks in the engine, the chat adapter and the runtime are one call each (``METRICS.x(...)``);
what a record means for which metric is decided here. Label values are bounded: request kinds,
outcomes and loss causes come from loopd's own enums, tool names from the tools file (anything
else the model calls is ``unknown``), Mattermost events from the list below (the rest ``other``),
slots from ``LOOPD_SLOTS``; the usage's people and channels (``loopd.status.usage``) through a
``LabelFold`` each: the configured channels, then the largest of the rest up to a number, the
others summed as ``(other)`` and counted in ``loopd_usage_folded_labels``. The state that is read
rather than counted (busy slots, live turns) is collected at scrape time from the runtime
(``loopd.status.server``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

from loopcommon.version import installed_version
from loopd.engine.cacheloss import LossCause
from loopd.sessionlog.records import RequestKind, RequestRecord

SECONDS_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
TOOL_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
# Events of Mattermost's WebSocket that loopd may see; each gets its own label value.
MM_EVENTS: Final = frozenset(
    {
        "hello",
        "posted",
        "post_edited",
        "post_deleted",
        "reaction_added",
        "reaction_removed",
        "typing",
        "channel_viewed",
        "user_added",
        "user_removed",
        "status_change",
        "direct_added",
        "group_added",
        "new_user",
        "preferences_changed",
    }
)
REQUEST_OUTCOMES: Final = frozenset({"complete", "broken", "cancelled"})
TURN_OUTCOMES: Final = ("answered", "failed", "cancelled")
_LOSS_NAMES: Final = {cause.value: cause.name.lower() for cause in LossCause}
FOLDED: Final = "(other)"  # a label's values past its bound, summed (no username has brackets)

log = logging.getLogger(__name__)
# A counter's ``_created`` series doubles what a scrape carries and no dashboard or rule reads it.
disable_created_metrics()  # type: ignore[no-untyped-call]


def loss_label(cause: str | None) -> str:
    """A short label for a recorded cause (``"new epoch"`` -> ``new_epoch``)."""
    return _LOSS_NAMES.get(cause or "", "unexplained") or "unexplained"


class LoopdMetrics:
    """Every loopd metric, in a registry of its own (so a test can make a fresh one)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.turns = Counter("loopd_turns", "Turns ended, by outcome.", ["outcome"], registry=r)
        self.requests = Counter(
            "loopd_requests",
            "Model requests sent, by kind and outcome (retries are requests of their own).",
            ["kind", "outcome"],
            registry=r,
        )
        self.prompt_processed = Counter(
            "loopd_prompt_tokens_processed",
            "Prompt tokens the server evaluated (prompt_n), by request kind.",
            ["kind"],
            registry=r,
        )
        self.prompt_reused = Counter(
            "loopd_prompt_tokens_reused",
            "Prompt tokens the server took from its cache (cache_n), by request kind.",
            ["kind"],
            registry=r,
        )
        self.generated = Counter(
            "loopd_generated_tokens",
            "Tokens generated (predicted_n), by kind.",
            ["kind"],
            registry=r,
        )
        self.cache_losses = Counter(
            "loopd_cache_losses",
            "Requests that re-read what the previous one had cached, by cause.",
            ["cause"],
            registry=r,
        )
        self.cache_lost_tokens = Counter(
            "loopd_cache_lost_tokens",
            "Prompt tokens re-read that the previous request had cached, by cause.",
            ["cause"],
            registry=r,
        )
        self.ttfb = Histogram(
            "loopd_time_to_first_byte_seconds",
            "From sending a model request to its first byte, by kind.",
            ["kind"],
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.server_queue = Histogram(
            "loopd_server_queue_wait_seconds",
            "Time a request waited while the server's slot was busy with another client.",
            ["slot"],
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.slot_wait = Histogram(
            "loopd_slot_wait_seconds",
            "Time a turn waited in loopd's line for its slot (behind other sessions on it).",
            ["slot"],
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.capped = Counter(
            "loopd_thinking_capped", "Requests whose thinking hit LOOPD_THINK_CAP.", registry=r
        )
        self.compactions = Counter(
            "loopd_compactions", "Turns that first compacted the session.", registry=r
        )
        self.prewarms = Counter(
            "loopd_prewarms", "Prewarms tried, by outcome.", ["outcome"], registry=r
        )
        self.tool_calls = Counter(
            "loopd_tool_calls", "Tool calls, by tool and outcome.", ["tool", "outcome"], registry=r
        )
        self.guard_firings = Counter(
            "loopd_guard_firings",
            "Times a loop guard answered the model, by guard (repeat, cycle, failures, "
            "calls_per_message, calls_per_turn, tool_time; thinking_loop, answer_loop) and "
            "action: pointed (a call answered with its earlier result, not run), stopped (the "
            "turn ended), ended (the reasoning ended by the control call) or closed (the answer "
            "closed, kept as written).",
            ["guard", "action"],
            registry=r,
        )
        self.tool_seconds = Histogram(
            "loopd_tool_call_seconds",
            "Time a tool call took, by tool.",
            ["tool"],
            buckets=TOOL_BUCKETS,
            registry=r,
        )
        self.mm_events = Counter(
            "loopd_mattermost_events",
            "Mattermost WebSocket events received, by event.",
            ["event"],
            registry=r,
        )
        self.mm_reconnects = Counter(
            "loopd_mattermost_reconnects", "Reconnections to Mattermost's WebSocket.", registry=r
        )
        self.answers_cut = Counter(
            "loopd_answers_cut",
            "Requests whose answer the server cut at max_tokens (finish_reason length), by kind.",
            ["kind"],
            registry=r,
        )
        self.mm_connected = Gauge(
            "loopd_mattermost_connected",
            "1 while loopd's WebSocket to Mattermost is open and caught up, else 0.",
            registry=r,
        )
        self.build_info = Gauge(
            "loopd_build_info", "Always 1: the installed loopd, as labels.", ["version"], registry=r
        )
        self.build_info.labels(installed_version()).set(1)
        self.retries = Counter(
            "loopd_retries",
            "Calls sent again after a transient failure, by what was called.",
            ["target"],
            registry=r,
        )
        for outcome in TURN_OUTCOMES:  # present from the start, so a rate() sees the first one
            self.turns.labels(outcome)
        for kind in RequestKind:
            self.requests.labels(kind.value, "complete")

    # -- the events --------------------------------------------------------------------------

    def request_recorded(self, record: RequestRecord) -> None:
        """A model request ended and was recorded (turn, tool follow-up, compaction, prewarm)."""
        kind, perf = record.kind.value, record.perf
        outcome = perf.outcome if perf.outcome in REQUEST_OUTCOMES else "other"
        self.requests.labels(kind, outcome).inc()
        if perf.prompt_n is not None:
            self.prompt_processed.labels(kind).inc(perf.prompt_n)
        if perf.cache_n is not None:
            self.prompt_reused.labels(kind).inc(perf.cache_n)
        if perf.predicted_n is not None:
            self.generated.labels(kind).inc(perf.predicted_n)
        if perf.cache_loss:
            cause = loss_label(perf.cache_loss_cause)
            self.cache_losses.labels(cause).inc()
            self.cache_lost_tokens.labels(cause).inc(perf.cache_loss)
        if perf.extra.get("finish_reason") == "length":
            self.answers_cut.labels(kind).inc()
        if perf.ttfb_ms is not None:
            self.ttfb.labels(kind).observe(perf.ttfb_ms / 1000)
        if perf.queue_wait_ms is not None:
            self.server_queue.labels(str(record.slot)).observe(perf.queue_wait_ms / 1000)
        if perf.capped:
            self.capped.inc()

    def mattermost_connected(self, connected: bool) -> None:
        self.mm_connected.set(1 if connected else 0)

    def turn_ended(self, outcome: str, *, compacted: bool = False) -> None:
        self.turns.labels(outcome if outcome in TURN_OUTCOMES else "failed").inc()
        if compacted:
            self.compactions.inc()

    def slot_waited(self, slot: int, seconds: float) -> None:
        self.slot_wait.labels(str(slot)).observe(seconds)

    def prewarm_ended(self, outcome: str) -> None:
        """A prewarm ended (``PrewarmOutcome``'s value): done, failed, cancelled or skipped (no
        request sent). Its request, if it sent one, was counted when it was recorded
        (``loopd.observe.recorder``)."""
        self.prewarms.labels(outcome).inc()

    def tool_called(self, tool: str, outcome: str, seconds: float) -> None:
        self.tool_calls.labels(tool, outcome).inc()
        self.tool_seconds.labels(tool).observe(seconds)

    def guard_fired(self, guard: str, action: str) -> None:
        """A loop guard acted (``loopd.engine.guards``, ``loopd.engine.loops``)."""
        self.guard_firings.labels(guard, action).inc()

    def mattermost_event(self, event: str) -> None:
        self.mm_events.labels(event if event in MM_EVENTS else "other").inc()

    def mattermost_reconnect(self) -> None:
        self.mm_reconnects.inc()

    def retried(self, target: str) -> None:
        """``target``: ``inference`` (a model request sent again) or ``mattermost`` (a REST
        call)."""
        self.retries.labels(target).inc()


class LabelFold:
    """A label's values, bounded: the ``fixed`` ones, and up to ``top`` others, the largest
    first, taken as they are first seen; every value after those is ``FOLDED``. A value once
    named keeps its name and one folded stays folded, so a counter's series never moves from one
    label value to another (a counter that went down would read as a reset)."""

    def __init__(self, name: str, top: int, fixed: Collection[str] = ()) -> None:
        self.name = name
        self.top = top
        self.fixed = frozenset(fixed)
        self._named: set[str] = set()
        self._folded: set[str] = set()

    def labels(self, sizes: Mapping[str, float]) -> dict[str, str]:
        """Each value of ``sizes`` (a value: how much it weighs, to rank new ones) to its
        label value."""
        new = [v for v in sizes if v not in self.fixed | self._named | self._folded]
        for value in sorted(new, key=lambda v: (-sizes[v], v)):
            if len(self._named) < self.top:
                self._named.add(value)
            else:
                if not self._folded:
                    log.warning(
                        "usage metrics: more than %d values of %s; the rest are summed as %s "
                        "(loopd_usage_folded_labels counts them)",
                        self.top,
                        self.name,
                        FOLDED,
                    )
                self._folded.add(value)
        return {v: FOLDED if v in self._folded else v for v in sizes}

    @property
    def folded(self) -> int:
        """How many values are summed as ``FOLDED``."""
        return len(self._folded)


def tool_label(name: str, known: Collection[str]) -> str:
    """The tool's name when loopd knows it; a name the model made up is ``unknown``."""
    return name if name in known else "unknown"


METRICS: Final = LoopdMetrics()
"""The process's metrics, served by ``loopd serve`` at ``LOOPD_METRICS_ADDR``."""
