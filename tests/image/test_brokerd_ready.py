"""brokerd tells systemd it is ready (``Type=notify``) only once its sockets take connections.

deploy/loopd.container starts after brokerd.service; with ``Type=notify`` "after" means after
brokerd sent ``READY=1``. These tests stand in for systemd's end of ``$NOTIFY_SOCKET``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerd.sdnotify import notify

NOTIFY_TIMEOUT_S = 30.0  # interpreter start and imports on a loaded two-core machine


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # Unix socket paths must stay short; pytest's tmp_path can be long.
    path = Path(tempfile.mkdtemp(prefix="notify", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _receiver(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(NOTIFY_TIMEOUT_S)
    return sock


def test_ready_is_sent_once_every_socket_accepts_connections(short_dir: Path) -> None:
    run_dir = short_dir / "run"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(short_dir),
        "NOTIFY_SOCKET": str(short_dir / "notify"),
        "BROKERD_SOCKET_DIR": str(run_dir),
        "BROKERD_INFERENCE_URL": f"unix:{short_dir}/no-llama.sock",
        "BROKERD_MATTERMOST_URL": f"unix:{short_dir}/no-mattermost.sock",
        "BROKERD_MATTERMOST_TOKEN_FILE": str(short_dir / "token"),
        "BROKERD_BROKER__AUDIT_DB": str(short_dir / "audit.db"),
    }
    (short_dir / "token").write_text("a-token\n")
    with _receiver(short_dir / "notify") as systemd:
        brokerd = subprocess.Popen(
            [sys.executable, "-m", "brokerd", "serve"],
            env=env,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            try:
                message = systemd.recv(4096)
            except TimeoutError:
                brokerd.kill()
                pytest.fail(f"no READY=1 in {NOTIFY_TIMEOUT_S} s: {brokerd.communicate()[1]!r}")
            assert message == b"READY=1"
            for service in ("infer", "chat", "broker"):
                with socket.socket(socket.AF_UNIX) as client:
                    client.connect(str(run_dir / f"{service}.sock"))  # refused would raise
            brokerd.send_signal(signal.SIGTERM)
            assert systemd.recv(4096) == b"STOPPING=1"
            assert brokerd.wait(timeout=NOTIFY_TIMEOUT_S) == 0
        finally:
            if brokerd.poll() is None:
                brokerd.kill()
            brokerd.communicate()


def test_notify_reaches_an_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"loopd-notify-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind("\0" + name)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify("READY=1")
        assert systemd.recv(64) == b"READY=1"


def test_without_systemd_notify_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not notify("READY=1")


def test_a_dead_notify_socket_is_a_warning_not_a_crash(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(short_dir / "nobody"))
    assert not notify("READY=1")
    assert "cannot tell systemd READY=1" in caplog.text
