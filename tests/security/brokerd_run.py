"""``brokerd serve`` as its own process, configured by environment, for the attacks that need
the real thing: its sockets, its limits, its log."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).parents[2]
STARTUP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RunningBrokerd:
    socket_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes]

    def socket(self, service: str) -> Path:
        return self.socket_dir / f"{service}.sock"

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def log_bytes(self) -> int:
        return self.log_path.stat().st_size

    def rss_bytes(self) -> int:
        """Resident memory of the brokerd process now (VmRSS)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS line")


@contextmanager
def brokerd(
    folder: Path,
    variables: Mapping[str, str],
    *,
    only: Sequence[str] = (),
    prefix: Sequence[str] = (),
) -> Iterator[RunningBrokerd]:
    """Run ``brokerd serve`` with only ``variables`` (and PATH) in its environment; its sockets
    are in ``folder/run``. ``prefix`` wraps the command (``prlimit --nofile=...``)."""
    socket_dir = folder / "run"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(REPO_ROOT),
        "BROKERD_SOCKET_DIR": str(socket_dir),
        **variables,
    }
    argv = [*prefix, sys.executable, "-m", "brokerd", "serve"]
    for service in only:
        argv += ["--only", service]
    log_path = folder / "brokerd.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=log, cwd=folder)
    running = RunningBrokerd(socket_dir, log_path, process)
    try:
        _wait_ready(running)
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(running: RunningBrokerd) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while '"msg": "ready: ' not in running.log():
        if running.process.poll() is not None:
            raise AssertionError(f"brokerd exited ({running.process.returncode}):\n{running.log()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"brokerd not ready in {STARTUP_TIMEOUT_S} s:\n{running.log()}")
        time.sleep(0.05)
