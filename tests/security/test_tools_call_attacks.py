"""Attacks through the core tools as a model's call makes them, driven by ``loopd tools call``:
a regex that backtracks forever, commands without a sandbox, a daemon escaping the timeout.

Each attack test is one row of docs/security.md's table (one per sandbox kind): its docstring
gives the attack (first line), the input and what is expected; ``record_property("observed",
...)`` says what the run saw.
"""

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from loopd.tools.launcher import CommandLimits
from tests.tools.toolcall import (
    LoopdBox,
    kill_all,
    processes_with,
    unique_sleep,
    wait_until,
    without_bwrap,
)

Record = Callable[[str, object], None]
SESSION = "mm:attacker"
REFUSAL = (
    "run_command is not available: commands cannot be sandboxed on this host (bwrap is not "
    "installed (Debian package bubblewrap)), and the operator has not allowed unsandboxed "
    "commands (LOOPD_UNSANDBOXED_COMMANDS). The file tools still work.\n"
)


@pytest.fixture
def box(tmp_path: Path) -> LoopdBox:
    made = LoopdBox(tmp_path)
    made.add_sessions(SESSION)
    return made


@pytest.fixture
def marker() -> Iterator[str]:
    value = unique_sleep()
    yield value
    kill_all(value)


def plain_env(confined: bool, tmp_path: Path) -> dict[str, str]:
    """No bubblewrap to be found, and the operator's permission to run without it."""
    if confined:
        return {}
    return {"PATH": without_bwrap(tmp_path), "LOOPD_UNSANDBOXED_COMMANDS": "true"}


