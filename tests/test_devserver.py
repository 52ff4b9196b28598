"""The embedded server as `make run` uses it: started as a process, stopped with SIGTERM."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from loopd_dev import devserver

pytestmark = pytest.mark.real_server


def test_sigterm_stops_the_router_too(tmp_path: Path) -> None:
    """The router runs in its own session; a SIGTERM to the devserver, sent the moment it says
    it is ready, must not orphan it: the devserver exits only once the router's whole process
    group (the router and its model children) has."""
    socket = tmp_path / "llama.sock"
    argv = [sys.executable, "-m", "loopd_dev.devserver", "--socket", str(socket)]
    argv += ["--workdir", str(tmp_path / "work")]
    process = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    try:
        with process.stderr:
            ready = process.stderr.readline()
            assert "ready at" in ready, ready
            (router,) = _routers_for(socket)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0
        assert _routers_for(socket) == []
        assert not _group_alive(router), "a model child outlived the devserver"
    finally:
        _end(process, socket)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _end(process: subprocess.Popen[str], socket: Path) -> None:
    """Whatever the test left running, pass or fail: the devserver, then each router's group."""
    if process.poll() is None:
        process.kill()
        process.wait()
    for router in _routers_for(socket):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(router, signal.SIGKILL)


def _routers_for(socket: Path) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(socket).encode() in cmdline and cmdline[0].endswith(b"llama-server"):
            found.append(int(pid))
    return found


PROV = devserver.Provisioned(
    Path("/b/llama-server"),
    Path("/t"),
    Path("/m.gguf"),
    Path("/m/qwen35moe-vocab.gguf"),
    Path("/m/tools.gguf"),
    Path("/m/agent.gguf"),
)


def sections(ini: str) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in ini.splitlines():
        if line.startswith("["):
            current = out.setdefault(line.strip("[]"), {})
        elif " = " in line:
            key, value = line.split(" = ", 1)
            current[key] = value
    return out


def test_preset_names_every_model() -> None:
    ini = devserver.preset_ini(PROV, devserver.ServerLayout(), Path("/w/every.jinja"))
    found = sections(ini)
    assert found["*"]["np"] == "2"
    assert found["smollm2"] == {"model": "/m.gguf"}
    assert found["smollm2-think"]["chat-template-file"] == "/t/Qwen3.5-4B.jinja"
    assert found["smollm2-think-all"]["chat-template-file"] == "/w/every.jinja"


def test_the_hybrid_preset_is_production_shaped() -> None:
    """Four slots on one unified pool, the every-turn template, the context the file lacks; the
    host prompt cache and --cache-idle-slots stay as the server starts by default."""
    hybrid = sections(devserver.preset_ini(PROV, devserver.ServerLayout(), Path("/w/every.jinja")))
    assert hybrid["qwen35moe"] == {
        "model": "/m/qwen35moe-vocab.gguf",
        "override-kv": "qwen35moe.context_length=int:65536",
        "threads": "1",
        "c": "16384",
        "np": "4",
        "kv-unified": "true",
        "chat-template-file": "/w/every.jinja",
    }


def test_the_tool_preset_serves_loopds_template_on_one_slot() -> None:
    found = sections(devserver.preset_ini(PROV, devserver.ServerLayout(), Path("/w/every.jinja")))
    assert found["qwen-coder-tools"] == {
        "model": "/m/tools.gguf",
        "jinja": "true",
        "chat-template-file": str(devserver.TOOL_TEMPLATE),
        "c": "4096",
        "np": "1",
        "threads": "2",
    }
    assert devserver.TOOL_TEMPLATE.is_file()


def test_the_agent_preset_serves_the_rounds_template_on_one_slot_and_one_thread() -> None:
    found = sections(devserver.preset_ini(PROV, devserver.ServerLayout(), Path("/w/every.jinja")))
    assert found["qwen-coder-agent"] == {
        "model": "/m/agent.gguf",
        "jinja": "true",
        "chat-template-file": str(devserver.AGENT_TEMPLATE),
        "c": "8192",
        "np": "1",
        "threads": "1",
    }
    assert devserver.AGENT_TEMPLATE.is_file()
    assigned = devserver.loopd_env("qwen-coder-agent", {})
    assert assigned.splitlines()[:3] == [
        "export LOOPD_TEMPERATURE=0.0",
        "export LOOPD_MAX_TOKENS=150",
        "export LOOPD_THINK_CAP=0",
    ]
    # A shell reads the assignments: the system text comes through whole.
    shown = subprocess.run(
        ["bash", "-c", f'{assigned}\nprintf %s "$LOOPD_SYSTEM_TEXT"'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout == devserver.AGENT_SYSTEM_TEXT


def test_the_tool_model_brings_its_settings_unless_the_environment_sets_them() -> None:
    assert devserver.loopd_env("qwen-coder-tools", {"LOOPD_MAX_TOKENS": "99"}).splitlines() == [
        "export LOOPD_TEMPERATURE=0.0",
        "export LOOPD_THINK_CAP=0",
    ]
    assert devserver.loopd_env("smollm2", {}) == ""


def test_presets_of_the_callers_own_follow_and_override() -> None:
    variant = devserver.hybrid_preset(
        PROV, None, name="v", extra=(("chat-template", "chatml"), ("cache-idle-slots", "false"))
    )
    dense = devserver.dense_preset(
        PROV, None, name="d", layout=devserver.SlotLayout(ctx_size=8192, kv_unified=False)
    )
    found = sections(
        devserver.preset_ini(PROV, devserver.ServerLayout(), Path("/w/e.jinja"), (variant, dense))
    )
    assert found["v"]["chat-template"] == "chatml"
    assert found["v"]["cache-idle-slots"] == "false"
    assert "chat-template-file" not in found["v"]
    assert found["d"] == {"model": "/m.gguf", "c": "8192", "np": "4", "kv-unified": "false"}


def test_the_every_turn_template_changes_one_condition_of_the_provisioned_one() -> None:
    prov = devserver.Provisioned.in_cache(devserver.default_cache_dir())
    original = (prov.templates / devserver.THINKING_TEMPLATE).read_text(encoding="utf-8")
    changed = devserver.every_turn_reasoning(original)
    removed = [line for line in original.splitlines() if line not in changed.splitlines()]
    assert [line.strip() for line in removed] == ["{%- if loop.index0 > ns.last_query_index %}"]
    assert len(changed.splitlines()) == len(original.splitlines())
    with pytest.raises(devserver.DevServerError, match="expected reasoning condition"):
        devserver.every_turn_reasoning(changed)


@pytest.mark.real_server
def test_only_the_every_turn_preset_renders_earlier_reasoning(tmp_path: Path) -> None:
    conversation = [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer", "reasoning_content": "EARLIER-THOUGHT"},
        {"role": "user", "content": "second question"},
    ]
    server = devserver.start(
        tmp_path,
        devserver.default_cache_dir(),
        socket_path=tmp_path / "llama.sock",
        load=(devserver.THINKING_MODEL, devserver.EVERY_TURN_MODEL),
    )
    try:
        with server.client() as client:
            prompts = {
                model: client.post(
                    "/apply-template", json={"model": model, "messages": conversation}
                ).json()["prompt"]
                for model in (devserver.THINKING_MODEL, devserver.EVERY_TURN_MODEL)
            }
    finally:
        server.stop()
    assert "EARLIER-THOUGHT" not in prompts[devserver.THINKING_MODEL]
    assert "<think>\nEARLIER-THOUGHT\n</think>" in prompts[devserver.EVERY_TURN_MODEL]
    assert "first answer" in prompts[devserver.THINKING_MODEL]
