"""The session log's storage failing under a turn: full, locked, truncated."""

from __future__ import annotations

import sqlite3
from dataclasses import replace

import anyio
import pytest

from loopcommon.errors import DaemonError
from loopd_dev.fakes.llama import ScriptedReply
from tests.reliability.conftest import Observe
from tests.reliability.harness import (
    FAST,
    SESSION,
    chat,
    check_invariants,
    runtime,
    start_chat,
    terminal_text,
)
from tests.reliability.harness import box as make_box
from tests.reliability.write_table import scenario

pytestmark = pytest.mark.anyio


@scenario(
    "Storage",
    "disk full during a turn",
    fault="SQLite's page limit is reached when the answer is stored (SQLITE_FULL)",
    expected="one clear 'disk full' message, nothing half-written; with room again the "
    "pending turn resumes and answers",
)
async def test_disk_full_during_a_turn(observe: Observe) -> None:
    async with make_box() as env:
        # Every line different: the repetition watch would close an answer that loops.
        large = " ".join(f"line {n} of a large answer." for n in range(1500))
        env.fake.push(ScriptedReply(content=large))
        async with runtime(env, max_tokens=4096) as rt:
            target = rt.ensure_session(SESSION)
            rt.log.append_user(SESSION, "write a lot", external_key="k-1")
            conn = rt.log._conn  # the test's stand-in for a small file system
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {pages}")
            turn = replace(rt.turn(target, lambda status: None), limits=FAST)
            try:
                shown = terminal_text(await turn.run())
            except DaemonError as exc:  # what `loopd chat` prints for it
                shown = f"loopd: {exc}"
        assert "full" in shown.lower()
        resumed = await chat(env)
        assert resumed.process.returncode == 0, resumed.err()
        checked = check_invariants(
            env.state_dir, env.audit_db, ["write a lot"], shown + "\n" + resumed.out()
        )
        assert "You said: write a lot" in resumed.out()
        observe(checked.summary())


@scenario(
    "Storage",
    "database locked briefly",
    fault="another process holds an exclusive lock on loopd.db for 1 s",
    expected="loopd waits for it (busy timeout) and answers",
)
async def test_database_locked_briefly(observe: Observe) -> None:
    async with make_box() as env:
        first = await chat(env, ["make the log"])
        assert first.process.returncode == 0, first.err()
        locker = sqlite3.connect(env.db_path, isolation_level=None)
        try:
            locker.execute("BEGIN EXCLUSIVE")
            proc = await start_chat(env, ["while locked"])
            await anyio.sleep(1.0)
            locker.execute("ROLLBACK")
        finally:
            locker.close()
        assert await proc.wait() == 0, proc.err()
        checked = check_invariants(
            env.state_dir,
            env.audit_db,
            ["make the log", "while locked"],
            proc.out(),
            shows="You said: while locked",
        )
        observe(checked.summary())


@scenario(
    "Storage",
    "database locked for good",
    fault="another process holds an exclusive lock on loopd.db past the busy timeout",
    expected="one clear 'locked' line, exit 2, no traceback; the log is intact afterwards",
)
async def test_database_locked_for_good(observe: Observe) -> None:
    async with make_box() as env:
        first = await chat(env, ["make the log"])
        assert first.process.returncode == 0, first.err()
        locker = sqlite3.connect(env.db_path, isolation_level=None)
        try:
            locker.execute("BEGIN EXCLUSIVE")
            proc = await chat(env, ["while locked"])
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        said = [line for line in proc.err().splitlines() if line.startswith("loopd:")]
        assert proc.process.returncode == 2
        assert len(said) == 1, proc.err()
        assert "lock" in said[0], proc.err()
        checked = check_invariants(
            env.state_dir, env.audit_db, ["make the log"], said[0], shows="loopd:"
        )
        observe(checked.summary())


@scenario(
    "Storage",
    "truncated database file",
    fault="loopd.db cut to half its length (a bad copy, a crashed disk)",
    expected="loopd chat and loopd log verify each say the log is damaged, in one line, and "
    "change nothing",
)
async def test_truncated_database(observe: Observe) -> None:
    async with make_box() as env:
        first = await chat(env, ["one", "two", "three"])
        assert first.process.returncode == 0, first.err()
        data = env.db_path.read_bytes()
        env.db_path.write_bytes(data[: len(data) // 2])
        damaged = env.db_path.read_bytes()
        proc = await chat(env, ["four"])
        verify = await anyio.run_process([*_loopd(), "log", "verify"], env=env.env(), check=False)
        for code, err in ((proc.process.returncode, proc.err()), (verify.returncode, "")):
            assert code in (1, 2)
            assert "Traceback" not in err
        said = [line for line in proc.err().splitlines() if line.startswith("loopd:")]
        verify_said = verify.stderr.decode().strip()
        assert len(said) == 1, proc.err()
        assert str(env.db_path) in said[0]
        assert str(env.db_path) in verify_said
        assert "Traceback" not in verify_said
        assert env.db_path.read_bytes() == damaged, "a damaged log must be left as it is"
        observe(f"loopd chat: exit 2, {said[0][:80]}; log verify: exit {verify.returncode}")


def _loopd() -> list[str]:
    import sys

    return [sys.executable, "-m", "loopd"]
