"""The scale section runs end to end on small sizes and shows each figure beside the earlier run."""

from pathlib import Path

from bench import scale
from loopd.sessionlog.store import SessionLog


def test_filling_makes_real_turns_with_new_epochs(tmp_path: Path) -> None:
    with SessionLog.open(tmp_path / "log.db") as log:
        marks = scale.fill(log, "t", 2 * scale.EPOCH_ENTRIES + 1_000)
        entries = log.entries("t")
        assert len(entries) >= 2 * scale.EPOCH_ENTRIES + 1_000
        assert len(log.epochs("t")) >= 3
        assert log.state("t").idle
    assert len(marks) >= 1
    assert all(mark > 0 for mark in marks)


def test_the_section_measures_and_renders_beside_a_before_run() -> None:
    found = scale.measure(sizes=(1_000,), tokens=(200,), start=(3, 2), label="test")
    row = found["sizes"]["1000"]
    assert row["request_warm_ms"] > 0
    assert row["request_cold_ms"] > 0
    assert found["start"]["sessions"] == 3
    assert found["disk"]["with tools"]["bytes"] > found["disk"]["plain"]["bytes"]
    assert found["tokens"]["200"]["loopd_ms"] > 0
    assert found["tokens"]["200"]["bare_ms"] > 0
    assert found["tokens"]["200"]["bare_asyncio_ms"] > 0
    before = dict(found, command="python -m bench.scale (before)")
    text = "\n".join(scale.render(found, before))
    assert "python -m bench.scale (before)" in text
    warm = f"{row['request_warm_ms']:,.2f}"
    assert f"| {warm} / {warm} |" in text
    tokens = found["tokens"]["200"]
    own = (
        f"{tokens['bare_asyncio_ms']:,.3f} | {tokens['loopd_ms'] / tokens['bare_asyncio_ms']:.2f} |"
    )
    assert own in text


def test_the_recorded_before_run_is_there_to_compare_with() -> None:
    recorded = scale.before()
    assert recorded is not None
    assert set(recorded["sizes"]) == {str(size) for size in scale.SIZES}
