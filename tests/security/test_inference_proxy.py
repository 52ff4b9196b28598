"""The inference proxy in front of a shared llama-server: which slots and models the box may use.

brokerd here allows slot 0 and model ``smollm2`` (``inference_slots = [0]``,
``inference_models = ["smollm2"]``); a recording upstream stands in for llama-server.
"""

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.security.brokerd_run import brokerd
from tests.security.fake_mattermost import served


@dataclass
class RecordingLlama:
    seen: list[str] = field(default_factory=list)

    async def any_route(self, request: Request) -> JSONResponse:
        self.seen.append(f"{request.method} {request.url.path}")
        return JSONResponse({"ok": True})

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{path:path}", self.any_route, methods=["GET", "POST"])])


@pytest.fixture(scope="module")
def infer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RecordingLlama, Path]]:
    folder = Path(tmp_path_factory.mktemp("infer"))
    llama = RecordingLlama()
    with served(llama.app(), folder / "llama.sock"):
        variables = {
            "BROKERD_INFERENCE_URL": f"unix:{folder}/llama.sock",
            "BROKERD_INFERENCE_SLOTS": "[0]",
            "BROKERD_INFERENCE_MODELS": '["smollm2"]',
        }
        with brokerd(folder, variables, only=["infer"]) as running:
            yield llama, running.socket("infer")


def chat_request(infer_sock: Path, **fields: Any) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **fields}
    transport = httpx.HTTPTransport(uds=str(infer_sock))
    with httpx.Client(transport=transport, base_url="http://infer", timeout=10) as box:
        return box.post("/v1/chat/completions", content=json.dumps(body))


def run_cases(
    infer: tuple[RecordingLlama, Path], cases: list[tuple[str, dict[str, Any]]]
) -> dict[str, tuple[int, int]]:
    """Each case's status, and how many requests reached the server for it."""
    llama, sock = infer
    results = {}
    for name, fields in cases:
        before = len(llama.seen)
        status = chat_request(sock, **fields).status_code
        results[name] = (status, len(llama.seen) - before)
    return results


@pytest.mark.attack(
    attack="A box request takes another client's slot on the shared server",
    input='chat request with `"id_slot": 1` (brokerd allows slot 0)',
    expected="403; nothing reaches llama-server (slot 0 still passes)",
)
def test_another_slot_is_refused(
    infer: tuple[RecordingLlama, Path], observed: Callable[[str], None]
) -> None:
    results = run_cases(
        infer,
        [
            ("slot 1", {"model": "smollm2", "id_slot": 1}),
            ("slot 0", {"model": "smollm2", "id_slot": 0}),
        ],
    )
    observed(", ".join(f"{name}: {status}" for name, (status, _) in results.items()))
    assert results == {"slot 1": (403, 0), "slot 0": (200, 1)}


@pytest.mark.attack(
    attack="The server picks a slot for the box: any idle one, maybe another client's",
    input='chat request with `"id_slot": -1`, and one with no id_slot',
    expected="403 for both while inference_slots is set",
)
def test_no_slot_or_any_slot_is_refused(
    infer: tuple[RecordingLlama, Path], observed: Callable[[str], None]
) -> None:
    results = run_cases(
        infer,
        [
            ("id_slot -1", {"model": "smollm2", "id_slot": -1}),
            ("no id_slot", {"model": "smollm2"}),
            ("id_slot true", {"model": "smollm2", "id_slot": True}),
        ],
    )
    observed(", ".join(f"{name}: {status}" for name, (status, _) in results.items()))
    assert results == {"id_slot -1": (403, 0), "no id_slot": (403, 0), "id_slot true": (403, 0)}


@pytest.mark.attack(
    attack="A box request names another model (router mode loads it)",
    input='chat request with `"model": "big-model"`, and GET /props?model=big-model',
    expected="403; nothing reaches llama-server",
)
def test_another_model_is_refused(
    infer: tuple[RecordingLlama, Path], observed: Callable[[str], None]
) -> None:
    llama, sock = infer
    results = run_cases(infer, [("chat", {"model": "big-model", "id_slot": 0})])
    before = len(llama.seen)
    transport = httpx.HTTPTransport(uds=str(sock))
    with httpx.Client(transport=transport, base_url="http://infer", timeout=10) as box:
        props = box.get("/props", params={"model": "big-model"}).status_code
    results["props"] = (props, len(llama.seen) - before)
    observed(", ".join(f"{name}: {status}" for name, (status, _) in results.items()))
    assert results == {"chat": (403, 0), "props": (403, 0)}
