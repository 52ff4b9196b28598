"""brokerd.confine: a catalogue's declaration checked, and one real sandbox (the shared command
line itself: tests/loopcommon/test_sandbox.py)."""

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerd.config import BrokerdSettings, Secrets
from brokerd.confine import ConfinementError, confined_argv, detect_host_view
from brokerd.serve import build_endpoints
from brokerd.tools.settings import BrokerSettings
from loopcommon.errors import ConfigError
from loopcommon.sandbox import Bind, Confinement, HiddenPath, HostView, Mount

VIEW = HostView("/usr/bin/bwrap", "/usr/bin/prlimit", (Mount("--ro-bind-try", "/usr", "/usr"),))
ENV = {"PATH": "/usr/bin:/bin"}


def test_a_declared_path_inside_brokerds_own_folder_is_refused() -> None:
    binds = (Bind(Path("/run/brokerd/sub"), Path("/run/brokerd/sub")),)
    hidden = (HiddenPath(Path("/run/brokerd"), is_dir=True),)
    with pytest.raises(ConfinementError, match="brokerd's own"):
        confined_argv(VIEW, Confinement(binds=binds, hidden=hidden), ["ls"], ENV)


def test_a_real_sandbox_shows_the_system_and_nothing_of_the_host(tmp_path: Path) -> None:
    view = detect_host_view()
    (tmp_path / "seen.txt").write_text("seen\n")
    binds = (Bind(tmp_path, tmp_path),)
    script = f"cat {tmp_path}/seen.txt; ls /; touch {tmp_path}/new 2>&1 || true"
    argv = confined_argv(view, Confinement(binds=binds), ["sh", "-c", script], ENV)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={}, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("seen\n")
    top = set(result.stdout.splitlines()[1:])
    assert {"usr", "proc", "dev", "tmp"} <= top
    assert not {"root", "home", "work"} & top
    assert "Read-only file system" in result.stdout
    assert not (tmp_path / "new").exists()


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    detect_host_view.cache_clear()
    monkeypatch.setattr("brokerd.confine.shutil.which", lambda name, path=None: None)
    yield
    detect_host_view.cache_clear()


@pytest.mark.usefixtures("no_bwrap")
def test_without_bubblewrap_command_tools_stop_brokerd_at_startup(tmp_path: Path) -> None:
    settings = BrokerdSettings(
        socket_dir=tmp_path / "run", broker=BrokerSettings(audit_db=tmp_path / "audit.db")
    )
    with pytest.raises(ConfigError) as error:
        build_endpoints(settings, Secrets(inference_key=None, bot_token=None), ("broker",))
    assert str(error.value) == (
        "broker: command tools cannot run confined: bwrap is not installed "
        "(Debian package bubblewrap)"
    )
