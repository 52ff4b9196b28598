"""The durable sessions' figures of a soak run: which requests are returns after a server kill,
what they re-read against their ideal, and the save folder against its cap."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from soak.chaos import Injected
from soak.durability import Folder, Request, evicted_files, returns_after_kills, reuse
from soak.plan import FaultKind
from soak.report import Figures, comparison_line, durable_rows, render, verdict
from tests.soak.test_soak_report import passing

KILL = 1000.0


def request(
    session: str,
    at: float,
    cache_n: int | None,
    prompt_n: int | None,
    *,
    expected: int | None = None,
    cause: str = "",
    outcome: str = "complete",
    kind: str = "turn",
) -> Request:
    record: dict[str, Any] = {
        "session": session,
        "created_at": datetime.fromtimestamp(at, UTC).isoformat(),
        "kind": kind,
        "outcome": outcome,
        "cache_n": cache_n,
        "prompt_n": prompt_n,
        "cache_loss_cause": cause or None,
        "ttfb_ms": 120.0,
    }
    if expected is not None:
        record["expected_reuse"] = expected
    return Request.from_record(record)


def test_a_record_reads_as_loopd_perf_writes_it() -> None:
    r = request("mm:a", KILL, 480, 20, expected=479, cause="restored from disk")
    assert r.at == KILL
    assert (r.prompt, r.ideal, r.restored, r.counted) == (500, 21, True, True)
    assert not request("mm:a", KILL, 0, 9, kind="selftest").counted
    assert not request("mm:a", KILL, None, None).counted


def test_a_new_epoch_had_to_read_its_whole_new_prompt() -> None:
    # After a compaction the prompt (summary, carried messages) was never in any slot: what the
    # server did not keep of it was not loopd's to spare, restore or no restore.
    r = request("mm:a", KILL, 27, 846, expected=1600, cause="new epoch")
    assert (r.prompt, r.ideal) == (873, 846)
    plain = request("mm:a", KILL, 27, 846, expected=600, cause="another session used the slot")
    assert plain.ideal == 873 - 600


def test_the_first_completed_request_after_a_kill_is_the_return() -> None:
    requests = [
        request("mm:a", KILL - 50, 0, 400),  # before the kill: a session to come back to
        request("mm:a", KILL + 1, 300, 5, outcome="broken"),  # in flight at the kill
        request("mm:a", KILL + 9, 0, 420, expected=399, cause="server restarted"),  # the return
        request("mm:a", KILL + 30, 419, 10, expected=419),  # a later turn, not a return
        request("mm:b", KILL + 5, 0, 200),  # a session that began after the kill
        request("mm:c", KILL - 10, 0, 300),
        request("mm:c", KILL + 12, 299, 20, expected=299, cause="restored from disk"),
    ]
    found = returns_after_kills(requests, [KILL])
    assert (found.kills, found.returns, found.worth_restoring, found.restored) == (1, 2, 2, 1)
    assert found.reread == 420 + 20
    assert found.ideal == (420 - 399) + (319 - 299)
    assert found.prompt == 420 + 319
    assert found.over_ideal == 440 / 41
    assert dict(found.causes) == {"server restarted": 1, "restored from disk": 1}


def test_each_kill_has_its_own_returns() -> None:
    second = KILL + 100
    requests = [
        request("mm:a", KILL - 5, 0, 100),
        request("mm:a", KILL + 5, 99, 10, expected=99),
        request("mm:a", second + 5, 0, 120, expected=109),
        request("mm:b", KILL - 5, 0, 100),
        request("mm:b", second + 7, 0, 130, expected=109),  # back only after the second kill
    ]
    found = returns_after_kills(requests, [second, KILL])
    assert (found.kills, found.returns) == (2, 3)
    assert found.worth_restoring == 2  # the first return found its session still there
    assert returns_after_kills(requests, []).returns == 0


def test_a_small_loss_is_not_worth_restoring_by_loopds_rule() -> None:
    # Another session's system text kept (30 of 55 tokens): a restore would win 25 tokens.
    assert not request("mm:a", KILL, 30, 47, expected=55).worth_restoring
    assert request("mm:a", KILL, 30, 900, expected=880).worth_restoring
    assert request("mm:a", KILL, 700, 900, expected=1300).worth_restoring  # 600 tokens lost
    assert not request("mm:a", KILL, 0, 40).worth_restoring  # nothing held before


def test_reuse_counts_every_request_and_the_durable_causes() -> None:
    requests = [
        request("mm:a", 1.0, 0, 100),
        request("mm:a", 2.0, 90, 10, cause="restored from disk"),
        request("mm:a", 3.0, 90, 10, cause="restored from disk, resumed at a checkpoint"),
        request("mm:b", 4.0, 0, 100, cause="restore refused"),
        request("mm:b", 5.0, 0, 50, kind="selftest"),
    ]
    found = reuse(requests, ["restored from disk", "restore refused", "server restarted"])
    assert (found.requests, found.cache_n, found.prompt_n) == (4, 180, 220)
    assert found.hit_rate == 180 / 400
    assert dict(found.by_cause) == {
        "restored from disk": 2,
        "restore refused": 1,
        "server restarted": 0,
    }


def test_the_folder_counts_its_samples_over_the_cap_and_brokerd_evictions() -> None:
    folder = Folder(100, ((1.0, 40), (2.0, 120), (3.0, 90)), end_bytes=90, end_files=3)
    assert (folder.peak_bytes, folder.over_cap) == (120, 1)
    log = (
        '{"msg": "slot save folder over its cap: removed 2 files (10 bytes)"}\n'
        '{"msg": "ready"}\n'
        '{"msg": "slot save folder over its cap: removed 1 files (5 bytes)"}\n'
    )
    assert evicted_files(log) == 3


def figures(durable: bool, **changes: Any) -> Figures:
    f = passing()
    f.faults = [Injected(kind, 1.0, fired=True, struck=1.0) for kind in FaultKind]
    f.durable = durable
    f.durable_said = f"durable sessions: {'on' if durable else 'off'} (LOOPD_DURABLE x)"
    kill = [request("mm:a", 0.5, 0, 400), request("mm:a", 9.0, 0, 420, expected=399)]
    if durable:
        kill[1] = request("mm:a", 9.0, 399, 21, expected=399, cause="restored from disk")
    f.returns = returns_after_kills(kill, [1.0])
    f.folder = Folder(1000, ((1.0, 600),), end_bytes=600, end_files=2)
    for name, value in changes.items():
        setattr(f, name, value)
    return f


def test_durable_runs_fail_when_nothing_came_back_or_the_cap_is_broken() -> None:
    assert figures(True).failures() == []
    assert figures(False).failures() == []
    reread = returns_after_kills(
        [request("mm:a", 0.5, 0, 400), request("mm:a", 9.0, 0, 420, expected=399)], [1.0]
    )
    assert any("none of the 1 returns" in x for x in figures(True, returns=reread).failures())
    small = returns_after_kills(
        [request("mm:a", 0.5, 0, 55), request("mm:a", 9.0, 30, 47, expected=55)], [1.0]
    )
    assert figures(True, returns=small).failures() == []  # nothing worth a restore came back
    assert figures(False, returns=reread).failures() == []  # without durable sessions: expected
    over = Folder(1000, ((1.0, 600),), end_bytes=1001, end_files=2)
    assert any("over its cap" in x for x in figures(True, folder=over).failures())
    said_off = figures(True, durable_said="durable sessions: off (LOOPD_DURABLE on; ...)")
    assert any("loopd said" in x for x in said_off.failures())
    assert figures(True, durable_said="").failures()


def test_both_runs_are_set_side_by_side_and_judged_together() -> None:
    on, off = figures(True), figures(False)
    rows = durable_rows([on, off])
    assert rows[0] == "| Figure | durable sessions on | durable sessions off |"
    reread = next(r for r in rows if r.startswith("| **prompt tokens re-read"))
    assert reread.endswith("| **21** (5%) | **420** (100%) |")
    line = comparison_line(on, off)
    assert line.startswith("soak PASS (durable sessions on and off, seed 7)")
    assert "re-read 21 of 420 prompt tokens with durable sessions (ideal 21, 1 of 1" in line
    assert line.endswith("420 of 420 without (ideal 21)")
    report = render(on, "soak.png", off)
    assert "| durable sessions on | durable sessions off |" in report
    assert "**Result: PASS**" in report
    off.lost.append("p1 (t00): never stored")
    assert verdict(on, off) == [
        "the run with durable sessions off: message lost: p1 (t00): never stored"
    ]
    assert comparison_line(on, off).startswith("soak FAIL")
    assert "**Result: FAIL**" in render(on, "soak.png", off)
