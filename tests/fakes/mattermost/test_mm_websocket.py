"""The fake's WebSocket: hello, seq, double-encoded posts, mentions, actions, auth, resume A-E."""

import json

import pytest
from websockets.exceptions import ConnectionClosed

from loopd_dev.fakes.mattermost.model import is_valid_id, new_id
from tests.fakes.mattermost.mm_support import (
    manual_clock,
    nothing_within,
    open_ws,
    recv,
    recv_event,
    rest,
    running_fake,
    wait_inactive,
)

pytestmark = pytest.mark.anyio


async def test_hello_then_posted_with_seq_and_double_encoded_post() -> None:
    async with running_fake() as running, open_ws(running) as ws:
        hello = await recv(ws)
        assert (hello["event"], hello["seq"]) == ("hello", 0)
        assert is_valid_id(hello["data"]["connection_id"])
        assert hello["data"]["server_version"] == running.fake.config.server_version
        post = running.fake.post_as("alice", "dev", "hello there")
        posted = await recv(ws)
        assert (posted["event"], posted["seq"]) == ("posted", 1)
        assert isinstance(posted["data"]["post"], str)
        decoded = json.loads(posted["data"]["post"])
        assert (decoded["id"], decoded["message"]) == (post.id, "hello there")
        assert posted["data"]["sender_name"] == "@alice"
        assert posted["broadcast"]["channel_id"] == running.fake.channel("dev").id
        assert "mentions" not in posted["data"]


async def test_mentions_are_per_receiver() -> None:
    async with (
        running_fake() as running,
        open_ws(running) as bot_ws,
        open_ws(running, token="alice-token") as alice_ws,
    ):
        await recv(bot_ws)
        await recv(alice_ws)
        running.fake.post_as("bob", "dev", "@loopd: please look")
        to_bot = await recv_event(bot_ws, "posted")
        to_alice = await recv_event(alice_ws, "posted")
        assert json.loads(to_bot["data"]["mentions"]) == [running.fake.bot.id]
        assert "mentions" not in to_alice["data"]
        running.fake.post_as("alice", running.fake.channel("secret").id, "no mention")
        in_dm = running.fake.world.channels_of(running.fake.bot)[-1]
        assert in_dm.type == "D"
        running.fake.post_as("alice", in_dm.id, "dm without a name")
        secret = await recv_event(bot_ws, "posted")
        dm = await recv_event(bot_ws, "posted")
        assert "mentions" not in secret["data"]
        assert json.loads(dm["data"]["mentions"]) == [running.fake.bot.id]


async def test_events_only_reach_channel_members() -> None:
    async with running_fake() as running, open_ws(running) as ws:
        await recv(ws)
        running.fake.post_as("alice", "quiet", "the bot is not here")
        running.fake.post_as("alice", "dev", "the bot is here")
        posted = await recv(ws)
        assert json.loads(posted["data"]["post"])["message"] == "the bot is here"


async def test_actions_reply_with_seq_reply_and_no_seq() -> None:
    async with running_fake() as running, open_ws(running) as ws:
        await recv(ws)
        await ws.send(json.dumps({"action": "ping", "seq": 1}))
        pong = await recv(ws)
        assert pong["seq_reply"] == 1
        assert "seq" not in pong
        assert pong["data"]["text"] == "pong"
        dev = running.fake.channel("dev").id
        await ws.send(json.dumps({"action": "user_typing", "seq": 2, "data": {"channel_id": dev}}))
        assert await recv(ws) == {"status": "OK", "seq_reply": 2}
        await ws.send(json.dumps({"action": "ping", "seq": 0}))
        assert (await recv(ws))["status"] == "FAIL"


async def test_typing_omits_the_typist() -> None:
    async with (
        running_fake() as running,
        open_ws(running) as bot_ws,
        open_ws(running, token="alice-token") as alice_ws,
    ):
        await recv(bot_ws)
        await recv(alice_ws)
        running.fake.typing_as("alice", "dev", parent_id="p")
        typing = await recv(bot_ws)
        assert typing["event"] == "typing"
        assert typing["data"] == {"parent_id": "p", "user_id": running.fake.user("alice").id}
        assert typing["broadcast"]["omit_users"] == {running.fake.user("alice").id: True}
        assert await nothing_within(alice_ws)


