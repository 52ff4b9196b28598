"""Acceptance on the REAL llama-server, loopd and brokerd as separate processes:

- both ``/metrics`` pages, scraped during a turn and parsed by ``prometheus_client.parser``,
  move as the turn goes (and loopd's reaches the host through brokerd's relay);
- one turn's loopd and brokerd log lines join on ``request_id``: in Python, and with the README's
  ``jq`` one-liner;
- headless Chromium loads the status page during a live turn and shows the busy slot, the
  session (its thread's first words with their hidden characters shown) and its phase; its
  screenshot is not blank.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from loopd.engine.progress import Phase, Status, phase_words
from loopd_dev import devserver
from tests.observe.observe_support import Page, scraped, value
from tests.observe.real_stack import (
    MODEL_S,
    Stack,
    eventually,
    observed_stack,
    poll,
    slot_held,
    system_tool,
)
from tests.screenshots import assert_drawn

pytestmark = [pytest.mark.real_server, pytest.mark.anyio, pytest.mark.timeout(900)]

README = Path(__file__).resolve().parents[2] / "README.md"
HIDDEN = "report\u202efdp.sh a\u200bb \x9b2J"  # an override, a zero-width space, a C1 CSI


@pytest.fixture
def sockets() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="or") as tmp:
        yield Path(tmp)


async def queued_turn(stack: Stack) -> Page:
    """loopd's metrics once its turn is live and queued on the server (its session's phase)."""

    async def queued() -> Page | None:
        status = (await stack.loopd_get("/status.json")).json()
        if any(live["phase"] == phase_words(Status(Phase.QUEUED)) for live in status["live"]):
            return await stack.loopd_metrics()
        return None

    page: Page = await poll(queued, "the turn to be queued on the server")
    return page


async def test_both_metrics_pages_move_as_a_turn_goes(
    tmp_path: Path, sockets: Path, real_server: devserver.RunningServer
) -> None:
    async with observed_stack(tmp_path, sockets, real_server) as stack:
        loopd_before, brokerd_before = await stack.loopd_metrics(), await stack.brokerd_metrics()
        relayed = await stack.brokerd_get("/loopd/metrics")
        async with slot_held(real_server):
            post = stack.env.fake.post_as("alice", stack.env.dm(), "Say hello.")
            loopd_queued = await queued_turn(stack)
            brokerd_queued = await stack.brokerd_metrics()

            async def polled_again() -> Page | None:  # loopd polls /slots while it waits
                page = await stack.brokerd_metrics()
                return page if slots_polls(page) > slots_polls(brokerd_queued) else None

            brokerd_later: Page = await poll(polled_again, "another /slots poll")
        await eventually(lambda: len(stack.env.answers(post.id)) == 1, "the answer", MODEL_S)
        loopd_after, brokerd_after = await stack.loopd_metrics(), await stack.brokerd_metrics()

    assert relayed.status_code == 200
    assert ("loopd_turns_total", (("outcome", "answered"),)) in scraped(relayed.text)

    def loopd_moved(before: Page, after: Page, name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # While the turn waits: it is live, its slot is busy, the post was counted, no request ended.
    assert value(loopd_queued, "loopd_sessions_active") == 1
    assert value(loopd_queued, "loopd_slot_busy", endpoint="default", slot="0") == 1
    assert loopd_moved(loopd_before, loopd_queued, "loopd_mattermost_events_total", event="posted")
    assert (
        loopd_moved(
            loopd_before, loopd_queued, "loopd_requests_total", kind="turn", outcome="complete"
        )
        == 0
    )
    assert value(brokerd_queued, "brokerd_requests_in_flight", socket="infer") >= 1
    assert slots_polls(brokerd_later) > slots_polls(brokerd_queued) > slots_polls(brokerd_before)

    # Once answered: the turn, its request, its tokens and its first byte are counted.
    assert value(loopd_after, "loopd_sessions_active") == 0
    assert loopd_moved(loopd_before, loopd_after, "loopd_turns_total", outcome="answered") == 1
    assert (
        loopd_moved(
            loopd_before, loopd_after, "loopd_requests_total", kind="turn", outcome="complete"
        )
        == 1
    )
    assert (
        loopd_moved(loopd_before, loopd_after, "loopd_prompt_tokens_processed_total", kind="turn")
        > 0
    )
    assert loopd_moved(loopd_before, loopd_after, "loopd_generated_tokens_total", kind="turn") > 0
    assert (
        loopd_moved(
            loopd_before, loopd_after, "loopd_time_to_first_byte_seconds_count", kind="turn"
        )
        == 1
    )
    assert (
        loopd_moved(loopd_before, loopd_after, "loopd_server_queue_wait_seconds_sum", slot="0") > 0
    )
    # Usage per person: the turn counts for alice, in her direct message.
    usage = {"person": "alice", "channel": "direct message"}
    assert value(loopd_after, "loopd_usage_requests_total", **usage) == 1
    assert value(loopd_after, "loopd_usage_prompt_tokens_total", **usage) == loopd_moved(
        loopd_before, loopd_after, "loopd_prompt_tokens_processed_total", kind="turn"
    )
    assert value(loopd_after, "loopd_usage_generated_tokens_total", **usage) == loopd_moved(
        loopd_before, loopd_after, "loopd_generated_tokens_total", kind="turn"
    )
    assert value(loopd_after, "loopd_usage_gpu_seconds_total", **usage) > 0
    chat = {"socket": "infer", "route": "/v1/chat/completions", "status": "200"}
    assert loopd_moved(brokerd_before, brokerd_after, "brokerd_requests_total", **chat) == 1
    streamed = {"socket": "infer", "direction": "to_box"}
    assert (
        loopd_moved(brokerd_queued, brokerd_after, "brokerd_streamed_bytes_total", **streamed) > 0
    )


async def run(argv: list[str], timeout_s: float = 120.0) -> subprocess.CompletedProcess[bytes]:
    """A command's result, run in a worker thread: after the fake Mattermost of an earlier
    block has closed, ``anyio.run_process`` never sees its child exit (seen with anyio 4.16)."""
    return await anyio.to_thread.run_sync(
        lambda: subprocess.run(argv, capture_output=True, timeout=timeout_s, check=False)
    )


def slots_polls(page: Page) -> float:
    return value(page, "brokerd_requests_total", socket="infer", route="/slots", status="200")


def readme_jq() -> str:
    """The jq program of the README's one-liner (between its single quotes)."""
    text = README.read_text()
    match = re.search(r"^jq -s '([^']+)' (\S+) (\S+)$", text, re.MULTILINE)
    assert match, "the README shows the jq one-liner"
    return match.group(1)


