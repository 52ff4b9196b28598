"""Every refusal loopd posts, once, word for word: who asked, where, and what the person reads.

A refusal is built from the decision's structured fields (who is not allowed), never by parsing
the log reason: parsing made a group message by a person who is not allowed read "...and @carol
is not allowed may not."
"""

from __future__ import annotations

import pytest

from loopd.chat.adapter import REFUSAL, refusal_text
from loopd.chat.intake import Action, Allowlist, decide
from loopd.chat.model import Channel, Post, User

BOT = User("bot", "loopd", is_bot=True)
ALICE = User("alice-id", "alice")
CAROL = User("carol-id", "carol")
DEV = Channel("dev-id", "O", "dev", "team-id")
SECRET = Channel("secret-id", "O", "secret", "team-id")
DM = Channel("dm-id", "D", "carol-id__bot")
GM = Channel("gm-id", "G", "0a1b2c")
ALLOW = Allowlist.of(["alice"], [], ["dev"])
GROUP = "🚫 In a group message I answer only when everyone in it may use me, and {} not enabled. "
GROUP_END = "Ask the admin to add them, or message me directly."


def refused(channel: Channel, author: User, outsiders: tuple[str, ...] = ()) -> str:
    post = Post(id="p1", channel_id=channel.id, user_id=author.id, message="@loopd hello")
    decision = decide(post, channel=channel, author=author, bot=BOT, allow=ALLOW,
                      thread_known=False, post_known=False, group_outsiders=outsiders)  # fmt: skip
    assert decision.action is Action.REFUSE, decision
    return refusal_text(decision, channel)


@pytest.mark.parametrize(
    ("case", "channel", "author", "outsiders", "text"),
    [
        ("a person not allowed, in a channel", DEV, CAROL, (), REFUSAL),
        ("a person not allowed, in a direct message", DM, CAROL, (), REFUSAL),
        ("an allowed person, in a channel not allowed", SECRET, ALICE, (), REFUSAL),
        ("a person not allowed, in a group", GM, CAROL, (), GROUP.format("@carol is") + GROUP_END),
        ("one member not allowed", GM, ALICE, ("carol",), GROUP.format("@carol is") + GROUP_END),
        (
            "three members not allowed",
            GM,
            ALICE,
            ("dave", "carol", "erin"),
            GROUP.format("@carol, @dave and @erin are") + GROUP_END,
        ),
    ],
)
def test_each_refusal_reads_as_a_sentence(
    case: str, channel: Channel, author: User, outsiders: tuple[str, ...], text: str
) -> None:
    assert refused(channel, author, outsiders) == text, case
