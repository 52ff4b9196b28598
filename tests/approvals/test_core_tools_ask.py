"""loopd's own tools ask as brokerd's do, where ``[approval]`` says so: in a thread of the fake
Mattermost, a ``write_file`` set to ``ask`` writes nothing until the person who asked allows it,
nothing at all when they deny it, and a restart of loopd with the question open asks on in the
same post. A misspelt tool in ``[approval]`` is refused with the name it most likely meant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopcommon.errors import ConfigError
from loopd.chat.threads import session_name
from loopd.config import load_settings
from loopd.tools.workspace import session_workspace
from loopd_dev.fakes.llama import FakeLlama, RunningFake, ScriptedReply, ScriptedToolCall
from tests.approvals.support import tool_results
from tests.approvals.test_approval_thread import allowed_after_a_restart, asked, thread_env
from tests.chat.chat_support import daemon, until
from tests.chat.conftest import FAKE_MODEL

pytestmark = pytest.mark.anyio

HEAD = "🔐 `write_file` wants to run with the arguments above. It says: `"
WRITE = json.dumps({"path": "notes.txt", "content": "hello"})


def script_a_write(fake: FakeLlama) -> None:
    fake.push(
        ScriptedReply(tool_calls=(ScriptedToolCall("write_file", WRITE),)),
        ScriptedReply(content="Written."),
        model=FAKE_MODEL,
    )


@pytest.mark.parametrize(("reaction", "verdict"), [("white_check_mark", "allow"), ("x", "deny")])
async def test_a_core_tool_set_to_ask_runs_only_when_allowed(
    tmp_path: Path,
    sockets: Path,
    fake_llama: FakeLlama,
    llama: RunningFake,
    reaction: str,
    verdict: str,
) -> None:
    script_a_write(fake_llama)
    async with (
        thread_env(tmp_path, sockets, llama, asks=("write_file",)) as env,
        daemon(env) as running,
    ):
        root = env.fake.post_as("alice", env.dm(), "write a note")
        question = await asked(env, running, root.id)
        assert question.message.startswith(HEAD)
        posts = [p.message for p in env.live_bot_posts(root.id)]
        arguments = '```json\n{\n  "content": "hello",\n  "path": "notes.txt"\n}\n```'
        assert posts[posts.index(question.message) - 1] == arguments
        env.fake.react_as("alice", question.post_id, reaction)
        await until(lambda: len(env.answers(root.id)) == 1, "the answer")
    name = session_name(root.id)
    written = session_workspace(env.settings.workspaces, name) / "notes.txt"
    result = tool_results(env.settings.db_path, name)[-1]
    if verdict == "allow":
        assert result.startswith("Allowed by @alice.\n")
        assert written.read_text() == "hello"
    else:
        assert result.startswith("write_file was not run: @alice denied this call.")
        assert not written.exists()


async def test_a_restart_with_the_question_open_asks_on_in_the_same_post(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    script_a_write(fake_llama)
    async with thread_env(tmp_path, sockets, llama, asks=("write_file",)) as env:
        name = session_name(await allowed_after_a_restart(env, "write a note"))
    assert session_workspace(env.settings.workspaces, name).joinpath("notes.txt").exists()
    assert tool_results(env.settings.db_path, name)[-1].startswith("Allowed by @alice.\n")


def test_a_misspelt_core_tool_is_refused_with_the_name_it_likely_meant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "loopd.toml"
    config.write_text('model = "m"\n\n[approval]\nwrit_file = "ask"\n')
    monkeypatch.setenv("LOOPD_CONFIG", str(config))
    with pytest.raises(ConfigError) as refused:
        load_settings()
    assert str(refused.value) == (
        f"unknown setting `approval.writ_file` in {config}; did you mean `approval.write_file`?"
    )


def test_core_tools_run_at_once_unless_set_to_ask() -> None:
    approval = load_settings(model="m", approval={"run_command": "ask"}).approval
    assert approval.asks("run_command")
    assert not approval.asks("write_file")
    assert approval.timeout_s == 600.0
