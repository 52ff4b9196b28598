"""The audit log cannot fill the host's disk, and the operator can bound its age.

A ``brokerd serve --only broker`` takes find_tool queries and call_tool arguments of nearly a
megabyte each (the broker's body cap) from one session; the audit database must grow by a
bounded amount, while every request is answered as before. ``brokerd audit prune`` deletes the
rows older than the retention and nothing else.
"""

import functools
import hashlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from brokerd.tools.audit import AuditLog
from brokerd.tools.calls import CallRequest
from tests.security.broker_api import BrokerClient
from tests.security.brokerd_run import REPO_ROOT, brokerd

REQUESTS = 20
BIG = 900_000  # characters: under the broker's 1 MiB body cap
GROWTH_BOUND = 4 * 1024 * 1024


def audit_bytes(path: Path) -> int:
    return sum(
        os.path.getsize(f"{path}{suffix}")
        for suffix in ("", "-wal")
        if os.path.exists(f"{path}{suffix}")
    )


@pytest.mark.attack(
    attack="A session fills the host's disk through the audit log",
    input=f"{REQUESTS} find_tool queries and {REQUESTS} call_tool arguments of {BIG // 1000} KB "
    "each, from one session",
    expected=f"every request answered as usual; the audit database grows under "
    f"{GROWTH_BOUND >> 20} MiB (bounded excerpts with a sha256, a per-minute budget per session)",
)
def test_big_requests_do_not_grow_the_audit_log_without_bound(
    short_dir: Path, observed: Callable[[str], None]
) -> None:
    audit_db = short_dir / "audit.db"
    with brokerd(short_dir, {"BROKERD_BROKER__AUDIT_DB": str(audit_db)}, only=["broker"]) as run:
        client = BrokerClient(run.socket("broker"), session="filler")
        try:
            before = audit_bytes(audit_db)
            statuses = set()
            for number in range(REQUESTS):
                query = f"clock {number} " + "x" * BIG
                assert client.find(query) == ["clock_now"]
                answer = client.call("clock_now", {"timezone": "y" * BIG})
                statuses.add(answer["status"])
            grown = audit_bytes(audit_db) - before
        finally:
            client.close()
    observed(f"audit database grew by {grown / 2**20:.1f} MiB; call statuses {sorted(statuses)}")
    assert grown < GROWTH_BOUND
    assert statuses == {"invalid"}
    with sqlite3.connect(f"file:{audit_db}?mode=ro", uri=True) as db:
        rows = db.execute(
            "SELECT query_sha256, query_bytes, length(CAST(query AS BLOB)) FROM find_tool_calls "
            "WHERE session = 'filler' ORDER BY id"
        ).fetchall()
    first = "clock 0 " + "x" * BIG
    assert rows[0][0] == hashlib.sha256(first.encode()).hexdigest()
    assert rows[0][1] == len(first)
    assert all(stored <= 4096 for *_, stored in rows)


@pytest.mark.attack(
    attack="The operator bounds the audit log's age",
    input="rows 40 and 1 days old; `brokerd audit prune` with `audit_retention_days = 30`",
    expected="one line saying how many rows were pruned; the old rows are gone, the cutoff is "
    "recorded, the kept rows still cannot be deleted",
)
def test_audit_prune_deletes_only_rows_older_than_the_retention(
    tmp_path: Path, observed: Callable[[str], None]
) -> None:
    audit_db = tmp_path / "audit.db"
    for days, call_id in ((40, "old"), (1, "new")):
        at = datetime.now(UTC) - timedelta(days=days)
        audit = AuditLog.open(audit_db, clock=functools.partial(_fixed, at))
        audit.record_find("s", f"query {call_id}", ["clock_now"], "found")
        audit.record_start(CallRequest("s", call_id, "clock_now", "{}"))
        audit.record_end("s", call_id, "ok", "done")
        audit.close()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(REPO_ROOT),
        "BROKERD_BROKER__AUDIT_DB": str(audit_db),
        "BROKERD_BROKER__AUDIT_RETENTION_DAYS": "30",
    }
    done = subprocess.run(
        [sys.executable, "-m", "brokerd", "audit", "prune"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = (done.stdout + done.stderr).strip()
    observed(f"exit {done.returncode}: {output.replace(str(tmp_path), '<tmp>')}")
    assert done.returncode == 0, output
    assert output.splitlines() == [
        f"brokerd: pruned 3 audit rows older than 30 days from {audit_db}"
    ]
    with sqlite3.connect(audit_db) as db:
        assert db.execute("SELECT call_id FROM calls").fetchall() == [("new",)]
        assert db.execute("SELECT query FROM find_tool_calls").fetchall() == [("query new",)]
        assert db.execute("SELECT rows FROM audit_prunes").fetchall() == [(3,)]
        for statement in ("DELETE FROM find_tool_calls", "DELETE FROM audit_prunes"):
            with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                db.execute(statement)


def _fixed(at: datetime) -> datetime:
    return at
