"""What the bot posts in Mattermost pings no channel and nobody outside the thread: a mention the
model wrote (``@channel``, ``@all``, ``@here``, a person no one in the thread named) is posted
defused, in every post and every edit; the thread's people, and those they named, stay mentions.

``loopd serve`` runs against the fake Mattermost and the fake llama-server, whose model answers
with mentions in its thinking, a tool call's arguments (shown on the status post) and its answer.
Each text the bot ever showed is read with Mattermost's own rule (``mattermost_mentions``, written
here from the server's parser, independent of loopd's code).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from loopd_dev.fakes.llama import (
    FakeLlama,
    ModelSpec,
    RunningFake,
    ScriptedReply,
    ScriptedToolCall,
    serve_fake_llama,
)
from tests.chat.chat_support import (
    FAST_MM,
    Env,
    chat_settings_for,
    daemon,
    fake_mattermost,
    settings_for,
    until,
)

pytestmark = pytest.mark.anyio

FAKE_MODEL = "fake-model"
PINGS = "@channel @all, @here! and (@mallory) and @@everyone:"
CODE = "`@here` in code, and\n```\nnpm i @types/node\n```\n"
ANSWER = f"Hello {PINGS}\n\n{CODE}@alice asked me to tell @bob. mail me@example.com"
_WORD = re.compile(r"[\w.\-:@]+")  # Mattermost's word: letters, digits and .-_:@
_AT_MENTION = re.compile(r"(?<![A-Za-z0-9_])@[A-Za-z0-9][A-Za-z0-9.\-_:]*")  # \B@[[:alnum:]]...
_CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)


def mattermost_mentions(text: str) -> list[str]:
    """The mentions Mattermost reads in ``text``: outside code, a word starting ``@`` and a
    letter or digit (its special words and usernames alike), and what its at-mention pattern
    finds."""
    prose = _CODE.sub(" ", text)
    # A word's trailing punctuation is trimmed, as Mattermost does ("@bob." names bob).
    words = [w.rstrip(".-_:") for w in _WORD.findall(prose) if re.match(r"@[.\-_:]*[^\W_]", w)]
    patterned = [m.rstrip(".-_:") for m in _AT_MENTION.findall(prose)]
    return sorted(set(words) | set(patterned))


@pytest.fixture
async def llama() -> AsyncIterator[tuple[FakeLlama, RunningFake]]:
    fake = FakeLlama([ModelSpec(FAKE_MODEL, n_slots=2, n_ctx=32768)])
    async with serve_fake_llama(fake) as running:
        yield fake, running


@asynccontextmanager
async def environment(tmp_path: Path, sockets: Path, llama: RunningFake) -> AsyncIterator[Env]:
    async with fake_mattermost(sockets, FAST_MM) as mm:
        yield Env(
            mm,
            settings_for(tmp_path / "state", llama.base_url, FAKE_MODEL, max_tokens=2048),
            chat_settings_for(mm, tmp_path),
        )


@pytest.fixture
def sockets(short_dir: Path) -> Path:
    return short_dir


@pytest.mark.attack(
    attack="The bot pings everyone: a model's answer with channel-wide mentions is posted as "
    "written",
    input="alice asks to tell @bob; an answer, thinking and a tool call's arguments with "
    "@channel, @all, @here, @mallory (not in the thread), @@everyone, @alice, @bob; code with "
    "@here and @types/node",
    expected="no post or edit of the bot holds a mention Mattermost reads but @alice and @bob; "
    "code and me@example.com as written",
)
async def test_mentions_the_model_writes_are_posted_defused(
    tmp_path: Path,
    sockets: Path,
    llama: tuple[FakeLlama, RunningFake],
    observed: Callable[[str], None],
) -> None:
    fake_llama, running = llama
    fake_llama.push(
        ScriptedReply(
            reasoning=f"I will ping {PINGS}",
            tool_calls=(ScriptedToolCall("list_dir", f'{{"path": "{PINGS}"}}', "call_1"),),
        ),
        ScriptedReply(content=ANSWER),
        model=FAKE_MODEL,
    )
    async with environment(tmp_path, sockets, running) as env, daemon(env):
        post = env.fake.post_as("alice", env.dm(), "hello, say hi to everyone and tell @bob")
        await until(lambda: len(env.answers(post.id)) == 1, "the answer")
        await until(lambda: env.status_posts_left(post.id) == [], "the status post to go")
        bot = env.fake.bot.id
        shown = [e.message for e in env.fake.log.entries if e.user_id == bot and e.message]
        [answer] = env.answers(post.id)
    live = sorted({m for text in shown for m in mattermost_mentions(text)})
    observed(f"{len(shown)} texts posted or edited; mentions Mattermost reads in them: {live}")
    assert live == ["@alice", "@bob"]
    assert CODE in answer.message
    assert answer.message.endswith("@alice asked me to tell @bob. mail me@example.com")
    # It reads the same: only the @ of each mention changed.
    assert len(answer.message) == len(ANSWER)
    assert answer.message.replace("\uff20", "@") == ANSWER
