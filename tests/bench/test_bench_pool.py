"""The pool and hybrid benchmarks' pure parts: causes, summaries and their report sections."""

from __future__ import annotations

from bench import hybrid, pool
from bench.report import render
from bench.serverlog import ServerSteps
from bench.switching import TurnSample
from tests.bench.results_support import results

PINNED = "pinned, own slots"


def request(held: int, cache_n: int, **changes: object) -> pool.PoolRequest:
    fields: dict[str, object] = {
        "layout": "pool-qwen35moe-unified",
        "scenario": PINNED,
        "sessions": 2,
        "session": "S0",
        "round": 2,
        "slot_sent": 0,
        "slot_used": 0,
        "held": held,
        "cache_n": cache_n,
        "prompt_n": 20,
        "cause": "kept in its slot",
        **changes,
    }
    return pool.PoolRequest(**fields)  # type: ignore[arg-type]


def test_kept_back_to_the_checkpoint_and_lost_are_told_apart() -> None:
    assert request(100, 99).kept
    checkpoint = request(100, 96, checkpoint=96)
    assert (checkpoint.kept, checkpoint.to_checkpoint, checkpoint.lost) == (False, True, False)
    far = request(100, 80, checkpoint=80)
    assert far.lost
    assert request(100, 0).lost
    assert not request(0, 0).lost  # a first request loses nothing


def test_the_summary_counts_per_layout_scenario_and_session_count() -> None:
    cleared = "pinned slot empty: cleared when a task launched on another slot; more"
    rows = [
        request(0, 0, round=1, cause="first request"),
        request(100, 0, cause=cleared),
        request(120, 0, cause=cleared),
        request(100, 96, checkpoint=96, scenario="unpinned", slot_sent=-1),
        request(0, 0, other_client=True, scenario="unpinned", round=2),
    ]
    pinned, unpinned = pool.summarize(rows)
    assert (pinned.later, pinned.kept, pinned.lost, pinned.reuse) == (2, 0, 2, 0.0)
    assert pinned.causes == {"pinned slot empty": 2}
    assert (unpinned.later, unpinned.to_checkpoint, unpinned.causes) == (1, 1, {})


def test_a_pinned_request_to_a_slot_a_launch_cleared_says_so() -> None:
    steps = ServerSteps(task=9, slot=0, selected_by="id", pinned_slot_empty=True)
    assert pool.explain(steps, 100, 0, hybrid=False).startswith("pinned slot empty")
    purged = ServerSteps(task=9, slot=0, selected_by="LRU", cache_updated=True, purged={1: 900})
    text = pool.explain(purged, 100, 0, hybrid=False)
    assert text == (
        "slot held another prompt; the host cache had nothing better; "
        "slots [1] purged for room (not saved)"
    )


def test_the_hybrid_benchmark_names_the_tokenizer_the_reply_and_the_checkpoint() -> None:
    steps = ServerSteps(task=4, slot=0, selected_by="id", checkpoint=28)
    tail = hybrid.explain(
        steps,
        turn=2,
        hybrid=True,
        previous_prompt=32,
        held=32,
        divergence=31,
        cache_n=28,
        scripted=True,
    )
    assert tail == (
        "the previous prompt's last token tokenizes anew once text follows; "
        "recurrent state restored from the checkpoint at 28"
    )
    reply = hybrid.explain(
        ServerSteps(task=5, slot=0),
        turn=2,
        hybrid=False,
        previous_prompt=35,
        held=58,
        divergence=35,
        cache_n=35,
        scripted=False,
    )
    assert reply == "the reply re-tokenizes differently from the tokens generated"
    kept = hybrid.explain(
        steps,
        turn=3,
        hybrid=True,
        previous_prompt=61,
        held=61,
        divergence=61,
        cache_n=61,
        scripted=True,
    )
    assert kept == "kept"


def test_the_report_has_the_pool_and_hybrid_sections() -> None:
    layout = pool.Layout("pool-qwen35moe-unified", "hybrid", "--kv-unified", True)
    rows = [
        request(0, 0, round=1, sessions=4, cause="first request"),
        request(100, 0, sessions=4, cause="pinned slot empty: cleared"),
    ]
    hybrid_rows = [hybrid.HybridRow("hybrid", "scripted", 2, 56, 32, 31, 28, 28, "checkpoint")]
    text = render(results(pool_layouts=[layout], pool=rows, hybrid=hybrid_rows))
    assert "## Pinning on a unified pool" in text
    assert "hybrid, --kv-unified **(production's default)**" in text
    assert "| 1x pinned slot empty |" in text
    assert "Four sessions on `pool-qwen35moe-unified`" in text
    assert "## Where a hybrid model's cache goes" in text
    assert "| hybrid | scripted | 2 | 56 | 32 | 31 | 28 | 28 | checkpoint |" in text


def test_the_hybrid_switching_turns_show_loopds_cause_and_the_servers() -> None:
    turn = TurnSample(
        "qwen35moe",
        2,
        "s1",
        2,
        True,
        96,
        30,
        4,
        0.1,
        0.2,
        0.01,
        loopd_cause="unexplained",
        server_says="restored from the host prompt cache; resumed at the checkpoint at 96",
    )
    text = render(results(switching_turns=[turn]))
    assert "Every turn on the hybrid preset" in text
    assert (
        "| 2 | s1 | 2 | 96 | 4 | unexplained | restored from the host prompt cache; "
        "resumed at the checkpoint at 96 |" in text
    )


def test_slot_owners_follow_launches_and_clearing() -> None:
    owners = pool.SlotOwners()
    assert owners.held(ServerSteps(task=1, slot=0), "S0") == "unknown"
    assert owners.held(ServerSteps(task=2, slot=0), "S0") == "own"
    assert owners.held(ServerSteps(task=3, slot=0), "S1") == "other"
    # S2 launches on slot 1 and the launch clears slot 0, which S1 held.
    assert owners.held(ServerSteps(task=4, slot=1, cleared={0: 90}), "S2") == "unknown"
    assert owners.held(ServerSteps(task=5, slot=0), "S0") == "empty"
    assert owners.held(ServerSteps(task=6), "S0") == "unknown"


def test_a_pinned_slot_cleared_without_the_scan_saying_so_is_still_named() -> None:
    """With --slot-prompt-similarity 0 the server skips the scan that logs an empty slot."""
    steps = ServerSteps(task=9, slot=0, selected_by="id")
    assert pool.explain(steps, 100, 0, False, "empty").startswith("pinned slot empty")
    loaded = ServerSteps(task=9, slot=0, selected_by="LRU", cache_updated=True, cache_loaded=True)
    assert pool.explain(loaded, 100, 0, False, "empty").startswith(
        "restored a prompt from the host cache that shares only part"
    )


def test_a_slot_another_session_held_with_the_shared_part_kept_says_so() -> None:
    steps = ServerSteps(task=7, slot=0, selected_by="LCP similarity")
    cause = pool.explain(steps, 235, 186, hybrid=False, slot_held="other")
    assert cause.startswith("slot held another session's prompt sharing the system text")
    restored = ServerSteps(task=8, slot=0, selected_by="LRU", cache_updated=True, cache_loaded=True)
    assert pool.explain(restored, 235, 235, False, "other") == "restored from the host prompt cache"
