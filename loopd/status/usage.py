"""The usage ledger's totals as metrics: prompt, cached and generated tokens and GPU seconds per
person and channel (``loopd.usage``), read from the session log.

They are counters over the whole log (a day is the scrape's time axis: ``increase(...[1d])``).
The log is read incrementally, by index: ``refresh`` reads the requests recorded after the last
one it counted, and, for each session they belong to, the entries after the last one it read
(``loopd.usage.ledger.Tally``), so a scrape costs what was recorded since the one before, however
long the log. ``refresh`` does I/O and is run in a worker thread (``loopd.status.server``), never
on the event loop that reads model streams and Mattermost; ``collect`` only reports its totals.

The label values are bounded (``LabelFold``): channels are the configured ones (and the fixed
ones: direct and group messages, terminal) plus the ``TOP_CHANNELS`` largest others, people the
``TOP_PEOPLE`` largest; the rest are summed as ``(other)``, and ``loopd_usage_folded_labels``
says how many values each label folds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from loopcommon.statuspage import ThreadView
from loopd.chat.labels import DIRECT_MESSAGE, GROUP_MESSAGE
from loopd.observe.metrics import LabelFold
from loopd.sessionlog.errors import LogError
from loopd.sessionlog.records import Request
from loopd.sessionlog.store import SessionLog
from loopd.usage.ledger import TERMINAL_CHANNEL, Tally, UsageTotals
from loopd.usage.source import UNLABELLED, channel_and_person

log = logging.getLogger(__name__)

TOP_PEOPLE: Final = 50
TOP_CHANNELS: Final = 20
PAGE: Final = 1000  # rows read at a time: the log's lock is let go between pages
FIXED_CHANNELS: Final = (TERMINAL_CHANNEL, DIRECT_MESSAGE, GROUP_MESSAGE, UNLABELLED)

_FIGURES = (
    ("loopd_usage_prompt_tokens", "Prompt tokens the server evaluated for a person's turns."),
    ("loopd_usage_cached_tokens", "Prompt tokens of a person's turns taken from the cache."),
    ("loopd_usage_generated_tokens", "Tokens generated for a person's turns."),
    ("loopd_usage_gpu_seconds", "Server time (prompt and generation) for a person's turns."),
    ("loopd_usage_requests", "Model requests made for a person's turns."),
)

Totals = dict[tuple[str, str], UsageTotals]  # (person, channel) -> usage


class UsageCollector(Collector):
    """``loopd_usage_*_total{person, channel}``. ``threads``: the Mattermost threads' labels by
    session name (their channels), read at each refresh; ``channels``: the configured channels
    (``LOOPD_MM_ALLOWED_CHANNELS``), which always have a label value of their own."""

    def __init__(
        self,
        log: SessionLog,
        threads: Callable[[], Mapping[str, ThreadView]],
        local_person: str,
        channels: Collection[str] = (),
    ) -> None:
        self.log = log
        self.threads = threads
        self.local_person = local_person
        configured = [f"~{name}" for name in channels if name != "*"]
        self.people = LabelFold("person", TOP_PEOPLE)
        self.channels = LabelFold("channel", TOP_CHANNELS, (*FIXED_CHANNELS, *configured))
        self._tallies: dict[str, Tally] = {}
        self._last_request = 0  # the last request row counted, every session's
        self._totals: Totals = {}
        self._lock = threading.Lock()  # one refresh at a time

    def refresh(self) -> None:
        """Count what the log recorded since the last refresh (blocking: run it off the event
        loop). A log that cannot be read keeps the totals as they were, with one log line."""
        with self._lock:
            try:
                self._count_new()
            except LogError as exc:
                log.warning("usage metrics: the session log could not be read: %s", exc)
                return
            self._totals = _totals(self._tallies.values())

    def _count_new(self) -> None:
        labels = self.threads()
        self._recount_relabelled(labels)
        while page := self.log.requests_after(self._last_request, PAGE):
            by_session: dict[str, list[Request]] = {}
            for name, request in page:
                by_session.setdefault(name, []).append(request)
            for name, requests in by_session.items():
                tally = self._tallies.get(name) or self._tally(name, labels)
                self._tallies[name] = tally
                self._read_entries(tally, name)
                tally.count(r for r in requests if r.id > tally.last_request)
            self._last_request = page[-1][1].id

    def _tally(self, session: str, labels: Mapping[str, ThreadView]) -> Tally:
        channel, person = channel_and_person(session, labels, self.local_person)
        return Tally(channel, person)

    def _recount_relabelled(self, labels: Mapping[str, ThreadView]) -> None:
        """A session whose channel changed (its thread's label came after its first requests)
        is counted again from its start, up to where the others are."""
        for name, tally in list(self._tallies.items()):
            fresh = self._tally(name, labels)
            if fresh.channel == tally.channel:
                continue
            self._read_entries(fresh, name)
            fresh.count(r for r in self.log.requests(name) if r.id <= self._last_request)
            self._tallies[name] = fresh

    def _read_entries(self, tally: Tally, session: str) -> None:
        while entries := self.log.entries(session, after_seq=tally.last_entry, limit=PAGE):
            tally.read(entries)

    def collect(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        """The totals of the last ``refresh``, under bounded label values (no I/O)."""
        families = [
            CounterMetricFamily(name, text, labels=["person", "channel"]) for name, text in _FIGURES
        ]
        for (person, channel), usage in sorted(self._folded().items()):
            for family, value in zip(families, _values(usage), strict=True):
                family.add_metric([person, channel], value)
        folded = GaugeMetricFamily(
            "loopd_usage_folded_labels",
            "Values of a usage label summed as (other): people past the largest 50, channels "
            "past the configured ones and the largest 20 others.",
            labels=["label"],
        )
        for fold in (self.people, self.channels):
            folded.add_metric([fold.name], float(fold.folded))
        return [*families, folded]

    def _folded(self) -> Totals:
        totals = self._totals
        people = self.people.labels(_sizes(totals, 0))
        channels = self.channels.labels(_sizes(totals, 1))
        out: Totals = {}
        for (person, channel), usage in totals.items():
            out.setdefault((people[person], channels[channel]), UsageTotals()).add(usage)
        return out


def _totals(tallies: Iterable[Tally]) -> Totals:
    totals: Totals = {}
    for tally in tallies:
        for key, usage in tally.ledger.items():
            totals.setdefault((key.person, key.channel), UsageTotals()).add(usage)
    return totals


def _sizes(totals: Totals, part: int) -> dict[str, float]:
    """Each person's (``part`` 0) or channel's (1) tokens: how a new value is ranked."""
    sizes: dict[str, float] = {}
    for key, usage in totals.items():
        sizes[key[part]] = sizes.get(key[part], 0) + usage.prompt_tokens + usage.generated_tokens
    return sizes


def _values(usage: UsageTotals) -> tuple[float, ...]:
    return (
        float(usage.prompt_tokens),
        float(usage.cached_tokens),
        float(usage.generated_tokens),
        usage.gpu_seconds,
        float(usage.requests),
    )
