"""The placement section: its figures are computed from the requests the session log recorded."""

from __future__ import annotations

from typing import Any

from bench.placement import PlacementRun, TurnSample, section
from loopd.sessionlog.records import Perf, Request, RequestKind, RequestRecord


def _request(
    number: int, duration_ms: float, *, failure: str | None = None, **perf: Any
) -> Request:
    extra: dict[str, Any] = {"duration_ms": duration_ms}
    if failure is not None:
        extra["failure"] = failure
    record = RequestRecord(RequestKind.TURN, 0, 1, 1, "0" * 64, Perf(extra=extra, **perf))
    return Request(number, 1, record, "2026-12-01T00:00:00+00:00")


def test_queue_wait_reads_and_the_lost_endpoints_cost() -> None:
    turns = [
        TurnSample("t0", 2.0, (_request(1, 500, prompt_n=40, cache_loss=0),)),
        TurnSample(
            "t1",
            7.0,
            (
                _request(2, 0, failure="unreachable"),
                _request(3, 1000, prompt_n=120, cache_loss=100, cache_loss_cause="endpoint lost"),
            ),
        ),
    ]
    run = PlacementRun("2 endpoints, a killed", 2, 2, turns, 9.0, {"b": 2})
    assert run.queue_wait() == (3.75, 6.0)  # 2 - 0.5 and 7 - 1, median and max
    assert run.read_per_turn() == 80.0
    assert run.reread_per_turn() == 50.0
    assert run.delayed() == (1, 5.0)
    text = "\n".join(section([run], "2026-12-01"))
    assert "| 2 endpoints, a killed | 2 | b: 2 | 3.75 / 6.00 | 80.0 | 50.0 | 9.0 |" in text
    assert "1 requests recorded `endpoint lost` (t1; one per session that moved)" in text
    assert "re-reading 100 tokens" in text
