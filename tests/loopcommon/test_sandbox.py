"""loopcommon.sandbox: the bubblewrap command line both daemons run their sandboxes with (pure;
the real sandboxes: tests/brokerd/test_confine.py, tests/tools, tests/security)."""

from pathlib import Path

import pytest

from loopcommon.sandbox import (
    Bind,
    Confinement,
    HiddenPath,
    HostView,
    Mount,
    ResourceLimits,
    masks,
    probe_failure,
    sandbox_argv,
)

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
    assert [argv[i + 1] for i, arg in enumerate(argv) if arg == "--cap-drop"] == ["ALL"]
    assert "--share-net" not in argv
    assert "--die-with-parent" in argv
    assert "--clearenv" in argv
    assert after(argv, "--setenv") == [["PATH", "/usr/bin:/bin"]]
    assert after(argv, "--size") == [[str(64 * 1024 * 1024), "--tmpfs"]]
    assert after(argv, "--chdir") == [["/", "--clearenv"]]
    tail = argv[argv.index("--") + 1 :]
    assert tail == ["/usr/bin/prlimit", *ResourceLimits().prlimit_options(), "--", "git", "log"]


def test_each_difference_of_loopds_commands_is_a_named_flag() -> None:
    workspace = Path("/srv/ws")
    confinement = Confinement(
        binds=(Bind(workspace, workspace, writable=True),),
        limits=None,
        tmp_bytes=None,
        workdir=workspace,
        drop_privileges=False,
    )
    argv = sandbox_argv(VIEW, confinement, ["sh", "-c", "true"], ENV)
    assert argv[:4] == ["/usr/bin/bwrap", "--unshare-all", "--die-with-parent", "--new-session"]
    assert not {"--unshare-user", "--disable-userns", "--cap-drop", "--size"} & set(argv)
    assert after(argv, "--bind") == [["/srv/ws", "/srv/ws"]]
    assert after(argv, "--chdir") == [["/srv/ws", "--clearenv"]]
    assert argv[argv.index("--") :] == ["--", "sh", "-c", "true"]


def test_limits_inside_need_prlimit() -> None:
    without = HostView("/usr/bin/bwrap", None, VIEW.system)
    with pytest.raises(ValueError, match="needs prlimit"):
        sandbox_argv(without, Confinement(), ["true"], ENV)
    assert sandbox_argv(without, Confinement(limits=None), ["true"], ENV)[-2:] == ["--", "true"]


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


def test_a_failed_probe_is_one_line() -> None:
    assert probe_failure(0, b"") is None
    assert probe_failure(1, b"bwrap: No permissions\nmore\n") == (
        "bwrap cannot create a sandbox here: bwrap: No permissions"
    )
    assert probe_failure(2, b"") == "bwrap cannot create a sandbox here: exit status 2"
