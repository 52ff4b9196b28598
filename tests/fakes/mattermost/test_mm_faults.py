"""Every fault switch of the fake, observed from the client side; the control API over HTTP."""

import json
import sys

import anyio
import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from tests.fakes.mattermost.mm_support import (
    WAIT_S,
    frames_until_closed,
    nothing_within,
    open_ws,
    recv,
    recv_event,
    rest,
    running_fake,
    wait_inactive,
)

pytestmark = pytest.mark.anyio


async def test_drop_cuts_the_socket_and_the_connection_stays_resumable() -> None:
    async with running_fake() as running:
        async with open_ws(running) as ws:
            conn_id = (await recv(ws))["data"]["connection_id"]
            assert running.fake.drop_sockets() == 1
            with pytest.raises(ConnectionClosed) as closed:
                await recv(ws)
            assert closed.value.rcvd is None  # no close frame: the wire was cut
        await wait_inactive(running, conn_id)
        running.fake.post_as("alice", "dev", "after the drop")
        async with open_ws(running, f"connection_id={conn_id}&sequence_number=1") as ws:
            assert (await recv(ws))["seq"] == 1


async def test_skip_seq_leaves_a_gap() -> None:
    async with running_fake() as running, open_ws(running) as ws:
        await recv(ws)
        running.fake.skip_seq(2)
        running.fake.post_as("alice", "dev", "x")
        assert (await recv(ws))["seq"] == 3


async def test_duplicate_seq_writes_the_event_twice() -> None:
    async with running_fake() as running, open_ws(running) as ws:
        await recv(ws)
        running.fake.duplicate_seq()
        running.fake.post_as("alice", "dev", "x")
        first, second = await recv(ws), await recv(ws)
        assert first == second
        assert first["seq"] == 1
        running.fake.post_as("alice", "dev", "y")
        assert (await recv(ws))["seq"] == 2


async def test_stall_holds_events_replies_and_pongs_until_released() -> None:
    async with running_fake() as running, open_ws(running) as ws:
        await recv(ws)
        running.fake.stall()
        running.fake.post_as("alice", "dev", "held")
        await ws.send(json.dumps({"action": "ping", "seq": 1}))
        with anyio.move_on_after(0.3) as no_pong:
            await (await ws.ping())
        assert no_pong.cancelled_caught
        assert await nothing_within(ws, 0.1)
        running.fake.unstall()
        with anyio.fail_after(WAIT_S):
            await (await ws.ping())
        assert (await recv(ws))["event"] == "posted"
        assert (await recv(ws))["seq_reply"] == 1


async def test_restart_forgets_connections_and_keeps_posts() -> None:
    async with running_fake() as running:
        post = running.fake.post_as("alice", "dev", "survives")
        async with open_ws(running) as ws:
            conn_id = (await recv(ws))["data"]["connection_id"]
            running.fake.restart()
            with pytest.raises(ConnectionClosed) as closed:
                await recv_event(ws, "never")
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1001
        async with open_ws(running, f"connection_id={conn_id}&sequence_number=1") as ws:
            hello = await recv(ws)
            assert hello["data"]["connection_id"] != conn_id
        async with rest(running) as client:
            assert (await client.get(f"/posts/{post.id}")).status_code == 200


async def test_send_queue_overflow_drops_the_connection() -> None:
    async with running_fake() as running:
        async with open_ws(running) as ws:
            conn_id = (await recv(ws))["data"]["connection_id"]
            assert running.fake.overflow_send_queue() == 1
            # What was queued before the overflow still drains, then the server closes.
            assert await frames_until_closed(ws) <= running.fake.config.send_queue_size + 1
        await wait_inactive(running, conn_id)
        async with open_ws(running, f"connection_id={conn_id}&sequence_number=1") as ws:
            hello = await recv(ws)
            assert (hello["event"], hello["seq"]) == ("hello", 0)
            assert hello["data"]["connection_id"] != conn_id


async def test_5xx_after_commit_then_retry_gives_exactly_one_post() -> None:
    async with running_fake() as running, rest(running) as client, open_ws(running) as ws:
        await recv(ws)
        running.fake.fail_next_creates(1, status=503)
        body = {
            "channel_id": running.fake.channel("dev").id,
            "message": "once",
            "pending_post_id": "b:1",
        }
        failed = await client.post("/posts", json=body)
        assert failed.status_code == 503
        posted = json.loads((await recv(ws))["data"]["post"])
        retried = await client.post("/posts", json=body)
        assert retried.status_code == 201
        assert retried.json()["id"] == posted["id"]
        assert len(running.fake.log.created(user_id=running.fake.bot.id)) == 1


async def retry_while_pending(client: httpx.AsyncClient, body: dict[str, str]) -> httpx.Response:
    """POST /posts again while the server still says the first create is in flight (it learns
    that the hung client went away only when it next reads from that connection)."""
    for _ in range(200):
        response = await client.post("/posts", json=body)
        if response.status_code != 500:
            return response
        assert response.json()["id"] == "api.post.deduplicate_create_post.pending"
        await anyio.sleep(0.01)  # a client's retry delay, not a wait for an event
    raise AssertionError("the create stayed pending")


