"""``loopd log export --format markdown|openai``, on a session log written here (no server)."""

from __future__ import annotations

from pathlib import Path

from loopcommon.jsonbytes import dumps
from loopd.sessionlog.records import RequestKind, RequestRecord
from loopd.sessionlog.replay import messages_array
from loopd.sessionlog.store import SessionLog
from loopd.transcript import latest_session, markdown
from loopd.turnstop import record_stop
from tests.terminal.support import split_array
from tests.test_cli import run_loopd

TOOLS = '[{"type":"function","function":{"name":"list_dir","parameters":{"type":"object"}}}]'


def _request() -> RequestRecord:
    return RequestRecord(RequestKind.TURN, slot=0, epoch=1, message_count=2, messages_sha256="0")


def _write_session(db: Path) -> None:
    with SessionLog.open(db) as log:
        log.ensure_session("older", 0)
        log.start_epoch("older", reason="new session", tools_text=TOOLS, system_text="Old.")
        log.append_user("older", "first", external_key="k0")
        log.ensure_session("s", 0)
        log.start_epoch("s", reason="new session", tools_text=TOOLS, system_text="Be brief.")
        log.append_user("s", "What is in\ndocs?", external_key="k1")
        call = {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Look first.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "list_dir", "arguments": '{"path":"docs"}'},
                }
            ],
        }
        log.append_assistant("s", dumps(call), request=_request())
        log.append_tool_result("s", tool_call_id="c1", content="a.md\n```b```")
        answer = {"role": "assistant", "content": "Two files: a.md and b."}
        log.append_assistant("s", dumps(answer), request=_request())
        log.append_user("s", "Thanks, and?", external_key="k2")
        record_stop(log, "s", "alice")


def test_markdown_reads_as_a_transcript(tmp_path: Path) -> None:
    db = tmp_path / "loopd.db"
    _write_session(db)
    with SessionLog.open(db, create=False) as log:
        text = markdown("s", log.epochs("s"), log.entries("s"))
    assert text.startswith("# Session `s`\n")
    assert "## Epoch 1 (new session)" in text
    assert "**System:** Be brief." in text
    assert "> What is in\n> docs?" in text
    assert "<details><summary>thinking</summary>\n\n> Look first." in text
    assert 'Tool call `list_dir` (`c1`):\n\n```json\n{"path":"docs"}\n```' in text
    # A fence longer than the backticks inside the result.
    assert "````text\na.md\n```b```\n````" in text
    assert "Two files: a.md and b." in text
    assert "_(not replayed: stopped by @alice)_" in text


def test_openai_is_the_replayed_array_byte_for_byte_and_defaults_to_the_latest(
    tmp_path: Path,
) -> None:
    db = tmp_path / "loopd.db"
    _write_session(db)
    env = {"LOOPD_STATE_DIR": str(tmp_path)}
    exported = run_loopd(["log", "export", "--format", "openai"], env)
    assert exported.returncode == 0, exported.stderr
    with SessionLog.open(db, create=False) as log:
        replayed = log.replay_messages("s")
        assert latest_session(log) == "s"
    assert exported.stdout == messages_array(replayed)  # no newline: exactly the bytes
    assert split_array(exported.stdout) == replayed
    named = run_loopd(["log", "export", "older", "--format", "openai"], env)
    assert len(split_array(named.stdout)) == 2
    jsonl = run_loopd(["log", "export"], env)
    assert jsonl.returncode == 0, jsonl.stderr
    assert len(jsonl.stdout.splitlines()) == 7  # the latest session's entries, one a line


def test_export_of_a_missing_session_is_one_line(tmp_path: Path) -> None:
    _write_session(tmp_path / "loopd.db")
    result = run_loopd(
        ["log", "export", "nope", "--format", "markdown"], {"LOOPD_STATE_DIR": str(tmp_path)}
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "nope" in result.stderr
    assert result.stdout == ""
