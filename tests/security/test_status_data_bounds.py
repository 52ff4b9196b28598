"""The box's status data cannot take brokerd's memory or hold its event loop: brokerd renders the
status page from data whose types bound it (points, sessions, slots, string lengths) and reads at
most ``STATUS_MAX_BYTES`` of it.

The box's side is a hostile server on loopd's metrics socket, in this process; brokerd's relay
runs in a child process (``tests.watch``), asked for the page twice at once (the page's refresh
and a second browser), so its peak memory and its event loop's longest stall are the render's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from loopcommon.statuspage import MAX_SESSIONS, PLOT_POINTS, STATUS_MAX_BYTES
from tests.security.hostile_http import MIB, head, hostile_server
from tests.watch import run_watched

MAX_GROWTH = 32 * MIB
SCENARIO = "tests.security.bound_scenarios:status_page"


def status(sessions: int, points: int) -> bytes:
    """Status data of ``sessions`` sessions with ``points`` points each."""
    session = {
        "name": "mm:x",
        "slot": 0,
        "requests": points,
        "last_turn_at": None,
        "hit_rate": None,
        "prompt_n": list(range(1_000_000, 1_000_000 + points)),
        "phase": None,
    }
    data = {
        "generated_at": "2026-05-01T12:00:00Z",
        "model": "m",
        "slots": [],
        "live": [],
        "sessions": [session] * sessions,
    }
    return json.dumps(data, separators=(",", ":")).encode()


SHAPES = {
    "points": status(1, 950_000),  # about 7.6 MB: one session's plot
    "sessions": status(14_000, PLOT_POINTS),  # about 8.1 MB: sessions of a full plot each
    "under the byte cap": status(1, 120_000),  # about 1 MB: past the points' bound only
}


def loopd_socket(body: bytes) -> Callable[[str], tuple[bytes, Iterable[bytes | float]]]:
    def script(request: str) -> tuple[bytes, Iterable[bytes | float]]:
        pieces = [body[i : i + 65536] for i in range(0, len(body), 65536)]
        return head("200 OK", "application/json"), pieces

    return script


@pytest.mark.attack(
    attack="The box's status data amplifies in brokerd as it renders the status page",
    input=f"loopd's /status.json of {len(SHAPES['points']) / 1e6:.1f} MB (one session of "
    f"950,000 points), of {len(SHAPES['sessions']) / 1e6:.1f} MB (14,000 sessions), and of "
    f"{len(SHAPES['under the byte cap']) / 1e6:.1f} MB (120,000 points); the page asked for "
    "twice at once",
    expected=f"refused with one line: over {STATUS_MAX_BYTES // MIB} MiB, or the bound passed "
    f"(at most {PLOT_POINTS} points, {MAX_SESSIONS} sessions); brokerd's memory grows under "
    f"{MAX_GROWTH // MIB} MiB",
)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_status_data_is_bounded_before_it_is_rendered(
    short_dir: Path, observed: Callable[[str], None], shape: str
) -> None:
    sock = short_dir / "metrics.sock"
    with hostile_server(sock, loopd_socket(SHAPES[shape])):
        watched = run_watched(SCENARIO, str(sock))
    outcomes = watched.result["outcomes"]
    line = f"{shape}: {outcomes[0]}; {watched.line}"
    print(line)
    observed(line)
    assert len(outcomes) == 2
    for outcome in outcomes:
        assert f"over {STATUS_MAX_BYTES} bytes" in outcome or "at most 60 items" in outcome
    assert watched.growth < MAX_GROWTH