async def test_no_credentials_means_no_hello_and_a_close() -> None:
    async with running_fake() as running, open_ws(running, token=None) as ws:
        with pytest.raises(ConnectionClosed):
            await recv(ws)


async def test_authentication_challenge() -> None:
    async with running_fake() as running, open_ws(running, token=None) as ws:
        token = running.fake.config.bot_token
        challenge = {"seq": 1, "action": "authentication_challenge", "data": {"token": token}}
        await ws.send(json.dumps(challenge))
        assert await recv(ws) == {"status": "OK", "seq_reply": 1}
        assert (await recv(ws))["event"] == "hello"


async def test_resume_a_replays_from_the_dead_queue_without_hello() -> None:
    async with running_fake() as running:
        async with open_ws(running) as ws:
            conn_id = (await recv(ws))["data"]["connection_id"]
            for i in range(3):
                running.fake.post_as("alice", "dev", f"m{i}")
            first = [await recv(ws) for _ in range(3)]
        await wait_inactive(running, conn_id)
        async with open_ws(running, f"connection_id={conn_id}&sequence_number=2") as ws:
            replayed = [await recv(ws), await recv(ws)]
            assert replayed == first[1:]
            running.fake.post_as("alice", "dev", "live")
            assert (await recv(ws))["seq"] == 4


async def test_resume_b_delivers_what_was_queued_while_away() -> None:
    async with running_fake() as running:
        async with open_ws(running) as ws:
            conn_id = (await recv(ws))["data"]["connection_id"]
        await wait_inactive(running, conn_id)
        running.fake.post_as("alice", "dev", "while away")
        async with open_ws(running, f"connection_id={conn_id}&sequence_number=1") as ws:
            frame = await recv(ws)
            assert (frame["event"], frame["seq"]) == ("posted", 1)


async def test_resume_c_after_the_buffer_overflowed_says_hello_with_a_new_id() -> None:
    async with running_fake() as running:
        async with open_ws(running) as ws:
            conn_id = (await recv(ws))["data"]["connection_id"]
            running.fake.emit_noise(130, "status_change")
            for _ in range(130):
                await recv(ws)
        await wait_inactive(running, conn_id)
        async with open_ws(running, f"connection_id={conn_id}&sequence_number=1") as ws:
            hello = await recv(ws)
            assert (hello["event"], hello["seq"]) == ("hello", 0)
            assert hello["data"]["connection_id"] != conn_id


async def test_resume_d_after_the_reaper_or_for_an_unknown_id() -> None:
    async with running_fake() as running:
        async with open_ws(running) as ws:
            conn_id = (await recv(ws))["data"]["connection_id"]
        await wait_inactive(running, conn_id)
        manual_clock(running).advance(running.fake.config.reaper_timeout_s + 1)
        async with open_ws(running, f"connection_id={conn_id}&sequence_number=1") as ws:
            hello = await recv(ws)
            assert hello["event"] == "hello"
            assert hello["data"]["connection_id"] != conn_id
        async with open_ws(running, f"connection_id={new_id()}&sequence_number=5") as ws:
            assert (await recv(ws))["event"] == "hello"


@pytest.mark.parametrize(
    "query",
    [
        "connection_id=not-an-id&sequence_number=1",
        "connection_id={id}",
        "connection_id={id}&sequence_number=-1",
        "connection_id={id}&sequence_number=abc",
    ],
)
async def test_resume_e_bad_parameters_close_the_socket(query: str) -> None:
    async with running_fake() as running:
        async with open_ws(running) as ws:
            conn_id = (await recv(ws))["data"]["connection_id"]
        await wait_inactive(running, conn_id)
        async with open_ws(running, query.format(id=conn_id)) as ws:
            with pytest.raises(ConnectionClosed):
                await recv(ws)


async def test_rest_and_ws_agree_on_a_bot_post() -> None:
    async with running_fake() as running, open_ws(running) as ws, rest(running) as client:
        await recv(ws)
        dev = running.fake.channel("dev").id
        created = (await client.post("/posts", json={"channel_id": dev, "message": "hi"})).json()
        posted = await recv(ws)
        assert json.loads(posted["data"]["post"]) == created
