"""Bad input at the command line: one line on stderr, a documented exit status, nothing written.

Each case runs ``loopd`` or ``brokerd`` as a user does, in a subprocess, and quotes the line it
prints. The statuses are those of the ``loopd.cli`` and ``brokerd.cli`` docstrings and the README.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOOPD = [sys.executable, "-m", "loopd"]
BROKERD = [sys.executable, "-m", "brokerd"]
KEEP = frozenset({"LOOPDEV_CACHE_DIR"})


def environment(home: Path, **settings: str) -> dict[str, str]:
    """This process's environment without LOOPD_*/BROKERD_* (a developer's config must not leak
    in), a HOME of the test's own, then ``settings``."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.upper().startswith(("LOOPD_", "BROKERD_")) or name in KEEP
    }
    env["HOME"] = str(home)
    env.update(settings)
    return env


def run(
    argv: list[str], env: dict[str, str], stdin: str = "", **kwargs: object
) -> subprocess.CompletedProcess[str]:
    result: subprocess.CompletedProcess[str] = subprocess.run(
        argv,
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
        **kwargs,  # type: ignore[call-overload]
    )
    return result


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single line a failure prints on stderr, besides the log's JSON lines (``serve
    --skip-selftest`` logs a warning first), and nothing on stdout."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if not line.startswith('{"ts": ')]
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""
    return lines[0]


def unprivileged(argv: list[str]) -> list[str]:
    """``argv`` run so that file permissions apply to it: as root, without the capabilities that
    let root read and write anything (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH)."""
    if os.geteuid() != 0:
        return argv
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.fail("as root, this test needs setpriv (util-linux) to drop CAP_DAC_OVERRIDE")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--", *argv]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def unreadable(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "locked"
    path.mkdir()
    path.chmod(0)
    yield path
    path.chmod(0o700)  # so that pytest can remove it


@pytest.mark.parametrize("command", [["sessions"], ["log", "verify"], ["perf"], ["chat"]])
def test_an_unreadable_state_dir(home: Path, unreadable: Path, command: list[str]) -> None:
    env = environment(home, LOOPD_STATE_DIR=str(unreadable))
    result = run(unprivileged([*LOOPD, *command]), env, stdin="hello\n")
    assert result.returncode == 2
    assert (
        one_line(result) == f"loopd: LOOPD_STATE_DIR: cannot read {unreadable}: permission denied"
    )


@pytest.mark.parametrize("command", [["sessions"], ["log", "show", "x"], ["chat"], ["serve"]])
def test_a_state_dir_that_is_a_file(home: Path, tmp_path: Path, command: list[str]) -> None:
    state = tmp_path / "state"
    state.write_text("not a folder")
    result = run([*LOOPD, *command], environment(home, LOOPD_STATE_DIR=str(state)))
    assert result.returncode == 2
    assert one_line(result) == f"loopd: LOOPD_STATE_DIR: {state} is a file, not a folder"
    assert state.read_text() == "not a folder"


