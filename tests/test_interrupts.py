"""Ctrl-C at any moment of a command: one line at most and exit status 130, never a traceback.

The interrupt is sent at moments spread over the command's whole life: while the interpreter
imports the command line (the window where it used to print a 30-line ``KeyboardInterrupt``
traceback), while the command works, and as it exits. Whatever the moment, what the person sees
is at most one line, and the status is 130 (or 0 where the command had already finished, or the
interpreter's own death by SIGINT before any Python code ran).

Two windows are the interpreter's and not loopd's: while Python imports its ``site`` module (and
runs the ``.pth`` files it finds, such as an editable install's path hook), before it runs a line
of the program, an interrupt is a fatal error of the interpreter itself or a report it makes and
goes on from; and while the installed script's first statement imports the entry module, inside
Python's own import machinery (and the editable install's finder), it is a traceback whose only
frame of the script is that statement. No program can catch either (the entry module imports
only what is built into the interpreter, so the second window is the import system's own); those
runs are told apart by their traceback, which shows no frame of the program's own code, and are
the only ones let through.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_cli_errors import environment

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("loopd", "loopcommon", "brokerd")
# Moments after the start, in seconds: spread over the import of the command line (a few hundred
# milliseconds on a quiet machine, more on a busy one) and past it.
MOMENTS = (0.0, 0.01, 0.03, 0.06, 0.1, 0.15, 0.2, 0.3, 0.45, 0.6, 0.9, 1.3)
KILLED_BY_SIGINT = -signal.SIGINT
# The interpreter's own initialisation (importing ``site``, setting up the standard streams).
INTERPRETER_START_UP = "Fatal Python error: init_"
# Reports of an interrupt the interpreter makes itself before the program's first line, and
# then runs on: ``site`` running a ``.pth`` file, the import lock's clean-up, the probe of the
# script's path as an import path entry.
SITE_REPORTS = (
    "Error processing line ",
    "Exception ignored in: <function _get_module_lock",
    "Failed checking if argv[0] is an import path entry",
)


def interrupted(argv: list[str], env: dict[str, str], after_s: float) -> tuple[int, str]:
    # ``with`` closes the pipes whatever happens, so a run that fails leaves nothing open behind.
    with subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as child:
        try:
            time.sleep(after_s)  # the moment under test, not a wait for anything
            if child.poll() is None:
                child.send_signal(signal.SIGINT)
            _, err = child.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            child.kill()
            _, err = child.communicate()
            raise AssertionError(
                f"still running 120 s after the SIGINT: {err.decode(errors='replace')}"
            ) from None
        finally:
            if child.poll() is None:
                child.kill()
    return child.returncode, err.decode(errors="replace")


def in_interpreter_start_up(err: str) -> bool:
    """The interrupt came before a line of the program ran: while Python imported ``site`` (or
    ran the ``.pth`` files it reads: an editable install's path hook), or inside Python's import
    machinery as the installed script's first statement imported the entry module. Such an
    error shows no frame of the program's own code, and of the script only that statement."""
    frames = [line for line in err.splitlines() if line.lstrip().startswith("File ")]
    if any(f'"{ROOT}/{package}/' in frame for frame in frames for package in PACKAGES):
        return False
    script = [frame for frame in frames if f'"{BIN}/' in frame]
    if any("line 3, in <module>" not in frame for frame in script):
        return False
    return err.startswith((INTERPRETER_START_UP, *SITE_REPORTS)) or (
        err.rstrip().endswith("KeyboardInterrupt")
    )


@pytest.mark.parametrize("after_s", MOMENTS)
def test_ctrl_c_at_any_moment_of_loopd_is_one_line(tmp_path: Path, after_s: float) -> None:
    env = environment(tmp_path, LOOPD_STATE_DIR=str(tmp_path / "state"))
    status, err = interrupted([str(BIN / "loopd"), "sessions"], env, after_s)
    if in_interpreter_start_up(err):
        return
    assert "Traceback" not in err, err
    assert "KeyboardInterrupt" not in err, err
    assert len(err.splitlines()) <= 1, err
    assert status in (0, 130, KILLED_BY_SIGINT), (status, err)
    if status == 130:
        assert err.strip() == "loopd: interrupted"


@pytest.mark.parametrize("after_s", MOMENTS)
def test_ctrl_c_at_any_moment_of_brokerd_is_no_traceback(tmp_path: Path, after_s: float) -> None:
    socket_dir = tmp_path / "sockets"
    env = environment(
        tmp_path,
        BROKERD_SOCKET_DIR=str(socket_dir),
        BROKERD_BROKER__AUDIT_DB=str(tmp_path / "audit.db"),
    )
    status, err = interrupted([str(BIN / "brokerd"), "serve", "--only", "broker"], env, after_s)
    if in_interpreter_start_up(err):
        return
    assert "Traceback" not in err, err
    assert "KeyboardInterrupt" not in err, err
    # 0: stopped by SIGINT once serving; 130: interrupted before serving began.
    assert status in (0, 130, KILLED_BY_SIGINT), (status, err)


def test_python_m_loopd_is_the_same_entry(tmp_path: Path) -> None:
    env = environment(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "loopd", "--version"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result
    assert result.stdout.startswith("loopd "), result
    assert "loopcommon.entry" in (BIN / "loopd").read_text()  # the installed script is this entry
