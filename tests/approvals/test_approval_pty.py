"""``loopd chat`` in a pseudo-terminal: a tool call that brokerd holds for approval shows its
whole arguments and asks y/n under the answer; ``y`` allows it, ``n`` denies it, the decision is
written under the answer, and with no answer in time it is denied and the next line typed is the
next message, as ever. A line typed during the turn, before the question, does not answer it:
it waits at the next prompt."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from anyio.from_thread import start_blocking_portal

from loopd.sessionlog.records import EntryKind
from loopd.terminal.link import local_user
from loopd_dev.fakes.llama import ScriptedReply, ScriptedToolCall
from tests.approvals.support import TOOL, asking_broker, audit_approvals
from tests.terminal.support import (
    PROMPT,
    FakeServer,
    end_chats,
    entries,
    fake_env,
    fake_llama,
    of_kind,
    quit_chat,
    spawn_chat,
    until,
)

QUESTION = "Allow it? [y/N]"


@pytest.fixture(autouse=True)
def _end_chats() -> Iterator[None]:
    try:
        yield
    finally:
        end_chats()


@contextmanager
def broker_in_a_thread(root: Path) -> Iterator[str]:
    with (
        tempfile.TemporaryDirectory(prefix="lb") as sockets,
        start_blocking_portal(backend="asyncio") as portal,
        portal.wrap_async_context_manager(asking_broker(root, Path(sockets))) as url,
    ):
        yield url


def script_a_call(server: FakeServer, *after: ScriptedReply, text: str = "hi") -> None:
    call = json.dumps({"name": TOOL, "arguments": {"text": text}})
    server.script(
        ScriptedReply(tool_calls=(ScriptedToolCall("find_tool", '{"query": "echo a text"}'),)),
        ScriptedReply(tool_calls=(ScriptedToolCall("call_tool", call),)),
        ScriptedReply(content="Done."),
        *after,
    )


def last_tool_result(state: Path) -> str:
    tool = of_kind(entries(state, "tty"), EntryKind.TOOL)[-1]
    return str(json.loads(tool.message or "{}")["content"])


def chat_env(server: FakeServer, state: Path, broker_url: str, timeout_s: str) -> dict[str, str]:
    env = fake_env(server, state)
    env.update(LOOPD_BROKER_URL=broker_url, LOOPD_APPROVAL_TIMEOUT_S=timeout_s)
    return env


@pytest.mark.parametrize(("typed", "verdict"), [("y", "allow"), ("n", "deny")])
def test_the_answer_typed_decides(tmp_path: Path, typed: str, verdict: str) -> None:
    with fake_llama() as server, broker_in_a_thread(tmp_path) as broker_url:
        script_a_call(server)
        chat = spawn_chat(chat_env(server, tmp_path / "state", broker_url, "60"))
        chat.expect_exact(PROMPT)
        chat.send("echo hi\r")
        chat.expect_exact("echo_text wants to run with these arguments.")
        chat.expect_exact('"text": "hi"')
        chat.expect_exact(QUESTION)
        chat.send(f"{typed}\r")
        chat.expect_exact(f"{typed}\r\n")  # the answer shows as it is typed
        decided = "✅ allowed by" if verdict == "allow" else "❌ denied by"
        chat.expect_exact(f"{decided} @{local_user()}")
        chat.expect_exact("Done.")
        chat.expect_exact(PROMPT)
        assert quit_chat(chat) == 0
        who = f"@{local_user()}"
        assert audit_approvals(tmp_path) == [(TOOL, verdict, who)]
    result = last_tool_result(tmp_path / "state")
    if verdict == "allow":
        assert result == f"Allowed by {who}.\necho: hi"
    else:
        assert result.startswith(f"{TOOL} was not run: {who} denied this call.")


def test_no_answer_in_time_denies_it_and_the_next_line_is_a_message(tmp_path: Path) -> None:
    with fake_llama() as server, broker_in_a_thread(tmp_path) as broker_url:
        script_a_call(server, ScriptedReply(content="Hello again."))
        chat = spawn_chat(chat_env(server, tmp_path / "state", broker_url, "1"))
        chat.expect_exact(PROMPT)
        chat.send("echo hi\r")
        chat.expect_exact(QUESTION)
        chat.expect_exact("Done.")  # nobody typed: denied at the limit
        chat.expect_exact(PROMPT)
        chat.send("hello\r")
        chat.expect_exact("Hello again.")
        chat.expect_exact(PROMPT)
        assert quit_chat(chat) == 0
    assert "nobody allowed it in time" in last_tool_result(tmp_path / "state")
    users = [e.message or "" for e in of_kind(entries(tmp_path / "state", "tty"), EntryKind.USER)]
    assert [json.loads(u)["content"] for u in users] == ["echo hi", "hello"]


def test_a_line_typed_during_the_turn_waits_for_the_next_prompt(tmp_path: Path) -> None:
    tricky = "report\u202efdp.sh a\u200bb \x1b[2J"
    with fake_llama() as server, broker_in_a_thread(tmp_path) as broker_url:
        script_a_call(server, ScriptedReply(content="Hello again."), text=tricky)
        server.faults(stall_before_first_byte=True)  # the turn waits on the server
        chat = spawn_chat(chat_env(server, tmp_path / "state", broker_url, "60"))
        chat.expect_exact(PROMPT)
        chat.send("echo it\r")
        until(lambda: server.chat_requests() == 1, "the turn's first request")
        chat.send("yes\r")  # typed during the turn, meant as the next message
        server.faults(stall_before_first_byte=False)
        # The arguments as they will be sent: every hidden character seen, as its escape.
        chat.expect_exact('"text": "report\\u202efdp.sh a\\u200bb \\u001b[2J"')
        chat.expect_exact(QUESTION)
        chat.send("n\r")  # typed after the question was drawn: this answers it
        chat.expect_exact(f"❌ denied by @{local_user()}")
        chat.expect_exact("Done.")
        chat.expect_exact(PROMPT)
        chat.expect_exact("yes")  # given back to the next prompt, ready to send
        chat.send("\r")
        chat.expect_exact("Hello again.")
        chat.expect_exact(PROMPT)
        assert quit_chat(chat) == 0
    assert audit_approvals(tmp_path) == [(TOOL, "deny", f"@{local_user()}")]
    users = [e.message or "" for e in of_kind(entries(tmp_path / "state", "tty"), EntryKind.USER)]
    assert [json.loads(u)["content"] for u in users] == ["echo it", "yes"]