def test_stdout_closed_early_ends_quietly(home: Path, tmp_path: Path) -> None:
    """``loopd sessions | head -1``: the reader is gone before loopd writes (the read end is
    closed before loopd starts), as when ``head`` has had its line."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [*LOOPD, "sessions"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=environment(home, LOOPD_STATE_DIR=str(tmp_path / "state")),
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (141, "")


def test_sessions_on_a_fresh_install_is_an_empty_list(home: Path, tmp_path: Path) -> None:
    state = tmp_path / "never-used"
    result = run([*LOOPD, "sessions"], environment(home, LOOPD_STATE_DIR=str(state)))
    assert result.returncode == 0
    assert result.stdout.split() == ["SESSION", "SLOT", "EPOCH", "ENTRIES", "STATE"]
    # A mistyped LOOPD_STATE_DIR looks like a fresh install: the line names the folder.
    assert result.stderr == (
        f"loopd: no sessions: the state folder {state} does not exist (LOOPD_STATE_DIR)\n"
    )
    assert not state.exists(), "reading creates nothing"
    verify = run([*LOOPD, "log", "verify"], environment(home, LOOPD_STATE_DIR=str(state)))
    assert (verify.returncode, verify.stderr) == (0, "")
    assert verify.stdout == f"ok: {state / 'loopd.db'}: no session log yet, nothing to verify\n"


@pytest.mark.parametrize(
    ("command", "status", "prefix"),
    [
        (["log", "verify"], 1, "loopd: log verify: "),
        (["log", "verify", "x"], 1, "loopd: log verify: "),
        (["sessions"], 2, "loopd: "),
        (["log", "export", "x"], 2, "loopd: "),
        (["perf"], 2, "loopd: perf: "),
    ],
)
def test_an_empty_log_file_is_refused_and_left_as_it_is(
    home: Path, tmp_path: Path, command: list[str], status: int, prefix: str
) -> None:
    db = tmp_path / "loopd.db"
    db.touch()
    result = run([*LOOPD, *command], environment(home, LOOPD_STATE_DIR=str(tmp_path)))
    assert result.returncode == status
    assert one_line(result) == (
        f"{prefix}session log {db}: an empty file, not a loopd session log; left as it is"
    )
    assert db.stat().st_size == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "loopd.db"]


@pytest.mark.parametrize(("argv", "program"), [(LOOPD, "loopd"), (BROKERD, "brokerd")])
def test_version(home: Path, argv: list[str], program: str) -> None:
    result = run([*argv, "--version"], environment(home))
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"{program} {version('loopd')}\n"


@pytest.mark.parametrize(
    "command", [["chat"], ["serve"], ["serve", "--skip-selftest"], ["selftest"]]
)
def test_a_bad_tools_file(home: Path, tmp_path: Path, command: list[str]) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text("[not json")
    env = environment(
        home,
        LOOPD_STATE_DIR=str(tmp_path / "state"),
        LOOPD_TOOLS_FILE=str(tools),
        LOOPD_INFER_URL=f"unix:{tmp_path / 'no-server.sock'}",
        LOOPD_MODEL="m",
        LOOPD_MM_URL=f"unix:{tmp_path / 'no-mattermost.sock'}",
    )
    result = run([*LOOPD, *command], env, stdin="hello\n")
    assert result.returncode == 2
    line = one_line(result)
    assert line.startswith("loopd")
    assert f"{tools}: not valid JSON: Expecting value: line 1 column 2 (char 1)" in line


def test_an_unknown_variable(home: Path) -> None:
    result = run([*LOOPD, "config"], environment(home, LOOPD_FIRST_BYTES_S="1"))
    assert result.returncode == 2
    assert one_line(result) == (
        "loopd: unknown setting LOOPD_FIRST_BYTES_S; did you mean LOOPD_FIRST_BYTE_S?"
    )


def test_contradictory_settings(home: Path) -> None:
    env = environment(home, LOOPD_THINK_CAP="5000", LOOPD_MAX_TOKENS="4096")
    result = run([*LOOPD, "config"], env)
    assert result.returncode == 2
    assert one_line(result) == (
        "loopd: contradictory settings (think_cap_leaves_answer_room): think_cap 5000 leaves no "
        "room for the answer below max_tokens 4096: think_cap + 1024 must be at most max_tokens "
        "(think_cap 0: no cap)"
    )


def test_brokerd_with_a_socket_dir_it_cannot_create(home: Path, tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    sockets = locked / "brokerd"
    env = environment(home, BROKERD_SOCKET_DIR=str(sockets))
    try:
        result = run(unprivileged([*BROKERD, "serve", "--only", "infer"]), env)
    finally:
        locked.chmod(0o700)
    assert result.returncode == 1
    assert one_line(result) == (
        f"brokerd: cannot use {sockets} as the socket folder: permission denied"
    )


def test_brokerd_with_a_socket_dir_that_is_a_file(home: Path, tmp_path: Path) -> None:
    sockets = tmp_path / "sockets"
    sockets.write_text("")
    result = run(
        [*BROKERD, "serve", "--only", "infer"], environment(home, BROKERD_SOCKET_DIR=str(sockets))
    )
    assert result.returncode == 1
    assert one_line(result) == f"brokerd: socket folder {sockets} is not a folder"


def test_brokerd_an_unknown_variable(home: Path) -> None:
    result = run([*BROKERD, "serve"], environment(home, BROKERD_SOCKETDIR="/tmp"))
    assert result.returncode == 2
    assert one_line(result) == (
        "brokerd: unknown setting BROKERD_SOCKETDIR; did you mean BROKERD_SOCKET_DIR?"
    )


def test_loopd_config_naming_a_folder(home: Path, tmp_path: Path) -> None:
    (tmp_path / "loopd.toml").write_text('model = "m"\n')
    result = run([*LOOPD, "config"], environment(home, LOOPD_CONFIG=str(tmp_path)))
    assert result.returncode == 2
    assert one_line(result) == (
        f"loopd: LOOPD_CONFIG: {tmp_path} is a folder, not a file: name the TOML file itself "
        "(it holds loopd.toml)"
    )


def test_an_empty_allow_list_would_hide_the_files_list(home: Path, tmp_path: Path) -> None:
    config = tmp_path / "loopd.toml"
    config.write_text('[mm]\nallowed_users = ["alice"]\n')
    env = environment(home, LOOPD_CONFIG=str(config), LOOPD_MM_ALLOWED_USERS="")
    result = run([*LOOPD, "config"], env)
    assert result.returncode == 2
    assert one_line(result) == (
        f"loopd: LOOPD_MM_ALLOWED_USERS is set but empty, and would replace allowed_users under "
        f"[mm] in {config} with nobody: give the list in one place (remove the variable, or set "
        "it)"
    )
    # The shipped files together: loopd.env's empty lists, loopd.toml without them.
    shipped = environment(home, LOOPD_CONFIG=str(ROOT / "deploy" / "loopd.toml"))
    shipped |= dict(
        line.split("=", 1)
        for line in (ROOT / "deploy" / "loopd.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert run([*LOOPD, "config"], shipped).returncode == 0


def test_run_from_stdin_with_bytes_that_are_not_text(home: Path, tmp_path: Path) -> None:
    env = environment(
        home,
        LOOPD_STATE_DIR=str(tmp_path / "state"),
        LOOPD_INFER_URL=f"unix:{tmp_path / 'no-server.sock'}",
        LOOPD_MODEL="m",
    )
    noise = b"hello " + bytes(range(0x80, 0x100)) + b" world"
    result = subprocess.run(
        [*LOOPD, "run", "-"], input=noise, capture_output=True, env=env, timeout=120, check=False
    )
    assert result.returncode == 2
    assert result.stderr.decode() == (
        "loopd: run: the message is not UTF-8 text (byte 0x80 at byte 6); nothing was sent\n"
    )
    assert result.stdout == b""
