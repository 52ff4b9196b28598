"""The switching benchmark's turns and summary, against the fake llama-server."""

from pathlib import Path

import pytest

from bench.stats import Spread
from bench.switching import TurnSample, first_message, report_text, run, summarize
from tests.bench.fake_server import fake_server


def test_reports_are_deterministic_and_distinct() -> None:
    assert report_text(1) == report_text(1)
    assert report_text(1) != report_text(2)
    assert first_message(3).startswith("Report 3: ")


@pytest.mark.anyio
async def test_sessions_take_turns_on_one_slot_and_later_turns_are_switches(
    tmp_path: Path,
) -> None:
    async with fake_server() as url:
        samples = await run(url, tmp_path, counts=(1, 2), rounds=2, max_tokens=4)
    assert [(s.sessions, s.session, s.round) for s in samples] == [
        (1, "smollm2-share1-0", 1),
        (1, "smollm2-share1-0", 2),
        (2, "smollm2-share2-0", 1),
        (2, "smollm2-share2-1", 1),
        (2, "smollm2-share2-0", 2),
        (2, "smollm2-share2-1", 2),
    ]
    assert [s.switched for s in samples] == [False, False, True, True, True, True]
    assert all(s.prompt_n > 0 and s.wall_s > 0 for s in samples)
    alone = samples[1]
    assert alone.cache_loss == 0  # the same session again: nothing to re-read


def _sample(sessions: int, round_number: int, loss: int, switched: bool) -> TurnSample:
    return TurnSample(
        "smollm2", sessions, "s", round_number, switched, 100, 10 + loss, loss, 0.5, 1.0, 0.01
    )


def test_summary_is_over_the_turns_after_each_sessions_first() -> None:
    samples = [
        _sample(1, 1, 0, False),
        _sample(1, 2, 0, False),
        _sample(2, 1, 0, True),
        _sample(2, 2, 4, True),
        _sample(2, 3, 8, True),
    ]
    rows = summarize(samples)
    assert [(row.sessions, row.turns, row.switches) for row in rows] == [(1, 1, 0), (2, 2, 2)]
    assert rows[1].cache_loss == Spread(4, 6, 8, 2)
    assert rows[1].prompt_n == Spread(14, 16, 18, 2)
