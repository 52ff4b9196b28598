"""The broker's HTTP API end to end (in process): gating, validation, limits, audit, replay."""

import json
import sqlite3
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette

from brokerd.tools.app import create_broker_app
from brokerd.tools.audit import AuditLog
from brokerd.tools.calls import CallRequest
from brokerd.tools.errors import CatalogueError
from brokerd.tools.settings import BrokerSettings
from tests.brokerd.tools.brokertools_support import python_tool, write_tool

pytestmark = pytest.mark.anyio

WORD_SCHEMA = {
    "type": "object",
    "properties": {"word": {"type": "string", "maxLength": 20}},
    "required": ["word"],
    "additionalProperties": False,
}
FLOOD = """
import sys
chunk = b"x" * (1 << 20)
for _ in range(100):
    sys.stdout.buffer.write(chunk)
"""


class Api:
    def __init__(self, client: httpx.AsyncClient, settings: BrokerSettings) -> None:
        self.client = client
        self.settings = settings

    async def find(self, query: str, session: str = "s1") -> dict[str, Any]:
        response = await self.client.post(
            "/v1/find_tool", json={"session": session, "query": query}
        )
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def call(
        self, name: str, arguments: Any = "{}", call_id: str = "c1", session: str = "s1"
    ) -> dict[str, Any]:
        response = await self.client.post(
            "/v1/call_tool",
            json={"session": session, "call_id": call_id, "name": name, "arguments": arguments},
        )
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def audit_rows(self) -> list[dict[str, Any]]:
        with sqlite3.connect(self.settings.audit_db) as db:
            db.row_factory = sqlite3.Row
            return [dict(row) for row in db.execute("SELECT * FROM calls ORDER BY started_at")]


@pytest.fixture
def catalogue_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "catalogue"
    count_file = tmp_path / "count"
    python_tool(
        directory,
        "counter",
        "import sys; open(sys.argv[1], 'a').write('x'); print('counted')",
        str(count_file),
        writable=tmp_path,
    )
    echo_run = {"kind": "command", "argv": ["echo", "said", "{word}"]}
    write_tool(directory, "echo_word", parameters=WORD_SCHEMA, run=echo_run)
    python_tool(
        directory,
        "hang",
        "import time; print('started', flush=True); time.sleep(60)",
        timeout_s=0.5,
    )
    python_tool(directory, "flood", FLOOD, output_cap_bytes=65536)
    python_tool(directory, "fail", "import sys; sys.exit('broken pipe dream')")
    write_tool(directory, "clock_now", description="Current date and time.")
    return directory


@pytest.fixture
def settings(tmp_path: Path, catalogue_dir: Path) -> BrokerSettings:
    # The counter writes a host file, so it would ask; these tests are about what runs.
    return BrokerSettings(
        audit_db=tmp_path / "audit.db", catalogue_dir=catalogue_dir, approval={"counter": "auto"}
    )


async def open_api(settings: BrokerSettings) -> tuple[Api, Starlette]:
    app = create_broker_app(settings)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://broker")
    return Api(client, settings), app


@pytest.fixture
async def api(settings: BrokerSettings) -> AsyncIterator[Api]:
    api, app = await open_api(settings)
    try:
        yield api
    finally:
        await api.client.aclose()
        app.state.broker.close()


def count(settings: BrokerSettings) -> str:
    path = settings.catalogue_dir.parent / "count"
    return path.read_text() if path.exists() else ""


async def test_health_reports_the_catalogue(api: Api) -> None:
    response = await api.client.get("/v1/health")
    assert response.json() == {"status": "ok", "tools": 6}


async def test_find_tool_returns_names_and_call_tool_wording(api: Api) -> None:
    found = await api.find("echo a word")
    assert found["names"][0] == "echo_word"
    assert 'call_tool(name="echo_word", arguments={"word": <string>})' in found["result"]


async def test_call_before_find_tool_is_refused_and_nothing_runs(api: Api) -> None:
    answer = await api.call("counter")
    assert answer["status"] == "refused"
    assert "Call find_tool first" in answer["result"]
    assert count(api.settings) == ""


async def test_call_after_find_tool_runs(api: Api) -> None:
    await api.find("counter")
    answer = await api.call("counter")
    assert answer == {"result": "counted\n", "status": "ok"}
    assert count(api.settings) == "x"


async def test_found_names_are_per_session(api: Api) -> None:
    await api.find("counter", session="other")
    answer = await api.call("counter", session="s1")
    assert answer["status"] == "refused"


async def test_same_call_id_twice_runs_once(api: Api) -> None:
    await api.find("counter")
    first = await api.call("counter", call_id="same")
    second = await api.call("counter", call_id="same")
    assert first["status"] == "ok"
    assert second == {"result": first["result"], "status": "replayed", "recorded_status": "ok"}
    assert count(api.settings) == "x"
    third = await api.call("counter", call_id="new")
    assert third["status"] == "ok"
    assert count(api.settings) == "xx"


