"""What the server tells of the model without waking it (``loopd.engine.modelstate``), read
from answers of the shapes build 11434 gives (``tests/durable/test_quiet_real.py`` reads the
real ones)."""

from __future__ import annotations

from typing import Any

import pytest

from loopd.engine.modelstate import (
    Forgot,
    ModelMemory,
    ModelReading,
    ModelStatus,
    Weights,
    fingerprint,
    forgot,
    read_reading,
    template_sha256,
)

ARGS = [
    "/opt/llama-server",
    "--host",
    "127.0.0.1",
    "--port",
    "35171",
    "--sleep-idle-seconds",
    "21600",
    "--alias",
    "m",
    "--override-kv",
    "qwen35moe.context_length=int:65536",
    "--model",
    "/srv/models/m.gguf",
]
META = {"n_vocab": 49152, "n_embd": 576, "n_params": 134515008, "size": 96576768, "ftype": "Q4_1"}


def models(status: str = "loaded", args: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    entry = {"id": "m", "aliases": [], "status": {"value": status, "args": args or ARGS}}
    return {"data": [{"id": "other", "status": {"value": "loaded"}}, {**entry, **extra}]}


PROPS = {
    "model_path": "/home/op/models/m.gguf",
    "model_ftype": "Q4_1",
    "chat_template": "{{ messages }}",
    "is_sleeping": False,
}


def test_a_router_reading_holds_state_start_idle_policy_and_weights() -> None:
    reading = read_reading(models(meta=META), PROPS, "m")
    assert reading.status is ModelStatus.AWAKE
    assert reading.instance == "35171"
    assert reading.sleep_idle_s == 21600
    assert reading.weights == Weights(
        file="m.gguf",
        ftype="Q4_1",
        size=96576768,
        n_params=134515008,
        n_vocab=49152,
        n_embd=576,
        args=("--override-kv qwen35moe.context_length=int:65536",),
    )
    assert reading.template == template_sha256("{{ messages }}", None)


@pytest.mark.parametrize(
    ("value", "status"),
    [
        ("sleeping", ModelStatus.ASLEEP),
        ("unloaded", ModelStatus.UNLOADED),
        ("loading", ModelStatus.LOADING),
        ("something new", ModelStatus.UNKNOWN),
    ],
)
def test_the_routers_status_words(value: str, status: ModelStatus) -> None:
    assert read_reading(models(value), None, "m").status is status


def test_a_single_model_server_says_asleep_in_props() -> None:
    single = {"data": [{"id": "/srv/m.gguf", "meta": META}]}
    reading = read_reading(single, {**PROPS, "is_sleeping": True}, "anything")
    assert reading.status is ModelStatus.ASLEEP
    assert reading.instance is None
    assert reading.weights is not None
    assert reading.weights.size == 96576768


@pytest.mark.parametrize(
    "hostile",
    [
        {},
        {"data": "x"},
        {"data": [1, None, {"id": "m", "status": "loaded"}]},
        {"data": [{"id": "m", "status": {"value": 3, "args": "--port 1"}, "meta": [1]}]},
    ],
)
def test_hostile_answers_give_what_they_hold_never_an_error(hostile: dict[str, Any]) -> None:
    reading = read_reading(hostile, {"is_sleeping": "no", "chat_template": 5}, "m")
    assert reading.status is ModelStatus.UNKNOWN
    assert reading.template is None


def test_the_fingerprint_follows_the_weights_and_the_template_not_the_folder() -> None:
    here = read_reading(models(meta=META), PROPS, "m")
    elsewhere = read_reading(models(meta=META), {**PROPS, "model_path": "/other/m.gguf"}, "m")
    assert here.fingerprint("m") == elsewhere.fingerprint("m")
    assert here.fingerprint("m") is not None
    resized = read_reading(models(meta={**META, "size": 1}), PROPS, "m")
    retemplated = read_reading(models(meta=META), {**PROPS, "chat_template": "x"}, "m")
    other_kv = read_reading(models(args=[*ARGS, "--cache-type-k", "q8_0"], meta=META), PROPS, "m")
    prints = {r.fingerprint("m") for r in (here, resized, retemplated, other_kv)}
    assert len(prints) == 4
    assert here.fingerprint("other id") != here.fingerprint("m")
    assert len(fingerprint("m", Weights("f", "t"), "t")) == 12


def at(status: ModelStatus, instance: str | None = "1") -> ModelReading:
    return ModelReading(status, instance=instance)


def test_a_sleep_an_unload_and_a_restart_are_each_a_forgetting() -> None:
    awake, asleep = at(ModelStatus.AWAKE), at(ModelStatus.ASLEEP)
    assert forgot(awake, asleep) is Forgot.SLEPT
    assert forgot(asleep, asleep) is None  # the same sleep
    assert forgot(asleep, awake) is None  # woken: counted when it fell asleep
    assert forgot(awake, at(ModelStatus.UNLOADED)) is Forgot.UNLOADED
    assert forgot(at(ModelStatus.UNLOADED), at(ModelStatus.LOADING)) is None
    assert forgot(awake, at(ModelStatus.AWAKE, "2")) is Forgot.RESTARTED
    assert forgot(awake, at(ModelStatus.AWAKE, None)) is None
    assert forgot(None, asleep) is Forgot.SLEPT
    assert forgot(None, awake) is None
    assert forgot(awake, at(ModelStatus.UNKNOWN)) is None


def test_the_memory_counts_forgettings_and_ignores_readings_that_tell_nothing() -> None:
    memory = ModelMemory()
    assert ModelMemory().status is ModelStatus.UNKNOWN
    memory.observe(at(ModelStatus.AWAKE))
    assert memory.forgets == 0
    memory.observe(at(ModelStatus.ASLEEP))
    memory.observe(at(ModelStatus.UNKNOWN))
    assert memory.status is ModelStatus.ASLEEP
    memory.observe(at(ModelStatus.AWAKE))
    memory.observe(at(ModelStatus.AWAKE, "9"))
    assert memory.forgets == 2
    assert memory.last_forget is Forgot.RESTARTED


def test_the_memory_keeps_the_last_fingerprint_a_reading_told() -> None:
    memory = ModelMemory()
    told = read_reading(models(meta=META), PROPS, "m")
    memory.observe(told)
    memory.observe(read_reading(models("unloaded"), None, "m"))  # tells no weights
    assert memory.known == told
    assert memory.status is ModelStatus.UNLOADED
