"""The usage metrics are bounded: a scrape reads only what was recorded since the one before, by
index, never on the event loop; and their label values are bounded, what is folded said.

The scrapes run in a child process (``tests.watch``) through ``loopd serve``'s own metrics app on
a log of a 21,600-entry thread, so its peak memory and its event loop's longest stall are printed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, generate_latest

from loopcommon.statuspage import ThreadView
from loopd.chat.cursor import ChatState
from loopd.config import load_settings
from loopd.observe.metrics import FOLDED
from loopd.sessionlog.store import SessionLog
from loopd.sessions import Runtime
from loopd.status.server import create_app
from loopd.status.usage import TOP_CHANNELS, TOP_PEOPLE, UsageCollector
from loopd.usage.source import UNLABELLED, thread_labels
from tests.observe.observe_support import scraped, value
from tests.usage.test_usage import _answer, _record
from tests.watch import run_watched, under_heartbeat

THREAD = "mm:bigthread00000000000000"
TURNS = 10_800  # 21,600 entries: a user message and an answer each
REQUESTS = "loopd_usage_requests_total"


def write_long_thread(state: Path) -> None:
    with SessionLog.open(state / "loopd.db") as log:
        log.ensure_session(THREAD, 0)
        log.start_epoch(THREAD, reason="new session", tools_text="[]", system_text="You help.")
        with log.transaction():
            for turn in range(TURNS):
                log.append_user(THREAD, f"@alice: question {turn}", external_key=f"p{turn}")
                log.append_assistant(THREAD, _answer(f"answer {turn}"), request=_record(40, 10))


class ReadWatch:
    """Counts the rows the session log's reads return, and those read on the event loop's
    thread."""

    READS = ("sessions", "requests", "requests_after", "entries")

    def __init__(self, log: SessionLog) -> None:
        self.rows = 0
        self.on_loop = 0
        self.loop_thread = threading.current_thread()
        for name in self.READS:
            setattr(log, name, self._watched(getattr(log, name)))

    def _watched(self, read: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
        def watched(*args: Any, **kwargs: Any) -> list[Any]:
            found = read(*args, **kwargs)
            self.rows += len(found)
            self.on_loop += len(found) * (threading.current_thread() is self.loop_thread)
            return found

        return watched


async def scrapes(state_dir: str) -> dict[str, Any]:
    """Two scrapes of ``/metrics``, the second after one more turn, as ``loopd serve`` serves
    them; what each read of the log, and the event loop's longest stall while they ran."""
    runtime = Runtime.open(load_settings(state_dir=Path(state_dir), model="m"))
    reads = ReadWatch(runtime.log)
    transport = httpx.ASGITransport(create_app(runtime))

    async def both() -> dict[str, Any]:
        async with httpx.AsyncClient(transport=transport, base_url="http://loopd") as page:
            started = time.monotonic()
            await page.get("/metrics")
            first = {"rows": reads.rows, "on_loop": reads.on_loop, "s": time.monotonic() - started}
            reads.rows = reads.on_loop = 0
            runtime.log.append_user(THREAD, "@bob: one more", external_key="more")
            runtime.log.append_assistant(THREAD, _answer("done"), request=_record(5, 2))
            second_page = scraped((await page.get("/metrics")).text)
        second = {"rows": reads.rows, "on_loop": reads.on_loop}
        bob = value(
            second_page, "loopd_usage_prompt_tokens_total", person="bob", channel=UNLABELLED
        )
        return {"first": first, "second": second, "bob": bob}

    try:
        result, stall = await under_heartbeat(both())
    finally:
        await runtime.aclose()
    return {**result, "stall_s": stall}


def test_a_scrape_reads_what_is_new_off_the_event_loop(tmp_path: Path) -> None:
    write_long_thread(tmp_path)
    watched = run_watched("tests.usage.test_usage_bounds:scrapes", str(tmp_path), timeout_s=300)
    first, second = watched.result["first"], watched.result["second"]
    stall = watched.result["stall_s"]
    print(
        f"first scrape: {first['rows']:,} rows read ({first['on_loop']:,} on the event loop) in "
        f"{first['s']:.2f} s; after one more turn: {second['rows']:,} rows "
        f"({second['on_loop']:,} on the loop); longest stall during the scrapes "
        f"{stall * 1000:.0f} ms; {watched.line}"
    )
    assert watched.result["bob"] == 5.0  # the new turn was counted
    assert first["on_loop"] == second["on_loop"] == 0
    assert second["rows"] < 10
    assert stall < first["s"] / 2  # the count took the loop no more than a fraction of its time


def write_many_threads(state: Path, channels: int, people: int) -> None:
    """One thread per channel, each started by one of ``people``, labelled in the chat state."""
    chat = ChatState.open(state / "chat.db")
    try:
        with SessionLog.open(state / "loopd.db") as log, log.transaction():
            for n in range(channels):
                root = f"root{n:022d}"
                session = f"mm:{root}"
                log.ensure_session(session, 0)
                log.start_epoch(session, reason="new session", tools_text="[]", system_text="Hi.")
                person = f"user{n % people}"
                log.append_user(session, f"@{person}: hello", external_key=f"k{n}")
                log.append_assistant(session, _answer("hi"), request=_record(10 + n, 1))
                chat.label_thread(ThreadView(root, f"~channel{n}", person, "hello"))
    finally:
        chat.close()


def test_usage_label_values_are_bounded_and_what_is_folded_is_said(tmp_path: Path) -> None:
    write_many_threads(tmp_path, channels=400, people=120)
    registry = CollectorRegistry()
    with SessionLog.open(tmp_path / "loopd.db") as log:
        collector = UsageCollector(
            log, lambda: thread_labels(tmp_path), "ann", channels=("channel7", "*")
        )
        registry.register(collector)
        collector.refresh()
        page = scraped(generate_latest(registry).decode())
    series = [(dict(labels), n) for (name, labels), n in page.items() if name == REQUESTS]
    channels = {labels["channel"] for labels, _ in series}
    people = {labels["person"] for labels, _ in series}
    print(f"{len(series)} series: {len(channels)} channels, {len(people)} people")
    assert len(channels) == TOP_CHANNELS + 2  # the largest 20, the configured one, (other)
    assert "~channel7" in channels  # configured: named, however small
    assert "~channel399" in channels  # the largest
    assert FOLDED in channels
    assert len(people) == TOP_PEOPLE + 1
    assert sum(n for _, n in series) == 400  # nothing lost: the rest summed as (other)
    assert value(page, "loopd_usage_folded_labels", label="channel") == 400 - TOP_CHANNELS - 1
    assert value(page, "loopd_usage_folded_labels", label="person") == 120 - TOP_PEOPLE
