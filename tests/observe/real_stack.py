"""The whole stack for the real-server observability tests, as an operator runs it.

- the real llama-server (the session's ``real_server``, on a Unix socket);
- ``brokerd serve --only infer --only broker`` as a child process, with JSON logs, its metrics
  on a loopback port and ``metrics_relay`` naming loopd's metrics socket;
- the fake Mattermost, in this process;
- ``loopd serve`` as a child process, reaching the server through brokerd's inference proxy, with
  ``LOOPD_METRICS_ADDR`` a Unix socket in its state folder (as in the box).

``slot_held`` keeps the server's slot 0 busy with another client's long generation, so that a
turn stays queued (and so visibly live) until the test lets it go.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from loopd.engine.client import InferenceClient
from loopd_dev import devserver
from tests.chat.chat_support import Env, chat_settings_for, fake_mattermost, settings_for
from tests.chat.serve_process import ServeProcess, loopd_serve
from tests.e2e.e2e_support import REPO_ROOT, Child, ChildFailed, minimal_env
from tests.observe.observe_support import Page, eventually, scraped

STARTUP_S = 60.0
MODEL_S = 180.0  # one answer of the real model on a slow, loaded machine


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a log (anything else, like a traceback's lines, is skipped)."""
    out = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


@dataclass
class Stack:
    env: Env
    brokerd: Child
    loopd: ServeProcess
    loopd_socket: Path
    brokerd_url: str

    async def loopd_get(self, path: str) -> httpx.Response:
        transport = httpx.AsyncHTTPTransport(uds=str(self.loopd_socket))
        async with httpx.AsyncClient(transport=transport, base_url="http://loopd") as client:
            return await client.get(path)

    async def brokerd_get(self, path: str) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.brokerd_url, trust_env=False) as client:
            return await client.get(path)

    async def loopd_metrics(self) -> Page:
        response = await self.loopd_get("/metrics")
        assert response.status_code == 200, response.text
        return scraped(response.text)

    async def brokerd_metrics(self) -> Page:
        response = await self.brokerd_get("/metrics")
        assert response.status_code == 200, response.text
        return scraped(response.text)

    def loopd_lines(self) -> list[dict[str, Any]]:
        return json_lines(self.loopd.stderr_text())

    def brokerd_lines(self) -> list[dict[str, Any]]:
        return json_lines(self.brokerd.log())


@asynccontextmanager
async def observed_stack(
    tmp_path: Path, sockets: Path, server: devserver.RunningServer, **settings: Any
) -> AsyncIterator[Stack]:
    run, state = sockets / "run", sockets / "state"
    loopd_socket = state / "metrics.sock"
    home = tmp_path / "home"
    home.mkdir()
    port = devserver.free_port()
    variables = {
        "BROKERD_SOCKET_DIR": str(run),
        "BROKERD_INFERENCE_URL": server.url,
        "BROKERD_BROKER__AUDIT_DB": str(tmp_path / "audit.db"),
        "BROKERD_METRICS_ADDR": f"127.0.0.1:{port}",
        "BROKERD_METRICS_RELAY": str(loopd_socket),
    }
    argv = [sys.executable, "-m", "brokerd", "serve", "--only", "infer", "--only", "broker"]
    env = minimal_env(home, PYTHONPATH=str(REPO_ROOT), **variables)
    brokerd = Child.start("brokerd", argv, tmp_path / "brokerd.log", env)
    try:
        try:
            await anyio.to_thread.run_sync(brokerd.wait_for, '"msg": "ready: ', STARTUP_S)
        except ChildFailed as exc:
            pytest.fail(str(exc))
        async with fake_mattermost(sockets) as mm:
            values = {
                "broker_url": f"unix:{run}/broker.sock",
                "metrics_addr": f"unix:{loopd_socket}",
                "max_tokens": 48,
                **settings,
            }
            loopd_env = Env(
                mm,
                settings_for(state, f"unix:{run}/infer.sock", devserver.PLAIN_MODEL, **values),
                chat_settings_for(mm, tmp_path),
            )
            async with loopd_serve(loopd_env, tmp_path, "observed") as loopd:
                await loopd.until(loopd_socket.is_socket, "loopd's metrics socket", STARTUP_S)
                yield Stack(loopd_env, brokerd, loopd, loopd_socket, f"http://127.0.0.1:{port}")
    finally:
        brokerd.stop()
        print(f"----- brokerd log -----\n{brokerd.log()}")


@asynccontextmanager
async def slot_held(server: devserver.RunningServer, slot: int = 0) -> AsyncIterator[None]:
    """Another client's generation on ``slot`` (the context's worth of tokens) for the block."""
    body = {
        "model": devserver.PLAIN_MODEL,
        "id_slot": slot,
        "messages": [{"role": "user", "content": "Count from one to ten thousand, in words."}],
        "stream": True,
        "max_tokens": 3800,
        "ignore_eos": True,
        "cache_prompt": False,
    }
    async with (
        InferenceClient(server.url, devserver.PLAIN_MODEL) as client,
        client.stream_chat(json.dumps(body).encode()) as stream,
    ):
        await stream.receive()  # its first byte: the slot is processing it
        yield
    # Leaving closed the connection, which frees the slot on the server.


async def poll(condition: Any, what: str, timeout_s: float = MODEL_S) -> Any:
    """Wait until the async ``condition()`` returns something true; that value."""
    with anyio.fail_after(timeout_s):
        while not (value := await condition()):  # noqa: ASYNC110 - nothing to wait on but HTTP
            await anyio.sleep(0.2)
    assert value, what
    return value


def system_tool(name: str) -> str:
    """The path of a Debian package's command, installed (apt-get, as root) when missing; the
    test fails naming the command to run when it cannot be installed here."""
    found = shutil.which(name)
    if found:
        return found
    install = ["apt-get", "install", "-y", "-qq", name]
    if shutil.which("apt-get") and _is_root():
        done = subprocess.run(install, capture_output=True, check=False)
        if done.returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True, check=False)
            subprocess.run(install, capture_output=True, check=False)
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(f"{name} is needed and is not installed: sudo apt-get install {name}")


def _is_root() -> bool:
    import os

    return os.geteuid() == 0


__all__ = ["MODEL_S", "Stack", "eventually", "observed_stack", "poll", "slot_held", "system_tool"]
