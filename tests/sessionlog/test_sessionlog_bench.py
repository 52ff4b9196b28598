"""The bench function runs and reports plausible numbers (small sizes; ``make bench`` runs big)."""

from pathlib import Path

from loopd_dev.sessionlog_bench import measure


def test_measure_reports_latency_and_build_times(tmp_path: Path) -> None:
    result = measure(tmp_path, sizes=(10, 100), appends=20)
    assert 0 < result.append_p50_ms <= result.append_p99_ms
    assert set(result.build_ms) == {10, 100}
    assert all(ms > 0 for ms in result.build_ms.values())
