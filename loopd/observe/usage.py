"""The usage ledger's totals as metrics: prompt, cached and generated tokens and GPU seconds per
person and channel (``loopd.usage``), read from the session log at scrape time.

They are counters over the whole log (a day is the scrape's time axis: ``increase(...[1d])``).
A session's figures are counted again only when it has recorded a request since the last scrape,
so a scrape reads the requests table and the entries of the sessions that changed, not every
session's messages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from loopcommon.statuspage import ThreadView
from loopd.sessionlog.store import SessionLog
from loopd.usage.ledger import Ledger, UsageTotals, merged, totals
from loopd.usage.source import one_session

_FIGURES = (
    ("loopd_usage_prompt_tokens", "Prompt tokens the server evaluated for a person's turns."),
    ("loopd_usage_cached_tokens", "Prompt tokens of a person's turns taken from the cache."),
    ("loopd_usage_generated_tokens", "Tokens generated for a person's turns."),
    ("loopd_usage_gpu_seconds", "Server time (prompt and generation) for a person's turns."),
    ("loopd_usage_requests", "Model requests made for a person's turns."),
)


@dataclass(frozen=True)
class _Counted:
    last_row: int  # the session's latest request when it was counted
    label: ThreadView | None
    ledger: Ledger


class UsageCollector(Collector):
    """``loopd_usage_*_total{person, channel}``. ``threads``: the Mattermost threads' labels by
    session name (their channels), read at each scrape."""

    def __init__(
        self, log: SessionLog, threads: Callable[[], Mapping[str, ThreadView]], local_person: str
    ) -> None:
        self.log = log
        self.threads = threads
        self.local_person = local_person
        self._counted: dict[str, _Counted] = {}

    def ledger(self) -> Ledger:
        labels = self.threads()
        for session in self.log.sessions():
            requests = self.log.requests(session.name)
            last = requests[-1].id if requests else 0
            label = labels.get(session.name)
            known = self._counted.get(session.name)
            if known is None or (known.last_row, known.label) != (last, label):
                counted = one_session(self.log, session, labels, self.local_person)
                self._counted[session.name] = _Counted(last, label, counted)
        return merged(counted.ledger for counted in self._counted.values())

    def collect(self) -> Iterable[CounterMetricFamily]:
        per = totals(self.ledger(), lambda key: (key.person, key.channel))
        families = [
            CounterMetricFamily(name, text, labels=["person", "channel"]) for name, text in _FIGURES
        ]
        for (person, channel), usage in sorted(per.items()):
            for family, value in zip(families, _values(usage), strict=True):
                family.add_metric([person, channel], value)
        return families


def _values(usage: UsageTotals) -> tuple[float, ...]:
    return (
        float(usage.prompt_tokens),
        float(usage.cached_tokens),
        float(usage.generated_tokens),
        usage.gpu_seconds,
        float(usage.requests),
    )
