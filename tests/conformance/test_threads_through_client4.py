"""A thread as a person lives it, through the official Mattermost client: alice posts, replies
and reacts with Client4 (``js/person.cjs``) against the fake, loopd answers, and what she reads
back through Client4 says what happened: an answer cut at the limit says so, a turn she stopped
(with the word or the reaction) says who stopped it, and a tool call that asks first runs when
she allows it, not when she denies it or leaves it unanswered.

The waits are on the fake's own record of loopd's posts (an event the test can see at once);
every assertion is on what Client4 reads.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from loopd.chat.threads import session_name
from loopd.engine.notes import cut_note
from loopd_dev.fakes.llama import FakeLlama, Pace, RunningFake, ScriptedReply
from tests.approvals.support import audit_approvals, script_a_call, tool_results
from tests.approvals.test_approval_thread import thread_env
from tests.chat.chat_support import (
    Env,
    daemon,
    environment,
    until,
)
from tests.chat.conftest import FAKE_MODEL, fake_llama, llama, sockets
from tests.conformance.person import Person, PersonOf, person_of

__all__ = ["fake_llama", "llama", "person_of", "sockets"]  # the fixtures, here too

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

STOPPED = "⏹️ Stopped by @alice."


Alice = Person
AliceOf = Callable[[Env], Alice]


@pytest.fixture
def alice_of(person_of: PersonOf) -> AliceOf:
    """alice's client for an environment (each test makes its own)."""
    return lambda env: person_of(env, "alice")


async def test_an_answer_cut_at_the_limit_says_so_in_her_client(
    tmp_path: Path, fake_llama: FakeLlama, llama: RunningFake, alice_of: AliceOf
) -> None:
    fake_llama.push(ScriptedReply(content="word " * 400), model=FAKE_MODEL)
    async with environment(tmp_path, None, llama, max_tokens=24) as env, daemon(env):
        alice = alice_of(env)
        root = await alice.post("write a lot")
        await until(lambda: len(env.answers(root)) == 1, "the cut answer")
        [answer] = await alice.bot_messages(root)  # no status post left, no other post
        assert answer.startswith("word word"), answer
        assert answer.endswith(f"\n\n_{cut_note(24)}_"), answer


async def stop_by_reaction(alice: Alice, root: str) -> None:
    """She finds the status post in her client, by the prop loopd gives it, and reacts."""
    status = [
        p
        for p in await alice.thread(root)
        if str(p.get("props", {}).get("loopd_turn", "")).endswith(":status")
    ]
    assert len(status) == 1, status
    await alice.react(status[0]["id"], "octagonal_sign")


async def stop_by_word(alice: Alice, root: str) -> None:
    await alice.post("stop", root_id=root)


@pytest.mark.parametrize("stop", [stop_by_word, stop_by_reaction], ids=["word", "reaction"])
async def test_a_turn_she_stops_says_who_stopped_it(
    tmp_path: Path,
    fake_llama: FakeLlama,
    llama: RunningFake,
    alice_of: AliceOf,
    stop: Callable[[Alice, str], Awaitable[None]],
) -> None:
    fake_llama.pace = Pace(tokens_per_second=30)
    fake_llama.push(ScriptedReply(content="long " * 500), model=FAKE_MODEL)
    async with environment(tmp_path, None, llama) as env, daemon(env):
        alice = alice_of(env)
        root = await alice.post("write a lot")
        await until(lambda: "answering" in "".join(env.status_history(root)), "answering")
        await stop(alice, root)
        await until(lambda: env.status_posts_left(root) == [], "the status post to go", 60)
        [closing] = await alice.bot_messages(root)
        assert closing.endswith(f"\n\n{STOPPED}"), closing


async def question_in_her_client(alice: Alice, env: Env, root: str) -> dict[str, Any]:
    """The approval question, once loopd has posted it, as her client reads it."""
    await until(
        lambda: any(p.message.startswith("🔐") for p in env.live_bot_posts(root)), "the question"
    )
    [found] = [p for p in await alice.thread(root) if p["message"].startswith("🔐")]
    return found


@pytest.mark.parametrize(
    ("reaction", "result", "decision"),
    [
        ("white_check_mark", "Allowed by @alice.\necho: hi", "allow"),
        ("x", "echo_text was not run: @alice denied this call.", "deny"),
    ],
    ids=["allowed", "denied"],
)
async def test_she_answers_an_approval_with_a_reaction_in_her_client(
    tmp_path: Path,
    sockets: Path,
    fake_llama: FakeLlama,
    llama: RunningFake,
    alice_of: AliceOf,
    reaction: str,
    result: str,
    decision: str,
) -> None:
    script_a_call(fake_llama, FAKE_MODEL)
    async with (
        thread_env(tmp_path, sockets, llama, mattermost_on_tcp=True) as env,
        daemon(env) as running,
    ):
        alice = alice_of(env)
        root = await alice.post("echo hi")
        question = await question_in_her_client(alice, env, root)
        assert question["message"].startswith(
            "🔐 `echo_text` wants to run with the arguments above."
        )
        questions = running.adapter.threads.questions
        await until(lambda: questions.is_open(question["id"]), "the question open")
        await alice.react(question["id"], reaction)
        await until(lambda: len(env.answers(root)) == 1, "the answer")
        assert (await alice.bot_messages(root))[-1] == "Done."
    assert tool_results(env.settings.db_path, session_name(root))[-1].startswith(result)
    assert audit_approvals(tmp_path) == [("echo_text", decision, "@alice")]


async def test_an_approval_she_leaves_unanswered_is_denied_in_time(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake, alice_of: AliceOf
) -> None:
    script_a_call(fake_llama, FAKE_MODEL)
    async with (
        thread_env(tmp_path, sockets, llama, 1.0, mattermost_on_tcp=True) as env,
        daemon(env),
    ):
        alice = alice_of(env)
        root = await alice.post("echo hi")
        question = await question_in_her_client(alice, env, root)
        assert "(within 1 second, then it is denied)" in question["message"]
        await until(lambda: len(env.answers(root)) == 1, "the answer")
        assert (await alice.bot_messages(root))[-1] == "Done."
    result = tool_results(env.settings.db_path, session_name(root))[-1]
    assert "nobody allowed it in time (no answer within 1 second)" in result
    assert audit_approvals(tmp_path)[0][:2] == ("echo_text", "timeout")
