"""The chat proxy, attacked from the box through brokerd's real chat.sock.

brokerd adds the bot token to everything it forwards, so every request the box can get through
runs as the bot. A fake Mattermost behind brokerd records what reached it.
"""

import json
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import unix_connect

from tests.security.brokerd_run import RunningBrokerd, brokerd
from tests.security.fake_mattermost import (
    ALICE,
    ALICE_POST,
    BOT_POST_ELSEWHERE,
    BOT_POST_TOWN,
    CAROL,
    DM_ALICE,
    DM_MALLORY,
    ELSEWHERE,
    GM_BAD,
    GM_GOOD,
    TEAM,
    TOWN,
    FakeMattermost,
    mm_id,
    served,
)

TOKEN = "bot-" + secrets.token_hex(12)


@pytest.fixture(scope="module")
def mattermost(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeMattermost, Path]]:
    folder = Path(tmp_path_factory.mktemp("chat"))
    fake = FakeMattermost()
    with served(fake.app(), folder / "mm.sock"):
        yield fake, folder


def start_brokerd(folder: Path, uds: Path, **policy: list[str]) -> Iterator[RunningBrokerd]:
    """brokerd's chat.sock in front of the fake, with ``policy`` as chat_allowed_* settings."""
    token = folder / "bot-token"
    token.write_text(TOKEN + "\n")
    variables = {
        "BROKERD_MATTERMOST_URL": f"unix:{uds}",
        "BROKERD_MATTERMOST_TOKEN_FILE": str(token),
    }
    for name, ids in policy.items():
        variables[f"BROKERD_CHAT_ALLOWED_{name.upper()}"] = json.dumps(ids)
    with brokerd(folder, variables, only=["chat"]) as running:
        yield running


@pytest.fixture(scope="module")
def chat(mattermost: tuple[FakeMattermost, Path]) -> Iterator[Path]:
    """chat.sock of a brokerd configured only with Mattermost's address and token."""
    _fake, folder = mattermost
    box = folder / "plain"
    box.mkdir()
    for running in start_brokerd(box, folder / "mm.sock"):
        yield running.socket("chat")


@pytest.fixture(scope="module")
def guarded(mattermost: tuple[FakeMattermost, Path]) -> Iterator[Path]:
    """chat.sock of a brokerd that lets the box act in TEAM's channels, with ALICE and CAROL."""
    _fake, folder = mattermost
    box = folder / "guarded"
    box.mkdir()
    for running in start_brokerd(box, folder / "mm.sock", teams=[TEAM], users=[ALICE, CAROL]):
        yield running.socket("chat")


def client(chat_sock: Path) -> httpx.Client:
    transport = httpx.HTTPTransport(uds=str(chat_sock))
    return httpx.Client(transport=transport, base_url="http://chat", timeout=10.0)


@pytest.mark.attack(
    attack="The chat proxy forwards any path that fits its `{id}` segment, with the bot token",
    input="GET /users/tokens, /users/autocomplete, /users/stats, /users/search, /channels/members",
    expected="403 for each; nothing reaches Mattermost",
)
def test_paths_that_only_look_like_ids_are_refused(
    chat: Path, mattermost: tuple[FakeMattermost, Path], observed: Callable[[str], None]
) -> None:
    fake, _ = mattermost
    paths = ["users/tokens", "users/autocomplete", "users/stats", "users/search"]
    paths.append("channels/members")
    before = len(fake.seen)
    with client(chat) as box:
        statuses = [box.get(f"/api/v4/{path}").status_code for path in paths]
        members = box.get(f"/api/v4/channels/{GM_GOOD}/members")
    reached = fake.paths()[before:]
    observed(f"statuses {statuses}; reached Mattermost: {reached}")
    assert statuses == [403] * len(paths)
    assert reached == [f"/api/v4/channels/{GM_GOOD}/members"]
    assert members.status_code == 200  # a group message's members, by id: the adapter needs it


@pytest.mark.attack(
    attack="An upstream Set-Cookie is replayed on later requests",
    input="Mattermost answers GET /users/me with `Set-Cookie: MMAUTHTOKEN=...`; the box asks again",
    expected="the second request reaches Mattermost with no Cookie header",
)
def test_no_cookie_is_kept_between_requests(
    chat: Path, mattermost: tuple[FakeMattermost, Path], observed: Callable[[str], None]
) -> None:
    fake, _ = mattermost
    before = len(fake.seen)
    with client(chat) as box:
        first = box.get("/api/v4/users/me")
        box.get("/api/v4/users/me")
    cookies = [seen.headers.get("cookie") for seen in fake.seen[before:]]
    observed(f"Set-Cookie to the box: {first.headers.get('set-cookie')}; cookies sent: {cookies}")
    assert "set-cookie" not in first.headers
    assert cookies == [None, None]


