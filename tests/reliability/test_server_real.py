"""Faults the real llama-server can really have: killed mid-stream, restarted (cold cache), a
router that unloads the model (--models-max 1)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopd.engine.progress import Phase, Status
from loopd.sessionlog.records import fresh_external_key
from loopd.sessions import Runtime
from loopd_dev import devserver
from tests.reliability.conftest import Observe, start_real
from tests.reliability.harness import FAST, SESSION, check_invariants, runtime, terminal_text
from tests.reliability.harness import box as make_box
from tests.reliability.write_table import scenario

pytestmark = [pytest.mark.anyio, pytest.mark.real_server]

PLAIN = devserver.PLAIN_MODEL


@dataclass
class Restartable:
    workdir: Path
    server: devserver.RunningServer

    def restart(self) -> None:
        self.server.stop()
        self.server = start_real(self.workdir)


@pytest.fixture(scope="module")
def real() -> Iterator[Restartable]:
    """A router of this module's own (``--models-max 1``): the scenarios kill and restart it."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="lrs") as tmp:
        holder = Restartable(Path(tmp), start_real(Path(tmp)))
        try:
            yield holder
        finally:
            holder.server.stop()


async def turn(rt: Runtime, text: str, on_status: object = None) -> str:
    session = rt.ensure_session(SESSION)
    rt.log.append_user(SESSION, text, external_key=fresh_external_key())
    report = on_status if callable(on_status) else (lambda status: None)
    t = rt.turn(session, report)
    t = replace(t, limits=replace(FAST, first_byte_s=120.0, silence_s=30.0))
    return terminal_text(await t.run())


def settings_for(real: Restartable, **extra: object) -> dict[str, object]:
    values: dict[str, object] = {
        "infer_url": real.server.url,
        "model": PLAIN,
        "temperature": 0.0,
        "max_tokens": 200,
        "think_cap": 0,  # no cap: 200 tokens leave a capped reasoning no room to answer
    }
    values.update(extra)
    return values


@scenario(
    "Server",
    "real server killed mid-stream, then restarted (cold cache)",
    fault="llama-server SIGKILLed at the first answer token; started again before the next turn",
    expected="a clear message and a broken entry; after the restart the next turn answers and "
    "the full re-read is recorded, not an error",
)
async def test_real_server_killed_mid_stream_then_restarted(
    real: Restartable, observe: Observe
) -> None:
    async with make_box() as env:
        async with runtime(env, **settings_for(real)) as rt:
            killed: list[Status] = []

            def kill_on_answer(status: Status) -> None:
                if status.phase is Phase.ANSWERING and not killed:
                    # The router and its model children: the whole server dies at once.
                    os.killpg(real.server.process.pid, signal.SIGKILL)
                    killed.append(status)

            shown = await turn(rt, "Write a long story about a lighthouse.", kill_on_answer)
        assert killed, "the stream never reached the answer"
        real.restart()
        async with runtime(env, **settings_for(real)) as rt:
            after = await turn(rt, "Say hello.")
            perf = rt.log.requests(SESSION)[-1].record.perf
        checked = check_invariants(
            env.state_dir,
            env.audit_db,
            ["Write a long story about a lighthouse.", "Say hello."],
            shown,
            shows="loopd:",
        )
        assert not after.startswith("loopd:"), after
        assert perf.outcome == "complete"
        observe(checked.summary() + f"; after restart: cache_n={perf.cache_n}, answered")


@scenario(
    "Server",
    "router unloads the model (--models-max 1)",
    fault="another client loads a second model; the router unloads the session's model",
    expected="the next turn waits for the reload and answers; the cache loss is recorded",
)
async def test_real_router_unloads_the_model(real: Restartable, observe: Observe) -> None:
    async with make_box() as env, runtime(env, **settings_for(real)) as rt:
        first = await turn(rt, "Name a colour.")
        with real.server.client(timeout=120) as other:
            response = _load_other_model(other)
            assert response.status_code == 200, response.text
            models = _models(other)
        status = {m["id"]: m.get("status", {}).get("value") for m in models}
        assert status.get(PLAIN) != "loaded", status
        second = await turn(rt, "Name another colour.")
        perf = rt.log.requests(SESSION)[-1].record.perf
        checked = check_invariants(
            env.state_dir, env.audit_db, ["Name a colour.", "Name another colour."], second
        )
        assert not first.startswith("loopd:"), first
        assert not second.startswith("loopd:"), second
        observe(
            checked.summary() + f"; reloaded: cache_n={perf.cache_n}, "
            f"loss={perf.cache_loss} ({perf.cache_loss_cause})"
        )


def _models(client: httpx.Client) -> list[dict[str, Any]]:
    """The router's ``/models``; right after a swap it too may drop a connection unanswered."""
    for _ in range(4):
        try:
            return list(client.get("/models").json()["data"])
        except httpx.RemoteProtocolError:
            continue
    return list(client.get("/models").json()["data"])


def _load_other_model(client: httpx.Client) -> httpx.Response:
    """Another client's request for the second model. While the router swaps models it may
    drop a connection unanswered (the same router behaviour loopd's client is built around),
    so the other client tries again, as any client would."""
    body = {
        "model": devserver.THINKING_MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
    }
    for _ in range(4):
        try:
            return client.post("/v1/chat/completions", json=body)
        except httpx.RemoteProtocolError:
            continue
    return client.post("/v1/chat/completions", json=body)