async def test_same_call_id_at_once_runs_once(api: Api) -> None:
    await api.find("counter")
    answers: list[dict[str, Any]] = []

    async def call() -> None:
        answers.append(await api.call("counter", call_id="together"))

    async with anyio.create_task_group() as group:
        for _ in range(5):
            group.start_soon(call)
    assert sorted(answer["status"] for answer in answers) == ["ok"] + ["replayed"] * 4
    assert {answer["result"] for answer in answers} == {"counted\n"}
    assert count(api.settings) == "x"


async def test_reused_call_id_for_another_call_is_a_conflict(api: Api) -> None:
    await api.find("echo word")
    await api.call("echo_word", '{"word": "a"}', call_id="k")
    response = await api.client.post(
        "/v1/call_tool",
        json={"session": "s1", "call_id": "k", "name": "echo_word", "arguments": '{"word": "b"}'},
    )
    assert response.status_code == 409
    assert "already used" in response.json()["error"]


async def test_arguments_that_are_not_json_are_named(api: Api) -> None:
    await api.find("echo word")
    answer = await api.call("echo_word", "word=hello")
    assert answer["status"] == "invalid"
    assert 'the arguments for "echo_word" are not valid JSON' in answer["result"]
    assert "Expecting value at line 1 column 1" in answer["result"]


async def test_schema_violation_names_path_and_message(api: Api) -> None:
    await api.find("echo word")
    answer = await api.call("echo_word", '{"word": "far too long for the schema", "x": 1}')
    assert answer["status"] == "invalid"
    assert "at arguments.word: 'far too long for the schema' is too long" in answer["result"]
    assert "Additional properties are not allowed ('x' was unexpected)" in answer["result"]


async def test_arguments_as_a_parsed_object_are_accepted(api: Api) -> None:
    await api.find("echo word")
    answer = await api.call("echo_word", {"word": "hi"})
    assert answer == {"result": "said hi\n", "status": "ok"}
    assert api.audit_rows()[0]["arguments"] == '{"word":"hi"}'


async def test_unknown_tool_says_so(api: Api) -> None:
    answer = await api.call("teleport")
    assert answer["status"] == "invalid"
    assert 'there is no tool named "teleport"' in answer["result"]


async def test_failing_tool_is_an_error_with_its_output(api: Api) -> None:
    await api.find("fail")
    answer = await api.call("fail")
    assert answer["status"] == "error"
    assert answer["result"] == "fail failed: exited with status 1\nbroken pipe dream\n"


async def test_hanging_tool_times_out_and_is_stopped(api: Api) -> None:
    await api.find("hang")
    started = time.monotonic()
    answer = await api.call("hang")
    assert time.monotonic() - started < 10
    assert answer["status"] == "timeout"
    assert answer["result"] == (
        "hang timed out after 0.5 s and was stopped. Output before the stop:\nstarted\n"
    )


async def test_huge_output_is_capped_without_being_read(api: Api) -> None:
    await api.find("flood")
    tracemalloc.start()
    try:
        answer = await api.call("flood")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert answer["status"] == "ok"
    assert answer["result"] == "x" * 65536 + "\n[output cut at 65536 bytes; the tool produced more]"
    assert peak < 8 * 1024 * 1024, f"peak {peak} bytes: the 100 MB output was read"


async def test_every_call_is_audited(api: Api) -> None:
    await api.find("echo word")
    await api.call("echo_word", '{"word": "a"}', call_id="c1")
    await api.call("echo_word", "nope", call_id="c2")
    await api.call("teleport", "{}", call_id="c3")
    rows = api.audit_rows()
    assert [(r["call_id"], r["tool"], r["arguments"], r["status"]) for r in rows] == [
        ("c1", "echo_word", '{"word": "a"}', "ok"),
        ("c2", "echo_word", "nope", "invalid"),
        ("c3", "teleport", "{}", "invalid"),
    ]
    assert rows[0]["result"] == "said a\n"
    assert all(r["session"] == "s1" and r["started_at"] <= r["ended_at"] for r in rows)


async def test_audit_log_is_append_only(api: Api) -> None:
    await api.find("echo word")
    await api.call("echo_word", '{"word": "a"}')
    with sqlite3.connect(api.settings.audit_db) as db:
        for statement in (
            "UPDATE call_ended SET result = 'forged'",
            "DELETE FROM call_started",
            "DELETE FROM find_tool_calls",
        ):
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                db.execute(statement)
    assert api.audit_rows()[0]["result"] == "said a\n"


async def test_call_killed_mid_way_is_interrupted_on_replay(settings: BrokerSettings) -> None:
    # What brokerd leaves behind when killed mid-call: a found tool and a start row, no end row.
    audit = AuditLog.open(settings.audit_db)
    audit.record_find("s1", "counter", ["counter"], "(result)")
    audit.record_start(CallRequest("s1", "c1", "counter", "{}"))
    audit.close()

    api, app = await open_api(settings)
    try:
        answer = await api.call("counter", call_id="c1")
        assert answer["status"] == "interrupted"
        assert "may or may not have taken effect" in answer["result"]
        assert count(settings) == "", "an interrupted call is never run again"
        again = await api.call("counter", call_id="c1")
        assert again == {
            "result": answer["result"],
            "status": "replayed",
            "recorded_status": "interrupted",
        }
    finally:
        await api.client.aclose()
        app.state.broker.close()