@pytest.mark.attack(
    attack="Forwarding and method-override headers from the box reach Mattermost",
    input="X-Forwarded-For, X-Real-IP, X-HTTP-Method-Override: DELETE, Forwarded",
    expected="none of them reaches Mattermost",
)
def test_forwarding_headers_are_dropped(
    chat: Path, mattermost: tuple[FakeMattermost, Path], observed: Callable[[str], None]
) -> None:
    fake, _ = mattermost
    sent = {
        "X-Forwarded-For": "10.0.0.1",
        "X-Real-IP": "10.0.0.1",
        "X-HTTP-Method-Override": "DELETE",
        "Forwarded": "for=10.0.0.1",
    }
    before = len(fake.seen)
    with client(chat) as box:
        box.get(f"/api/v4/posts/{ALICE_POST}/thread", headers=sent)
    [seen] = fake.seen[before:]
    passed = sorted(name for name in sent if name.lower() in seen.headers)
    observed(f"reached Mattermost: {passed or 'none'}")
    assert passed == []


@pytest.mark.attack(
    attack="The WebSocket upgrade follows a redirect, taking the bot token along",
    input="Mattermost answers the upgrade with 302 to another path",
    expected="the box gets a refusal; the redirect target is never contacted",
)
def test_the_websocket_upgrade_follows_no_redirect(
    chat: Path, mattermost: tuple[FakeMattermost, Path], observed: Callable[[str], None]
) -> None:
    fake, _ = mattermost
    before = len(fake.seen)
    try:
        with unix_connect(str(chat), "ws://chat/api/v4/websocket", open_timeout=10):
            status = 101  # open: the redirect was followed
    except InvalidStatus as refused:
        status = refused.response.status_code
    reached = [seen.path for seen in fake.seen[before:]]
    observed(f"box got {status}; upgrades that reached Mattermost: {reached}")
    assert reached == ["/api/v4/websocket"]
    assert status == 502


POSTS = [
    ("a channel of an allowed team", TOWN, 201),
    ("a channel of another team", ELSEWHERE, 403),
    ("a direct message with an allowed user", DM_ALICE, 201),
    ("a direct message with another user", DM_MALLORY, 403),
    ("a group message of allowed users only", GM_GOOD, 201),
    ("a group message with another user", GM_BAD, 403),
    ("a channel the bot cannot see", mm_id("x"), 403),
]


@pytest.mark.attack(
    attack="The box posts in any channel the bot can reach",
    input="POST /posts in each kind of channel; brokerd allows one team and one user",
    expected="only the allowed team's channels and messages whose members are all allowed pass",
)
def test_posts_go_only_where_the_config_allows(
    guarded: Path, mattermost: tuple[FakeMattermost, Path], observed: Callable[[str], None]
) -> None:
    fake, _ = mattermost
    answers = {}
    with client(guarded) as box:
        for what, channel, _ in POSTS:
            before = len(fake.paths("POST"))
            post = {"channel_id": channel, "message": "hello", "root_id": ""}
            status = box.post("/api/v4/posts", json=post).status_code
            answers[what] = (status, len(fake.paths("POST")) - before)
    observed("; ".join(f"{what}: {status}" for what, (status, _) in answers.items()))
    for what, _, expected in POSTS:
        status, forwarded = answers[what]
        assert status == expected, what
        assert forwarded == (1 if expected == 201 else 0), what


EDITS = [
    ("the bot's post in an allowed channel", BOT_POST_TOWN, 200),
    ("the bot's post in another team's channel", BOT_POST_ELSEWHERE, 403),
    ("someone else's post in an allowed channel", ALICE_POST, 403),
]


@pytest.mark.attack(
    attack="The box edits posts outside its channels, or other people's",
    input="PUT /posts/{id}/patch on the bot's post elsewhere and on a user's post",
    expected="only the bot's own posts in allowed channels can be edited",
)
def test_edits_go_only_to_the_bots_posts_where_the_config_allows(
    guarded: Path, mattermost: tuple[FakeMattermost, Path], observed: Callable[[str], None]
) -> None:
    fake, _ = mattermost
    answers = {}
    with client(guarded) as box:
        for what, post_id, _ in EDITS:
            before = len(fake.paths("PUT"))
            patch = box.put(f"/api/v4/posts/{post_id}/patch", json={"message": "edited"})
            answers[what] = (patch.status_code, len(fake.paths("PUT")) - before)
    observed("; ".join(f"{what}: {status}" for what, (status, _) in answers.items()))
    for what, _, expected in EDITS:
        status, forwarded = answers[what]
        assert status == expected, what
        assert forwarded == (1 if expected == 200 else 0), what
