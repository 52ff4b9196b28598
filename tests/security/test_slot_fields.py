"""A chat request that names the box's slot but starts work on others (the real llama-server).

The real server here has two slots per model; brokerd gives the box slot 0
(``inference_slots = [0]``). ``n_cmpl`` (alias ``n``) asks for parallel completions of one
prompt: the server runs each extra one on another idle slot, over whatever that slot cached.
"""

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopd_dev import devserver
from tests.security.brokerd_run import brokerd
from tests.security.server_fields import chat_request_fields

pytestmark = pytest.mark.real_server

MODEL = devserver.PLAIN_MODEL


@pytest.fixture
def infer_sock(short_dir: Path, real_server: devserver.RunningServer) -> Iterator[Path]:
    variables = {
        "BROKERD_INFERENCE_URL": real_server.url,
        "BROKERD_INFERENCE_SLOTS": "[0]",
        "BROKERD_INFERENCE_MODELS": json.dumps([MODEL]),
    }
    with brokerd(short_dir, variables, only=["infer"]) as running:
        yield running.socket("infer")


def slots(server: devserver.RunningServer) -> dict[int, dict[str, Any]]:
    """The server's slots as it reports them (a fresh connection: the router may close a kept
    one without answering)."""
    with server.client() as client:
        answer = client.get("/slots", params={"model": MODEL})
    answer.raise_for_status()
    return {slot["id"]: slot for slot in answer.json()}


def chat(infer_sock: Path, body: bytes) -> httpx.Response:
    transport = httpx.HTTPTransport(uds=str(infer_sock))
    with httpx.Client(transport=transport, base_url="http://infer", timeout=120) as box:
        return box.post("/v1/chat/completions", content=body)


def body_with(**fields: Any) -> bytes:
    base = {
        "model": MODEL,
        "id_slot": 0,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": "Name a colour."}],
    }
    return json.dumps({**base, **fields}).encode()


def refusal_of(answer: httpx.Response) -> str:
    message = answer.json().get("error", {}).get("message", "") if answer.content else ""
    return f"{answer.status_code} {message}".strip()


@pytest.mark.attack(
    attack="A request naming the box's slot starts work on the server's other slots",
    input='chat request with `"id_slot": 0` and `"n_cmpl": 2`, `"n": 2`, `"n_cmpl": 2.0`; '
    "also `lora`, `backend_sampling`, `n_probs` 100000 and a field brokerd does not know",
    expected="403 naming the field for each; slot 1 untouched; `n_cmpl` 1 passes, on slot 0 only",
)
def test_fields_that_take_other_slots_are_refused(
    infer_sock: Path, real_server: devserver.RunningServer, observed: Callable[[str], None]
) -> None:
    before = slots(real_server)
    attempts = {
        "n_cmpl": body_with(n_cmpl=2),
        "n": body_with(n=2),
        "n_cmpl 2.0": body_with(n_cmpl=2.0),
        "lora": body_with(lora=[{"id": 0, "scale": 1.0}]),
        "backend_sampling": body_with(backend_sampling=True),
        "n_probs": body_with(n_probs=100000),
        "logprobs": body_with(logprobs=True, top_logprobs=100000),
        "unknown": body_with(n_completions=2),
    }
    answers = {name: refusal_of(chat(infer_sock, body)) for name, body in attempts.items()}
    after_refusals = slots(real_server)
    allowed = chat(infer_sock, body_with(n_cmpl=1))
    # A repeated key: brokerd and the server both read the last value.
    repeated = chat(infer_sock, body_with(n_cmpl=2)[:-1] + b', "n_cmpl": 1}')
    after = slots(real_server)
    observed(
        "; ".join(f"{name}: {answer[:3]}" for name, answer in answers.items())
        + f"; slot 1 touched: {after[1] != before[1]}; e.g. {answers['n_cmpl']}"
    )
    assert after_refusals[1] == before[1], f"slot 1 was used: {answers}"
    for name, answer in answers.items():
        field = {"n_cmpl 2.0": "n_cmpl", "logprobs": "top_logprobs", "unknown": "n_completions"}
        expected = f"403 brokerd refuses the field '{field.get(name, name)}'"
        assert answer.startswith(expected), (name, answer)
    assert allowed.status_code == 200, allowed.text
    assert repeated.status_code == 200, repeated.text
    assert [len(a.json()["choices"]) for a in (allowed, repeated)] == [1, 1]
    assert after[1] == before[1], "a request on slot 0 touched slot 1"
    assert after[0]["id_task"] != before[0].get("id_task"), (
        "the allowed requests did not run on slot 0"
    )


@pytest.mark.attack(
    attack="A newer llama-server reads a request field that brokerd waves through unexamined",
    input="the provisioned build's own source: every field its chat route reads",
    expected="each is classified in brokerd's table (allowed, bounded or refused), and the table "
    "names no field the server does not read",
)
def test_every_field_the_server_reads_is_classified(observed: Callable[[str], None]) -> None:
    from brokerd.proxy.requestfields import CHAT_FIELDS  # a test of the table itself

    source = devserver.Provisioned.in_cache(devserver.default_cache_dir()).source
    if not (source / "tools" / "server").is_dir():
        pytest.fail(f"{source} is missing: run `make llama-server` to provision it")
    read = chat_request_fields(source)
    unclassified = sorted(read - CHAT_FIELDS.keys())
    stale = sorted(CHAT_FIELDS.keys() - read)
    observed(f"{len(read)} fields read; unclassified {unclassified}; not read {stale}")
    assert unclassified == [], f"brokerd's policy does not classify {unclassified}"
    assert stale == [], f"brokerd's policy names fields the server does not read: {stale}"
