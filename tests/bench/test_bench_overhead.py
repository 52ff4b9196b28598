"""loopd's own cost: the session log, memory in a fresh process, CPU share."""

from pathlib import Path

import pytest

from bench.memory import main, measure
from bench.overhead import cpu_share, log_cost


def test_log_cost_spreads_over_runs() -> None:
    cost = log_cost(repeats=2, sizes=(10, 30), appends=5)
    assert cost.appends == 5
    assert cost.append_p50_ms.count == 2
    assert set(cost.build_ms) == {10, 30}
    assert cost.append_p99_ms.maximum >= cost.append_p50_ms.minimum


def test_idle_sessions_are_created_and_measured(tmp_path: Path) -> None:
    sample = measure(tmp_path, sessions=3, turns=2)
    assert sample.sessions == 3
    assert sample.rss_before_mib > 10
    assert sample.rss_after_mib > 10


def test_memory_child_refuses_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["dir", "many"]) == 2
    assert "usage" in capsys.readouterr().err


def test_cpu_share_is_cpu_over_wall() -> None:
    share = cpu_share("turns", [0.01, 0.02, 0.0], [1.0, 1.0, 0.0])  # a zero wall is skipped
    assert share.share.count == 2
    assert share.share.minimum == pytest.approx(0.01)
    assert share.share.maximum == pytest.approx(0.02)
