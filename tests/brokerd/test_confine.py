"""brokerd.confine: the bubblewrap command line (pure) and one real sandbox."""

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerd.config import BrokerdSettings, Secrets
from brokerd.confine import (
    Bind,
    Confinement,
    ConfinementError,
    HiddenPath,
    HostView,
    Mount,
    ResourceLimits,
    detect_host_view,
    masks,
    sandbox_argv,
)
from brokerd.serve import build_endpoints
from brokerd.tools.settings import BrokerSettings
from loopcommon.errors import ConfigError

VIEW = HostView(
    bwrap="/usr/bin/bwrap",
    prlimit="/usr/bin/prlimit",
    system=(Mount("--ro-bind-try", "/usr", "/usr"), Mount("--symlink", "usr/bin", "/bin")),
    network_files=(Mount("--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf"),),
)
ENV = {"PATH": "/usr/bin:/bin"}


def after(argv: list[str], option: str) -> list[list[str]]:
    """The two arguments after each occurrence of ``option``."""
    return [argv[i + 1 : i + 3] for i, arg in enumerate(argv) if arg == option]


def test_the_command_runs_last_under_prlimit_with_every_namespace_unshared() -> None:
    argv = sandbox_argv(VIEW, Confinement(), ["git", "log"], ENV)
    assert argv[:4] == ["/usr/bin/bwrap", "--unshare-all", "--unshare-user", "--disable-userns"]
    assert "--share-net" not in argv
    assert "--die-with-parent" in argv
    assert "--clearenv" in argv
    assert after(argv, "--setenv") == [["PATH", "/usr/bin:/bin"]]
    tail = argv[argv.index("--") + 1 :]
    assert tail == ["/usr/bin/prlimit", *ResourceLimits().prlimit_options(), "--", "git", "log"]


def test_the_network_and_its_files_come_only_when_declared() -> None:
    argv = sandbox_argv(VIEW, Confinement(network=True), ["curl"], ENV)
    assert "--share-net" in argv
    assert ["/etc/resolv.conf", "/etc/resolv.conf"] in after(argv, "--ro-bind-try")
    closed = sandbox_argv(VIEW, Confinement(), ["curl"], ENV)
    assert ["/etc/resolv.conf", "/etc/resolv.conf"] not in after(closed, "--ro-bind-try")


def test_declared_paths_are_bound_parents_first_and_read_only_unless_writable() -> None:
    binds = (
        Bind(Path("/srv/a/b"), Path("/srv/a/b")),
        Bind(Path("/real/a"), Path("/srv/a"), writable=True),
    )
    argv = sandbox_argv(VIEW, Confinement(binds=binds), ["ls"], ENV)
    order = [(argv[i], argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if "bind" in a]
    assert order[-2:] == [("--bind", "/real/a", "/srv/a"), ("--ro-bind", "/srv/a/b", "/srv/a/b")]


def test_hidden_paths_inside_a_shown_folder_are_masked_where_the_tool_sees_them() -> None:
    binds = (Bind(Path("/data/real"), Path("/srv/data")),)
    hidden = (
        HiddenPath(Path("/data/real/state"), is_dir=True),
        HiddenPath(Path("/data/real/token"), is_dir=False),
        HiddenPath(Path("/elsewhere/token"), is_dir=False),
    )
    confinement = Confinement(binds=binds, hidden=hidden)
    assert [m.path for m in masks(confinement, VIEW.system)] == [
        Path("/srv/data/state"),
        Path("/srv/data/token"),
    ]
    argv = sandbox_argv(VIEW, confinement, ["ls"], ENV)
    assert [argv[i + 1] for i, arg in enumerate(argv) if arg == "--tmpfs"] == [
        "/tmp",
        "/srv/data/state",
    ]
    assert ["/dev/null", "/srv/data/token"] in after(argv, "--ro-bind")
    assert "/elsewhere/token" not in argv


def test_a_declared_path_inside_brokerds_own_folder_is_refused() -> None:
    binds = (Bind(Path("/run/brokerd/sub"), Path("/run/brokerd/sub")),)
    hidden = (HiddenPath(Path("/run/brokerd"), is_dir=True),)
    with pytest.raises(ConfinementError, match="brokerd's own"):
        sandbox_argv(VIEW, Confinement(binds=binds, hidden=hidden), ["ls"], ENV)


def test_a_real_sandbox_shows_the_system_and_nothing_of_the_host(tmp_path: Path) -> None:
    view = detect_host_view()
    (tmp_path / "seen.txt").write_text("seen\n")
    binds = (Bind(tmp_path, tmp_path),)
    script = f"cat {tmp_path}/seen.txt; ls /; touch {tmp_path}/new 2>&1 || true"
    argv = sandbox_argv(view, Confinement(binds=binds), ["sh", "-c", script], ENV)
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
