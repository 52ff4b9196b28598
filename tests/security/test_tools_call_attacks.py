"""Attacks through the core tools as a model's call makes them, driven by ``loopd tools call``:
a regex that backtracks forever, commands without a sandbox, a daemon escaping the timeout.

Each test records one row of the security table (attack, input, expected, observed) as report
properties: ``pytest --junitxml`` carries them to the generator of docs/security.md.
"""

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.tools.toolcall import (
    LoopdBox,
    kill_all,
    processes_with,
    record_attack,
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


def path_kind(confined: bool) -> str:
    return "bubblewrap" if confined else "allowed unsandboxed"


def plain_env(confined: bool, tmp_path: Path) -> dict[str, str]:
    """No bubblewrap to be found, and the operator's permission to run without it."""
    if confined:
        return {}
    return {"PATH": without_bwrap(tmp_path), "LOOPD_UNSANDBOXED_COMMANDS": "true"}


def log_lines(stderr: str) -> list[str]:
    return [json.loads(line)["msg"] for line in stderr.splitlines() if line.startswith("{")]


def test_a_catastrophic_regex_answers_at_once(box: LoopdBox, record_property: Record) -> None:
    """A backtracking engine spends minutes on ``^(a+)+$`` against 29 a's and a '!', on loopd's
    event loop; RE2 answers in linear time."""
    assert (
        box.call("write_file", SESSION, {"path": "t.txt", "content": "a" * 29 + "!"}).returncode
        == 0
    )
    called = box.call("search_files", SESSION, {"pattern": "^(a+)+$", "regex": True}, timeout=60)
    record_attack(
        record_property,
        attack="ReDoS: a regex that backtracks exponentially freezes loopd",
        input='search_files {"pattern": "^(a+)+$", "regex": true}, a 30-byte file: 29 a\'s, !',
        expected="an answer within the command's start-up time (RE2 is linear)",
        observed=f"exit {called.returncode} in {called.seconds:.1f} s: {called.stdout.strip()}",
    )
    assert (called.returncode, called.stdout) == (0, "no matches for '^(a+)+$' under .\n")
    # Mostly the start of a Python process; a backtracking engine takes tens of seconds here.
    assert called.seconds < 10


def test_a_regex_re2_cannot_run_is_one_clear_error(box: LoopdBox, record_property: Record) -> None:
    called = box.call("search_files", SESSION, {"pattern": r"(a+)\1", "regex": True})
    record_attack(
        record_property,
        attack="a regex feature only a backtracking engine has (backreference)",
        input=r'search_files {"pattern": "(a+)\\1", "regex": true}',
        expected="one tool error naming why",
        observed=f"exit {called.returncode}: {called.stdout.strip()}",
    )
    assert called.returncode == 1
    assert called.stdout.startswith(
        "search_files: the regex '(a+)\\\\1' cannot be used: invalid escape sequence: \\1 "
        "(backreferences are not supported)."
    )


def test_without_bubblewrap_commands_are_refused(
    box: LoopdBox, tmp_path: Path, record_property: Record
) -> None:
    """Unsandboxed, a command reads loopd's state and reaches all three brokerd sockets (it
    could post as the bot anywhere): refused unless the operator opts in."""
    called = box.call(
        "run_command",
        SESSION,
        {"command": "echo ran > ran.txt"},
        env={"PATH": without_bwrap(tmp_path)},
    )
    record_attack(
        record_property,
        attack="run_command without bubblewrap runs unconfined next to brokerd's sockets",
        input='run_command {"command": "echo ran > ran.txt"} on a host without bwrap',
        expected="refused with one tool error; one log line says why and how to opt in",
        observed=f"exit {called.returncode}: {called.stdout.strip()}",
    )
    assert (called.returncode, called.stdout) == (1, REFUSAL)
    assert not (box.workspaces / "mm%3Aattacker" / "ran.txt").exists()
    warnings = [line for line in log_lines(called.stderr) if "run_command" in line]
    assert warnings == [
        "run_command is refused: commands cannot be sandboxed here (bwrap is not installed "
        "(Debian package bubblewrap)); set LOOPD_UNSANDBOXED_COMMANDS=true to run them without "
        "a sandbox, where they can read all loopd can and reach brokerd's sockets"
    ]


def test_an_operator_may_allow_unsandboxed_commands(box: LoopdBox, tmp_path: Path) -> None:
    called = box.call(
        "run_command",
        SESSION,
        {"command": "echo ran"},
        env=plain_env(confined=False, tmp_path=tmp_path),
    )
    assert (called.returncode, called.stdout) == (0, "exit code 0\nran\n\n")
    assert any("run_command is NOT sandboxed" in line for line in log_lines(called.stderr))


@pytest.mark.parametrize("confined", [True, False], ids=["bwrap", "plain"])
def test_a_setsid_child_does_not_survive_the_timeout(
    box: LoopdBox, tmp_path: Path, marker: str, confined: bool, record_property: Record
) -> None:
    arguments = {"command": f"setsid sleep {marker} & sleep {marker}", "timeout_s": 2}
    called = box.call("run_command", SESSION, arguments, env=plain_env(confined, tmp_path))
    survivors = processes_with(marker)
    record_attack(
        record_property,
        attack=f"a setsid child outlives the timeout ({path_kind(confined)})",
        input="run_command setsid sleep & sleep, timeout_s 2, through loopd tools call",
        expected="every process of the command is gone when the call returns",
        observed=f"exit {called.returncode}: {called.stdout.splitlines()[0]}; "
        f"{len(survivors)} left",
    )
    assert called.stdout.startswith("timed out after 2 s; the command and its children were")
    assert survivors == []


@pytest.mark.parametrize("confined", [True, False], ids=["bwrap", "plain"])
def test_a_memory_hog_is_refused_by_the_default_cap(
    box: LoopdBox, tmp_path: Path, confined: bool, record_property: Record
) -> None:
    # A private writable mapping counts against the cap as soon as it is made: refused at once
    # under the cap, and never touched without it (the test must not take 8 GiB of the host).
    hog = (
        "python3 -c 'import mmap; hog = mmap.mmap(-1, 8 << 30, "
        'flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS); print("got it")\''
    )
    called = box.call("run_command", SESSION, {"command": hog}, env=plain_env(confined, tmp_path))
    record_attack(
        record_property,
        attack=f"memory hog under the default cap ({path_kind(confined)})",
        input="run_command python3 mapping 8 GiB of private memory; default memory cap 4 GiB",
        expected="the mapping is refused; the machine keeps its memory",
        observed=f"exit {called.returncode}: {called.stdout.strip().splitlines()[-1]}",
    )
    assert called.returncode == 1
    assert called.stdout.rstrip().endswith("OSError: [Errno 12] Cannot allocate memory")
    assert "got it" not in called.stdout


@pytest.mark.parametrize("confined", [True, False], ids=["bwrap", "plain"])
def test_a_command_does_not_outlive_a_killed_loopd(
    box: LoopdBox, tmp_path: Path, marker: str, confined: bool, record_property: Record
) -> None:
    arguments = json.dumps({"command": f"sleep {marker}", "timeout_s": 600})
    loopd = box.start(
        ["tools", "call", "run_command", "--session", SESSION, arguments],
        env=plain_env(confined, tmp_path),
    )
    try:
        wait_until(lambda: processes_with(marker) != [], "the command to start")
    finally:
        loopd.kill()
        loopd.wait()
    wait_until(lambda: processes_with(marker) == [], "the command to end with loopd", 10)
    record_attack(
        record_property,
        attack=f"a command outlives loopd, killed while it runs ({path_kind(confined)})",
        input="SIGKILL to the loopd running run_command sleep (timeout_s 600)",
        expected="the command ends with loopd",
        observed="no process of the command left",
    )
