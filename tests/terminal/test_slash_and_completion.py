"""The chat's ``/`` commands (which text is one) and ``loopd completion bash|zsh``."""

from __future__ import annotations

import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from loopd.terminal.slash import (
    COMMANDS,
    HELP,
    Slash,
    UnknownSlash,
    completions,
    new_session_name,
    parse,
)
from tests.test_cli import run_loopd


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("/new", Slash("new")),
        ("  /new  my-session ", Slash("new", "my-session")),
        ("/SESSIONS", Slash("sessions")),
        ("/perf", Slash("perf")),
        ("/resume mm:abc-1", Slash("resume", "mm:abc-1")),
        ("/search kiwi  OR eggs", Slash("search", "kiwi  OR eggs")),
        ("/quit", Slash("quit")),
        ("/help", Slash("help")),
        ("/nope", UnknownSlash("nope")),
        ("/etc/hosts: what is this file?", None),
        ("what does /new do?", None),
        ("hello", None),
    ],
)
def test_which_text_is_a_command(text: str, parsed: Slash | UnknownSlash | None) -> None:
    assert parse(text) == parsed


def test_help_names_every_command_and_a_new_session_has_a_dated_name() -> None:
    for name in COMMANDS:
        assert f"/{name}" in HELP
    assert new_session_name(datetime(2026, 1, 2, 3, 4, 5)) == "terminal-20260102-030405"


def _completions(script: Path, words: list[str]) -> list[str]:
    """What bash offers for ``words`` (the last one being completed) with ``script`` loaded."""
    line = " ".join(words)
    program = (
        f"source {script}; COMP_WORDS=({' '.join(repr(w) for w in words)}); "
        f"COMP_CWORD={len(words) - 1}; COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}; "
        '_shtab_loopd; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(
        ["bash", "-c", program], capture_output=True, text=True, check=True, timeout=30
    )
    return done.stdout.split()


def test_bash_completion_knows_the_subcommands_options_and_choices(tmp_path: Path) -> None:
    result = run_loopd(["completion", "bash"], {"LOOPD_STATE_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    script = tmp_path / "loopd.bash"
    script.write_text(result.stdout)
    assert _completions(script, ["loopd", "r"]) == ["run"]
    assert {"chat", "run", "log", "completion", "sessions"} <= set(
        _completions(script, ["loopd", ""])
    )
    assert _completions(script, ["loopd", "log", "export", "--format", ""]) == [
        "jsonl",
        "markdown",
        "openai",
    ]
    assert "--show-thinking" in _completions(script, ["loopd", "chat", "--"])


def test_zsh_completion_is_a_compdef_script_with_the_same_commands(tmp_path: Path) -> None:
    result = run_loopd(["completion", "zsh"], {"LOOPD_STATE_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("#compdef loopd")
    for word in ("chat:", "run:", "completion:", "--show-thinking", "markdown", "openai"):
        assert word in result.stdout, word


def test_tab_offers_command_names_then_session_names() -> None:
    names = ["terminal", "mm:abc-1", "mm:abd", "run-2026"]
    assert completions("/", names)[:3] == ["/new ", "/resume ", "/search "]
    assert completions("/RE", names) == ["/resume ", "/retry"]
    assert completions("/RES", names) == ["/resume "]
    assert completions("/pe", names) == ["/perf"]
    assert completions("/resume ", names) == sorted(names)
    assert completions("/resume mm:ab", names) == ["mm:abc-1", "mm:abd"]
    assert completions("  /resume  mm:abc", names) == ["mm:abc-1"]
    assert completions("/new mm", names) == []  # a new name is not one in use
    assert completions("hello /re", names) == []
    assert completions("/etc/ho", names) == []
