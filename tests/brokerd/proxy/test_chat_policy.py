"""Where the box may act in Mattermost: the pure decision, and its settings."""

import pytest

from brokerd.config import load_settings
from brokerd.proxy.chatpolicy import ChannelFacts, ChatPolicy, channel_refusal, direct_members
from loopcommon.errors import ConfigError

BOT, ALICE, MALLORY = "b" * 26, "a" * 26, "m" * 26
TEAM, OTHER = "t" * 26, "o" * 26
POLICY = ChatPolicy.of(teams=[TEAM], channels=["c" * 26], users=[ALICE])


def channel(kind: str, team: str = "", name: str = "x", channel_id: str = "x" * 26) -> ChannelFacts:
    return ChannelFacts(channel_id, kind, team, name)


@pytest.mark.parametrize(
    ("facts", "members", "allowed"),
    [
        (channel("O", TEAM), frozenset(), True),
        (channel("P", OTHER), frozenset(), False),
        (channel("O", OTHER, channel_id="c" * 26), frozenset(), True),  # listed by id
        (channel("D", name=f"{ALICE}__{BOT}"), frozenset({ALICE, BOT}), True),
        (channel("D", name=f"{BOT}__{MALLORY}"), frozenset({BOT, MALLORY}), False),
        (channel("D", name=f"{BOT}__{BOT}"), frozenset({BOT}), False),  # nobody to allow
        (channel("G"), frozenset({BOT, ALICE}), True),
        (channel("G"), frozenset({BOT, ALICE, MALLORY}), False),
        (channel("X", TEAM), frozenset(), False),
    ],
)
def test_the_policy_allows_listed_teams_channels_and_users_only(
    facts: ChannelFacts, members: frozenset[str], allowed: bool
) -> None:
    assert (channel_refusal(POLICY, facts, members, BOT) is None) == allowed


def test_star_allows_everything_and_nothing_listed_allows_nothing() -> None:
    facts = channel("G")
    members = frozenset({BOT, MALLORY})
    assert channel_refusal(ChatPolicy.everyone(), facts, members, BOT) is None
    refusal = channel_refusal(ChatPolicy(), channel("O", TEAM), frozenset(), BOT)
    assert refusal is not None
    assert "chat_allowed_teams" in refusal


def test_a_direct_messages_members_come_from_its_name() -> None:
    assert direct_members(channel("D", name=f"{ALICE}__{BOT}")) == {ALICE, BOT}


def test_a_name_instead_of_an_id_is_one_line_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BROKERD_CHAT_ALLOWED_TEAMS", '["town-square"]')
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert str(error.value).startswith("BROKERD_CHAT_ALLOWED_TEAMS: ")
    assert "'town-square' is not a Mattermost id" in str(error.value)