def joined(lines: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The lines that carry a request id, by id (what the README's jq one-liner does)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        if "request_id" in line:
            out.setdefault(line["request_id"], []).append(line)
    return out


async def test_one_turns_lines_join_on_the_request_id(
    tmp_path: Path, sockets: Path, real_server: devserver.RunningServer
) -> None:
    jq = system_tool("jq")
    async with observed_stack(tmp_path, sockets, real_server) as stack:
        async with slot_held(real_server):
            post = stack.env.fake.post_as("alice", stack.env.dm(), "Say hello.")
            await queued_turn(stack)
            await eventually(
                lambda: any(
                    "/slots" in line["msg"] and "request_id" in line
                    for line in stack.brokerd_lines()
                ),
                "brokerd to log a /slots poll of the queued request",
            )
        await eventually(lambda: len(stack.env.answers(post.id)) == 1, "the answer", MODEL_S)
        loopd_log, brokerd_log = stack.loopd.log_path, stack.brokerd.log_path
        loopd_lines, brokerd_lines = stack.loopd_lines(), stack.brokerd_lines()

    session = f"mm:{post.id}"
    [request] = [
        line
        for line in loopd_lines
        if line["msg"] == "model request" and line.get("session") == session
    ]
    by_id = joined(loopd_lines + brokerd_lines)
    same = by_id[request["request_id"]]
    loggers = {line["logger"].split(".")[0] for line in same}
    assert loggers == {"loopd", "brokerd"}, "both daemons logged the request"
    assert {line["session"] for line in same} == {session}
    brokerd_msgs = [line["msg"] for line in same if line["logger"].startswith("brokerd")]
    # loopd closes the stream once it has read [DONE]; brokerd may still be relaying the body's
    # last bytes then, and says so ("client_gone"). Either way it is the same request, answered.
    assert {
        "POST /v1/chat/completions -> 200 complete",
        "POST /v1/chat/completions -> 200 client_gone",
    } & set(brokerd_msgs), brokerd_msgs
    assert any(msg.startswith("GET /slots -> 200") for msg in brokerd_msgs)
    assert request["prompt_n"] > 0

    # The README's jq one-liner gives the same join over the two log files.
    program = readme_jq()
    done = await run([jq, "-s", "-c", program, str(loopd_log), str(brokerd_log)])
    assert done.returncode == 0, done.stderr.decode()
    groups = [json.loads(line) for line in done.stdout.decode().splitlines()]
    from_jq = {group["request_id"]: group for group in groups}
    assert request["request_id"] in from_jq
    group = from_jq[request["request_id"]]
    assert group["session"] == session
    assert sorted(line["msg"] for line in group["lines"]) == sorted(line["msg"] for line in same)


async def test_chromium_shows_the_busy_slot_the_session_and_its_phase(
    tmp_path: Path, sockets: Path, real_server: devserver.RunningServer
) -> None:
    chromium = system_tool("chromium")
    shot = tmp_path / "status-page.png"
    async with observed_stack(tmp_path, sockets, real_server) as stack:
        # A session with history first, so the page has a plot and a hit rate to show.
        first = stack.env.fake.post_as("alice", stack.env.dm(), f"Name a colour. {HIDDEN}")
        await eventually(lambda: len(stack.env.answers(first.id)) == 1, "the answer", MODEL_S)
        stack.env.fake.post_as("alice", stack.env.dm(), "And another?", root_id=first.id)
        await eventually(lambda: len(stack.env.answers(first.id)) == 2, "the answer", MODEL_S)
        async with slot_held(real_server):
            stack.env.fake.post_as("alice", stack.env.dm(), "Name a fruit.", root_id=first.id)
            await queued_turn(stack)
            url = f"{stack.brokerd_url}/loopd/"
            profile = tmp_path / "chromium"
            flags = [
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ]
            async with anyio.create_task_group() as tg:
                results: dict[str, subprocess.CompletedProcess[bytes]] = {}

                async def browse(name: str, *extra: str) -> None:
                    argv = [chromium, *flags, f"--user-data-dir={profile / name}", *extra, url]
                    results[name] = await run(argv)

                tg.start_soon(browse, "dom", "--dump-dom")
                tg.start_soon(
                    browse,
                    "shot",
                    f"--screenshot={shot}",
                    "--window-size=1640,620",
                    "--hide-scrollbars",
                )
            still_live = (await stack.loopd_get("/status.json")).json()["live"]
    dom = results["dom"]
    assert dom.returncode == 0, dom.stderr.decode(errors="replace")[-2000:]
    text = dom.stdout.decode()
    session = f"mm:{first.id}"
    assert still_live, "the turn was still live when the browser had finished"
    # The busy slot's row: the session (its thread's label, then loopd's name) and its phase.
    row = re.search(
        r'<span class="busy">busy</span></td><td>(.*?)</td><td><bdi>([^<]*)</bdi></td>', text
    )
    assert row is not None, text
    assert f"<code><bdi>{session}</bdi></code>" in row.group(1), row.group(1)
    # The thread's first words show their hidden characters, isolated from the rest of the row.
    shown = "Name a colour. report&lt;U+202E&gt;fdp.sh a&lt;U+200B&gt;b &lt;U+009B&gt;2J"
    assert f"“<bdi>{shown}</bdi>”" in row.group(1), row.group(1)
    assert not any(char in text for char in "\u202e\u200b\x9b")
    assert row.group(2).startswith("queued"), row.group(2)
    assert results["shot"].returncode == 0, results["shot"].stderr.decode(errors="replace")[-2000:]
    assert_drawn(shot, least_height=600, least_width=1000)
    if keep := os.environ.get("LOOPDTEST_STATUS_PNG"):  # docs/status-page.png is made so
        shutil.copy(shot, keep)
