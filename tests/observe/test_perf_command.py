"""``loopd perf``: --since, the percentiles, and --plot FILE.png (matplotlib)."""

from __future__ import annotations

import io
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from loopcommon.jsonbytes import dumps
from loopd.cli import perf as perf_command
from loopd.cli.parser import build_parser
from loopd.observe import perfsummary
from loopd.sessionlog.chain import messages_digest
from loopd.sessionlog.records import Perf, RequestKind, RequestRecord, fresh_external_key
from loopd.sessionlog.store import SessionLog

SESSION = "mm:perf"
NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def _run(db: Path, *argv: str) -> tuple[int, str, str]:
    args = build_parser().parse_args(["perf", *argv])
    out, err = io.StringIO(), io.StringIO()
    code = perf_command.run(args, db, out, err)
    return code, out.getvalue(), err.getvalue()


def _answer(log: SessionLog, **perf: Any) -> None:
    log.append_user(SESSION, "q", external_key=fresh_external_key())
    messages = log.replay_messages(SESSION)
    record = RequestRecord(
        kind=RequestKind.TURN,
        slot=0,
        epoch=log.current_epoch(SESSION).number,
        message_count=len(messages),
        messages_sha256=messages_digest(messages),
        perf=Perf(outcome="complete", **perf),
    )
    log.append_assistant(SESSION, dumps({"role": "assistant", "content": "a"}), request=record)


@dataclass(frozen=True)
class Log:
    path: Path
    cut: datetime  # between the first five requests and the last five


@pytest.fixture
def log(tmp_path: Path) -> Log:
    """Ten turns: a wait for the first token of 100..1000 ms, prompt_n 10..100, 5..50
    tokens/s."""
    path = tmp_path / "loopd.db"
    with SessionLog.open(path) as session_log:
        session_log.ensure_session(SESSION, 0)
        session_log.start_epoch(SESSION, reason="new session", tools_text="[]", system_text="s")
        for i in range(1, 11):
            if i == 6:
                cut = datetime.now(UTC)
            _answer(
                session_log,
                cache_n=i * 100,
                prompt_n=i * 10,
                predicted_n=5,
                ttfb_ms=20.0,
                predicted_per_second=i * 5.0,
                extra={
                    "loopd_queue_ms": i * 100.0 - 60,
                    "server_queue_ms": 20.0,
                    "prompt_read_ms": 30.0,
                    "first_token_ms": 10.0,
                },
            )
    return Log(path, cut)


@pytest.fixture
def db(log: Log) -> Path:
    return log.path


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert [perfsummary.percentile(values, q) for q in (50, 90, 99, 100)] == [50, 90, 99, 100]
    assert perfsummary.percentile([7.0], 99) == 7.0
    assert perfsummary.percentile([3.0, 1.0, 2.0], 50) == 2.0


def test_the_summary_gives_the_percentiles(db: Path) -> None:
    code, out, err = _run(db)
    assert (code, err) == (0, "")
    assert "  wait for the first token: p50 500 ms, p95 1.0 s (10 turns)" in out
    assert "  prompt tokens read per request: p50 50, p95 100 (10 requests)" in out
    assert "  tokens generated per second: p50 25.0, p95 50.0 (10 requests)" in out


def test_since_keeps_the_requests_made_since(log: Log) -> None:
    code, out, err = _run(log.path, "--since", log.cut.isoformat())
    assert (code, err) == (0, "")
    assert out.startswith(f"session {SESSION}: 5 turns, 5 requests to the model")
    assert "wait for the first token: p50 800 ms, p95 1.0 s (5 turns)" in out
    code, out, _ = _run(log.path, "--since", "1h")
    assert out.startswith(f"session {SESSION}: 10 turns, 10 requests to the model")
    code, out, _ = _run(log.path, "--since", (datetime.now(UTC) + timedelta(hours=1)).isoformat())
    assert out.startswith(f"session {SESSION}: 0 turns, 0 requests to the model")


def test_since_parses_spans_and_dates() -> None:
    assert perf_command.parse_since("30m", NOW) == NOW - timedelta(minutes=30)
    assert perf_command.parse_since("7d", NOW) == NOW - timedelta(days=7)
    assert perf_command.parse_since("2026-04-30", NOW) == datetime(2026, 4, 30, tzinfo=UTC)
    with_offset = perf_command.parse_since("2026-04-30T10:00+02:00", NOW)
    assert with_offset == datetime(2026, 4, 30, 8, tzinfo=UTC)


def test_a_bad_since_is_one_line(db: Path) -> None:
    code, out, err = _run(db, "--since", "yesterday")
    assert (code, out) == (2, "")
    assert err == (
        "loopd: perf: --since: 'yesterday' is neither a span (30m, 2h, 7d) nor an ISO date "
        "or time (2026-05-01)\n"
    )


def test_plot_draws_a_png(db: Path, tmp_path: Path) -> None:
    from matplotlib import image

    png = tmp_path / "perf.png"
    code, out, err = _run(db, "--plot", str(png))
    assert code == 0
    assert err == f"wrote {png} (10 requests)\n"
    assert out.startswith(f"session {SESSION}: 10 turns, 10 requests to the model")
    pixels = image.imread(png)
    height, width = pixels.shape[:2]
    assert (width, height) == (1000, 800)
    assert pixels.std() > 0.01, "not a blank image"


def test_plot_says_what_is_missing(db: Path, tmp_path: Path, monkeypatch: Any) -> None:
    code, _, err = _run(db, "--plot", str(tmp_path / "no" / "such" / "dir.png"))
    assert code == 2
    assert err.startswith("loopd: perf: --plot: cannot write ")
    assert err.count("\n") == 1
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    code, _, err = _run(db, "--since", later, "--plot", str(tmp_path / "empty.png"))
    assert (code, err) == (2, "loopd: perf: --plot: no requests to draw\n")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the extra were not installed
    code, _, err = _run(db, "--plot", str(tmp_path / "x.png"))
    assert (code, err) == (2, "loopd: perf: --plot: needs matplotlib: pip install 'loopd[plot]'\n")
