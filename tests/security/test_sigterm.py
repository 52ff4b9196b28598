"""brokerd's own life: a stop signal ends every task it started, whatever it serves.

systemd sends SIGTERM, waits ``TimeoutStopSec`` and then kills; a brokerd that outlives the
signal is killed in the middle of its audit writes. So every socket and the metrics address
must close at once on SIGTERM (the uvicorn servers drain for at most ``GRACEFUL_SHUTDOWN_S``,
and with no open connection they have nothing to drain).
"""

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from brokerd.serve import GRACEFUL_SHUTDOWN_S
from tests.security.brokerd_run import brokerd

# A stop with nothing in flight takes well under a second; this bound leaves a busy machine
# room while staying below the graceful drain it must not need, and far below a hang.
STOP_BOUND_S = 2 * GRACEFUL_SHUTDOWN_S
# How long the test waits for the process at all before it calls it hung (and kills it).
HANG_S = 60.0


def every_service(folder: Path) -> dict[str, str]:
    """brokerd with its three sockets and its metrics address (and loopd's relay) configured."""
    token = folder / "bot-token"
    token.write_text("bot-token\n")
    return {
        "BROKERD_INFERENCE_URL": f"unix:{folder}/no-llama.sock",
        "BROKERD_MATTERMOST_URL": f"unix:{folder}/no-mattermost.sock",
        "BROKERD_MATTERMOST_TOKEN_FILE": str(token),
        "BROKERD_BROKER__AUDIT_DB": str(folder / "audit.db"),
        "BROKERD_METRICS_ADDR": f"unix:{folder}/metrics/metrics.sock",
        "BROKERD_METRICS_RELAY": str(folder / "loopd-metrics.sock"),
    }


@pytest.mark.attack(
    attack="brokerd outlives SIGTERM while it serves metrics (systemd then kills it mid-write)",
    input="SIGTERM to `brokerd serve` with infer.sock, chat.sock, broker.sock and metrics_addr",
    expected=f"the process exits 0 within {STOP_BOUND_S} s, its sockets removed",
)
def test_sigterm_stops_every_socket_and_the_metrics(
    short_dir: Path, observed: Callable[[str], None]
) -> None:
    (short_dir / "metrics").mkdir()
    with brokerd(short_dir, every_service(short_dir)) as running:
        metrics = httpx.HTTPTransport(uds=str(short_dir / "metrics" / "metrics.sock"))
        with httpx.Client(transport=metrics, base_url="http://metrics", timeout=10) as client:
            assert client.get("/metrics").status_code == 200  # the metrics task is serving
        started = time.monotonic()
        running.process.send_signal(signal.SIGTERM)
        try:
            code = running.process.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            code = None  # the context manager's exit kills it
        took = time.monotonic() - started
        left = sorted(p.name for p in (short_dir / "run").glob("*.sock"))
        left += sorted(p.name for p in (short_dir / "metrics").glob("*.sock"))
    observed(f"exit {code} after {took:.1f} s; sockets left: {', '.join(left) or 'none'}")
    assert code == 0, f"brokerd still running {HANG_S:g} s after SIGTERM"
    assert took < STOP_BOUND_S, f"brokerd took {took:.1f} s to stop"
    assert left == []
