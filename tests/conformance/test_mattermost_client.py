"""The fake Mattermost, driven by the official JavaScript client (``@mattermost/client``: Client4
and WebSocketClient), one small Node script per scenario (``js/``).

What loopd's adapter relies on is only as good as the fake it is tested against; here the
server's own client says whether the fake answers as the real server does: every REST call
loopd makes, posting, replying, patching, reactions, threads, posts since and after, logging in,
the WebSocket hello, ``posted`` with ``data.post`` as a JSON string, and a resume after a drop.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from loopd_dev.fakes.mattermost import RunningFake

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]


async def run_script(
    node: str, modules: Path, script: Path, arguments: dict[str, Any]
) -> dict[str, Any]:
    env = {**os.environ, "NODE_PATH": str(modules), "NODE_NO_WARNINGS": "1"}
    flags = ["--experimental-websocket"] if script.name == "websocket.cjs" else []
    with anyio.fail_after(120):
        done = await anyio.run_process(
            [node, *flags, str(script), json.dumps(arguments)], env=env, check=False
        )
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode == 0, f"{script.name} failed:\n{stderr}"
    result = json.loads(done.stdout)
    assert isinstance(result, dict)
    return result


def ids(mm: RunningFake) -> dict[str, str]:
    fake = mm.fake
    return {
        "url": mm.base_url,
        "ws_url": mm.websocket_url,
        "bot_token": fake.config.bot_token,
        "alice_token": fake.user("alice").token,
        "alice_id": fake.user("alice").id,
        "dev_id": fake.channel("dev").id,
        "quiet_id": fake.channel("quiet").id,
    }


async def test_rest_calls_through_client4(
    node: str, client_modules: Path, scripts: Path, mm: RunningFake
) -> None:
    fake = mm.fake
    other_team = fake.world.add_team("elsewhere", "Elsewhere", (fake.user("alice"),))
    out = await run_script(node, client_modules, scripts / "rest.cjs", ids(mm))

    assert out["ping"]["status"] == "OK"
    assert (out["me"]["username"], out["me"]["is_bot"]) == ("loopd", True)
    assert out["user"]["username"] == "alice"
    assert [p["username"] for p in out["profiles"]] == ["alice"]
    assert [t["name"] for t in out["teams"]] == ["loopd-team"]  # not "elsewhere"
    assert other_team.id not in {t["id"] for t in out["teams"]}
    assert (out["channel"]["name"], out["channel"]["type"]) == ("dev", "O")
    assert {m["user_id"] for m in out["members"]} == fake.channel("dev").members
    assert out["config"]["MaxPostSize"] == "16383"
    assert out["typing"]["status"] == "OK"

    root, again, reply = out["root"], out["again"], out["reply"]
    assert again["id"] == root["id"]  # pending_post_id: the retry gets the same post
    assert root["props"]["from_bot"] == "true"
    assert root["props"]["loopd_turn"] == "conformance#1"
    assert reply["root_id"] == root["id"]
    assert out["patched"]["message"] == "an edited reply"
    assert out["patched"]["edit_at"] > 0
    assert out["reaction"]["emoji_name"] == "eyes"
    assert [r["emoji_name"] for r in out["reactions"]] == ["eyes"]
    thread = out["thread"]
    assert set(thread["order"]) == {root["id"], reply["id"]}
    assert thread["posts"][reply["id"]]["message"] == "an edited reply"
    assert root["id"] in out["since"]["order"]
    assert reply["id"] in out["since"]["order"]
    assert out["after"]["order"] == [reply["id"]]
    assert out["bad_root"] == {
        "status_code": 400,
        "server_error_id": "api.post.create_post.root_id.app_error",
    }
    assert out["not_member"]["status_code"] == 403
    assert out["deleted"]["status"] == "OK"
    assert out["patch_deleted"]["status_code"] == 403  # a deleted post: 403, not 404

    assert out["login"]["username"] == "alice"
    assert out["login_token"] == fake.user("alice").token
    assert out["login_me"]["username"] == "alice"
    assert out["bad_login"]["status_code"] == 401
    assert out["bot_login"]["status_code"] == 401


@pytest.mark.parametrize("header", [True, False], ids=["header-auth", "challenge-auth"])
async def test_websocket_hello_posted_and_resume(
    node: str, client_modules: Path, scripts: Path, mm: RunningFake, header: bool
) -> None:
    fake = mm.fake
    out = await run_script(
        node, client_modules, scripts / "websocket.cjs", {**ids(mm), "header": header}
    )

    events = out["events"]
    assert events[0]["event"] == "hello"
    assert events[0]["seq"] == 0
    assert events[0]["data"]["connection_id"] == out["connection_id"]
    posted = [e for e in events if e["event"] == "posted"]
    assert len(posted) == 2
    for event, post_id in zip(posted, out["posted_ids"], strict=True):
        assert isinstance(event["data"]["post"], str)  # a JSON string, parsed a second time
        assert json.loads(event["data"]["post"])["id"] == post_id
        assert event["data"]["channel_name"] == "dev"
    # Every event's seq is the one after the last: the resume lost and repeated nothing.
    assert [e["seq"] for e in events] == list(range(len(events)))
    first_url, second_url = out["urls"]
    assert first_url.endswith("?connection_id=&sequence_number=0")
    assert f"connection_id={out['connection_id']}" in second_url
    assert f"sequence_number={posted[0]['seq'] + 1}" in second_url
    # The server carried the same connection on (its queue still held the missed events), and
    # the client knew it.
    assert [c.id for c in fake.connections("loopd")] == [out["connection_id"]]
    assert out["connection_id_after"] == out["connection_id"]
    assert out["missed"] == 0  # no new hello: the client did not have to resync
    assert sum(e["event"] == "hello" for e in events) == 1
    replied = {r["seq_reply"] for r in out["replies"]}
    if header:
        # The client sends authentication_challenge (seq 1) even on a socket the header
        # authenticated; the server ignores it, and answers the ping (seq 2).
        assert replied == {2}
    else:
        assert replied == {1, 2}
