"""A good neighbour on the real router (``loopd.engine.quiet``, ``loopd.engine.modelstate``):
``loopd serve`` idle after answering a thread, its server check every second, on a router
whose model child sleeps after three idle seconds. The model falls asleep and stays asleep
through the checks; unloaded by another client's request (``--models-max 1``), it stays
unloaded; then a new post in the thread is answered with one request to the server, which
re-reads under a tenth of its prompt: loopd knew its model forgot, and restored the thread's
save before the request."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from loopd.engine.client import InferenceClient
from loopd.engine.durable import DurableMode
from loopd.engine.modelstate import ModelStatus
from loopd.engine.outcome import Failure
from loopd.selftest.run import run_selftest
from loopd.serve import Daemon, run_daemon
from loopd.sessionlog.records import Request, RequestKind
from loopd_dev import devserver
from tests.chat.chat_support import Env, chat_settings_for, fake_mattermost, settings_for, until
from tests.durable.sleepy import CHANGE_WITHIN_S, sleepy_router, status_becomes

pytestmark = [pytest.mark.real_server, pytest.mark.anyio]

MODEL = devserver.PLAIN_MODEL
OTHER_CLIENTS_MODEL = devserver.THINKING_MODEL
SLEEP_S = 3
CHECK_EVERY_S = 1.0
# Long enough a first message that a re-read of it is far more than a tenth of the prompt.
NOTES = " ".join(
    f"Note {n}: the deploy window opens on Thursday after every owner signs off." for n in range(40)
)


@pytest.fixture
def sockets() -> Iterator[Path]:
    """A short folder for Unix sockets (``tmp_path`` may pass the 108-byte limit)."""
    with tempfile.TemporaryDirectory(prefix="ln") as tmp:
        yield Path(tmp)


@pytest.fixture
def router(tmp_path: Path) -> Iterator[devserver.RunningServer]:
    one_model = devserver.ServerLayout(models_max=1)
    with sleepy_router(tmp_path / "router", MODEL, SLEEP_S, one_model) as server:
        yield server


async def status_of(client: InferenceClient) -> ModelStatus:
    return (await client.model_reading()).status


async def stays(client: InferenceClient, daemon: Daemon, status: ModelStatus) -> None:
    """The model is ``status`` now and through three more of loopd's server checks."""
    watch = daemon.watch
    assert watch is not None
    until_check = watch.checks + 3
    with anyio.fail_after(CHANGE_WITHIN_S):
        while watch.checks < until_check:
            assert await status_of(client) is status
            await anyio.sleep(0.2)
    assert await status_of(client) is status


def turn_requests(requests: list[Request], after: int) -> list[Request]:
    return [r for r in requests[after:] if r.record.kind is RequestKind.TURN]


async def test_idle_loopd_lets_its_model_sleep_and_returns_warm_with_one_request(
    tmp_path: Path, sockets: Path, router: devserver.RunningServer
) -> None:
    async with fake_mattermost(sockets) as mm:
        settings = settings_for(
            tmp_path / "state",
            router.url,
            MODEL,
            selftest_every_s=CHECK_EVERY_S,
            durable=DurableMode.ON,
            first_byte_s=CHANGE_WITHIN_S,
        )
        env = Env(mm, settings, chat_settings_for(mm, tmp_path))
        expected = tmp_path / "expected"
        report = await run_selftest(settings, record=True, expected_dir=expected)
        assert report.ok, [r for r in report.results if not r.ok]
        async with anyio.create_task_group() as tg:
            daemon: Daemon = await tg.start(
                lambda task_status: run_daemon(
                    env.daemon_settings,
                    report=report,
                    expected_dir=expected,
                    task_status=task_status,
                )
            )
            post = env.fake.post_as("alice", env.dm(), f"Keep these notes. {NOTES}")
            await until(lambda: len(env.answers(post.id)) == 1, "the answer", CHANGE_WITHIN_S)
            session = f"mm:{post.id}"
            async with InferenceClient(router.url, MODEL) as client:
                await status_becomes(client, ModelStatus.ASLEEP)
                await stays(client, daemon, ModelStatus.ASLEEP)
                # Another client's model takes the router's one place: loopd's is unloaded.
                with router.client(timeout=CHANGE_WITHIN_S) as other:
                    answer = other.post(
                        "/v1/chat/completions",
                        json={
                            "model": OTHER_CLIENTS_MODEL,
                            "messages": [{"role": "user", "content": "hi"}],
                            "max_tokens": 1,
                        },
                    )
                    assert answer.status_code == 200, answer.text
                await status_becomes(client, ModelStatus.UNLOADED)
                await stays(client, daemon, ModelStatus.UNLOADED)
            before = len(daemon.runtime.log.requests(session))
            env.fake.post_as("alice", env.dm(), "Which day does the window open?", root_id=post.id)
            await until(lambda: len(env.answers(post.id)) == 2, "the second answer", 300)
            requests = daemon.runtime.log.requests(session)
            tg.cancel_scope.cancel()
    sent = turn_requests(requests, before)
    failures = [r.record.perf.extra.get("failure") for r in sent]
    assert failures == [None], f"one request, none closed and sent again ({Failure.LOST_BY_SERVER})"
    perf = sent[0].record.perf
    assert perf.cache_n is not None
    assert perf.prompt_n is not None
    prompt = perf.cache_n + perf.prompt_n
    restore = perf.extra["restore"]
    assert isinstance(restore, dict)
    print(
        f"the new post: {len(sent)} request, re-read {perf.prompt_n} of {prompt} prompt tokens "
        f"({restore.get('why')}, {restore.get('outcome')})"
    )
    assert perf.prompt_n < prompt / 10, (perf.cache_n, perf.prompt_n, perf.extra)
    assert restore["outcome"] == "restored from disk"
    assert restore["why"] == "the model was unloaded"