async def test_found_tools_survive_a_restart(settings: BrokerSettings) -> None:
    first, app = await open_api(settings)
    await first.find("counter")
    await first.client.aclose()
    app.state.broker.close()

    second, app = await open_api(settings)
    try:
        assert (await second.call("counter"))["status"] == "ok"
    finally:
        await second.client.aclose()
        app.state.broker.close()


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/find_tool", b"{", "not JSON"),
        ("/v1/find_tool", b"[]", "must be a JSON object"),
        ("/v1/find_tool", b'{"session": "s"}', "query: field required"),
        ("/v1/call_tool", b'{"session": "s", "name": "x"}', "call_id: field required"),
        ("/v1/call_tool", b'{"session": "s", "call_id": "c", "name": "x"}', "arguments: field"),
        (
            "/v1/call_tool",
            b'{"session": "", "call_id": "c", "name": "x", "arguments": ""}',
            "session",
        ),
    ],
)
async def test_malformed_requests_get_400_with_a_message(
    api: Api, path: str, body: bytes, message: str
) -> None:
    response = await api.client.post(path, content=body)
    assert response.status_code == 400
    assert message in response.json()["error"]


def test_bad_catalogue_stops_the_app_from_being_built(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("{", encoding="utf-8")
    settings = BrokerSettings(audit_db=tmp_path / "audit.db", catalogue_dir=tmp_path)
    with pytest.raises(CatalogueError, match=r"broken\.json"):
        create_broker_app(settings)


async def test_default_host_commands_run(tmp_path: Path) -> None:
    api, app = await open_api(BrokerSettings(audit_db=tmp_path / "audit.db"))
    try:
        await api.find("disk usage")
        disk = await api.call("host_disk_usage", call_id="c1")
        assert disk["status"] == "ok"
        assert "Filesystem" in disk["result"]
    finally:
        await api.client.aclose()
        app.state.broker.close()


async def test_git_log_reads_a_repository_under_the_allowed_folders(tmp_path: Path) -> None:
    workspaces = tmp_path / "workspaces"
    repo = workspaces / "s1" / "repo"
    git = ["git", "-c", "user.name=Ada", "-c", "user.email=ada@example.org", "-C", str(repo)]
    await anyio.run_process(["git", "init", "-q", str(repo)])
    await anyio.run_process([*git, "commit", "-q", "--allow-empty", "-m", "first commit"])
    settings = BrokerSettings(audit_db=tmp_path / "audit.db", host_path_roots=(workspaces,))
    api, app = await open_api(settings)
    try:
        found = await api.find("git log commits of a repository")
        assert "git_log" in found["names"]
        log = await api.call("git_log", {"repo": str(repo), "max_count": 5}, call_id="c1")
        assert log["status"] == "ok", log["result"]
        assert log["result"].endswith(" Ada first commit\n")
        outside = await api.call("git_log", {"repo": str(tmp_path)}, call_id="c2")
        assert outside["status"] == "refused"
        assert f"repo must be a path under {workspaces}" in outside["result"]
    finally:
        await api.client.aclose()
        app.state.broker.close()


async def test_git_log_refuses_every_path_when_no_folder_is_allowed(tmp_path: Path) -> None:
    api, app = await open_api(BrokerSettings(audit_db=tmp_path / "audit.db"))
    try:
        await api.find("git log")
        refused = await api.call("git_log", {"repo": str(tmp_path)}, call_id="c1")
        assert refused["status"] == "refused"
        assert "host_path_roots is empty" in refused["result"]
    finally:
        await api.client.aclose()
        app.state.broker.close()


async def test_a_body_over_the_brokers_cap_is_413_and_not_audited(tmp_path: Path) -> None:
    settings = BrokerSettings(audit_db=tmp_path / "audit.db", body_cap_bytes=200)
    api, app = await open_api(settings)
    try:
        await api.find("clock")
        big = {"session": "s1", "call_id": "c1", "name": "clock_now", "arguments": "x" * 300}
        response = await api.client.post("/v1/call_tool", json=big)
        assert response.status_code == 413
        assert response.json() == {"error": "request body over the 200-byte limit"}
        assert api.audit_rows() == []
    finally:
        await api.client.aclose()
        app.state.broker.close()


async def test_over_deep_arguments_are_refused_in_either_form(api: Api) -> None:
    await api.find("echo word")
    deep = "[" * 5000 + "]" * 5000
    body = {"session": "s1", "call_id": "c1", "name": "echo_word", "arguments": None}
    response = await api.client.post(
        "/v1/call_tool",
        content=json.dumps(body).replace("null", deep),
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json() == {"error": "the request body nests deeper than 64 levels"}
    as_text = await api.call("echo_word", '{"word": ' + deep + "}", call_id="c2")
    assert as_text["status"] == "invalid"
    assert "nest deeper than 32 levels" in as_text["result"]