def command_cgroup(marker: str) -> Path | None:
    """The pids cgroup of the launcher running ``sleep MARKER`` (None when it has none)."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 4 and argv[3].endswith(b"launcher.py") and marker.encode() in argv[-2]:
            path = CommandLimits.from_json(argv[4].decode()).pids_cgroup
            return None if path is None else Path(path)
    raise AssertionError(f"no launcher runs sleep {marker}")


def log_lines(stderr: str) -> list[str]:
    return [json.loads(line)["msg"] for line in stderr.splitlines() if line.startswith("{")]


def test_a_catastrophic_regex_answers_at_once(box: LoopdBox, record_property: Record) -> None:
    """ReDoS: a backtracking regex holds loopd's event loop for tens of seconds.

    Input: search_files ^(a+)+$ with regex true over a 30-byte file (29 a's and !)
    Expected: an answer at once (RE2 is linear); no stall of the event loop
    """
    wrote = box.call("write_file", SESSION, {"path": "t.txt", "content": "a" * 29 + "!"})
    assert wrote.stdout == "created t.txt (30 bytes)\n"
    called = box.call("search_files", SESSION, {"pattern": "^(a+)+$", "regex": True}, timeout=60)
    record_property(
        "observed", f"exit {called.returncode} in {called.seconds:.1f} s: {called.stdout.strip()}"
    )
    assert (called.returncode, called.stdout) == (0, "no matches for '^(a+)+$' under .\n")
    # Mostly the start of a Python process; a backtracking engine takes tens of seconds here.
    assert called.seconds < 10


def test_a_regex_re2_cannot_run_is_one_clear_error(box: LoopdBox, record_property: Record) -> None:
    """A regex feature only a backtracking engine has (a backreference).

    Input: search_files (a+)\\1 with regex true
    Expected: one tool error naming why (backreferences are not supported)
    """
    called = box.call("search_files", SESSION, {"pattern": r"(a+)\1", "regex": True})
    record_property("observed", f"exit {called.returncode}: {called.stdout.strip()}")
    assert called.returncode == 1
    assert called.stdout.startswith(
        "search_files: the regex '(a+)\\\\1' cannot be used: invalid escape sequence: \\1 "
        "(backreferences are not supported)."
    )


def test_without_bubblewrap_commands_are_refused(
    box: LoopdBox, tmp_path: Path, record_property: Record
) -> None:
    """run_command without bubblewrap runs beside loopd's state and brokerd's sockets.

    Input: run_command echo ran > ran.txt on a host without bwrap, no opt-in
    Expected: refused: one tool error; one log line says why and names LOOPD_UNSANDBOXED_COMMANDS
    """
    called = box.call(
        "run_command",
        SESSION,
        {"command": "echo ran > ran.txt"},
        env={"PATH": without_bwrap(tmp_path)},
    )
    record_property("observed", f"exit {called.returncode}: {called.stdout.strip()}")
    assert (called.returncode, called.stdout) == (1, REFUSAL)
    assert not (box.workspaces / "mm%3Aattacker" / "ran.txt").exists()
    warnings = [line for line in log_lines(called.stderr) if "run_command" in line]
    assert warnings == [
        "run_command is refused: commands cannot be sandboxed here (bwrap is not installed "
        "(Debian package bubblewrap)); set LOOPD_UNSANDBOXED_COMMANDS=true to run them without "
        "a sandbox, where they can read all loopd can and reach brokerd's sockets"
    ]


def test_an_operator_may_allow_unsandboxed_commands(
    box: LoopdBox, tmp_path: Path, record_property: Record
) -> None:
    """An operator opts in to commands without a sandbox on a host without bubblewrap.

    Input: run_command echo ran, no bwrap, LOOPD_UNSANDBOXED_COMMANDS=true
    Expected: the command runs; one log line says it is NOT sandboxed
    """
    called = box.call(
        "run_command",
        SESSION,
        {"command": "echo ran"},
        env=plain_env(confined=False, tmp_path=tmp_path),
    )
    record_property("observed", f"exit {called.returncode}: {' / '.join(called.stdout.split())}")
    assert (called.returncode, called.stdout) == (0, "exit code 0\nran\n\n")
    assert any("run_command is NOT sandboxed" in line for line in log_lines(called.stderr))


@pytest.mark.parametrize("confined", [True, False], ids=["bwrap", "plain"])
def test_a_setsid_child_does_not_survive_the_timeout(
    box: LoopdBox, tmp_path: Path, marker: str, confined: bool, record_property: Record
) -> None:
    """A setsid child outlives run_command's timeout (bubblewrap, allowed unsandboxed).

    Input: loopd tools call run_command: setsid sleep N & sleep N, timeout_s 2
    Expected: every process of the command is gone when the call returns
    """
    arguments = {"command": f"setsid sleep {marker} & sleep {marker}", "timeout_s": 2}
    called = box.call("run_command", SESSION, arguments, env=plain_env(confined, tmp_path))
    survivors = processes_with(marker)
    record_property(
        "observed",
        f"exit {called.returncode}: {called.stdout.splitlines()[0]}; {len(survivors)} left",
    )
    assert called.stdout.startswith("timed out after 2 s; the command and its children were")
    assert survivors == []


@pytest.mark.parametrize("confined", [True, False], ids=["bwrap", "plain"])
def test_a_memory_hog_is_refused_by_the_default_cap(
    box: LoopdBox, tmp_path: Path, confined: bool, record_property: Record
) -> None:
    """A memory hog under the default caps (bubblewrap, allowed unsandboxed).

    Input: run_command: python3 mapping 8 GiB of private memory; default memory cap 4 GiB
    Expected: the mapping is refused (ENOMEM); the host keeps its memory
    """
    # A private writable mapping counts against the cap as soon as it is made: refused at once
    # under the cap, and never touched without it (the test must not take 8 GiB of the host).
    hog = (
        "python3 -c 'import mmap; hog = mmap.mmap(-1, 8 << 30, "
        'flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS); print("got it")\''
    )
    called = box.call("run_command", SESSION, {"command": hog}, env=plain_env(confined, tmp_path))
    record_property(
        "observed", f"exit {called.returncode}: {called.stdout.strip().splitlines()[-1]}"
    )
    assert called.returncode == 1
    assert called.stdout.rstrip().endswith("OSError: [Errno 12] Cannot allocate memory")
    assert "got it" not in called.stdout


@pytest.mark.parametrize("confined", [True, False], ids=["bwrap", "plain"])
def test_a_command_does_not_outlive_a_killed_loopd(
    box: LoopdBox, tmp_path: Path, marker: str, confined: bool, record_property: Record
) -> None:
    """A command outlives loopd, killed while it runs (bubblewrap, allowed unsandboxed).

    Input: SIGKILL to the loopd running run_command sleep N (timeout_s 600)
    Expected: the command ends with loopd
    """
    arguments = json.dumps({"command": f"sleep {marker}", "timeout_s": 600})
    loopd = box.start(
        ["tools", "call", "run_command", "--session", SESSION, arguments],
        env=plain_env(confined, tmp_path),
    )
    try:
        wait_until(lambda: processes_with(marker) != [], "the command to start")
        cgroup = command_cgroup(marker)
    finally:
        loopd.kill()
        loopd.wait()
    wait_until(lambda: processes_with(marker) == [], "the command to end with loopd", 10)
    if cgroup is not None:  # loopd runs as root here: the launcher removes the command's cgroup
        wait_until(lambda: not cgroup.exists(), "the command's pids cgroup to go", 10)
    record_property("observed", "no process of the command left")
