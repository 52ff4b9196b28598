"""Reading llama-server's trace log: lines recorded from build 11434 with ``-lv 4``."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.errors import BenchError
from bench.pool import explain
from bench.serverlog import LogFollower, ServerSteps, parse

DATA = Path(__file__).resolve().parent.parent / "data" / "serverlog"


def lines(name: str) -> list[str]:
    return (DATA / name).read_text(encoding="utf-8").splitlines()


def test_a_pinned_request_to_a_cleared_slot() -> None:
    """Slot 0 was cleared by the previous launch; this launch clears slot 1 in turn."""
    steps = parse(lines("pinned-slot-cleared.log"))
    assert steps.task == 6
    assert steps.slot == 0
    assert steps.selected_by == "id"
    assert steps.pinned_slot_empty
    assert not steps.cache_updated
    assert steps.cleared == {1: 107}
    assert steps.prompt_tokens == 128
    assert steps.checkpoint is None
    cause = explain(steps, held=106, cache_n=0, hybrid=True)
    assert cause.startswith("pinned slot empty: cleared when a task launched on another slot")


def test_a_prompt_restored_from_the_host_cache_then_its_checkpoint() -> None:
    steps = parse(lines("one-slot-restored.log"))
    assert (steps.task, steps.slot, steps.selected_by) == (114, 0, "id")
    assert steps.cache_updated
    assert steps.cache_loaded
    assert not steps.pinned_slot_empty
    assert steps.checkpoint == 99
    assert steps.cleared == {}  # the idle slots it cleared held nothing
    cause = explain(steps, held=103, cache_n=99, hybrid=True)
    assert cause.startswith("restored from the host prompt cache; resumed at the checkpoint at 99")


def test_first_requests_and_unreadable_logs_are_said_so() -> None:
    assert explain(ServerSteps(), held=0, cache_n=0, hybrid=False) == "first request"
    assert explain(ServerSteps(), held=50, cache_n=0, hybrid=False).startswith("unreadable")


def test_kept_in_the_slot() -> None:
    steps = ServerSteps(task=3, slot=1, selected_by="id")
    assert explain(steps, held=80, cache_n=80, hybrid=False) == "kept in its slot"


def test_the_follower_returns_a_requests_lines_and_waits_for_the_release(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_text("before\n", encoding="utf-8")
    follower = LogFollower(path)
    follower.mark()
    release = lines("pinned-slot-cleared.log")[-1]
    with path.open("a", encoding="utf-8") as log:
        log.write("one\n" + release + "\npartial")
    assert follower.lines_until_release() == ["one", release]
    follower.mark()
    with pytest.raises(BenchError, match="no 'stop processing' line"):
        follower.lines_until_release(timeout_s=0.05)
