"""Slot saves through brokerd against the real llama-server: a state saved through the proxy
comes back after the server is killed and started again, and the folder stays under its cap.

The router runs SmolLM2 with ``--slot-save-path`` on its command line; brokerd allows slots 0
and 1, bounds the folder, and sits between this test (as the box) and the server.
"""

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopcommon.slotfiles import slot_file_name
from loopd_dev import devserver
from tests.security.brokerd_run import RunningBrokerd, brokerd
from tests.tools.toolcall import wait_until

FINGERPRINT = "0123456789ab"  # the model that wrote a save (loopcommon.slotfiles)


pytestmark = [pytest.mark.real_server, pytest.mark.slow]

MODEL = devserver.PLAIN_MODEL
QUESTION = {"role": "user", "content": "Which tests does the release checklist name?"}


def box_client(running: RunningBrokerd) -> httpx.Client:
    transport = httpx.HTTPTransport(uds=str(running.socket("infer")))
    return httpx.Client(transport=transport, base_url="http://infer", timeout=120)


def messages(session: str) -> list[dict[str, Any]]:
    notes = " ".join(f"{session} note {n}: the parser tests run nightly." for n in range(8))
    return [{"role": "system", "content": notes}, QUESTION]


def chat(box: httpx.Client, slot: int, history: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": MODEL, "id_slot": slot, "messages": history, "max_tokens": 1}
    response = box.post("/v1/chat/completions", json={**body, "temperature": 0})
    assert response.status_code == 200, response.text
    timings: dict[str, Any] = response.json()["timings"]
    return timings


def slot_action(box: httpx.Client, action: str, slot: int, filename: str) -> httpx.Response:
    body = {"filename": filename, "model": MODEL}
    return box.post(f"/slots/{slot}", params={"action": action}, content=json.dumps(body))


@dataclass
class Stack:
    """The router (restartable) and brokerd in front of it, bounding the save folder."""

    folder: Path
    server: devserver.RunningServer
    brokerd: RunningBrokerd
    state_bytes: int

    @property
    def saves(self) -> Path:
        return self.folder / "saves"

    def restart_server(self) -> None:
        self.server.kill()
        self.server = start_server(self.folder)


def start_server(folder: Path) -> devserver.RunningServer:
    return devserver.start(
        folder / "server",
        devserver.default_cache_dir(),
        socket_path=folder / "llama.sock",
        extra_args=("--slot-save-path", str(folder / "saves")),
    )


def probe_state_bytes(server: devserver.RunningServer) -> int:
    """The size of one test session's saved state, straight from the server (then removed)."""
    # A connection each: the router may drop a kept-alive one unanswered once the model's
    # reply is done (as the bench's durable section found).
    with server.client(timeout=120) as direct:
        chat(direct, 0, messages("probe"))
    with server.client(timeout=120) as direct:
        saved = direct.post("/slots/0?action=save", json={"filename": "probe.bin", "model": MODEL})
        assert saved.status_code == 200, saved.text
    return int(saved.json()["n_written"])


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    (tmp_path / "saves").mkdir()
    server = start_server(tmp_path)
    try:
        state_bytes = probe_state_bytes(server)
        (tmp_path / "saves" / "probe.bin").unlink()
        variables = {
            "BROKERD_INFERENCE_URL": server.url,
            "BROKERD_INFERENCE_SLOTS": "[0, 1]",
            "BROKERD_INFERENCE_MODELS": json.dumps([MODEL]),
            "BROKERD_SLOT_SAVE_DIRS": json.dumps([str(tmp_path / "saves")]),
            # Two of the test's states fit, a third does not.
            "BROKERD_SLOT_SAVE_MAX_BYTES": str(state_bytes * 5 // 2),
        }
        with brokerd(tmp_path, variables, only=["infer"]) as running:
            stack = Stack(tmp_path, server, running, state_bytes)
            try:
                yield stack
            finally:
                server = stack.server
    finally:
        server.kill()


def test_a_state_saved_through_brokerd_comes_back_after_a_server_restart(stack: Stack) -> None:
    running, saves = stack.brokerd, stack.saves
    history = messages("restart")
    name = slot_file_name("session-restart", json.dumps(history).encode(), fingerprint=FINGERPRINT)
    with box_client(running) as box:
        first = chat(box, 0, history)
        saved = slot_action(box, "save", 0, name)
        assert saved.status_code == 200, saved.text
        assert (saves / name).exists()
        # Another client's name, a path, erase: refused before the server.
        for refused in ("slot0.bin", f"../{name}"):
            assert slot_action(box, "restore", 0, refused).status_code == 403
        assert box.post("/slots/0", params={"action": "erase"}, json={}).status_code == 403
    held = int(saved.json()["n_saved"])
    assert held >= first["prompt_n"]

    stack.restart_server()
    with box_client(running) as box:
        restored = slot_action(box, "restore", 0, name)
        assert restored.status_code == 200, restored.text
        assert restored.json()["n_restored"] == held
        follow_up = [*history, {"role": "assistant", "content": "The parser tests."}, QUESTION]
        again = chat(box, 0, follow_up)
    # Everything the first prompt held is reused; only the new turn is read.
    assert again["cache_n"] >= first["prompt_n"] - 1
    assert again["prompt_n"] < 40


def test_the_save_folder_stays_under_its_cap_on_the_real_server(stack: Stack) -> None:
    running, saves = stack.brokerd, stack.saves
    names = [
        slot_file_name(f"session-{n}", f"prefix-{n}".encode(), fingerprint=FINGERPRINT)
        for n in range(3)
    ]
    with box_client(running) as box:
        for n, name in enumerate(names):
            chat(box, n % 2, messages(f"cap-{n}"))
            assert slot_action(box, "save", n % 2, name).status_code == 200
    wait_until(lambda: not (saves / names[0]).exists(), "the oldest state to go")
    sizes = [path.stat().st_size for path in saves.glob("loopd-*")]
    assert sorted(p.name for p in saves.glob("loopd-*")) == sorted(names[1:])
    assert sum(sizes) <= stack.state_bytes * 5 // 2
