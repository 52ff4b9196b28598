"""The whole self-test against the real llama-server: the recorded values pass, and a server with
another context size, slot count or chat template fails, naming the difference."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopd.cli.selftest import selftest
from loopd.config import CORE_TOOLS_FILE, Settings, load_settings
from loopd.engine.client import InferenceClient
from loopd.selftest.expected import DEFAULT_DIR, load_expectation, save_expectation
from loopd.selftest.probe import template_keeps_reasoning
from loopd.selftest.run import SelftestReport, format_result, run_selftest
from loopd.selftest.template import TemplateAnswer
from loopd.tools.spec import load_tools_spec
from loopd_dev import devserver

pytestmark = pytest.mark.real_server


# A chat template of our own: valid for the server, but not the one recorded for smollm2.
OTHER_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def settings_for(server: devserver.RunningServer, model: str) -> Settings:
    return load_settings(infer_url=server.url, model=model, first_byte_s=120.0, silence_s=60.0)


def failing_lines(report: SelftestReport) -> list[str]:
    return [format_result(r) for r in report.results if not r.ok]


@pytest.mark.anyio
@pytest.mark.parametrize("model", [devserver.PLAIN_MODEL, devserver.THINKING_MODEL])
async def test_the_real_server_passes_with_the_recorded_values(
    real_server: devserver.RunningServer, model: str
) -> None:
    report = await run_selftest(
        settings_for(real_server, model), tools_text=load_tools_spec(CORE_TOOLS_FILE).text
    )
    assert failing_lines(report) == []
    assert report.exit_status == 0
    assert report.notes == []
    stream = report.facts.stream
    assert stream is not None
    assert stream.control_answer == "success"
    assert stream.progress_events >= 1


@pytest.mark.anyio
async def test_the_thinking_template_drops_past_reasoning(
    real_server: devserver.RunningServer,
) -> None:
    # llama.cpp's Qwen3.5 template renders only the current turn's reasoning.
    async with InferenceClient(real_server.url, devserver.THINKING_MODEL) as client:
        assert await template_keeps_reasoning(client) is TemplateAnswer.NO
    report = await run_selftest(settings_for(real_server, devserver.THINKING_MODEL))
    assert report.keeps_past_reasoning is TemplateAnswer.NO
    assert report.facts.template is not None
    assert report.facts.template.tool_turn_prefix is TemplateAnswer.NO
    assert "prompts differ at character" in report.facts.template.detail
    assert report.notes == ["no tools file: the render probe rendered without tools"]


def test_record_rewrites_the_file_and_shows_the_diff(
    real_server: devserver.RunningServer, tmp_path: Path
) -> None:
    recorded = load_expectation(devserver.PLAIN_MODEL, DEFAULT_DIR)
    assert recorded is not None
    save_expectation(recorded.model_copy(update={"n_ctx_per_slot": 1234}), tmp_path)
    out = io.StringIO()
    status = selftest(
        settings_for(real_server, devserver.PLAIN_MODEL),
        record=True,
        as_json=True,
        expected_dir=tmp_path,
        out=out,
    )
    report = json.loads(out.getvalue())
    assert [c for c in report["checks"] if not c["ok"]] == []
    assert status == 0
    # The packaged file records no save probe; this server has no --slot-save-path.
    assert report["recorded"]["changes"] == [
        {"field": "n_ctx_per_slot", "old": 1234, "new": recorded.n_ctx_per_slot},
        {"field": "durable_available", "old": None, "new": False},
    ]
    now = recorded.model_copy(update={"durable_available": False})
    assert load_expectation(devserver.PLAIN_MODEL, tmp_path) == now


@pytest.fixture
def other_server(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[devserver.RunningServer]:
    """A router with the layout or extra flags given by the test's parameter."""
    layout, extra_args = request.param
    template = tmp_path / "other.jinja"
    template.write_text(OTHER_TEMPLATE)
    extra = tuple(arg.replace("{template}", str(template)) for arg in extra_args)
    with devserver.running(
        tmp_path / "server",
        devserver.default_cache_dir(),
        socket_path=tmp_path / "server" / "llama.sock",
        layout=layout,
        extra_args=extra,
        load=(devserver.PLAIN_MODEL,),
    ) as server:
        yield server


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize(
    ("other_server", "expected_failures"),
    [
        pytest.param(
            (devserver.ServerLayout(ctx_size=4096, parallel=2), ()),
            ["FAIL  context per slot: expected 4096, got 2048"],
            id="context",
        ),
        pytest.param(
            (devserver.ServerLayout(ctx_size=16384, parallel=4), ()),
            ["FAIL  slots: expected 2, got 4"],
            id="slots",
        ),
    ],
    indirect=["other_server"],
)
async def test_a_different_layout_fails_naming_the_difference(
    other_server: devserver.RunningServer, expected_failures: list[str]
) -> None:
    report = await run_selftest(settings_for(other_server, devserver.PLAIN_MODEL))
    assert failing_lines(report) == expected_failures
    assert report.exit_status == 1


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize(
    "other_server",
    [(devserver.ServerLayout(), ("--chat-template-file", "{template}"))],
    indirect=True,
)
async def test_a_different_chat_template_fails_naming_both_hashes(
    other_server: devserver.RunningServer,
) -> None:
    recorded = load_expectation(devserver.PLAIN_MODEL, DEFAULT_DIR)
    assert recorded is not None
    report = await run_selftest(settings_for(other_server, devserver.PLAIN_MODEL))
    failed = [r for r in report.results if not r.ok]
    assert [r.name for r in failed] == ["chat template"]
    assert recorded.template_sha256 in failed[0].expected
    assert failed[0].actual.startswith("sha256 ")
    assert recorded.template_sha256 not in failed[0].actual
    assert report.exit_status == 1


@pytest.fixture
def hybrid_server(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[devserver.RunningServer]:
    """The router serving only the production-shaped qwen35moe preset, with extra flags."""
    with devserver.running(
        tmp_path / "server",
        devserver.default_cache_dir(),
        socket_path=tmp_path / "server" / "llama.sock",
        extra_args=request.param,
        load=(devserver.HYBRID_MODEL,),
    ) as server:
        yield server


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("hybrid_server", "expected_failures"),
    [
        pytest.param((), [], id="as-recorded"),
        pytest.param(
            ("--no-cache-idle-slots",),
            [
                "FAIL  slot pool: expected a slot is cleared once another slot runs (unified "
                "pool, --cache-idle-slots): a pinned session loses its cache, got a slot keeps "
                "its prompt while another slot runs"
            ],
            id="no-idle-clear",
        ),
    ],
    indirect=["hybrid_server"],
)
async def test_the_hybrid_preset_and_its_pool(
    hybrid_server: devserver.RunningServer, expected_failures: list[str]
) -> None:
    """On the hybrid model a repeated prompt resumes at its checkpoint, which the cache probe
    accepts; the pool probe tells a unified pool that clears idle slots from one that does not."""
    report = await run_selftest(
        settings_for(hybrid_server, devserver.HYBRID_MODEL),
        tools_text=load_tools_spec(CORE_TOOLS_FILE).text,
    )
    assert [line.split(" (slot")[0] for line in failing_lines(report)] == expected_failures
    assert report.idle_slots_cleared is (not expected_failures)
    assert report.to_json()["pool"] == {"idle_slots_cleared": report.idle_slots_cleared}
    cache = {r.name: r for r in report.results}["cache probe"]
    assert cache.ok
    assert "resumed at the checkpoint 4 tokens before the end" in cache.detail