async def test_a_retry_of_a_create_in_flight_is_500_pending() -> None:
    async with (
        running_fake() as running,
        rest(running) as client,
        rest(running) as other_client,
        open_ws(running) as ws,
        anyio.create_task_group() as tg,
    ):
        await recv(ws)
        running.fake.hang_next_creates(1)
        body = {
            "channel_id": running.fake.channel("dev").id,
            "message": "x",
            "pending_post_id": "c:1",
        }
        first = anyio.CancelScope()

        async def hung() -> None:
            with first:
                await client.post("/posts", json=body, timeout=30)

        tg.start_soon(hung)
        posted = json.loads((await recv(ws))["data"]["post"])  # committed, not yet answered
        pending = await other_client.post("/posts", json=body)
        assert pending.status_code == 500
        assert pending.json()["id"] == "api.post.deduplicate_create_post.pending"
        first.cancel()  # the first client gives up and hangs up: the create ends
        await client.aclose()
        done = await retry_while_pending(other_client, body)
        assert (done.status_code, done.json()["id"]) == (201, posted["id"])
        assert len(running.fake.log.created(user_id=running.fake.bot.id)) == 1


async def test_hanging_create_commits_and_never_answers() -> None:
    async with (
        running_fake() as running,
        rest(running) as client,
        httpx.AsyncClient(base_url=running.base_url) as control,
        open_ws(running) as ws,
    ):
        await recv(ws)
        switched = await control.post("/_fake/faults/hang_next_creates", json={"count": 1})
        assert switched.status_code == 200
        body = {
            "channel_id": running.fake.channel("dev").id,
            "message": "once",
            "pending_post_id": "b:1",
        }
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/posts", json=body, timeout=0.5)
        posted = json.loads((await recv(ws))["data"]["post"])  # committed and broadcast
        assert posted["message"] == "once"
        retried = await retry_while_pending(client, body)  # only the next create hung
        assert retried.status_code == 201
        assert retried.json()["id"] == posted["id"]
        other = await client.post("/posts", json={**body, "pending_post_id": "b:2"})
        assert other.status_code == 201
        created = running.fake.log.created(user_id=running.fake.bot.id)
        assert [p.post_id for p in created] == [posted["id"], other.json()["id"]]


async def test_429_burst_with_retry_after() -> None:
    async with running_fake() as running, rest(running) as client:
        running.fake.burst_429(2, retry_after_s=3)
        first = await client.get("/users/me")
        second = await client.get("/users/me")
        third = await client.get("/users/me")
        assert [first.status_code, second.status_code, third.status_code] == [429, 429, 200]
        assert first.headers["Retry-After"] == "3"
        assert first.text.strip() == "limit exceeded"


async def test_update_at_skew() -> None:
    async with running_fake() as running:
        running.fake.set_update_at_skew(-5000)
        post = running.fake.post_as("alice", "dev", "x")
        assert post.update_at == post.create_at - 5000


async def test_noise_fills_the_buffer_with_ignored_events() -> None:
    async with running_fake() as running, open_ws(running) as ws:
        await recv(ws)
        assert running.fake.emit_noise(3, "channel_viewed") == 1 * 3
        kinds = [(await recv(ws))["event"] for _ in range(3)]
        assert kinds == ["channel_viewed"] * 3


async def test_control_api_over_http() -> None:
    async with (
        running_fake() as running,
        httpx.AsyncClient(base_url=running.base_url) as control,
        open_ws(running) as ws,
    ):
        await recv(ws)
        state = (await control.get("/_fake/state")).json()
        assert state["bot"]["token"] == running.fake.config.bot_token
        posted = await control.post(
            "/_fake/act/post_as", json={"username": "alice", "channel": "dev", "message": "hi"}
        )
        post_id = posted.json()["result"]["id"]
        assert json.loads((await recv(ws))["data"]["post"])["id"] == post_id
        await control.post("/_fake/faults/skip_seq", json={"count": 1})
        await control.post(
            "/_fake/act/edit_as", json={"username": "alice", "post_id": post_id, "message": "hi!"}
        )
        edited = await recv(ws)
        assert (edited["event"], edited["seq"]) == ("post_edited", 3)
        log = (await control.get("/_fake/log")).json()
        assert [e["action"] for e in log] == ["created", "edited"]
        assert (await control.post("/_fake/faults/os_system", json={})).status_code == 404
        wrong = await control.post("/_fake/faults/skip_seq", json={"bogus": 1})
        assert wrong.status_code == 400
        advanced = await control.post("/_fake/clock/advance", json={"seconds": 2})
        assert advanced.status_code == 200


async def test_runs_as_a_subprocess() -> None:
    command = [sys.executable, "-m", "loopd_dev.fakes.mattermost", "--manual-clock"]
    async with await anyio.open_process(command) as process:
        assert process.stdout is not None
        try:
            with anyio.fail_after(30):
                line = b""
                while not line.endswith(b"\n"):
                    line += await process.stdout.receive(1)
            announced = json.loads(line)
            async with httpx.AsyncClient(base_url=announced["base_url"]) as client:
                ping = await client.get("/api/v4/system/ping")
                assert ping.json()["status"] == "OK"
                headers = {"Authorization": f"Bearer {announced['bot_token']}"}
                me = await client.get("/api/v4/users/me", headers=headers)
                assert me.json()["id"] == announced["users"]["loopd"]
        finally:
            process.terminate()
            with anyio.fail_after(10):
                await process.wait()
