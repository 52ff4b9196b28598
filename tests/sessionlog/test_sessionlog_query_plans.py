"""Every query a request's path runs reads by index: ``EXPLAIN QUERY PLAN`` of each shows no
scan of the entries or the requests, so a request costs what is new, not the file's size."""

import re
import sqlite3
from contextlib import closing
from pathlib import Path
from unittest import mock

import anyio

from bench import scale
from loopd.chat.threads import thread_entries
from loopd.engine.client import InferenceClient
from loopd.sessionlog.store import SessionLog

_SCAN = re.compile(r"\bSCAN (e|entries|r|requests)\b")


def _turn_queries(path: Path) -> list[str]:
    """The statements of one turn (two requests and a tool round) and the chat layer's reads
    around it, on a log that holds another session besides."""
    with SessionLog.open(path) as log:
        scale.fill(log, "other", 1_200)
        scale.fill(log, "thread", 1_200)
    seen: list[str] = []
    streams = iter([(scale.STREAMS / n).read_bytes() for n in ("tool_call.sse", "plain.sse")])

    async def one_turn(log: SessionLog) -> None:
        client = InferenceClient("http://127.0.0.1:9", "fake-model")  # the stream is canned
        outcome = await scale.thread_turn(log, "thread", client).run()
        await client.aclose()
        assert outcome.answer is not None

    with (
        SessionLog.open(path) as log,
        mock.patch("loopd.turn.loop.stream_into", scale._canned_stream(streams)),
    ):
        log.trace(seen.append)
        thread_entries(log, "thread")
        log.state("thread")
        log.append_user("thread", "@ana: and now?", external_key="now")
        anyio.run(one_turn, log)
        thread_entries(log, "thread")
        log.latest_entries("thread", 1)
        log.state("thread")
        log.last_answered()
        log.trace(None)
    return [sql for sql in seen if sql.lstrip().upper().startswith("SELECT")]


def test_no_query_of_a_request_scans_the_entries_or_the_requests(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    queries = _turn_queries(path)
    assert len(queries) > 10  # the trace saw the turn's reads
    scans = {}
    with closing(sqlite3.connect(path)) as conn:
        for sql in dict.fromkeys(queries):
            plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}")]
            if any(_SCAN.search(detail) for detail in plan):
                scans[sql] = plan
    assert scans == {}


def test_the_scan_check_catches_a_query_that_reads_everything(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    with SessionLog.open(path) as log:
        scale.new_session(log, "thread")
    with closing(sqlite3.connect(path)) as conn:
        plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN SELECT * FROM entries e")]
    assert any(_SCAN.search(detail) for detail in plan)
