"""The inference proxy in front of two llama-servers: each socket reaches its own server only.

brokerd here has two ``[[endpoint]]`` tables: ``gpu1`` (model ``small``, slot 0) and ``gpu2``
(model ``large``, slots 0 and 1), each a recording upstream with its own API key, served on
``infer-gpu1.sock`` and ``infer-gpu2.sock``.
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

from tests.security.brokerd_run import RunningBrokerd, brokerd
from tests.security.fake_mattermost import served


@dataclass
class RecordingLlama:
    """Records each request's route, and the key it came with."""

    seen: list[tuple[str, str]] = field(default_factory=list)

    async def any_route(self, request: Request) -> JSONResponse:
        key = request.headers.get("authorization", "")
        self.seen.append((f"{request.method} {request.url.path}", key))
        return JSONResponse({"ok": True})

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{path:path}", self.any_route, methods=["GET", "POST"])])


@dataclass(frozen=True)
class TwoServers:
    gpu1: RecordingLlama
    gpu2: RecordingLlama
    running: RunningBrokerd

    def total(self) -> int:
        return len(self.gpu1.seen) + len(self.gpu2.seen)


CONFIG = """
[[endpoint]]
name = "gpu1"
url = "unix:{folder}/gpu1.sock"
key_file = "{folder}/gpu1.key"
inference_slots = [0]
inference_models = ["small"]

[[endpoint]]
name = "gpu2"
url = "unix:{folder}/gpu2.sock"
key_file = "{folder}/gpu2.key"
inference_slots = [0, 1]
inference_models = ["large"]
"""


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoServers]:
    folder = Path(tmp_path_factory.mktemp("endpoints"))
    (folder / "gpu1.key").write_text("key-one\n")
    (folder / "gpu2.key").write_text("key-two\n")
    config = folder / "brokerd.toml"
    config.write_text(CONFIG.format(folder=folder))
    gpu1, gpu2 = RecordingLlama(), RecordingLlama()
    with (
        served(gpu1.app(), folder / "gpu1.sock"),
        served(gpu2.app(), folder / "gpu2.sock"),
        brokerd(folder, {"BROKERD_CONFIG": str(config)}, only=["infer"]) as running,
    ):
        yield TwoServers(gpu1, gpu2, running)


def chat(sock: Path, **fields: Any) -> int:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **fields}
    transport = httpx.HTTPTransport(uds=str(sock))
    with httpx.Client(transport=transport, base_url="http://infer", timeout=10) as box:
        return box.post("/v1/chat/completions", content=json.dumps(body)).status_code


@pytest.mark.attack(
    attack="The box finds an inference socket that no [[endpoint]] table gave it",
    input="the socket folder of a brokerd with endpoints gpu1 and gpu2",
    expected="infer-gpu1.sock and infer-gpu2.sock only: no infer.sock to the default server",
)
def test_each_endpoint_has_its_own_socket_and_no_infer_sock(
    two_servers: TwoServers, observed: Callable[[str], None]
) -> None:
    sockets = sorted(path.name for path in two_servers.running.socket_dir.iterdir())
    observed(", ".join(sockets))
    assert sockets == ["infer-gpu1.sock", "infer-gpu2.sock"]


@pytest.mark.attack(
    attack="A box request on one server's socket asks for an endpoint it is not given there",
    input="on infer-gpu1.sock: gpu2's model `large`; gpu2's slot 1; `GET /props?model=large`",
    expected="403 naming gpu1; nothing reaches either server (gpu1's own model and slot pass)",
)
def test_a_request_for_another_endpoint_is_refused(
    two_servers: TwoServers, observed: Callable[[str], None]
) -> None:
    sock = two_servers.running.socket("infer-gpu1")
    results: dict[str, tuple[int, int]] = {}
    for name, fields in [
        ("model large", {"model": "large", "id_slot": 0}),
        ("slot 1", {"model": "small", "id_slot": 1}),
    ]:
        before = two_servers.total()
        results[name] = (chat(sock, **fields), two_servers.total() - before)
    before = two_servers.total()
    transport = httpx.HTTPTransport(uds=str(sock))
    with httpx.Client(transport=transport, base_url="http://infer", timeout=10) as box:
        props = box.get("/props", params={"model": "large"})
    results["props large"] = (props.status_code, two_servers.total() - before)
    observed(", ".join(f"{name}: {status}" for name, (status, _) in results.items()))
    assert "on endpoint gpu1" in props.json()["error"]["message"]
    assert results == {"model large": (403, 0), "slot 1": (403, 0), "props large": (403, 0)}
    assert chat(sock, model="small", id_slot=0) == 200
    assert two_servers.gpu1.seen[-1] == ("POST /v1/chat/completions", "Bearer key-one")


@pytest.mark.attack(
    attack="A request on one server's socket reaches another server, or carries its key",
    input="`id_slot` 1 with model `large` on infer-gpu2.sock, then model `small` on "
    "infer-gpu1.sock",
    expected="each reaches its own server only, with that server's key",
)
def test_each_socket_reaches_its_own_server_with_its_own_key(
    two_servers: TwoServers, observed: Callable[[str], None]
) -> None:
    gpu1_before, gpu2_before = len(two_servers.gpu1.seen), len(two_servers.gpu2.seen)
    assert chat(two_servers.running.socket("infer-gpu2"), model="large", id_slot=1) == 200
    assert chat(two_servers.running.socket("infer-gpu1"), model="small", id_slot=0) == 200
    gpu1_new = two_servers.gpu1.seen[gpu1_before:]
    gpu2_new = two_servers.gpu2.seen[gpu2_before:]
    observed(f"gpu1 saw {gpu1_new}, gpu2 saw {gpu2_new}")
    assert gpu1_new == [("POST /v1/chat/completions", "Bearer key-one")]
    assert gpu2_new == [("POST /v1/chat/completions", "Bearer key-two")]
