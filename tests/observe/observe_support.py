"""Helpers for the observability tests: captured JSON log lines, and metric deltas."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from loopcommon.context import ContextFields
from loopcommon.logsetup import JsonLinesFormatter

Labels = dict[str, str]


@dataclass
class Captured:
    out: io.StringIO = field(default_factory=io.StringIO)

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.getvalue().splitlines() if line]

    def of(self, prefix: str) -> list[dict[str, Any]]:
        """The lines of loggers under ``prefix`` (``loopd.``, ``brokerd.``)."""
        return [line for line in self.lines() if str(line["logger"]).startswith(prefix)]


@contextmanager
def captured_logs() -> Iterator[Captured]:
    """Every log line at INFO and above as JSON objects, with both daemons' context fields (the
    two daemons run in one process here; the shared filter reads the innermost scope's)."""
    captured = Captured()
    handler = logging.StreamHandler(captured.out)
    handler.setFormatter(JsonLinesFormatter())
    handler.addFilter(ContextFields())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield captured
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """A sample's value now (0 when it has none yet)."""
    return registry.get_sample_value(name, labels) or 0.0


Page = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scraped(text: str) -> Page:
    """A /metrics page parsed by prometheus_client's own parser: (name, labels) -> value."""
    out: Page = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(
    page: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return page.get((name, tuple(sorted(labels.items()))), 0.0)


async def eventually(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Wait for ``condition()`` (polled; the daemons offer no event for what they did)."""
    try:
        with anyio.fail_after(timeout_s):
            while not condition():  # noqa: ASYNC110
                await anyio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None
