"""The approval question's words and who may answer it (pure parts)."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from loopd.approvals.call import AskedCall, Decision
from loopd.approvals.deciders import Deciders
from loopd.approvals.words import shown_arguments
from loopd.chat.approvals import Questions, question_line
from loopd.chatsettings import ChatSettings

pytestmark = pytest.mark.anyio
CALL = AskedCall("mm:x", "c1", "fs.write", '{"path": "/a`b", "text": "' + "y" * 400 + '"}', "id", 0)


def settings(**fields: object) -> ChatSettings:
    return ChatSettings(url="http://mm", token_file="/dev/null", **fields)  # type: ignore[arg-type]


def test_the_line_is_short_and_its_arguments_cannot_break_out_of_code() -> None:
    line = question_line(CALL, settings(), Deciders.of({"alice"}), 600)
    assert line.startswith('🔐 `fs.write` wants to run with `{"path": "/a\'b"')
    assert line.count("`") == 4  # the tool's and the arguments' code spans, nothing else
    assert "…" in line
    assert len(line) < 500
    assert "(within 10 minutes, then it is denied)" in line
    assert len(shown_arguments("not json\n\nat all")) == len("not json at all")


async def test_only_the_starter_or_an_admin_answers() -> None:
    questions = Questions(settings())
    decided: list[Decision | None] = []

    async def wait() -> None:
        decided.append(await questions.wait("p1", Deciders.of({"alice"}, {"carol"}), 5.0))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        while not questions.is_open("p1"):
            await anyio.lowlevel.checkpoint()
        assert not questions.react("p1", "white_check_mark", "bob", "bob-id")
        assert not questions.react("p1", "thumbsup", "alice", "alice-id")
        assert questions.react("p1", "x", "carol", "carol-id")
    assert decided == [Decision("deny", "@carol")]
    assert not questions.react("p1", "white_check_mark", "alice", "alice-id")  # closed
