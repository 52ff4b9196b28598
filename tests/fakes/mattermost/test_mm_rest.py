"""The fake's REST surface over real HTTP: auth, permissions, limits, since, files, errors."""

from pathlib import Path

import anyio
import httpx
import pytest

from loopd_dev.fakes.mattermost import serve_fake_mattermost
from tests.fakes.mattermost.mm_support import manual_clock, rest, running_fake

pytestmark = pytest.mark.anyio


async def test_401_without_bearer_and_app_error_body() -> None:
    async with running_fake() as running, rest(running, token=None) as client:
        response = await client.get("/users/me")
        assert response.status_code == 401
        body = response.json()
        assert body["status_code"] == 401
        assert set(body) == {"id", "message", "detailed_error", "request_id", "status_code"}
        wrong = await client.get("/users/me", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401


async def test_me_ping_and_client_config() -> None:
    async with running_fake() as running, rest(running) as client:
        me = (await client.get("/users/me")).json()
        assert (me["username"], me["is_bot"]) == ("loopd", True)
        assert (await client.get(f"/users/{me['id']}")).json()["id"] == me["id"]
        assert (await client.get("/system/ping")).json()["status"] == "OK"
        config = (await client.get("/config/client", params={"format": "old"})).json()
        assert config["MaxPostSize"] == "16383"
        alice = running.fake.user("alice")
        users = (await client.post("/users/ids", json=[alice.id, "x" * 26])).json()
        assert [u["username"] for u in users] == ["alice"]
        channels = (await client.get("/users/me/channels")).json()
        assert "quiet" not in {c["name"] for c in channels}
        assert {"dev", "secret"} <= {c["name"] for c in channels}
        dm = next(c for c in channels if c["type"] == "D")
        assert dm["name"] == "__".join(sorted((alice.id, me["id"])))


async def test_post_as_non_member_is_403_and_bad_root_is_400() -> None:
    async with running_fake() as running, rest(running) as client:
        quiet = running.fake.channel("quiet").id
        response = await client.post("/posts", json={"channel_id": quiet, "message": "hi"})
        assert response.status_code == 403
        assert response.json()["id"] == "api.context.permissions.app_error"
        dev = running.fake.channel("dev").id
        root = running.fake.post_as("alice", "dev", "root")
        reply = running.fake.post_as("alice", "dev", "reply", root_id=root.id)
        bad = await client.post(
            "/posts", json={"channel_id": dev, "message": "x", "root_id": reply.id}
        )
        assert bad.status_code == 400


async def test_rune_limit_is_400() -> None:
    async with running_fake() as running, rest(running) as client:
        dev = running.fake.channel("dev").id
        ok = await client.post("/posts", json={"channel_id": dev, "message": "€" * 16383})
        assert ok.status_code == 201
        too_long = await client.post("/posts", json={"channel_id": dev, "message": "€" * 16384})
        assert too_long.status_code == 400
        assert too_long.json()["id"] == "model.post.is_valid.message_length.app_error"


async def test_pending_post_id_dedup_and_from_bot() -> None:
    async with running_fake() as running, rest(running) as client:
        body = {
            "channel_id": running.fake.channel("dev").id,
            "message": "answer",
            "props": {"loopd_turn": "t1", "from_webhook": "true"},
            "pending_post_id": "bot:1",
        }
        first = (await client.post("/posts", json=body)).json()
        second = await client.post("/posts", json=body)
        assert second.status_code == 201
        assert second.json()["id"] == first["id"]
        assert first["props"] == {"loopd_turn": "t1", "from_bot": "true"}
        manual_clock(running).advance(31)
        third = (await client.post("/posts", json=body)).json()
        assert third["id"] != first["id"]
        assert len(running.fake.log.created(user_id=running.fake.bot.id)) == 2


async def test_patch_history_and_edit_limit_over_http() -> None:
    async with running_fake() as running, rest(running) as client:
        dev = running.fake.channel("dev")
        created = await client.post("/posts", json={"channel_id": dev.id, "message": "v1"})
        post_id = created.json()["id"]
        patched = await client.put(f"/posts/{post_id}/patch", json={"message": "v2"})
        assert patched.json()["message"] == "v2"
        assert patched.json()["edit_at"] > 0
        history = [p for p in running.fake.world.posts.values() if p.original_id == post_id]
        assert [h.message for h in history] == ["v1"]
        running.fake.set_edit_time_limit(1)
        manual_clock(running).advance(2)
        late = await client.put(f"/posts/{post_id}/patch", json={"message": "v3"})
        assert late.status_code == 400
        assert late.json()["id"] == "api.post.update_post.permissions_time_limit.app_error"
        alice_post = running.fake.post_as("alice", "dev", "hers")
        foreign = await client.put(f"/posts/{alice_post.id}/patch", json={"message": "no"})
        assert foreign.status_code == 403


async def test_a_deleted_post_and_refused_edits_answer_403() -> None:
    async with running_fake() as running, rest(running) as client:
        dev = running.fake.channel("dev")
        created = await client.post("/posts", json={"channel_id": dev.id, "message": "v1"})
        post_id = created.json()["id"]
        running.fake.refuse_patches(503)
        outage = await client.put(f"/posts/{post_id}/patch", json={"message": "v2"})
        assert outage.status_code == 503
        running.fake.refuse_patches(None)
        assert (await client.put(f"/posts/{post_id}/patch", json={"message": "v2"})).is_success
        await client.delete(f"/posts/{post_id}")
        deleted = await client.put(f"/posts/{post_id}/patch", json={"message": "v3"})
        assert deleted.status_code == 403


async def test_channel_posts_since_and_paging() -> None:
    async with running_fake() as running, rest(running) as client:
        clock = manual_clock(running)
        dev = running.fake.channel("dev").id
        posts = [running.fake.post_as("alice", "dev", f"m{i}") for i in range(5)]
        clock.advance(1)
        cursor = clock.now_ms()
        clock.advance(0.01)  # since is strict: update_at > since
        running.fake.edit_as("alice", posts[0].id, "m0 edited")
        since = (await client.get(f"/channels/{dev}/posts", params={"since": cursor})).json()
        history = [p for p in since["posts"].values() if p["original_id"] == posts[0].id]
        assert posts[0].id in since["order"]
        assert len(history) == 1
        assert history[0]["delete_at"] > 0
        page = (await client.get(f"/channels/{dev}/posts", params={"per_page": 2})).json()
        assert page["order"] == [posts[4].id, posts[3].id]
        after = await client.get(
            f"/channels/{dev}/posts", params={"after": posts[1].id, "per_page": 200}
        )
        assert after.json()["order"] == [p.id for p in reversed(posts[2:])]
        thread = (await client.get(f"/posts/{posts[0].id}/thread")).json()
        assert thread["order"] == [posts[0].id]
        assert thread["has_next"] is False


async def test_delete_get_and_reactions() -> None:
    async with running_fake() as running, rest(running) as client:
        dev = running.fake.channel("dev").id
        post = (await client.post("/posts", json={"channel_id": dev, "message": "x"})).json()
        bot = running.fake.bot.id
        added = await client.post(
            "/reactions", json={"user_id": bot, "post_id": post["id"], "emoji_name": "eyes"}
        )
        assert added.status_code == 201
        listed = (await client.get(f"/posts/{post['id']}/reactions")).json()
        assert [r["emoji_name"] for r in listed] == ["eyes"]
        removed = await client.delete(f"/users/me/posts/{post['id']}/reactions/eyes")
        assert removed.json() == {"status": "OK"}
        assert (await client.delete(f"/posts/{post['id']}")).status_code == 200
        assert (await client.get(f"/posts/{post['id']}")).status_code == 404


async def test_typing_for_another_user_is_403() -> None:
    async with running_fake() as running, rest(running) as client:
        dev = running.fake.channel("dev").id
        ok = await client.post("/users/me/typing", json={"channel_id": dev, "parent_id": ""})
        assert ok.status_code == 200
        alice = running.fake.user("alice").id
        other = await client.post(f"/users/{alice}/typing", json={"channel_id": dev})
        assert other.status_code == 403


async def test_files_upload_download_and_attach() -> None:
    async with running_fake() as running, rest(running) as client:
        dev = running.fake.channel("dev").id
        payload = bytes(range(256)) * 4
        uploaded = await client.post(
            "/files",
            data={"channel_id": dev},
            files={"files": ("notes.bin", payload, "application/octet-stream")},
        )
        assert uploaded.status_code == 201
        info = uploaded.json()["file_infos"][0]
        assert (info["name"], info["size"]) == ("notes.bin", len(payload))
        assert (await client.get(f"/files/{info['id']}")).content == payload
        assert (await client.get(f"/files/{info['id']}/info")).json()["id"] == info["id"]
        post = await client.post(
            "/posts", json={"channel_id": dev, "message": "see file", "file_ids": [info["id"]]}
        )
        assert post.json()["file_ids"] == [info["id"]]
        assert post.json()["metadata"]["files"][0]["post_id"] == post.json()["id"]


async def test_rate_limiter_headers_and_plain_429() -> None:
    async with running_fake() as running, rest(running) as client:
        running.fake.set_rate_limit(True, per_second=10, burst=2)
        statuses = []
        for _ in range(4):
            response = await client.get("/users/me")
            statuses.append(response.status_code)
        assert statuses == [200, 200, 200, 429]
        assert response.headers["X-RateLimit-Limit"] == "3"
        assert response.headers["X-RateLimit-Remaining"] == "0"
        assert response.headers["Retry-After"] == "1"
        assert "X-RateLimit-Reset" in response.headers
        assert response.headers["content-type"].startswith("text/plain")
        assert response.text.strip() == "limit exceeded"
        manual_clock(running).advance(1)
        assert (await client.get("/users/me")).status_code == 200


async def test_unix_socket(tmp_path: Path) -> None:
    path = tmp_path / "mm.sock"
    async with anyio.create_task_group() as tg, serve_fake_mattermost(tg, uds=path) as running:
        transport = httpx.AsyncHTTPTransport(uds=str(path))
        token = running.fake.config.bot_token
        async with httpx.AsyncClient(
            transport=transport,
            base_url=running.api_url,
            headers={"Authorization": f"Bearer {token}"},
        ) as client:
            assert (await client.get("/users/me")).json()["username"] == "loopd"
        tg.cancel_scope.cancel()
    assert not path.exists()
