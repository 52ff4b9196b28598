"""The pure cores: intake decisions, the mention rule, splitting, status text and throttle."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopd.chat.intake import Action, Allowlist, decide, is_stop, mentions
from loopd.chat.mentions import defuse, named
from loopd.chat.model import Channel, Post, User
from loopd.chat.split import open_fence, split_message
from loopd.chat.status import Finished, InLine, next_edit, status_text
from loopd.chat.ws import Resume, SeqCheck, check_seq, websocket_uri
from loopd.engine.progress import Phase, Status

BOT = User("bot", "loopd", is_bot=True)
ALICE = User("alice-id", "alice")
DEV = Channel("dev-id", "O", "dev", "team-id")
DM = Channel("dm-id", "D", "alice-id__bot")
ALLOW = Allowlist.of(["alice"], [], ["dev"])


def post(message: str, **fields: object) -> Post:
    values: dict[str, object] = {"id": "p1", "user_id": ALICE.id, "channel_id": DEV.id}
    values.update(fields)
    values["message"] = message
    return Post(**values)  # type: ignore[arg-type]


def decision(p: Post, *, channel: Channel = DEV, known: bool = False, seen: bool = False,
             author: User = ALICE, allow: Allowlist = ALLOW) -> Action:  # fmt: skip
    return decide(
        p, channel=channel, author=author, bot=BOT, allow=allow,
        thread_known=known, post_known=seen,
    ).action  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("@loopd hi", True),
        ("hi @loopd.", True),
        ("@loopd: please", True),
        ("(@LOOPD)", True),
        ("@loopdx hi", False),
        ("email loopd@example.com", False),
        ("see `@loopd` here", False),
        ("```\n@loopd in a block\n```", False),
        ("```\ncode\n```\nthen @loopd", True),
        ("", False),
    ],
)
def test_mention_rule(text: str, expected: bool) -> None:
    assert mentions(text, "loopd") is expected


def test_stop_word() -> None:
    assert is_stop("stop", "stop", "loopd")
    assert is_stop("@loopd STOP!", "stop", "loopd")
    assert not is_stop("please stop that", "stop", "loopd")


def test_a_stop_word_addressed_to_someone_else_is_not_a_stop() -> None:
    assert not is_stop("@bob stop", "stop", "loopd")
    assert not is_stop("@loopd @bob STOP!", "stop", "loopd")
    assert decision(post("@bob stop", root_id="r1"), known=True) is Action.REPLY
    assert decision(post("stop", root_id="r1"), known=True) is Action.STOP


def test_decisions() -> None:
    assert decision(post("@loopd hi")) is Action.START
    assert decision(post("hi")) is Action.IGNORE
    assert decision(post("hi", root_id="r"), known=True) is Action.REPLY
    assert decision(post("hi", root_id="r")) is Action.IGNORE
    assert decision(post("stop", root_id="r"), known=True) is Action.STOP
    assert decision(post("hello"), channel=DM) is Action.START
    assert decision(post("@loopd hi", edit_at=5), seen=True) is Action.EDIT_NOTICE
    assert decision(post("@loopd hi"), seen=True) is Action.IGNORE
    assert decision(post("@loopd hi", user_id=BOT.id), author=BOT) is Action.IGNORE
    assert decision(post("@loopd hi", type="system_join_channel")) is Action.IGNORE
    assert decision(post("@loopd hi", props={"from_webhook": "true"})) is Action.IGNORE
    assert decision(post("@loopd hi", delete_at=1)) is Action.IGNORE
    town = Channel("ts", "O", "town-square", "team-id")
    assert decision(post("@loopd hi", channel_id="ts"), channel=town) is Action.REFUSE
    bob = User("bob-id", "bob")
    assert decision(post("@loopd hi", user_id="bob-id"), author=bob) is Action.REFUSE
    assert decision(post("hi", user_id="bob-id", root_id="r"), known=True, author=bob) is (
        Action.IGNORE
    )


def test_default_allowlist_allows_nobody_and_star_everyone() -> None:
    assert decision(post("hello"), channel=DM, allow=Allowlist()) is Action.REFUSE
    everyone = Allowlist.of(["*"], ["*"], [])
    assert decision(post("@loopd hi"), allow=everyone) is Action.START
    by_team = Allowlist.of(["alice"], ["team-id"], [])
    assert decision(post("@loopd hi"), allow=by_team) is Action.START


def test_post_from_event_string() -> None:
    raw = '{"id":"p","channel_id":"c","user_id":"u","message":"m","props":{"a":1}}'
    parsed = Post.from_json(raw)
    assert (parsed.id, parsed.thread_root, parsed.props) == ("p", "p", {"a": 1})


def test_split_short_text_is_unchanged() -> None:
    assert split_message("hello", 100) == ["hello"]


def test_split_on_paragraphs() -> None:
    text = "\n\n".join(f"paragraph {i} " + "x" * 50 for i in range(10))
    parts = split_message(text, 200)
    assert all(len(p) <= 200 for p in parts)
    assert "\n\n".join(parts) == text


def test_split_reopens_a_cut_fence() -> None:
    code = "\n".join(f"line {i} = {i * 7}" for i in range(100))
    text = f"Here:\n\n```python\n{code}\n```\n\nDone."
    parts = split_message(text, 300)
    assert len(parts) > 2
    for part in parts:
        assert len(part) <= 300
        assert open_fence(part) is None
    assert parts[1].startswith("```python\n")
    assert "line 99 = 693" in parts[-1] or "line 99 = 693" in parts[-2]


@given(st.text(alphabet=st.sampled_from("ab \n`"), max_size=3000), st.integers(64, 400))
def test_split_property_every_part_fits(text: str, limit: int) -> None:
    parts = split_message(text, limit)
    assert all(len(p) <= limit for p in parts)
    if len(text) <= limit:
        assert parts == [text]


def test_status_texts() -> None:
    assert "queued behind another request" in status_text(Status(Phase.QUEUED))
    assert "reading the prompt 40%" in status_text(Status(Phase.READING, percent=40))
    assert "thinking (12 tokens)" in status_text(Status(Phase.THINKING, tokens=12))
    assert "calling read_file" in status_text(Status(Phase.TOOL_CALL, tool="read_file"))
    assert "answering" in status_text(Status(Phase.ANSWERING), " (stop hint)")
    assert status_text(InLine(0, 2)) == "⏳ waiting for its turn (behind 2 other threads)"
    assert status_text(Finished("stopped", "by @alice"), "hint") == "⏹️ stopped by @alice"


def test_throttle() -> None:
    assert next_edit(10.0, "a", last_at=None, last_text=None, interval_s=3).send
    assert not next_edit(10.0, "a", last_at=0.0, last_text="a", interval_s=3).send
    later = next_edit(10.0, "b", last_at=9.0, last_text="a", interval_s=3)
    assert (later.send, later.wait_s) == (False, 2.0)
    assert next_edit(12.0, "b", last_at=9.0, last_text="a", interval_s=3).send


def test_seq_and_uri() -> None:
    assert check_seq(5, 5) is SeqCheck.NEXT
    assert check_seq(5, 4) is SeqCheck.REPEAT
    assert check_seq(5, 7) is SeqCheck.GAP
    assert websocket_uri("unix:/run/chat.sock", None) == "ws://localhost/api/v4/websocket"
    uri = websocket_uri("https://mm.example", Resume("abc", 9))
    assert uri == "wss://mm.example/api/v4/websocket?connection_id=abc&sequence_number=9"


GM = Channel("gm-id", "G", "0a1b2c")


def test_a_group_message_is_allowed_when_everyone_in_it_is() -> None:
    mention = post("@loopd hello", channel_id=GM.id)
    allowed = decide(mention, channel=GM, author=ALICE, bot=BOT, allow=ALLOW,
                     thread_known=False, post_known=False)  # fmt: skip
    assert allowed.action is Action.START
    refused = decide(mention, channel=GM, author=ALICE, bot=BOT, allow=ALLOW,
                     thread_known=False, post_known=False, group_outsiders=["carol"])  # fmt: skip
    assert (refused.action, refused.reason) == (
        Action.REFUSE,
        "group message with members not allowed: @carol",
    )
    listed = Allowlist.of(["alice"], [], [GM.id])
    assert listed.allows_channel(GM, group_outsiders=["carol"])


def test_thread_policy_mentions_answers_only_mentions_in_channel_threads() -> None:
    def act(text: str, channel: Channel = DEV) -> Action:
        p = post(text, root_id="r1", channel_id=channel.id)
        return decide(p, channel=channel, author=ALICE, bot=BOT, allow=ALLOW, thread_known=True,
                      post_known=False, replies_need_mention=True).action  # fmt: skip

    assert act("and then?") is Action.IGNORE
    assert act("@loopd and then?") is Action.REPLY
    assert act("stop") is Action.STOP


def test_the_same_words_for_a_phase_on_every_surface() -> None:
    from loopd.engine.progress import phase_words
    from loopd.terminal.render import Style, TurnView

    for status in [Status(phase) for phase in Phase] + [Status(Phase.READING, percent=40)]:
        assert phase_words(status) in status_text(status)
        if status.phase is not Phase.ANSWERING:  # the terminal shows the answer itself
            assert phase_words(status) in TurnView(Style.TERMINAL, width=200).status(status)


def test_draft_text_shows_the_first_post_and_a_mark() -> None:
    from loopd.chat.status import draft_text

    assert draft_text("Hello there", 100) == "Hello there …"
    long = draft_text("word " * 100, 80)
    assert len(long) <= 80
    assert long.endswith(" …")


def test_text_attachments_are_read_and_others_named() -> None:
    from loopd.chat.attachments import read_file, unread_notice
    from loopd.chat.model import FileInfo

    notes = read_file(FileInfo("f1", "notes.txt", "text/plain", 5), b"hello", 100)
    assert notes.text == "[attached file notes.txt (5 bytes)]\nhello\n[end of notes.txt]"
    assert notes.notice == ""
    code = read_file(FileInfo("f2", "main.py", "application/octet-stream", 9), b"print(1)\n", 99)
    assert "print(1)" in code.text
    big = read_file(FileInfo("f3", "big.log", "text/plain", 5000), b"x" * 101, 100)
    assert "[cut: big.log has 4.9 KB; only the first 100 bytes]" in big.text
    assert big.text.count("x") == 100
    photo = read_file(FileInfo("f4", "cat.png", "image/png", 900), None, 100)
    blob = read_file(FileInfo("f5", "a.bin", "application/octet-stream", 9), None, 100)
    nul = read_file(FileInfo("f6", "b.txt", "text/plain", 3), b"a\0b", 100)
    assert photo.text == "[attached: cat.png, an image, not read]"
    assert unread_notice([notes, photo, blob]) == (
        "📎 cat.png is an image; I read only text files. a.bin is a binary file "
        "(application/octet-stream); I read only text files."
    )
    assert "not text" in nul.notice


def test_defuse_keeps_code_emails_and_the_names_asked_for() -> None:
    text = "@channel @all, @here! (@bob) @alice. me@example.com `@here` @@x"
    assert defuse(text, frozenset({"alice", "here"})) == (
        "\uff20channel \uff20all, \uff20here! (\uff20bob) @alice. me@example.com `@here` @\uff20x"
    )
    fenced = "```\nnpm i @types/node\n```\n@types"
    assert defuse(fenced) == "```\nnpm i @types/node\n```\n\uff20types"
    assert defuse("```\n@here") == "```\n\uff20here"  # a fence not closed is text
    assert named("ask @Bob and `@not` me@x.com") == frozenset({"bob"})


@given(st.text(alphabet="@ab.-_`\n x"))
def test_defuse_keeps_the_length_and_is_idempotent(text: str) -> None:
    once = defuse(text)
    assert len(once) == len(text)
    assert defuse(once) == once
