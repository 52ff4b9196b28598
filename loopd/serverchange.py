"""When the server is not the one recorded: what loopd says, to threads and to the operator. Pure.

The shared llama-server gets upgraded or reconfigured under loopd (the inference contract records
such a change being caught by the self-test). ``loopd serve`` then stays up rather than exit and
be restarted by systemd every 30 s while people in threads hear nothing: it answers each thread
that asks with one line (once per thread per change), logs what differs, writes it to its status
file, and runs the self-test again every ``LOOPD_SELFTEST_EVERY_S`` until it passes
(``loopd.serve``). An unreachable server is not a change: at startup ``loopd serve`` still exits
with status 2, since nothing about the server is known and the usual cause, brokerd not running,
also cuts loopd off from Mattermost.

A change is named by the checks that failed and what they expected, so the same change keeps one
key across re-checks and restarts (the thread line is posted under it once), and a new
recording, or another difference, makes a new one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from loopd.selftest.checks import CheckResult


@dataclass(frozen=True)
class ServerChange:
    """The server differs from the recorded expectations: the failed checks, one line each."""

    key: str
    names: tuple[str, ...]
    lines: tuple[str, ...]

    @property
    def thread_line(self) -> str:
        """The one line a thread gets while the change lasts."""
        what = ", ".join(self.names)
        return (
            f"⚠️ The model server is not the one loopd was checked against ({what}), so I "
            "cannot answer for now. An operator must check it and record it again (`loopd "
            "selftest --record`); I answer here once it passes."
        )

    def log_line(self, url: str, every_s: float) -> str:
        """The operator's line: what differs, and what loopd does meanwhile."""
        return (
            f"the server at {url} differs from the recorded expectations: "
            f"{'; '.join(self.lines)}. Threads are told it changed and wait; the self-test runs "
            f"again every {every_s:g} s (check the server, then `loopd selftest --record`)"
        )


def server_change(results: Sequence[CheckResult]) -> ServerChange | None:
    """The change the failed checks show; None when every check passed."""
    failed = [r for r in results if not r.ok and not r.informational]
    if not failed:
        return None
    named = "\n".join(f"{r.name}\0{r.expected}" for r in failed)
    key = hashlib.sha256(named.encode("utf-8")).hexdigest()[:16]
    lines = tuple(
        f"{r.name}: expected {r.expected}, got {r.actual}" + (f" ({r.detail})" if r.detail else "")
        for r in failed
    )
    return ServerChange(key, tuple(r.name for r in failed), lines)


def status_record(
    change: ServerChange | None, *, url: str, model: str, since: str, every_s: float
) -> dict[str, Any]:
    """What the status file says: the server as loopd last found it."""
    record: dict[str, Any] = {
        "server": "ok" if change is None else "changed",
        "url": url,
        "model": model,
        "since": since,
        "selftest_every_s": every_s,
    }
    if change is not None:
        record["differs"] = list(change.lines)
    return record
